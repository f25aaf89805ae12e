//! The `walpost` binary: flags, logging, the runtime, and one call into [`walpost::app`].

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use walpost::cli::{Cli, LogColor, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.log_color);
    exit_on_panic();
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    // One thread runs the stream and drives its sockets: a record read from PostgreSQL
    // is decoded and handed to librdkafka (which has its own threads) without waking
    // another thread. Blocking calls go to spawn_blocking; the metrics server has a
    // thread of its own.
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(walpost::app::main(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // The kind sorts the error for log queries (`kind=slot`); the text is the
            // operator's message, quoted in the runbooks.
            tracing::error!(kind = %e.kind(), "{e}");
            ExitCode::FAILURE
        }
    }
}

/// A panic anywhere is a bug walpost cannot reason past, and must not go unnoticed: the
/// runtime catches a spawned task's panic and runs on without the task, and a thread's
/// panic ends only that thread (walpost would then run half-alive, or stop and exit 0).
/// So the panic is logged with the thread it happened on, and the process exits 101 at
/// once, which the systemd unit restarts (`Restart=on-failure`). Nothing is lost by
/// exiting there, as with a kill -9: what was not confirmed to PostgreSQL (`run`) or
/// committed with its offsets (`inbox`) is read again at the next start.
fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let thread = std::thread::current().name().unwrap_or("unnamed").to_owned();
        tracing::error!(
            thread,
            "walpost panicked, {info}; exiting with status 101 (a bug: please report it with this line)"
        );
        std::process::exit(PANIC_EXIT_CODE);
    }));
}

/// The exit status after a panic (Rust's own for a panicking main thread).
const PANIC_EXIT_CODE: i32 = 101;

fn init_logging(format: LogFormat, color: LogColor) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WALPOST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = match color {
        LogColor::Auto => std::io::stderr().is_terminal(),
        LogColor::Always => true,
        LogColor::Never => false,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
