//! The composition root: turns a parsed command line into settings, and wires the
//! stream and its side tasks (metrics server, liveness beat, slot monitor, retention,
//! heartbeat, signals) for `walpost run`, or runs one of the operator commands. Only
//! connects things; the work is in the modules it calls.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::cli::{CheckArgs, CheckTarget, Cli, Command, ContractsAction, SlotAction};
use crate::error::{ErrorKind, PipelineError};
use crate::settings::admin::AdminSettings;
use crate::settings::{FileConfig, Settings};
use crate::telemetry::{http, Health, Metrics};
use crate::{control, kafka, monitor, ops, retention, stream};
use inbox::metrics::InboxMetrics;
use inbox::settings::InboxSettings;

/// How long after start-up the slot monitor, retention and heartbeat tasks begin, so
/// their connections do not compete with the stream's on the way to the first record.
const BACKGROUND_START_DELAY: Duration = Duration::from_secs(1);

/// `/healthz` fails when the stream's runtime has not run for this long.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(30);
/// At a stop, queued spans get this long to reach the OTLP endpoint.
const SPAN_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The process's exit code for a run that did not fail: 0, or what a command says
/// (`walpost slot status` by the slot's state, `import-debezium` 2 when incomplete).
pub type ExitCode = u8;

/// Runs the command. `Err`: a definite error (exit 1), already explained by its text.
pub async fn main(cli: Cli) -> Result<ExitCode, PipelineError> {
    // A client of a running walpost: no configuration file of its own, and its errors are
    // its exit codes (ops::ctl::exit), not a PipelineError.
    if let Command::Ctl(args) = &cli.command {
        return Ok(ops::ctl::command(args.options(), &args.action()).await);
    }
    let file = match &cli.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    match cli.command {
        Command::Run(args) => run(Settings::resolve(&args.overrides(), file)?).await.map(|()| 0),
        Command::Check(check) => {
            let checks = match *check {
                CheckArgs { target: Some(CheckTarget::Inbox(args)), .. } => {
                    inbox::check::check(&crate::settings::inbox::resolve(&args.overrides(), file)?).await
                }
                CheckArgs { target: None, run } => ops::check::check(&Settings::resolve(&run.overrides(), file)?).await,
            };
            if ops::check::any_failed(&checks) {
                return Err(PipelineError::definite(
                    ErrorKind::Config,
                    "walpost check: some checks failed (see FAIL lines above)",
                ));
            }
            Ok(0)
        }
        Command::ImportDebezium { file: path } => {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                PipelineError::definite(ErrorKind::Config, format!("cannot read {}: {e}", path.display()))
            })?;
            let c = ops::import_debezium::convert(&text)
                .map_err(|e| PipelineError::definite(ErrorKind::Config, format!("{}: {e}", path.display())))?;
            print!("{}", c.toml);
            for note in &c.notes {
                eprintln!("note: {note}");
            }
            for (key, reason) in &c.not_carried {
                eprintln!("not carried over: {key}: {reason}");
            }
            if c.not_carried.is_empty() {
                Ok(0)
            } else {
                eprintln!("conversion incomplete: {} option(s) not carried over", c.not_carried.len());
                Ok(2)
            }
        }
        Command::Slot { action } => match action {
            SlotAction::Status { args, json } => {
                ops::slot::status(&Settings::resolve_without_kafka(&args.overrides(), file)?, json).await
            }
            SlotAction::Create { args } => {
                ops::slot::create(&Settings::resolve_without_kafka(&args.overrides(), file)?).await.map(|()| 0)
            }
            SlotAction::Drop { args, yes } => {
                ops::slot::drop(&Settings::resolve_without_kafka(&args.overrides(), file)?, yes).await.map(|()| 0)
            }
        },
        Command::Retention(args) => {
            let settings = Settings::resolve_without_kafka(&args.overrides(), file)?;
            retention::command(&settings, args.dry_run).await.map(|()| 0)
        }
        Command::Contracts { action } => {
            let (action, args) = match action {
                ContractsAction::Check(a) => (ops::contracts::Action::Check, a),
                ContractsAction::Push(a) => (ops::contracts::Action::Push, a),
            };
            let mut registry = file.registry;
            if args.registry.is_some() {
                registry.url = args.registry;
            }
            let (strategy, topic) = (args.subject_strategy.as_deref(), args.topic.as_deref());
            ops::contracts::command(action, &registry, &args.dir, strategy, topic).await.map(|()| 0)
        }
        Command::Replay(args) => {
            let mut settings = Settings::resolve(&args.run.overrides(), file)?;
            attach_registry(&mut settings, None).await?;
            let spec = ops::replay::spec(
                &settings.source,
                args.id,
                args.since,
                args.until,
                ops::replay::cli_condition(args.condition, args.unsafe_where)?,
                args.time_column,
                args.dry_run,
                args.statement_timeout,
            );
            ops::replay::command(&settings, &spec).await.map(|()| 0)
        }
        Command::Migrate(args) => {
            let (target, status) = match args.action {
                Some(crate::cli::MigrateAction::Status(target)) => (target, true),
                None => (args.target, false),
            };
            let target = migrate_target(target, file)?;
            match status {
                true => ops::migrate::status(&target).await.map(|()| 0),
                false => ops::migrate::command(&target, args.dry_run).await.map(|()| 0),
            }
        }
        // Answered above, before the configuration file is read.
        Command::Ctl(_) => Ok(ops::ctl::exit::USAGE),
        Command::Inbox(args) => {
            let (settings, admin) = crate::settings::inbox::resolve_with_admin(&args.overrides(), file)?;
            run_inbox(settings, admin).await.map(|()| 0)
        }
    }
}

