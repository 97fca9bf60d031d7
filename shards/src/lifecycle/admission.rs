//! Admission: a slot on a pod now, or a place in the revision's queue and the wait for one,
//! while watching the client so that one that leaves gives its place up at once. The slot is
//! held by a [`Held`] guard; giving it back hands it to the oldest waiter on any shard.
//!
//! The protocol-specific part is the [`ClientWatch`] a front passes in: how to notice, without
//! consuming anything, that the client has something to say, and how to take it.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use monoio::time::Instant;

use crate::routing::replica::{LocalPod, LocalRevision, Ungranted};
use crate::runtime::control_link::EvidenceKind;
use crate::shard::Shard;
use crate::throttle::gate::{Admission, Class, WaiterId};
use crate::upstream::error::UpstreamError;

use crate::request::deadlines::QueueTimeLevels;
use crate::request::error::RequestError;
use crate::request::policy::WaitNote;

/// The client side of a request while it waits for a slot.
pub(crate) trait ClientWatch {
    /// Called once when the request starts waiting in the queue: let go of what a waiting
    /// request need not hold (an empty read buffer).
    fn parked(&mut self);

    /// Completes when the client has something to say (bytes, a FIN, a reset) without reading
    /// it, so that dropping this future loses nothing. Never completes once the front buffers
    /// no more.
    fn readable(&self) -> impl Future<Output = ()>;

    /// Takes what [`ClientWatch::readable`] announced; false when the client is gone.
    fn absorb(&mut self) -> impl Future<Output = bool>;
}

/// A slot on a pod for `revision`: at once when one is free and nobody waits, else after a wait
/// in the queue bounded by `deadline`. `class`: the request's band and flow under the
/// revision's priority policy (`LocalRevision::classify`).
///
/// A queued request is kept small: its deadline is an alarm in the shard's timer, and the
/// client is only watched for readability. Errors: the queue is full (or a request of a higher
/// band took this one's place in it: shed, answered as a full queue), the deadline passed, the
/// revision left routing, or the client left (its place is given up at once).
///
/// A wait that began without a routable pod ends by the revision's cold-start wait, when it
/// has one (`LocalRevision::cold_start_wait`), if its own deadline is later.
///
/// A wait, however it ends, is added to `note` (`Some` once the request has queued: what the response tells the client) and to the
/// revision's wait histograms; it is a cold start when the revision had no routable pod as the
/// request queued.
pub(crate) async fn acquire<W: ClientWatch>(
    shard: &Shard,
    revision: &LocalRevision,
    class: Class,
    deadline: Instant,
    client: &mut W,
    note: &mut Option<WaitNote>,
) -> Result<Rc<LocalPod>, RequestError> {
    let (admission, outbox) = revision.admit(class);
    shard.deliver(revision, outbox);
    match admission {
        Admission::Proceed(pod) => Ok(pod),
        Admission::Rejected => {
            revision.counters.rejected.increment();
            Err(RequestError::QueueFull)
        }
        // Displacing: another shard is asked to shed a lower band's waiter for this request;
        // it waits for that answer as for its slot.
        Admission::Queued(id) | Admission::Displacing(id) => {
            client.parked();
            let queued_at = Instant::now();
            let cold_start = !revision.has_routable_pod();
            // A wait for a first pod may be bounded more tightly than the request (the add-on's
            // readiness timeout).
            let deadline = match revision.cold_start_wait() {
                Some(wait) if cold_start => deadline.min(queued_at + wait),
                _ => deadline,
            };
            // Per band only under a policy, which classified the request (and made the block).
            let band = revision
                .counters
                .priority()
                .filter(|_| revision.has_priority_policy())
                .map(|counters| &counters.bands[usize::from(class.band)]);
            if let Some(band) = band {
                band.queued.increment();
            }
            let waited = wait_for_slot(client, revision, shard, id, deadline).await;
            if let Some(band) = band {
                band.queued.decrement();
            }
            let wait = queued_at.elapsed();
            record_queue_time(shard, wait);
            let wait_us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
            revision.counters.record_wait(wait_us, cold_start);
            note.get_or_insert_default().add(wait_us, cold_start);
            match waited {
                Waited::Granted(pod) => Ok(pod),
                Waited::Removed => Err(RequestError::RevisionGone),
                Waited::Shed => {
                    shard.stats().shed.increment();
                    revision.counters.rejected.increment();
                    if let Some(band) = band {
                        band.shed.increment();
                    }
                    Err(RequestError::QueueFull)
                }
                Waited::Refused => {
                    revision.counters.rejected.increment();
                    Err(RequestError::QueueFull)
                }
                Waited::TimedOut => Err(RequestError::TimedOut),
                Waited::ClientGone => {
                    shard.stats().client_aborts.increment();
                    Err(RequestError::ClientGone)
                }
            }
        }
    }
}

/// Counts a wait against the fork's warning, error and critical thresholds, once each.
fn record_queue_time(shard: &Shard, waited: Duration) {
    let stats = shard.stats();
    let levels = QueueTimeLevels::of(waited);
    if levels.warning {
        stats.queue_time_warning.increment();
    }
    if levels.error {
        stats.queue_time_error.increment();
    }
    if levels.critical {
        stats.queue_time_critical.increment();
    }
}

/// Tells the control thread what a request found out about a pod (never waits, never lost).
pub(crate) fn report(shard: &Shard, revision: &LocalRevision, pod: &LocalPod, kind: EvidenceKind) {
    shard.control.report(revision.key(), &pod.tracker, kind);
}

