//! Pods at scale (issue 16): REVISIONS × PODS pods from the file, each pod at its own loopback
//! address, one listener answering every probe as a queue-proxy does. For each size, with
//! quarantine on and off: load time (start → `/readyz`), RSS, kactivator's CPU while idle (no
//! requests), the probes it sent meanwhile, queue-proxy registration → queued request forwarded
//! (p50/p99), and, quarantine on, new pod → its first probe.
//!
//! The configuration is written at run time into the scenario's scratch directory and removed
//! with it; nothing generated is kept.

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::activator::{Activator, Launch};
use crate::first_forward::{read_status, spawn_pod, time_ready_to_forward};
use crate::{fmt_us, percentile, ScratchDir};

/// Targets of issue 16 at 5 000 × 10, quarantine on.
const TARGET_IDLE_CPU_PERCENT: f64 = 1.0;
const TARGET_RSS_MIB: f64 = 150.0;
const TARGET_P99: Duration = Duration::from_millis(2);
/// Longest wait for any one step.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// New pods registered at once for the first-probe measurement.
const NEW_PODS: u32 = 20;

pub struct Options {
    /// Sizes, in revisions.
    pub revisions: Vec<usize>,
    pub pods: usize,
    pub repetitions: usize,
    /// Idle CPU window.
    pub idle: Duration,
    /// From `/readyz` to the idle window, quarantine on (first probes and the first settled
    /// ones done).
    pub settle: Duration,
    pub drivers: Vec<String>,
    pub shards: Option<usize>,
}

/// The listener every pod's address reaches: 0.0.0.0:port, answering `K-Network-Probe: queue`
/// with `queue` on kept connections, counting probes and the first probe of watched addresses.
struct QueueProxies {
    port: u16,
    probes: Arc<AtomicU64>,
    first_probe: Arc<Mutex<HashMap<IpAddr, Option<Instant>>>>,
}

fn spawn_queue_proxies() -> Result<QueueProxies, String> {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let probes = Arc::new(AtomicU64::new(0));
    let first_probe: Arc<Mutex<HashMap<IpAddr, Option<Instant>>>> = Arc::default();
    let (counter, firsts) = (probes.clone(), first_probe.clone());
    std::thread::Builder::new()
        .name("queue-proxies".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        // Out of descriptors, most likely: let connections close first.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let (counter, firsts) = (counter.clone(), firsts.clone());
                    tokio::spawn(answer_probes(stream, counter, firsts));
                }
            });
        })
        .map_err(|e| e.to_string())?;
    Ok(QueueProxies {
        port,
        probes,
        first_probe,
    })
}

async fn answer_probes(
    mut stream: tokio::net::TcpStream,
    counter: Arc<AtomicU64>,
    firsts: Arc<Mutex<HashMap<IpAddr, Option<Instant>>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.set_nodelay(true);
    let pod = stream.local_addr().map(|addr| addr.ip()).ok();
    let mut buf = Vec::with_capacity(1024);
    loop {
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 2048];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let close = String::from_utf8_lossy(&buf[..end])
            .to_ascii_lowercase()
            .contains("connection: close");
        buf.drain(..end);
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(pod) = pod {
            // Watched pods (entered as None) keep the time of their first probe.
            if let Some(first @ None) = firsts.lock().unwrap().get_mut(&pod) {
                *first = Some(Instant::now());
            }
        }
        let answer: &[u8] = if close {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nqueue"
        } else {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nqueue"
        };
        if stream.write_all(answer).await.is_err() || close {
            return;
        }
    }
}

/// Pod `index`'s address: 127.1.0.0 + index (never 127.0.0.x, which the other pods use).
fn pod_ip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x7f01_0000u32 + index as u32))
}

