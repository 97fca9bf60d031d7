//! The pods behind kactivator, with their own concurrency counters: the project's test backends
//! (`kactivator-testkit`, tokio + hyper, route `/delay/<ms>`), or a dedicated thread-per-
//! connection backend whose handler sleeps to an exact deadline.
//!
//! Both count a request in flight from the moment its handler starts until its response is
//! produced (before the last bytes are written), so a proxy that starts the next request only
//! after it has read the previous response can never be blamed for an overlap that is not there.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};

/// Which backend the pods are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `kactivator-testkit` backends: `tokio::time::sleep` in `/delay/<ms>`.
    Testkit,
    /// Dedicated backend: one OS thread per connection, sleeping to an exact deadline.
    Exact,
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(text: &str) -> Result<Kind, String> {
        match text {
            "testkit" => Ok(Kind::Testkit),
            "exact" => Ok(Kind::Exact),
            _ => Err(format!("unknown backend {text:?} (testkit or exact)")),
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Testkit => "testkit",
            Kind::Exact => "exact",
        })
    }
}

/// One pod's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct PodStats {
    pub requests: u64,
    pub in_flight: u64,
    pub max_in_flight: u64,
    /// Time spent in handlers, from the head read to the response write (exact backend only).
    pub busy_ns: Option<u64>,
}

/// A set of running pods.
pub enum Pods {
    Testkit(Vec<BackendHandle>),
    Exact(Vec<ExactBackend>),
}

impl Pods {
    pub fn spawn(kind: Kind, count: usize) -> io::Result<Pods> {
        Ok(match kind {
            Kind::Testkit => Pods::Testkit(
                (0..count)
                    .map(|i| backend::spawn(BackendConfig::named(format!("pod-{i}"))))
                    .collect::<io::Result<_>>()?,
            ),
            Kind::Exact => Pods::Exact(
                (0..count)
                    .map(|_| ExactBackend::spawn())
                    .collect::<io::Result<_>>()?,
            ),
        })
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        match self {
            Pods::Testkit(pods) => pods.iter().map(BackendHandle::addr).collect(),
            Pods::Exact(pods) => pods.iter().map(|pod| pod.addr).collect(),
        }
    }

    /// The request path that makes a pod's handler take `delay_ms`.
    pub fn path(&self, delay_ms: u64) -> String {
        format!("/delay/{delay_ms}")
    }

    pub fn stats(&self) -> Vec<PodStats> {
        match self {
            Pods::Testkit(pods) => pods
                .iter()
                .map(|pod| {
                    let stats = pod.stats();
                    PodStats {
                        requests: stats.requests,
                        in_flight: stats.in_flight,
                        max_in_flight: stats.max_in_flight,
                        busy_ns: None,
                    }
                })
                .collect(),
            Pods::Exact(pods) => pods.iter().map(|pod| pod.counters.snapshot()).collect(),
        }
    }

