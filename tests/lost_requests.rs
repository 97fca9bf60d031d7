//! Requests that must not be lost (issue 13): a pod that cannot be reached is not a failed
//! request, since nothing was sent to it.

mod support;

use std::net::{SocketAddr, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::ports::RefusingAddress;
use support::{exchange, get, revision, Activator, NO_QUARANTINE};

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

/// The next response on `stream`, which must come.
fn next_response(stream: &mut std::net::TcpStream) -> support::Response {
    support::read_response(stream, &mut Vec::new()).expect("a response")
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
    let refusing = RefusingAddress::new();
    let dead = refusing.addr();
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
    let refusing = RefusingAddress::new();
    let dead = refusing.addr();
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
    let refusing = RefusingAddress::new();
    let dead = refusing.addr();
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

/// How one client's request in the drain test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Answered,
    /// The connection was refused: no listener is left, and a client goes to another replica.
    WentElsewhere,
    /// Connected (to this replica) and sent, but the connection ended with no response.
    Lost,
}

/// One request on `stream` (a fresh connection, or a kept one when `reused`). Nothing is
/// retried: a request sent on a kept connection that then ends with nothing is lost, as it is
/// for an ingress that does not retry a POST (issue 23: the drain used to close idle keep-alive
/// connections at SIGTERM, and the requests that crossed the FIN were lost).
fn one_request(http: SocketAddr, kept: &mut Option<std::net::TcpStream>, request: &[u8]) -> Fate {
    use std::io::Write;
    let reused = kept.is_some();
    let mut stream = match kept.take() {
        Some(stream) => stream,
        None => match std::net::TcpStream::connect(http) {
            Ok(stream) => stream,
            Err(_) => return Fate::WentElsewhere,
        },
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buffered = Vec::new();
    let written = stream.write_all(request);
    let response = written
        .as_ref()
        .ok()
        .and_then(|()| support::read_response(&mut stream, &mut buffered).ok());
    match response {
        Some(response) if response.status == 200 => {
            let closes = response
                .header("connection")
                .is_some_and(|value| value.eq_ignore_ascii_case("close"));
            if !closes {
                *kept = Some(stream);
            }
            Fate::Answered
        }
        Some(response) => {
            eprintln!("lost: answered {} {}", response.status, response.text());
            Fate::Lost
        }
        None => {
            eprintln!(
                "lost: reused={reused} write={written:?} {} bytes before the end, local {:?}",
                buffered.len(),
                stream.local_addr()
            );
            Fate::Lost
        }
    }
}

#[test]
fn a_drain_under_load_loses_no_request() {
    // Issue 13, item 1: 64 clients, 16 on keep-alive connections and 48 opening a connection per
    // request, while the activator is told to stop; many times over, since what it guards
    // against is a race.
    let pods: Vec<_> = (0..2)
        .map(|_| backend::spawn(BackendConfig::named("pod")).unwrap())
        .collect();
    let addresses: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    let mut lost_total = 0;
    for run in 0..8 {
        let mut activator = Activator::start_with(
            &revision("default", "drain", &addresses, ""),
            "",
            &["--shards", "2", "--drain-grace-seconds", "1"],
            &[],
        );
        let http = activator.http;
        let request = get("drain", "/delay/2");
        let clients: Vec<_> = (0..64)
            .map(|client| {
                let request = request.clone();
                thread::spawn(move || {
                    let keep_alive = client < 16;
                    let mut kept = None;
                    let mut fates = Vec::new();
                    let started = Instant::now();
                    while started.elapsed() < Duration::from_secs(10) {
                        let fate = one_request(http, &mut kept, request.as_bytes());
                        fates.push(fate);
                        if !keep_alive {
                            kept = None;
                        }
                        if fate == Fate::WentElsewhere {
                            break;
                        }
                    }
                    fates
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(300 + run * 37));
        activator.send_signal("TERM");
        assert_eq!(
            activator.wait_exit(Duration::from_secs(15)),
            Some(0),
            "{}",
            activator.stderr()
        );
        let fates: Vec<Fate> = clients
            .into_iter()
            .flat_map(|client| client.join().unwrap())
            .collect();
        let answered = fates.iter().filter(|&&fate| fate == Fate::Answered).count();
        let lost = fates.iter().filter(|&&fate| fate == Fate::Lost).count();
        assert!(answered > 500, "run {run}: only {answered} answered");
        eprintln!("run {run}: {answered} answered, {lost} lost");
        if lost > 0 {
            eprintln!("{}", activator.stderr());
        }
        lost_total += lost;
    }
    assert_eq!(lost_total, 0, "requests were lost in the drain");
}

#[test]
fn during_the_grace_period_idle_keep_alive_connections_stay_open_and_are_answered() {
    use std::io::{Read, Write};
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let mut activator = Activator::start_with(
        &revision("default", "grace", &[pod.addr()], ""),
        "",
        &["--shards", "2", "--drain-grace-seconds", "2"],
        &[],
    );
    let request = get("grace", "/");
    // Keep-alive connections that have served a request and sit idle, as an ingress keeps them.
    let mut idle: Vec<std::net::TcpStream> = (0..8)
        .map(|_| {
            let mut stream = activator.connect();
            stream.write_all(request.as_bytes()).unwrap();
            let first = next_response(&mut stream);
            assert_eq!(first.status, 200);
            assert_eq!(
                first.header("connection"),
                None,
                "kept alive before the drain"
            );
            stream
        })
        .collect();
    // One more that stays idle through the whole grace period.
    let mut silent_after_one = idle.pop().unwrap();
    // One opened before the drain that has sent nothing yet.
    let mut quiet = activator.connect();

    activator.send_signal("TERM");
    let signalled = Instant::now();
    // The ingress sends on its kept connections just after the signal: every request is
    // answered, and told to close the connection.
    thread::sleep(Duration::from_millis(7));
    for stream in &mut idle {
        stream.write_all(request.as_bytes()).unwrap();
    }
    for stream in &mut idle {
        let answered = next_response(stream);
        assert_eq!(answered.status, 200);
        assert_eq!(answered.header("connection"), Some("close"));
    }
    // A new connection is served, and told to close.
    let fresh = exchange(activator.http, request.as_bytes());
    assert_eq!(fresh.status, 200);
    assert_eq!(fresh.header("connection"), Some("close"));
    // The connection that had sent nothing is not closed under it: its request is answered,
    // with Connection: close.
    quiet.write_all(request.as_bytes()).unwrap();
    let answered = next_response(&mut quiet);
    assert_eq!(answered.status, 200);
    assert_eq!(answered.header("connection"), Some("close"));
    // The keep-alive connection that stayed idle is closed only when the grace period ends,
    // with the listeners.
    silent_after_one
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        silent_after_one.read(&mut byte).unwrap(),
        0,
        "closed at the end"
    );
    let closed_after = signalled.elapsed();
    assert!(
        closed_after >= Duration::from_millis(1900),
        "an idle keep-alive connection was closed {closed_after:?} after SIGTERM, inside the 2 s grace period"
    );
    assert_eq!(
        activator.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        activator.stderr()
    );
}

#[test]
fn a_connection_accepted_before_the_listeners_close_is_answered_after_they_did() {
    use std::io::Write;
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let mut activator = Activator::start_with(
        &revision("default", "late", &[pod.addr()], ""),
        "",
        &["--shards", "2", "--drain-grace-seconds", "1"],
        &[],
    );
    // Connected, and silent until after the grace period: it has until
    // FIRST_REQUEST_GRACE (1 s) after the listeners closed to send its request.
    let mut late = activator.connect();
    activator.send_signal("TERM");
    thread::sleep(Duration::from_millis(1300));
    assert!(
        std::net::TcpStream::connect(activator.http).is_err(),
        "the listeners are closed"
    );
    late.write_all(get("late", "/").as_bytes()).unwrap();
    let response = next_response(&mut late);
    assert_eq!(response.status, 200);
    assert_eq!(response.header("connection"), Some("close"));
    assert_eq!(activator.wait_exit(Duration::from_secs(10)), Some(0));
}

/// A pod that can be killed: at `kill`, its listener closes and every connection it holds is
/// torn down at once, as the kernel does for a process that dies. It answers health probes
/// (`K-Network-Probe: queue`) and serves every other request after 30 ms.
struct KillablePod {
    addr: SocketAddr,
    killed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    connections: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    /// Requests read and not yet answered.
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl KillablePod {
    fn start() -> KillablePod {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::{Arc, Mutex};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let pod = KillablePod {
            addr: listener.local_addr().unwrap(),
            killed: Arc::new(AtomicBool::new(false)),
            connections: Arc::new(Mutex::new(Vec::new())),
            in_flight: Arc::new(AtomicUsize::new(0)),
        };
        let (killed, connections, in_flight) = (
            pod.killed.clone(),
            pod.connections.clone(),
            pod.in_flight.clone(),
        );
        thread::spawn(move || {
            while !killed.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok((stream, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                connections
                    .lock()
                    .unwrap()
                    .push(stream.try_clone().unwrap());
                let (killed, in_flight) = (killed.clone(), in_flight.clone());
                thread::spawn(move || serve_until_killed(stream, &killed, &in_flight));
            }
            // The listener is dropped here: the port refuses from now on.
        });
        pod
    }

    fn kill(&self) -> usize {
        let in_flight = self.in_flight.load(std::sync::atomic::Ordering::SeqCst);
        self.killed.store(true, std::sync::atomic::Ordering::SeqCst);
        for connection in self.connections.lock().unwrap().drain(..) {
            let _ = connection.shutdown(std::net::Shutdown::Both);
        }
        // Wait for the accept loop to drop the listener.
        while std::net::TcpStream::connect(self.addr).is_ok() {
            thread::sleep(Duration::from_millis(1));
        }
        in_flight
    }
}

fn serve_until_killed(
    mut stream: std::net::TcpStream,
    killed: &std::sync::atomic::AtomicBool,
    in_flight: &std::sync::atomic::AtomicUsize,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let mut buffered = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Some(end) = buffered.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buffered.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buffered[..end]).to_ascii_lowercase();
        buffered.drain(..end + 4);
        let body = if head.contains("k-network-probe: queue") {
            "queue"
        } else {
            in_flight.fetch_add(1, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(30));
            in_flight.fetch_sub(1, Ordering::SeqCst);
            "ok"
        };
        if killed.load(Ordering::SeqCst) {
            return;
        }
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn a_pod_killed_mid_request_fails_only_the_requests_it_had() {
    // Issue 13, item 5: two pods under load, one killed. Requests in flight on it get a 502
    // naming the cause; every request that arrives after the kill is served by the other.
    let doomed = KillablePod::start();
    let survivor = backend::spawn(BackendConfig::named("survivor")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "kill",
        &[doomed.addr, survivor.addr()],
        "",
    ));
    let http = activator.http;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                let request = get("kill", "/delay/30");
                let mut outcomes = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let sent = Instant::now();
                    let response = exchange(http, request.as_bytes());
                    outcomes.push((sent, response.status, response.text()));
                }
                outcomes
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(700));
    let had = doomed.kill();
    let killed_at = Instant::now();
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let outcomes: Vec<_> = clients
        .into_iter()
        .flat_map(|client| client.join().unwrap())
        .collect();
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|(_, status, _)| *status != 200)
        .collect();
    let after_the_kill = outcomes
        .iter()
        .filter(|(sent, _, _)| *sent > killed_at)
        .count();
    assert!(
        after_the_kill > 50,
        "{after_the_kill} requests after the kill"
    );
    for (sent, status, body) in &failed {
        assert!(
            *sent < killed_at,
            "a request sent after the kill failed: {status} {body}"
        );
        assert_eq!(*status, 502, "{body}");
        assert!(
            body.contains(&doomed.addr.to_string()),
            "the 502 names the pod: {body}"
        );
    }
    // What the pod had when it died was never answered, so those fail (and only those: 8
    // clients, one request each).
    assert!(had == 0 || !failed.is_empty(), "the pod had {had} requests");
    assert!(failed.len() <= 8, "{failed:?}");
    eprintln!(
        "{} requests, {} after the kill; the pod had {had} when it died, {} failed",
        outcomes.len(),
        after_the_kill,
        failed.len()
    );
}

#[test]
fn at_the_connection_limit_the_longest_idle_keep_alive_connection_gives_way() {
    use std::io::{Read, Write};
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "capped", &[pod.addr()], ""),
        "max_connections_per_shard = 4\n",
        &["--shards", "1"],
        &[],
    );
    let request = get("capped", "/");
    // Four keep-alive connections hold the cap, idle after one request each, oldest first.
    let mut idle: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut stream = activator.connect();
            stream.write_all(request.as_bytes()).unwrap();
            assert_eq!(next_response(&mut stream).status, 200);
            thread::sleep(Duration::from_millis(20));
            stream
        })
        .collect();
    // A new client is served at once: the connection idle the longest gave way.
    let started = Instant::now();
    let response = exchange(activator.http, request.as_bytes());
    assert_eq!(response.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a new client waited {:?} behind idle connections",
        started.elapsed()
    );
    let mut byte = [0u8; 1];
    idle[0]
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(idle[0].read(&mut byte).unwrap(), 0, "the oldest was closed");
    // The others are still there and serve.
    idle[3].write_all(request.as_bytes()).unwrap();
    assert_eq!(next_response(&mut idle[3]).status, 200);
    assert!(activator.metric_sum("kactivator_shard_idle_evictions_total", &[]) >= 1.0);
}