/// The `[[revisions]]` tables: REVISIONS × PODS pods at `port`, plus `zero` (the registration
/// target, no pods) and `fresh` (new pods arrive by registration).
fn revisions(options_pods: usize, revisions: usize, port: u16, zero_port: u16) -> String {
    let mut text = String::with_capacity(revisions * (60 + options_pods * 24));
    for revision in 0..revisions {
        text.push_str(&format!(
            "[[revisions]]\nnamespace = \"default\"\nname = \"r{revision:05}\"\nserving_port = {port}\npods = ["
        ));
        for pod in 0..options_pods {
            let ip = pod_ip(revision * options_pods + pod);
            text.push_str(&format!("\"{ip}:{port}\","));
        }
        text.push_str("]\n\n");
    }
    text.push_str(&format!(
        "[[revisions]]\nnamespace = \"default\"\nname = \"zero\"\ncontainer_concurrency = 1\nserving_port = {zero_port}\ntimeout_seconds = 30\npods = []\n\n\
         [[revisions]]\nnamespace = \"default\"\nname = \"fresh\"\nserving_port = {port}\npods = []\n\n"
    ));
    text
}

struct Row {
    revisions: usize,
    quarantine: bool,
    load: Duration,
    idle_cpu_percent: f64,
    probes_per_second: f64,
    rss_mib: f64,
    p50: u64,
    p99: u64,
    first_probe_slowest: Option<Duration>,
}

fn measure(
    binary: &Path,
    driver: &str,
    revision_count: usize,
    quarantine: bool,
    options: &Options,
    proxies: &QueueProxies,
) -> Result<Row, String> {
    let dir = ScratchDir::new(&format!("pod-scale-{driver}-{revision_count}-{quarantine}"))?;
    let zero_ip = IpAddr::from([127, 0, 0, 2]);
    let zero_pod = spawn_pod(zero_ip).map_err(|e| format!("starting the pod: {e}"))?;
    let revisions = revisions(
        options.pods,
        revision_count,
        proxies.port,
        zero_pod.addr.port(),
    );
    let features = format!(
        "\"activator.pod-quarantine\" = \"{}\"",
        if quarantine { "enabled" } else { "disabled" }
    );
    let started = Instant::now();
    let mut activator = Activator::spawn(&Launch {
        binary,
        driver,
        shards: options.shards,
        http_ip: "127.0.0.1",
        proxy: "",
        features: &features,
        tables: "",
        revisions: &revisions,
        dir: dir.path(),
        args: &[],
        env: &[],
    })?;
    activator.wait_ready(Duration::from_secs(120))?;
    let load = started.elapsed();
    eprintln!(
        "[pod-scale] {driver} {revision_count} × {} quarantine {quarantine}: ready in {load:?}",
        options.pods
    );
    std::thread::sleep(if quarantine {
        options.settle
    } else {
        Duration::from_secs(5).min(options.settle)
    });

    // Idle: no requests.
    let cpu_before = activator.cpu_time()?;
    let probes_before = proxies.probes.load(Ordering::Relaxed);
    let idle_start = Instant::now();
    std::thread::sleep(options.idle);
    let cpu = activator.cpu_time()?.saturating_sub(cpu_before);
    let window = idle_start.elapsed();
    let probes = proxies.probes.load(Ordering::Relaxed) - probes_before;
    let rss_mib = activator.memory_kib()?.rss as f64 / 1024.0;

    // Registration → forwarded.
    let mut delays = Vec::with_capacity(options.repetitions);
    for repetition in 0..options.repetitions {
        let delay =
            time_ready_to_forward(&activator, &zero_pod, zero_ip, "zero", STEP_TIMEOUT, |_| {
                // Queued within microseconds; no /metrics scrape (several MB at this size) in between.
                std::thread::sleep(Duration::from_millis(20));
                Ok(())
            })
            .map_err(|e| format!("repetition {repetition}: {e}"))?;
        delays.push(delay);
    }
    delays.sort_unstable();

    // New pods → first probe.
    let first_probe_slowest = if quarantine {
        let base = revision_count * options.pods + 1000;
        let ips: Vec<IpAddr> = (0..NEW_PODS as usize).map(|i| pod_ip(base + i)).collect();
        {
            let mut firsts = proxies.first_probe.lock().unwrap();
            for ip in &ips {
                firsts.insert(*ip, None);
            }
        }
        let registered = Instant::now();
        let http = activator.http;
        let senders: Vec<_> = ips
            .iter()
            .map(|&ip| std::thread::spawn(move || register_fresh(http, ip)))
            .collect();
        for sender in senders {
            sender
                .join()
                .map_err(|_| "a registration thread panicked")??;
        }
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let firsts = proxies.first_probe.lock().unwrap();
            let probed: Vec<Instant> = ips
                .iter()
                .filter_map(|ip| firsts.get(ip).copied().flatten())
                .collect();
            if probed.len() == ips.len() {
                break probed
                    .iter()
                    .map(|at| at.saturating_duration_since(registered))
                    .max();
            }
            drop(firsts);
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    } else {
        None
    };
    if let Some(trouble) = activator.stop() {
        eprintln!("[pod-scale] {trouble}");
    }
    Ok(Row {
        revisions: revision_count,
        quarantine,
        load,
        idle_cpu_percent: cpu.as_secs_f64() * 100.0 / window.as_secs_f64(),
        probes_per_second: probes as f64 / window.as_secs_f64(),
        rss_mib,
        p50: percentile(&delays, 50.0),
        p99: percentile(&delays, 99.0),
        first_probe_slowest,
    })
}

