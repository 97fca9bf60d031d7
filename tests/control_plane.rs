//! The control plane through the real binary: queue-proxy registrations, the pod state machine
//! in all four gate modes, quarantine by the active prober, IP reuse, live configuration
//! reloads, peer relays and the registration API's refusals.
//!
//! Pods are real backends on distinct loopback IPs sharing one port, as pods of a revision
//! share a container port, so a queue-proxy's bare `pod_ip` maps to `ip:<serving_port>`.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};
use kactivator_testkit::queue_proxy::QueueProxyClient;
use support::{eventually, exchange, get, Activator, Response};

/// Fast control loops so tests see changes within tens of milliseconds.
const FAST: &str = "[control]\nwatch_interval_ms = 50\n\n[health]\nprobe_interval_ms = 50\nsettled_probe_interval_ms = 50\nprobe_timeout_ms = 500\n\n";

fn features(authority: &str, quarantine: &str) -> String {
    format!("[features]\n\"queueproxy.pod-authority\" = \"{authority}\"\n\"activator.pod-quarantine\" = \"{quarantine}\"\n\n")
}

/// Pods on 127.0.0.2, 127.0.0.3, … sharing one port.
fn pods(count: u8) -> Vec<BackendHandle> {
    backend::spawn_on_shared_port((0..count).map(|i| {
        (
            IpAddr::from([127, 0, 0, 2 + i]),
            BackendConfig::named(format!("pod-{i}")),
        )
    }))
    .expect("start pods")
}

/// A revision `default/<name>` whose queue-proxies register on `port`, listing `listed` pods.
fn revision(name: &str, port: u16, listed: &[SocketAddr], extra: &str) -> String {
    support::revision(
        "default",
        name,
        listed,
        &format!("serving_port = {port}\n{extra}"),
    )
}

fn queue_proxy(activator: &Activator, name: &str, pod: &BackendHandle) -> QueueProxyClient {
    QueueProxyClient::new(
        activator.http,
        "default",
        name,
        format!("{name}-pod"),
        pod.addr().ip(),
    )
}

/// Sends a GET for `default/<name>` on its own thread.
fn request(activator: &Activator, name: &str, path: &str) -> JoinHandle<Response> {
    let http = activator.http;
    let raw = get(name, path);
    std::thread::spawn(move || exchange(http, raw.as_bytes()))
}

fn queued(activator: &Activator, name: &str) -> f64 {
    activator.metric_sum(
        "kactivator_revision_queued",
        &[&format!("revision_name=\"{name}\"")],
    )
}

fn accepted(answer: (u16, String)) {
    assert_eq!(answer.0, 200, "registration refused: {}", answer.1);
    assert_eq!(answer.1.trim(), "{\"status\":\"accepted\"}");
}

#[test]
fn a_pod_is_routable_only_after_ready_and_then_at_once() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let activator = Activator::start(&format!(
        "{FAST}{}",
        revision("cold", port, &[], "container_concurrency = 1")
    ));
    let labels = ["revision=\"cold\""];
    assert_eq!(
        activator.metric_sum("kactivator_revision_routable_pods", &labels),
        0.0
    );
    assert_eq!(
        activator.metric_sum("kactivator_revision_capacity", &labels),
        0.0
    );
    let waiting = request(&activator, "cold", "/");
    assert!(
        eventually(Duration::from_secs(5), || queued(&activator, "cold") == 1.0),
        "the request waits while no pod is routable"
    );
    let qp = queue_proxy(&activator, "cold", &pods[0]);
    accepted(qp.send_blocking("startup"));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(queued(&activator, "cold"), 1.0, "startup is not ready");
    assert_eq!(pods[0].stats().requests, 0);
    let ready_at = Instant::now();
    accepted(qp.send_blocking("ready"));
    let response = waiting.join().unwrap();
    assert_eq!(response.status, 200);
    assert!(
        ready_at.elapsed() < Duration::from_secs(1),
        "the queued request flows as soon as the pod is ready, took {:?}",
        ready_at.elapsed()
    );
    assert_eq!(pods[0].stats().requests, 1);
    let labels = ["revision=\"cold\""];
    assert_eq!(
        activator.metric_sum("kactivator_revision_routable_pods", &labels),
        1.0
    );
    assert_eq!(
        activator.metric_sum("kactivator_revision_capacity", &labels),
        1.0
    );
    // `startup` for a pod already known is a no-op (the fork crashed here).
    accepted(qp.send_blocking("startup"));
    assert_eq!(
        exchange(activator.http, get("cold", "/").as_bytes()).status,
        200
    );
    assert_eq!(
        activator.metric_sum(
            "pod_state_transitions_total",
            &[
                "from_state=\"not-ready\"",
                "to_state=\"ready\"",
                "source=\"qp_push\""
            ]
        ),
        1.0
    );
}

