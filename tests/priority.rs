//! Priority bands, fairness across tenants and shedding, through the real binary (issue 27):
//! one pod with containerConcurrency 1 whose only slot is held, requests queued behind it with
//! `K-Priority` and `K-Tenant`, and the order in which the pod then serves them. The pod takes
//! 100 ms per request, one at a time, so the order the answers come back in is the order it
//! served them.

mod support;

use std::io::Write;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use support::{exchange, revision, Activator};

/// A policy of three bands, default band 1, whose priority header a trusted hop sets (a client
/// may then raise its band; the next test shows it cannot by default).
const POLICY: &str =
    "container_concurrency = 1\n[revisions.priority]\nbands = 3\npriority_header_trusted = true";

/// How long the pod takes per request.
const SERVICE_MS: u64 = 100;

/// A GET for `default/<name>` that the pod answers after [`SERVICE_MS`], with extra headers.
fn request(name: &str, headers: &str) -> String {
    format!(
        "GET /delay/{SERVICE_MS} HTTP/1.1\r\nHost: example.com\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: {name}\r\n{headers}\r\n"
    )
}

/// Requests sent on their own connections, answered in some order.
struct Waiters {
    threads: Vec<std::thread::JoinHandle<(String, u16, String, Instant)>>,
}

impl Waiters {
    fn new() -> Waiters {
        Waiters {
            threads: Vec::new(),
        }
    }

    /// Sends one request labelled `label` (for the assertions only) and waits until the
    /// activator counts `queued` waiters for the revision.
    fn send(&mut self, activator: &Activator, name: &str, label: &str, headers: &str, queued: f64) {
        let (http, raw, owned) = (activator.http, request(name, headers), label.to_string());
        self.threads.push(std::thread::spawn(move || {
            let response = exchange(http, raw.as_bytes());
            (owned, response.status, response.text(), Instant::now())
        }));
        self.until_queued(activator, name, label, queued);
    }

    /// [`Waiters::send`] on a connection already open (one of a chosen shard).
    fn send_on(
        &mut self,
        activator: &Activator,
        mut stream: std::net::TcpStream,
        name: &str,
        label: &str,
        headers: &str,
        queued: f64,
    ) {
        let (raw, owned) = (request(name, headers), label.to_string());
        self.threads.push(std::thread::spawn(move || {
            stream.write_all(raw.as_bytes()).unwrap();
            let response = support::read_response(&mut stream, &mut Vec::new())
                .expect("an answer on the connection");
            (owned, response.status, response.text(), Instant::now())
        }));
        self.until_queued(activator, name, label, queued);
    }

    fn until_queued(&self, activator: &Activator, name: &str, label: &str, queued: f64) {
        let waiting = || {
            activator.metric_sum(
                "kactivator_revision_queued",
                &[&format!("revision_name=\"{name}\"")],
            )
        };
        assert!(
            support::eventually(Duration::from_secs(10), || waiting() == queued),
            "{label}: {} waiting, not {queued}",
            waiting()
        );
    }

    /// Every answer, in the order they came back: (label, status, body).
    fn answers(self) -> Vec<(String, u16, String)> {
        let mut answers: Vec<_> = self
            .threads
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .collect();
        answers.sort_by_key(|(_, _, _, at)| *at);
        answers
            .into_iter()
            .map(|(label, status, body, _)| (label, status, body))
            .collect()
    }
}

/// The labels and statuses of `answers`, in their order.
fn statuses(answers: &[(String, u16, String)]) -> Vec<(&str, u16)> {
    answers
        .iter()
        .map(|(label, status, _)| (label.as_str(), *status))
        .collect()
}

/// An activator on one shard (where the order is exact) serving `default/<name>` on `pod`, the
/// revision configured by `extra`.
fn on_one_shard(pod: &backend::BackendHandle, name: &str, extra: &str) -> Activator {
    Activator::start_with(
        &revision("default", name, &[pod.addr()], extra),
        "",
        &["--shards", "1"],
        &[],
    )
}

/// Opens an upgraded connection through the activator: it holds the pod's slot until dropped.
fn hold_slot(activator: &Activator, name: &str) -> std::net::TcpStream {
    let (stream, head) = support::open_upgrade(activator, name);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    stream
}

