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

/// One request as its client saw it: sent, answered, status.
type Exchange = (Instant, Instant, u16);

/// `clients` threads each sending `get(name, path)`, one after another, until `stop`; returns
/// every request's times and status.
fn steady_load(
    activator: &Activator,
    name: &'static str,
    path: &'static str,
    clients: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<Vec<Exchange>>> {
    (0..clients)
        .map(|_| {
            let http = activator.http;
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut exchanges = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let status = exchange(http, get(name, path).as_bytes()).status;
                    exchanges.push((sent, Instant::now(), status));
                }
                exchanges
            })
        })
        .collect()
}

/// The clients' own view of a window: requests in flight on average, and arrivals.
fn offered(exchanges: &[Exchange], from: Instant, to: Instant) -> (f64, f64) {
    let length = to.duration_since(from).as_secs_f64();
    let busy: f64 = exchanges
        .iter()
        .map(|(sent, answered, _)| {
            let start = (*sent).max(from);
            let end = (*answered).min(to);
            end.saturating_duration_since(start).as_secs_f64()
        })
        .sum();
    let arrivals = exchanges
        .iter()
        .filter(|(sent, _, _)| *sent >= from && *sent < to)
        .count();
    (busy / length, arrivals as f64)
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

#[test]
fn per_second_reports_match_the_offered_load_in_one_report_over_both_shards() {
    let autoscaler = TestAutoscaler::start().unwrap();
    let pod = backend::spawn(BackendConfig::named("steady")).unwrap();
    let activator = activator(
        &autoscaler.url(),
        &revision("default", "steady", &[pod.addr()], ""),
    )
    .until_ready();
    // 8 clients, each with one request of 50 ms in flight: about 8 at once, 160 a second.
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let clients = steady_load(&activator, "steady", "/delay/50", 8, &stop);
    std::thread::sleep(Duration::from_millis(5_500));
    stop.store(true, Ordering::Relaxed);
    let ended = Instant::now();
    let exchanges: Vec<Exchange> = clients
        .into_iter()
        .flat_map(|client| client.join().unwrap())
        .collect();
    assert!(exchanges.iter().all(|(_, _, status)| *status == 200));
    // A tick made after every request arrived closes the last window: one that arrives more
    // than a report interval after the clients were done.
    let done = Instant::now();
    assert!(eventually(Duration::from_secs(5), || autoscaler
        .stats_of("default", "steady")
        .iter()
        .any(|stat| stat.at > done + Duration::from_millis(1_050))));
    let stats = autoscaler.stats_of("default", "steady");
    // Each tick's window runs from the previous tick; the first (after the poke) and the
    // edges of the load are left out. What the clients offered in the same window is what
    // the report must say, within 10 %: on a busy machine the clients offer less than 8.
    let windows: Vec<(Instant, &StatSeen)> = stats
        .windows(2)
        .map(|pair| (pair[0].at, &pair[1]))
        .filter(|(from, stat)| *from > started + Duration::from_millis(1_200) && stat.at < ended)
        .collect();
    assert!(windows.len() >= 3, "a report a second: {stats:?}");
    for (from, stat) in &windows {
        let (concurrency, arrivals) = offered(&exchanges, *from, stat.at);
        assert!(concurrency > 4.0, "the load ran: {concurrency}");
        assert!(
            (stat.average_concurrent_requests - concurrency).abs() <= 0.1 * concurrency,
            "reported {stat:?}, offered {concurrency:.2} at once"
        );
        assert!(
            (stat.request_count - arrivals).abs() <= 0.1 * arrivals + 2.0,
            "reported {stat:?}, offered {arrivals} arrivals"
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
    assert_eq!(
        reported,
        exchanges.len() as f64,
        "every arrival counted once"
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
        for (_, _, status) in client.join().unwrap() {
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
