//! Memory per queued request: a revision with no pods, so every request waits; N client
//! connections, each with one complete request sent; kactivator's resident memory before and
//! with all N queued (`VmRSS` from `/proc/<pid>/status`, once `kactivator_revision_queued`
//! says N).
//!
//! The connections are opened in stages (N/S, 2N/S, …, N) and memory is sampled at each, so the
//! report shows both the average cost ((RSS(N) − RSS(idle)) ÷ N) and the marginal one (the
//! slope between the first and last stage, which leaves out one-time costs such as the first
//! growth of a queue or an allocator arena), and whether the growth is linear.
//!
//! Practicalities: one process needs a file descriptor per connection, so both this process and
//! kactivator raise their soft `RLIMIT_NOFILE` to the hard limit; when the hard limit is below N
//! the scenario measures as many as it can and labels the N figure an extrapolation. One source
//! address has ~28 000 ephemeral ports towards one destination, so the connections are bound to
//! sources 127.0.0.2, 127.0.0.3, ... (`--per-source` connections each).

use std::io::{ErrorKind, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::activator::{raise_nofile_soft_limit, revision, Activator, Launch, Memory};
use crate::client::get_request;
use crate::ScratchDir;

const REVISION: &str = "queued";
/// Descriptors kept free for everything but client connections (listeners, rings, eventfds,
/// admin connections, stdio) in each process.
const FD_RESERVE: u64 = 200;
/// Longest wait for a connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct Options {
    /// Requests to queue (the target; may be capped by the descriptor limit).
    pub count: u64,
    pub stages: u64,
    pub per_source: u64,
    pub drivers: Vec<String>,
    pub shards: Option<usize>,
    /// Extra `[proxy]` keys (e.g. a process-wide queue cap).
    pub proxy: String,
    /// The revision's `queue_depth`; default: the count plus 1000.
    pub queue_depth: Option<u64>,
    /// Time for the queue metric to reach a stage's count.
    pub stage_timeout: Duration,
    /// Pause between reaching a count and sampling memory.
    pub settle: Duration,
    /// KEDA's HTTP add-on role: `kactivator keda-http` against a real API server, the
    /// requests held for an HTTPScaledObject whose Service has no ready endpoint.
    pub keda: bool,
}

/// The host the KEDA role's held requests are for.
const KEDA_HOST: &str = "queued.example.com";

/// An API server with the add-on's CRD, a Service with an empty EndpointSlice, and an
/// HTTPScaledObject [`REVISION`] routing [`KEDA_HOST`] to it.
fn keda_cluster() -> Result<kactivator_testkit::apiserver::ApiServer, String> {
    crate::kube::guarded("a kube-apiserver with an HTTPScaledObject", || {
        let api = kactivator_testkit::apiserver::ApiServer::start();
        api.install_keda_http_crds();
        api.apply_yaml(&crate::kube::keda_route_yaml(
            REVISION,
            KEDA_HOST,
            &[],
            8080,
            "    kactivator.dev/container-concurrency: \"1\"",
        ));
        api
    })
}

/// One memory sample.
#[derive(Clone, Copy, Debug)]
struct Sample {
    queued: u64,
    memory: Memory,
}

/// What one driver measured.
struct DriverResult {
    driver: String,
    pid: u32,
    idle: Memory,
    stages: Vec<Sample>,
    released: Option<Memory>,
    /// Why the run stopped short of its last stage, if it did.
    stopped: Option<String>,
}

/// Runs the scenario; returns the markdown report and whether every driver reached its count.
pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    let scratch = ScratchDir::new("queued-memory")?;
    let limit = raise_nofile_soft_limit().map_err(|e| format!("raising RLIMIT_NOFILE: {e}"))?;
    let possible = limit.saturating_sub(FD_RESERVE);
    let count = if options.count <= possible {
        options.count
    } else {
        // Whole thousands, so the stages are round numbers.
        (possible / 1000) * 1000
    };
    if count == 0 {
        return Err(format!(
            "RLIMIT_NOFILE hard limit {limit} leaves no room for client connections"
        ));
    }
    let capped_by_fds = count < options.count;
    if capped_by_fds {
        eprintln!(
            "[queued-memory] WARNING: the hard RLIMIT_NOFILE is {limit} (`ulimit -Hn`; raising it \
             needs CAP_SYS_RESOURCE), so one process cannot hold {} connections: measuring {count} \
             and EXTRAPOLATING to {}",
            options.count, options.count
        );
    }

    let mut results = Vec::new();
    for driver in &options.drivers {
        results.push(run_driver(binary, options, driver, count, scratch.path())?);
    }
    Ok(report(options, count, limit, capped_by_fds, &results))
}

