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
/// Every route's ready pods, as the shell exports them.
const ROUTABLE_GAUGE: &str = "kactivator_revision_routable_pods";

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

/// The run's figures.
struct Measured {
    sync: Duration,
    /// kactivator's CPU time from start to `/readyz` 200.
    sync_cpu: Duration,
    rss_synced_kib: u64,
    /// After the first `/metrics` scrape, which renders every route's series.
    rss_scraped_kib: u64,
    rss_end_kib: u64,
    /// Size and time of that scrape.
    scrape_bytes: usize,
    scrape: Duration,
    /// The routable-pods gauges' sum once it settled (or at the timeout).
    routable: f64,
    /// kactivator's CPU over [`Options::idle`] with nothing changing.
    idle_cpu: Duration,
    /// The measured changes and the churn.
    changed: Changed,
    /// The histogram's observations since just before the first change, once every change
    /// was counted (or the settle timeout).
    applied: Buckets,
    /// kactivator's CPU from just before the first change until every change was counted
    /// (at least [`SETTLE_PAUSE`] after the last), and that window's length.
    window_cpu: Duration,
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
    let sync_cpu = activator.cpu_time()?;
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
        let metrics = activator.metrics()?;
        let scrape = scrape_started.elapsed();
        if first_scrape.is_none() {
            first_scrape = Some((metrics.len(), scrape, activator.memory_kib()?.rss));
        }
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
    let (scrape_bytes, scrape, rss_scraped_kib) = first_scrape.expect("the loop scrapes");
    eprintln!(
        "[keda-scale] RSS {} MiB, {} MiB after one /metrics scrape ({:.1} MB in {})",
        rss_synced_kib / 1024,
        rss_scraped_kib / 1024,
        scrape_bytes as f64 / 1e6,
        fmt_us(scrape.as_micros() as u64)
    );

    // What the process burns with nothing to do (timers, the scaler's counting task), to set
    // against the change window's CPU.
    let idle_before = activator.cpu_time()?;
    std::thread::sleep(options.idle);
    let idle_cpu = activator.cpu_time()?.saturating_sub(idle_before);

    // The measured changes go to one half of the routes, the churn to the other, so the two
    // never patch the same slice. Addresses for changes follow the ones the objects have.
    let measured: Vec<usize> = creation.items.iter().copied().step_by(2).collect();
    let others: Vec<usize> = creation.items.iter().copied().skip(1).step_by(2).collect();
    let fresh = AtomicU64::new((options.routes * options.pods) as u64);
    let before = Buckets::parse(&activator.metrics()?, APPLY_HISTOGRAM)?;
    eprintln!(
        "[keda-scale] idle CPU {} ms over {} s; {} changes at {} ms gaps, churn {}/s",
        idle_cpu.as_millis(),
        options.idle.as_secs(),
        options.changes,
        options.gap.as_millis(),
        options.churn_per_second
    );
    let cpu_before = activator.cpu_time()?;
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
    // when the control thread is still working through a backlog, at a later look a second
    // apart (each look a `/metrics` render, counted in the window).
    let made = changed.made();
    std::thread::sleep(SETTLE_PAUSE);
    let deadline = Instant::now() + kube::SETTLE_TIMEOUT;
    let mut extra_scrapes = 0;
    let (window_cpu, window, applied) = loop {
        let cpu = activator.cpu_time()?.saturating_sub(cpu_before);
        let window = window_started.elapsed();
        let counted = Buckets::parse(&activator.metrics()?, APPLY_HISTOGRAM)?.since(&before)?;
        if counted.count() >= made as f64 || Instant::now() > deadline {
            break (cpu, window, counted);
        }
        extra_scrapes += 1;
        std::thread::sleep(Duration::from_secs(1));
    };
    if extra_scrapes > 0 {
        notes.push(format!(
            "the events were applied {extra_scrapes} s after the first look ({:?} after the \
             last change): a backlog; the CPU window stayed open until then and holds \
             {extra_scrapes} `/metrics` renders of {:.1} MB",
            SETTLE_PAUSE,
            scrape_bytes as f64 / 1e6
        ));
    }
    if applied.count() != made as f64 {
        notes.push(format!(
            "the histogram counted {} events for {made} patches",
            applied.count()
        ));
    }
    if changed.churn_failed > 0 {
        notes.push(format!(
            "{} churn patches failed; the first: {}",
            changed.churn_failed,
            changed.churn_error.clone().unwrap_or_default()
        ));
    }
    let rss_end_kib = activator.memory_kib()?.rss;
    if let Some(trouble) = activator.stop() {
        notes.push(trouble);
    }
    Ok(Measured {
        sync,
        sync_cpu,
        rss_synced_kib,
        rss_scraped_kib,
        rss_end_kib,
        scrape_bytes,
        scrape,
        routable,
        idle_cpu,
        changed,
        applied,
        window_cpu,
        window,
        notes,
    })
}