/// How long a shard passes over a pod it could not connect to. Long enough to cover the
/// moment before the control thread's decision (quarantine: capacity zero) arrives, which takes
/// well under a millisecond; with quarantine off, how often this shard lets a request try the
/// pod again (a request that finds it still refusing goes elsewhere, see `request::retry`).
pub const DIAL_FAILURE_HOLD: Duration = Duration::from_millis(250);

/// A connection to `pod` could not be made: the control thread hears of it as a transport
/// failure (a passive health signal), and this shard passes the pod over for
/// [`DIAL_FAILURE_HOLD`], so that the request going back to admission, and those behind it,
/// land elsewhere. When the hold ends, requests that queued meanwhile are served.
pub(crate) fn dial_failed(shard: &Rc<Shard>, revision: &Rc<LocalRevision>, pod: &Rc<LocalPod>) {
    report(shard, revision, pod, EvidenceKind::TransportFailure);
    if !pod.hold_off() {
        return;
    }
    let (shard, revision, pod) = (shard.clone(), revision.clone(), pod.clone());
    monoio::spawn(async move {
        shard.alarms.at(Instant::now() + DIAL_FAILURE_HOLD).await;
        pod.end_hold();
        let outbox = revision.dispatch();
        shard.deliver(&revision, outbox);
    });
}

/// Why a request that left admission without a pod failed: a deadline that passed after a pod
/// could not be reached is answered with that pod's failure (the client hears why, not only that
/// time ran out).
pub(crate) fn not_admitted(error: RequestError, unreached: Option<UpstreamError>) -> RequestError {
    match (error, unreached) {
        (RequestError::TimedOut, Some(unreached)) => unreached.into(),
        (error, _) => error,
    }
}

/// How a wait in the queue ended.
enum Waited {
    Granted(Rc<LocalPod>),
    /// The revision was removed while the request waited.
    Removed,
    /// A request of a higher band took its place.
    Shed,
    /// It asked another shard to shed a lower band's waiter for it, nothing was left to shed,
    /// and the queue was still full.
    Refused,
    TimedOut,
    /// The client closed its connection: its place in the queue is already given up.
    ClientGone,
}

/// Waits for a slot while watching the client.
async fn wait_for_slot<W: ClientWatch>(
    client: &mut W,
    revision: &LocalRevision,
    shard: &Shard,
    id: WaiterId,
    deadline: Instant,
) -> Waited {
    enum Woke {
        Queue(Result<Rc<LocalPod>, Ungranted>),
        Deadline,
        Readable,
    }
    let mut queued = pin!(Queued {
        revision,
        shard,
        id,
        done: false,
    });
    let mut alarm = pin!(shard.alarms.at(deadline));
    loop {
        let woke = {
            let mut readable = pin!(client.readable());
            poll_fn(|cx| {
                if let Poll::Ready(grant) = queued.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Queue(grant));
                }
                if alarm.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Deadline);
                }
                if readable.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Woke::Readable);
                }
                Poll::Pending
            })
            .await
        };
        match woke {
            Woke::Queue(Ok(pod)) => return Waited::Granted(pod),
            Woke::Queue(Err(Ungranted::Removed)) => return Waited::Removed,
            Woke::Queue(Err(Ungranted::Shed)) => return Waited::Shed,
            Woke::Queue(Err(Ungranted::Refused)) => return Waited::Refused,
            Woke::Deadline => return Waited::TimedOut,
            // Readable: taking it completes at once (bytes, FIN or error are there), so the
            // queue and the alarm can wait for it. Dropping the queued wait (on return) gives
            // up its place.
            Woke::Readable => {
                if !client.absorb().await {
                    return Waited::ClientGone;
                }
            }
        }
    }
}

/// A queued request waiting for its slot. Dropped before the slot arrives (timeout, client
/// gone), it frees its place in the queue, or the slot granted meanwhile. Once shed or refused
/// it holds nothing: its place went to the request that shed it, or it never had one.
struct Queued<'a> {
    revision: &'a LocalRevision,
    shard: &'a Shard,
    id: WaiterId,
    done: bool,
}

impl Future for Queued<'_> {
    type Output = Result<Rc<LocalPod>, Ungranted>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Self::Output> {
        let ready = self.revision.poll_grant(self.id, cx);
        if ready.is_ready() {
            self.done = true;
        }
        ready
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !self.done {
            let outbox = self.revision.cancel(self.id);
            self.shard.deliver(self.revision, outbox);
        }
    }
}

/// Holds a pod slot for the duration of a request; giving it back hands it to the oldest
/// waiter on any shard.
pub(crate) struct Held<'a> {
    pub pod: &'a LocalPod,
    revision: &'a LocalRevision,
    shard: &'a Shard,
}

impl<'a> Held<'a> {
    pub fn new(pod: &'a LocalPod, revision: &'a LocalRevision, shard: &'a Shard) -> Held<'a> {
        Held {
            pod,
            revision,
            shard,
        }
    }

    /// Gives the slot back now; true when a request queued on this shard was woken with it.
    pub fn give_back(self) -> bool {
        let held = std::mem::ManuallyDrop::new(self);
        let outbox = held.revision.release(held.pod);
        held.shard.deliver(held.revision, outbox)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let outbox = self.revision.release(self.pod);
        self.shard.deliver(self.revision, outbox);
    }
}
