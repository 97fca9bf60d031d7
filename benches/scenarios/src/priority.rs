//! Priority bands and per-tenant fairness (issue 27), three figures from one kactivator per
//! driver:
//!
//! 1. **Fairness.** One pod with containerConcurrency 1 whose handler takes SERVICE ms, a
//!    revision with a priority policy. Tenant A (`K-Tenant: a`) has BACKLOG requests waiting;
//!    tenant B (`K-Tenant: b`) then sends ARRIVALS requests one at a time, each after the
//!    previous answer. B's wait per request = answer − send − SERVICE; the target is
//!    p99 ≤ 2 service times.
//! 2. **Priority.** The same with BACKLOG requests of band 0 (`K-Priority: 0`) waiting, then
//!    ARRIVALS of the top band sent at once: the pod's own journal says how many low requests it
//!    started between a high one's send and its start. The invariant: at most one (one the
//!    activator handed the slot to while the high request was on the wire).
//! 3. **Throughput cost.** The `scarcity` layout (P pods × CC 1, C clients, D ms) through two
//!    revisions of the same process that differ only in the policy, in alternating rounds
//!    (`scarcity::measure`): the on ÷ off ratio; the target is ≥ 0.98. Every request carries
//!    `K-Priority` and one of T `K-Tenant` keys, in both rows, so the bytes are the same.
//!
//! A backlog is queued exactly: one request of the backlog's class holds the pod for HOLD ms
//! while the BACKLOG others connect and wait (`kactivator_revision_queued` = BACKLOG), and the
//! arrivals start when the holder's answer comes back. Pods are the exact backend
//! (`backends::ExactBackend`) with a journal: each request carries `?id=<id>` in its target and
//! the pod records the order in which it started them, on the scenario's clock.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::activator::{revision, Activator, Launch};
use crate::backends::{ExactBackend, Handled, Kind, PodStats, Pods};
use crate::client::{get_request_with, Conn, Response};
use crate::scarcity::{self, first_request, Measured};
use crate::{fmt_us, median, percentile, ScratchDir};

/// Revision of the fairness figure (its own pod).
const FAIR: &str = "fair";
/// Revision of the priority figure (its own pod).
const ORDER: &str = "order";
/// The throughput revisions: the same pods, without and with a policy.
const OFF: &str = "scarce-off";
const ON: &str = "scarce-on";
/// Client socket timeouts: the last of a backlog waits BACKLOG × SERVICE (10 s at the defaults)
/// on a machine that may be slow.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest wait for the holder to reach its pod.
const HOLDER_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between two `/metrics` scrapes while a backlog builds up.
const POLL: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
pub struct Options {
    /// Handler time of the fairness and priority pods, in milliseconds.
    pub service_ms: u64,
    /// Requests waiting (tenant A's; the low band's).
    pub backlog: usize,
    /// Requests arriving behind them (tenant B's; the high band's).
    pub arrivals: usize,
    /// How long the request holding the pod takes while the backlog connects, in milliseconds.
    pub hold_ms: u64,
    /// `bands` of the policy; the low band is 0, the high one `bands - 1`.
    pub bands: u32,
    /// Fairness keys the throughput clients spread over.
    pub tenants: usize,
    /// The throughput rows' layout, window and rounds (`drivers`, `shards` are used for all).
    pub throughput: scarcity::Options,
}

/// What one driver measured.
struct DriverResult {
    driver: String,
    fairness: Figure,
    priority: Figure,
    /// (round, policy on, what it measured).
    throughput: Vec<(usize, bool, Measured)>,
}

/// A backlog and the arrivals behind it, as the clients and the pod saw them.
struct Figure {
    /// Requests waiting at the peak (`kactivator_revision_queued`), and when the arrivals began.
    peak_waiting: f64,
    waiting_at_start: f64,
    /// Per arrival: sent, answered, started at the pod, backlog requests the pod started between
    /// its send and its start.
    arrivals: Vec<Arrival>,
    /// Responses that were not 200 (backlog and arrivals), with the first one.
    failures: usize,
    first_failure: Option<String>,
    /// The pod's counters (requests, max in flight).
    pod: PodStats,
    /// The pod's mean handler time, the holder's left out.
    handler_mean: Option<Duration>,
}

struct Arrival {
    sent: Instant,
    answered: Instant,
    started: Option<Instant>,
    backlog_before: usize,
}