#[test]
fn not_ready_stops_new_requests_while_in_flight_ones_complete() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let activator = Activator::start(&format!(
        "{FAST}{}",
        revision("busy", port, &[], "container_concurrency = 4")
    ));
    let qp = queue_proxy(&activator, "busy", &pods[0]);
    accepted(qp.send_blocking("ready"));
    let slow = request(&activator, "busy", "/delay/600");
    assert!(eventually(Duration::from_secs(5), || pods[0]
        .stats()
        .in_flight
        == 1));
    accepted(qp.send_blocking("not-ready"));
    let next = request(&activator, "busy", "/");
    assert!(
        eventually(Duration::from_secs(5), || queued(&activator, "busy") == 1.0),
        "a new request waits"
    );
    assert_eq!(
        slow.join().unwrap().status,
        200,
        "the in-flight request completes"
    );
    assert_eq!(
        pods[0].stats().requests,
        1,
        "nothing new reached the not-ready pod"
    );
    accepted(qp.send_blocking("ready"));
    assert_eq!(next.join().unwrap().status, 200);
}

#[test]
fn draining_takes_a_pod_out_of_routing_and_the_other_pod_serves() {
    let pods = pods(2);
    let port = pods[0].addr().port();
    let activator = Activator::start(&format!("{FAST}{}", revision("drain", port, &[], "")));
    for pod in &pods {
        accepted(queue_proxy(&activator, "drain", pod).send_blocking("ready"));
    }
    accepted(queue_proxy(&activator, "drain", &pods[0]).send_blocking("draining"));
    pods[0].reset_stats();
    for _ in 0..20 {
        assert_eq!(
            exchange(activator.http, get("drain", "/").as_bytes()).status,
            200
        );
    }
    assert_eq!(pods[0].stats().requests, 0, "the draining pod gets nothing");
    assert_eq!(pods[1].stats().requests, 20);
}

#[test]
fn a_pod_whose_health_checks_fail_is_quarantined_then_recovers() {
    let pods = pods(2);
    let port = pods[0].addr().port();
    let listed: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    let activator = Activator::start(&format!("{FAST}{}", revision("sick", port, &listed, "")));
    assert!(
        eventually(Duration::from_secs(5), || pods[0].probes() > 0),
        "the prober checks routable pods"
    );
    pods[0].set_probe_healthy(false);
    assert!(
        eventually(Duration::from_secs(5), || activator
            .metric_sum("activator_pod_quarantines", &[])
            == 1.0),
        "quarantined: {}",
        activator.metrics()
    );
    pods[0].reset_stats();
    for _ in 0..20 {
        assert_eq!(
            exchange(activator.http, get("sick", "/").as_bytes()).status,
            200
        );
    }
    assert_eq!(
        pods[0].stats().requests,
        0,
        "no request reaches a quarantined pod"
    );
    pods[0].set_probe_healthy(true);
    assert!(
        eventually(Duration::from_secs(10), || activator
            .metric_sum("activator_pod_trackers", &["state=\"ready\""])
            == 2.0),
        "recovered: {}",
        activator.metrics()
    );
    assert_eq!(activator.metric_sum("activator_pod_quarantines", &[]), 0.0);
    let entries = activator.metric_sum("activator_pod_quarantine_entries_total", &[]);
    let exits = activator.metric_sum("activator_pod_quarantine_exits_total", &[]);
    assert!(
        entries >= 1.0 && entries == exits,
        "entries {entries}, exits {exits}"
    );
    assert!(
        activator.metric_sum(
            "pod_state_transitions_total",
            &["from_state=\"recovering\"", "to_state=\"ready\""]
        ) >= 1.0
    );
}

