//! What the shards tell the control thread: queue-proxy registrations received on the data
//! port, and passive health signals about pods. The control thread only ever answers
//! registrations; routing still flows the other way, as snapshots.

use kactivator_api::RevisionKey;
use std::net::SocketAddr;

/// One message from a shard.
#[derive(Debug)]
pub enum ToControl {
    /// A registration body, as received. The control thread parses, applies and answers it.
    Registration {
        body: Vec<u8>,
        /// Sent by a peer activator rather than a queue-proxy.
        relayed: bool,
        reply: flume::Sender<Reply>,
    },
    /// Something a request found out about a pod.
    Signal(PodSignal),
}

/// The control thread's answer to a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// `application/json` rather than plain text.
    pub json: bool,
}

/// Passive evidence about a pod, seen on the request path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSignal {
    /// The revision the request was for.
    pub revision: RevisionKey,
    pub pod: SocketAddr,
    pub kind: SignalKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SignalKind {
    /// Dialing failed (refused, reset, unreachable, timed out) or the pod dropped the connection
    /// before answering: counts as a failed health check.
    TransportFailure,
    /// The pod answered as another revision: its IP was reused.
    IpReused { namespace: String, revision: String },
}

/// The shards' sending side. Registrations wait for room; signals are dropped (and counted by
/// the caller) when the channel is full, since the request path never waits on the control
/// thread.
#[derive(Clone, Debug)]
pub struct ControlLink {
    tx: flume::Sender<ToControl>,
}

/// Messages the channel holds.
pub const CONTROL_LINK_CAPACITY: usize = 4096;

impl ControlLink {
    pub fn channel() -> (ControlLink, flume::Receiver<ToControl>) {
        let (tx, rx) = flume::bounded(CONTROL_LINK_CAPACITY);
        (ControlLink { tx }, rx)
    }

    /// A link to nowhere (tests and tools without a control thread).
    pub fn disconnected() -> ControlLink {
        let (tx, _) = flume::bounded(1);
        ControlLink { tx }
    }

    /// Hands a registration over and waits for the answer.
    pub async fn register(&self, body: Vec<u8>, relayed: bool) -> Reply {
        let (reply, answer) = flume::bounded(1);
        let unavailable = || Reply {
            status: 503,
            body: kactivator_api::messages::CONTROL_PLANE_UNAVAILABLE.into(),
            json: false,
        };
        if self
            .tx
            .send_async(ToControl::Registration {
                body,
                relayed,
                reply,
            })
            .await
            .is_err()
        {
            return unavailable();
        }
        answer.recv_async().await.unwrap_or_else(|_| unavailable())
    }

    /// Reports a signal unless the channel is full. True if it was queued.
    pub fn signal(&self, signal: PodSignal) -> bool {
        self.tx.try_send(ToControl::Signal(signal)).is_ok()
    }
}
