//! Clients that leave mid-request (issue 36): a pod is busy until it has finished a request,
//! not until its client left. A slot is held until the pod ended the exchange, so a waiter is
//! never handed a pod still working on an abandoned request: never more than
//! containerConcurrency in flight at a pod, in both roles.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};
use kactivator_testkit::ports::free_port;
use support::queue_proxy::{knative_env, QueueProxy};
use support::{exchange, get, revision, Activator};

/// Sends `request` on a new connection and closes it after `leave_after`, without reading.
fn leave_mid_request(
    to: SocketAddr,
    request: String,
    leave_after: Duration,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut stream = TcpStream::connect(to).expect("connect");
        stream.write_all(request.as_bytes()).expect("send");
        thread::sleep(leave_after);
        drop(stream);
    })
}

/// `count` clients that wait for their answers to `request`; statuses and when each came.
fn waiters(
    to: SocketAddr,
    request: String,
    count: usize,
) -> Vec<thread::JoinHandle<(u16, Duration)>> {
    (0..count)
        .map(|_| {
            let request = request.clone();
            thread::spawn(move || {
                let started = Instant::now();
                let response = exchange(to, request.as_bytes());
                (response.status, started.elapsed())
            })
        })
        .collect()
}

fn pods(count: usize, config: impl Fn(usize) -> BackendConfig) -> Vec<BackendHandle> {
    (0..count)
        .map(|i| backend::spawn(config(i)).expect("start a pod"))
        .collect()
}

/// Review finding: four pods at containerConcurrency 1, busy 400 ms a request, four clients on
/// them and four more waiting. The first four leave at 100 ms: their slots went to the waiters
/// at once while the pods still worked, two requests in flight at each pod. Now each pod is
/// told (its request is half-closed), its answer read and discarded, and only then is its slot
/// handed on. These pods keep working after their client left, as a model server that cannot
/// stop mid-inference.
#[test]
fn a_client_that_leaves_keeps_its_pods_slot_until_the_pod_has_finished() {
    let pods = pods(4, |i| {
        BackendConfig::named(format!("pod-{i}")).keeps_working()
    });
    let addrs: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision(
            "default",
            "busy",
            &addrs,
            "container_concurrency = 1\nload_balancing_policy = \"first-available\""
        )
    ));
    let leavers: Vec<_> = (0..4)
        .map(|_| {
            leave_mid_request(
                activator.http,
                get("busy", "/delay/400"),
                Duration::from_millis(100),
            )
        })
        .collect();
    assert!(support::eventually(Duration::from_secs(2), || pods
        .iter()
        .all(|pod| pod.stats().in_flight == 1)));
    let started = Instant::now();
    let waiting = waiters(activator.http, get("busy", "/delay/10"), 4);
    for leaver in leavers {
        leaver.join().unwrap();
    }
    for waiter in waiting {
        let (status, waited) = waiter.join().unwrap();
        assert_eq!(status, 200);
        assert!(
            waited >= Duration::from_millis(200),
            "served after {waited:?}, while the pods were still busy"
        );
    }
    for pod in &pods {
        let stats = pod.stats();
        assert_eq!(
            stats.max_in_flight, 1,
            "more than containerConcurrency at one pod: {stats:?}"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A pod that watches its client (hyper's default here; Go's `net/http` and uvicorn alike)
/// hears of the half-close, drops the work and closes: its slot is free at once, not when a
/// request it no longer works on would have ended.
#[test]
fn a_pod_that_watches_its_client_is_told_and_its_slot_freed_when_it_stops() {
    let pod = backend::spawn(BackendConfig::named("watcher")).unwrap();
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision(
            "default",
            "told",
            &[pod.addr()],
            "container_concurrency = 1"
        )
    ));
    let leaver = leave_mid_request(
        activator.http,
        get("told", "/delay/10000"),
        Duration::from_millis(200),
    );
    assert!(support::eventually(Duration::from_secs(2), || pod
        .stats()
        .in_flight
        == 1));
    let waiting = waiters(activator.http, get("told", "/"), 1);
    leaver.join().unwrap();
    let (status, waited) = waiting.into_iter().next().unwrap().join().unwrap();
    assert_eq!(status, 200);
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
    assert_eq!(pod.stats().max_in_flight, 1);
}

/// The queue-proxy role holds its breaker the same way: a user container at
/// containerConcurrency 1 that keeps working after its client left gets the next request only
/// once it has answered the abandoned one.
#[test]
fn the_queue_proxy_holds_its_breaker_until_the_app_has_finished_an_abandoned_request() {
    let user_port = free_port();
    let user = backend::spawn_on(
        SocketAddr::from(([127, 0, 0, 1], user_port)),
        BackendConfig::named("user-container").keeps_working(),
    )
    .unwrap();
    let proxy = QueueProxy::start_with(
        knative_env(user_port, free_port(), 1),
        &["--drain-grace-seconds", "1"],
    );
    assert!(support::eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));
    let leaver = leave_mid_request(
        proxy.serving,
        "GET /delay/400 HTTP/1.1\r\nHost: hello.default\r\n\r\n".to_string(),
        Duration::from_millis(100),
    );
    assert!(support::eventually(Duration::from_secs(2), || user
        .stats()
        .in_flight
        == 1));
    let waiting = waiters(
        proxy.serving,
        "GET /delay/10 HTTP/1.1\r\nHost: hello.default\r\nConnection: close\r\n\r\n".to_string(),
        1,
    );
    leaver.join().unwrap();
    let (status, waited) = waiting.into_iter().next().unwrap().join().unwrap();
    assert_eq!(status, 200);
    assert!(
        waited >= Duration::from_millis(200),
        "served after {waited:?}, while the app was still busy"
    );
    assert_eq!(user.stats().max_in_flight, 1, "{:?}", user.stats());
}
