//! The websocket to the autoscaler's stat server, kept up for as long as the process runs.
//!
//! As upstream's durable sending connection (`knative.dev/pkg/websocket`): a 3 s handshake, a
//! ping every 3.33 s and a connection given up when no pong came for 10 s, reconnection with a
//! backoff of 100 ms × 1.3 per attempt with up to 50 % jitter (20 steps, then again from 100 ms).
//! A close frame from the autoscaler (1012 when it restarts) is a reconnect like any other.
//!
//! ★ What could not be sent is not lost: the latest stat of each revision that was due while the
//! link was down is kept, and before it the revision's cold-start poke if that never went out
//! (a later stat never overwrites a poke, see [`Pending`]); right after reconnecting those of
//! revisions that still have requests waiting are sent. Upstream drops them, so a cold start
//! during an autoscaler restart waits for the next tick at best.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kactivator_api::autoscaler::{self, WireStatMessage, WireStatMessages};
use kactivator_shards::runtime::readiness::Readiness;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::metrics::register;

/// Longest time a connection attempt may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// A connection is given up when no pong came for this long.
pub const PONG_TIMEOUT: Duration = Duration::from_secs(10);
/// Pings go out three times per pong timeout.
pub const PING_INTERVAL: Duration = Duration::from_millis(3_333);

/// Reconnection delays: 100 ms × 1.3 per attempt, up to 50 % jitter on top, 20 steps, then
/// again from the start (upstream's `wait.Backoff{100ms, 1.3, 0.5, 20}` looped forever).
#[derive(Clone, Debug, Default)]
pub struct ReconnectBackoff {
    step: u32,
}

/// First delay.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// Growth per attempt.
pub const BACKOFF_FACTOR: f64 = 1.3;
/// Most extra delay, as a fraction of the delay.
pub const BACKOFF_JITTER: f64 = 0.5;
/// Attempts before the delays start again from the first.
pub const BACKOFF_STEPS: u32 = 20;

impl ReconnectBackoff {
    /// The delay before the next attempt; `jitter` is a random number in [0, 1).
    pub fn next(&mut self, jitter: f64) -> Duration {
        let base = BACKOFF_INITIAL.as_secs_f64() * BACKOFF_FACTOR.powi(self.step as i32);
        self.step = (self.step + 1) % BACKOFF_STEPS;
        Duration::from_secs_f64(base * (1.0 + BACKOFF_JITTER * jitter.clamp(0.0, 1.0)))
    }

    /// A connection was made: the next failure starts from the first delay.
    pub fn reset(&mut self) {
        self.step = 0;
    }
}

/// The link's metrics; under Knative 1.19+'s names too when those are exported
/// (`kn.activator.stats.conn.reachable`, `kn.activator.stats.conn.errors`, `peer=autoscaler`).
#[derive(Clone)]
pub struct LinkMetrics {
    connected: IntGauge,
    connections: IntCounterVec,
    send_errors: IntCounterVec,
    sent: IntCounterVec,
    reachable: Option<IntGaugeVec>,
    errors: Option<IntCounterVec>,
}

impl LinkMetrics {
    pub fn new(registry: &Registry, names: crate::config::MetricNames) -> LinkMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register(
                registry,
                IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
            )
        };
        LinkMetrics {
            connected: register(
                registry,
                IntGauge::new(
                    "kactivator_autoscaler_connected",
                    "1 while the stat websocket to the autoscaler is up",
                )
                .expect("valid metric"),
            ),
            connections: counter(
                "kactivator_autoscaler_connections_total",
                "Connection attempts to the autoscaler by result (established, failed, lost)",
                &["result"],
            ),
            send_errors: counter(
                "kactivator_autoscaler_send_errors_total",
                "Stat batches that could not be sent (kept for after the reconnect)",
                &["reason"],
            ),
            sent: counter(
                "kactivator_autoscaler_stats_sent_total",
                "Stats sent to the autoscaler, by kind (poke, tick, resent)",
                &["kind"],
            ),
            reachable: names.opentelemetry().then(|| {
                let reachable = register(
                    registry,
                    IntGaugeVec::new(
                        Opts::new(
                            "kn_activator_stats_conn_reachable",
                            "Whether a peer is reachable from the activator (1 = reachable, 0 = not reachable)",
                        ),
                        &["peer"],
                    )
                    .expect("valid metric"),
                );
                reachable.with_label_values(&["autoscaler"]).set(0);
                reachable
            }),
            errors: names.opentelemetry().then(|| {
                counter(
                    "kn_activator_stats_conn_errors_total",
                    "Number of connection errors from the activator",
                    &["peer"],
                )
            }),
        }
    }

    fn up(&self) {
        self.connected.set(1);
        self.connections.with_label_values(&["established"]).inc();
        if let Some(reachable) = &self.reachable {
            reachable.with_label_values(&["autoscaler"]).set(1);
        }
    }

    /// The connection failed or was lost (`result`).
    fn down(&self, result: &str) {
        self.connected.set(0);
        self.connections.with_label_values(&[result]).inc();
        if let Some(reachable) = &self.reachable {
            reachable.with_label_values(&["autoscaler"]).set(0);
        }
        if let Some(errors) = &self.errors {
            errors.with_label_values(&["autoscaler"]).inc();
        }
    }
}

