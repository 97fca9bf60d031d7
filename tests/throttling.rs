//! Per-pod concurrency through the real binary: never more than containerConcurrency requests
//! in flight to a pod from this process, summed over shards; bounded queues; queue time counts
//! against the revision's timeout.

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use support::{exchange, get, revision, Activator};

#[test]
fn never_more_than_container_concurrency_in_flight_per_pod_across_shards() {
    let pods: Vec<_> = (0..2)
        .map(|i| backend::spawn(BackendConfig::named(format!("pod-{i}"))).unwrap())
        .collect();
    let addrs: Vec<_> = pods.iter().map(|pod| pod.addr()).collect();
    let activator = Activator::start(&revision(
        "default",
        "scarce",
        &addrs,
        "container_concurrency = 1",
    ));
    // 200 clients on their own connections (spread over both shards), 2 requests each.
    let clients: Vec<_> = (0..200)
        .map(|_| {
            let http = activator.http;
            std::thread::spawn(move || {
                let mut stream = std::net::TcpStream::connect(http).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(60)))
                    .unwrap();
                let mut buffered = Vec::new();
                let mut statuses = Vec::new();
                for _ in 0..2 {
                    stream
                        .write_all(get("scarce", "/delay/5").as_bytes())
                        .unwrap();
                    statuses.push(
                        support::read_response(&mut stream, &mut buffered)
                            .ok()
                            .map(|r| r.status),
                    );
                }
                statuses
            })
        })
        .collect();
    for client in clients {
        for status in client.join().unwrap() {
            assert_eq!(status, Some(200));
        }
    }
    for pod in &pods {
        let stats = pod.stats();
        assert_eq!(
            stats.max_in_flight, 1,
            "a pod with containerConcurrency 1 saw {stats:?}"
        );
        assert!(stats.requests >= 100, "both pods serve: {stats:?}");
    }
    let total: u64 = pods.iter().map(|pod| pod.stats().requests).sum();
    assert_eq!(total, 400);
}

/// Opens an upgraded connection through the activator: it holds its pod slot until closed.
fn hold_slot_with_an_upgrade(activator: &Activator, name: &str) -> std::net::TcpStream {
    let (stream, head) = support::open_upgrade(activator, name);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

#[test]
fn a_full_queue_answers_503_pending_request_queue_full() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "tight",
        &[pod.addr()],
        "container_concurrency = 1\nqueue_depth = 2",
    ));
    let holder = hold_slot_with_an_upgrade(&activator, "tight");
    // Two fit in the queue, the third is refused at once.
    let http = activator.http;
    let waiting: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || exchange(http, get("tight", "/").as_bytes())))
        .collect();
    let queued =
        || activator.metric_sum("kactivator_revision_queued", &["revision_name=\"tight\""]);
    assert!(
        support::eventually(Duration::from_secs(5), || queued() == 2.0),
        "{}",
        activator.metrics()
    );
    let response = exchange(activator.http, get("tight", "/").as_bytes());
    assert_eq!(
        (response.status, response.text().as_str()),
        (503, "pending request queue full\n")
    );
    // Freeing the slot serves both waiters.
    drop(holder);
    for waiter in waiting {
        assert_eq!(waiter.join().unwrap().status, 200);
    }
}

#[test]
fn queue_time_counts_against_the_revision_timeout() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "slow",
        &[pod.addr()],
        "container_concurrency = 1\ntimeout_seconds = 1",
    ));
    let _holder = hold_slot_with_an_upgrade(&activator, "slow");
    let started = Instant::now();
    let response = exchange(activator.http, get("slow", "/").as_bytes());
    assert_eq!(
        (response.status, response.text().as_str()),
        (504, "activator request timeout")
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "waited {waited:?}"
    );
    assert_eq!(pod.stats().requests, 1, "only the upgrade reached the pod");
}

