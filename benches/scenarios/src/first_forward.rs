//! Routable → first queued request forwarded: a revision has no routable pod, one request waits
//! in kactivator's queue, then the pod's queue-proxy registers `ready`
//! (`POST /api/v1/pod-registration` on the data port). Measured: from the moment the harness
//! starts writing the registration to the moment the pod reads the queued request's head, over
//! many repetitions (the pod is sent `not-ready` between them). This is the whole scale-from-zero
//! path inside kactivator: the registration request, the control thread's state worker, the
//! routing update to the shards, the hand-off to the waiter and the write to the pod.
//!
//! The pod is a raw socket server in this process that timestamps each request head with the same
//! monotonic clock the harness used for the start, so no clock is compared across processes.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kactivator_testkit::raw_http1;

use crate::activator::{self, Activator, Launch};
use crate::client::{get_request, io_error, Conn};
use crate::{fmt_us, percentile, ScratchDir};

/// The targets of `../shared/BENCHMARKS.md`.
const TARGET_P50: Duration = Duration::from_millis(1);
const TARGET_P99: Duration = Duration::from_millis(5);
/// Longest wait for any one step before the run fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Options {
    pub repetitions: usize,
    pub drivers: Vec<String>,
    pub shards: Option<usize>,
}

/// A pod that answers every request 200 and reports when each non-probe head arrived.
pub(crate) struct Pod {
    pub(crate) addr: SocketAddr,
    pub(crate) arrivals: mpsc::Receiver<Instant>,
}

pub(crate) fn spawn_pod(ip: IpAddr) -> io::Result<Pod> {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))?;
    let addr = listener.local_addr()?;
    let (tx, arrivals) = mpsc::channel();
    std::thread::Builder::new()
        .name("ff-pod".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let tx = tx.clone();
                let _ = std::thread::Builder::new()
                    .name("ff-pod-conn".into())
                    .spawn(move || serve(stream, tx));
            }
        })?;
    Ok(Pod { addr, arrivals })
}