/// Issue 13, item 3: when a quarantine ends the pod is probed at once, and only a passing
/// probe routes it again; no user request is the first thing to touch it. The sick pod's
/// probes fail only after 300 ms, so each probation lasts that long: under load, requests
/// would reach it then if Recovering were routable.
#[test]
fn a_pod_leaving_quarantine_gets_no_request_until_a_probe_passes() {
    let pods = pods(2);
    let port = pods[0].addr().port();
    let listed: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    let activator = Activator::start(&format!(
        "{FAST}{}",
        revision("probation", port, &listed, "")
    ));
    assert!(
        eventually(Duration::from_secs(5), || pods[0].probes() > 0),
        "the prober checks the pods"
    );
    pods[0].set_probe_delay(Duration::from_millis(300));
    pods[0].set_probe_healthy(false);
    assert!(
        eventually(Duration::from_secs(5), || activator
            .metric_sum("activator_pod_quarantines", &[])
            == 1.0),
        "quarantined: {}",
        activator.metrics()
    );
    let probations = || {
        activator.metric_sum(
            "pod_state_transitions_total",
            &["from_state=\"quarantined\"", "to_state=\"recovering\""],
        )
    };
    let probations_before = probations();
    pods[0].reset_stats();
    let stop = Instant::now() + Duration::from_millis(4_500);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let http = activator.http;
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while Instant::now() < stop {
                    statuses.push(exchange(http, get("probation", "/").as_bytes()).status);
                }
                statuses
            })
        })
        .collect();
    let mut total = 0;
    for client in clients {
        for status in client.join().unwrap() {
            assert_eq!(status, 200);
            total += 1;
        }
    }
    assert!(total > 100, "only {total} requests");
    let probations = probations() - probations_before;
    assert!(
        probations >= 2.0,
        "{probations} probations: {}",
        activator.metrics()
    );
    assert_eq!(
        pods[0].stats().requests,
        0,
        "no request reaches a pod in quarantine or on probation"
    );
    // Its probes pass again: the next probation ends in Ready, and it takes requests.
    pods[0].set_probe_delay(Duration::ZERO);
    pods[0].set_probe_healthy(true);
    assert!(
        eventually(Duration::from_secs(10), || {
            exchange(activator.http, get("probation", "/").as_bytes());
            pods[0].stats().requests > 0
        }),
        "the pod routes again: {}",
        activator.metrics()
    );
}

/// A pod whose queue-proxy answers a probe in another revision's name sits at an address that
/// was given to another pod: it is removed, and requests go to the other pod.
#[test]
fn a_pod_whose_probe_answer_names_another_revision_is_removed() {
    let pods = pods(2);
    let port = pods[0].addr().port();
    let listed: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    let activator = Activator::start(&format!(
        "{FAST}{}{}",
        features("enabled", "enabled"),
        revision("reuse", port, &listed, "")
    ));
    pods[0].set_revision("default", "somebody-else").unwrap();
    assert!(
        eventually(Duration::from_secs(5), || activator.metric_sum(
            "pod_state_transitions_total",
            &["to_state=\"none\"", "source=\"prober\""]
        ) == 1.0),
        "{}",
        activator.metrics()
    );
    let before = pods[0].stats().requests;
    for _ in 0..20 {
        let response = exchange(activator.http, get("reuse", "/").as_bytes());
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-backend"), Some("pod-1"));
    }
    assert_eq!(pods[0].stats().requests, before);
}

