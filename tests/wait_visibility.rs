//! Cold starts and waits that users can see (issue 27, SPEC §8), through the real binary: a
//! response whose request waited in the activator says how long in `Server-Timing`, one that
//! waited for a revision with no routable pod also carries `X-Activator-Cold-Start: true`, and
//! `/metrics` has both waits as histograms in both metric name sets. A request that took a slot
//! at once gets neither field.

mod support;

use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use support::{curl, exchange, revision, Activator, Response};

/// A GET for `default/<name>` over HTTP/1.1.
fn get(name: &str) -> String {
    format!("GET / HTTP/1.1\r\nHost: {name}.default.svc.cluster.local\r\nConnection: close\r\n\r\n")
}

/// The milliseconds in `Server-Timing: activator;dur=<ms>`, if the response has that field.
fn waited_ms(timing: Option<&str>) -> Option<f64> {
    timing?.strip_prefix("activator;dur=")?.parse().ok()
}

/// Waits until the activator counts `queued` waiters for revision `name`.
fn until_queued(activator: &Activator, name: &str, queued: f64) {
    let waiting = || {
        activator.metric_sum(
            "kactivator_revision_queued",
            &[&format!("revision_name=\"{name}\"")],
        )
    };
    assert!(
        support::eventually(Duration::from_secs(10), || waiting() == queued),
        "{} waiting, not {queued}",
        waiting()
    );
}

/// Sends `raw` on its own thread; the response when it comes.
fn send(activator: &Activator, raw: String) -> std::thread::JoinHandle<Response> {
    let http = activator.http;
    std::thread::spawn(move || exchange(http, raw.as_bytes()))
}

#[test]
fn a_request_that_waited_for_a_busy_pod_says_how_long_and_one_that_did_not_says_nothing() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "busy",
        &[pod.addr()],
        "container_concurrency = 1",
    ));
    let at_once = exchange(activator.http, get("busy").as_bytes());
    assert_eq!(at_once.status, 200, "{}", at_once.text());
    assert_eq!(at_once.header("server-timing"), None, "it did not wait");
    assert_eq!(at_once.header("x-activator-cold-start"), None);

    // The pod's only slot is held by an upgraded connection; a request queues behind it.
    let (holder, head) = support::open_upgrade(&activator, "busy");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let held_at = Instant::now();
    let waiter = send(&activator, get("busy"));
    until_queued(&activator, "busy", 1.0);
    std::thread::sleep(Duration::from_millis(300));
    drop(holder);
    let response = waiter.join().unwrap();
    let held_ms = held_at.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(response.status, 200, "{}", response.text());
    let waited = waited_ms(response.header("server-timing"))
        .unwrap_or_else(|| panic!("no Server-Timing: {:?}", response.headers));
    assert!(
        (300.0..held_ms).contains(&waited),
        "waited {waited} ms, the slot was held {held_ms} ms"
    );
    assert_eq!(
        response.header("x-activator-cold-start"),
        None,
        "a pod was routable: not a cold start"
    );
    let metrics = activator.metrics();
    assert_eq!(
        activator.metric_sum(
            "activator_request_wait_latencies_count",
            &["revision_name=\"busy\""]
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        activator.metric_sum(
            "kn_revision_request_wait_duration_seconds_count",
            &["kn_revision_name=\"busy\""]
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        activator.metric_sum(
            "activator_cold_start_wait_latencies_count",
            &["revision_name=\"busy\""]
        ),
        0.0,
        "{metrics}"
    );
}

#[test]
fn a_request_that_waited_for_a_revision_with_no_pod_is_marked_a_cold_start_over_either_protocol() {
    // Speaks HTTP/1.1 and h2c: a request goes to a pod in the protocol it came in.
    let pod = kactivator_testkit::grpc::spawn_grpc(
        BackendConfig::named("pod").with_revision("cold", "default"),
    )
    .unwrap();
    let scaled_to_zero = revision("default", "cold", &[], "");
    let activator = Activator::start(&scaled_to_zero);
    let h1 = send(&activator, get("cold"));
    // And one over h2c (prior knowledge), through the HTTP/2 front.
    let url = format!("http://{}/", activator.http2);
    let h2 = std::thread::spawn(move || {
        curl(&[
            "--http2-prior-knowledge",
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            "Host: cold.default.svc.cluster.local",
            &url,
        ])
    });
    until_queued(&activator, "cold", 2.0);
    std::thread::sleep(Duration::from_millis(200));
    // The pod comes up.
    activator.write_config(&revision("default", "cold", &[pod.addr()], ""), "");
    let response = h1.join().unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-activator-cold-start"), Some("true"));
    let waited = waited_ms(response.header("server-timing"))
        .unwrap_or_else(|| panic!("no Server-Timing: {:?}", response.headers));
    assert!(waited >= 200.0, "waited {waited} ms");

    let (ok, head) = h2.join().unwrap();
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(ok && head.starts_with("http/2 200"), "{head}");
    assert!(
        head.contains("\r\nx-activator-cold-start: true\r\n"),
        "{head}"
    );
    let timing = head
        .lines()
        .find_map(|line| line.strip_prefix("server-timing: "))
        .map(str::trim);
    assert!(
        waited_ms(timing).is_some_and(|ms| ms >= 200.0),
        "h2c: {head}"
    );

    assert_eq!(
        activator.metric_sum(
            "activator_cold_start_wait_latencies_count",
            &["revision_name=\"cold\""]
        ),
        2.0
    );
    assert_eq!(
        activator.metric_sum(
            "kn_revision_cold_start_wait_duration_seconds_count",
            &["kn_revision_name=\"cold\""]
        ),
        2.0
    );
    // Both waits were over 200 ms: none in the buckets up to 200 ms (0.2 s).
    assert_eq!(
        activator.metric_sum(
            "kn_revision_cold_start_wait_duration_seconds_bucket",
            &["kn_revision_name=\"cold\"", "le=\"0.2\""]
        ),
        0.0
    );
}

#[test]
fn the_activators_own_answer_after_a_wait_says_how_long_too() {
    // No pod ever comes: the request waits out its revision timeout and gets the activator's
    // 504, which still tells the client how long it waited and that it was a cold start.
    let activator = Activator::start(&revision("default", "never", &[], "timeout_seconds = 1"));
    let started = Instant::now();
    let response = exchange(activator.http, get("never").as_bytes());
    assert_eq!(response.status, 504, "{}", response.text());
    assert_eq!(response.header("x-activator-cold-start"), Some("true"));
    let waited = waited_ms(response.header("server-timing"))
        .unwrap_or_else(|| panic!("no Server-Timing: {:?}", response.headers));
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    assert!(
        (900.0..=elapsed).contains(&waited),
        "waited {waited} ms of {elapsed}"
    );
}
