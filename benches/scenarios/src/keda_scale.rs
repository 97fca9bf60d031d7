//! keda-scale: the KEDA HTTP add-on role's control plane at scale, as `kube-scale` measures the
//! activator role's. A real kube-apiserver (testkit's, v1.20.2) holding ROUTES routes, each as a
//! user and the endpoint controller write it: a Service, its EndpointSlice with PODS ready
//! endpoints, and an HTTPScaledObject routing `r<i>.example.com` to the Service; and
//! `kactivator keda-http` watching it as the ServiceAccount of `deploy/keda-http/rbac.yaml`.
//! Measured: how long the objects take to create, the initial sync (process start → `/readyz`
//! 200), RSS, the latency of single-EndpointSlice changes under background churn from
//! kactivator's own histogram `kactivator_kubernetes_event_apply_seconds` (a watch event's
//! arrival → its ops applied by the state worker and sent to every shard), and kactivator's CPU
//! time per watch event over the changes.
//!
//! The pods are addresses only (10.200.0.0 upwards): nothing listens on them, and nothing needs
//! to: the role trusts a ready endpoint of a slice without probing it, and no request is sent.

use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kactivator_testkit::apiserver::ApiServer;
use kactivator_testkit::ports::free_port;

use crate::activator::{self, Activator, Launch};
use crate::kube::{
    self, describe_bucket, pod_ip, Buckets, ChangeWindow, Changed, Creation, KubectlProxy, Random,
    APPLY_HISTOGRAM,
};
use crate::{fmt_us, mib, percentile, ScratchDir};

/// The port every pod serves on, the Services' target port.
const POD_PORT: u16 = 8080;
/// Pause between `/readyz` 200 and the first RSS reading.
const AFTER_READY: Duration = Duration::from_secs(2);
/// How long the routable-pods gauges may take to show every route's pods once ready.
const GAUGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after the last change before the CPU window closes: the last events are applied.
const SETTLE_PAUSE: Duration = Duration::from_secs(1);
/// How often the histogram is looked at while kactivator works through a backlog of events:
/// each look renders `/metrics` (2 MB and ~0.1 s of CPU at 5 000 routes).
const BACKLOG_LOOK: Duration = Duration::from_secs(5);
/// Every route's ready pods, as the shell exports them.
const ROUTABLE_GAUGE: &str = "kactivator_revision_routable_pods";
/// How long a `/metrics` scrape may take: a process working through a backlog of watch events
/// answers late.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(120);
/// The shards are quiet once their threads use at most this much CPU, together, in one
/// [`QUIET_SLICE`].
const QUIET_CPU: Duration = Duration::from_millis(50);
const QUIET_SLICE: Duration = Duration::from_secs(1);
/// The shards' threads' names start with this.
const SHARD_THREAD: &str = "shard-";

pub struct Options {
    pub routes: usize,
    pub pods: usize,
    /// Single-EndpointSlice changes measured, one at a time.
    pub changes: usize,
    /// Background changes per second to other routes' slices while measuring.
    pub churn_per_second: f64,
    /// Routes per `kubectl create -f -` (three objects each).
    pub chunk: usize,
    /// `kubectl create` processes at once.
    pub create_workers: usize,
    /// Pause after each measured change before the next.
    pub gap: Duration,
    /// How long kactivator may take from start to `/readyz` 200.
    pub sync_timeout: Duration,
    /// The window of idle CPU measured before the changes.
    pub idle: Duration,
    /// How long the shards may stay busy after `/readyz` before the idle window starts anyway.
    pub quiet_timeout: Duration,
    pub driver: String,
    pub shards: usize,
}

fn route_name(index: usize) -> String {
    format!("r{index}")
}

