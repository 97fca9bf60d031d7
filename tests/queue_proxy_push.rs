//! The fork's push side end to end: a kactivator activator and a kactivator queue-proxy, both
//! the real binary, the queue-proxy started as Knative starts it (the reconciler's environment,
//! plus `ACTIVATOR_SERVICE_URL` naming the activator) in front of a user container that comes
//! up late.
//!
//! The activator's file lists no pod for the revision and quarantine is off, so the activator
//! has no address to route to or probe: the only way the queued request can flow is the
//! queue-proxy's `ready` push naming its pod (`SERVING_POD_IP` + the revision's
//! `serving_port`, the queue-proxy's `QUEUE_SERVING_PORT`).

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::ports::free_port;
use support::queue_proxy::{knative_env, QueueProxy, REVISION};
use support::{eventually, exchange, get, Activator};

/// Pod authority on, quarantine off (no health checks on the request path), and the
/// activator's prober slowed to a minute, so nothing but a push can route the pod in time.
const ACTIVATOR: &str = "[features]\n\"queueproxy.pod-authority\" = \"enabled\"\n\"activator.pod-quarantine\" = \"disabled\"\n\n[health]\nprobe_interval_ms = 60000\nsettled_probe_interval_ms = 60000\n\n";

/// The queue-proxy as Knative 1.18's reconciler starts it, for a user container on
/// `user_port`, serving on `serving_port`, pushing to `activator`.
fn knative_env_pushing(
    user_port: u16,
    serving_port: u16,
    activator_url: &str,
) -> HashMap<String, String> {
    let mut env = knative_env(user_port, serving_port, 0);
    env.insert("ACTIVATOR_SERVICE_URL".into(), activator_url.into());
    env
}

fn start_pushing(user_port: u16, serving_port: u16, activator: SocketAddr) -> QueueProxy {
    QueueProxy::start_with(
        knative_env_pushing(user_port, serving_port, &format!("http://{activator}")),
        // Long enough that the draining push is seen while the queue-proxy still serves.
        &["--drain-grace-seconds", "10"],
    )
}

fn registrations(activator: &Activator, event: &str) -> f64 {
    activator.metric_sum(
        "activator_pod_registrations_total",
        &["result=\"accepted\"", &format!("event_type=\"{event}\"")],
    )
}

fn routable_pods(activator: &Activator) -> f64 {
    activator.metric_sum(
        "kactivator_revision_routable_pods",
        &[&format!("revision=\"{REVISION}\"")],
    )
}

fn queued(activator: &Activator) -> f64 {
    activator.metric_sum(
        "kactivator_revision_queued",
        &[&format!("revision_name=\"{REVISION}\"")],
    )
}

