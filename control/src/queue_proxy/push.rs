//! The Cerebrium fork's push side: the queue-proxy tells the activator about its pod (`startup`,
//! `ready`, `not-ready`, `draining`) by `POST`ing the registration body
//! (`kactivator_api::registration`) to `ACTIVATOR_SERVICE_URL` + `/api/v1/pod-registration`,
//! so a queued request flows the moment the user container is ready instead of after the
//! kubelet, the endpoints controller and the activator's informer have each seen it.
//!
//! [`Push`] decides which event to send and when (sans-IO, the clock passed in); [`Pusher::run`]
//! on the control thread feeds it the readiness edges (`readiness::QueueProxyHealth::edges`) and the
//! drain ([`DrainPhase`]) and makes the requests with [`crate::http_client`].
//!
//! As the fork (`pkg/queue/pod_registration.go`, `sharedmain/main.go`, reference
//! `fork-and-kpa.md` §2): `ready` when readiness first passes, `not-ready` when it stops,
//! `draining` at SIGTERM; `POST` with `Content-Type: application/json` and
//! `User-Agent: knative-queue-proxy`, one connection per request, [`REQUEST_TIMEOUT`] (2 s)
//! over connecting, sending and reading, at most [`ANSWER_LIMIT`] (4 KiB) of the answer read; a
//! failure is logged and never holds up the data path or the drain.
//!
//! Differences, on purpose:
//! * ★ One request at a time, in order, and only the newest news: the fork sent each event from
//!   its own goroutine, so a quick `ready`/`not-ready` flap could reach the activator
//!   reordered and leave it believing the stale one. Here an event that is superseded before
//!   it is sent is never sent, and one superseded while in flight is followed by the newer.
//! * ★ A request that fails without an answer, or with a 5xx, 408 or 429, is retried after
//!   [`RETRY_FIRST`], doubling up to [`RETRY_MAX`], at most [`MAX_ATTEMPTS`] attempts, and only
//!   while its event is still the news (the fork never retried: one lost `ready` left the
//!   pod to the informer's path). Every event is idempotent at the activator, so a retry of one
//!   that did arrive changes nothing. Any other answer (4xx, 3xx) is the activator refusing it:
//!   given up at once, as resending the same body cannot help.
//! * `startup` is sent when the queue-proxy starts with the user container not yet ready (the
//!   fork stopped sending it, `05e6017559`): the activator then knows the pod, not routable,
//!   before it is ready. A `ready` that is due before `startup` went out replaces it.
//! * After `draining`, readiness is no longer reported: the pod is leaving.
//!
//! The fork's receiving-side quirks (the port-less `pod_ip` key, one replica told through the
//! ClusterIP Service, `startup` crashing the activator for a known pod) are fixed where they
//! arise, in the activator (`crate::pod_state`, `crate::sources::registrations`); the body
//! sent here is the fork's.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use hyper::Method;
use kactivator_api::headers::USER_AGENT;
use kactivator_api::registration::{self, QueueProxyEvent, Registration, RegistrationError};
use tokio::sync::watch;

use super::env::ActivatorUrl;
use crate::drain::DrainPhase;
use crate::http_client::{self, Call};

/// Longest one request may take, connecting included (the fork's `RegistrationTimeout`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Most of the activator's answer read, in bytes (the fork's `io.LimitReader(…, 4096)`).
pub const ANSWER_LIMIT: usize = 4096;
/// Wait before the first retry of a failed request; each further retry waits twice as long.
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
/// Longest wait between two attempts.
pub const RETRY_MAX: Duration = Duration::from_secs(2);
/// Most attempts at one event before it is given up (the first included).
pub const MAX_ATTEMPTS: u32 = 6;

// === The core (sans-IO) ===

/// How one request went, as far as the push is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// A 2xx: the activator applied it.
    Accepted,
    /// An answer that says no (4xx other than 408 and 429, 3xx, 1xx): sending it again cannot
    /// help.
    Refused,
    /// No answer (connect, write or read failed, or [`REQUEST_TIMEOUT`]), or one that says
    /// "not now" (5xx, 408, 429): worth another attempt. The activator may or may not have
    /// applied it.
    Failed,
}

impl Delivery {
    /// What an answer's status means.
    pub fn of_status(status: u16) -> Delivery {
        match status {
            200..=299 => Delivery::Accepted,
            408 | 429 | 500..=599 => Delivery::Failed,
            _ => Delivery::Refused,
        }
    }
}

/// What the push does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this event now, then report how it went with [`Push::sent`].
    Send(QueueProxyEvent),
    /// A retry is due at this instant (sooner if news comes).
    SleepUntil(Instant),
    /// A request is under way: wait for it.
    AwaitSend,
    /// Nothing to send until news comes.
    Idle,
    /// `draining` was delivered or given up: nothing will ever be sent again.
    Done,
}

