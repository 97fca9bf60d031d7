//! Requests that must not be lost (issue 13): a pod that cannot be reached is not a failed
//! request, since nothing was sent to it.

mod support;

use std::net::{SocketAddr, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use support::{exchange, get, revision, Activator, NO_QUARANTINE};

/// An address on loopback that refuses connections (nothing listens there).
fn refusing_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// `clients` threads each send `each` requests for `name`, one connection per request, and the
/// statuses come back with the bodies of those that were not 200.
fn load(activator: &Activator, name: &str, clients: usize, each: usize) -> Vec<(u16, String)> {
    let http = activator.http;
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let request = get(name, "/delay/5");
            thread::spawn(move || {
                (0..each)
                    .map(|_| {
                        let response = exchange(http, request.as_bytes());
                        (response.status, response.text())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|thread| thread.join().unwrap())
        .collect()
}

fn failures(results: &[(u16, String)]) -> Vec<&(u16, String)> {
    results
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect()
}

/// A revision with one pod that refuses connections and one that serves, containerConcurrency
/// 1 so that both are picked under load: every request is served by the live pod, with
/// quarantine on (the refusing pod is taken out once the first refusal is reported) and off
/// (nothing takes it out: each shard passes it over for a moment after each refusal).
fn a_refused_dial_is_served_by_the_other_pod(features: &str) {
    let live = backend::spawn(BackendConfig::named("live")).unwrap();
    let dead = refusing_address();
    let activator = Activator::start(&format!(
        "{features}{}",
        revision(
            "default",
            "half",
            &[dead, live.addr()],
            "container_concurrency = 1"
        )
    ));
    let results = load(&activator, "half", 8, 25);
    assert_eq!(results.len(), 200);
    assert!(
        failures(&results).is_empty(),
        "requests failed although a live pod could serve them: {:?}",
        failures(&results)
    );
    assert_eq!(live.stats().requests, 200);
    assert!(
        live.stats().max_in_flight <= 1,
        "containerConcurrency 1 held through the retries"
    );
    assert!(
        activator.metric_sum("kactivator_shard_dial_retries_total", &[]) >= 1.0,
        "the refusing pod was tried and the request sent elsewhere:\n{}",
        activator.metrics()
    );
    assert!(
        activator.metric_sum(
            "activator_pod_passive_signals_total",
            &["kind=\"transport_failure\""]
        ) >= 1.0,
        "each refusal is still reported as a passive signal"
    );
}

#[test]
fn a_refused_dial_is_served_by_another_pod_with_quarantine_on() {
    a_refused_dial_is_served_by_the_other_pod("");
}

#[test]
fn a_refused_dial_is_served_by_another_pod_with_quarantine_off() {
    a_refused_dial_is_served_by_the_other_pod(NO_QUARANTINE);
}

#[test]
fn a_request_with_a_body_goes_to_another_pod_when_the_dial_is_refused() {
    // Nothing of the body was read before the dial failed, so all of it reaches the live pod.
    let live = backend::spawn(BackendConfig::named("live")).unwrap();
    let dead = refusing_address();
    let activator = Activator::start(&format!(
        "{NO_QUARANTINE}{}",
        revision("default", "body", &[dead, live.addr()], "")
    ));
    let body = "x".repeat(100_000);
    for _ in 0..20 {
        let request = format!(
            "POST /echo HTTP/1.1\r\nHost: body.default.svc.cluster.local\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let response = exchange(activator.http, request.as_bytes());
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.body.len(), body.len());
    }
    assert_eq!(live.stats().requests, 20);
}

#[test]
fn a_revision_whose_only_pod_refuses_answers_502_naming_the_cause_after_bounded_attempts() {
    let dead = refusing_address();
    let activator = Activator::start(&format!(
        "{NO_QUARANTINE}{}",
        revision("default", "dead", &[dead], "")
    ));
    let started = Instant::now();
    let response = exchange(activator.http, get("dead", "/").as_bytes());
    assert_eq!(
        (response.status, response.text()),
        (502, format!("dial {dead}: connection refused\n"))
    );
    // Four attempts, each after the shard's hold on the pod (250 ms) ended.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded: {:?}",
        started.elapsed()
    );
    assert_eq!(
        activator.metric_sum("kactivator_shard_upstream_connect_errors_total", &[]),
        4.0,
        "the first attempt and three more"
    );
}