/// CPU per event: the whole window's, and net of what the process burns idle over as long.
fn cpu_per_event(measured: &Measured, idle: Duration) -> Option<(Duration, Duration)> {
    let events = measured.applied.count();
    if events <= 0.0 {
        return None;
    }
    let gross = measured.window_cpu.as_secs_f64();
    let idle_rate = measured.idle_cpu.as_secs_f64() / idle.as_secs_f64().max(1e-9);
    let net = (gross - idle_rate * measured.window.as_secs_f64()).max(0.0);
    Some((
        Duration::from_secs_f64(gross / events),
        Duration::from_secs_f64(net / events),
    ))
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
    let applied = &measured.applied;
    let cpu = cpu_per_event(measured, options.idle);
    let ms = |duration: Duration| format!("{:.3} ms", duration.as_secs_f64() * 1e3);
    let quantile = |q: f64| {
        format!(
            "{} (≈ {})",
            describe_bucket(applied.quantile_bucket(q)),
            applied.quantile(q).describe()
        )
    };
    report.push_str(
        "| routes | pods | create | start → /readyz 200 | its CPU | RSS 2 s after | after one \
         /metrics | at end | events | apply p50 | apply p99 | ≤ 1 ms | mean | **CPU per event** \
         | net of idle | net per route |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    report.push_str(&format!(
        "| {routes} | {} | {:.1} s | {:.2} s | {:.2} s | {} | {} | {} | {} | {} | {} | {} | {} | \
         **{}** | {} | {} |\n",
        options.pods,
        creation.elapsed.as_secs_f64(),
        measured.sync.as_secs_f64(),
        measured.sync_cpu.as_secs_f64(),
        mib(measured.rss_synced_kib),
        mib(measured.rss_scraped_kib),
        mib(measured.rss_end_kib),
        applied.count(),
        quantile(0.5),
        quantile(0.99),
        applied
            .share_within(0.001)
            .map_or("–".into(), |share| format!("{:.1} %", share * 100.0)),
        applied.describe_mean(),
        cpu.map_or("–".into(), |(gross, _)| ms(gross)),
        cpu.map_or("–".into(), |(_, net)| ms(net)),
        cpu.map_or("–".into(), |(_, net)| format!(
            "{:.0} ns",
            net.as_secs_f64() * 1e9 / routes as f64
        )),
    ));
    report.push_str(&format!(
        "\nRSS is `VmRSS` {} s after `/readyz` answered 200, again after the first `/metrics` \
         scrape ({:.1} MB in {}; every route's series), and at the end. \"its CPU\" is \
         kactivator's user + system time up to `/readyz` 200.\n",
        AFTER_READY.as_secs(),
        measured.scrape_bytes as f64 / 1e6,
        fmt_us(measured.scrape.as_micros() as u64),
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
    let changed = &measured.changed;
    report.push_str(&format!(
        "\nCPU per event: kactivator's user + system time (`/proc/<pid>/stat`), all threads, \
         from just before the first change until the histogram had counted every change, at \
         least {} s after the last ({:.1} s, {} ms of CPU), divided by the {} events it \
         counted. \"net of idle\" first takes off what the process used over as long with \
         nothing changing ({} ms in a {} s window before the changes); \"net per route\" \
         divides that by the {routes} routes: the cost of a model that recomputes every route \
         on every event, if it is linear. While the CPU per event is above the pace of the \
         events (one every {:.1} ms here), the control thread falls behind: an event then \
         waits in its watch stream, and that wait is not in the histogram, which starts when \
         the source takes the event.\n",
        SETTLE_PAUSE.as_secs(),
        measured.window.as_secs_f64(),
        measured.window_cpu.as_millis(),
        measured.applied.count(),
        measured.idle_cpu.as_millis(),
        options.idle.as_secs(),
        measured.changed.seconds * 1e3 / measured.changed.made().max(1) as f64,
    ));
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
