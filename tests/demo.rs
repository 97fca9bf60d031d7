//! `kactivator demo` on a fresh machine: its pods and the proxy start, every command it prints
//! works; and the binary that ships the demo links no test code.

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

    // Every command the demo prints does what it says, run as a person would paste it.
    let expectations: [(&str, &str, &str); 6] = [
        (
            "Knative-Serving-Revision: hello",
            "200",
            "hello from hello-pod-",
        ),
        ("/ -H 'Host: hello.default", "200", "hello from hello-pod-"),
        (
            "/headers -H 'Host: hello.default",
            "200",
            // What the activator added, as the pod received it.
            "k-original-host: hello.default.svc.cluster.local",
        ),
        ("Host: nope.default", "404", "\"nope\" not found"),
        ("K-Network-Probe: activator", "200", "activator"),
        ("/metrics | grep", "", "activator_request_count{"),
    ];
    let commands: Vec<&str> = printed
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with("curl "))
        .collect();
    assert_eq!(commands.len(), expectations.len(), "{printed}");
    for (fragment, status, shown) in expectations {
        let matching: Vec<&&str> = commands
            .iter()
            .filter(|command| command.contains(fragment))
            .collect();
        let [command] = matching[..] else {
            panic!("one printed command with {fragment:?}: {printed}");
        };
        let bounded = command.replacen("curl ", "curl --max-time 60 ", 1);
        let output = Command::new("sh").args(["-c", &bounded]).output().unwrap();
        let answer = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{command}: {answer}");
        if !status.is_empty() {
            let status_line = answer.lines().next().unwrap_or_default();
            assert!(
                status_line.starts_with(&format!("HTTP/1.1 {status} ")),
                "{command}: {answer}"
            );
        }
        assert!(answer.contains(shown), "{command}: {answer}");
    }

    // Each pod answers its queue-proxy's probe, as the activator's prober wants it, and says which
    // revision it belongs to on every answer.
    let pods: Vec<&str> = printed
        .split_once("pods (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(list, _)| list.split(", ").collect())
        .unwrap_or_default();
    assert_eq!(pods.len(), 3, "{printed}");
    for pod in pods {
        let (ok, answer) = support::curl(&[
            "-i",
            "-H",
            "K-Network-Probe: queue",
            &format!("http://{pod}/healthz"),
        ]);
        assert!(ok);
        let answer = support::parse_response(&answer).expect("an HTTP/1.1 answer");
        assert_eq!(answer.status, 200, "{pod}: {}", answer.text());
        assert_eq!(answer.text(), "queue", "{pod}");
        assert_eq!(answer.header("x-knative-revision-name"), Some("hello"));
        assert_eq!(
            answer.header("x-knative-revision-namespace"),
            Some("default")
        );
    }

    // The demo's revision balances by random choice of two (containerConcurrency 0), so which
    // pods a handful of requests reach is chance: six requests miss one of three pods about one
    // time in four. Up to 60 miss one with odds below 1e-10, and the loop ends once all answered.
    let url = format!("http://{http}/");
    let mut pods_seen = std::collections::BTreeSet::new();
    for _ in 0..60 {
        if pods_seen.len() == 3 {
            break;
        }
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

/// The binary that ships `kactivator demo` carries no test code: its normal and build
/// dependencies hold neither testkit nor what only the test peers use (tonic's client transport, hyper-util's
/// server side), so a release build links none of it.
#[test]
fn the_release_binary_links_no_test_code() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--manifest-path",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            "--package",
            "kactivator",
            "--edges",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p} [{f}]",
            "--locked",
            // Everything was fetched to build this test; the check needs no network.
            "--offline",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        tree.lines()
            .any(|line| line.starts_with("kactivator-shards ")),
        "the tree lists the binary's dependencies: {tree}"
    );
    let test_code: Vec<&str> = tree
        .lines()
        .filter(|line| {
            let package = line.split_whitespace().next().unwrap_or_default();
            let features = line
                .rsplit_once('[')
                .and_then(|(_, rest)| rest.split_once(']'))
                .map(|(features, _)| features)
                .unwrap_or_default();
            // tonic serves the KEDA role's scaler (its generated code only); its client
            // transport is the tests'.
            package == "kactivator-testkit"
                || (package == "tonic" && features.split(',').any(|feature| feature == "channel"))
                || (package == "hyper-util"
                    && features
                        .split(',')
                        .any(|feature| feature.starts_with("server")))
        })
        .collect();
    assert!(
        test_code.is_empty(),
        "the release binary links test code: {test_code:#?}"
    );
}