#[test]
fn at_the_connection_limit_busy_connections_make_a_new_client_wait_and_nothing_is_lost() {
    use std::io::Write;
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "busy", &[pod.addr()], ""),
        "max_connections_per_shard = 4\n",
        &["--shards", "1"],
        &[],
    );
    // Four connections each in the middle of a request: none can give way.
    let mut busy: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut stream = activator.connect();
            stream
                .write_all(get("busy", "/delay/1500").as_bytes())
                .unwrap();
            stream
        })
        .collect();
    thread::sleep(Duration::from_millis(300));
    // The fifth connects (the kernel queues it) but is not taken while four are busy.
    let mut waiting = activator.connect();
    waiting.write_all(get("busy", "/").as_bytes()).unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_millis(400)))
        .unwrap();
    let mut buffered = Vec::new();
    assert!(
        support::read_response(&mut waiting, &mut buffered).is_err() && buffered.is_empty(),
        "served beyond the limit"
    );
    assert!(activator.metric_sum("kactivator_shard_accept_pauses_total", &[]) >= 1.0);
    // The busy ones finish and stay open, idle: the fifth is accepted and answered.
    for stream in &mut busy {
        assert_eq!(next_response(stream).status, 200);
    }
    waiting
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        support::read_response(&mut waiting, &mut buffered)
            .unwrap()
            .status,
        200
    );
}

