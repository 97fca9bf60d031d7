//! A stand-in for Knative's autoscaler stat server (`pkg/autoscaler/statserver`): it accepts
//! websocket connections, decodes every binary frame as `WireStatMessages`, and keeps each
//! batch with the time it arrived. Like the real one it can restart, closing its connections
//! with code 1012 first; it then listens on the same port again.
//!
//! The messages are decoded with code generated here from the repository's `stat.proto`, not
//! with kactivator's, so a test checks kactivator's encoding rather than agreeing with it.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// The generated types of `stat.proto` (package `metrics`).
#[allow(clippy::all)]
pub mod wire {
    include!(concat!(env!("OUT_DIR"), "/metrics.rs"));
}

/// One frame as it arrived.
#[derive(Clone, Debug)]
pub struct Batch {
    pub at: Instant,
    pub messages: Vec<wire::WireStatMessage>,
}

/// One stat of one revision, flattened.
#[derive(Clone, Debug, PartialEq)]
pub struct StatSeen {
    pub at: Instant,
    pub pod_name: String,
    pub average_concurrent_requests: f64,
    pub request_count: f64,
}

#[derive(Default)]
struct Seen {
    batches: Vec<Batch>,
    /// Frames that did not decode, or were not binary.
    rejected: usize,
    connections: usize,
}

/// A running test autoscaler; stopped on drop.
pub struct TestAutoscaler {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    /// `true` while it should serve; `false` closes every connection with 1012 and stops
    /// listening.
    serving: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestAutoscaler {
    /// Starts one on a free loopback port.
    pub fn start() -> io::Result<TestAutoscaler> {
        // Port 0: the kernel picks a port no one holds. A port checked free and bound a moment
        // later could be taken in between by a parallel test binary (CI saw AddrInUse here).
        TestAutoscaler::start_on(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// Starts one on `addr`; it listens before this returns.
    pub fn start_on(addr: SocketAddr) -> io::Result<TestAutoscaler> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            bind(addr)?
        };
        // The address bound (its port chosen by the kernel when `addr` asked for 0).
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (serving, watch) = watch::channel(true);
        let thread_seen = seen.clone();
        let thread = std::thread::Builder::new()
            .name("test-autoscaler".into())
            .spawn(move || runtime.block_on(serve(listener, addr, thread_seen, watch)))?;
        Ok(TestAutoscaler {
            addr,
            seen,
            serving,
            thread: Some(thread),
        })
    }

    /// `ws://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// Closes every connection with 1012 ("restarting") and stops listening, until
    /// [`TestAutoscaler::resume`].
    pub fn pause(&self) {
        let _ = self.serving.send(false);
    }

    /// Listens on the same port again.
    pub fn resume(&self) {
        let _ = self.serving.send(true);
    }

    /// Every batch so far.
    pub fn batches(&self) -> Vec<Batch> {
        self.lock().batches.clone()
    }

    /// Frames that were not a binary `WireStatMessages`.
    pub fn rejected(&self) -> usize {
        self.lock().rejected
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.lock().connections
    }

    /// Every stat about `namespace/revision`, in arrival order.
    pub fn stats_of(&self, namespace: &str, revision: &str) -> Vec<StatSeen> {
        self.lock()
            .batches
            .iter()
            .flat_map(|batch| {
                batch
                    .messages
                    .iter()
                    .filter(|message| message.namespace == namespace && message.name == revision)
                    .filter_map(|message| {
                        message.stat.as_ref().map(|stat| StatSeen {
                            at: batch.at,
                            pod_name: stat.pod_name.clone(),
                            average_concurrent_requests: stat.average_concurrent_requests,
                            request_count: stat.request_count,
                        })
                    })
            })
            .collect()
    }

    /// Waits until `revision` has had at least `count` stats, for at most `limit`; returns them.
    pub fn wait_for_stats(
        &self,
        namespace: &str,
        revision: &str,
        count: usize,
        limit: Duration,
    ) -> Vec<StatSeen> {
        let deadline = Instant::now() + limit;
        loop {
            let stats = self.stats_of(namespace, revision);
            if stats.len() >= count || Instant::now() >= deadline {
                return stats;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for TestAutoscaler {
    fn drop(&mut self) {
        // Dropping the sender ends the serving loop.
        let (closed, _) = watch::channel(false);
        drop(std::mem::replace(&mut self.serving, closed));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn serve(
    mut listener: TcpListener,
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    mut serving: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let seen = seen.clone();
                let serving = serving.clone();
                tokio::spawn(connection(stream, seen, serving));
            }
            changed = serving.changed() => {
                if changed.is_err() {
                    return;
                }
                if *serving.borrow() {
                    continue;
                }
                // Paused: stop listening until resumed (connections close themselves).
                drop(listener);
                loop {
                    if serving.changed().await.is_err() {
                        return;
                    }
                    if *serving.borrow() {
                        break;
                    }
                }
                listener = match bind(addr) {
                    Ok(listener) => listener,
                    Err(_) => return,
                };
            }
        }
    }
}

async fn connection(
    stream: tokio::net::TcpStream,
    seen: Arc<Mutex<Seen>>,
    mut serving: watch::Receiver<bool>,
) {
    let Ok(socket) = tokio_tungstenite::accept_async(stream).await else {
        return;
    };
    seen.lock().unwrap_or_else(|p| p.into_inner()).connections += 1;
    let (mut sink, mut frames) = socket.split();
    loop {
        tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(Message::Binary(bytes))) => {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    match wire::WireStatMessages::decode(bytes.as_ref()) {
                        Ok(batch) => seen.batches.push(Batch {
                            at: Instant::now(),
                            messages: batch.messages,
                        }),
                        Err(_) => seen.rejected += 1,
                    }
                }
                Some(Ok(Message::Ping(payload))) => {
                    let _ = sink.send(Message::Pong(payload)).await;
                }
                Some(Ok(Message::Text(_))) => {
                    seen.lock().unwrap_or_else(|p| p.into_inner()).rejected += 1;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            },
            changed = serving.changed() => {
                if changed.is_err() || !*serving.borrow() {
                    let _ = sink
                        .send(Message::Close(Some(CloseFrame {
                            code: CloseCode::Restart,
                            reason: "Restarting".into(),
                        })))
                        .await;
                    return;
                }
            }
        }
    }
}