/// Route `index`'s three objects, its pods `pods` addresses from `index × pods` on.
fn route_yaml(index: usize, pods: usize) -> String {
    let name = route_name(index);
    let ready: Vec<IpAddr> = (0..pods)
        .map(|k| IpAddr::V4(pod_ip((index * pods + k) as u64)))
        .collect();
    kube::keda_route_yaml(&name, &format!("{name}.example.com"), &ready, POD_PORT, "")
}

/// Replaces the address of endpoint `endpoint` of route `name`'s EndpointSlice with `ip`.
fn replace_endpoint(
    proxy: &KubectlProxy,
    name: &str,
    endpoint: usize,
    ip: std::net::Ipv4Addr,
) -> Result<(), String> {
    proxy.json_patch(
        &kube::keda_slice_path(name),
        &format!(
            r#"[{{"op":"replace","path":"/endpoints/{endpoint}/addresses/0","value":"{ip}"}}]"#
        ),
    )
}

/// CPU time so far of the shard threads and of all the others (the control thread, the
/// state worker, the runtimes' pools).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Split {
    shards: Duration,
    rest: Duration,
}

impl Split {
    fn of(activator: &Activator) -> Result<Split, String> {
        let mut split = Split::default();
        for (name, time) in activator.thread_cpu_times()? {
            if name.starts_with(SHARD_THREAD) {
                split.shards += time;
            } else {
                split.rest += time;
            }
        }
        Ok(split)
    }

    fn since(self, earlier: Split) -> Split {
        Split {
            shards: self.shards.saturating_sub(earlier.shards),
            rest: self.rest.saturating_sub(earlier.rest),
        }
    }
}

/// The run's figures.
struct Measured {
    sync: Duration,
    /// kactivator's CPU time from start to `/readyz` 200.
    sync_cpu: Duration,
    /// From `/readyz` 200 to the start of the first quiet slice of the shards, and whether
    /// that was the first slice looked at (then they may have been quiet earlier); `None`: not
    /// quiet within [`Options::quiet_timeout`]. And the shards' CPU in between.
    shards_busy: Option<(Duration, bool)>,
    shards_busy_cpu: Duration,
    rss_synced_kib: u64,
    /// Once the shards were quiet (after at least one `/metrics` scrape, which renders every
    /// route's series).
    rss_quiet_kib: u64,
    rss_end_kib: u64,
    /// Size and time of the first scrape.
    scrape_bytes: usize,
    scrape: Duration,
    /// The routable-pods gauges' sum once it settled (or at the timeout).
    routable: f64,
    /// kactivator's CPU over [`Options::idle`] with nothing changing, by thread kind.
    idle_cpu: Split,
    /// The measured changes and the churn.
    changed: Changed,
    /// The histogram's observations since just before the first change, once every change
    /// was counted (or the settle timeout).
    applied: Buckets,
    /// kactivator's CPU from just before the first change until every change was counted
    /// (at least [`SETTLE_PAUSE`] after the last): the process's (`/proc/<pid>/stat`) and by
    /// thread kind; and that window's length.
    window_cpu: Duration,
    window_split: Split,
    window: Duration,
    notes: Vec<String>,
}

pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    eprintln!("[keda-scale] starting kube-apiserver and etcd");
    let api = kube::keda_api_server()?;
    let proxy = KubectlProxy::start(&api)?;
    eprintln!(
        "[keda-scale] creating {} routes × {} pods ({} objects)",
        options.routes,
        options.pods,
        options.routes * 3
    );
    let pods = options.pods;
    let creation = kube::create(
        &api,
        &kube::Batches {
            tag: "keda-scale",
            noun: "routes",
            count: options.routes,
            chunk: options.chunk,
            workers: options.create_workers,
            objects_per_item: 3,
            yaml: &|index| route_yaml(index, pods),
        },
    )?;
    eprintln!(
        "[keda-scale] created {} objects in {:.1} s",
        creation.objects,
        creation.elapsed.as_secs_f64()
    );
    let measured = measure(binary, &api, &proxy, &creation, options)?;
    Ok(report(&creation, &measured, options))
}

