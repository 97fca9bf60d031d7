//! Routing snapshots: what the control thread publishes and what each shard keeps a replica of.
//!
//! The control thread owns the truth and sends per-revision updates, each stamped with a version,
//! over one channel per shard. A shard applies them to its local replica between requests, so a
//! request never waits on the control thread. Pod trackers are `Arc`s that the control thread
//! reuses by address across versions: the in-flight count of a pod survives every update.

pub mod placeholder;
pub mod priority;
pub mod replica;
pub mod rules;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::RevisionKey;

use self::priority::PriorityPolicy;
use crate::throttle::gate::{RevisionGate, WaiterId};
pub use crate::throttle::lb::LbPolicy;
use crate::throttle::slots::PodSlots;

/// Default most requests waiting for a slot per revision: 10 000, the queue depth of upstream's
/// revision breaker (`breakerQueueDepth`).
pub const DEFAULT_QUEUE_DEPTH: u32 = 10_000;

/// Default whole-request timeout per revision: 300 s, Knative's `revision-timeout-seconds`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest revision timeout accepted from any source (each of `timeoutSeconds`,
/// `responseStartTimeoutSeconds`, `idleTimeoutSeconds`): one year. A larger value is refused
/// where it enters (the file, with its position; a Revision, naming the field), never clamped.
/// Knative's own default ceiling (`max-revision-timeout-seconds`) is 600 s and clusters raise it
/// to hours, so this refuses nothing real; it keeps every deadline far inside what an `Instant`
/// and the shards' timers can represent.
pub const MAX_TIMEOUT_SECONDS: u64 = 365 * 24 * 60 * 60;

/// Wire protocol the revision's pods speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Http1,
    H2c,
}

/// The three per-request timers of a revision. Time queued in the activator counts against all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Whole request, from arrival to the end of the response (`timeoutSeconds`). Default:
    /// [`DEFAULT_TIMEOUT`] (300 s).
    pub total: Duration,
    /// Arrival to the first response byte (`responseStartTimeoutSeconds`); `None` = off.
    pub response_start: Option<Duration>,
    /// Longest gap between response writes (`idleTimeoutSeconds`); `None` = off.
    pub idle: Option<Duration>,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            total: DEFAULT_TIMEOUT,
            response_start: None,
            idle: None,
        }
    }
}

/// One pod as every shard sees it. Shared by all shards and kept across snapshot versions, so
/// its in-flight count carries over when the routing changes.
///
/// Aligned to a cache line (64 B: the tracker fits in one) so the line every shard writes for
/// this pod holds nothing of another pod. A padded counter inside it instead made each tracker
/// 512 B with its `Arc` — 50 MiB at 100 000 pods; this is 128 B.
#[derive(Debug)]
#[repr(align(64))]
pub struct PodTracker {
    /// Unique in the process: a new pod at a reused address is another tracker, and evidence
    /// about the old one must not touch it.
    pub id: u64,
    pub addr: SocketAddr,
    /// Requests this process has in flight to the pod, summed over shards, and this activator's
    /// share of containerConcurrency.
    pub slots: PodSlots,
    /// A transport failure was reported and the control thread has not taken it yet.
    failure_report_pending: AtomicBool,
}

// One line per pod: a field added to the tracker that pushes it past 64 B must say why.
const _: () = assert!(std::mem::size_of::<PodTracker>() == 64);

static NEXT_TRACKER_ID: AtomicU64 = AtomicU64::new(1);

