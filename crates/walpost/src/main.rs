//! The `walpost` binary: flags, logging, signals, and one call into the pipeline.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use walpost::cli::{Cli, Command, LogFormat, SlotAction};
use walpost::config::{FileConfig, Settings};
use walpost::error::PipelineError;
use walpost::metrics::{self, Metrics};
use walpost::{monitor, ops, pipeline};

/// How long after start-up the slot monitor, retention and heartbeat tasks begin.
const BACKGROUND_START_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // One thread runs the pipeline and drives its sockets: a record read from PostgreSQL
    // is decoded and handed to librdkafka (which has its own threads) without waking
    // another thread. With a multi-threaded runtime the pipeline ran on the main thread
    // while a worker polled its sockets: a thread wake-up per read, visible in a profile
    // of the live benchmark. Blocking calls go to spawn_blocking.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    let file = match &cli.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    match cli.command {
        Command::Run(args) => {
            let settings = Settings::resolve(&args, file)?;
            let metrics = Arc::new(Metrics::default());
            if let Some(addr) = settings.metrics_addr {
                metrics::serve(addr, metrics.clone())
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr}: {e}"))?;
            }
            tracing::info!(
                version = walpost::VERSION,
                postgres = %settings.postgres.redacted(),
                kafka = %settings.kafka_brokers,
                table = %settings.table,
                slot = %settings.slot,
                "walpost starting"
            );
            let shutdown = shutdown_signal()?;
            let (fatal_tx, mut fatal) = tokio::sync::watch::channel(None);
            // The background tasks start a moment later, so their connections do not
            // compete with the pipeline's on the way to the first record.
            let background = (settings.clone(), metrics.clone(), shutdown.clone());
            tokio::spawn(async move {
                let (settings, metrics, shutdown) = background;
                tokio::time::sleep(BACKGROUND_START_DELAY).await;
                tokio::spawn(monitor::run(settings.clone(), metrics.clone(), fatal_tx));
                tokio::spawn(walpost::retention::task(settings.clone(), metrics, shutdown));
                if let Some(every) = settings.heartbeat_interval {
                    tokio::spawn(monitor::heartbeat(settings, every));
                }
            });
            tokio::select! {
                result = pipeline::run(&settings, metrics, shutdown) => result?,
                // The slot was invalidated or an outbox table stopped being streamed.
                Ok(()) = fatal.changed() => {
                    let message = fatal.borrow().clone().unwrap_or_default();
                    return Err(PipelineError::Definite(message).into());
                }
            }
            tracing::info!("stopped");
            Ok(())
        }
        Command::Check(args) => {
            let settings = Settings::resolve(&args, file)?;
            let checks = ops::check(&settings).await;
            if ops::any_failed(&checks) {
                anyhow::bail!("walpost check: some checks failed (see FAIL lines above)");
            }
            Ok(())
        }
        Command::ImportDebezium { file } => {
            let text =
                std::fs::read_to_string(&file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            let c = walpost::debezium::convert(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            print!("{}", c.toml);
            for note in &c.notes {
                eprintln!("note: {note}");
            }
            for (key, reason) in &c.not_carried {
                eprintln!("not carried over: {key}: {reason}");
            }
            if !c.not_carried.is_empty() {
                eprintln!("conversion incomplete: {} option(s) not carried over", c.not_carried.len());
                std::process::exit(2);
            }
            Ok(())
        }
        Command::Slot { action } => match action {
            SlotAction::Status { args, json } => {
                ops::slot_status(&Settings::resolve_without_kafka(&args, file)?, json).await
            }
            SlotAction::Create { args } => ops::slot_create(&Settings::resolve_without_kafka(&args, file)?).await,
            SlotAction::Drop { args, yes } => ops::slot_drop(&Settings::resolve_without_kafka(&args, file)?, yes).await,
        },
        Command::Retention(args) => Ok(walpost::retention::command(&args, file).await?),
    }
}

/// A watch channel that flips on the first SIGINT or SIGTERM.
fn shutdown_signal() -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = tokio::sync::watch::channel(false);
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WALPOST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