/// One batch for the autoscaler.
#[derive(Debug)]
pub struct Outgoing {
    pub batch: WireStatMessages,
    /// [`POKE`], [`TICK`] or [`RESENT`]: what the batch is, and its metric label.
    pub kind: &'static str,
}

/// A revision's first request, reported at once.
pub const POKE: &str = "poke";
/// The stats of every revision at a report tick.
pub const TICK: &str = "tick";
/// What could not be sent before a reconnect, sent right after it.
pub const RESENT: &str = "resent";

/// What could not be sent while the link was down, kept for right after the reconnect: per
/// revision its latest stat, and before it the revision's poke if that was never delivered.
/// A later stat replaces an earlier one but never a poke: the first window after a poke
/// subtracts the poked request, so a request still waiting reports `{0, 0}` there, and that
/// stat alone would tell the autoscaler nothing of it.
#[derive(Debug, Default)]
pub struct Pending {
    kept: BTreeMap<(String, String), Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    poke: Option<WireStatMessage>,
    latest: Option<WireStatMessage>,
}

impl Pending {
    /// `due` could not be sent.
    pub fn keep(&mut self, due: Outgoing) {
        for message in due.batch.messages {
            let key = (message.namespace.clone(), message.name.clone());
            if due.kind == POKE {
                // A poke comes only after the revision's entry was deleted: whatever was kept
                // from before is over.
                self.kept.insert(
                    key,
                    Kept {
                        poke: Some(message),
                        latest: None,
                    },
                );
            } else {
                self.kept.entry(key).or_default().latest = Some(message);
            }
        }
    }

    /// What to send right after a reconnect: the kept stats of the revisions that still have
    /// requests waiting (`waiting(namespace, name)`), each revision's poke before its latest
    /// stat; `None` when nothing is due. What is kept stays until [`Pending::delivered`].
    pub fn after_reconnect(&self, waiting: impl Fn(&str, &str) -> bool) -> Option<Outgoing> {
        let messages: Vec<WireStatMessage> = self
            .kept
            .iter()
            .filter(|((namespace, name), _)| waiting(namespace, name))
            .flat_map(|(_, kept)| kept.poke.iter().chain(kept.latest.iter()).cloned())
            .collect();
        (!messages.is_empty()).then_some(Outgoing {
            batch: WireStatMessages { messages },
            kind: RESENT,
        })
    }

    /// What [`Pending::after_reconnect`] chose was sent (or nothing was due): the rest is
    /// stale, and nothing is kept any more.
    pub fn delivered(&mut self) {
        self.kept.clear();
    }
}

/// Keeps the link up and sends every batch from `outgoing`; whether it is up goes into
/// `readiness`. `waiting(namespace, name)` says whether a revision still has requests
/// waiting (its kept stat is worth sending late).
pub async fn run(
    url: String,
    mut outgoing: mpsc::UnboundedReceiver<Outgoing>,
    readiness: Arc<Readiness>,
    metrics: LinkMetrics,
    waiting: impl Fn(&str, &str) -> bool,
) {
    let mut backoff = ReconnectBackoff::default();
    let mut pending = Pending::default();
    loop {
        // Nagle off: a poke is one small frame, and with it on, a frame written while the
        // previous one is unacknowledged waits for the peer's delayed ACK (40 ms).
        let attempt = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            tokio_tungstenite::connect_async_with_config(url.as_str(), None, true),
        )
        .await;
        match attempt {
            Ok(Ok((socket, _response))) => {
                backoff.reset();
                readiness.set_autoscaler_up(true);
                metrics.up();
                tracing::info!(%url, "connected to the autoscaler");
                let late = pending.after_reconnect(&waiting);
                if late.is_none() {
                    pending.delivered();
                }
                let why = serve(socket, late, &mut outgoing, &mut pending, &metrics).await;
                readiness.set_autoscaler_up(false);
                metrics.down("lost");
                match why {
                    Ended::Shutdown => return,
                    Ended::Lost(why) => tracing::warn!(%url, "autoscaler connection lost: {why}"),
                }
            }
            Ok(Err(error)) => {
                metrics.down("failed");
                tracing::warn!(%url, "cannot connect to the autoscaler: {error}");
            }
            Err(_elapsed) => {
                metrics.down("failed");
                tracing::warn!(%url, "cannot connect to the autoscaler: no handshake within {HANDSHAKE_TIMEOUT:?}");
            }
        }
        // Until the next attempt, what is due is kept (the latest per revision).
        let wake = Instant::now() + backoff.next(jitter());
        loop {
            match tokio::time::timeout_at(wake, outgoing.recv()).await {
                Ok(Some(due)) => {
                    metrics
                        .send_errors
                        .with_label_values(&["disconnected"])
                        .inc();
                    pending.keep(due);
                }
                Ok(None) => return,
                Err(_elapsed) => break,
            }
        }
    }
}