impl Figure {
    /// Client-side waits, answer − send − service, in µs, sorted (0 when shorter).
    fn waits_us(&self, service: Duration) -> Vec<u32> {
        let mut waits: Vec<u32> = self
            .arrivals
            .iter()
            .map(|a| {
                let us = (a.answered - a.sent).saturating_sub(service).as_micros();
                u32::try_from(us).unwrap_or(u32::MAX)
            })
            .collect();
        waits.sort_unstable();
        waits
    }

    /// Pod-side waits, start at the pod − send, in µs, sorted.
    fn pod_waits_us(&self) -> Vec<u32> {
        let mut waits: Vec<u32> = self
            .arrivals
            .iter()
            .filter_map(|a| {
                let us = a.started?.saturating_duration_since(a.sent).as_micros();
                Some(u32::try_from(us).unwrap_or(u32::MAX))
            })
            .collect();
        waits.sort_unstable();
        waits
    }
}

/// Runs the scenario; returns the markdown report and whether its invariants held (every
/// response 200, no pod above containerConcurrency, no high request served after more than one
/// low one that was waiting when it was sent).
pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    let scratch = ScratchDir::new("priority")?;
    let mut results = Vec::new();
    for driver in &options.throughput.drivers {
        results.push(run_driver(binary, driver, options, &scratch)?);
    }
    Ok(report(options, &results))
}

fn run_driver(
    binary: &Path,
    driver: &str,
    options: &Options,
    scratch: &ScratchDir,
) -> Result<DriverResult, String> {
    let t = &options.throughput;
    let fair_pod = ExactBackend::spawn_journaled().map_err(|e| format!("fairness pod: {e}"))?;
    let order_pod = ExactBackend::spawn_journaled().map_err(|e| format!("priority pod: {e}"))?;
    let pods = Pods::spawn(Kind::Exact, t.pods)
        .map_err(|e| format!("starting {} backends: {e}", t.pods))?;
    // The benchmark's client plays the trusted hop that sets the band.
    let policy = format!(
        "[revisions.priority]\nbands = {}\npriority_header_trusted = true",
        options.bands
    );
    let cc1 = "container_concurrency = 1";
    let cc = format!("container_concurrency = {}", t.container_concurrency);
    let revisions = [
        revision(FAIR, &[fair_pod.addr()], &format!("{cc1}\n{policy}")),
        revision(ORDER, &[order_pod.addr()], &format!("{cc1}\n{policy}")),
        revision(OFF, &pods.addrs(), &cc),
        revision(ON, &pods.addrs(), &format!("{cc}\n{policy}")),
    ]
    .concat();
    let activator = Activator::start(&Launch {
        binary,
        driver,
        shards: t.shards,
        http_ip: "127.0.0.1",
        proxy: "",
        features: scarcity::FEATURES,
        tables: "",
        revisions: &revisions,
        dir: scratch.path(),
        args: &[],
        env: &[],
    })
    .map_err(|e| format!("kactivator --driver {driver}: {e}"))?;
    eprintln!(
        "[priority] kactivator --driver {driver} pid {} on {}",
        activator.pid(),
        activator.http
    );

    let high = options.bands.saturating_sub(1);
    let fairness = figure(
        &activator,
        &fair_pod,
        FAIR,
        options,
        ("a", "K-Tenant: a\r\n"),
        ("b", "K-Tenant: b\r\n"),
        false,
    )?;
    eprintln!(
        "[priority] {driver} fairness: B's waits (answer − send − service) {:?} µs; A's started before each B {:?}",
        fairness.waits_us(Duration::from_millis(options.service_ms)),
        fairness.arrivals.iter().map(|a| a.backlog_before).collect::<Vec<_>>()
    );
    let priority = figure(
        &activator,
        &order_pod,
        ORDER,
        options,
        ("low", "K-Priority: 0\r\n"),
        ("high", &format!("K-Priority: {high}\r\n")),
        true,
    )?;
    eprintln!(
        "[priority] {driver} priority: lows started between each high's send and its start {:?}",
        priority
            .arrivals
            .iter()
            .map(|a| a.backlog_before)
            .collect::<Vec<_>>()
    );

    let throughput = throughput(&activator, &pods, options, driver)?;
    if let Some(note) = activator.stop() {
        eprintln!("[priority] {driver}: {note}");
    }
    Ok(DriverResult {
        driver: driver.to_string(),
        fairness,
        priority,
        throughput,
    })
}

