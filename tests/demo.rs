//! `kactivator demo` on a fresh machine: backends and proxy start, curl gets 200s through it.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use kactivator_testkit::ports::free_port;

#[test]
fn the_demo_serves_its_revision_and_prints_what_to_try() {
    let http = format!("127.0.0.1:{}", free_port());
    let http2 = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .args([
            "demo", "--http", &http, "--http2", &http2, "--admin", &admin,
        ])
        .env_remove("KACTIVATOR_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    let mut line = String::new();
    while stdout.read_line(&mut line).unwrap() > 0 {
        printed.push_str(&line);
        line.clear();
        if printed.contains("Ctrl-C") {
            break;
        }
    }
    assert!(
        printed.contains(&format!("curl -i http://{http}/")),
        "{printed}"
    );

    let url = format!("http://{http}/");
    let mut pods_seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let (ok, body) = support::curl(&["-H", "Host: hello.default.svc.cluster.local", &url]);
        assert!(ok);
        let body = String::from_utf8(body).unwrap();
        assert!(body.starts_with("hello from hello-pod-"), "{body}");
        pods_seen.insert(body);
    }
    assert_eq!(
        pods_seen.len(),
        3,
        "the demo spreads over its three pods: {pods_seen:?}"
    );
    let (ok, metrics) = support::curl(&[&format!("http://{admin}/metrics")]);
    assert!(ok);
    assert!(String::from_utf8_lossy(&metrics).contains("activator_request_count{"));

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let exited = support::eventually(Duration::from_secs(10), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    assert!(exited, "the demo exits on SIGTERM");
}