/// Review finding: a response naming another revision retired the pod, so an app relaying
/// another Knative service's answer unrouted itself for good. Only the queue-proxy's own probe
/// answers say which revision a pod serves: a user's response is relayed as it came and
/// changes no pod state, with the prober running (quarantine on) and without it.
#[test]
fn an_app_that_names_another_revision_in_its_response_stays_routed() {
    for quarantine in ["enabled", "disabled"] {
        let pods = pods(2);
        let port = pods[0].addr().port();
        let listed: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
        let activator = Activator::start(&format!(
            "{FAST}{}{}",
            features("enabled", quarantine),
            revision("echoes", port, &listed, "")
        ));
        for _ in 0..20 {
            let response = exchange(
                activator.http,
                get(
                    "echoes",
                    "/respond-header/X-Knative-Revision-Name/somebody-else",
                )
                .as_bytes(),
            );
            assert_eq!(response.status, 200, "quarantine {quarantine}");
            assert_eq!(
                response.header("x-knative-revision-name"),
                Some("somebody-else")
            );
        }
        assert!(
            pods.iter().all(|pod| pod.stats().requests > 0),
            "both pods keep serving (quarantine {quarantine})"
        );
        assert_eq!(
            activator.metric_sum("pod_state_transitions_total", &["to_state=\"none\""]),
            0.0,
            "quarantine {quarantine}: {}",
            activator.metrics()
        );
    }
}

#[test]
fn with_pod_authority_off_a_queue_proxy_ready_does_not_route() {
    for quarantine in ["enabled", "disabled"] {
        let pods = pods(1);
        let port = pods[0].addr().port();
        let activator = Activator::start(&format!(
            "{FAST}{}{}",
            features("disabled", quarantine),
            revision("informer", port, &[], "timeout_seconds = 1")
        ));
        accepted(queue_proxy(&activator, "informer", &pods[0]).send_blocking("ready"));
        let response = exchange(activator.http, get("informer", "/").as_bytes());
        assert_eq!(
            response.status, 504,
            "quarantine {quarantine}: the pod is pending"
        );
        assert_eq!(pods[0].stats().requests, 0);
        // The informer (here the file) lists it: now it routes.
        activator.write_config(
            &format!(
                "{FAST}{}{}",
                features("disabled", quarantine),
                revision("informer", port, &[pods[0].addr()], "timeout_seconds = 1")
            ),
            "",
        );
        assert!(eventually(Duration::from_secs(5), || exchange(
            activator.http,
            get("informer", "/").as_bytes()
        )
        .status
            == 200));
    }
}

#[test]
fn with_quarantine_off_failing_health_checks_change_nothing() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let activator = Activator::start(&format!(
        "{FAST}{}{}",
        features("enabled", "disabled"),
        revision("plain", port, &[pods[0].addr()], "")
    ));
    pods[0].set_probe_healthy(false);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(pods[0].probes(), 0, "no active probing without quarantine");
    assert_eq!(
        exchange(activator.http, get("plain", "/").as_bytes()).status,
        200
    );
    assert_eq!(activator.metric_sum("activator_pod_quarantines", &[]), 0.0);
}

#[test]
fn flipping_the_gates_under_load_drops_no_request() {
    let pods = pods(2);
    let port = pods[0].addr().port();
    let listed: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    let config = |authority: &str, quarantine: &str| {
        format!(
            "{FAST}{}{}",
            features(authority, quarantine),
            revision("flip", port, &listed, "container_concurrency = 2")
        )
    };
    let activator = Activator::start(&config("enabled", "enabled"));
    let stop = Instant::now() + Duration::from_secs(2);
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let http = activator.http;
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while Instant::now() < stop {
                    statuses.push(exchange(http, get("flip", "/delay/2").as_bytes()).status);
                }
                statuses
            })
        })
        .collect();
    let modes = [
        ("disabled", "enabled"),
        ("disabled", "disabled"),
        ("enabled", "disabled"),
        ("enabled", "enabled"),
    ];
    let mut flips = 0;
    while Instant::now() < stop {
        let (authority, quarantine) = modes[flips % modes.len()];
        activator.write_config(&config(authority, quarantine), "");
        flips += 1;
        std::thread::sleep(Duration::from_millis(120));
    }
    let mut total = 0;
    for client in clients {
        for status in client.join().unwrap() {
            assert_eq!(status, 200);
            total += 1;
        }
    }
    assert!(total > 100, "only {total} requests");
    assert!(
        activator.metric_sum("kactivator_config_reloads_total", &["result=\"applied\""]) >= 4.0,
        "{}",
        activator.metrics()
    );
    for pod in &pods {
        assert!(pod.stats().max_in_flight <= 2, "{:?}", pod.stats());
    }
}

