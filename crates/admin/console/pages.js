// The console's pages: the relay's overview, dead letters and replays; the inbox's handlers
// and a handler's review queue. Helpers and the API come from app.js (window.walpostConsole).
'use strict';

(function () {
  const c = window.walpostConsole;
  const { el, put, shown, bytes, seconds, api, table, fields, canAct, main } = c;

  // Runs an action, showing the API's error and hint when it is refused.
  async function act(doing, run) {
    c.clearProblem();
    try {
      return await run();
    } catch (f) {
      c.showProblem(f, doing);
      return undefined;
    }
  }

  // ---- Relay: overview ----

  function overview() {
    const s = c.app.status || {};
    const controls = el('div', { class: 'row', id: 'stream-controls' });
    if (canAct()) {
      controls.append(
        el('button', { type: 'button', id: 'pause', class: 'danger', text: 'Pause the stream', onclick: askPause }),
        el('button', { type: 'button', id: 'resume', text: 'Resume the stream', onclick: askResume }));
    }
    put(main(),
      el('h1', { text: 'Overview' }),
      el('section', { 'aria-labelledby': 'h-stream', class: 'card' },
        el('h2', { id: 'h-stream', text: 'Stream' }),
        el('p', { class: 'state-line' }, 'State: ', el('span', { id: 'f-state', class: 'state', text: shown(s.state) }), el('span', { id: 'f-paused-by', class: 'muted' })),
        el('div', { id: 'stream-fields' }),
        controls),
      el('section', { 'aria-labelledby': 'h-delivery', class: 'card' },
        el('h2', { id: 'h-delivery', text: 'Delivery' }), el('div', { id: 'delivery-fields' })),
      el('section', { 'aria-labelledby': 'h-alarms', class: 'card' },
        el('h2', { id: 'h-alarms', text: 'Alarms' }), el('div', { id: 'alarms' })),
      el('section', { 'aria-labelledby': 'h-lag', class: 'card wide' },
        el('h2', { id: 'h-lag', text: 'Lag' }), el('div', { id: 'charts', class: 'charts' })),
    );
    updateOverview();
  }

  function updateOverview() {
    const s = c.app.status;
    if (!s || !document.getElementById('stream-fields')) return;
    const state = document.getElementById('f-state');
    state.textContent = shown(s.state);
    state.dataset.state = s.state || '';
    document.getElementById('f-paused-by').textContent = s.paused_by ? ' (' + s.paused_by + ')' : '';
    put(document.getElementById('stream-fields'), fields([
      ['Slot', 'f-slot', s.slot],
      ['Confirmed LSN', 'f-confirmed', s.confirmed_lsn],
      ['Server LSN', 'f-server', s.server_lsn],
      ['Lag', 'f-lag-bytes', bytes(s.lag_bytes)],
      ['Lag (time)', 'f-lag-seconds', seconds(s.lag_seconds)],
      ['Halted because', 'f-halted', s.halted_reason],
      ['Slot held by', 'f-holder', s.slot_holder],
    ]));
    put(document.getElementById('delivery-fields'), fields([
      ['Delivery', 'f-delivery', s.delivery],
      ['In flight', 'f-in-flight', s.in_flight],
      ['Events per second', 'f-rate', s.events_per_second === null ? 'not measured' : s.events_per_second],
    ]));
    const alarms = s.alarms || [];
    put(document.getElementById('alarms'), alarms.length
      ? el('ul', { class: 'alarms' }, alarms.map((a) => el('li', { class: 'alarm level-' + a.level },
        el('span', { class: 'badge', text: a.level }), ' ', el('span', { text: a.reason }), ' — runbook: ', c.runbookLink(a.runbook))))
      : el('p', { class: 'muted', text: 'No alarm.' }));
    put(document.getElementById('charts'),
      c.chart('bytes', 'Lag in bytes', (n) => bytes(n).replace(/ \(\d+ B\)$/, '')), c.chart('secs', 'Lag in seconds', seconds));
    const pause = document.getElementById('pause');
    const resume = document.getElementById('resume');
    if (pause && resume) {
      const paused = s.state === 'paused';
      const had = document.activeElement;
      pause.hidden = paused;
      resume.hidden = !paused;
      if (had === pause && paused) resume.focus();
      if (had === resume && !paused) pause.focus();
    }
  }

  function askPause() {
    const slot = (c.app.status && c.app.status.slot) || 'the slot';
    c.confirmThen('Pause reading from ' + slot + '? What was read still goes to Kafka; WAL builds up in the slot until you resume.',
      'Pause', () => act('cannot pause', async () => { await api('POST', '/api/v1/pause'); await c.sample(); }));
  }

  function askResume() {
    c.confirmThen('Resume reading from the slot?', 'Resume',
      () => act('cannot resume', async () => { await api('POST', '/api/v1/resume'); await c.sample(); }));
  }

  // ---- Relay: dead letters ----
  // Shapes: GET /api/v1/dead-letters and POST /api/v1/dead-letters/redrive of
  // docs/control-plane.md (crates/walpost/src/control/dead_letters.rs, redrive.rs).

  const REDRIVE_RESULTS = ['redriven', 'still_refused', 'not_found', 'failed', 'not_attempted'];

  // Where a record went: `topic` partition/offset, or nothing known.
  function placeOf(r) {
    if (!r.topic) return null;
    return r.topic + (r.partition === null || r.partition === undefined ? '' : ' [' + r.partition + '] @' + r.offset);
  }

  // The newest redrive of a dead letter: its result, who and when (null: never redriven).
  function redriveCell(state) {
    if (!state) return el('span', { class: 'muted', 'data-redrive': '', text: 'not redriven' });
    const tail = ' by ' + state.by + ' at ' + state.at + (state.result === 'redriven' && state.topic ? ' to ' + placeOf(state) : '')
      + (state.reason ? ' (' + state.reason + ')' : '');
    return el('span', { 'data-redrive': state.result }, el('strong', { class: 'result-' + state.result, text: state.result }), tail);
  }

  async function deadLetters() {
    const limit = el('input', { id: 'dl-limit', type: 'number', min: 1, max: 500, value: 50 });
    const reason = el('select', { id: 'dl-reason' }, el('option', { value: '', text: 'every reason' }));
    const about = el('p', { id: 'dl-about', class: 'muted' });
    const list = el('div', { id: 'dl-list' });
    const result = el('div', { id: 'dl-result' });
    const form = el('form', { class: 'filters' },
      el('label', { for: 'dl-reason', text: 'Reason' }), reason,
      el('label', { for: 'dl-limit', text: 'Newest per partition (1-500)' }), limit,
      el('button', { type: 'submit', id: 'dl-refresh', text: 'Refresh' }));
    put(main(), el('h1', { text: 'Dead letters' }), about, form, result, list);
    let rows = [];
    const draw = () => {
      const want = reason.value;
      const shownRows = rows.filter((r) => !want || r.reason === want);
      const checks = [];
      const columns = [
        ['Event id', (r) => r.event_id],
        ['Event type', (r) => r.event_type],
        ['Original topic', (r) => r.original_topic],
        ['Reason', (r) => r.reason],
        ['Violation', (r) => r.violation_pointer === null ? null : el('code', { text: r.violation_pointer })],
        ['Time', (r) => r.time],
        ['Redrive', (r) => redriveCell(r.redrive)],
      ];
      if (canAct()) {
        // A dead letter without an event id cannot be named in a redrive.
        columns.unshift(['Select', (r) => {
          if (r.event_id === null) return '';
          const box = el('input', { type: 'checkbox', 'aria-label': 'Select event ' + r.event_id, 'data-event-id': r.event_id });
          checks.push(box);
          return box;
        }]);
      }
      const parts = [shownRows.length
        ? table('dead-letters', columns, shownRows, shownRows.length + ' of ' + rows.length + ' dead letters read, newest first')
        : el('p', { class: 'muted', id: 'dl-empty', text: rows.length ? 'No dead letter of this reason.' : 'No dead letter.' })];
      if (canAct() && shownRows.length) {
        parts.unshift(el('div', { class: 'row' },
          el('button', { type: 'button', id: 'redrive-selected', text: 'Redrive selected', onclick: () => {
            const ids = [...new Set(checks.filter((b) => b.checked).map((b) => b.dataset.eventId))];
            if (!ids.length) { c.notice(result, 'Select the dead letters to redrive first.'); return; }
            c.confirmThen('Redrive ' + ids.length + ' event(s) (' + ids.join(', ') + ')? Each row is read again from its outbox table, routed through the current router and contracts, and what passes is published to its topic.',
              'Redrive', () => redrive({ event_ids: ids }));
          } }),
          want ? el('button', { type: 'button', id: 'redrive-reason', text: 'Redrive all of reason ' + want, onclick: () =>
            c.confirmThen('Redrive every dead letter of reason ' + want + ' not redriven yet (at most 100 events)?', 'Redrive', () => redrive({ reason: want })) }) : null));
      }
      put(list, ...parts);
    };
    const redrive = (body) => act('cannot redrive', async () => {
      const data = await api('POST', '/api/v1/dead-letters/redrive', body);
      const counts = REDRIVE_RESULTS.map((k) => k + ' ' + data[k]).join(', ');
      put(result, el('h2', { text: 'Redrive results' }),
        el('p', { id: 'redrive-counts', role: 'status', text: counts }),
        table('redrive-results', [
          ['Event id', (r) => r.event_id],
          ['Result', (r) => el('strong', { class: 'result-' + r.result, 'data-result': r.result, text: r.result })],
          ['Outbox table', (r) => r.outbox_table],
          ['Published to', (r) => placeOf(r)],
          ['Reason', (r) => r.reason],
          ['Detail', (r) => r.detail],
        ], data.results));
      await load();
    });
    const load = () => act('cannot read the dead letters', async () => {
      const data = await api('GET', '/api/v1/dead-letters?limit=' + encodeURIComponent(limit.value));
      rows = data.dead_letters;
      about.textContent = 'The newest records of ' + data.topic + '; payloads ' + data.payloads + '.'
        + (data.redrive_state_unavailable ? ' Redrive states unknown: ' + data.redrive_state_unavailable : '');
      const had = reason.value;
      const reasons = [...new Set(rows.map((r) => r.reason).filter((r) => r !== null))].sort();
      put(reason, el('option', { value: '', text: 'every reason' }), reasons.map((r) => el('option', { value: r, text: r })));
      if (reasons.includes(had)) reason.value = had;
      draw();
    });
    reason.addEventListener('change', draw);
    form.addEventListener('submit', (ev) => { ev.preventDefault(); load(); });
    await load();
  }

  // ---- Relay: replays ----
  // Shapes: POST/GET /api/v1/replays and GET/DELETE /api/v1/replays/{id} of
  // docs/control-plane.md (crates/walpost/src/control/replays.rs). A replay's `id` is its
  // name (the walpost.replay header).

  const FOLLOW_MS = 1000;

  function selectionOf(p) {
    const parts = [];
    if (p.where !== null) parts.push('where ' + p.where);
    if (p.since !== null) parts.push('since ' + p.since);
    if (p.until !== null) parts.push('until ' + p.until);
    if (!parts.length) parts.push('every row');
    return parts.join('; ') + (p.dry_run ? ' (dry run)' : '');
  }

  // Polls `load` while `hash` is the page and `running()` says so.
  function follow(hash, load, running) {
    const tick = async () => {
      if (location.hash !== hash || !c.app.who) return;
      await load();
      if (running()) setTimeout(tick, FOLLOW_MS);
    };
    if (running()) setTimeout(tick, FOLLOW_MS);
  }

  function stopButton(p, after) {
    return el('button', { type: 'button', class: 'danger', 'data-stop': p.id, text: 'Stop', 'aria-label': 'Stop replay ' + p.id, onclick: () =>
      c.confirmThen('Stop replay ' + p.id + '? It ends before its next fetch; what it published stays published.', 'Stop',
        () => act('cannot stop the replay', async () => {
          await api('DELETE', '/api/v1/replays/' + encodeURIComponent(p.id));
          await after();
        })) });
  }

  function startForm() {
    const inputs = {
      where: el('input', { id: 'r-where', type: 'text', placeholder: "aggregate_type = 'order'", size: 48 }),
      since: el('input', { id: 'r-since', type: 'text', placeholder: '2026-11-28T00:00:00Z' }),
      until: el('input', { id: 'r-until', type: 'text', placeholder: '2026-11-29T00:00:00Z' }),
      all: el('input', { id: 'r-all', type: 'checkbox' }),
      id: el('input', { id: 'r-id', type: 'text', placeholder: 'fix-42', size: 24, maxlength: 64 }),
      dry_run: el('input', { id: 'r-dry-run', type: 'checkbox' }),
    };
    const note = el('div', { id: 'r-note' });
    const form = el('form', { class: 'stack card', id: 'replay-form' },
      el('h2', { text: 'Start a replay' }),
      el('p', { class: 'muted', text: 'The rules of walpost replay: select rows by a condition (columns compared with constants), a time range [since, until), or both; or every row of every outbox, asked for by name.' }),
      el('label', { for: 'r-where', text: 'Condition (where)' }), inputs.where,
      el('div', { class: 'row' },
        el('span', {}, el('label', { for: 'r-since', text: 'Since' }), ' ', inputs.since),
        el('span', {}, el('label', { for: 'r-until', text: 'Until' }), ' ', inputs.until)),
      el('span', {}, inputs.all, ' ', el('label', { for: 'r-all', text: 'Every row of every outbox (no condition, no range)' })),
      el('label', { for: 'r-id', text: 'Name (optional; 1-64 letters, digits, - _ .; the walpost.replay header)' }), inputs.id,
      el('span', {}, inputs.dry_run, ' ', el('label', { for: 'r-dry-run', text: 'Dry run: route and count, publish nothing' })),
      note,
      el('button', { type: 'submit', id: 'start-replay', text: 'Start the replay' }));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const body = {};
      for (const k of ['where', 'since', 'until', 'id']) if (inputs[k].value.trim()) body[k] = inputs[k].value.trim();
      if (inputs.dry_run.checked) body.dry_run = true;
      const selects = body.where !== undefined || body.since !== undefined || body.until !== undefined;
      if (inputs.all.checked && selects) { c.notice(note, 'Every row, or a condition and range: not both.'); return; }
      if (!inputs.all.checked && !selects) { c.notice(note, 'Give a condition or a time range, or tick every row.'); return; }
      if (inputs.all.checked) body.all = true;
      const what = body.all ? 'EVERY row of every outbox table' : 'the rows ' + selectionOf({ where: body.where ?? null, since: body.since ?? null, until: body.until ?? null });
      c.confirmThen('Replay ' + what + (body.dry_run ? ' as a dry run (nothing published)' : ' to Kafka again') + (body.id ? ' as ' + body.id : '') + '?', 'Start',
        () => act('cannot start the replay', async () => {
          const started = await api('POST', '/api/v1/replays', body);
          location.hash = '#/replays/' + encodeURIComponent(started.id);
        }));
    });
    return form;
  }

  async function replays() {
    const list = el('section', { id: 'replay-list', 'aria-labelledby': 'h-replays' });
    put(main(), el('h1', { text: 'Replays' }), canAct() ? startForm() : null, list);
    let running = 0;
    const load = () => act('cannot read the replays', async () => {
      const data = await api('GET', '/api/v1/replays');
      running = data.running;
      const columns = [
        ['Name', (p) => el('a', { href: '#/replays/' + encodeURIComponent(p.id), text: p.id })],
        ['State', (p) => el('span', { class: 'state', 'data-state': p.state, text: p.state })],
        ['Selection', (p) => selectionOf(p)],
        ['Rows read', (p) => p.rows_read],
        ['Events published', (p) => p.events_published],
        ['Started', (p) => p.started_at],
        ['Finished', (p) => p.finished_at],
        ['Error', (p) => p.error],
      ];
      if (canAct()) columns.push(['', (p) => p.state === 'running' ? stopButton(p, load) : '']);
      put(list, el('h2', { id: 'h-replays', text: 'Replays (' + data.running + ' of at most ' + data.max_running + ' running)' }),
        data.replays.length
          ? table('replays', columns, data.replays, 'Running and the last ended, newest first; a restart forgets them')
          : el('p', { class: 'muted', id: 'replays-empty', text: 'No replay since walpost started.' }),
        el('button', { type: 'button', id: 'replays-refresh', text: 'Refresh', onclick: load }));
    });
    await load();
    follow(location.hash, load, () => running > 0);
  }

  async function replay(id) {
    const box = el('section', { class: 'card wide', id: 'replay', 'aria-labelledby': 'h-replay' });
    put(main(), el('p', {}, el('a', { href: '#/replays', text: '← Replays' })), el('h1', {}, 'Replay ', el('code', { text: id })), box);
    let p = null;
    const load = () => act('cannot read replay ' + id, async () => {
      p = await api('GET', '/api/v1/replays/' + encodeURIComponent(id));
      const progress = p.state === 'running' && p.rows_read > 0
        ? el('progress', { max: p.rows_read, value: p.events_published, 'aria-label': 'Published of read' }) : null;
      put(box, el('h2', { id: 'h-replay', text: p.state === 'running' ? 'Running (refreshed every second)' : 'Ended' }),
        el('p', { class: 'state-line' }, 'State: ', el('span', { id: 'f-replay-state', class: 'state', 'data-state': p.state, text: p.state })),
        fields([
          ['Selection', 'f-selection', selectionOf(p)],
          ['Time column', 'f-time-column', p.time_column],
          ['Rows read', 'f-rows-read', p.rows_read],
          ['Events published', 'f-events-published', p.events_published],
          ['Started', 'f-started', p.started_at],
          ['Finished', 'f-finished', p.finished_at],
          ['Stop requested', 'f-stop-requested', p.stop_requested],
          ['Error', 'f-error', p.error],
        ]), progress,
        canAct() && p.state === 'running' ? stopButton(p, load) : null);
    });
    await load();
    follow(location.hash, load, () => p !== null && p.state === 'running');
  }

  // ---- Inbox: handlers ----

  async function handlers() {
    const statusBox = el('section', { class: 'card', 'aria-labelledby': 'h-consumer' }, el('h2', { id: 'h-consumer', text: 'Consumer' }));
    const list = el('section', { 'aria-labelledby': 'h-handlers' }, el('h2', { id: 'h-handlers', text: 'Handlers' }));
    put(main(), el('h1', { text: 'Inbox' }), statusBox, list);
    const load = () => act('cannot read the inbox', async () => {
      const s = await api('GET', '/api/v1/inbox/status');
      put(statusBox, el('h2', { id: 'h-consumer', text: 'Consumer' }), fields([
        ['State', 'f-state', s.state], ['Group', 'f-group', s.group], ['Schema', 'f-schema', s.schema],
        ['Halted because', 'f-halted', s.halted_reason], ['Assigned partitions', 'f-assigned', s.assigned_partitions],
        ['Records stored', 'f-stored', s.records_stored], ['Duplicates', 'f-duplicates', s.duplicates], ['Rejected', 'f-rejected', s.rejected],
      ]), (s.consumer_lag || []).length ? table('consumer-lag', [['Topic', (l) => l.topic], ['Partition', (l) => l.partition], ['Lag (records)', (l) => l.lag]], s.consumer_lag, 'Consumer lag per partition') : null);
      const data = await api('GET', '/api/v1/inbox/handlers');
      const columns = [
        ['Handler', (h) => el('a', { href: '#/handlers/' + encodeURIComponent(h.handler), text: h.handler })],
        ['Backlog', (h) => h.backlog],
        ['Oldest pending', (h) => seconds(h.oldest_pending_seconds)],
        ['Leased', (h) => h.leased],
        ['Review required', (h) => h.review_required],
        ['Attempts', (h) => h.attempts],
        ['Paused', (h) => h.paused],
      ];
      if (canAct()) {
        columns.push(['', (h) => {
          const verb = h.paused ? 'resume' : 'pause';
          return el('button', { type: 'button', 'data-action': verb, 'data-handler': h.handler, class: h.paused ? '' : 'danger', text: h.paused ? 'Resume' : 'Pause', 'aria-label': (h.paused ? 'Resume ' : 'Pause ') + h.handler, onclick: () =>
            c.confirmThen((h.paused ? 'Resume' : 'Pause') + ' handler ' + h.handler + '?' + (h.paused ? '' : ' inbox.claim offers it nothing until resumed.'), h.paused ? 'Resume' : 'Pause',
              () => act('cannot ' + verb + ' ' + h.handler, async () => {
                await api('POST', '/api/v1/inbox/handlers/' + encodeURIComponent(h.handler) + '/' + verb);
                await load();
              })) });
        }]);
      }
      put(list, el('h2', { id: 'h-handlers', text: 'Handlers' }), table('handlers', columns, data.handlers || []),
        el('button', { type: 'button', id: 'refresh', text: 'Refresh', onclick: load }));
    });
    await load();
  }

  // ---- Inbox: a handler's review queue ----

  async function review(handler) {
    const base = '/api/v1/inbox/handlers/' + encodeURIComponent(handler);
    const groupsBox = el('section', { 'aria-labelledby': 'h-groups' });
    const messagesBox = el('section', { 'aria-labelledby': 'h-messages' });
    const result = el('div', { id: 'review-result' });
    put(main(),
      el('p', {}, el('a', { href: '#/handlers', text: '← Handlers' })),
      el('h1', {}, 'Review queue of ', el('code', { text: handler })),
      el('p', { class: 'muted' }, 'Messages that used up their attempts wait here. What to do: ',
        c.runbookLink('runbooks/inbox-review-required.md')),
      result, groupsBox, messagesBox);
    // The ids of a group without an error code: listed, then selected by id.
    const idsWithoutCode = async () => {
      const data = await api('GET', base + '/review?limit=10000');
      return (data.messages || []).filter((m) => m.last_error_code === null).map((m) => m.event_id);
    };
    const bulk = (verb, g) => act('cannot ' + verb, async () => {
      const body = g.error_code === null ? { event_ids: await idsWithoutCode() } : { error_code: g.error_code };
      if (body.event_ids && !body.event_ids.length) return;
      const data = await api('POST', base + '/' + verb, body);
      c.notice(result, (verb === 'retry' ? 'Retried ' : 'Dismissed ') + data.count + ' message(s) of ' + shown(g.error_code) + '.');
      await load();
    });
    const load = () => act('cannot read the review queue', async () => {
      const grouped = await api('GET', base + '/review?group_by=error_code');
      const columns = [
        ['Error code', (g) => el('code', { text: g.error_code === null ? '(none)' : g.error_code })],
        ['Messages', (g) => g.count],
        ['First', (g) => g.first_at],
        ['Last', (g) => g.last_at],
        ['Sample of event ids', (g) => g.sample_event_ids],
      ];
      if (canAct()) {
        columns.push(['', (g) => {
          const code = g.error_code === null ? '' : g.error_code;
          const label = g.error_code === null ? 'without an error code' : 'with error code ' + g.error_code;
          return el('span', { class: 'row' },
            el('button', { type: 'button', 'data-action': 'retry', 'data-code': code, text: 'Retry', 'aria-label': 'Retry the messages ' + label, onclick: () =>
              c.confirmThen('Retry the ' + g.count + ' message(s) ' + label + '? They become pending with their attempts reset.', 'Retry', () => bulk('retry', g)) }),
            el('button', { type: 'button', class: 'danger', 'data-action': 'dismiss', 'data-code': code, text: 'Dismiss', 'aria-label': 'Dismiss the messages ' + label, onclick: () =>
              c.confirmThen('Dismiss the ' + g.count + ' message(s) ' + label + '? The handler will not get them again.', 'Dismiss', () => bulk('dismiss', g)) }));
        }]);
      }
      const groups = grouped.groups || [];
      put(groupsBox, el('h2', { id: 'h-groups', text: 'By error code' }), groups.length
        ? table('review-groups', columns, groups)
        : el('p', { class: 'muted', id: 'review-empty', text: 'No message waits for review.' }));
      const listed = await api('GET', base + '/review?limit=100');
      put(messagesBox, el('h2', { id: 'h-messages', text: 'Messages (the first 100)' }), table('review-messages', [
        ['Event id', (m) => m.event_id], ['Topic', (m) => m.topic], ['Partition', (m) => m.partition], ['Offset', (m) => m.offset],
        ['Event type', (m) => m.event_type], ['Attempts', (m) => m.attempts], ['Last error code', (m) => m.last_error_code], ['Received', (m) => m.received_at],
      ], listed.messages || []));
    });
    await load();
  }

  window.walpostPages = { overview, updateOverview, deadLetters, replays, replay, handlers, review };
})();
