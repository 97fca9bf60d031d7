//! chaos: a bounded soak (issue 13, item 6). kactivator (standalone, 2 shards by default) under
//! steady mixed load — keep-alive and connection-per-request clients, small and chunked bodies,
//! websockets, a revision that scales to zero and back — while pods (separate
//! `kactivator-testbackend` processes) are killed with SIGKILL and restarted on the same address,
//! queue-proxy registrations flip pods not-ready/ready, and the config file is rewritten (pods
//! list, feature gates). Every request's outcome is kept with its start and end time; at the end
//! each failure is checked against the kill log: the only acceptable failure is a 502 naming a
//! pod that was killed while the request was in flight (within its kill window).

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kactivator_testkit::ports::free_port;
use kactivator_testkit::queue_proxy::QueueProxyClient;
use kactivator_testkit::raw_http1;

use crate::activator::{Activator, Launch};
use crate::client::io_error;
use crate::ScratchDir;

/// How long after a kill a failure naming the killed pod still counts as "in flight on it".
const KILL_WINDOW: Duration = Duration::from_secs(2);
/// How long after a kill a stream or tunnel cut (no status to name the pod) counts as in flight.
const CUT_WINDOW: Duration = Duration::from_millis(200);
/// Client timeouts (connect, and each read/write).
const IO_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Options {
    pub duration: Duration,
    /// Chaos time before the RSS baseline is taken: the first rounds of every event fill the
    /// allocator's arenas, the pools and the connection slabs to their working size.
    pub warm_up: Duration,
    pub shards: Option<usize>,
    pub driver: String,
    pub testbackend: PathBuf,
    /// Pods of the main revision (`chaos`).
    pub pods: usize,
}

/// One pod: a `kactivator-testbackend` process that can be killed and started again.
struct Pod {
    addr: SocketAddr,
    name: String,
    child: Option<Child>,
}

impl Pod {
    /// Sends a queue-proxy event for this pod of `default/chaos`; the status is for the log.
    fn queue_proxy(&self, http: SocketAddr, event: &str) -> String {
        let qp = QueueProxyClient::new(http, "default", "chaos", self.name.clone(), self.addr.ip());
        let (status, _) = qp.send_blocking(event);
        format!("queue-proxy {event} for {}: {status}", self.addr)
    }

