//! The `walpost` binary: flags, logging, the runtime, and one call into [`walpost::app`].

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use walpost::cli::{Cli, LogColor, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.log_color);
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
