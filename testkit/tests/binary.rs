//! Runs the `kactivator-testbackend` binary as a separate process: it announces its
//! address, serves, and exits cleanly on SIGTERM and SIGINT.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

fn run_and_signal(signal: libc::c_int) {
    run_and_signal_with(signal, &[]);
}

fn run_and_signal_with(signal: libc::c_int, extra_arguments: &[&str]) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kactivator-testbackend"))
        .args(["--listen", "127.0.0.1:0", "--name", "standalone"])
        .args(extra_arguments)
        .args([
            "--revision-name",
            "hello-00002",
            "--revision-namespace",
            "demo",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start kactivator-testbackend");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr: SocketAddr = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .trim_end()
        .parse()
        .unwrap();
    assert_ne!(addr.port(), 0);

    let response = support::get(addr, "/");
    assert_eq!(response.text(), "hello from standalone\n");
    assert_eq!(
        response.header("x-knative-revision-name"),
        Some("hello-00002")
    );
    assert_eq!(
        response.header("x-knative-revision-namespace"),
        Some("demo")
    );

    let process_id = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill has no memory-safety preconditions; the pid is our own child.
    assert_eq!(unsafe { libc::kill(process_id, signal) }, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert_eq!(rest, "", "only one line is printed");
}

#[test]
fn exits_cleanly_on_sigterm() {
    run_and_signal(libc::SIGTERM);
}

#[test]
fn exits_cleanly_on_sigint() {
    run_and_signal(libc::SIGINT);
}

/// The gRPC backend answers plain HTTP/1.1 `GET /` the same way, so the same checks hold.
#[test]
fn grpc_backend_exits_cleanly_on_sigterm() {
    run_and_signal_with(libc::SIGTERM, &["--grpc"]);
}