enum Ended {
    /// The reporter is gone: nothing more to send.
    Shutdown,
    Lost(String),
}

async fn serve<S>(
    socket: tokio_tungstenite::WebSocketStream<S>,
    late: Option<Outgoing>,
    outgoing: &mut mpsc::UnboundedReceiver<Outgoing>,
    pending: &mut Pending,
    metrics: &LinkMetrics,
) -> Ended
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = socket.split();
    let mut last_pong = Instant::now();
    let mut pings = tokio::time::interval_at(Instant::now() + PING_INTERVAL, PING_INTERVAL);
    let mut first = late;
    loop {
        let due = match first.take() {
            Some(late) => Some(late),
            None => tokio::select! {
                due = outgoing.recv() => match due {
                    Some(due) => Some(due),
                    None => return Ended::Shutdown,
                },
                _ = pings.tick() => {
                    if last_pong.elapsed() > PONG_TIMEOUT {
                        return Ended::Lost(format!("no pong for {PONG_TIMEOUT:?}"));
                    }
                    if let Err(error) = sink.send(Message::Ping(Default::default())).await {
                        return Ended::Lost(format!("ping: {error}"));
                    }
                    None
                }
                message = stream.next() => match message {
                    Some(Ok(Message::Pong(_))) => {
                        last_pong = Instant::now();
                        None
                    }
                    Some(Ok(Message::Close(frame))) => {
                        let why = match frame {
                            Some(frame) if u16::from(frame.code) == autoscaler::CLOSE_RESTARTING => {
                                "the autoscaler is restarting (1012)".to_string()
                            }
                            Some(frame) => format!("closed by the autoscaler: {} {}", frame.code, frame.reason),
                            None => "closed by the autoscaler".to_string(),
                        };
                        return Ended::Lost(why);
                    }
                    Some(Ok(_)) => None,
                    Some(Err(error)) => return Ended::Lost(error.to_string()),
                    None => return Ended::Lost("connection closed".into()),
                },
            },
        };
        let Some(due) = due else {
            continue;
        };
        let frame = Message::Binary(autoscaler::encode(&due.batch).into());
        match sink.send(frame).await {
            Ok(()) => {
                metrics
                    .sent
                    .with_label_values(&[due.kind])
                    .inc_by(due.batch.messages.len() as u64);
                if due.kind == RESENT {
                    pending.delivered();
                }
            }
            Err(error) => {
                metrics.send_errors.with_label_values(&["send"]).inc();
                // A resent batch is still kept; any other is kept now.
                if due.kind != RESENT {
                    pending.keep(due);
                }
                return Ended::Lost(format!("send: {error}"));
            }
        }
    }
}