fn serve(mut stream: TcpStream, tx: mpsc::Sender<Instant>) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let end = loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                break end + 4;
            }
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let at = Instant::now();
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        buf.drain(..end);
        // The activator's health prober (quarantine gate on) gets the queue-proxy's answer and
        // is not a forwarded request.
        let answer: &[u8] = if head.contains("k-network-probe: queue") {
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nqueue"
        } else {
            let _ = tx.send(at);
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        };
        if stream.write_all(answer).is_err() {
            return;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

pub(crate) fn registration(pod_ip: IpAddr, event: &str) -> Vec<u8> {
    let body = format!(
        "{{\"pod_name\":\"ff-pod\",\"pod_ip\":\"{pod_ip}\",\"namespace\":\"default\",\"revision\":\"zero\",\"event_type\":\"{event}\"}}"
    );
    format!(
        "POST /api/v1/pod-registration HTTP/1.1\r\nHost: activator\r\nUser-Agent: knative-queue-proxy\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Reads the HTTP response on `stream` and returns its status.
pub(crate) fn read_status(stream: TcpStream) -> io::Result<u16> {
    stream.set_read_timeout(Some(STEP_TIMEOUT))?;
    let response = raw_http1::Connection::new(stream)?
        .read_response()
        .map_err(io_error)?;
    Ok(response.status)
}

pub(crate) fn register(http: SocketAddr, pod_ip: IpAddr, event: &str) -> Result<(), String> {
    let mut stream = TcpStream::connect_timeout(&http, STEP_TIMEOUT).map_err(|e| e.to_string())?;
    stream
        .write_all(&registration(pod_ip, event))
        .map_err(|e| e.to_string())?;
    match read_status(stream) {
        Ok(200) => Ok(()),
        Ok(status) => Err(format!("registration {event} answered {status}")),
        Err(error) => Err(format!("registration {event}: {error}")),
    }
}

fn wait_queued(activator: &Activator, count: f64) -> Result<(), String> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let queued =
            activator.metric_sum("kactivator_revision_queued", &["revision_name=\"zero\""])?;
        if queued == count {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("queued stayed at {queued}, expected {count}"));
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// One driver: returns the delays in microseconds, sorted.
/// One repetition: the pod at `pod_ip` is made not-ready, a client's request to `revision`
/// waits, `queued` says when it is queued, then a queue-proxy `ready` goes in. Returns the
/// microseconds from sending that `ready` to the request's head reaching the pod. Each step
/// (connecting, the request's arrival) may take up to `step_timeout`.
pub(crate) fn time_ready_to_forward(
    activator: &Activator,
    pod: &Pod,
    pod_ip: IpAddr,
    revision: &'static str,
    step_timeout: Duration,
    queued: impl FnOnce(&Activator) -> Result<(), String>,
) -> Result<u32, String> {
    register(activator.http, pod_ip, "not-ready")?;
    let http = activator.http;
    let client = std::thread::spawn(move || {
        Conn::connect(http, step_timeout)
            .and_then(|mut conn| conn.roundtrip(&get_request("/", revision)))
            .map(|response| response.status)
    });
    queued(activator)?;
    while pod.arrivals.try_recv().is_ok() {}
    let start = Instant::now();
    let mut stream =
        TcpStream::connect_timeout(&activator.http, step_timeout).map_err(|e| e.to_string())?;
    stream
        .write_all(&registration(pod_ip, "ready"))
        .map_err(|e| e.to_string())?;
    let arrived = pod.arrivals.recv_timeout(step_timeout).map_err(|_| {
        format!(
            "the queued request never reached the pod; log:\n{}",
            activator.log_tail()
        )
    })?;
    let delay = arrived.saturating_duration_since(start).as_micros() as u32;
    match read_status(stream) {
        Ok(200) => {}
        other => return Err(format!("registration {other:?}")),
    }
    match client.join() {
        Ok(Ok(200)) => Ok(delay),
        other => Err(format!("client {other:?}")),
    }
}

fn measure(binary: &Path, driver: &str, options: &Options) -> Result<Vec<u32>, String> {
    let dir = ScratchDir::new(&format!("first-forward-{driver}"))?;
    let pod_ip = IpAddr::from([127, 0, 0, 2]);
    let pod = spawn_pod(pod_ip).map_err(|e| format!("starting the pod: {e}"))?;
    let revisions = activator::revision(
        "zero",
        &[],
        &format!(
            "container_concurrency = 1\nserving_port = {}\ntimeout_seconds = 30",
            pod.addr.port()
        ),
    );
    let activator = Activator::start(&Launch {
        binary,
        driver,
        shards: options.shards,
        http_ip: "127.0.0.1",
        proxy: "",
        features: "",
        tables: "",
        revisions: &revisions,
        dir: dir.path(),
        args: &[],
        env: &[],
    })?;
    let mut delays = Vec::with_capacity(options.repetitions);
    for repetition in 0..options.repetitions {
        let delay = time_ready_to_forward(
            &activator,
            &pod,
            pod_ip,
            "zero",
            STEP_TIMEOUT,
            |activator| wait_queued(activator, 1.0),
        )
        .map_err(|e| format!("repetition {repetition}: {e}"))?;
        delays.push(delay);
    }
    if let Some(trouble) = activator.stop() {
        return Err(trouble);
    }
    delays.sort_unstable();
    Ok(delays)
}

pub fn run(binary: &Path, options: &Options) -> Result<(String, bool), String> {
    let mut report = format!(
        "### Routable → first queued request forwarded\n\n\
         {} repetitions per driver: one request queued for a revision with no routable pod, then \
         the pod's queue-proxy registers `ready`; time from the first byte of the registration \
         to the pod reading the queued request (same clock, one process).\n\n\
         | driver | p50 | p90 | p99 | max | target p50 ≤ 1 ms, p99 ≤ 5 ms |\n|---|---|---|---|---|---|\n",
        options.repetitions
    );
    let mut passed = true;
    for driver in &options.drivers {
        let delays = measure(binary, driver, options)?;
        let p50 = percentile(&delays, 50.0);
        let p99 = percentile(&delays, 99.0);
        let met = p50 <= TARGET_P50.as_micros() as u64 && p99 <= TARGET_P99.as_micros() as u64;
        passed &= met;
        report.push_str(&format!(
            "| {driver} | {} | {} | {} | {} | {} |\n",
            fmt_us(p50),
            fmt_us(percentile(&delays, 90.0)),
            fmt_us(p99),
            fmt_us(u64::from(*delays.last().unwrap_or(&0))),
            if met { "met" } else { "**not met**" }
        ));
    }
    Ok((report, passed))
}
