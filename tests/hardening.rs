//! Issue 23: no input kills a shard, a panic ends only the request that caused it, health tells
//! the truth about the shards, a value out of bounds is refused where it enters, and an
//! operator's stop drains like a signal.

mod support;

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use support::{admin_get, curl, eventually, exchange, get, revision, scratch_dir, Activator};

/// The environment that arms the test-build-only faults (`shards::request::faults`).
const FAULTS: (&str, &str) = ("KACTIVATOR_TEST_FAULTS", "1");

fn with_fault(name: &str, fault: &str) -> String {
    format!(
        "GET / HTTP/1.1\r\nHost: {name}.default.svc.cluster.local\r\nK-Test-Fault: {fault}\r\n\r\n"
    )
}

#[test]
fn a_panic_while_serving_a_request_answers_500_and_the_shard_serves_on() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "hello", &[pod.addr()], ""),
        "",
        &["--shards", "1"],
        &[FAULTS],
    );
    // HTTP/1: the request that panics is answered 500 and its connection closes.
    let mut stream = activator.connect();
    stream
        .write_all(with_fault("hello", "panic").as_bytes())
        .unwrap();
    let mut buffered = Vec::new();
    let answer = support::read_response(&mut stream, &mut buffered).expect("an answer");
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert_eq!(
        answer.text(),
        kactivator_api::messages::INTERNAL_ERROR,
        "{answer:?}"
    );
    assert_eq!(answer.header("connection"), Some("close"));
    // The one shard lives on: the next request is served.
    assert_eq!(
        exchange(activator.http, get("hello", "/").as_bytes()).status,
        200
    );

    // HTTP/2 (h2c, a real client): the stream that panics gets a 500, and the shard answers
    // the next one (the activator's own probe answer: this pod speaks only HTTP/1, and an h2
    // request goes to a pod as h2c).
    let url = format!("http://{}/", activator.http2);
    let host = "Host: hello.default.svc.cluster.local";
    let (ok, out) = curl(&[
        "--http2-prior-knowledge",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        host,
        "-H",
        "K-Test-Fault: panic",
        &url,
    ]);
    assert!(ok);
    assert_eq!(String::from_utf8_lossy(&out), "500");
    let (ok, out) = curl(&[
        "--http2-prior-knowledge",
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        "K-Network-Probe: activator",
        &url,
    ]);
    assert!(ok);
    assert_eq!(String::from_utf8_lossy(&out), "200");

    assert_eq!(
        activator.metric_sum("kactivator_shard_panics_total", &[]),
        2.0
    );
    assert_eq!(admin_get(activator.admin, "/healthz").unwrap().0, 200);
    assert!(
        activator
            .stderr()
            .contains("test fault: a panic while serving a request"),
        "the panic is logged"
    );
    // Without the fault header nothing happens, with an unknown fault neither.
    let mut other = activator.connect();
    other
        .write_all(with_fault("hello", "something-else").as_bytes())
        .unwrap();
    assert_eq!(
        support::read_response(&mut other, &mut Vec::new())
            .unwrap()
            .status,
        200
    );
}

#[test]
fn faults_are_inert_unless_armed() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "hello", &[pod.addr()], ""),
        "",
        &["--shards", "1"],
        &[],
    );
    let mut stream = activator.connect();
    stream
        .write_all(with_fault("hello", "panic").as_bytes())
        .unwrap();
    let answer = support::read_response(&mut stream, &mut Vec::new()).expect("an answer");
    assert_eq!(answer.status, 200);
    assert_eq!(
        activator.metric_sum("kactivator_shard_panics_total", &[]),
        0.0
    );
}

#[test]
fn a_shard_thread_that_dies_turns_liveness_and_readiness_red() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "hello", &[pod.addr()], ""),
        "",
        &["--shards", "2"],
        &[FAULTS],
    );
    assert_eq!(admin_get(activator.admin, "/healthz").unwrap().0, 200);
    assert_eq!(admin_get(activator.admin, "/readyz").unwrap().0, 200);
    // A task of one shard's own panics, outside any request: that shard's thread ends. (The
    // request that asked for it may be lost with its shard; that is the point.)
    let mut stream = activator.connect();
    stream
        .write_all(with_fault("hello", "panic-shard").as_bytes())
        .unwrap();
    let dead = eventually(Duration::from_secs(5), || {
        admin_get(activator.admin, "/healthz").is_some_and(|(status, _)| status == 503)
    });
    assert!(dead, "liveness still says ok:\n{}", activator.stderr());
    let (_, body) = admin_get(activator.admin, "/healthz").unwrap();
    assert!(body.contains("shard thread died"), "{body}");
    let (status, body) = admin_get(activator.admin, "/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    // The kubelet's probe on the data port, answered by the shard still alive, fails too. The
    // dead shard's listener is shut, so every new connection lands on the living one (twenty
    // connections, spread over both listeners by the kernel's hash, all answered).
    for _ in 0..20 {
        let probe = exchange(
            activator.http,
            b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.30\r\n\r\n",
        );
        assert_eq!(probe.status, 500, "{}", probe.text());
    }
    assert!(activator.stderr().contains("shard thread died"));
}

