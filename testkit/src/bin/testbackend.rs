//! `kactivator-testbackend`: one test backend as a standalone process, for demos and for
//! tests that need the backend outside their own process (to kill it, for example).
//!
//! Prints `listening on <addr>` once ready and serves until SIGTERM or SIGINT. With `--grpc`
//! it runs the gRPC backend (HTTP/1.1 and h2c on one port) instead of the HTTP/1.1 one.

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use kactivator_testkit::backend::{run_until_signal, BackendConfig};
use kactivator_testkit::grpc::run_grpc_until_signal;

/// A Knative-queue-proxy-like HTTP/1.1 (or, with `--grpc`, gRPC and h2c) backend for
/// exercising kactivator.
#[derive(Debug, Parser)]
#[command(name = "kactivator-testbackend", version)]
struct Arguments {
    /// Address to listen on; port 0 picks a free port (see the `listening on` line).
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Name reported in `X-Backend` and the `/` greeting.
    #[arg(long)]
    name: String,
    /// Revision name reported in `X-Knative-Revision-Name`.
    #[arg(long)]
    revision_name: Option<String>,
    /// Revision namespace reported in `X-Knative-Revision-Namespace`.
    #[arg(long)]
    revision_namespace: Option<String>,
    /// Serve the gRPC Echo service, plain HTTP/1.1 and h2c on the port instead of the HTTP/1.1
    /// test routes.
    #[arg(long)]
    grpc: bool,
}

fn main() -> ExitCode {
    let arguments = Arguments::parse();
    let config = BackendConfig {
        name: arguments.name,
        revision_name: arguments.revision_name,
        revision_namespace: arguments.revision_namespace,
        keeps_working: false,
        max_concurrent_streams: None,
        http2_only: false,
    };
    let served = if arguments.grpc {
        run_grpc_until_signal(arguments.listen, config, announce)
    } else {
        run_until_signal(arguments.listen, config, announce)
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kactivator-testbackend: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the `listening on` line. Whoever started this process waits for it to learn the
/// port, so it must not sit in a buffer.
fn announce(addr: SocketAddr) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening on {addr}");
    let _ = stdout.flush();
}
