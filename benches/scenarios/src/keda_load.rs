//! keda-load: KEDA's HTTP add-on role under load (issue 40's "requests per second and CPU per
//! request at 1 and 64 clients"). One backend on a pod network (testkit's `PodNet`: an
//! EndpointSlice takes no loopback address), a real kube-apiserver holding its Service, its
//! EndpointSlice and an HTTPScaledObject, and three rows in the same run, each at every client
//! count, in alternating order from round to round:
//!
//! * **direct**: the clients to the backend itself, the ceiling;
//! * **activator**: `kactivator` (the activator role) with a revision of that one pod from its
//!   file, the role whose figures BENCHMARKS.md already has;
//! * **keda-http**: `kactivator keda-http` routing the HTTPScaledObject's host to the pod.
//!
//! Each client is one keep-alive connection, one request at a time, no think time; CPU per
//! request is the kactivator process's own (user + system, `/proc/<pid>/stat`) over the
//! measured window, divided by the requests the clients completed in it.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactivator_testkit::apiserver::ApiServer;
use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};
use kactivator_testkit::podnet::PodNet;
use kactivator_testkit::ports::free_port;

use crate::activator::{revision, Activator, Launch};
use crate::client::{get_request, Conn};
use crate::ScratchDir;

/// The pod's port, the Service's target port.
const POD_PORT: u16 = 8080;
const ROUTE: &str = "app";
const HOST: &str = "app.example.com";

#[derive(Clone, Debug)]
pub struct Options {
    /// Client counts, each a row per path.
    pub clients: Vec<usize>,
    pub warmup: Duration,
    pub duration: Duration,
    pub rounds: usize,
    pub driver: String,
    pub shards: Option<usize>,
}

/// One measured window.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    requests: u64,
    failed: u64,
    seconds: f64,
    /// The kactivator process's CPU time in the window; `None` for the direct path.
    cpu: Option<Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Path3 {
    Direct,
    Activator,
    Keda,
}

impl Path3 {
    fn label(self) -> &'static str {
        match self {
            Path3::Direct => "direct (backend alone)",
            Path3::Activator => "activator role",
            Path3::Keda => "keda-http role",
        }
    }
}

pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    let scratch = ScratchDir::new("keda-load")?;
    let net = PodNet::new();
    let ip = net.add_address();
    let pod_addr = SocketAddr::new(ip, POD_PORT);
    let pod: BackendHandle = net
        .inside(|| backend::spawn_on(pod_addr, BackendConfig::named("pod")))
        .map_err(|e| format!("the pod's backend at {pod_addr}: {e}"))?;
    let api = crate::kube::guarded("a kube-apiserver with an HTTPScaledObject", || cluster(ip))?;
    let kubeconfig = api.admin_kubeconfig().display().to_string();
    let scaler_port = free_port().to_string();
    let metrics_port = free_port().to_string();
    let keda_env = [
        ("KUBECONFIG", kubeconfig.as_str()),
        ("KEDA_HTTP_SCALER_PORT", scaler_port.as_str()),
        ("OTEL_PROM_EXPORTER_PORT", metrics_port.as_str()),
        ("KACTIVATOR_LOG", "warn"),
    ];
    let launch =
        |args: &'static [&'static str], env: &[(&str, &str)], revisions: &str, tag: &str| {
            let dir = scratch.path().join(tag);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Activator::start(&Launch {
                binary,
                driver: &options.driver,
                shards: options.shards,
                http_ip: "127.0.0.1",
                proxy: "",
                features: "\"activator.pod-quarantine\" = \"disabled\"",
                tables: "",
                revisions,
                dir: &dir,
                args,
                env,
            })
        };
    let activator = launch(&[], &[], &revision(ROUTE, &[pod_addr], ""), "activator")
        .map_err(|e| format!("kactivator (activator role): {e}"))?;
    let keda_role = launch(&["keda-http"], &keda_env, "", "keda")
        .map_err(|e| format!("kactivator keda-http: {e}"))?;
    // The route is published once its watches have listed; wait for a 200 through it.
    wait_routed(keda_role.http)?;

    let direct_request = b"GET / HTTP/1.1\r\nHost: pod\r\n\r\n".to_vec();
    let activator_request = get_request("/", ROUTE);
    let keda_request = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n").into_bytes();
    let mut results: Vec<(usize, Path3, Window)> = Vec::new();
    let mut passed = true;
    for round in 0..options.rounds {
        let mut order = vec![Path3::Direct, Path3::Activator, Path3::Keda];
        if round % 2 == 1 {
            order.reverse();
        }
        for &clients in &options.clients {
            for &path in &order {
                let (addr, request, process) = match path {
                    Path3::Direct => (pod_addr, &direct_request, None),
                    Path3::Activator => (activator.http, &activator_request, Some(&activator)),
                    Path3::Keda => (keda_role.http, &keda_request, Some(&keda_role)),
                };
                let window = measure(addr, request, clients, options, process)?;
                eprintln!(
                    "[keda-load] round {} {} clients {}: {:.0} req/s, {} failed",
                    round + 1,
                    path.label(),
                    clients,
                    window.requests as f64 / window.seconds,
                    window.failed
                );
                passed &= window.failed == 0;
                results.push((clients, path, window));
            }
        }
    }
    let served = pod.stats().requests;
    drop(keda_role);
    drop(activator);
    drop(api);
    Ok((report(options, &results, served), passed))
}

