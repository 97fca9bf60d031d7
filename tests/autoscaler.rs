//! The autoscaler stat link through the real binary, against a test autoscaler that decodes
//! the frames with its own code generated from the same `stat.proto`: the cold-start poke,
//! the per-second reports, one report per revision over all shards, readiness that follows the
//! link, and an autoscaler restart under load.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kactivator_testkit::autoscaler::{StatSeen, TestAutoscaler};
use kactivator_testkit::backend::{self, BackendConfig};
use support::{admin_get, eventually, exchange, get, revision, Activator};

const POD_NAME: &str = "activator-test-0";

/// An activator reporting to `url`, with these `[[revisions]]`, 2 shards, not yet waited for.
fn activator(url: &str, revisions: &str) -> Activator {
    Activator::prepare(
        &format!("[control]\nwatch_interval_ms = 50\n\n{revisions}"),
        "",
    )
    .spawn_args(
        &["--shards", "2", "--autoscaler-url", url],
        &[("POD_NAME", POD_NAME)],
    )
}

fn readyz(activator: &Activator) -> Option<(u16, String)> {
    admin_get(activator.admin, "/readyz")
}

/// `clients` threads each sending `get(name, path)` on keep-alive connections until `stop`;
/// returns the statuses they saw.
fn steady_load(
    activator: &Activator,
    name: &'static str,
    path: &'static str,
    clients: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<Vec<u16>>> {
    (0..clients)
        .map(|_| {
            let http = activator.http;
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    statuses.push(exchange(http, get(name, path).as_bytes()).status);
                }
                statuses
            })
        })
        .collect()
}

#[test]
fn a_cold_revision_pokes_the_autoscaler_at_once_and_its_request_is_served_when_a_pod_comes() {
    let autoscaler = TestAutoscaler::start().unwrap();
    let pod = backend::spawn(BackendConfig::named("late-pod")).unwrap();
    let activator =
        activator(&autoscaler.url(), &revision("default", "cold", &[], "")).until_ready();
    let http = activator.http;
    let sent = Instant::now();
    let waiting = std::thread::spawn(move || exchange(http, get("cold", "/").as_bytes()));
    let poke = autoscaler.wait_for_stats("default", "cold", 1, Duration::from_secs(5));
    assert_eq!(
        poke.first()
            .map(|stat| (stat.average_concurrent_requests, stat.request_count)),
        Some((1.0, 1.0)),
        "the first stat is the poke: {poke:?}"
    );
    assert_eq!(poke[0].pod_name, POD_NAME);
    assert!(
        poke[0].at.duration_since(sent) < Duration::from_millis(500),
        "the poke came at once, not at a tick: {:?}",
        poke[0].at.duration_since(sent)
    );
    // The autoscaler scales the revision up: a pod appears.
    let config = format!(
        "[control]\nwatch_interval_ms = 50\n\n{}",
        revision("default", "cold", &[pod.addr()], "")
    );
    activator.write_config(&config, "");
    assert_eq!(waiting.join().unwrap().status, 200);
    assert_eq!(autoscaler.rejected(), 0);
}

#[test]
fn readiness_waits_for_the_autoscaler_and_follows_it() {
    // Nothing listens there yet.
    let port = kactivator_testkit::ports::free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let url = format!("ws://{addr}");
    let activator = activator(&url, &revision("default", "r", &[], ""));
    assert!(eventually(Duration::from_secs(10), || readyz(&activator)
        .is_some_and(|(status, body)| status == 503
            && body.trim()
                == "connection has not yet been established")));
    // Kubelet probes on the data port say the same, as upstream's do.
    let probe = exchange(
        activator.http,
        b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.30\r\n\r\n",
    );
    assert_eq!(probe.status, 500);
    assert_eq!(probe.text(), "connection has not yet been established\n");

    let autoscaler = TestAutoscaler::start_on(addr).unwrap();
    assert!(eventually(Duration::from_secs(10), || readyz(&activator)
        .is_some_and(|(status, _)| status == 200)));
    let probe = exchange(
        activator.http,
        b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.30\r\n\r\n",
    );
    assert_eq!(probe.status, 200);
    assert_eq!(
        activator.metric_sum("kactivator_autoscaler_connected", &[]),
        1.0
    );

    // The autoscaler restarts: readiness fails while it is away and comes back with it.
    autoscaler.pause();
    assert!(eventually(Duration::from_secs(10), || readyz(&activator)
        .is_some_and(|(status, _)| status == 503)));
    autoscaler.resume();
    assert!(eventually(Duration::from_secs(10), || readyz(&activator)
        .is_some_and(|(status, _)| status == 200)));
    assert!(autoscaler.connections() >= 2);
}

/// Median of the middle reports (the first after the poke and the edges of the load are off).
fn steady(stats: &[StatSeen], from: Instant, to: Instant) -> Vec<&StatSeen> {
    stats
        .iter()
        .filter(|stat| stat.at > from && stat.at < to)
        .collect()
}