#[test]
fn a_client_that_leaves_the_queue_frees_its_place_at_once() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "one",
        &[pod.addr()],
        "container_concurrency = 1\nqueue_depth = 1",
    ));
    let holder = hold_slot_with_an_upgrade(&activator, "one");
    let queued = || activator.metric_sum("kactivator_revision_queued", &["revision_name=\"one\""]);
    let mut leaver = activator.connect();
    leaver.write_all(get("one", "/").as_bytes()).unwrap();
    assert!(support::eventually(Duration::from_secs(5), || queued() == 1.0));
    drop(leaver);
    // Its place is free long before the 300 s revision timeout.
    assert!(
        support::eventually(Duration::from_secs(2), || queued() == 0.0),
        "{}",
        activator.metrics()
    );
    // So the next request queues instead of being refused, and is served once the slot frees.
    let http = activator.http;
    let next = std::thread::spawn(move || exchange(http, get("one", "/").as_bytes()));
    assert!(support::eventually(Duration::from_secs(5), || queued() == 1.0));
    drop(holder);
    assert_eq!(next.join().unwrap().status, 200);
    assert_eq!(
        pod.stats().requests,
        2,
        "the upgrade and the last request; the leaver never reached the pod"
    );
}

#[test]
fn a_body_and_a_pipelined_request_sent_while_queued_arrive_whole() {
    // A queued request watches its client for readability only; bytes that arrive meanwhile are
    // read into its buffer up to a limit (64 KiB), the rest waits in the socket. Either way the
    // pod must get the body byte for byte, and the pipelined request after it must be served.
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "echo",
        &[pod.addr()],
        "container_concurrency = 1",
    ));
    let holder = hold_slot_with_an_upgrade(&activator, "echo");
    let queued = || activator.metric_sum("kactivator_revision_queued", &["revision_name=\"echo\""]);
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut client = activator.connect();
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        client,
        "POST /echo HTTP/1.1\r\nHost: example.com\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: echo\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    assert!(support::eventually(Duration::from_secs(5), || queued() == 1.0));
    // Body and next request while the first one waits.
    client.write_all(&body).unwrap();
    client.write_all(get("echo", "/").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        queued(),
        1.0,
        "still waiting: bytes from the client are not a disconnect"
    );
    drop(holder);
    let mut buffered = Vec::new();
    let first = support::read_response(&mut client, &mut buffered).expect("echo response");
    assert_eq!(first.status, 200);
    assert_eq!(first.body.len(), body.len());
    assert!(first.body == body, "the body reached the pod unchanged");
    let second = support::read_response(&mut client, &mut buffered).expect("pipelined response");
    assert_eq!(second.status, 200);
    assert_eq!(pod.stats().requests, 3, "the upgrade, the POST and the GET");
}

#[test]
fn the_process_wide_cap_bounds_waiters_over_all_revisions_and_removal_frees_places() {
    let pod = backend::spawn(BackendConfig::named("late")).unwrap();
    let cold = |name: &str, pods: &[std::net::SocketAddr]| {
        revision(
            "default",
            name,
            pods,
            "queue_depth = 10\ntimeout_seconds = 30",
        )
    };
    let config = |with_a: bool, b_pods: &[std::net::SocketAddr]| {
        let a = if with_a {
            cold("cold-a", &[])
        } else {
            String::new()
        };
        format!(
            "[control]\nwatch_interval_ms = 50\n\n{a}{}",
            cold("cold-b", b_pods)
        )
    };
    let activator = Activator::start_with(
        &config(true, &[]),
        "max_queued_requests = 3",
        &["--shards", "2"],
        &[],
    );
    let send = |name: &'static str| {
        let http = activator.http;
        std::thread::spawn(move || exchange(http, get(name, "/").as_bytes()))
    };
    let queued = || activator.metric_sum("kactivator_revision_queued", &[]);
    let waiting_a = [send("cold-a"), send("cold-a")];
    let waiting_b = send("cold-b");
    assert!(support::eventually(Duration::from_secs(5), || queued() == 3.0));
    // Revision b is far below its own depth, but the process is full.
    let refused = exchange(activator.http, get("cold-b", "/").as_bytes());
    assert_eq!(
        (refused.status, refused.text().as_str()),
        (503, "pending request queue full\n")
    );

    // Revision a goes away: its waiters are answered and their places come back.
    activator.write_config(&config(false, &[]), "max_queued_requests = 3");
    for waiting in waiting_a {
        assert_eq!(waiting.join().unwrap().status, 503);
    }
    assert!(support::eventually(Duration::from_secs(5), || queued() == 1.0));
    let second_b = send("cold-b");
    assert!(support::eventually(Duration::from_secs(5), || queued() == 2.0));
    // A pod appears for b: both of its waiters are served.
    activator.write_config(&config(false, &[pod.addr()]), "max_queued_requests = 3");
    assert_eq!(waiting_b.join().unwrap().status, 200);
    assert_eq!(second_b.join().unwrap().status, 200);
}
