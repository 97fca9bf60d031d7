//! The `kactivator` binary: parses the command line, wires the control thread to the shards, and
//! runs until drained.

#![forbid(unsafe_code)]

mod cli;
mod demo;
mod keda_http;
mod queue_proxy;
mod start;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    start::init_logging(&cli.logging);
    log_panics();
    let result = match cli.command {
        Some(cli::Command::Demo(ref demo_args)) => demo::run(&cli, demo_args),
        Some(cli::Command::QueueProxy(ref args)) => queue_proxy::run(&cli, args),
        Some(cli::Command::KedaHttp) => keda_http::run(&cli),
        None => start::run(&cli, None),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // Said once: as a plain line for a person, as a log event for a collector.
            match cli.logging.log_format {
                cli::LogFormat::Text => eprintln!("kactivator: {error}"),
                cli::LogFormat::Json => tracing::error!("{error}"),
            }
            std::process::ExitCode::from(error.exit_code())
        }
    }
}

/// Every panic becomes one log event (in the log's format, with the thread that panicked and
/// where), whether or not it is then contained to a request (`shards::runtime::contain`).
fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        let location = info
            .location()
            .map(|location| location.to_string())
            .unwrap_or_default();
        let thread = thread.name().unwrap_or("unnamed");
        // With RUST_BACKTRACE set, as the default hook does.
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            tracing::error!(thread, %location, %backtrace, "panic: {message}");
        } else {
            tracing::error!(thread, %location, "panic: {message}");
        }
    }));
}