/// A number in [0, 1) for the backoff's jitter, from the clock: good enough to keep many
/// activators from reconnecting in step, and no random-number crate for it.
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    f64::from(nanos % 1_000) / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_grows_by_thirty_percent_with_at_most_half_again_of_jitter_and_starts_over() {
        let mut backoff = ReconnectBackoff::default();
        let plain: Vec<u128> = (0..4).map(|_| backoff.next(0.0).as_millis()).collect();
        assert_eq!(plain, [100, 130, 169, 219]);
        let mut backoff = ReconnectBackoff::default();
        assert_eq!(backoff.next(0.999).as_millis(), 149);
        let mut backoff = ReconnectBackoff::default();
        let mut last = Duration::ZERO;
        for _ in 0..BACKOFF_STEPS {
            last = backoff.next(0.0);
        }
        assert!(last > Duration::from_secs(14), "20th delay: {last:?}");
        assert_eq!(backoff.next(0.0), BACKOFF_INITIAL, "then from the start");
        backoff.next(0.0);
        backoff.reset();
        assert_eq!(backoff.next(0.0), BACKOFF_INITIAL);
    }

    fn stat(name: &str, concurrency: f64, count: f64) -> WireStatMessage {
        autoscaler::stat_message("ns", name, "act", concurrency, count)
    }

    fn outgoing(messages: Vec<WireStatMessage>, kind: &'static str) -> Outgoing {
        Outgoing {
            batch: WireStatMessages { messages },
            kind,
        }
    }

    /// (name, concurrency, count) of each message.
    fn sent(due: &Outgoing) -> Vec<(String, f64, f64)> {
        due.batch
            .messages
            .iter()
            .map(|message| {
                let stat = message.stat.as_ref().expect("a stat");
                (
                    message.name.clone(),
                    stat.average_concurrent_requests,
                    stat.request_count,
                )
            })
            .collect()
    }

    #[test]
    fn only_the_latest_undelivered_stat_of_a_revision_is_kept() {
        let mut pending = Pending::default();
        pending.keep(outgoing(
            vec![stat("a", 1.0, 1.0), stat("b", 3.0, 1.0)],
            TICK,
        ));
        pending.keep(outgoing(vec![stat("a", 2.0, 1.0)], TICK));
        let due = pending.after_reconnect(|_, _| true).expect("due");
        assert_eq!(due.kind, RESENT);
        assert_eq!(sent(&due), [("a".into(), 2.0, 1.0), ("b".into(), 3.0, 1.0)]);
        // Only revisions with requests waiting; kept until delivered.
        let due = pending.after_reconnect(|_, name| name == "b").expect("due");
        assert_eq!(sent(&due), [("b".into(), 3.0, 1.0)]);
        pending.delivered();
        assert!(pending.after_reconnect(|_, _| true).is_none());
    }

    /// The reporter's own stats on simulated time: a cold start while the link is down.
    #[test]
    fn an_undelivered_poke_outlives_the_zero_stat_of_its_first_window() {
        use crate::autoscaler::stats::{Stats, Totals};
        use kactivator_api::RevisionKey;
        let revision = RevisionKey::new("ns", "cold").unwrap();
        let message = |report: &crate::autoscaler::stats::Report| {
            stat(
                report.revision.name(),
                report.average_concurrency,
                report.request_count,
            )
        };
        let mut stats = Stats::default();
        let mut pending = Pending::default();
        // t = 0: the revision's first request pokes; the link is down, so it is kept.
        let poke = stats.poke(&revision, Totals::default(), 0).expect("a poke");
        pending.keep(outgoing(vec![message(&poke)], POKE));
        // t = 1 s: the request still waits for a pod. The first window subtracts the poked
        // request, so the tick says {0, 0}; it cannot be sent either.
        let waiting = Totals {
            arrivals: 1,
            in_flight: 1,
            integral: 1_000_000,
        };
        let tick = stats.tick(1_000_000, |_| waiting);
        assert_eq!(
            sent(&outgoing(tick.reports.iter().map(message).collect(), TICK)),
            [("cold".into(), 0.0, 0.0)]
        );
        pending.keep(outgoing(tick.reports.iter().map(message).collect(), TICK));
        // The link is back while the request still waits: the autoscaler hears of it.
        let due = pending.after_reconnect(|_, _| true).expect("due");
        assert_eq!(
            sent(&due),
            [("cold".into(), 1.0, 1.0), ("cold".into(), 0.0, 0.0)],
            "the poke, then the latest stat"
        );
        // t = 2 s: the next window says {1, 0}; it replaces the {0, 0}, never the poke.
        let tick = stats.tick(2_000_000, |_| Totals {
            integral: 2_000_000,
            ..waiting
        });
        pending.keep(outgoing(tick.reports.iter().map(message).collect(), TICK));
        let due = pending.after_reconnect(|_, _| true).expect("due");
        assert_eq!(
            sent(&due),
            [("cold".into(), 1.0, 1.0), ("cold".into(), 1.0, 0.0)]
        );
        // A new poke (after the entry was deleted) replaces everything kept before it.
        pending.keep(outgoing(vec![stat("cold", 1.0, 1.0)], POKE));
        let due = pending.after_reconnect(|_, _| true).expect("due");
        assert_eq!(sent(&due), [("cold".into(), 1.0, 1.0)]);
    }
}