impl PodTracker {
    pub fn new(addr: SocketAddr, capacity: u32) -> PodTracker {
        PodTracker {
            id: NEXT_TRACKER_ID.fetch_add(1, Ordering::Relaxed),
            addr,
            slots: PodSlots::new(capacity),
            failure_report_pending: AtomicBool::new(false),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.slots.in_flight()
    }

    /// A shard is about to report a transport failure: true when no earlier report still
    /// waits for the control thread (then this one is sent).
    pub fn claim_failure_report(&self) -> bool {
        !self.failure_report_pending.swap(true, Ordering::AcqRel)
    }

    /// The control thread took the failure report: the next failure is reported again.
    pub fn failure_report_taken(&self) {
        self.failure_report_pending.store(false, Ordering::Release);
    }
}

/// What one shard sends another about a revision's admission (see `throttle::gate`), over the
/// receiving shard's mailbox.
#[derive(Debug)]
pub enum Handoff {
    /// A slot on a pod, handed from the shard that found it free to the shard whose waiter is
    /// next to serve.
    Grant {
        key: RevisionKey,
        pod: Arc<PodTracker>,
    },
    /// Shed a waiter of a band below `below` for request `waiter` of shard `from`, whose queue
    /// is full (`throttle::gate::Effect::Evict`). `gate` tells this revision from a later one
    /// of the same name.
    Evict {
        key: RevisionKey,
        gate: Arc<RevisionGate>,
        below: u8,
        from: usize,
        waiter: WaiterId,
    },
    /// The answer to an [`Handoff::Evict`]: `placed` when a waiter was shed, whose places in
    /// the revision's queue and the process's this carries to `waiter`.
    Place {
        key: RevisionKey,
        gate: Arc<RevisionGate>,
        waiter: WaiterId,
        placed: bool,
    },
}

pub use crate::metrics::RevisionLabels;

/// Everything a shard needs to route one revision, as of one version.
#[derive(Debug)]
pub struct RevisionRoute {
    pub key: RevisionKey,
    pub labels: RevisionLabels,
    /// Per-pod concurrency limit; 0 = unlimited.
    pub container_concurrency: u32,
    pub protocol: Protocol,
    pub timeouts: Timeouts,
    pub lb_policy: LbPolicy,
    /// Routable pods, sorted by address.
    pub pods: Vec<Arc<PodTracker>>,
    /// Cross-shard admission; the same object in every version of the revision.
    pub gate: Arc<RevisionGate>,
    /// Most requests that may wait for this revision (★ upstream's queue is unbounded).
    pub queue_depth: u32,
    /// Priority bands and fairness among its waiters (issue 27); `None` (the default): arrival
    /// order.
    pub priority: Option<PriorityPolicy>,
    /// TLS to the revision's pods (Knative's `system-internal-tls`, or the file's per-revision
    /// setting); `None`: plain TCP.
    pub upstream_tls: Option<Arc<crate::runtime::tls::UpstreamTls>>,
    /// The rules that route a request here (KEDA's HTTP add-on role, issue 40: an
    /// HTTPScaledObject's hosts, path prefixes and headers); `None`: a request names the
    /// revision itself (the Knative roles).
    pub rules: Option<Arc<RouteRules>>,
    /// What a request that waits for the route's first pod may do (KEDA's HTTP add-on role);
    /// the default: wait until its own deadline.
    pub cold_start: ColdStart,
}

/// How long a request waits for a route with no routable pod, and where it goes then (KEDA's
/// HTTP add-on's readiness timeout and `coldStartTimeoutFailoverRef`), or what answers it at
/// once instead (its placeholder).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColdStart {
    /// Longest wait that began without a routable pod; `None`: the request's own deadline.
    pub wait: Option<Duration>,
    /// The route a request that waited that long goes to instead (its pods are the failover
    /// Service's); `None`: it is answered 504.
    pub failover: Option<RevisionKey>,
    /// A request that arrives while the route has no routable pod is answered this at once
    /// (but see `hold_before_placeholder`).
    pub placeholder: Option<Arc<placeholder::Placeholder>>,
    /// With a placeholder: requests wait for a pod as any, up to the route's queue bound, and
    /// the placeholder answers only those a full queue turns away while there is no routable
    /// pod (KEDA's add-on 0.16: `overflow: Placeholder` with an explicit
    /// `maxPendingRequests`).
    pub hold_before_placeholder: bool,
}

/// A route's rules and what orders it among routes whose rules tie ([`rules::RuleTable`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteRules {
    pub order: rules::RouteOrder,
    pub rules: Vec<rules::Rule>,
    /// Its static routes, in order ([`placeholder::StaticRoute`]).
    pub statics: Vec<placeholder::StaticRoute>,
}

/// One change to the routing table.
#[derive(Clone, Debug)]
pub enum RoutingUpdate {
    /// Add a revision or replace its route.
    Upsert {
        version: u64,
        route: Arc<RevisionRoute>,
    },
    /// The revision is gone.
    Remove { version: u64, key: RevisionKey },
}

impl RoutingUpdate {
    pub fn version(&self) -> u64 {
        match self {
            RoutingUpdate::Upsert { version, .. } | RoutingUpdate::Remove { version, .. } => {
                *version
            }
        }
    }
}

/// Everything the control thread tells a shard. It only ever flows control → shard.
#[derive(Clone, Debug)]
pub enum ShardCommand {
    Routing(RoutingUpdate),
    /// Readiness is already failing; keep serving requests but report draining on probes.
    BeginDrain,
    /// Stop accepting, close idle connections, finish in-flight work, then exit.
    StopAccepting,
    /// The TLS data port's certificates and settings from now on: new handshakes use them,
    /// connections already open keep theirs. `None`: none to offer (a TLS connection is closed).
    ServerTls(Option<std::sync::Arc<rustls::ServerConfig>>),
    /// Tracing from now on (issue 39): `None` off (propagation headers pass untouched, no
    /// span recorded); else new requests are traced, new traces sampled by the sampler.
    Tracing(Option<kactivator_api::trace::Sampler>),
}