#[test]
fn a_queued_request_flows_on_the_queue_proxys_ready_push_and_draining_reaches_the_activator() {
    let user_port = free_port();
    let serving_port = free_port();
    let activator = Activator::start(&format!(
        "{ACTIVATOR}{}",
        support::revision(
            "default",
            REVISION,
            &[],
            &format!("serving_port = {serving_port}")
        )
    ));
    let mut proxy = start_pushing(user_port, serving_port, activator.http);

    // The queue-proxy announces its pod at start: known to the activator, not routable.
    assert!(
        eventually(Duration::from_secs(10), || registrations(
            &activator, "startup"
        ) == 1.0),
        "startup never reached the activator: {}",
        proxy.stderr()
    );
    assert_eq!(routable_pods(&activator), 0.0);

    // A request for the revision waits in the activator while the user container is down.
    let http = activator.http;
    let waiting = std::thread::spawn(move || exchange(http, get(REVISION, "/").as_bytes()));
    assert!(
        eventually(Duration::from_secs(5), || queued(&activator) == 1.0),
        "the request is queued"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(queued(&activator), 1.0, "still queued: nothing is ready");
    assert_eq!(registrations(&activator, "ready"), 0.0);

    // The user container comes up: the queue-proxy's prober sees it within its 50 ms attempts
    // and pushes `ready`, and the activator forwards the queued request through it.
    let up_at = Instant::now();
    let user = backend::spawn_on(
        SocketAddr::from(([127, 0, 0, 1], user_port)),
        BackendConfig::named("user-container"),
    )
    .expect("user container");
    let answer = waiting.join().unwrap();
    let took = up_at.elapsed();
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (200, "hello from user-container\n")
    );
    // The activator's prober would take a minute and the file names no pod: a second is
    // far more than a push needs and far less than anything else could take.
    assert!(
        took < Duration::from_secs(1),
        "forwarded {took:?} after the user container came up"
    );
    assert_eq!(registrations(&activator, "ready"), 1.0);
    assert_eq!(
        activator.metric_sum(
            "pod_state_transitions_total",
            &[
                "from_state=\"not-ready\"",
                "to_state=\"ready\"",
                "source=\"qp_push\""
            ]
        ),
        1.0,
        "the push made the pod routable"
    );
    assert_eq!(routable_pods(&activator), 1.0);
    assert_eq!(user.stats().requests, 1);

    // SIGTERM: `draining` reaches the activator at once, while the queue-proxy still serves
    // its grace period, and the pod is out of routing there.
    Command::new("kill")
        .arg("-TERM")
        .arg(proxy.child.id().to_string())
        .status()
        .expect("kill");
    let signalled_at = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || registrations(
            &activator, "draining"
        ) == 1.0),
        "draining never reached the activator: {}",
        proxy.stderr()
    );
    assert!(
        signalled_at.elapsed() < Duration::from_secs(2),
        "draining took {:?}",
        signalled_at.elapsed()
    );
    assert!(
        proxy.still_running(),
        "draining came before the drain ended"
    );
    assert_eq!(routable_pods(&activator), 0.0);
    // A new request waits for a pod again instead of going to the leaving one.
    let waiting = std::thread::spawn(move || exchange(http, get(REVISION, "/").as_bytes()));
    assert!(
        eventually(Duration::from_secs(5), || queued(&activator) == 1.0),
        "a request after draining waits"
    );
    assert_eq!(user.stats().requests, 1);
    // Nothing else was pushed: no not-ready (the pod is leaving), one of each event.
    assert_eq!(registrations(&activator, "not-ready"), 0.0);
    assert_eq!(
        activator.metric_sum("activator_pod_registrations_total", &[]),
        3.0
    );
    drop(activator);
    let _ = waiting.join();
}

#[test]
fn a_user_container_that_stops_is_pushed_not_ready_and_ready_again_when_it_returns() {
    let user_port = free_port();
    let serving_port = free_port();
    let activator = Activator::start(&format!(
        "{ACTIVATOR}{}",
        support::revision(
            "default",
            REVISION,
            &[],
            &format!("serving_port = {serving_port}")
        )
    ));
    let user_addr = SocketAddr::from(([127, 0, 0, 1], user_port));
    let user = backend::spawn_on(user_addr, BackendConfig::named("user-container"))
        .expect("user container");
    let proxy = start_pushing(user_port, serving_port, activator.http);
    assert!(
        eventually(Duration::from_secs(10), || routable_pods(&activator) == 1.0),
        "ready never made the pod routable: {}",
        proxy.stderr()
    );
    assert_eq!(
        exchange(activator.http, get(REVISION, "/").as_bytes()).status,
        200
    );

    // The app stops: the queue-proxy's next attempt is refused and it pushes `not-ready`.
    user.shutdown();
    assert!(
        eventually(Duration::from_secs(5), || registrations(
            &activator,
            "not-ready"
        ) == 1.0),
        "not-ready never reached the activator: {}",
        proxy.stderr()
    );
    assert_eq!(routable_pods(&activator), 0.0);
    let http = activator.http;
    let waiting = std::thread::spawn(move || exchange(http, get(REVISION, "/").as_bytes()));
    assert!(
        eventually(Duration::from_secs(5), || queued(&activator) == 1.0),
        "a request waits while the pod is not ready"
    );

    // It comes back on the same port: `ready` again, and the waiting request flows.
    let back_at = Instant::now();
    let user = backend::spawn_on(user_addr, BackendConfig::named("user-container"))
        .expect("user container again");
    let answer = waiting.join().unwrap();
    assert_eq!(answer.status, 200);
    assert!(
        back_at.elapsed() < Duration::from_secs(1),
        "forwarded {:?} after the app came back",
        back_at.elapsed()
    );
    assert_eq!(user.stats().requests, 1);
    assert_eq!(registrations(&activator, "ready"), 2.0);
    assert_eq!(registrations(&activator, "not-ready"), 1.0);
}

#[test]
fn an_unusable_activator_url_exits_2_naming_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("queue-proxy")
        .env_clear()
        .envs(knative_env_pushing(
            free_port(),
            free_port(),
            "https://activator-service",
        ))
        .output()
        .expect("run kactivator queue-proxy");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("ACTIVATOR_SERVICE_URL: \"https://activator-service\": https is not built"),
        "{stderr}"
    );
}