fn measure(
    binary: &Path,
    api: &ApiServer,
    proxy: &KubectlProxy,
    creation: &Creation,
    options: &Options,
) -> Result<Measured, String> {
    let dir = ScratchDir::new("keda-scale")?;
    let kubeconfig = kube::keda_role_kubeconfig(api)?.display().to_string();
    let scaler_port = free_port().to_string();
    let metrics_port = free_port().to_string();
    let env = [
        ("KUBECONFIG", kubeconfig.as_str()),
        ("KEDA_HTTP_SCALER_PORT", scaler_port.as_str()),
        ("OTEL_PROM_EXPORTER_PORT", metrics_port.as_str()),
    ];
    let launch = Launch {
        binary,
        driver: &options.driver,
        shards: Some(options.shards),
        http_ip: "127.0.0.1",
        proxy: "",
        features: "",
        tables: "",
        revisions: "",
        dir: dir.path(),
        args: &["keda-http"],
        env: &env,
    };
    eprintln!("[keda-scale] starting kactivator keda-http, waiting for /readyz");
    let started = Instant::now();
    let mut activator = Activator::spawn(&launch)?;
    activator.wait_ready(options.sync_timeout)?;
    let sync = started.elapsed();
    let ready_at = Instant::now();
    let sync_cpu = activator.cpu_time()?;
    let split_at_ready = Split::of(&activator)?;
    eprintln!(
        "[keda-scale] ready after {:.2} s ({:.2} s of CPU)",
        sync.as_secs_f64(),
        sync_cpu.as_secs_f64()
    );
    // The shards take the first view off their channels after /readyz: let them.
    std::thread::sleep(AFTER_READY);
    let rss_synced_kib = activator.memory_kib()?.rss;

    let mut notes = Vec::new();
    // Every route routes to its pods: the gauges' sum is routes × pods.
    let expected = (creation.items.len() * options.pods) as f64;
    let deadline = Instant::now() + GAUGE_TIMEOUT;
    let mut first_scrape = None;
    let routable = loop {
        let scrape_started = Instant::now();
        let metrics = activator.metrics_within(SCRAPE_TIMEOUT)?;
        let scrape = scrape_started.elapsed();
        first_scrape.get_or_insert((metrics.len(), scrape));
        let routable = activator::sum_of(&metrics, ROUTABLE_GAUGE, &[]);
        if routable == expected {
            break routable;
        }
        if Instant::now() > deadline {
            notes.push(format!(
                "`{ROUTABLE_GAUGE}` sums to {routable}, not {expected} (routes × pods), \
                 {GAUGE_TIMEOUT:?} after /readyz + {AFTER_READY:?}"
            ));
            break routable;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let (scrape_bytes, scrape) = first_scrape.expect("the loop scrapes");

    // The shards may still be working on the first view after /readyz: wait until a slice
    // in which they are quiet, so that neither the idle window nor the changes pay for it.
    let shards_busy = wait_shards_quiet(&activator, ready_at, options.quiet_timeout)?;
    let shards_busy_cpu = Split::of(&activator)?.since(split_at_ready).shards;
    if shards_busy.is_none() {
        notes.push(format!(
            "the shards were still busy {:?} after /readyz; the idle window and the changes \
             started anyway",
            options.quiet_timeout
        ));
    }
    let rss_quiet_kib = activator.memory_kib()?.rss;
    eprintln!(
        "[keda-scale] RSS {} MiB 2 s after /readyz, {} MiB once the shards were quiet ({}); \
         one /metrics: {:.1} MB in {}",
        rss_synced_kib / 1024,
        rss_quiet_kib / 1024,
        shards_busy.map_or("not within the timeout".into(), |busy| format!(
            "{} s after /readyz, {:.1} s of their CPU",
            describe_busy(busy),
            shards_busy_cpu.as_secs_f64()
        )),
        scrape_bytes as f64 / 1e6,
        fmt_us(scrape.as_micros() as u64)
    );

    // What the process burns with nothing to do (timers, the scaler's counting task), to set
    // against the change window's CPU.
    let idle_before = Split::of(&activator)?;
    std::thread::sleep(options.idle);
    let idle_cpu = Split::of(&activator)?.since(idle_before);

    // The measured changes go to one half of the routes, the churn to the other, so the two
    // never patch the same slice. Addresses for changes follow the ones the objects have.
    let measured: Vec<usize> = creation.items.iter().copied().step_by(2).collect();
    let others: Vec<usize> = creation.items.iter().copied().skip(1).step_by(2).collect();
    let fresh = AtomicU64::new((options.routes * options.pods) as u64);
    let before = Buckets::parse(&activator.metrics_within(SCRAPE_TIMEOUT)?, APPLY_HISTOGRAM)?;
    eprintln!(
        "[keda-scale] idle CPU {} ms over {} s (shards {} ms); {} changes at {} ms gaps, churn \
         {}/s",
        (idle_cpu.shards + idle_cpu.rest).as_millis(),
        options.idle.as_secs(),
        idle_cpu.shards.as_millis(),
        options.changes,
        options.gap.as_millis(),
        options.churn_per_second
    );
    let cpu_before = activator.cpu_time()?;
    let split_before = Split::of(&activator)?;
    let window_started = Instant::now();
    let changed = ChangeWindow {
        tag: "keda-scale",
        changes: options.changes,
        gap: options.gap,
        churn_per_second: options.churn_per_second,
        measured: &measured,
        churned: &others,
        change: &|route, random: &mut Random| {
            let ip = pod_ip(fresh.fetch_add(1, Ordering::Relaxed));
            replace_endpoint(proxy, &route_name(route), random.below(options.pods), ip)
        },
    }
    .run()?;
    // Every patch is one watch event and one observation. The CPU window closes once the
    // histogram has counted them all: at the first look SETTLE_PAUSE after the last change, or,
    // when the control thread is still working through a backlog, at a later look
    // BACKLOG_LOOK apart (each a `/metrics` render, counted in the window). It waits as long
    // as the count grows, and gives up after SETTLE_TIMEOUT without progress.
    let made = changed.made();
    std::thread::sleep(SETTLE_PAUSE);
    let mut deadline = Instant::now() + kube::SETTLE_TIMEOUT;
    let mut last_count = 0.0;
    let mut extra_scrapes = 0;
    let (window_cpu, window_split, window, applied) = loop {
        let cpu = activator.cpu_time()?.saturating_sub(cpu_before);
        let split = Split::of(&activator)?.since(split_before);
        let window = window_started.elapsed();
        let counted = Buckets::parse(&activator.metrics_within(SCRAPE_TIMEOUT)?, APPLY_HISTOGRAM)?
            .since(&before)?;
        if counted.count() >= made as f64 || Instant::now() > deadline {
            break (cpu, split, window, counted);
        }
        if counted.count() > last_count {
            last_count = counted.count();
            deadline = Instant::now() + kube::SETTLE_TIMEOUT;
        }
        if extra_scrapes % 6 == 0 {
            eprintln!(
                "[keda-scale] a backlog: {} of {made} events applied {:.0} s after the last change",
                counted.count(),
                window.as_secs_f64() - changed.seconds
            );
        }
        extra_scrapes += 1;
        std::thread::sleep(BACKLOG_LOOK);
    };
    if extra_scrapes > 0 {
        notes.push(format!(
            "a backlog: every event was counted by {:.1} s after the last change ({extra_scrapes} \
             more looks, at least {BACKLOG_LOOK:?} apart: a busy process answers a scrape late); \
             the CPU window stayed open until then and holds those {extra_scrapes} `/metrics` \
             renders of {:.1} MB",
            window.as_secs_f64() - changed.seconds,
            scrape_bytes as f64 / 1e6
        ));
    }
    // Above ~90 % of a core outside the shards, the control thread had no slack: CPU per event
    // is then the window over the events it got through, the idle tasks' share included.
    let busy = window_split.rest.as_secs_f64() / window.as_secs_f64().max(1e-9);
    if busy >= 0.9 {
        notes.push(format!(
            "saturated: the threads other than the shards used {:.0} % of a core over the \
             window, so the control thread had no slack and the events queued behind one \
             another; for the cost of one event on its own, pace the changes below it (e.g. \
             `--changes 60 --churn-per-second 0 --gap-ms 1000`)",
            busy * 100.0
        ));
    }
    notes.extend(changed.shortfalls(applied.count()));
    let rss_end_kib = activator.memory_kib()?.rss;
    if let Some(trouble) = activator.stop() {
        notes.push(trouble);
    }
    Ok(Measured {
        sync,
        sync_cpu,
        shards_busy,
        shards_busy_cpu,
        rss_synced_kib,
        rss_quiet_kib,
        rss_end_kib,
        scrape_bytes,
        scrape,
        routable,
        idle_cpu,
        changed,
        applied,
        window_cpu,
        window_split,
        window,
        notes,
    })
}

/// Waits for a [`QUIET_SLICE`] in which the shard threads use at most [`QUIET_CPU`]; returns
/// how long after `ready_at` that slice began and whether it was the first, `None` after
/// `timeout`.
fn wait_shards_quiet(
    activator: &Activator,
    ready_at: Instant,
    timeout: Duration,
) -> Result<Option<(Duration, bool)>, String> {
    let deadline = Instant::now() + timeout;
    let mut slice_start = (Instant::now(), Split::of(activator)?.shards);
    let mut first = true;
    loop {
        std::thread::sleep(QUIET_SLICE);
        let now = (Instant::now(), Split::of(activator)?.shards);
        if now.1.saturating_sub(slice_start.1) <= QUIET_CPU {
            return Ok(Some((slice_start.0 - ready_at, first)));
        }
        first = false;
        if now.0 > deadline {
            return Ok(None);
        }
        slice_start = now;
    }
}

/// `2.0` or, when the first slice looked at was already quiet, `≤ 2.0`.
fn describe_busy((busy, first): (Duration, bool)) -> String {
    format!("{}{:.1}", if first { "≤ " } else { "" }, busy.as_secs_f64())
}

/// CPU per event: the whole window's (the process's), the shards' part of it, and the whole
/// net of what the process burns idle over as long.
struct PerEvent {
    gross: Duration,
    shards: Duration,
    net: Duration,
}

fn per_event(measured: &Measured, idle: Duration) -> Option<PerEvent> {
    let events = measured.applied.count();
    if events <= 0.0 {
        return None;
    }
    let idle_total = measured.idle_cpu.shards + measured.idle_cpu.rest;
    let idle_rate = idle_total.as_secs_f64() / idle.as_secs_f64().max(1e-9);
    let gross = measured.window_cpu.as_secs_f64();
    let net = (gross - idle_rate * measured.window.as_secs_f64()).max(0.0);
    Some(PerEvent {
        gross: Duration::from_secs_f64(gross / events),
        shards: Duration::from_secs_f64(measured.window_split.shards.as_secs_f64() / events),
        net: Duration::from_secs_f64(net / events),
    })
}

fn report(creation: &Creation, measured: &Measured, options: &Options) -> (String, bool) {
    let routes = creation.items.len();
    let mut report = format!(
        "### KEDA role's control plane at scale (keda-scale)\n\n\
         A real kube-apiserver 1.20.2 (testkit, one etcd) with {routes} routes × {} pods, each \
         route a Service, its EndpointSlice (`discovery.k8s.io/v1beta1`, {} ready endpoints, {} \
         in all; nothing listens on them: the role trusts a slice's ready endpoints) and an \
         HTTPScaledObject routing `r<i>.example.com` to the Service, all in `default`. \
         `kactivator keda-http --shards {}` (driver {}) watches it as \
         `deploy/keda-http/rbac.yaml`'s ServiceAccount.\n\n",
        options.pods,
        options.pods,
        routes * options.pods,
        options.shards,
        options.driver,
    );
    if let Some(fallback) = &creation.fallback {
        report.push_str(&format!("**FALLBACK**: {fallback}.\n\n"));
    }
    report.push_str(&format!(
        "Created {} objects in {:.1} s ({:.0} objects/s; `kubectl create -f -`, {} routes per \
         call, {} calls at once).\n\n",
        creation.objects,
        creation.elapsed.as_secs_f64(),
        creation.objects as f64 / creation.elapsed.as_secs_f64(),
        options.chunk,
        options.create_workers,
    ));
    let ms = |duration: Duration| format!("{:.3} ms", duration.as_secs_f64() * 1e3);
    let idle_total = measured.idle_cpu.shards + measured.idle_cpu.rest;
    report.push_str(
        "| routes | pods | create | start → /readyz 200 | its CPU | shards busy after /readyz \
         | their CPU | RSS 2 s after /readyz | once the shards are quiet | at end | idle CPU |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    report.push_str(&format!(
        "| {routes} | {} | {:.1} s | {:.2} s | {:.2} s | {} | {:.2} s | {} | {} | {} | {:.1} % of \
         a core |\n\n",
        options.pods,
        creation.elapsed.as_secs_f64(),
        measured.sync.as_secs_f64(),
        measured.sync_cpu.as_secs_f64(),
        measured
            .shards_busy
            .map_or(format!("> {:?}", options.quiet_timeout), |busy| format!(
                "{} s",
                describe_busy(busy)
            )),
        measured.shards_busy_cpu.as_secs_f64(),
        mib(measured.rss_synced_kib),
        mib(measured.rss_quiet_kib),
        mib(measured.rss_end_kib),
        idle_total.as_secs_f64() * 100.0 / options.idle.as_secs_f64(),
    ));
    let applied = &measured.applied;
    let cpu = per_event(measured, options.idle);
    let quantile = |q: f64| {
        format!(
            "{} (≈ {})",
            describe_bucket(applied.quantile_bucket(q)),
            applied.quantile(q).describe()
        )
    };
    report.push_str(
        "| events | apply p50 | apply p99 | ≤ 1 ms | mean | **CPU per event** | of it the shards' \
         | net of idle | net per route |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    report.push_str(&format!(
        "| {} | {} | {} | {} | {} | **{}** | {} | {} | {} |\n",
        applied.count(),
        quantile(0.5),
        quantile(0.99),
        applied
            .share_within(0.001)
            .map_or("–".into(), |share| format!("{:.1} %", share * 100.0)),
        applied.describe_mean(),
        cpu.as_ref().map_or("–".into(), |cpu| ms(cpu.gross)),
        cpu.as_ref().map_or("–".into(), |cpu| ms(cpu.shards)),
        cpu.as_ref().map_or("–".into(), |cpu| ms(cpu.net)),
        cpu.as_ref().map_or("–".into(), |cpu| format!(
            "{:.1} µs",
            cpu.net.as_secs_f64() * 1e6 / routes as f64
        )),
    ));
    report.push_str(&format!(
        "\n\"its CPU\" is kactivator's user + system time up to `/readyz` 200. \"shards busy \
         after /readyz\": from `/readyz` 200 to the first {:?} slice in which the shard threads \
         (`{SHARD_THREAD}*`) used at most {:?} of CPU together, with their CPU in between (≤: \
         already quiet at the first look); the idle window and the changes wait for it. RSS \
         is `VmRSS` {} s after `/readyz` answered 200, once the shards are quiet (after a first `/metrics` scrape: {:.1} MB in {}; every \
         route's series), and at the end. \"idle CPU\": the process's, over {} s with nothing \
         changing, after the shards were quiet ({} ms, of it {} ms the shards').\n",
        QUIET_SLICE,
        QUIET_CPU,
        AFTER_READY.as_secs(),
        measured.scrape_bytes as f64 / 1e6,
        fmt_us(measured.scrape.as_micros() as u64),
        options.idle.as_secs(),
        idle_total.as_millis(),
        measured.idle_cpu.shards.as_millis(),
    ));
    report.push_str(&format!(
        "\nLatency is kactivator's own histogram `{APPLY_HISTOGRAM}`, which the KEDA source \
         observes for every watch event after the initial sync: the event's arrival → its ops \
         applied by the state worker and sent to every shard. Scraped before and after the \
         changes; p50/p99 are the bucket that holds the rank (bounds 50, 100, 250, 500 µs, 1, \
         2.5, 5, 10, 50, 250 ms, 1 s) and, after ≈, the linear interpolation inside it (as \
         `histogram_quantile`). \"events\" counts every event applied: the measured changes and \
         the churn.\n"
    ));
    report.push_str(&format!(
        "\nCPU per event: kactivator's user + system time (`/proc/<pid>/stat`, all threads) from \
         just before the first change until the histogram had counted every change, at least {} \
         s after the last ({:.1} s, {} ms of CPU, {} ms of it the shards'), divided by the {} \
         events it counted. \"net of idle\" first takes off what the process used over as long \
         with nothing changing; \"net per route\" divides that by the {routes} routes: the \
         cost of a model that recomputes every route on every event, if it is linear. While the \
         CPU per event is above the pace of the events (one every {:.1} ms here), the control \
         thread falls behind: an event then waits in its watch stream, and that wait is not in \
         the histogram, which starts when the source takes the event.\n",
        SETTLE_PAUSE.as_secs(),
        measured.window.as_secs_f64(),
        measured.window_cpu.as_millis(),
        measured.window_split.shards.as_millis(),
        applied.count(),
        measured.changed.seconds * 1e3 / measured.changed.made().max(1) as f64,
    ));
    let changed = &measured.changed;
    report.push_str(&format!(
        "\n- {} single-endpoint changes (a JSON patch replacing one endpoint's address in a \
         route's EndpointSlice), one at a time, {} ms apart, through `kubectl proxy` (API round \
         trip p50 {}, p99 {}); meanwhile {} churn patches to the other half of the routes \
         ({:.1}/s, {} failed).\n",
        changed.round_trips_us.len(),
        options.gap.as_millis(),
        fmt_us(percentile(&changed.round_trips_us, 50.0)),
        fmt_us(percentile(&changed.round_trips_us, 99.0)),
        changed.churned,
        changed.churned as f64 / changed.seconds,
        changed.churn_failed,
    ));
    report.push_str(&format!(
        "- `{ROUTABLE_GAUGE}` summed to {} after the sync ({} expected).\n",
        measured.routable,
        routes * options.pods
    ));
    for note in &measured.notes {
        report.push_str(&format!("- NOTE {note}\n"));
    }
    let passed = applied.count() == changed.made() as f64
        && changed.churn_failed == 0
        && measured.routable == (routes * options.pods) as f64;
    (report, passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_named_and_addressed_by_index() {
        let yaml = route_yaml(3, 2);
        assert!(yaml.contains("name: r3\n"), "{yaml}");
        assert!(yaml.contains("hosts: [\"r3.example.com\"]"), "{yaml}");
        // Route 3 of 2 pods each: pods 6 and 7.
        assert!(yaml.contains("\"10.200.0.6\""), "{yaml}");
        assert!(yaml.contains("\"10.200.0.7\""), "{yaml}");
        assert!(!yaml.contains("\"10.200.0.8\""), "{yaml}");
    }
}