fn run_driver(
    binary: &Path,
    options: &Options,
    driver: &str,
    count: u64,
    dir: &Path,
) -> Result<DriverResult, String> {
    let revisions = revision(
        REVISION,
        &[],
        &format!(
            "container_concurrency = 1\nqueue_depth = {}\ntimeout_seconds = 86400",
            options.queue_depth.unwrap_or(count + 1000)
        ),
    );
    // The KEDA role's cluster lives as long as this driver's run.
    let cluster = if options.keda {
        Some(keda_cluster()?)
    } else {
        None
    };
    let kubeconfig = cluster
        .as_ref()
        .map(|api| api.admin_kubeconfig().display().to_string())
        .unwrap_or_default();
    let scaler_port = kactivator_testkit::ports::free_port().to_string();
    let metrics_port = kactivator_testkit::ports::free_port().to_string();
    let keda_env = [
        ("KUBECONFIG", kubeconfig.as_str()),
        ("KEDA_HTTP_SCALER_PORT", scaler_port.as_str()),
        ("OTEL_PROM_EXPORTER_PORT", metrics_port.as_str()),
        // Held for the whole run, as the file's revision's requests are.
        ("KEDA_HTTP_RESPONSE_HEADER_TIMEOUT", "86400s"),
    ];
    let (args, env): (&[&str], &[(&str, &str)]) = if options.keda {
        (&["keda-http"], &keda_env)
    } else {
        (&[], &[])
    };
    let activator = Activator::start(&Launch {
        binary,
        driver,
        shards: options.shards,
        http_ip: "127.0.0.1",
        proxy: &options.proxy,
        features: "",
        tables: "",
        revisions: &revisions,
        dir,
        args,
        env,
    })
    .map_err(|e| format!("kactivator --driver {driver}: {e}"))?;
    let queued = || {
        activator
            .metric_sum(
                "kactivator_revision_queued",
                &[&format!("revision_name=\"{REVISION}\"")],
            )
            .map(|value| value as u64)
    };
    std::thread::sleep(options.settle);
    let idle = activator.memory_kib()?;
    eprintln!(
        "[queued-memory] {driver}: kactivator pid {} idle VmRSS {} KiB",
        activator.pid(),
        idle.rss
    );

    let request = if options.keda {
        format!("GET / HTTP/1.1\r\nHost: {KEDA_HOST}\r\n\r\n").into_bytes()
    } else {
        get_request("/", REVISION)
    };
    let mut conns: Vec<TcpStream> = Vec::with_capacity(count as usize);
    let mut sources = Sources::new(options.per_source);
    let mut stages = Vec::new();
    let mut stopped = None;
    for stage in 1..=options.stages {
        let target = count * stage / options.stages;
        let started = Instant::now();
        if let Err(e) = open_until(&mut conns, &mut sources, target, activator.http, &request) {
            stopped = Some(format!("opening connection {}: {e}", conns.len() + 1));
            break;
        }
        let opened = started.elapsed();
        match wait_queued(&queued, target, options.stage_timeout) {
            Ok(()) => {}
            Err(reached) => {
                stopped = Some(format!(
                    "the queue metric stayed at {reached} of {target} for {:?}; {}",
                    options.stage_timeout,
                    answered(&conns).unwrap_or_else(|| "no connection got a response".into())
                ));
                break;
            }
        }
        std::thread::sleep(options.settle);
        let memory = activator.memory_kib()?;
        let still = queued()?;
        if still != target {
            stopped = Some(format!(
                "{target} were queued but {still} are after settling; {}",
                answered(&conns).unwrap_or_else(|| "no connection got a response".into())
            ));
            break;
        }
        eprintln!(
            "[queued-memory] {driver}: {target} queued (connections opened in {:.1} s), VmRSS {} KiB, RssAnon {} KiB",
            opened.as_secs_f64(),
            memory.rss,
            memory.anon
        );
        stages.push(Sample {
            queued: target,
            memory,
        });
    }
    // Nothing may have been answered: every request must still be waiting.
    if stopped.is_none() {
        stopped = answered(&conns);
    }

    // Leaving frees every place at once; memory afterwards shows what is returned.
    drop(conns);
    let released = match wait_queued(&queued, 0, options.stage_timeout) {
        Ok(()) => {
            std::thread::sleep(options.settle);
            Some(activator.memory_kib()?)
        }
        Err(left) => {
            eprintln!("[queued-memory] {driver}: {left} still queued after the clients left");
            None
        }
    };
    let pid = activator.pid();
    if let Some(note) = activator.stop() {
        eprintln!("[queued-memory] {driver}: {note}");
    }
    Ok(DriverResult {
        driver: driver.to_string(),
        pid,
        idle,
        stages,
        released,
        stopped,
    })
}