#[test]
fn a_config_change_scales_from_zero_and_a_broken_file_keeps_the_last_good_one() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let activator = Activator::start(&format!("{FAST}{}", revision("zero", port, &[], "")));
    let waiting = request(&activator, "zero", "/");
    assert!(eventually(Duration::from_secs(5), || queued(
        &activator, "zero"
    ) == 1.0));
    activator.write_config(
        &format!("{FAST}{}", revision("zero", port, &[pods[0].addr()], "")),
        "",
    );
    assert_eq!(waiting.join().unwrap().status, 200);

    // A typo on line 3 of the revisions part: the error names where, routing carries on.
    std::fs::write(
        &activator.config_path,
        activator.config_text(
            &format!("{FAST}[[revisions]]\nnamespace = \"default\"\nname = \"zero\"\npods = [\"not an address\"]\n"),
            "",
        ),
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || activator.metric_sum(
            "kactivator_config_reloads_total",
            &["result=\"error\""]
        ) >= 1.0),
        "{}",
        activator.stderr()
    );
    let log = activator.stderr();
    let line = log
        .lines()
        .find(|line| line.contains("keeping the last good one"))
        .expect("the error is logged");
    assert!(
        regex_like_line_column(line),
        "the error names a line and column: {line}"
    );
    assert_eq!(
        exchange(activator.http, get("zero", "/").as_bytes()).status,
        200
    );
}

/// A writer that truncates the file and then writes it (`cat >`, `std::fs::write`) leaves a
/// moment in which the file holds a prefix. A prefix that parses (here: the settings without the
/// revision) must never be applied: it would remove the revision for as long as it lasts.
#[test]
fn a_file_caught_half_written_is_not_applied() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let activator = Activator::start(&format!(
        "{FAST}{}",
        revision("whole", port, &[pods[0].addr()], "")
    ));
    assert_eq!(
        exchange(activator.http, get("whole", "/").as_bytes()).status,
        200
    );
    let full = activator.config_text(
        &format!("{FAST}{}", revision("whole", port, &[pods[0].addr()], "")),
        "",
    );
    let prefix = activator.config_text(FAST, "");
    // 30 rewrites, 85–125 ms apart (varied so that the poll cannot fall into step with them),
    // each meant to leave the prefix in place for 10 ms: with a 50 ms poll each has about a 1 in
    // 5 chance to be read half-written. A round whose prefix stood for close to the source's
    // settle time (50 ms, `sources::file::SETTLE`) — this writer starved by a loaded machine —
    // left a complete, valid file that no reader can tell from a finished one, so a removal is
    // only kactivator's fault when more rounds were applied than this writer left standing
    // that long. The windows are measured, not assumed.
    const STOOD_TOO_LONG: Duration = Duration::from_millis(40);
    let mut starved_rounds = 0;
    for round in 0..30u64 {
        // Timed from before the first write: `std::fs::write` truncates and then writes, so an
        // empty file (which parses too) stands between its two calls, in both writes.
        let started = Instant::now();
        std::fs::write(&activator.config_path, &prefix).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        std::fs::write(&activator.config_path, &full).unwrap();
        if started.elapsed() >= STOOD_TOO_LONG {
            starved_rounds += 1;
        }
        std::thread::sleep(Duration::from_millis(75 + round * 17 % 40));
    }
    assert!(
        starved_rounds < 15,
        "the writer was starved in {starved_rounds} of 30 rounds: the machine is too loaded for \
         this test to tell anything"
    );
    let log = activator.stderr();
    let applied_half_written = log.matches("informer-removed").count();
    assert!(
        applied_half_written <= starved_rounds,
        "a half-written file was applied {applied_half_written} times, and the writer left \
         the prefix standing for {STOOD_TOO_LONG:?} or more in only {starved_rounds} rounds:\n{log}"
    );
    assert_eq!(
        exchange(activator.http, get("whole", "/").as_bytes()).status,
        200
    );
}