#[test]
fn a_high_band_arrival_is_served_before_the_low_waiters_on_any_shard() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision("default", "bands", &[pod.addr()], POLICY));
    let holder = hold_slot(&activator, "bands");
    let mut waiters = Waiters::new();
    // Each on its own connection: they spread over both shards.
    for low in 0..4 {
        let label = format!("low-{low}");
        waiters.send(
            &activator,
            "bands",
            &label,
            "K-Priority: 0\r\n",
            f64::from(low + 1),
        );
    }
    waiters.send(&activator, "bands", "default", "", 5.0);
    for high in 0..2 {
        let label = format!("high-{high}");
        waiters.send(
            &activator,
            "bands",
            &label,
            "K-Priority: 2\r\n",
            f64::from(high + 6),
        );
    }
    drop(holder);
    let answers = waiters.answers();
    assert!(
        answers.iter().all(|(_, status, _)| *status == 200),
        "{answers:?}"
    );
    let order: Vec<&str> = answers.iter().map(|(label, ..)| label.as_str()).collect();
    assert_eq!(
        order,
        ["high-0", "high-1", "default", "low-0", "low-1", "low-2", "low-3"],
        "highest band first, then arrival order within a band"
    );
    assert_eq!(pod.stats().max_in_flight, 1);
}

#[test]
fn a_tenants_first_request_waits_one_turn_behind_a_tenant_that_queued_many() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    // One shard: the exact order (across shards, equal turns may go either way: the test
    // below).
    let activator = on_one_shard(&pod, "fair", POLICY);
    let holder = hold_slot(&activator, "fair");
    let mut waiters = Waiters::new();
    for a in 0..5 {
        let label = format!("a-{a}");
        waiters.send(
            &activator,
            "fair",
            &label,
            "K-Tenant: a\r\n",
            f64::from(a + 1),
        );
    }
    waiters.send(&activator, "fair", "b-0", "K-Tenant: b\r\n", 6.0);
    waiters.send(&activator, "fair", "b-1", "K-Tenant: b\r\n", 7.0);
    drop(holder);
    let answers = waiters.answers();
    assert!(
        answers.iter().all(|(_, status, _)| *status == 200),
        "{answers:?}"
    );
    let order: Vec<&str> = answers.iter().map(|(label, ..)| label.as_str()).collect();
    assert_eq!(
        order,
        ["a-0", "b-0", "a-1", "b-1", "a-2", "a-3", "a-4"],
        "turns alternate between the tenants, each in its own arrival order"
    );
}

#[test]
fn across_shards_a_tenants_first_request_waits_at_most_one_turn_behind_a_backlog() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    // Two shards: each request on its own connection, spread over both by the kernel. A's
    // backlog is on both; B's request is on one of them. Served by the oldest ticket, B would
    // wait behind about half of A's backlog (the gate's simulation: 251 of 500).
    let activator = Activator::start(&revision("default", "spread", &[pod.addr()], POLICY));
    let holder = hold_slot(&activator, "spread");
    let mut waiters = Waiters::new();
    for a in 0..8 {
        let label = format!("a-{a}");
        waiters.send(
            &activator,
            "spread",
            &label,
            "K-Tenant: a\r\n",
            f64::from(a + 1),
        );
    }
    waiters.send(&activator, "spread", "b-0", "K-Tenant: b\r\n", 9.0);
    drop(holder);
    let answers = waiters.answers();
    assert!(
        answers.iter().all(|(_, status, _)| *status == 200),
        "{answers:?}"
    );
    let order: Vec<&str> = answers.iter().map(|(label, ..)| label.as_str()).collect();
    let b_at = order.iter().position(|label| *label == "b-0").unwrap();
    assert!(b_at <= 1, "b-0 served after {b_at} of a's: {order:?}");
    let a_order: Vec<&str> = order.iter().copied().filter(|l| *l != "b-0").collect();
    let mut sorted = a_order.clone();
    sorted.sort_by_key(|label| label[2..].parse::<u32>().unwrap());
    assert_eq!(a_order, sorted, "a's own requests in arrival order");
    // Per band and per tenant (the default band is 1).
    let band = |name: &str| activator.metric_sum(name, &["revision_name=\"spread\"", "band=\"1\""]);
    assert_eq!(
        band("kactivator_priority_requests_total"),
        10.0,
        "with the holder"
    );
    assert_eq!(band("kactivator_priority_queued"), 0.0);
    let tenant = |name: &str| {
        activator.metric_sum(
            "kactivator_priority_tenant_requests_total",
            &["revision_name=\"spread\"", &format!("tenant=\"{name}\"")],
        )
    };
    assert_eq!((tenant("a"), tenant("b"), tenant("")), (8.0, 1.0, 1.0));
}