    /// Zeroes the request counts and restarts each high-water mark from the current level.
    pub fn reset(&self) {
        match self {
            Pods::Testkit(pods) => pods.iter().for_each(BackendHandle::reset_stats),
            Pods::Exact(pods) => pods.iter().for_each(|pod| pod.counters.reset()),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    busy_ns: AtomicU64,
    /// Every counted request the pod has answered, when it keeps a journal
    /// ([`ExactBackend::spawn_journaled`]); `None` for the pods of throughput rows, which must
    /// not take a lock per request.
    journal: Option<Mutex<Vec<Handled>>>,
}

/// One request the pod handled: when it read the head (its start), how long its handler took,
/// and the `id` query parameter of its target (`/delay/20?id=b3` → `b3`; empty without one).
#[derive(Clone, Debug)]
pub struct Handled {
    pub at: Instant,
    pub took: Duration,
    pub id: String,
}

impl Counters {
    fn snapshot(&self) -> PodStats {
        PodStats {
            requests: self.requests.load(Ordering::SeqCst),
            in_flight: self.in_flight.load(Ordering::SeqCst),
            max_in_flight: self.max_in_flight.load(Ordering::SeqCst),
            busy_ns: Some(self.busy_ns.load(Ordering::SeqCst)),
        }
    }

    fn reset(&self) {
        self.requests.store(0, Ordering::SeqCst);
        self.busy_ns.store(0, Ordering::SeqCst);
        self.max_in_flight
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// A pod whose handler takes the requested time: `GET /delay/<ms>` answers `200 ok` once `ms`
/// have passed since the request head arrived. It sleeps to the deadline with nanosleep, with
/// the thread's timer slack cut from the default 50 µs to 1 µs, so what is left is the wake-up
/// itself (tens of µs on a VM).
pub struct ExactBackend {
    addr: SocketAddr,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
}

impl ExactBackend {
    fn spawn() -> io::Result<ExactBackend> {
        ExactBackend::start(Counters::default())
    }

    /// A pod that also records the requests it handles ([`ExactBackend::journal`]), for
    /// scenarios that check who was served before whom.
    pub fn spawn_journaled() -> io::Result<ExactBackend> {
        ExactBackend::start(Counters {
            journal: Some(Mutex::new(Vec::new())),
            ..Counters::default()
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> PodStats {
        self.counters.snapshot()
    }

    /// The requests handled so far, in the order the pod started them (empty for a pod without
    /// a journal). An entry is written when the handler is done, so a request still in its
    /// handler is not there yet.
    pub fn journal(&self) -> Vec<Handled> {
        let mut entries = self
            .counters
            .journal
            .as_ref()
            .map_or(Vec::new(), |journal| {
                journal.lock().unwrap_or_else(|e| e.into_inner()).clone()
            });
        entries.sort_by_key(|entry| entry.at);
        entries
    }

    fn start(counters: Counters) -> io::Result<ExactBackend> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(counters);
        let stop = Arc::new(AtomicBool::new(false));
        let (accept_counters, accept_stop) = (Arc::clone(&counters), Arc::clone(&stop));
        std::thread::Builder::new()
            .name(format!("exact-{}", addr.port()))
            .spawn(move || {
                for stream in listener.incoming() {
                    if accept_stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let counters = Arc::clone(&accept_counters);
                    // `trace-handoffs.sh` finds a pod's threads by this name.
                    let _ = std::thread::Builder::new()
                        .name(format!("exact-{}", addr.port()))
                        .stack_size(64 * 1024)
                        .spawn(move || serve(stream, &counters));
                }
            })?;
        Ok(ExactBackend {
            addr,
            counters,
            stop,
        })
    }
}

impl Drop for ExactBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Serves keep-alive requests on one connection until the peer closes it.
fn serve(mut stream: TcpStream, counters: &Counters) {
    let _ = stream.set_nodelay(true);
    // The default 50 µs of slack let every 5 ms handler overrun by ~2 %, for every path alike.
    // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack; no memory is involved.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
    }
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let head_end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let arrived = Instant::now();
        // Requests carry no body here. Only `GET /delay/<ms>` (with an optional `?id=<id>`) is a
        // request of the revision; anything else (a health probe) is answered at once and not
        // counted, as a queue-proxy answers its probes without the user container.
        let target = std::str::from_utf8(&buf[..head_end])
            .ok()
            .and_then(|head| head.split(' ').nth(1))
            .unwrap_or("");
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let delay_ms: Option<u64> = path.strip_prefix("/delay/").and_then(|ms| ms.parse().ok());
        let id = query
            .split('&')
            .find_map(|pair| pair.strip_prefix("id="))
            .unwrap_or("")
            .to_string();
        buf.drain(..head_end);
        let Some(delay_ms) = delay_ms else {
            if stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
                .is_err()
            {
                return;
            }
            continue;
        };
        counters.requests.fetch_add(1, Ordering::SeqCst);
        let now_in_flight = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        counters
            .max_in_flight
            .fetch_max(now_in_flight, Ordering::SeqCst);
        let deadline = arrived + Duration::from_millis(delay_ms);
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            std::thread::sleep(deadline - now);
        }
        let took = arrived.elapsed();
        let busy = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        counters.busy_ns.fetch_add(busy, Ordering::SeqCst);
        if let Some(journal) = counters.journal.as_ref() {
            let mut journal = journal.lock().unwrap_or_else(|e| e.into_inner());
            journal.push(Handled {
                at: arrived,
                took,
                id,
            });
        }
        counters.in_flight.fetch_sub(1, Ordering::SeqCst);
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
            .is_err()
        {
            return;
        }
    }
}
