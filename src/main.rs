//! The `kactivator` binary: parses the command line, wires the control thread to the shards, and
//! runs until drained.

#![forbid(unsafe_code)]

mod cli;
mod demo;
mod start;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    start::init_logging(&cli.logging);
    let result = match cli.command {
        Some(cli::Command::Demo(ref demo_args)) => demo::run(&cli, demo_args),
        None => start::run(&cli, None),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kactivator: {error}");
            tracing::error!("{error}");
            std::process::ExitCode::from(error.exit_code())
        }
    }
}