/// `file:LINE:COLUMN:` somewhere in the line.
fn regex_like_line_column(line: &str) -> bool {
    line.split("kactivator.toml:").nth(1).is_some_and(|rest| {
        let mut parts = rest.splitn(3, ':');
        let line = parts.next().and_then(|p| p.parse::<u32>().ok());
        let column = parts.next().and_then(|p| p.parse::<u32>().ok());
        line.is_some() && column.is_some()
    })
}

#[test]
fn registration_refusals_say_why() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let activator = Activator::start(&format!("{FAST}{}", revision("api", port, &[], "")));
    let qp = queue_proxy(&activator, "api", &pods[0]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send =
        |agent: Option<&str>, body: Vec<u8>| runtime.block_on(qp.send_raw(agent, body)).unwrap();
    let (status, body) = send(Some("curl/8"), qp.body("ready"));
    assert_eq!(
        (status, body.trim()),
        (401, "Invalid User-Agent for pod registration")
    );
    let agent = Some("knative-queue-proxy");
    assert_eq!(
        send(agent, b"{not json".to_vec()),
        (400, "Invalid request body\n".into())
    );
    assert_eq!(send(agent, Vec::new()).0, 400);
    let missing =
        br#"{"pod_name":"p","pod_ip":"127.0.0.2","namespace":"default","event_type":"ready"}"#;
    assert_eq!(
        send(agent, missing.to_vec()),
        (400, "Missing required fields\n".into())
    );
    let bad_event = String::from_utf8(qp.body("ready"))
        .unwrap()
        .replace("\"ready\"", "\"awake\"");
    let (status, body) = send(agent, bad_event.into_bytes());
    assert_eq!(status, 400);
    assert!(body.starts_with("Invalid event_type"), "{body}");
    let bad_ip = QueueProxyClient::new(activator.http, "default", "api", "p", "not-an-ip");
    let (status, body) = send(agent, bad_ip.body("ready"));
    assert_eq!(
        (status, body.trim()),
        (400, "Invalid pod_ip: must be a valid IP address")
    );
    let huge = format!(
        "{{\"pod_name\":\"{}\",\"pod_ip\":\"127.0.0.2\",\"namespace\":\"default\",\"revision\":\"api\",\"event_type\":\"ready\"}}",
        "x".repeat(70 * 1024)
    );
    let (status, body) = send(agent, huge.into_bytes());
    assert_eq!((status, body.trim()), (400, "Request body too large"));
    // Nothing above changed any state; a valid one still works.
    assert_eq!(pods[0].stats().requests, 0);
    accepted(qp.send_blocking("ready"));
    assert_eq!(
        exchange(activator.http, get("api", "/").as_bytes()).status,
        200
    );
    assert_eq!(
        activator.metric_sum("activator_pod_registrations_total", &["result=\"invalid\""]),
        5.0
    );
}

#[test]
fn a_thousand_concurrent_registrations_are_all_applied() {
    let activator = Activator::start(&format!("{FAST}{}", revision("many", 8012, &[], "")));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let statuses = runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..1000u32 {
            let ip = IpAddr::from([10, 9, (i / 250) as u8, (i % 250) as u8 + 1]);
            let qp = QueueProxyClient::new(activator.http, "default", "many", format!("p{i}"), ip)
                .with_timeout(Duration::from_secs(30));
            tasks.push(tokio::spawn(async move { qp.send("not-ready").await.0 }));
        }
        let mut statuses = Vec::new();
        for task in tasks {
            statuses.push(task.await.unwrap());
        }
        statuses
    });
    assert!(statuses.iter().all(|&status| status == 200), "{statuses:?}");
    assert_eq!(
        activator.metric_sum("activator_pod_trackers", &["state=\"not-ready\""]),
        1000.0
    );
    assert_eq!(
        activator.metric_sum(
            "activator_pod_registrations_total",
            &["result=\"accepted\""]
        ),
        1000.0
    );
}

