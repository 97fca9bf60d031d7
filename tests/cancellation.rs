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

/// h2c: a stream the client reset keeps its pod's slot until the pod has read the reset (two
/// PING round trips on that connection). A pod whose connection stops reading right after it
/// took the first call never confirms it, so its one slot stays taken until that call's
/// deadline; then that connection is given up and the next call is served on a new one. Were
/// the slot handed on at the reset, the next call would go to the pod that never heard the first
/// was abandoned, on a connection nobody reads, and time out.
#[tokio::test]
async fn an_h2c_streams_slot_waits_until_the_pod_has_read_its_reset() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pod = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let (took_first, first_taken) = tokio::sync::oneshot::channel::<()>();
    let counted = connections.clone();
    tokio::spawn(async move {
        let mut took_first = Some(took_first);
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let took_first = if n == 0 { took_first.take() } else { None };
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(socket).await else {
                    return;
                };
                if let Some(took_first) = took_first {
                    // The first call: taken, then the connection is read no more.
                    let call = connection.accept().await;
                    let _ = took_first.send(());
                    let _held = (call, connection);
                    return std::future::pending::<()>().await;
                }
                while let Some(Ok((_, mut respond))) = connection.accept().await {
                    let response = http::Response::builder().status(200).body(()).unwrap();
                    if let Ok(mut body) = respond.send_response(response, false) {
                        let _ = body.send_data(bytes::Bytes::from_static(b"served\n"), true);
                    }
                }
            });
        }
    });
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision(
            "default",
            "stalls",
            &[pod],
            "container_concurrency = 1\nprotocol = \"h2c\"\ntimeout_seconds = 2"
        )
    ));
    let client = tokio::net::TcpStream::connect(activator.http2)
        .await
        .unwrap();
    let (sender, connection) = h2::client::handshake(client).await.unwrap();
    tokio::spawn(connection);
    let mut sender = sender.ready().await.unwrap();
    let call = |path: &str| {
        http::Request::builder()
            .uri(format!("http://stalls.default.svc.cluster.local{path}"))
            .header("knative-serving-namespace", "default")
            .header("knative-serving-revision", "stalls")
            .body(())
            .unwrap()
    };
    let (first, _) = sender.send_request(call("/first"), true).unwrap();
    first_taken.await.unwrap();
    let reset_at = Instant::now();
    // Dropping the response future resets the stream (CANCEL).
    drop(first);
    // Sent well inside the first call's deadline, with a deadline of its own that leaves a
    // second after the first one's for the new connection.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let mut sender = sender.ready().await.unwrap();
    let (second, _) = sender.send_request(call("/second"), true).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("an answer within 10 s")
        .expect("the second call is answered");
    assert_eq!(response.status(), 200);
    let waited = reset_at.elapsed();
    assert!(
        waited >= Duration::from_millis(1_200),
        "served {waited:?} after the reset: the slot was handed on before the pod read it"
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        2,
        "a new connection for the second call"
    );
}