/// `walpost inbox`: the ingest and its metrics server, until a signal or a definite error.
async fn run_inbox(settings: InboxSettings, admin: Option<AdminSettings>) -> Result<(), PipelineError> {
    let health = Arc::new(Health::new(Duration::from_secs(30), LIVENESS_TIMEOUT));
    let metrics = InboxMetrics::new(health.clone()).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
    serve_metrics(settings.metrics_addr, &metrics)?;
    tracing::info!(
        version = crate::VERSION,
        postgres = %settings.postgres.redacted(),
        kafka = %settings.brokers,
        group = %settings.group,
        "walpost inbox starting"
    );
    let shutdown = shutdown_signal()?;
    // Its own thread and connection: requests never wait for the ingest, nor it for them.
    let _admin = match &admin {
        Some(admin) => Some(control::inbox::start(admin, &settings, &metrics, shutdown.clone())?),
        None => None,
    };
    spawn_beat(health.clone());
    let stopped = shutdown.clone();
    match inbox::run(&settings, &metrics, shutdown).await {
        // A stop during a PostgreSQL outage: the unwritten batch is read again next time.
        Err(e) if e.is_transient() && *stopped.borrow() => {
            tracing::warn!("{e}");
            Ok(())
        }
        other => other,
    }
}

/// With `[registry]`: every router's contract is the registry's (they share one, and its
/// schema cache). A registry that refuses walpost stops it here.
async fn attach_registry(settings: &mut Settings, metrics: Option<&Metrics>) -> Result<(), PipelineError> {
    let Some(r) = &settings.registry else {
        return Ok(());
    };
    registry::probe(r).await?;
    let contract = registry::contract(r, metrics.map(|m| &m.contracts))?;
    for router in settings.source.routers_mut() {
        router.contract = Some(contract.clone());
    }
    Ok(())
}

/// Every router's contract counted in `walpost_contract_checks_total` (they share one).
fn meter_contracts(settings: &mut Settings, metrics: &Metrics) {
    let Some(contract) = settings.source.router().contract.clone() else {
        return;
    };
    let metered = metrics.contracts.meter(&contract);
    for router in settings.source.routers_mut() {
        router.contract = Some(metered.clone());
    }
}