#[test]
fn per_second_reports_match_the_offered_load_in_one_report_over_both_shards() {
    let autoscaler = TestAutoscaler::start().unwrap();
    let pod = backend::spawn(BackendConfig::named("steady")).unwrap();
    let activator = activator(
        &autoscaler.url(),
        &revision("default", "steady", &[pod.addr()], ""),
    )
    .until_ready();
    // 8 clients, each always with one request of 50 ms in flight: concurrency 8, 160 req/s.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients = steady_load(&activator, "steady", "/delay/50", 8, &stop);
    std::thread::sleep(Duration::from_millis(5_500));
    stop.store(true, Ordering::Relaxed);
    let ended = Instant::now();
    let mut served = 0;
    for client in clients {
        for status in client.join().unwrap() {
            assert_eq!(status, 200);
            served += 1;
        }
    }
    // A tick made after every request arrived closes the last window: one that arrives more
    // than a report interval after the clients were done.
    let done = Instant::now();
    assert!(eventually(Duration::from_secs(5), || autoscaler
        .stats_of("default", "steady")
        .iter()
        .any(|stat| stat.at > done + Duration::from_millis(1_050))));
    let stats = autoscaler.stats_of("default", "steady");
    let middle = steady(
        &stats,
        started + Duration::from_millis(1_500),
        ended - Duration::from_millis(200),
    );
    assert!(middle.len() >= 3, "a report a second: {stats:?}");
    for stat in &middle {
        assert!(
            (stat.average_concurrent_requests - 8.0).abs() <= 0.8,
            "concurrency within 10 % of 8: {stat:?}"
        );
        assert!(
            (stat.request_count - 160.0).abs() <= 16.0 + 8.0,
            "about 160 arrivals a second: {stat:?}"
        );
    }
    // Every tick is one batch with one stat for the revision, whichever shard served what.
    for batch in autoscaler.batches() {
        let mine = batch
            .messages
            .iter()
            .filter(|message| message.name == "steady")
            .count();
        assert!(mine <= 1, "one stat per revision per batch: {batch:?}");
    }
    let reported: f64 = stats.iter().map(|stat| stat.request_count).sum();
    assert!(
        (reported - served as f64).abs() <= 2.0,
        "every arrival counted once: {reported} reported, {served} served"
    );
    assert!(activator.metric_sum("kactivator_autoscaler_stats_sent_total", &[]) >= 4.0);
}

#[test]
fn an_autoscaler_restart_under_load_fails_no_request_and_reports_resume() {
    let autoscaler = TestAutoscaler::start().unwrap();
    let pod = backend::spawn(BackendConfig::named("busy")).unwrap();
    let activator = activator(
        &autoscaler.url(),
        &revision("default", "busy", &[pod.addr()], ""),
    )
    .until_ready();
    let stop = Arc::new(AtomicBool::new(false));
    let clients = steady_load(&activator, "busy", "/delay/20", 4, &stop);
    assert!(
        autoscaler
            .wait_for_stats("default", "busy", 2, Duration::from_secs(5))
            .len()
            >= 2
    );
    autoscaler.pause();
    std::thread::sleep(Duration::from_millis(1_500));
    let paused_at = Instant::now();
    autoscaler.resume();
    let resumed = eventually(Duration::from_secs(10), || {
        autoscaler
            .stats_of("default", "busy")
            .iter()
            .any(|stat| stat.at > paused_at)
    });
    stop.store(true, Ordering::Relaxed);
    let failed = AtomicUsize::new(0);
    for client in clients {
        for status in client.join().unwrap() {
            if status != 200 {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    assert!(resumed, "reports came again after the restart");
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed");
    assert!(
        activator.metric_sum(
            "kactivator_autoscaler_connections_total",
            &["result=\"lost\""]
        ) >= 1.0
    );
}

/// ★ A poke made while the autoscaler is away is sent as soon as it is back (upstream drops it,
/// and the cold start waits for a later tick).
#[test]
fn a_poke_made_while_the_autoscaler_is_away_is_sent_when_it_comes_back() {
    let autoscaler = TestAutoscaler::start().unwrap();
    let activator =
        activator(&autoscaler.url(), &revision("default", "away", &[], "")).until_ready();
    autoscaler.pause();
    assert!(eventually(Duration::from_secs(10), || readyz(&activator)
        .is_some_and(|(status, _)| status == 503)));
    let http = activator.http;
    let waiting = std::thread::spawn(move || exchange(http, get("away", "/").as_bytes()));
    std::thread::sleep(Duration::from_millis(300));
    assert!(autoscaler.stats_of("default", "away").is_empty());
    let back = Instant::now();
    autoscaler.resume();
    let stats = autoscaler.wait_for_stats("default", "away", 1, Duration::from_secs(10));
    let first = stats.first().expect("a stat after the reconnect");
    assert!(first.at >= back);
    assert!(first.average_concurrent_requests >= 1.0, "{first:?}");
    drop(activator);
    let _ = waiting.join();
}