/// What became of a request, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Applied by the activator.
    Accepted,
    /// Sent again at this instant.
    Retry(Instant),
    /// Not sent again: refused, or [`MAX_ATTEMPTS`] reached.
    GaveUp,
    /// Not sent again: newer news replaced it and is sent next.
    Superseded,
}

/// Which event the activator should hear next, and when: the newest news, one request at a
/// time, retried with backoff while it is still the news (module docs).
#[derive(Clone, Debug)]
pub struct Push {
    /// The newest news: what the activator should believe.
    news: QueueProxyEvent,
    /// What the activator is known to have applied last; `None` when unknown (nothing yet, or
    /// a request failed without a clear answer).
    applied: Option<QueueProxyEvent>,
    /// The event whose request is under way.
    in_flight: Option<QueueProxyEvent>,
    /// Failed attempts at `news`.
    failures: u32,
    /// `news` was given up on.
    gave_up: bool,
    /// When `news` may be sent.
    due: Instant,
}

impl Push {
    /// A queue-proxy starting with the user container `ready` or not: `ready` or `startup` is
    /// due at `now`.
    pub fn new(ready: bool, now: Instant) -> Push {
        Push {
            news: if ready {
                QueueProxyEvent::Ready
            } else {
                QueueProxyEvent::Startup
            },
            applied: None,
            in_flight: None,
            failures: 0,
            gave_up: false,
            due: now,
        }
    }

    /// The user container's readiness now (the prober's edges; repeats change nothing).
    /// Ignored once draining.
    pub fn readiness(&mut self, ready: bool, now: Instant) {
        let event = if ready {
            QueueProxyEvent::Ready
        } else {
            QueueProxyEvent::NotReady
        };
        match self.news {
            QueueProxyEvent::Draining => {}
            // Not ready at start is what `startup` already says.
            QueueProxyEvent::Startup if !ready => {}
            news if news == event => {}
            _ => self.replace(event, now),
        }
    }

    /// SIGTERM came: `draining` is the news from now on.
    pub fn draining(&mut self, now: Instant) {
        if self.news != QueueProxyEvent::Draining {
            self.replace(QueueProxyEvent::Draining, now);
        }
    }

    fn replace(&mut self, event: QueueProxyEvent, now: Instant) {
        self.news = event;
        self.failures = 0;
        self.gave_up = false;
        self.due = now;
    }

    pub fn next(&mut self, now: Instant) -> Step {
        if self.in_flight.is_some() {
            return Step::AwaitSend;
        }
        let settled = self.gave_up || self.applied == Some(self.news);
        if settled {
            return if self.news == QueueProxyEvent::Draining {
                Step::Done
            } else {
                Step::Idle
            };
        }
        if now < self.due {
            return Step::SleepUntil(self.due);
        }
        self.in_flight = Some(self.news);
        Step::Send(self.news)
    }

    /// How the request under way went (ignored when none is).
    pub fn sent(&mut self, delivery: Delivery, now: Instant) -> Option<After> {
        let event = self.in_flight.take()?;
        match delivery {
            Delivery::Accepted => self.applied = Some(event),
            // It may have been applied: the activator's view is unknown until the next answer.
            Delivery::Failed => self.applied = None,
            Delivery::Refused => {}
        }
        if event != self.news {
            // `replace` made the news due already.
            return Some(if delivery == Delivery::Accepted {
                After::Accepted
            } else {
                After::Superseded
            });
        }
        Some(match delivery {
            Delivery::Accepted => After::Accepted,
            Delivery::Refused => {
                self.gave_up = true;
                After::GaveUp
            }
            Delivery::Failed => {
                self.failures += 1;
                if self.failures >= MAX_ATTEMPTS {
                    self.gave_up = true;
                    After::GaveUp
                } else {
                    self.due = now + retry_wait(self.failures);
                    After::Retry(self.due)
                }
            }
        })
    }
}

/// The wait after the `failures`-th failed attempt: [`RETRY_FIRST`] doubled each time, at most
/// [`RETRY_MAX`].
pub fn retry_wait(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
}

// === The shell ===

/// Who this pod is, as every registration names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIdentity {
    /// `SERVING_POD`.
    pub pod_name: String,
    /// `SERVING_POD_IP`: the activator adds the revision's serving port.
    pub pod_ip: IpAddr,
    /// `SERVING_NAMESPACE`.
    pub namespace: String,
    /// `SERVING_REVISION`.
    pub revision: String,
}

impl PodIdentity {
    fn registration(&self, event: QueueProxyEvent, timestamp: Option<String>) -> Registration {
        Registration {
            pod_name: self.pod_name.clone(),
            pod_ip: self.pod_ip,
            namespace: self.namespace.clone(),
            revision: self.revision.clone(),
            event,
            timestamp,
        }
    }
}

/// The task that pushes this pod's events; [`Pusher::run`] on the control thread.
#[derive(Debug)]
pub struct Pusher {
    url: ActivatorUrl,
    pod: PodIdentity,
}