#[test]
fn a_revision_timeout_beyond_the_bound_is_refused_at_start_naming_its_line() {
    // The value that used to load and then panic every shard on its first request.
    for (value, says) in [
        ("9223372036854775807", "more than the most allowed"),
        ("18446744073709551615", "timeout_seconds"),
        ("0", "at least 1"),
    ] {
        let revisions = revision(
            "default",
            "hello",
            &[],
            &format!("timeout_seconds = {value}"),
        );
        let mut activator = Activator::prepare(&revisions, "").spawn();
        let code = activator.wait_exit(Duration::from_secs(10));
        let stderr = activator.stderr();
        assert_eq!(code, Some(2), "{value} must not start: {stderr}");
        let text = std::fs::read_to_string(&activator.config_path).unwrap();
        let line = 1 + text
            .lines()
            .position(|line| line.starts_with("timeout_seconds"))
            .unwrap();
        let at = format!("{}:{line}:", activator.config_path.display());
        assert!(stderr.contains(&at), "{value}: {at}\n{stderr}");
        assert!(stderr.contains(says), "{value}: {stderr}");
    }
}

#[test]
fn numbers_out_of_bounds_are_refused_with_their_key_and_flags_too() {
    for (proxy, key) in [
        ("connect_timeout_ms = 0", "proxy.connect_timeout_ms"),
        (
            "max_connections_per_shard = 100000000",
            "proxy.max_connections_per_shard",
        ),
        ("head_timeout_seconds = 0", "proxy.head_timeout_seconds"),
    ] {
        let mut activator = Activator::prepare("", proxy).spawn();
        assert_eq!(activator.wait_exit(Duration::from_secs(10)), Some(2));
        assert!(activator.stderr().contains(key), "{}", activator.stderr());
    }
    let mut activator = Activator::prepare("", "").spawn_args(
        &["--shards", "2", "--drain-grace-seconds", "99999999999"],
        &[],
    );
    assert_eq!(activator.wait_exit(Duration::from_secs(10)), Some(2));
    assert!(
        activator.stderr().contains("--drain-grace-seconds"),
        "{}",
        activator.stderr()
    );
    let mut activator = Activator::prepare("", "").spawn_args(&["--shards", "100000"], &[]);
    assert_eq!(activator.wait_exit(Duration::from_secs(10)), Some(2));
    assert!(
        activator.stderr().contains("--shards"),
        "{}",
        activator.stderr()
    );
}

#[test]
fn an_unknown_feature_key_in_the_file_is_refused() {
    let mut activator = Activator::prepare(
        "[features]\n\"queueproxy.pod-authorty\" = \"enabled\"\n",
        "",
    )
    .spawn();
    assert_eq!(activator.wait_exit(Duration::from_secs(10)), Some(2));
    let stderr = activator.stderr();
    assert!(stderr.contains("queueproxy.pod-authorty"), "{stderr}");
    assert!(stderr.contains("unknown key"), "{stderr}");
}

#[test]
fn a_start_up_error_is_printed_once() {
    let dir = scratch_dir();
    let path = dir.join("broken.toml");
    std::fs::write(&path, "[proxy]\nno_such_key = 1\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.matches("no_such_key").count(), 1, "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn quitquitquit_drains_like_sigterm() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let mut activator = Activator::start_with(
        &revision("default", "hello", &[pod.addr()], ""),
        "",
        &["--shards", "2", "--drain-grace-seconds", "2"],
        &[],
    );
    let request = get("hello", "/");
    // A keep-alive connection, idle.
    let mut idle = activator.connect();
    idle.write_all(request.as_bytes()).unwrap();
    assert_eq!(
        support::read_response(&mut idle, &mut Vec::new())
            .unwrap()
            .status,
        200
    );
    let asked = Instant::now();
    let mut admin = std::net::TcpStream::connect(activator.admin).unwrap();
    admin
        .write_all(b"POST /quitquitquit HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let said = support::read_response(&mut admin, &mut Vec::new()).unwrap();
    assert_eq!(said.status, 200, "{}", said.text());
    // Readiness fails at once, as on SIGTERM; requests are still served, told to close.
    let (status, _) = admin_get(activator.admin, "/readyz").unwrap();
    assert_eq!(status, 503);
    idle.write_all(request.as_bytes()).unwrap();
    let answered = support::read_response(&mut idle, &mut Vec::new()).unwrap();
    assert_eq!(answered.status, 200);
    assert_eq!(answered.header("connection"), Some("close"));
    assert_eq!(
        activator.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        activator.stderr()
    );
    assert!(
        asked.elapsed() >= Duration::from_millis(1900),
        "exited {:?} after /quitquitquit, inside the 2 s grace period",
        asked.elapsed()
    );
}