/// `walpost run`: the stream plus its side tasks, until a signal or a definite error.
async fn run(mut settings: Settings) -> Result<(), PipelineError> {
    let health = Arc::new(Health::new(settings.stream.unready_after, LIVENESS_TIMEOUT));
    let metrics = Metrics::new(health.clone()).map_err(|e| PipelineError::definite(ErrorKind::Internal, e))?;
    metrics.kafka.declare_dead_letter_classes(router::ERROR_CLASSES.iter().chain(kafka::rejection::CLASSES).copied());
    attach_registry(&mut settings, Some(&metrics)).await?;
    meter_contracts(&mut settings, &metrics);
    let server = serve_metrics(settings.telemetry.metrics_addr, &metrics)?;
    tracing::info!(
        version = crate::VERSION,
        postgres = %settings.postgres.server.redacted(),
        kafka = %settings.kafka()?.brokers,
        table = %settings.source.table(),
        slot = %settings.source.slot,
        "walpost starting"
    );
    kafka::config::log_defaults(&settings.kafka()?.properties);
    if let Some(contract) = &settings.source.router().contract {
        tracing::info!(
            "contracts: every payload is checked against its event type's schema ({})",
            contract.0.describe()
        );
    }
    // Only with OTEL_EXPORTER_OTLP_ENDPOINT: otherwise no thread, no queue, no spans.
    let spans = match &settings.telemetry.otel {
        Some(otel) => Some(otlp::Exporter::start(otel, metrics.spans.clone())?),
        None => None,
    };
    let shutdown = shutdown_signal()?;
    let stop = shutdown.clone();
    spawn_beat(health.clone());
    let (fatal_tx, mut fatal) = watch::channel(None);
    let (seen_tx, seen) = watch::channel(None);
    // A backfill (--snapshot initial_only) reads no slot and runs beside the service:
    // the slot monitor, retention, heartbeat and admin API are the service's.
    let backfill = settings.snapshot.mode == crate::settings::SnapshotMode::InitialOnly;
    // Beside the metrics server; a stop closes it (an exit ends its thread in any case).
    let _admin = match &settings.admin {
        Some(admin) if !backfill => Some(control::start(admin, &settings, &metrics, seen, shutdown.clone())?),
        _ => None,
    };
    if !backfill {
        // A pause taken before this process started (or through another instance) holds
        // from the first session on; then it is followed every few seconds.
        let (writer, slot) = (settings.postgres.writer().clone(), settings.source.slot.clone());
        crate::postgres::pause::read_at_start(&writer, &slot, &health).await;
        tokio::spawn(crate::postgres::pause::follow(writer, slot, health.clone(), shutdown.clone()));
    }
    let side = (settings.clone(), metrics.clone(), shutdown.clone());
    tokio::spawn(async move {
        if backfill {
            return;
        }
        let (settings, metrics, shutdown) = side;
        tokio::time::sleep(BACKGROUND_START_DELAY).await;
        tokio::spawn(monitor::run(
            settings.postgres.clone(),
            settings.source.clone(),
            settings.monitor.clone(),
            metrics.clone(),
            fatal_tx,
            seen_tx,
            shutdown.clone(),
        ));
        let heartbeat_shutdown = shutdown.clone();
        tokio::spawn(retention::task(settings.clone(), metrics.retention.clone(), shutdown));
        if let Some(every) = settings.source.heartbeat_interval {
            tokio::spawn(monitor::heartbeat::run(settings.postgres, every, heartbeat_shutdown));
        }
    });
    let result = tokio::select! {
        result = stream::run(&settings, &metrics, spans.as_ref(), shutdown) => result,
        // The slot was invalidated or an outbox table stopped being streamed.
        Ok(()) = fatal.changed() => {
            let message = fatal.borrow().clone().unwrap_or_default();
            Err(PipelineError::definite(ErrorKind::Slot, message))
        }
    };
    if let Some(spans) = spans {
        // The spans of what was delivered before the stop; off the runtime's thread.
        let _ = tokio::task::spawn_blocking(move || spans.shutdown(SPAN_FLUSH_TIMEOUT)).await;
    }
    if let Err(e) = &result {
        linger_halted(&settings, &health, e, stop, server).await;
    }
    result?;
    tracing::info!("stopped");
    Ok(())
}

