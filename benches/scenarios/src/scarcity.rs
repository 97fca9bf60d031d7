//! containerConcurrency=1 scarcity: P pods that each take one request at a time, C clients
//! (C > P) looping through kactivator without think time. Measures throughput against the ideal
//! P ÷ delay and against what the same backends achieve without kactivator (one client per pod,
//! the ceiling), client latency, and each pod's own high-water mark of concurrent requests
//! (over-commit is any mark above containerConcurrency).
//!
//! Rounds alternate the order of the rows (backend alone, then each driver; then backwards), as
//! `../shared/BENCHMARKS.md` asks, and the report takes medians over rounds.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::activator::{revision, Activator, Launch};
use crate::backends::{self, PodStats, Pods};
use crate::client::{get_request, Conn};
use crate::{fmt_us, median, percentile, ScratchDir};

const REVISION: &str = "scarce";
/// kactivator's prober (quarantine gate) sends `GET /healthz` to every routable pod each second.
/// A queue-proxy answers those itself, outside containerConcurrency, but the test backends would
/// count them as requests in flight: an over-commit that is not one. So the gate is off here.
pub const FEATURES: &str = "\"activator.pod-quarantine\" = \"disabled\"";
/// Longest wait for every pod to report nothing in flight between rows.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);
/// Client socket timeouts: a request waits in kactivator's queue for about
/// clients ÷ pods × delay, far below this.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Time the client threads get to connect before the warm-up starts.
const CONNECT_GRACE: Duration = Duration::from_millis(300);

#[derive(Clone, Debug)]
pub struct Options {
    pub pods: usize,
    pub container_concurrency: u32,
    pub clients: usize,
    pub delay_ms: u64,
    pub warmup: Duration,
    pub duration: Duration,
    pub rounds: usize,
    pub backend: backends::Kind,
    pub drivers: Vec<String>,
    pub shards: Option<usize>,
}

/// One row of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Row {
    /// The pods without kactivator: one client per pod, so exactly one request each at a time.
    Ceiling,
    Kactivator(String),
}

impl Row {
    fn label(&self) -> String {
        match self {
            Row::Ceiling => "backend alone (ceiling)".to_string(),
            Row::Kactivator(driver) => format!("kactivator {driver}"),
        }
    }
}

/// What one row measured in one round.
#[derive(Debug)]
pub struct Measured {
    /// Responses completed in the window, per second.
    pub rps: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// Responses completed in the window.
    pub requests: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// The pods' counters after the row (warm-up included).
    pub pods: Vec<PodStats>,
}

/// What one client thread saw.
#[derive(Default)]
struct ClientTally {
    latencies_us: Vec<u32>,
    completed_in_window: u64,
    errors: u64,
    first_error: Option<String>,
}

impl ClientTally {
    fn error(&mut self, message: String) {
        self.errors += 1;
        self.first_error.get_or_insert(message);
    }
}

/// Runs the scenario; returns the markdown report and whether it passed its invariant (no
/// over-commit, no failed request).
pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    let scratch = ScratchDir::new("scarcity")?;
    let pods = Pods::spawn(options.backend, options.pods)
        .map_err(|e| format!("starting {} backends: {e}", options.pods))?;
    let path = pods.path(options.delay_ms);
    let request: Arc<[u8]> = get_request(&path, REVISION).into();
    let requests = [Arc::clone(&request)];

    let mut activators = Vec::new();
    for driver in &options.drivers {
        let revisions = revision(
            REVISION,
            &pods.addrs(),
            &format!("container_concurrency = {}", options.container_concurrency),
        );
        let activator = Activator::start(&Launch {
            binary,
            driver,
            shards: options.shards,
            http_ip: "127.0.0.1",
            proxy: "",
            features: FEATURES,
            tables: "",
            revisions: &revisions,
            dir: scratch.path(),
            args: &[],
            env: &[],
        })
        .map_err(|e| format!("kactivator --driver {driver}: {e}"))?;
        first_request(&activator, &request, driver)?;
        eprintln!(
            "[scarcity] kactivator --driver {driver} pid {} on {}",
            activator.pid(),
            activator.http
        );
        activators.push((driver.clone(), activator));
    }

    let mut rows = vec![Row::Ceiling];
    rows.extend(options.drivers.iter().cloned().map(Row::Kactivator));
    let mut results: Vec<(usize, Row, Measured)> = Vec::new();
    for round in 1..=options.rounds {
        let mut order = rows.clone();
        if round % 2 == 0 {
            order.reverse();
        }
        for row in order {
            let targets: Vec<SocketAddr> = match &row {
                Row::Ceiling => pods.addrs(),
                Row::Kactivator(driver) => {
                    let (_, activator) = activators
                        .iter()
                        .find(|(d, _)| d == driver)
                        .expect("every driver row has its kactivator");
                    vec![activator.http; options.clients]
                }
            };
            let measured = measure(&pods, &targets, &requests, options)?;
            eprintln!(
                "[scarcity] round {round} {}: {:.0} rps, p50 {}, p99 {}, max in flight per pod {:?}, {} errors",
                row.label(),
                measured.rps,
                fmt_us(measured.p50_us),
                fmt_us(measured.p99_us),
                measured.pods.iter().map(|p| p.max_in_flight).collect::<Vec<_>>(),
                measured.errors,
            );
            results.push((round, row, measured));
        }
    }

    let mut notes = Vec::new();
    for (driver, activator) in activators {
        if let Some(note) = activator.stop() {
            notes.push(format!("{driver}: {note}"));
        }
    }
    Ok(report(options, &rows, &results, &path, &notes))
}