/// Opens connections until there are `target`, each with its request fully written. Sources
/// rotate over 127.0.0.2, 127.0.0.3, ... every `per_source` connections, and move on early when
/// an address has no port left (EADDRNOTAVAIL, e.g. ports still in TIME_WAIT from another run).
fn open_until(
    conns: &mut Vec<TcpStream>,
    sources: &mut Sources,
    target: u64,
    server: SocketAddr,
    request: &[u8],
) -> std::io::Result<()> {
    while (conns.len() as u64) < target {
        let stream = loop {
            let source = sources.next()?;
            match connect_from(source, server) {
                Ok(stream) => break stream,
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => sources.exhausted()?,
                Err(e) => return Err(e),
            }
        };
        let mut stream = stream;
        stream.set_write_timeout(Some(CONNECT_TIMEOUT))?;
        stream.write_all(request)?;
        conns.push(stream);
    }
    Ok(())
}

fn connect_from(source: Ipv4Addr, server: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    bind_address_no_port(&socket)?;
    // Closing sends RST instead of FIN: no TIME_WAIT left behind to exhaust the next run's ports.
    socket.set_linger(Some(Duration::ZERO))?;
    socket.bind(&SocketAddr::V4(SocketAddrV4::new(source, 0)).into())?;
    socket.connect_timeout(&server.into(), CONNECT_TIMEOUT)?;
    Ok(socket.into())
}

/// Loopback source addresses 127.0.0.2 and up, `per_source` connections each.
struct Sources {
    per_source: u64,
    host: u32,
    used: u64,
}

impl Sources {
    fn new(per_source: u64) -> Sources {
        Sources {
            per_source: per_source.max(1),
            host: 2,
            used: 0,
        }
    }

    /// The address for the next connection.
    fn next(&mut self) -> std::io::Result<Ipv4Addr> {
        if self.used >= self.per_source {
            self.exhausted()?;
        }
        self.used += 1;
        Ok(Ipv4Addr::from(0x7f00_0000 | self.host))
    }

    /// Moves on to the next address.
    fn exhausted(&mut self) -> std::io::Result<()> {
        self.host += 1;
        self.used = 0;
        if self.host >= 0x00ff_ffff {
            return Err(std::io::Error::other(
                "ran out of 127.x.y.z source addresses",
            ));
        }
        Ok(())
    }
}