#[test]
fn the_tracker_limit_refuses_new_pods_and_counts_them() {
    let activator = Activator::start(&format!(
        "[control]\nmax_trackers_per_revision = 2\n\n{}",
        revision("full", 8012, &[], "")
    ));
    for (i, expected) in [200, 200, 503].into_iter().enumerate() {
        let qp = QueueProxyClient::new(
            activator.http,
            "default",
            "full",
            format!("p{i}"),
            IpAddr::from([10, 8, 0, i as u8 + 1]),
        );
        let (status, body) = qp.send_blocking("ready");
        assert_eq!(status, expected, "{body}");
    }
    assert_eq!(
        activator.metric_sum(
            "activator_revision_tracker_limit_exceeded_total",
            &["revision=\"full\""]
        ),
        1.0
    );
}

#[test]
fn a_registration_reaches_every_peer_activator_once() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let body = format!("{FAST}{}", revision("shared", port, &[], ""));
    // Each is configured with the other's data port before either starts.
    let first = Activator::prepare(&body, "");
    let second = Activator::prepare(&body, "");
    let peered = |peer: SocketAddr| format!("[cluster]\npeers = [\"{peer}\"]\n\n{body}");
    first.write_config(&peered(second.http), "");
    second.write_config(&peered(first.http), "");
    let (first, second) = (first.launch(), second.launch());
    accepted(queue_proxy(&first, "shared", &pods[0]).send_blocking("ready"));
    assert!(
        eventually(Duration::from_secs(5), || exchange(
            second.http,
            get("shared", "/").as_bytes()
        )
        .status
            == 200),
        "the peer routes to the pod it heard about through the relay"
    );
    // The relay is counted once the peer's answer is back, which may be after the peer
    // applied the event and routed the request above.
    assert!(
        eventually(Duration::from_secs(5), || first.metric_sum(
            "activator_pod_registration_relays_total",
            &["result=\"accepted\""]
        ) == 1.0),
        "{}",
        first.metrics()
    );
    assert_eq!(
        second.metric_sum("activator_pod_registration_relays_total", &[]),
        0.0,
        "a relayed event is not relayed back"
    );
}

#[test]
fn a_pod_refusing_connections_is_quarantined_by_the_passive_signal() {
    // A port nobody listens on: the first request gets the classified 502, and the refusal it
    // met takes the pod out of routing without waiting for the prober.
    let refusing = kactivator_testkit::ports::RefusingAddress::new();
    let dead: SocketAddr = refusing.addr();
    let activator = Activator::start(&format!(
        "[health]\nprobe_interval_ms = 60000\n\n{}",
        revision("refused", dead.port(), &[dead], "timeout_seconds = 1")
    ));
    let response = exchange(activator.http, get("refused", "/").as_bytes());
    assert_eq!(response.status, 502);
    assert!(
        eventually(Duration::from_secs(5), || activator
            .metric_sum("activator_pod_quarantine_entries_total", &[])
            >= 1.0),
        "{}",
        activator.metrics()
    );
    assert!(
        activator.metric_sum(
            "activator_pod_passive_signals_total",
            &["kind=\"transport_failure\""]
        ) >= 1.0
    );
}

