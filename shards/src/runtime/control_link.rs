//! What the shards tell the control thread: queue-proxy registrations received on the data
//! port (answered once applied), and evidence about pods seen on the request path (never
//! answered, never lost). Routing still flows the other way, as snapshots.
//!
//! Cold-start pokes (a revision's first request while the autoscaler reporter has no entry for
//! it) go up the same way: unbounded, at most one per shard and revision outstanding.
//!
//! Evidence goes up as a message the shard cannot fail to send and the control thread turns
//! into a state-worker op; the decision (quarantine, removal) comes back down in a snapshot.
//! The request path never waits: the evidence channel is unbounded, and what bounds it is
//! that a pod has at most one report of each kind outstanding (see [`ControlLink::report`]).

use std::sync::Arc;

use kactivator_api::RevisionKey;

use crate::metrics::{LoadSnapshot, RevisionCounters};
use crate::routing::PodTracker;

/// A registration body, as received. The control thread parses, applies and answers it.
#[derive(Debug)]
pub struct RegistrationRequest {
    pub body: Vec<u8>,
    /// Sent by a peer activator rather than a queue-proxy.
    pub relayed: bool,
    pub reply: flume::Sender<Reply>,
}

/// The control thread's answer to a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// `application/json` rather than plain text.
    pub json: bool,
}

/// Something a request found out about a pod.
#[derive(Debug)]
pub struct PodEvidence {
    /// The revision the request was for.
    pub revision: RevisionKey,
    /// The pod, as the shard knew it: the control thread applies the evidence only if this is
    /// still the tracker it has for the address (a new pod at the same IP is another tracker).
    pub tracker: Arc<PodTracker>,
    pub kind: EvidenceKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EvidenceKind {
    /// Dialing failed (refused, reset, unreachable, timed out) or the pod dropped a fresh
    /// connection before answering: counts as a failed health check.
    TransportFailure,
}

/// Registrations the channel holds before a shard's registration waits for room.
pub const REGISTRATION_QUEUE: usize = 4096;

/// The shards' sending side.
#[derive(Clone, Debug)]
pub struct ControlLink {
    registrations: flume::Sender<RegistrationRequest>,
    evidence: flume::Sender<PodEvidence>,
    pokes: flume::Sender<Poke>,
}

/// The control thread's receiving side.
#[derive(Debug)]
pub struct FromShards {
    pub registrations: flume::Receiver<RegistrationRequest>,
    pub evidence: flume::Receiver<PodEvidence>,
    /// Revisions whose first request arrived while the autoscaler reporter had no entry for
    /// them (see `metrics::RevisionCounters::arrive`).
    pub pokes: flume::Receiver<Poke>,
}

/// A revision's first request while the autoscaler reporter had no entry for it.
#[derive(Debug)]
pub struct Poke {
    pub revision: RevisionKey,
    /// The poking shard's counters of the revision: the reporter reads its load from them.
    pub counters: Arc<RevisionCounters>,
    /// That shard's load just before the request, and when the request arrived: the
    /// reporter's first window starts there.
    pub before: LoadSnapshot,
    pub at_us: u64,
}

impl ControlLink {
    pub fn channel() -> (ControlLink, FromShards) {
        let (registrations, registrations_rx) = flume::bounded(REGISTRATION_QUEUE);
        let (evidence, evidence_rx) = flume::unbounded();
        let (pokes, pokes_rx) = flume::unbounded();
        (
            ControlLink {
                registrations,
                evidence,
                pokes,
            },
            FromShards {
                registrations: registrations_rx,
                evidence: evidence_rx,
                pokes: pokes_rx,
            },
        )
    }

    /// Hands a registration over and waits for the answer.
    pub async fn register(&self, body: Vec<u8>, relayed: bool) -> Reply {
        let (reply, answer) = flume::bounded(1);
        let unavailable = || Reply {
            status: 503,
            body: kactivator_api::messages::CONTROL_PLANE_UNAVAILABLE.into(),
            json: false,
        };
        let request = RegistrationRequest {
            body,
            relayed,
            reply,
        };
        if self.registrations.send_async(request).await.is_err() {
            return unavailable();
        }
        answer.recv_async().await.unwrap_or_else(|_| unavailable())
    }

    /// Tells the autoscaler reporter that `revision` has a request and no entry (a cold-start
    /// poke). Never waits and is never lost; at most one per shard and revision is outstanding,
    /// because only the arrival that set the revision's `reported` flag sends one.
    pub fn poke(
        &self,
        revision: &RevisionKey,
        counters: &Arc<RevisionCounters>,
        before: LoadSnapshot,
        at_us: u64,
    ) {
        // Fails only when the control thread is gone, and then nobody is left to tell.
        let _ = self.pokes.send(Poke {
            revision: revision.clone(),
            counters: counters.clone(),
            before,
            at_us,
        });
    }

    /// Reports what a request found out about `tracker`, without waiting and without loss.
    ///
    /// At most one report of each kind per tracker is in the channel: a transport failure is
    /// sent only when the previous one has been taken by the control thread
    /// ([`PodTracker::claim_failure_report`]). Failures that happen while a report waits say
    /// nothing the waiting one does not. (Evidence of IP reuse never comes from a request: a
    /// user's app can set any header, so only the queue-proxy's own probe answers and
    /// registrations say which revision a pod serves, SPEC §4.)
    pub fn report(&self, revision: &RevisionKey, tracker: &Arc<PodTracker>, kind: EvidenceKind) {
        let send = match kind {
            EvidenceKind::TransportFailure => tracker.claim_failure_report(),
        };
        if send {
            // Fails only when the control thread is gone, and then nobody is left to tell.
            let _ = self.evidence.send(PodEvidence {
                revision: revision.clone(),
                tracker: tracker.clone(),
                kind,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn tracker(n: u32) -> Arc<PodTracker> {
        let addr = SocketAddr::from(([10, 1, (n >> 8) as u8, n as u8], 8012));
        Arc::new(PodTracker::new(addr, 1))
    }

    /// Review finding: evidence went up with `try_send` on a bounded channel and was dropped
    /// when the channel was full, under load; a pod's failure could be lost with it.
    #[test]
    fn evidence_is_never_dropped_however_much_arrives_at_once() {
        let (link, from_shards) = ControlLink::channel();
        let revision = RevisionKey::new("ns", "rev").unwrap();
        for n in 0..10_000u32 {
            link.report(&revision, &tracker(n), EvidenceKind::TransportFailure);
        }
        assert_eq!(from_shards.evidence.len(), 10_000);
    }

    #[test]
    fn a_pod_has_one_failure_report_outstanding_until_the_control_thread_takes_it() {
        let (link, from_shards) = ControlLink::channel();
        let revision = RevisionKey::new("ns", "rev").unwrap();
        let pod = tracker(1);
        for _ in 0..100 {
            link.report(&revision, &pod, EvidenceKind::TransportFailure);
        }
        assert_eq!(from_shards.evidence.len(), 1);
        let taken = from_shards.evidence.try_recv().unwrap();
        taken.tracker.failure_report_taken();
        link.report(&revision, &pod, EvidenceKind::TransportFailure);
        assert_eq!(
            from_shards.evidence.len(),
            1,
            "the next failure is reported again"
        );
    }
}