/// `IP_BIND_ADDRESS_NO_PORT`: `bind` only fixes the source address and `connect` picks the
/// port for the whole 4-tuple. Without it, `bind(addr, 0)` must find a port free for every
/// destination, which gets slow as the range fills and cannot reuse ports left in TIME_WAIT
/// by an earlier run.
fn bind_address_no_port(socket: &Socket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live local.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Polls the queue metric until it equals `target`; on timeout returns the last value.
fn wait_queued(
    queued: &impl Fn() -> Result<u64, String>,
    target: u64,
    timeout: Duration,
) -> Result<(), u64> {
    let deadline = Instant::now() + timeout;
    let mut last = 0;
    while Instant::now() < deadline {
        match queued() {
            Ok(value) if value == target => return Ok(()),
            Ok(value) => last = value,
            Err(e) => eprintln!("[queued-memory] {e}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Err(last)
}

/// Looks, without blocking, for connections that got a response (a queued request gets none):
/// a description naming how many and the first status line, or `None` when none did.
fn answered(conns: &[TcpStream]) -> Option<String> {
    let mut count = 0;
    let mut first = None;
    for stream in conns {
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        let mut buf = [0u8; 256];
        match stream.peek(&mut buf) {
            Ok(0) => {
                count += 1;
                first.get_or_insert_with(|| "connection closed by kactivator".to_string());
            }
            Ok(n) => {
                count += 1;
                first.get_or_insert_with(|| {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    let status = text.lines().next().unwrap_or("").to_string();
                    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
                    format!("{status} / {body}")
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => {
                count += 1;
                first.get_or_insert_with(|| format!("connection error: {e}"));
            }
        }
        let _ = stream.set_nonblocking(false);
    }
    first.map(|first| {
        format!(
            "{count} of {} connections got a response, e.g. {first:?}",
            conns.len()
        )
    })
}

fn per_request_bytes(from: Sample, to: Sample) -> f64 {
    (to.memory.rss as f64 - from.memory.rss as f64) * 1024.0 / (to.queued - from.queued) as f64
}

fn report(
    options: &Options,
    count: u64,
    limit: u64,
    capped_by_fds: bool,
    results: &[DriverResult],
) -> (String, bool) {
    let mut out = String::new();
    let mut passed = true;
    out.push_str(&format!(
        "\n## Memory per queued request: revision with no pods, {count} requests queued ({} stages), \
         one connection each, sources 127.0.0.2.. ({} per address)\n\n",
        options.stages, options.per_source
    ));
    if capped_by_fds {
        out.push_str(&format!(
            "**FALLBACK: {count} queued, not {}.** The hard RLIMIT_NOFILE here is {limit} and \
             cannot be raised (no CAP_SYS_RESOURCE), and kactivator needs one descriptor per \
             queued connection. The bytes-per-request figures are measured at {count}; the RSS \
             at {} is EXTRAPOLATED as idle + {} × marginal bytes per request.\n\n",
            options.count, options.count, options.count
        ));
    }
    out.push_str(
        "| driver | idle VmRSS | VmRSS with all queued | queued | bytes per queued request, (RSS(N) − idle) ÷ N | marginal, first → last stage | VmRSS after the clients left |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for result in results {
        let (Some(first), Some(last)) = (result.stages.first(), result.stages.last()) else {
            passed = false;
            out.push_str(&format!(
                "| {} | {} KiB | — | 0 | — | — | — |\n",
                result.driver, result.idle.rss
            ));
            continue;
        };
        let idle = Sample {
            queued: 0,
            memory: result.idle,
        };
        let average = per_request_bytes(idle, *last);
        let marginal = if result.stages.len() > 1 {
            format!("{:.0} B", per_request_bytes(*first, *last))
        } else {
            "—".to_string()
        };
        out.push_str(&format!(
            "| {} | {} KiB | {} KiB | {} | **{average:.0} B** ({:.2} KiB) | {marginal} | {} |\n",
            result.driver,
            result.idle.rss,
            last.memory.rss,
            last.queued,
            average / 1024.0,
            result
                .released
                .map_or("— (queue did not empty)".to_string(), |m| format!(
                    "{} KiB",
                    m.rss
                )),
        ));
        if result.stopped.is_some() || last.queued != count {
            passed = false;
        }
    }
    out.push_str(
        "\nStages (VmRSS / RssAnon in KiB; bytes per request over the previous stage):\n\n",
    );
    for result in results {
        let mut previous = Sample {
            queued: 0,
            memory: result.idle,
        };
        out.push_str(&format!(
            "- {} (pid {}): idle {} / {}",
            result.driver, result.pid, result.idle.rss, result.idle.anon
        ));
        for sample in &result.stages {
            out.push_str(&format!(
                "; {} queued: {} / {} (+{:.0} B each)",
                sample.queued,
                sample.memory.rss,
                sample.memory.anon,
                per_request_bytes(previous, *sample)
            ));
            previous = *sample;
        }
        out.push('\n');
        if let Some(why) = &result.stopped {
            out.push_str(&format!("  - STOPPED SHORT: {why}\n"));
        }
        if let (Some(first), Some(last)) = (result.stages.first(), result.stages.last()) {
            if last.queued < options.count {
                let slope = if result.stages.len() > 1 {
                    per_request_bytes(*first, *last)
                } else {
                    per_request_bytes(
                        Sample {
                            queued: 0,
                            memory: result.idle,
                        },
                        *last,
                    )
                };
                let extrapolated = result.idle.rss as f64 + slope * options.count as f64 / 1024.0;
                out.push_str(&format!(
                    "  - EXTRAPOLATED VmRSS with {} queued: {:.0} MiB (idle + {} × {slope:.0} B)\n",
                    options.count,
                    extrapolated / 1024.0,
                    options.count
                ));
            }
        }
    }
    (out, passed)
}