/// Review finding: a client that sent the top `K-Priority` band jumped every queue and shed
/// other clients' waiters. By default its word can lower its band, not raise it: an untrusted
/// "top band" waits in the default band, in arrival order, and sheds nobody. A band above the
/// default comes from configuration: the fairness key `premium` is mapped to band 2.
#[test]
fn an_untrusted_client_cannot_raise_its_band_and_a_mapped_tenant_is_served_first() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = on_one_shard(
        &pod,
        "trust",
        "queue_depth = 2\ncontainer_concurrency = 1\n[revisions.priority]\nbands = 3\n\
         [revisions.priority.tenant_bands]\npremium = 2\n",
    );
    let holder = hold_slot(&activator, "trust");
    let mut waiters = Waiters::new();
    waiters.send(&activator, "trust", "plain", "", 1.0);
    waiters.send(
        &activator,
        "trust",
        "self-made-top",
        "K-Priority: 2\r\n",
        2.0,
    );
    // Full, and the "top band" it claimed is the default band: it is refused, sheds no one.
    let refused = exchange(
        activator.http,
        request("trust", "K-Priority: 2\r\n").as_bytes(),
    );
    assert_eq!(refused.status, 503);
    assert_eq!(
        activator.metric_sum("kactivator_shard_shed_total", &[]),
        0.0
    );
    // The mapped tenant's band is 2: it takes the newest default-band waiter's place.
    waiters.send(&activator, "trust", "premium", "K-Tenant: premium\r\n", 2.0);
    assert!(
        support::eventually(Duration::from_secs(10), || {
            activator.metric_sum("kactivator_shard_shed_total", &[]) == 1.0
        }),
        "{}",
        activator.metrics()
    );
    drop(holder);
    let answers = waiters.answers();
    let got = statuses(&answers);
    assert_eq!(
        got,
        [("self-made-top", 503), ("premium", 200), ("plain", 200)]
    );
}

#[test]
fn a_full_queue_sheds_its_newest_low_waiter_for_a_high_arrival() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    // One shard: shedding takes a lower band's place on the arrival's own shard (the next test
    // has it shed on another).
    let activator = on_one_shard(&pod, "shed", &format!("queue_depth = 2\n{POLICY}"));
    let holder = hold_slot(&activator, "shed");
    let mut waiters = Waiters::new();
    waiters.send(&activator, "shed", "low-0", "K-Priority: 0\r\n", 1.0);
    waiters.send(&activator, "shed", "low-1", "K-Priority: 0\r\n", 2.0);
    // Full: a request of the same band is refused itself.
    let refused = exchange(
        activator.http,
        request("shed", "K-Priority: 0\r\n").as_bytes(),
    );
    assert_eq!(
        (refused.status, refused.text().as_str()),
        (503, "pending request queue full\n")
    );
    // A high one takes the newest low waiter's place; that one is answered at once.
    waiters.send(&activator, "shed", "high", "K-Priority: 2\r\n", 2.0);
    assert!(
        support::eventually(Duration::from_secs(10), || {
            activator.metric_sum("kactivator_shard_shed_total", &[]) == 1.0
        }),
        "{}",
        activator.metrics()
    );
    drop(holder);
    let answers = waiters.answers();
    let got = statuses(&answers);
    assert_eq!(got, [("low-1", 503), ("high", 200), ("low-0", 200)]);
    assert_eq!(answers[0].2, "pending request queue full\n");
    let shed = |band: &str| {
        activator.metric_sum(
            "kactivator_priority_shed_total",
            &["revision_name=\"shed\"", &format!("band=\"{band}\"")],
        )
    };
    assert_eq!((shed("0"), shed("2")), (1.0, 0.0));
}