#[test]
fn silent_connections_hold_the_connection_cap_at_most_the_head_timeout() {
    use std::io::{Read, Write};
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "silent", &[pod.addr()], ""),
        "max_connections_per_shard = 4\nhead_timeout_seconds = 2\n",
        &["--shards", "1"],
        &[],
    );
    // Four clients connect and say nothing; a fifth is kept waiting by them.
    let mut silent: Vec<std::net::TcpStream> = (0..4).map(|_| activator.connect()).collect();
    thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let mut waiting = activator.connect();
    waiting.write_all(get("silent", "/").as_bytes()).unwrap();
    waiting
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let response = support::read_response(&mut waiting, &mut Vec::new()).expect("answered");
    assert_eq!(response.status, 200);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(3500),
        "a new client waited {waited:?} behind silent connections (head timeout 2 s)"
    );
    // The silent ones were closed by their head deadline, counted.
    for stream in &mut silent {
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).unwrap_or(0), 0);
    }
    assert!(activator.metric_sum("kactivator_shard_head_timeouts_total", &[]) >= 4.0);
}

#[test]
fn slow_heads_are_capped_and_cannot_grow_memory() {
    use std::io::Write;
    let pod = backend::spawn(BackendConfig::named("pod")).unwrap();
    let activator = Activator::start_with(
        &revision("default", "loris", &[pod.addr()], ""),
        "max_pending_heads_per_shard = 50\nmax_connections_per_shard = 100\n",
        &["--shards", "1"],
        &[],
    );
    let request = get("loris", "/");
    let before = activator.rss_kib();
    // Slow-loris clients: each sends the start of a head and then nothing more for now.
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut stream = activator.connect();
        stream.write_all(b"GET / HTTP/1.1\r\nX-Slow: ").unwrap();
        slow.push(stream);
    }
    thread::sleep(Duration::from_millis(200));
    // 2 000 more connect and send a byte every 100 ms. The shard stops accepting at 50 pending
    // heads (a connection is counted once its first bytes are read, so a few more may be taken
    // before), and never holds more than 100 connections.
    let mut queued = Vec::new();
    for _ in 0..2000 {
        match std::net::TcpStream::connect_timeout(&activator.http, Duration::from_millis(200)) {
            Ok(mut stream) => {
                let _ = stream.write_all(b"G");
                queued.push(stream);
            }
            Err(_) => break,
        }
    }
    for _ in 0..5 {
        for stream in &mut queued {
            let _ = stream.write_all(b"E");
        }
        thread::sleep(Duration::from_millis(100));
    }
    let during = activator.rss_kib();
    eprintln!(
        "RSS {before} KiB before, {during} KiB with 50 pending heads and {} queued connections",
        queued.len()
    );
    assert!(
        during < before + 4 * 1024,
        "memory grew by {} KiB under slow heads",
        during.saturating_sub(before)
    );
    assert!(
        activator.metric_sum("kactivator_shard_connections_open", &[]) <= 100.0,
        "{}",
        activator.metrics()
    );
    // The slow ones finish their heads: they are served, and so are the queued ones after them.
    for stream in &mut slow {
        stream
            .write_all(b"1\r\nHost: loris.default.svc.cluster.local\r\n\r\n")
            .unwrap();
        assert_eq!(next_response(stream).status, 200);
    }
    drop(queued);
    assert_eq!(exchange(activator.http, request.as_bytes()).status, 200);
}