/// One figure: a holder, BACKLOG requests of class `backlog` waiting behind it, then ARRIVALS
/// of class `arrival`: one at a time on one connection (`at_once` false), or each on its own
/// connection, all sent together (`at_once` true). Classes are (id prefix, header lines).
fn figure(
    activator: &Activator,
    pod: &ExactBackend,
    name: &str,
    options: &Options,
    backlog: (&str, &str),
    arrival: (&str, &str),
    at_once: bool,
) -> Result<Figure, String> {
    let service = options.service_ms;
    let request = |id: &str, delay: u64, headers: &str| {
        get_request_with(&format!("/delay/{delay}?id={id}"), name, headers)
    };
    let queued = || {
        activator.metric_sum(
            "kactivator_revision_queued",
            &[&format!("revision_name=\"{name}\"")],
        )
    };
    let connect = || {
        Conn::connect(activator.http, CLIENT_TIMEOUT)
            .map_err(|e| format!("connecting to kactivator: {e}"))
    };
    let (backlog_prefix, backlog_headers) = backlog;
    let (arrival_prefix, arrival_headers) = arrival;

    // The holder takes the pod's only slot; the backlog then waits behind it, all of it.
    let holder_id = format!("{backlog_prefix}-hold");
    let mut holder = connect()?;
    holder
        .send(&request(&holder_id, options.hold_ms, backlog_headers))
        .map_err(|e| format!("sending the holder: {e}"))?;
    let deadline = Instant::now() + HOLDER_TIMEOUT;
    // The pod is fresh: its first request is the holder.
    while pod.stats().requests == 0 {
        if Instant::now() > deadline {
            return Err(format!(
                "{name}: the holder did not reach its pod within {HOLDER_TIMEOUT:?}; kactivator's log:\n{}",
                activator.log_tail()
            ));
        }
        std::thread::sleep(POLL);
    }
    let mut waiting = Vec::with_capacity(options.backlog);
    for i in 0..options.backlog {
        let mut conn = connect()?;
        conn.send(&request(
            &format!("{backlog_prefix}-{i}"),
            service,
            backlog_headers,
        ))
        .map_err(|e| format!("sending backlog request {i}: {e}"))?;
        waiting.push(conn);
    }
    // The arrivals' connections are open before the clock starts.
    let mut arrival_conns = (0..if at_once { options.arrivals } else { 1 })
        .map(|_| connect())
        .collect::<Result<Vec<_>, _>>()?;
    let mut peak_waiting = 0f64;
    loop {
        let now = queued()?;
        peak_waiting = peak_waiting.max(now);
        // Full, or the holder is done and the pod has moved on.
        if now >= options.backlog as f64 || pod.stats().requests > 1 {
            break;
        }
        std::thread::sleep(POLL);
    }
    if peak_waiting < options.backlog as f64 {
        eprintln!(
            "[priority] {name}: only {peak_waiting} of {} waited at once; raise --hold-ms",
            options.backlog
        );
    }
    let mut failures = Failures::default();
    failures.check("holder", holder.read_response());
    let waiting_at_start = queued()?;

    let mut arrivals = Vec::with_capacity(options.arrivals);
    if at_once {
        let mut sent = Vec::with_capacity(options.arrivals);
        for (i, conn) in arrival_conns.iter_mut().enumerate() {
            let raw = request(&format!("{arrival_prefix}-{i}"), service, arrival_headers);
            sent.push(Instant::now());
            if let Err(e) = conn.send(&raw) {
                failures.add(format!("sending {arrival_prefix}-{i}: {e}"));
            }
        }
        for (i, conn) in arrival_conns.iter_mut().enumerate() {
            let outcome = conn.read_response();
            let answered = Instant::now();
            failures.check(&format!("{arrival_prefix}-{i}"), outcome);
            arrivals.push((sent[i], answered));
        }
    } else {
        let conn = &mut arrival_conns[0];
        for i in 0..options.arrivals {
            let raw = request(&format!("{arrival_prefix}-{i}"), service, arrival_headers);
            let sent = Instant::now();
            let outcome = conn.roundtrip(&raw);
            let answered = Instant::now();
            let broken = outcome.is_err();
            failures.check(&format!("{arrival_prefix}-{i}"), outcome);
            arrivals.push((sent, answered));
            if broken {
                *conn = connect()?;
            }
        }
    }
    for (i, conn) in waiting.iter_mut().enumerate() {
        failures.check(&format!("{backlog_prefix}-{i}"), conn.read_response());
    }

    let journal = pod.journal();
    let started_at = |id: &str| journal.iter().find(|s| s.id == id).map(|s| s.at);
    let backlog_started = |from: Instant, to: Instant| {
        journal
            .iter()
            .filter(|s: &&Handled| {
                s.id.starts_with(&format!("{backlog_prefix}-")) && s.id != holder_id
            })
            .filter(|s| s.at > from && s.at < to)
            .count()
    };
    let arrivals = arrivals
        .into_iter()
        .enumerate()
        .map(|(i, (sent, answered))| {
            let started = started_at(&format!("{arrival_prefix}-{i}"));
            Arrival {
                sent,
                answered,
                started,
                backlog_before: backlog_started(sent, started.unwrap_or(answered)),
            }
        })
        .collect();
    let handled: Vec<Duration> = journal
        .iter()
        .filter(|s| s.id != holder_id)
        .map(|s| s.took)
        .collect();
    Ok(Figure {
        peak_waiting,
        waiting_at_start,
        arrivals,
        failures: failures.count,
        first_failure: failures.first,
        pod: pod.stats(),
        handler_mean: (!handled.is_empty())
            .then(|| handled.iter().sum::<Duration>() / handled.len() as u32),
    })
}