impl Pusher {
    /// The push of `pod`'s events to `url`. Refused when the activator's own rules would
    /// refuse this pod's registrations (an empty pod name, a pod IP no pod can have, a `/` in
    /// the namespace, …): the error says which rule.
    pub fn new(url: ActivatorUrl, pod: PodIdentity) -> Result<Pusher, RegistrationError> {
        let sample = pod.registration(QueueProxyEvent::Startup, None);
        registration::parse(&registration::encode(&sample))?;
        Ok(Pusher { url, pod })
    }

    /// Pushes what `edges` (the user container's readiness, `readiness::QueueProxyHealth::edges`) and
    /// `drain` say, until `draining` is delivered or given up, or until neither can change
    /// any more.
    pub async fn run(
        self,
        mut edges: watch::Receiver<bool>,
        mut drain: watch::Receiver<DrainPhase>,
    ) {
        let now = || tokio::time::Instant::now().into_std();
        let mut push = Push::new(*edges.borrow_and_update(), now());
        let (mut edges_open, mut drain_open) = (true, true);
        loop {
            push.readiness(*edges.borrow_and_update(), now());
            if *drain.borrow_and_update() != DrainPhase::Serving {
                push.draining(now());
            }
            let wake_at = match push.next(now()) {
                Step::Send(event) => {
                    let (delivery, detail) = self.send(event).await;
                    if let Some(after) = push.sent(delivery, now()) {
                        log(event, &self.url, after, &detail);
                    }
                    continue;
                }
                Step::Done => return,
                // Each request is awaited and reported above before the next step is asked for.
                Step::AwaitSend => unreachable!("no request is under way between steps"),
                Step::SleepUntil(at) => Some(at),
                Step::Idle => None,
            };
            if !edges_open && !drain_open && wake_at.is_none() {
                return;
            }
            let sleep = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = sleep => {}
                changed = edges.changed(), if edges_open => edges_open = changed.is_ok(),
                changed = drain.changed(), if drain_open => drain_open = changed.is_ok(),
            }
        }
    }

    /// One request: how it went, and a word on it for the log.
    async fn send(&self, event: QueueProxyEvent) -> (Delivery, String) {
        let timestamp = rfc3339_nano(SystemTime::now());
        let body = registration::encode(&self.pod.registration(event, Some(timestamp)));
        let call = Call {
            method: Method::POST,
            path: &self.url.path,
            authority: Some(&self.url.authority),
            headers: &[
                ("Content-Type", registration::ACCEPTED_CONTENT_TYPE),
                (USER_AGENT, registration::USER_AGENT),
            ],
            body: Bytes::from(body),
        };
        let exchange = async {
            let addr = resolve(&self.url).await?;
            http_client::send(addr, call, ANSWER_LIMIT, REQUEST_TIMEOUT).await
        };
        // One deadline over the name lookup and the request, as the fork's client timeout.
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Err(_) => (
                Delivery::Failed,
                format!("timed out after {REQUEST_TIMEOUT:?}"),
            ),
            Ok(Err(reason)) => (Delivery::Failed, reason),
            Ok(Ok(answer)) => {
                let body = String::from_utf8_lossy(&answer.body);
                (
                    Delivery::of_status(answer.status),
                    format!("{} {}", answer.status, body.trim()),
                )
            }
        }
    }
}

fn log(event: QueueProxyEvent, url: &ActivatorUrl, after: After, detail: &str) {
    let event = event.wire_name();
    let url = &url.authority;
    match after {
        After::Accepted => tracing::info!(event, %url, "activator told"),
        After::Retry(_) => {
            tracing::warn!(event, %url, "telling the activator failed ({detail}); retrying")
        }
        After::GaveUp => {
            tracing::warn!(event, %url, "telling the activator failed ({detail}); giving up")
        }
        After::Superseded => {
            tracing::info!(event, %url, "telling the activator failed ({detail}); newer news goes next")
        }
    }
}

/// The activator's address: the URL's IP, or the first address its name resolves to (looked
/// up for each request: a Service's address can change).
async fn resolve(url: &ActivatorUrl) -> Result<SocketAddr, String> {
    if let Ok(ip) = url.host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, url.port));
    }
    tokio::net::lookup_host((url.host.as_str(), url.port))
        .await
        .map_err(|error| format!("resolve {}: {error}", url.host))?
        .next()
        .ok_or_else(|| format!("resolve {}: no address", url.host))
}

/// `time` as Go's `time.RFC3339Nano` writes a UTC time: `2025-10-31T12:00:00.123456789Z`,
/// trailing zeros of the fraction dropped, no fraction when it is zero. A time before 1970
/// (a clock set wrong) is written as the epoch.
pub fn rfc3339_nano(time: SystemTime) -> String {
    let since = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let seconds = since.as_secs();
    let (year, month, day) = kactivator_h1::date::civil_from_days(seconds / 86_400);
    let of_day = seconds % 86_400;
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60
    );
    let nanos = since.subsec_nanos();
    if nanos != 0 {
        let fraction = format!(".{nanos:09}");
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

#[cfg(test)]
mod tests;