#[test]
fn activators_split_the_pods_and_their_concurrency_between_them() {
    let pods = pods(3);
    let port = pods[0].addr().port();
    let listed: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    let start = |me: &str| {
        Activator::start(&format!(
            "[cluster]\nself_ip = \"{me}\"\nactivators = [\"10.1.0.1\", \"10.1.0.2\"]\n\n{}",
            revision("split", port, &listed, "container_concurrency = 2")
        ))
    };
    let (first, second) = (start("10.1.0.1"), start("10.1.0.2"));
    let labels = ["revision=\"split\""];
    let capacity =
        |activator: &Activator| activator.metric_sum("kactivator_revision_capacity", &labels);
    let routable =
        |activator: &Activator| activator.metric_sum("kactivator_revision_routable_pods", &labels);
    assert!(
        capacity(&first) >= 2.0 && capacity(&second) >= 2.0,
        "each gets a pod"
    );
    assert_eq!(
        capacity(&first) + capacity(&second),
        6.0,
        "3 pods × CC 2, split, never multiplied"
    );
    assert_eq!(routable(&first) + routable(&second), 3.0);
    // Both serve through their own share.
    for activator in [&first, &second] {
        assert_eq!(
            exchange(activator.http, get("split", "/").as_bytes()).status,
            200
        );
    }
}

#[test]
fn an_invalid_gate_value_keeps_the_previous_setting_and_says_so() {
    let pods = pods(1);
    let port = pods[0].addr().port();
    let listed = [pods[0].addr()];
    let config = |quarantine: &str| {
        format!(
            "{FAST}{}{}",
            features("enabled", quarantine),
            revision("gates", port, &listed, "")
        )
    };
    let activator = Activator::start(&config("disabled"));
    activator.write_config(&config("sometimes"), "");
    assert!(
        eventually(Duration::from_secs(5), || activator
            .stderr()
            .contains("activator.pod-quarantine: \"sometimes\" is neither")),
        "{}",
        activator.stderr()
    );
    // Still off: no probes reach the pod.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(pods[0].probes(), 0);
    activator.write_config(&config("ENABLED"), "");
    assert!(
        eventually(Duration::from_secs(5), || pods[0].probes() > 0),
        "turned on, case-insensitively"
    );
}

/// Cluster-IP (mesh) mode: every request goes to the revision's private Service, and this
/// activator admits `max(1, CC × ready pods / activators)` of them at once. The pods behind the
/// Service only count; they are never dialed nor probed (nothing listens at their addresses,
/// so a probe would quarantine them and shrink the capacity).
#[test]
fn cluster_ip_mode_sends_requests_to_the_service_within_its_share_of_the_ready_pods() {
    let service = backend::spawn(BackendConfig::named("private-service")).unwrap();
    let behind: Vec<SocketAddr> = ["127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1"]
        .iter()
        .map(|pod| pod.parse().unwrap())
        .collect();
    let config = |pods: &[SocketAddr]| {
        format!(
            "{FAST}[cluster]\nself_ip = \"10.1.0.1\"\nactivators = [\"10.1.0.1\", \"10.1.0.2\"]\n\n{}",
            support::revision(
                "default",
                "meshed",
                pods,
                &format!(
                    "container_concurrency = 2\ncluster_ip = \"{}\"",
                    service.addr()
                )
            )
        )
    };
    let activator = Activator::start(&config(&behind));
    let labels = ["revision=\"meshed\""];
    let capacity =
        |activator: &Activator| activator.metric_sum("kactivator_revision_capacity", &labels);
    assert_eq!(capacity(&activator), 3.0, "max(1, 2 × 3 / 2)");

    let clients: Vec<_> = (0..12)
        .map(|_| request(&activator, "meshed", "/delay/100"))
        .collect();
    for client in clients {
        assert_eq!(client.join().unwrap().status, 200);
    }
    let stats = service.stats();
    assert_eq!(stats.requests, 12, "every request went to the Service");
    assert_eq!(
        stats.max_in_flight, 3,
        "never more than the capacity: {stats:?}"
    );
    assert_eq!(
        capacity(&activator),
        3.0,
        "the pods behind were never probed away"
    );
    assert_eq!(activator.metric_sum("activator_pod_probes_total", &[]), 0.0);

    // One ready pod left: the floor of one request at a time.
    activator.write_config(&config(&behind[..1]), "");
    assert!(eventually(Duration::from_secs(5), || capacity(&activator) == 1.0));
    assert_eq!(
        exchange(activator.http, get("meshed", "/").as_bytes()).status,
        200
    );
}