/// Responses that were not 200, counted, with the first one described.
#[derive(Default)]
struct Failures {
    count: usize,
    first: Option<String>,
}

impl Failures {
    fn add(&mut self, message: String) {
        self.count += 1;
        self.first.get_or_insert(message);
    }

    fn check(&mut self, what: &str, outcome: std::io::Result<Response>) {
        match outcome {
            Ok(response) if response.status == 200 => {}
            Ok(response) => self.add(format!(
                "{what}: {} {}",
                response.status, response.body_start
            )),
            Err(e) => self.add(format!("{what}: {e}")),
        }
    }
}

/// The throughput rows: policy off and on, alternating which goes first from round to round.
fn throughput(
    activator: &Activator,
    pods: &Pods,
    options: &Options,
    driver: &str,
) -> Result<Vec<(usize, bool, Measured)>, String> {
    let t = &options.throughput;
    let path = pods.path(t.delay_ms);
    let high = options.bands.saturating_sub(1);
    let requests = |name: &str| -> Vec<Arc<[u8]>> {
        (0..options.tenants.max(1))
            .map(|tenant| {
                get_request_with(
                    &path,
                    name,
                    &format!("K-Priority: {high}\r\nK-Tenant: t{tenant}\r\n"),
                )
                .into()
            })
            .collect()
    };
    let (off, on) = (requests(OFF), requests(ON));
    if t.rounds > 0 {
        first_request(activator, &off[0], &format!("{driver} {OFF}"))?;
        first_request(activator, &on[0], &format!("{driver} {ON}"))?;
    }
    let targets: Vec<SocketAddr> = vec![activator.http; t.clients];
    let mut results = Vec::new();
    for round in 1..=t.rounds {
        let order = if round % 2 == 1 {
            [false, true]
        } else {
            [true, false]
        };
        for policy in order {
            let measured = scarcity::measure(pods, &targets, if policy { &on } else { &off }, t)?;
            eprintln!(
                "[priority] {driver} round {round} policy {}: {:.0} rps, p50 {}, p99 {}, max in flight per pod {:?}, {} errors",
                if policy { "on" } else { "off" },
                measured.rps,
                fmt_us(measured.p50_us),
                fmt_us(measured.p99_us),
                measured.pods.iter().map(|p| p.max_in_flight).collect::<Vec<_>>(),
                measured.errors,
            );
            results.push((round, policy, measured));
        }
    }
    Ok(results)
}

/// `µs` as milliseconds and service times.
fn ms_and_turns(us: u64, service_ms: u64) -> String {
    format!(
        "{:.1} ms ({:.2} ×)",
        us as f64 / 1000.0,
        us as f64 / 1000.0 / service_ms.max(1) as f64
    )
}