    fn start(&mut self, binary: &Path) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..50 {
            let mut command = Command::new(binary);
            command
                .arg("--listen")
                .arg(self.addr.to_string())
                .arg("--name")
                .arg(&self.name)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            {
                use std::os::unix::process::CommandExt;
                // SAFETY: only prctl, async-signal-safe, in the forked child.
                unsafe {
                    command.pre_exec(|| {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                            return Err(io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            }
            let mut child = command
                .spawn()
                .map_err(|e| format!("starting {}: {e}", binary.display()))?;
            let stdout = child.stdout.take().expect("piped");
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            if line.starts_with("listening on") {
                self.child = Some(child);
                return Ok(());
            }
            let status = child.wait().ok();
            last = format!("{status:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("pod {} would not start: {last}", self.addr))
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A finished request (or websocket session).
struct Record {
    kind: &'static str,
    start: Instant,
    end: Instant,
    /// `None` when it succeeded; else the failure class text.
    failure: Option<String>,
}

/// Chaos events, for classifying failures.
#[derive(Default)]
struct Log {
    /// (pod address, when it was killed)
    kills: Vec<(SocketAddr, Instant)>,
    events: Vec<(Instant, String)>,
}

struct Shared {
    stop: AtomicBool,
    records: Mutex<Vec<Record>>,
    sent: AtomicU64,
}

impl Shared {
    fn record(&self, kind: &'static str, start: Instant, failure: Option<String>) {
        self.records.lock().unwrap().push(Record {
            kind,
            start,
            end: Instant::now(),
            failure,
        });
    }
}

/// A response: status, whether the server will close, and the body.
struct Response {
    status: u16,
    close: bool,
    body: Vec<u8>,
}

/// Reads one response off `connection` with testkit's raw HTTP/1 client.
fn read_response(connection: &mut raw_http1::Connection) -> io::Result<Response> {
    let response = connection.read_response().map_err(io_error)?;
    Ok(Response {
        status: response.status,
        close: response.closes_connection(),
        body: response.body,
    })
}

fn connect(addr: SocketAddr) -> io::Result<raw_http1::Connection> {
    raw_http1::Connection::connect_with_timeout(addr, IO_TIMEOUT).map_err(io_error)
}

fn head(method: &str, path: &str, revision: &str, extra: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: chaos\r\nKnative-Serving-Namespace: default\r\n\
         Knative-Serving-Revision: {revision}\r\n{extra}\r\n"
    )
}

/// The class of a failure: status and first line of body, or the transport error.
fn failure_of(result: io::Result<Response>, expect: Option<&[u8]>, reused: bool) -> Option<String> {
    match result {
        Ok(response) if response.status == 200 => match expect {
            Some(expected) if response.body != expected => Some(format!(
                "200 with a wrong body ({} bytes, expected {})",
                response.body.len(),
                expected.len()
            )),
            _ => None,
        },
        Ok(response) => Some(format!(
            "{} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
        )),
        Err(error) => Some(format!(
            "transport: {}{}",
            error,
            if reused { " (reused connection)" } else { "" }
        )),
    }
}

#[derive(Clone, Copy)]
enum Load {
    /// keep-alive connection, small bodies (GET /delay/N, POST /echo)
    KeepAlive,
    /// a connection per request
    Fresh,
    /// chunked request body to /echo and chunked response from /chunked/N, keep-alive
    Streamed,
    /// the scale-to-zero revision, fresh connections
    Zero,
}

fn client(shared: Arc<Shared>, http: SocketAddr, load: Load, seed: u64) {
    let mut conn: Option<raw_http1::Connection> = None;
    let mut n = seed;
    let revision = if matches!(load, Load::Zero) {
        "zero"
    } else {
        "chaos"
    };
    while !shared.stop.load(Ordering::Relaxed) {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pick = (n >> 33) % 4;
        let small = format!("payload-{n:x}");
        let (kind, request, expect): (&'static str, Vec<u8>, Option<Vec<u8>>) = match load {
            Load::KeepAlive | Load::Fresh | Load::Zero => {
                let close = if matches!(load, Load::KeepAlive) {
                    ""
                } else {
                    "Connection: close\r\n"
                };
                let kind = match load {
                    Load::KeepAlive => "keep-alive",
                    Load::Fresh => "fresh connection",
                    _ => "scale-to-zero revision",
                };
                if pick < 2 {
                    let mut r = head(
                        "POST",
                        "/echo",
                        revision,
                        &format!("{close}Content-Length: {}\r\n", small.len()),
                    )
                    .into_bytes();
                    r.extend_from_slice(small.as_bytes());
                    (kind, r, Some(small.into_bytes()))
                } else {
                    let ms = 5 + (n >> 40) % 50;
                    (
                        kind,
                        head("GET", &format!("/delay/{ms}"), revision, close).into_bytes(),
                        Some(format!("slept {ms}\n").into_bytes()),
                    )
                }
            }
            Load::Streamed => {
                if pick < 2 {
                    // chunked request body, echoed back
                    let mut r = head("POST", "/echo", revision, "Transfer-Encoding: chunked\r\n")
                        .into_bytes();
                    let mut all = Vec::new();
                    for i in 0..8 {
                        let chunk = format!("{small}-{i}-").repeat(64);
                        r.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                        r.extend_from_slice(chunk.as_bytes());
                        r.extend_from_slice(b"\r\n");
                        all.extend_from_slice(chunk.as_bytes());
                    }
                    r.extend_from_slice(b"0\r\n\r\n");
                    ("streamed", r, Some(all))
                } else {
                    let len = 16 * 1024 + (n >> 40) % (256 * 1024);
                    (
                        "streamed",
                        head("GET", &format!("/chunked/{len}"), revision, "").into_bytes(),
                        None,
                    )
                }
            }
        };
        let start = Instant::now();
        shared.sent.fetch_add(1, Ordering::Relaxed);
        let reused = conn.is_some();
        let result = (|| {
            if conn.is_none() {
                conn = Some(connect(http)?);
            }
            let c = conn.as_mut().expect("connected");
            c.send(&request).map_err(io_error)?;
            read_response(c)
        })();
        let keep = matches!(load, Load::KeepAlive | Load::Streamed)
            && result.as_ref().is_ok_and(|r| !r.close);
        if !keep {
            conn = None;
        }
        let failure = failure_of(result, expect.as_deref(), reused);
        if failure.is_some() {
            conn = None;
        }
        shared.record(kind, start, failure);
    }
}

/// A websocket client: upgrade /ws, exchange messages, close, again.
fn websocket(shared: Arc<Shared>, http: SocketAddr) {
    let mut round = 0u64;
    while !shared.stop.load(Ordering::Relaxed) {
        round += 1;
        let start = Instant::now();
        shared.sent.fetch_add(1, Ordering::Relaxed);
        let result = ws_session(&shared, http, round);
        shared.record(
            "websocket session",
            start,
            result.err().map(|e| format!("websocket: {e}")),
        );
    }
}

fn ws_session(shared: &Shared, http: SocketAddr, round: u64) -> Result<(), String> {
    let mut conn = connect(http).map_err(|e| format!("transport: {e}"))?;
    let upgrade = head(
        "GET",
        "/ws",
        "chaos",
        "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    );
    conn.send(upgrade.as_bytes())
        .map_err(|e| format!("transport: {e}"))?;
    let response = read_response(&mut conn).map_err(|e| format!("transport: {e}"))?;
    if response.status != 101 {
        return Err(format!(
            "{} {}",
            response.status,
            String::from_utf8_lossy(&response.body).trim()
        ));
    }
    for i in 0..20 {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let message = format!("ws-{round}-{i}");
        let mask = [1u8, 2, 3, 4];
        let mut frame = vec![0x81, 0x80 | message.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(message.bytes().enumerate().map(|(j, b)| b ^ mask[j % 4]));
        conn.send(&frame)
            .map_err(|e| format!("transport mid-session: {e}"))?;
        let header = conn
            .read_exact_bytes(2)
            .map_err(|e| format!("transport mid-session: {e}"))?;
        let len = usize::from(header[1] & 0x7f);
        let payload = conn
            .read_exact_bytes(len)
            .map_err(|e| format!("transport mid-session: {e}"))?;
        if header[0] & 0x0f != 1 || payload != message.as_bytes() {
            return Err(format!("wrong echo frame (opcode {})", header[0] & 0x0f));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // close frame, masked, empty
    let _ = conn.send(&[0x88, 0x80, 0, 0, 0, 0]);
    Ok(())
}

/// The config file's `[features]` and `[[revisions]]`, rewritten in place (atomic rename).
struct ConfigFile {
    path: PathBuf,
    http: SocketAddr,
    admin: SocketAddr,
    port: u16,
}

impl ConfigFile {
    fn write(&self, quarantine: bool, authority: bool, chaos: &[SocketAddr], zero: &[SocketAddr]) {
        let gate = |on: bool| if on { "enabled" } else { "disabled" };
        let list = |pods: &[SocketAddr]| {
            pods.iter()
                .map(|p| format!("\"{p}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = format!(
            "[listen]\nhttp = \"{}\"\nhttp2 = \"127.0.0.1:0\"\nadmin = \"{}\"\n\n[proxy]\ndrain_grace_seconds = 0\n\n\
             [features]\n\"activator.pod-quarantine\" = \"{}\"\n\"queueproxy.pod-authority\" = \"{}\"\n\n\
             [control]\nwatch_interval_ms = 200\n\n\
             [[revisions]]\nnamespace = \"default\"\nname = \"chaos\"\nserving_port = {}\n\
             timeout_seconds = 60\npods = [{}]\n\n\
             [[revisions]]\nnamespace = \"default\"\nname = \"zero\"\nserving_port = {}\n\
             timeout_seconds = 60\npods = [{}]\n",
            self.http,
            self.admin,
            gate(quarantine),
            gate(authority),
            self.port,
            list(chaos),
            self.port,
            list(zero)
        );
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("writing the config");
        std::fs::rename(&tmp, &self.path).expect("renaming the config");
    }
}

pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    let scratch = ScratchDir::new("chaos")?;
    let port = free_port();
    let chaos_n = options.pods.max(2);
    let mut pods: Vec<Pod> = (0..chaos_n + 2)
        .map(|i| Pod {
            addr: SocketAddr::from(([127, 0, 0, 11 + i as u8], port)),
            name: format!("pod-{i}"),
            child: None,
        })
        .collect();
    for pod in &mut pods {
        pod.start(&options.testbackend)?;
    }
    let chaos_pods: Vec<SocketAddr> = pods[..chaos_n].iter().map(|p| p.addr).collect();
    let zero_pods: Vec<SocketAddr> = pods[chaos_n..].iter().map(|p| p.addr).collect();

    // The first config goes through Activator::spawn; the rewrites replace the whole file at
    // the same path with the same listen addresses.
    let revisions = format!(
        "[[revisions]]\nnamespace = \"default\"\nname = \"chaos\"\nserving_port = {port}\n\
         timeout_seconds = 60\npods = [{}]\n\n[[revisions]]\nnamespace = \"default\"\nname = \"zero\"\n\
         serving_port = {port}\ntimeout_seconds = 60\npods = [{}]\n",
        chaos_pods.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", "),
        zero_pods.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(", "),
    );
    let shards = options.shards.unwrap_or(2);
    let activator = Activator::start(&Launch {
        binary,
        driver: &options.driver,
        shards: Some(shards),
        http_ip: "127.0.0.1",
        proxy: "",
        features:
            "\"activator.pod-quarantine\" = \"enabled\"\n\"queueproxy.pod-authority\" = \"enabled\"",
        tables: "[control]\nwatch_interval_ms = 200",
        revisions: &revisions,
        dir: scratch.path(),
        args: &[],
        env: &[],
    })?;
    let config = ConfigFile {
        path: scratch
            .path()
            .join(format!("kactivator-{}.toml", options.driver)),
        http: activator.http,
        admin: activator.admin,
        port,
    };
    let http = activator.http;

    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        records: Mutex::new(Vec::new()),
        sent: AtomicU64::new(0),
    });
    let mut threads = Vec::new();
    let mut spawn_clients = |load: Load, count: u64, base: u64| {
        for i in 0..count {
            let shared = Arc::clone(&shared);
            threads.push(std::thread::spawn(move || {
                client(shared, http, load, base + i)
            }));
        }
    };
    spawn_clients(Load::KeepAlive, 8, 1);
    spawn_clients(Load::Fresh, 8, 100);
    spawn_clients(Load::Streamed, 4, 200);
    spawn_clients(Load::Zero, 2, 300);
    for _ in 0..3 {
        let shared = Arc::clone(&shared);
        threads.push(std::thread::spawn(move || websocket(shared, http)));
    }

    // Warm-up, then the start figure.
    std::thread::sleep(Duration::from_secs(5));
    let rss_load = activator.memory_kib()?.rss;
    eprintln!(
        "[chaos] load running, VmRSS {rss_load} KiB; chaos for {:?}, RSS baseline after {:?} of it",
        options.duration, options.warm_up
    );
    let begin = Instant::now();
    // VmRSS sampled after every chaos step: (seconds into the chaos, KiB).
    let mut rss_samples: Vec<(f64, u64)> = Vec::new();
    let mut log = Log::default();
    let event = |log: &mut Log, text: String| {
        eprintln!("[chaos {:>6.1}s] {text}", begin.elapsed().as_secs_f64());
        log.events.push((Instant::now(), text));
    };
    let mut step = 0u64;
    let mut quarantine = true;
    let mut authority = true;
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    while begin.elapsed() < options.duration {
        step += 1;
        let victim = (step as usize * 7) % chaos_n;
        match step % 5 {
            // a pod killed mid-load, restarted 2 s later on the same address
            1 | 3 => {
                pods[victim].kill();
                log.kills.push((pods[victim].addr, Instant::now()));
                event(&mut log, format!("killed {} (SIGKILL)", pods[victim].addr));
                *counts.entry("pod kills").or_default() += 1;
                std::thread::sleep(Duration::from_secs(2));
                pods[victim].start(&options.testbackend)?;
                event(&mut log, format!("restarted {}", pods[victim].addr));
                event(&mut log, pods[victim].queue_proxy(http, "ready"));
            }
            // queue-proxy: not-ready, then ready again
            2 => {
                event(&mut log, pods[victim].queue_proxy(http, "not-ready"));
                std::thread::sleep(Duration::from_secs(2));
                event(&mut log, pods[victim].queue_proxy(http, "ready"));
                *counts.entry("queue-proxy flips").or_default() += 1;
            }
            // config rewrite: a pod leaves the list, gates flip, then the pod comes back
            4 => {
                if step % 10 == 4 {
                    quarantine = !quarantine;
                } else {
                    authority = !authority;
                }
                let fewer: Vec<SocketAddr> = chaos_pods
                    .iter()
                    .copied()
                    .filter(|p| *p != chaos_pods[victim])
                    .collect();
                config.write(quarantine, authority, &fewer, &zero_pods);
                event(
                    &mut log,
                    format!(
                        "config: {} removed, pod-quarantine {quarantine}, pod-authority {authority}",
                        chaos_pods[victim]
                    ),
                );
                std::thread::sleep(Duration::from_secs(2));
                config.write(quarantine, authority, &chaos_pods, &zero_pods);
                event(&mut log, format!("config: {} back", chaos_pods[victim]));
                *counts.entry("config rewrites").or_default() += 2;
            }
            // scale-to-zero and back while requests wait
            _ => {
                config.write(quarantine, authority, &chaos_pods, &[]);
                event(
                    &mut log,
                    "config: revision zero scaled to zero (pods = [])".into(),
                );
                std::thread::sleep(Duration::from_secs(3));
                config.write(quarantine, authority, &chaos_pods, &zero_pods);
                event(&mut log, "config: revision zero back to its pods".into());
                *counts.entry("scale to zero and back").or_default() += 1;
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        let rss = activator.memory_kib()?.rss;
        let at = begin.elapsed().as_secs_f64();
        if rss_samples.last().is_none_or(|(last, _)| at - last >= 60.0) {
            eprintln!("[chaos {at:>6.1}s] VmRSS {rss} KiB");
        }
        rss_samples.push((at, rss));
    }
    // Let everything settle, then stop the load.
    std::thread::sleep(Duration::from_secs(3));
    let rss_end = activator.memory_kib()?.rss;
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let elapsed = begin.elapsed();
    let stop_note = activator.stop();

    // === classify ===
    let records = std::mem::take(&mut *shared.records.lock().unwrap());
    let sent = shared.sent.load(Ordering::Relaxed);
    let ok = records.iter().filter(|r| r.failure.is_none()).count();
    let mut classes: BTreeMap<String, (u64, u64, Vec<String>)> = BTreeMap::new();
    let mut all_in_flight = true;
    for r in records.iter() {
        let Some(failure) = &r.failure else { continue };
        // A 502 names the pod. A cut stream or websocket tunnel (head already sent) cannot:
        // it counts when it started before a kill and ended within CUT_WINDOW of it.
        let explained = log.kills.iter().find(|(addr, at)| {
            let named = failure.starts_with("502")
                && failure.contains(&addr.to_string())
                && r.end <= *at + KILL_WINDOW;
            let cut = (failure.contains("EOF inside") || failure.contains("mid-session"))
                && r.end <= *at + CUT_WINDOW;
            r.start <= *at && (named || cut)
        });
        let class = format!("{} — {}", r.kind, normalise(failure, &log));
        let entry = classes.entry(class).or_default();
        entry.0 += 1;
        if explained.is_some() {
            entry.1 += 1;
        } else {
            all_in_flight = false;
            if entry.2.len() < 3 {
                let t = |i: Instant| {
                    if i >= begin {
                        format!("+{:.3}s", (i - begin).as_secs_f64())
                    } else {
                        format!("-{:.3}s", (begin - i).as_secs_f64())
                    }
                };
                let nearest = log
                    .events
                    .iter()
                    .rev()
                    .find(|(at, _)| *at <= r.end)
                    .map(|(at, text)| format!("last event before its end: {} {text}", t(*at)))
                    .unwrap_or_default();
                entry.2.push(format!(
                    "started {}, ended {} ({} ms); {failure}; {nearest}",
                    t(r.start),
                    t(r.end),
                    (r.end - r.start).as_millis()
                ));
            }
        }
    }

    let mut report = String::new();
    let w = &mut report;
    use std::fmt::Write as _;
    let _ = writeln!(
        w,
        "## chaos — soak under pod kills, queue-proxy flips, config rewrites, scale to zero\n"
    );
    let _ = writeln!(
        w,
        "kactivator {} driver, {shards} shards; {} pods for `default/chaos`, 2 for `default/zero`; \
         load: 8 keep-alive, 8 connection-per-request, 4 streamed (chunked) clients, 2 on the \
         scale-to-zero revision, 3 websocket clients, started 5 s before the chaos. Chaos for {:.0} s.\n",
        options.driver,
        chaos_n,
        elapsed.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "Chaos events: {}\n",
        counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let failed = records.len() - ok;
    let _ = writeln!(
        w,
        "| requests sent | completed | succeeded | failed |\n|---:|---:|---:|---:|"
    );
    let _ = writeln!(w, "| {sent} | {} | {ok} | {failed} |\n", records.len());
    let by_kind = |kind: &str| records.iter().filter(|r| r.kind == kind).count();
    let _ = writeln!(
        w,
        "By kind: keep-alive {}, fresh connection {}, streamed {}, scale-to-zero revision {}, websocket sessions {} (20 messages each).\n",
        by_kind("keep-alive"),
        by_kind("fresh connection"),
        by_kind("streamed"),
        by_kind("scale-to-zero revision"),
        by_kind("websocket session")
    );
    if classes.is_empty() {
        let _ = writeln!(w, "No failures.\n");
    } else {
        let _ = writeln!(
            w,
            "| failure class | count | of which in flight on a pod killed then |\n|---|---:|---:|"
        );
        for (class, (count, explained, _)) in &classes {
            let _ = writeln!(w, "| {class} | {count} | {explained} |");
        }
        let _ = writeln!(w);
        for (class, (_, _, examples)) in &classes {
            for e in examples {
                let _ = writeln!(w, "- unexplained, {class}: {e}");
            }
        }
        let _ = writeln!(w);
    }
    // The baseline: the first sample at or after the warm-up (the last one if the run is shorter).
    let warm_up = options.warm_up.as_secs_f64();
    let (base_at, rss_start) = rss_samples
        .iter()
        .copied()
        .find(|(at, _)| *at >= warm_up)
        .or(rss_samples.last().copied())
        .unwrap_or((0.0, rss_load));
    let after: Vec<u64> = rss_samples
        .iter()
        .filter(|(at, _)| *at >= base_at)
        .map(|(_, kib)| *kib)
        .chain([rss_end])
        .collect();
    let (low, high) = (
        after.iter().copied().min().unwrap_or(rss_end),
        after.iter().copied().max().unwrap_or(rss_end),
    );
    let pct = |kib: u64| (kib as f64 / rss_start.max(1) as f64 - 1.0) * 100.0;
    let growth = pct(rss_end);
    let flat = pct(low) >= -10.0 && pct(high) <= 10.0;
    let _ = writeln!(
        w,
        "kactivator VmRSS: {rss_load} KiB with the load running before any chaos; baseline \
         {rss_start} KiB at {base_at:.0} s of chaos (warm-up {warm_up:.0} s); {rss_end} KiB at the \
         end ({growth:+.1} %); after the baseline between {low} KiB ({:+.1} %) and {high} KiB \
         ({:+.1} %). Flat within ±10 %: **{}**.\n",
        pct(low),
        pct(high),
        if flat { "yes" } else { "no" }
    );
    let mut series = String::new();
    let mut next = 0.0;
    for (at, kib) in &rss_samples {
        if *at >= next {
            let _ = write!(series, "{at:.0} s {kib}, ");
            next = at + 60.0;
        }
    }
    let _ = writeln!(
        w,
        "VmRSS (KiB) about once a minute: {series}end {rss_end}.\n"
    );
    let _ = writeln!(
        w,
        "Every failure in flight on a pod that died (a 502 naming a pod killed while it ran, ended within {} s of the kill; or a stream or websocket cut within 200 ms of a kill it started before): **{}**.",
        KILL_WINDOW.as_secs(),
        if all_in_flight { "yes" } else { "no" }
    );
    if let Some(note) = stop_note {
        let _ = writeln!(w, "\n{note}");
    }
    Ok((report, all_in_flight && flat))
}

/// A failure text with the varying parts (pod addresses, numbers of bytes) kept, so that classes
/// group: addresses of killed pods become `<killed pod>`, other pod addresses `<pod>`.
fn normalise(failure: &str, log: &Log) -> String {
    let mut text = failure.to_string();
    for (addr, _) in &log.kills {
        text = text.replace(&addr.to_string(), "<killed pod>");
    }
    text
}