#[test]
fn a_full_queue_sheds_a_low_waiter_on_another_shard_for_a_high_arrival() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    // Two shards: both low waiters on shard 0, the high arrival on shard 1, which has nothing
    // of its own to shed.
    let activator = Activator::start(&revision(
        "default",
        "across",
        &[pod.addr()],
        &format!("queue_depth = 2\n{POLICY}"),
    ));
    let holder = hold_slot(&activator, "across");
    let low = [activator.connect_on_shard(0), activator.connect_on_shard(0)];
    let high = activator.connect_on_shard(1);
    let mut waiters = Waiters::new();
    for (index, stream) in low.into_iter().enumerate() {
        let label = format!("low-{index}");
        let queued = (index + 1) as f64;
        waiters.send_on(
            &activator,
            stream,
            "across",
            &label,
            "K-Priority: 0\r\n",
            queued,
        );
    }
    // The queue is full; shard 0 sheds its newest low waiter for the high one.
    waiters.send_on(&activator, high, "across", "high", "K-Priority: 2\r\n", 2.0);
    assert!(
        support::eventually(Duration::from_secs(10), || {
            activator.metric_sum("kactivator_shard_shed_total", &["shard=\"0\""]) == 1.0
        }),
        "{}",
        activator.metrics()
    );
    drop(holder);
    let answers = waiters.answers();
    let got = statuses(&answers);
    assert_eq!(got, [("low-1", 503), ("high", 200), ("low-0", 200)]);
    assert_eq!(answers[0].2, "pending request queue full\n");
    assert_eq!(
        activator.metric_sum("kactivator_shard_shed_total", &[]),
        1.0,
        "one shed, on the low waiters' shard"
    );
    assert_eq!(pod.stats().max_in_flight, 1);
}

#[test]
fn a_heavy_tenant_that_came_after_the_series_ran_out_gets_one_of_its_own() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    // One shard: it ranks the tenants it sees.
    let activator = on_one_shard(&pod, "ranked", POLICY);
    let send = |tenant: &str| {
        let raw = format!(
            "GET / HTTP/1.1\r\nHost: example.com\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: ranked\r\nK-Tenant: {tenant}\r\n\r\n"
        );
        assert_eq!(exchange(activator.http, raw.as_bytes()).status, 200);
    };
    // Sixteen light tenants take every series (`metrics::TENANT_SERIES`), one request each.
    for light in 0..16 {
        send(&format!("light-{light:02}"));
    }
    // A late tenant is folded until it is surely more than twice as heavy as the lightest shown
    // (one request) plus the floor of 8: its tenth request takes that one's series.
    for _ in 0..20 {
        send("heavy");
    }
    let tenant = |name: &str| {
        activator.metric_sum(
            "kactivator_priority_tenant_requests_total",
            &["revision_name=\"ranked\"", &format!("tenant=\"{name}\"")],
        )
    };
    assert_eq!(tenant("heavy"), 11.0, "{}", activator.metrics());
    assert_eq!(
        activator.metric_sum(
            "kactivator_priority_other_tenants_requests_total",
            &["revision_name=\"ranked\""]
        ),
        9.0
    );
    let shown = activator
        .metrics()
        .lines()
        .filter(|line| {
            line.starts_with("kactivator_priority_tenant_requests_total{")
                && line.contains("revision_name=\"ranked\"")
        })
        .count();
    assert_eq!(
        shown, 16,
        "still sixteen series: one light tenant gave its own up"
    );
}

#[test]
fn without_a_policy_the_headers_change_nothing() {
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "plain",
        &[pod.addr()],
        "container_concurrency = 1",
    ));
    let holder = hold_slot(&activator, "plain");
    let mut waiters = Waiters::new();
    waiters.send(&activator, "plain", "first", "K-Priority: 0\r\n", 1.0);
    waiters.send(&activator, "plain", "second", "K-Priority: 2\r\n", 2.0);
    waiters.send(&activator, "plain", "third", "K-Priority: x\r\n", 3.0);
    drop(holder);
    let order: Vec<String> = waiters
        .answers()
        .into_iter()
        .map(|(label, ..)| label)
        .collect();
    assert_eq!(order, ["first", "second", "third"], "arrival order");
    assert_eq!(
        activator.metric_sum("kactivator_shard_priority_header_invalid_total", &[]),
        0.0,
        "nothing is classified without a policy"
    );
}