fn report(options: &Options, results: &[DriverResult]) -> (String, bool) {
    let t = &options.throughput;
    let service = Duration::from_millis(options.service_ms);
    let high = options.bands.saturating_sub(1);
    let shards = t.shards.map_or_else(
        || {
            format!(
                "kactivator's default ({} CPUs available)",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            )
        },
        |n| n.to_string(),
    );
    let mut passed = true;
    let mut out = String::new();
    out.push_str(&format!(
        "\n## Priority and fairness (issue 27): shards {shards}, policy `bands = {}`\n\n",
        options.bands
    ));
    for r in results {
        let pod_line = |figure: &Figure| {
            format!(
                "The pod: {} requests, mean handler {} (the holder left out), max in flight {}",
                figure.pod.requests,
                figure.handler_mean.map_or("—".to_string(), |d| format!(
                    "{:.2} ms",
                    d.as_secs_f64() * 1e3
                )),
                figure.pod.max_in_flight
            )
        };
        out.push_str(&format!("### kactivator {}\n\n", r.driver));

        // Fairness.
        let f = &r.fairness;
        let waits = f.waits_us(service);
        let pod_waits = f.pod_waits_us();
        let p99 = percentile(&waits, 99.0);
        let target = 2 * u64::try_from(service.as_micros()).unwrap_or(u64::MAX);
        out.push_str(&format!(
            "**Fairness.** One pod, containerConcurrency 1, `GET /delay/{}` (exact backend). \
             Tenant A (`K-Tenant: a`): {} requests on their own connections behind a {} ms holder \
             ({} waiting at the peak, {} when B began); tenant B (`K-Tenant: b`): {} requests, one \
             at a time on one keep-alive connection, each sent when the previous answer came \
             back. Wait = answer − send − {} ms; \"at the pod\" = the pod's start − send (same \
             clock). With {} samples, p99 is the largest.\n\n",
            options.service_ms,
            options.backlog,
            options.hold_ms,
            f.peak_waiting,
            f.waiting_at_start,
            f.arrivals.len(),
            options.service_ms,
            waits.len(),
        ));
        out.push_str("| B's wait | p50 | p99 | max |\n|---|---|---|---|\n");
        for (label, values) in [
            ("answer − send − service", &waits),
            ("at the pod (start − send)", &pod_waits),
        ] {
            out.push_str(&format!(
                "| {label} | {} | {} | {} |\n",
                ms_and_turns(percentile(values, 50.0), options.service_ms),
                ms_and_turns(percentile(values, 99.0), options.service_ms),
                ms_and_turns(
                    values.last().copied().map_or(0, u64::from),
                    options.service_ms
                ),
            ));
        }
        out.push_str(&format!(
            "\nA's requests the pod started between a B request's send and its start, per B request: {:?}. \
             Target p99 ≤ 2 service times ({} ms): **{}**. {}; {} failed responses{}.\n\n",
            f.arrivals.iter().map(|a| a.backlog_before).collect::<Vec<_>>(),
            2 * options.service_ms,
            if p99 <= target { "met" } else { "NOT met" },
            pod_line(f),
            f.failures,
            f.first_failure
                .as_ref()
                .map_or(String::new(), |e| format!(" (first: {e})")),
        ));
        if f.failures > 0 || f.pod.max_in_flight > 1 {
            passed = false;
        }

        // Priority.
        let p = &r.priority;
        let worst = p
            .arrivals
            .iter()
            .map(|a| a.backlog_before)
            .max()
            .unwrap_or(0);
        let unstarted = p.arrivals.iter().filter(|a| a.started.is_none()).count();
        let order_holds = worst <= 1 && unstarted == 0;
        out.push_str(&format!(
            "**Priority.** The same pod layout; {} requests of band 0 (`K-Priority: 0`) waiting \
             behind a {} ms holder ({} at the peak, {} when the high ones were sent), then {} of \
             band {high} (`K-Priority: {high}`), each on its own connection, sent together. Per \
             high request, the low requests the pod started between its send and its start \
             (every low one was waiting by then; the invariant allows 1, handed the slot while \
             the high one was on the wire): {:?}. Invariant: **{}**. The high ones' wait at the \
             pod (start − send): p50 {}, max {}. {}; {} failed responses{}.\n\n",
            options.backlog,
            options.hold_ms,
            p.peak_waiting,
            p.waiting_at_start,
            p.arrivals.len(),
            p.arrivals
                .iter()
                .map(|a| a.backlog_before)
                .collect::<Vec<_>>(),
            if order_holds { "holds" } else { "BROKEN" },
            ms_and_turns(percentile(&p.pod_waits_us(), 50.0), options.service_ms),
            ms_and_turns(
                p.pod_waits_us().last().copied().map_or(0, u64::from),
                options.service_ms
            ),
            pod_line(p),
            p.failures,
            p.first_failure
                .as_ref()
                .map_or(String::new(), |e| format!(" (first: {e})")),
        ));
        if !order_holds || p.failures > 0 || p.pod.max_in_flight > 1 {
            passed = false;
        }

        // Throughput.
        if r.throughput.is_empty() {
            out.push_str("**Throughput cost.** Not measured (`--rounds 0`).\n\n");
            continue;
        }
        let ideal =
            t.pods as f64 * f64::from(t.container_concurrency) * 1000.0 / t.delay_ms.max(1) as f64;
        out.push_str(&format!(
            "**Throughput cost.** The scarcity layout: {} pods × CC {}, `GET /delay/{}`, {} \
             clients on keep-alive connections, {} s measured after {} s warm-up per row, {} \
             rounds alternating which row goes first; revisions `{OFF}` (no policy) and `{ON}` \
             (`bands = {}`) of the same process with the same pods, every request with \
             `K-Priority: {high}` and one of {} `K-Tenant` keys. Ideal {ideal:.0} req/s.\n\n",
            t.pods,
            t.container_concurrency,
            t.delay_ms,
            t.clients,
            t.duration.as_secs_f64(),
            t.warmup.as_secs_f64(),
            t.rounds,
            options.bands,
            options.tenants.max(1),
        ));
        out.push_str(
            "| policy | req/s (median) | ÷ ideal | p50 | p99 | max in flight per pod | errors |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for policy in [false, true] {
            let of = || r.throughput.iter().filter(|(_, on, _)| *on == policy);
            let rps = median(of().map(|(_, _, m)| m.rps).collect());
            let p50 = median(of().map(|(_, _, m)| m.p50_us as f64).collect());
            let p99 = median(of().map(|(_, _, m)| m.p99_us as f64).collect());
            let mut max_per_pod = vec![0u64; t.pods];
            for (_, _, m) in of() {
                for (max, pod) in max_per_pod.iter_mut().zip(&m.pods) {
                    *max = (*max).max(pod.max_in_flight);
                }
            }
            let errors: u64 = of().map(|(_, _, m)| m.errors).sum();
            let over = max_per_pod
                .iter()
                .any(|&max| max > u64::from(t.container_concurrency));
            if over || errors > 0 {
                passed = false;
            }
            out.push_str(&format!(
                "| {} | {rps:.0} | {:.3} | {} | {} | {}{} | {errors} |\n",
                if policy { "on" } else { "off" },
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
        let mut ratios = Vec::new();
        for round in 1..=t.rounds {
            let rps = |policy: bool| {
                r.throughput
                    .iter()
                    .find(|(n, on, _)| *n == round && *on == policy)
                    .map(|(_, _, m)| m.rps)
            };
            if let (Some(off), Some(on)) = (rps(false), rps(true)) {
                ratios.push((round, on / off, off, on));
            }
        }
        let ratio = median(ratios.iter().map(|(_, ratio, _, _)| *ratio).collect());
        out.push_str(&format!(
            "\nOn ÷ off per round: {}. Median **{ratio:.3}** (target ≥ 0.98: **{}**).\n\n",
            ratios
                .iter()
                .map(|(round, ratio, off, on)| format!(
                    "round {round} {ratio:.3} ({on:.0} ÷ {off:.0})"
                ))
                .collect::<Vec<_>>()
                .join(", "),
            if ratio >= 0.98 { "met" } else { "NOT met" },
        ));
        for (round, policy, m) in &r.throughput {
            if let Some(error) = &m.first_error {
                out.push_str(&format!(
                    "- round {round} policy {}: {} errors, first: {error}\n",
                    if *policy { "on" } else { "off" },
                    m.errors
                ));
            }
        }
    }
    out.push_str(&format!(
        "Invariants (every response 200, no pod above its containerConcurrency, every high \
         request served after at most one low one that was waiting): **{}**. The timing targets \
         (B's p99, the throughput ratio) are reported, not enforced: they depend on the machine.\n",
        if passed { "hold" } else { "BROKEN" }
    ));
    (out, passed)
}