/// One request through kactivator, so that a misconfiguration fails at once and not as a table
/// of errors.
pub fn first_request(activator: &Activator, request: &[u8], label: &str) -> Result<(), String> {
    let mut conn = Conn::connect(activator.http, CLIENT_TIMEOUT)
        .map_err(|e| format!("connecting to kactivator {label}: {e}"))?;
    let response = conn
        .roundtrip(request)
        .map_err(|e| format!("first request through kactivator {label}: {e}"))?;
    if response.status != 200 {
        return Err(format!(
            "first request through kactivator {label} answered {} {}",
            response.status, response.body_start
        ));
    }
    Ok(())
}

/// One row for one round: clients loop on `targets` (client i on `targets[i]`, sending
/// `requests[i % requests.len()]`) through a warm-up and the measured window.
/// `options.warmup` and `options.duration` set the window. Also the throughput rows of the
/// `priority` scenario.
pub fn measure(
    pods: &Pods,
    targets: &[SocketAddr],
    requests: &[Arc<[u8]>],
    options: &Options,
) -> Result<Measured, String> {
    if requests.is_empty() {
        return Err("measure: no request to send".into());
    }
    quiesce(pods)?;
    // The high-water marks cover the warm-up too: an over-commit is one whenever it happens.
    pods.reset();
    let begin = Instant::now() + CONNECT_GRACE;
    let measure_from = begin + options.warmup;
    let end = measure_from + options.duration;
    let threads: Vec<_> = targets
        .iter()
        .enumerate()
        .map(|(index, &addr)| {
            let request = Arc::clone(&requests[index % requests.len()]);
            std::thread::Builder::new()
                .name(format!("client-{index}"))
                .stack_size(256 * 1024)
                .spawn(move || client_loop(addr, &request, begin, measure_from, end))
                .map_err(|e| format!("spawning a client thread: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut latencies = Vec::new();
    let mut completed = 0;
    let mut errors = 0;
    let mut first_error = None;
    for thread in threads {
        let tally = thread
            .join()
            .map_err(|_| "a client thread panicked".to_string())?;
        latencies.extend(tally.latencies_us);
        completed += tally.completed_in_window;
        errors += tally.errors;
        if first_error.is_none() {
            first_error = tally.first_error;
        }
    }
    quiesce(pods)?;
    latencies.sort_unstable();
    Ok(Measured {
        rps: completed as f64 / options.duration.as_secs_f64(),
        p50_us: percentile(&latencies, 50.0),
        p99_us: percentile(&latencies, 99.0),
        requests: completed,
        errors,
        first_error,
        pods: pods.stats(),
    })
}

/// Waits until no pod has a request in flight.
fn quiesce(pods: &Pods) -> Result<(), String> {
    let deadline = Instant::now() + QUIESCE_TIMEOUT;
    loop {
        let stats = pods.stats();
        if stats.iter().all(|pod| pod.in_flight == 0) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "pods still report requests in flight {QUIESCE_TIMEOUT:?} after the clients stopped: {stats:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One client: a keep-alive connection, one request at a time, no think time. Counts responses
/// completed inside `[measure_from, end)`; records the latency of those also sent inside it.
fn client_loop(
    addr: SocketAddr,
    request: &[u8],
    begin: Instant,
    measure_from: Instant,
    end: Instant,
) -> ClientTally {
    let mut tally = ClientTally::default();
    // Connect first, then start together (a failed connect is retried, and counted, below).
    let mut conn = Conn::connect(addr, CLIENT_TIMEOUT).ok();
    if let Some(wait) = begin.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
    loop {
        let sent = Instant::now();
        if sent >= end {
            return tally;
        }
        let current = match conn.as_mut() {
            Some(current) => current,
            None => match Conn::connect(addr, CLIENT_TIMEOUT) {
                Ok(fresh) => conn.insert(fresh),
                Err(e) => {
                    tally.error(format!("connect {addr}: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        match current.roundtrip(request) {
            Ok(response) if response.status == 200 => {
                let done = Instant::now();
                if done >= measure_from && done < end {
                    tally.completed_in_window += 1;
                    if sent >= measure_from {
                        let us = done.duration_since(sent).as_micros();
                        tally
                            .latencies_us
                            .push(u32::try_from(us).unwrap_or(u32::MAX));
                    }
                }
            }
            Ok(response) => tally.error(format!(
                "{addr} answered {} {}",
                response.status, response.body_start
            )),
            Err(e) => {
                tally.error(format!("{addr}: {e}"));
                conn = None;
            }
        }
    }
}

fn report(
    options: &Options,
    rows: &[Row],
    results: &[(usize, Row, Measured)],
    path: &str,
    notes: &[String],
) -> (String, bool) {
    let ideal = options.pods as f64 * f64::from(options.container_concurrency) * 1000.0
        / options.delay_ms as f64;
    let ceiling_in_round = |round: usize| {
        results
            .iter()
            .find(|(r, row, _)| *r == round && *row == Row::Ceiling)
            .map(|(_, _, m)| m.rps)
    };
    let mut passed = true;
    let mut out = String::new();
    let cc = options.container_concurrency;
    out.push_str(&format!(
        "\n## containerConcurrency={cc} scarcity: {} pods × CC {cc}, handler asked for {} ms ({} backend, GET {path}), \
         {} clients, {} s measured after {} s warm-up, median of {} alternating round(s)\n\n",
        options.pods,
        options.delay_ms,
        options.backend,
        options.clients,
        options.duration.as_secs_f64(),
        options.warmup.as_secs_f64(),
        options.rounds,
    ));
    out.push_str(&format!(
        "Ideal: {} pods × {cc} ÷ {} ms = {ideal:.0} req/s. The ceiling row is the same pods with one \
         client per pod and no kactivator ({} clients in total), so exactly one request per pod at \
         a time. \"cycle\" = pods × CC ÷ rps: the time one pod slot takes per request. \
         \"handler\": the pods' own mean time from reading a request head to writing its \
         response (exact backend only); \"idle gap\" = cycle − handler: how long a slot sits \
         idle between two requests (the proxy's hand-off, or the client's turnaround in the \
         ceiling row). The request counts and handler times cover warm-up and window.\n\n",
        options.pods, options.delay_ms, options.pods
    ));
    out.push_str(
        "| path | req/s | ÷ ideal | ÷ ceiling (same round) | cycle | handler | idle gap | p50 | p99 | max in flight per pod | errors |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let of = || results.iter().filter(|(_, r, _)| r == row);
        let rps = median(of().map(|(_, _, m)| m.rps).collect());
        let p50 = median(of().map(|(_, _, m)| m.p50_us as f64).collect());
        let p99 = median(of().map(|(_, _, m)| m.p99_us as f64).collect());
        let vs_ceiling = median(
            of().filter_map(|(round, _, m)| Some(m.rps / ceiling_in_round(*round)?))
                .collect(),
        );
        let mut max_per_pod = vec![0u64; options.pods];
        for (_, _, measured) in of() {
            for (max, pod) in max_per_pod.iter_mut().zip(&measured.pods) {
                *max = (*max).max(pod.max_in_flight);
            }
        }
        let errors: u64 = of().map(|(_, _, m)| m.errors).sum();
        let over = max_per_pod.iter().any(|&max| max > u64::from(cc));
        if over || errors > 0 {
            passed = false;
        }
        let cycle_ms = options.pods as f64 * f64::from(cc) * 1000.0 / rps;
        // The pods' own handler time per request, where the backend measures it.
        let handler_ms = median(
            of().filter_map(|(_, _, m)| {
                let busy: u64 = m.pods.iter().map(|p| p.busy_ns).sum::<Option<u64>>()?;
                let requests: u64 = m.pods.iter().map(|p| p.requests).sum();
                (requests > 0).then(|| busy as f64 / requests as f64 / 1e6)
            })
            .collect(),
        );
        let (handler, gap) = if handler_ms.is_nan() {
            ("—".to_string(), "—".to_string())
        } else {
            (
                format!("{handler_ms:.3} ms"),
                format!("{:.0} µs", (cycle_ms - handler_ms) * 1000.0),
            )
        };
        out.push_str(&format!(
            "| {} | {rps:.0} | {:.3} | {vs_ceiling:.3} | {cycle_ms:.3} ms | {handler} | {gap} | {} | {} | {}{} | {errors} |\n",
            row.label(),
            rps / ideal,
            fmt_us(p50 as u64),
            fmt_us(p99 as u64),
            max_per_pod
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            if over { " **OVER-COMMIT**" } else { "" },
        ));
    }
    out.push_str(
        "\nPer round (req/s; requests counted in the window; pod request counts, warm-up included):\n\n",
    );
    for (round, row, measured) in results {
        out.push_str(&format!(
            "- round {round} {}: {:.0} req/s, {} requests, per pod {:?}{}\n",
            row.label(),
            measured.rps,
            measured.requests,
            measured.pods.iter().map(|p| p.requests).collect::<Vec<_>>(),
            measured
                .first_error
                .as_ref()
                .map_or(String::new(), |e| format!(", first error: {e}")),
        ));
    }
    for note in notes {
        out.push_str(&format!("- note: {note}\n"));
    }
    out.push_str(&format!(
        "\nOver-commit (a pod's own high-water mark above {cc}): {}\n",
        if passed {
            "none"
        } else {
            "SEE TABLE (or failed requests)"
        }
    ));
    (out, passed)
}