fn register_fresh(http: SocketAddr, ip: IpAddr) -> Result<(), String> {
    let body = format!(
        "{{\"pod_name\":\"fresh-{ip}\",\"pod_ip\":\"{ip}\",\"namespace\":\"default\",\"revision\":\"fresh\",\"event_type\":\"ready\"}}"
    );
    let request = format!(
        "POST /api/v1/pod-registration HTTP/1.1\r\nHost: activator\r\nUser-Agent: knative-queue-proxy\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect_timeout(&http, STEP_TIMEOUT).map_err(|e| e.to_string())?;
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    match read_status(stream) {
        Ok(200) => Ok(()),
        other => Err(format!("registration of {ip}: {other:?}")),
    }
}

pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    let proxies = spawn_queue_proxies()?;
    let mut report = format!(
        "### Pods at scale\n\n\
         REVISIONS × {} pods from the file, each pod at its own loopback address, one listener \
         answering every probe (keep-alive, as a queue-proxy). Idle: {:?} without requests, \
         starting {:?} after `/readyz` with quarantine on (5 s off). Registration → forwarded: \
         {} repetitions, from a queue-proxy's `ready` to the pod reading the request queued for \
         it. New pods: {NEW_PODS} register at once; the slowest one's time to its first probe.\n\n\
         | driver | revisions × pods | quarantine | load | idle CPU | probes/s | RSS | reg → fwd p50 / p99 | new pod → first probe |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        options.pods,
        options.idle,
        options.settle,
        options.repetitions
    );
    let mut passed = true;
    for driver in &options.drivers {
        for &revision_count in &options.revisions {
            for quarantine in [true, false] {
                let row = measure(
                    binary,
                    driver,
                    revision_count,
                    quarantine,
                    options,
                    &proxies,
                )?;
                if row.quarantine && row.revisions * options.pods >= 50_000 {
                    passed &= row.idle_cpu_percent <= TARGET_IDLE_CPU_PERCENT
                        && row.rss_mib <= TARGET_RSS_MIB
                        && row.p99 <= TARGET_P99.as_micros() as u64;
                }
                report.push_str(&format!(
                    "| {driver} | {} × {} | {} | {:.2} s | {:.2} % | {:.0} | {:.1} MiB | {} / {} | {} |\n",
                    row.revisions,
                    options.pods,
                    if row.quarantine { "on" } else { "off" },
                    row.load.as_secs_f64(),
                    row.idle_cpu_percent,
                    row.probes_per_second,
                    row.rss_mib,
                    fmt_us(row.p50),
                    fmt_us(row.p99),
                    match (row.quarantine, row.first_probe_slowest) {
                        (false, _) => "–".to_string(),
                        (true, Some(slowest)) => format!("{} ms", slowest.as_millis()),
                        (true, None) => format!("not all within {STEP_TIMEOUT:?}"),
                    }
                ));
            }
        }
    }
    report.push_str(&format!(
        "\nTargets at 5 000 × 10 with quarantine on: idle CPU ≤ {TARGET_IDLE_CPU_PERCENT} % of a core, \
         RSS ≤ {TARGET_RSS_MIB} MiB, registration → forwarded p99 ≤ {} ms.\n",
        TARGET_P99.as_millis()
    ));
    Ok((report, passed))
}
