// The console's pages: the relay's overview, dead letters and replays; the inbox's handlers
// and a handler's review queue. Helpers and the API come from app.js (window.walpostConsole).
'use strict';

(function () {
  const c = window.walpostConsole;
  const { el, put, shown, bytes, seconds, pick, api, table, fields, canAct, main } = c;

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

  function deadLetterRows(data) {
    if (Array.isArray(data)) return data;
    return (data && (data.dead_letters || data.records || data.items)) || [];
  }

  async function deadLetters() {
    const limit = el('input', { id: 'dl-limit', type: 'number', min: 1, max: 10000, value: 100 });
    const reason = el('select', { id: 'dl-reason' }, el('option', { value: '', text: 'every reason' }));
    const list = el('div', { id: 'dl-list' });
    const result = el('div', { id: 'dl-result' });
    const form = el('form', { class: 'filters' },
      el('label', { for: 'dl-reason', text: 'Reason' }), reason,
      el('label', { for: 'dl-limit', text: 'Newest' }), limit,
      el('button', { type: 'submit', text: 'Refresh' }));
    put(main(), el('h1', { text: 'Dead letters' }), form, list, result);
    let rows = [];
    const draw = () => {
      const want = reason.value;
      const shownRows = rows.filter((r) => !want || pick(r, 'reason') === want);
      const checks = [];
      const columns = [
        ['Event id', (r) => pick(r, 'event_id', 'id')],
        ['Event type', (r) => pick(r, 'event_type', 'type')],
        ['Original topic', (r) => pick(r, 'original_topic', 'topic')],
        ['Reason', (r) => pick(r, 'reason')],
        ['Violation', (r) => pick(r, 'violation', 'violation_pointer', 'pointer')],
        ['Time', (r) => pick(r, 'at', 'time', 'timestamp')],
        ['Redrive', (r) => pick(r, 'redrive', 'redrive_state', 'redriven')],
      ];
      if (canAct()) {
        columns.unshift(['Select', (r) => {
          const id = String(pick(r, 'event_id', 'id'));
          const box = el('input', { type: 'checkbox', 'aria-label': 'Select ' + id, 'data-event-id': id });
          checks.push(box);
          return box;
        }]);
      }
      const parts = [table('dead-letters', columns, shownRows, shownRows.length + ' of ' + rows.length + ' dead letters read')];
      if (canAct()) {
        parts.push(el('div', { class: 'row' },
          el('button', { type: 'button', id: 'redrive-selected', text: 'Redrive selected', onclick: () => {
            const ids = checks.filter((b) => b.checked).map((b) => b.dataset.eventId);
            if (!ids.length) { c.notice(result, 'Select the dead letters to redrive first.'); return; }
            c.confirmThen('Redrive ' + ids.length + ' event(s) through the current router and contracts?', 'Redrive', () => redrive({ event_ids: ids }));
          } }),
          want ? el('button', { type: 'button', id: 'redrive-reason', text: 'Redrive all of reason "' + want + '"', onclick: () =>
            c.confirmThen('Redrive every dead letter of reason "' + want + '"?', 'Redrive', () => redrive({ reason: want })) }) : null));
      }
      put(list, ...parts);
    };
    const redrive = (body) => act('cannot redrive', async () => {
      const data = await api('POST', '/api/v1/dead-letters/redrive', body);
      const results = Array.isArray(data) ? data : (data && data.results) || [];
      put(result, el('h2', { text: 'Redrive results' }), table('redrive-results', [
        ['Event id', (r) => pick(r, 'event_id', 'id')],
        ['Result', (r) => pick(r, 'result', 'outcome', 'state')],
        ['Why', (r) => pick(r, 'reason', 'detail', 'error')],
      ], results));
      await load();
    });
    const load = () => act('cannot read the dead letters', async () => {
      rows = deadLetterRows(await api('GET', '/api/v1/dead-letters?limit=' + encodeURIComponent(limit.value)));
      const had = reason.value;
      const reasons = [...new Set(rows.map((r) => pick(r, 'reason')).filter(Boolean))].sort();
      put(reason, el('option', { value: '', text: 'every reason' }), reasons.map((r) => el('option', { value: r, text: r })));
      if (reasons.includes(had)) reason.value = had;
      draw();
    });
    reason.addEventListener('change', draw);
    form.addEventListener('submit', (ev) => { ev.preventDefault(); load(); });
    await load();
  }

  // ---- Relay: replays ----

  const FINISHED = ['done', 'finished', 'stopped', 'failed', 'cancelled'];

  async function replays() {
    const inputs = {
      where: el('input', { id: 'r-where', type: 'text', placeholder: "aggregate_type = 'order'", size: 40 }),
      event_ids: el('input', { id: 'r-ids', type: 'text', placeholder: 'id-1, id-2', size: 40 }),
      since: el('input', { id: 'r-since', type: 'text', placeholder: '2026-11-28T00:00:00Z' }),
      until: el('input', { id: 'r-until', type: 'text', placeholder: '2026-11-29T00:00:00Z' }),
    };
    const list = el('div', { id: 'replay-list' });
    const form = el('form', { class: 'stack', id: 'replay-form' },
      el('h2', { text: 'Start a replay' }),
      el('p', { class: 'muted', text: 'The same rules as walpost replay: a condition of columns compared with constants, event ids, or a time range; any together.' }),
      el('label', { for: 'r-where', text: 'Condition (where)' }), inputs.where,
      el('label', { for: 'r-ids', text: 'Event ids (comma-separated)' }), inputs.event_ids,
      el('div', { class: 'row' },
        el('span', {}, el('label', { for: 'r-since', text: 'Since' }), ' ', inputs.since),
        el('span', {}, el('label', { for: 'r-until', text: 'Until' }), ' ', inputs.until)),
      el('button', { type: 'submit', id: 'start-replay', text: 'Start the replay' }));
    put(main(), el('h1', { text: 'Replays' }), canAct() ? form : null, list);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const body = {};
      if (inputs.where.value.trim()) body.where = inputs.where.value.trim();
      const ids = inputs.event_ids.value.split(',').map((s) => s.trim()).filter(Boolean);
      if (ids.length) body.event_ids = ids;
      if (inputs.since.value.trim()) body.since = inputs.since.value.trim();
      if (inputs.until.value.trim()) body.until = inputs.until.value.trim();
      c.confirmThen('Start a replay of ' + (Object.keys(body).length ? JSON.stringify(body) : 'every row') + '?', 'Start', () =>
        act('cannot start the replay', async () => {
          const started = await api('POST', '/api/v1/replays', body);
          const id = pick(started, 'id', 'replay_id');
          if (id !== null) c.rememberReplay(String(id));
          await load();
        }));
    });
    const load = () => act('cannot read the replays', async () => {
      let ids = c.rememberedReplays();
      let known = null;
      try {
        const data = await api('GET', '/api/v1/replays');
        known = Array.isArray(data) ? data : (data && data.replays) || null;
      } catch (f) {
        if (f.status !== 404 && f.status !== 405) throw f;
      }
      const progress = [];
      if (known) progress.push(...known);
      else for (const id of ids) progress.push(await api('GET', '/api/v1/replays/' + encodeURIComponent(id)).catch((f) => ({ id, state: f.message })));
      ids = progress.map((p) => String(pick(p, 'id', 'replay_id')));
      const columns = [
        ['Id', (p) => pick(p, 'id', 'replay_id')],
        ['State', (p) => pick(p, 'state', 'status')],
        ['Progress', (p) => {
          const done = pick(p, 'published', 'rows_published', 'done');
          const total = pick(p, 'total', 'rows', 'rows_total');
          if (typeof done === 'number' && typeof total === 'number' && total > 0) {
            return el('span', {}, el('progress', { max: total, value: done }), ' ' + done + ' / ' + total);
          }
          return done;
        }],
        ['Started', (p) => pick(p, 'started_at', 'started')],
        ['Selection', (p) => pick(p, 'where', 'selection', 'condition')],
      ];
      if (canAct()) {
        columns.push(['', (p) => FINISHED.includes(pick(p, 'state', 'status')) ? '' : el('button', { type: 'button', class: 'danger', text: 'Stop', 'aria-label': 'Stop replay ' + pick(p, 'id', 'replay_id'), onclick: () =>
          c.confirmThen('Stop replay ' + pick(p, 'id', 'replay_id') + '?', 'Stop', () => act('cannot stop the replay', async () => {
            await api('DELETE', '/api/v1/replays/' + encodeURIComponent(pick(p, 'id', 'replay_id')));
            await load();
          })) })]);
      }
      put(list, el('h2', { text: 'Replays' }), progress.length
        ? table('replays', columns, progress)
        : el('p', { class: 'muted', text: 'No replay started from this tab.' }),
      el('button', { type: 'button', text: 'Refresh', onclick: load }));
    });
    await load();
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

  window.walpostPages = { overview, updateOverview, deadLetters, replays, handlers, review };
})();