/// A halt is an exit 1 that alerting built on /metrics would never see (the counters of
/// the refused record vanish with the process): with a metrics server, walpost first
/// serves `walpost_halted 1` (and `/readyz` "halted: ...") for `[pipeline]
/// halt_linger_secs`, then exits. A signal ends the wait at once, and so does a new
/// walpost taking the metrics port over (the runbooks' restart, done at once).
async fn linger_halted(
    s: &Settings,
    health: &Health,
    e: &PipelineError,
    mut stop: watch::Receiver<bool>,
    server: Option<http::Server>,
) {
    let Some(mut server) = server else { return };
    if e.is_transient() || s.stream.halt_linger.is_zero() {
        return;
    }
    health.set_halted(e.to_string());
    tracing::error!(
        kind = %e.kind(),
        "halted: {e} (serving walpost_halted = 1 on /metrics for {} s, then exiting 1)",
        s.stream.halt_linger.as_secs()
    );
    if *stop.borrow() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(s.stream.halt_linger) => {}
        _ = stop.changed() => {}
        _ = server.released() => {}
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr`, when one is configured.
fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    metrics: &(impl service::telemetry::Exporter + Clone),
) -> Result<Option<http::Server>, PipelineError> {
    let Some(addr) = addr else { return Ok(None) };
    http::serve(addr, metrics.clone()).map(Some).map_err(|e| {
        PipelineError::definite(ErrorKind::Host, format!("cannot serve metrics on {addr}: {e}")).caused_by(e)
    })
}

/// The beat proves the runtime's thread runs (`/healthz`).
fn spawn_beat(health: Arc<Health>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            // Tests: a spawned task that panics (`FAILPOINTS=beat=panic`).
            #[cfg(feature = "failpoints")]
            fail::fail_point!("beat");
            health.beat();
        }
    });
}

/// A watch channel that flips on the first SIGINT or SIGTERM.
fn shutdown_signal() -> Result<watch::Receiver<bool>, PipelineError> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind| {
        signal(kind).map_err(|e| PipelineError::definite(ErrorKind::Host, format!("cannot listen for signals: {e}")))
    };
    let mut term = listen(SignalKind::terminate())?;
    let mut int = listen(SignalKind::interrupt())?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{name} received: stopping reading, flushing Kafka, confirming");
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// `walpost migrate`'s database (the flag, else the file's `postgres`), set and schema.
fn migrate_target(t: crate::cli::MigrateTarget, file: FileConfig) -> Result<ops::migrate::Target, PipelineError> {
    let url = t.postgres.or(file.postgres).ok_or_else(|| {
        PipelineError::definite(ErrorKind::Config, "walpost migrate needs --postgres (or WALPOST_POSTGRES)")
    })?;
    let config = |e: &dyn std::fmt::Display| PipelineError::definite(ErrorKind::Config, format!("--postgres: {e}"));
    let mut postgres = match t.postgres_password_file.or(file.postgres_password_file) {
        None => replication::Config::from_url(&url).map_err(|e| config(&e))?,
        Some(path) => {
            // The file wins over PGPASSWORD, not over a password in the URL.
            let mut c = replication::Config::parse_with_env(&url, &|k| {
                (k != "PGPASSWORD").then(|| std::env::var(k).ok()).flatten()
            })
            .map_err(|e| config(&e))?;
            c.set_password_if_missing(
                crate::settings::secrets::read_secret_file(&path, "the PostgreSQL password").map_err(|e| config(&e))?,
            );
            c
        }
    };
    // Migrations write: on a multi-host URL, the primary.
    if postgres.target_session_attrs == replication::TargetSessionAttrs::Any {
        postgres.target_session_attrs = replication::TargetSessionAttrs::Primary;
    }
    let set = if t.inbox { migrate::Set::Inbox } else { migrate::Set::Outbox };
    let schema = t.schema.unwrap_or_else(|| set.default_schema().to_owned());
    Ok(ops::migrate::Target { postgres, set, schema })
}