/// The cluster: Service `app` (80 → the pod's port), its EndpointSlice listing the pod ready,
/// and the HTTPScaledObject routing [`HOST`] to it (no per-pod limit: the add-on's default).
fn cluster(ip: IpAddr) -> ApiServer {
    let api = ApiServer::start();
    api.install_keda_http_crds();
    api.apply_yaml(&crate::kube::keda_route_yaml(
        ROUTE,
        HOST,
        &[ip],
        POD_PORT,
        "",
    ));
    api
}

fn wait_routed(addr: SocketAddr) -> Result<(), String> {
    let request = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n").into_bytes();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = Conn::connect(addr, Duration::from_secs(5))
            .and_then(|mut conn| conn.roundtrip(&request))
            .map(|response| response.status);
        if matches!(status, Ok(200)) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("keda-http never routed {HOST}: last {status:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `clients` keep-alive connections sending `request` back to back: a warm-up, then the
/// measured window.
fn measure(
    addr: SocketAddr,
    request: &[u8],
    clients: usize,
    options: &Options,
    process: Option<&Activator>,
) -> Result<Window, String> {
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (measuring, stop, requests, failed) = (
            measuring.clone(),
            stop.clone(),
            requests.clone(),
            failed.clone(),
        );
        let request = request.to_vec();
        threads.push(std::thread::spawn(move || {
            let mut conn = None;
            while !stop.load(Ordering::Relaxed) {
                if conn.is_none() {
                    conn = Conn::connect(addr, Duration::from_secs(10)).ok();
                }
                let Some(open) = conn.as_mut() else {
                    if measuring.load(Ordering::Relaxed) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let ok = matches!(open.roundtrip(&request), Ok(response) if response.status == 200);
                if !ok {
                    conn = None;
                }
                if measuring.load(Ordering::Relaxed) {
                    if ok {
                        requests.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    std::thread::sleep(options.warmup);
    let cpu_before = process.map(Activator::cpu_time).transpose()?;
    let started = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    std::thread::sleep(options.duration);
    measuring.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = process.map(Activator::cpu_time).transpose()?;
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    Ok(Window {
        requests: requests.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        seconds,
        cpu: cpu_before
            .zip(cpu_after)
            .map(|(before, after)| after.saturating_sub(before)),
    })
}

fn report(options: &Options, results: &[(usize, Path3, Window)], served: u64) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## keda-load: {} rounds × {} s per row (warm-up {} s), driver {}, shards {}\n",
        options.rounds,
        options.duration.as_secs(),
        options.warmup.as_secs(),
        options.driver,
        options
            .shards
            .map_or_else(|| "default".to_owned(), |n| n.to_string())
    );
    out.push_str(
        "| clients | path | req/s (median of rounds) | ÷ direct | kactivator CPU µs per request (median) | failed |\n|---|---|---|---|---|---|\n",
    );
    let mut rows: BTreeMap<(usize, Path3), Vec<Window>> = BTreeMap::new();
    for (clients, path, window) in results {
        rows.entry((*clients, *path)).or_default().push(*window);
    }
    let median = |mut values: Vec<f64>| -> f64 {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(0.0)
    };
    for (&(clients, path), windows) in &rows {
        let rps = median(
            windows
                .iter()
                .map(|w| w.requests as f64 / w.seconds)
                .collect(),
        );
        let direct = rows
            .get(&(clients, Path3::Direct))
            .map(|windows| {
                median(
                    windows
                        .iter()
                        .map(|w| w.requests as f64 / w.seconds)
                        .collect(),
                )
            })
            .unwrap_or(0.0);
        let cpu = windows
            .iter()
            .filter_map(|w| {
                w.cpu
                    .map(|cpu| cpu.as_secs_f64() * 1e6 / w.requests.max(1) as f64)
            })
            .collect::<Vec<_>>();
        let failed: u64 = windows.iter().map(|w| w.failed).sum();
        let _ = writeln!(
            out,
            "| {clients} | {} | {rps:.0} | {:.2} | {} | {failed} |",
            path.label(),
            if direct > 0.0 { rps / direct } else { 0.0 },
            if cpu.is_empty() {
                "–".to_owned()
            } else {
                format!("{:.1}", median(cpu))
            }
        );
    }
    let _ = writeln!(out, "\nThe pod served {served} requests in all.");
    out
}
