//! Start-up and shutdown of the real binary: driver fallback under a seccomp profile that
//! refuses io_uring, configuration errors, the SIGTERM drain, and `--version`.

mod support;

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use support::{admin_get, exchange, get, revision, scratch_dir, Activator};

#[test]
fn auto_driver_falls_back_to_epoll_when_io_uring_is_refused() {
    let backend = backend::spawn(BackendConfig::named("pod")).unwrap();
    let revisions = revision("default", "hello", &[backend.addr()], "");
    let activator = Activator::start_without_io_uring(
        &revisions,
        &["--shards", "2"],
        &[("KACTIVATOR_DRIVER", "auto")],
    )
    .expect("auto must fall back and start");
    assert!(
        activator.stderr().contains("falling back to epoll"),
        "{}",
        activator.stderr()
    );
    let metrics = activator.metrics();
    assert!(
        metrics.contains("kactivator_shard_info{shard=\"0\",driver=\"epoll\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kactivator_shard_info{shard=\"1\",driver=\"epoll\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        exchange(activator.http, get("hello", "/").as_bytes()).text(),
        "hello from pod\n"
    );
}

#[test]
fn forcing_io_uring_where_it_is_refused_fails_with_a_clear_error() {
    let error = Activator::start_without_io_uring(
        "",
        &["--shards", "1"],
        &[("KACTIVATOR_DRIVER", "io-uring")],
    )
    .err()
    .expect("a forced io_uring driver must not silently fall back");
    assert!(
        error.contains("io_uring was forced but the kernel refused it"),
        "{error}"
    );
}

/// `--version` says which commit a running binary (an image, a cluster's pod) was built from:
/// the checkout's HEAD, or `unknown` when the source is not a git checkout.
#[test]
fn version_names_the_package_version_and_the_commit_built_from() {
    let output = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success());
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map_or_else(
            || "unknown".to_owned(),
            |output| String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("kactivator {} (commit {head})\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn config_errors_name_file_line_and_column_and_exit_2() {
    let dir = scratch_dir();
    let path = dir.join("broken.toml");
    std::fs::write(&path, "[listen]\nhttp = \"127.0.0.1:1\"\n\n[[revisions]]\nnamespace = \"a\"\nname = \"b\"\npods = [\"not-an-address\"]\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{}:7:", path.display())),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_unknown_protocol_is_refused_at_start_with_exit_2_naming_its_line() {
    let revisions = revision("default", "hello", &[], "protocol = \"h3\"");
    let mut activator = Activator::prepare(&revisions, "").spawn();
    let code = activator.wait_exit(Duration::from_secs(10));
    let stderr = activator.stderr();
    assert_eq!(code, Some(2), "h3 must not start: {stderr}");
    let text = std::fs::read_to_string(&activator.config_path).unwrap();
    let line = 1 + text
        .lines()
        .position(|line| line.starts_with("protocol"))
        .unwrap();
    let expected = format!("{}:{line}:12:", activator.config_path.display());
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    assert!(
        stderr.contains("unknown protocol \"h3\", expected \"http1\" or \"h2c\""),
        "{stderr}"
    );
}

#[test]
fn a_port_in_use_is_reported_and_exits_non_zero() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .args([
            "--http",
            &addr.to_string(),
            "--http2",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .env_remove("KACTIVATOR_CONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&format!("cannot listen on {addr}")));
}

#[test]
fn sigterm_fails_readiness_at_once_then_drains_in_flight_requests() {
    let backend = backend::spawn(BackendConfig::named("pod")).unwrap();
    let mut activator = Activator::start(&revision("default", "hello", &[backend.addr()], ""));
    let http = activator.http;
    let in_flight =
        std::thread::spawn(move || exchange(http, get("hello", "/delay/1500").as_bytes()));
    assert!(support::eventually(Duration::from_secs(5), || backend
        .stats()
        .in_flight
        == 1));

    let signalled = Instant::now();
    activator.send_signal("TERM");
    assert!(support::eventually(Duration::from_millis(500), || {
        admin_get(activator.admin, "/readyz").is_some_and(|(s, _)| s == 503)
    }));
    // The kubelet's probe on the data port fails the same way, with Knative's message.
    let probe = exchange(
        activator.http,
        b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.30\r\n\r\n",
    );
    assert_eq!(
        (probe.status, probe.text().as_str()),
        (500, "received SIGTERM from kubelet\n")
    );
    // New requests are still served during the grace period.
    assert_eq!(
        exchange(activator.http, get("hello", "/").as_bytes()).status,
        200
    );

    let response = in_flight.join().unwrap();
    assert_eq!(
        (response.status, response.text().as_str()),
        (200, "slept 1500\n"),
        "the in-flight request finished"
    );
    assert_eq!(
        activator.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        activator.stderr()
    );
    assert!(
        signalled.elapsed() >= Duration::from_secs(1),
        "the grace period was honoured"
    );
    let mut refused = std::net::TcpStream::connect(activator.http);
    if let Ok(stream) = refused.as_mut() {
        let _ = stream.write_all(b"GET / HTTP/1.1\r\n\r\n");
    }
}
