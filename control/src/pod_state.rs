//! The pod state machine: what one pod tracker's routing state becomes on each queue-proxy push,
//! informer/prober reconciliation, health signal and quarantine timer. Pure and sans-IO: the
//! clock and the in-flight count are passed in; nothing here awaits, locks or reads a clock.
//!
//! The state worker owns one [`Pod`] per tracker and feeds it [`Event`]s in order. Each call
//! returns an [`Outcome`] saying what changed and why, so the worker can publish a snapshot,
//! recalculate capacity when [`PodState::is_routable`] flipped, and count the transition under
//! [`Reason::label`].
//!
//! # Time
//!
//! [`Timestamp`] is an offset from an epoch the caller picks (the control thread uses a monotonic
//! clock read at start-up) and must keep for the life of the process. Tests use seconds from 0.
//!
//! # Who is authoritative (gate `queueproxy.pod-authority` on)
//!
//! The queue-proxy (QP) pushes `startup`, `ready`, `not-ready` and `draining`; the informer (the
//! probed-healthy endpoints) lists or omits the pod. A QP event always applies when it arrives.
//! Afterwards its age decides whether the informer may contradict it ([`Pod::authority`]):
//!
//! | last QP event                      | age < `qp_freshness` (30 s)                        | `qp_freshness` ≤ age < `qp_staleness` (30–60 s)   | age ≥ `qp_staleness` (60 s), or never heard |
//! |------------------------------------|----------------------------------------------------|---------------------------------------------------|---------------------------------------------|
//! | `ready`                            | QP: an informer omission does not demote a Ready pod | informer                                        | informer                                    |
//! | `startup`, `not-ready`, `draining` | QP: an informer listing does not promote           | QP: an informer listing does not promote          | informer                                    |
//!
//! With the gate off the informer is always authoritative and QP events only refresh the record
//! of the last event ([`Pod::last_queue_proxy_event`]).
//!
//! Why the band between the two windows is asymmetric: doubt favours keeping a pod *out* of
//! routing. Wrongly routing to a pod that said it is not ready fails user requests; wrongly
//! withholding a pod only delays them, and for at most `qp_staleness`. So a `ready` shields a
//! pod from the informer only while fresh, but a `not-ready` keeps it out until stale. (The fork
//! used 60 s for both and left its 30 s constant unused.)
//!
//! # Transitions
//!
//! "—" is a pod not yet tracked ([`Pod::first_seen`]). Gates: **A** = pod authority on, **Q** =
//! pod quarantine on; a row without a gate holds in every mode. "Unchanged" never changes
//! routing; QP events still record themselves as the last QP event. ★ marks a deliberate
//! departure from the fork (see below).
//!
//! | from                     | event                           | gates / condition                                   | to                | reason                | test                                                            |
//! |--------------------------|---------------------------------|-----------------------------------------------------|-------------------|-----------------------|-----------------------------------------------------------------|
//! | —                        | QP `ready`                      | A                                                   | Ready             | `qp-ready`            | `first_qp_ready_creates_a_ready_pod`                            |
//! | —                        | QP `not-ready`                  | A                                                   | NotReady          | `qp-not-ready`        | `first_qp_not_ready_creates_a_not_ready_pod`                    |
//! | —                        | QP `startup`                    | A                                                   | NotReady          | `qp-startup`          | `startup_for_an_unknown_pod_creates_it_not_ready`               |
//! | —                        | QP `ready`/`not-ready`/`startup`| not A ★                                             | NotReady          | `informer-pending`    | `first_qp_event_creates_a_pending_pod_when_authority_is_off`    |
//! | —                        | QP `draining`                   |                                                     | not created       |                       | `draining_for_an_unknown_pod_is_ignored_in_every_mode`          |
//! | —                        | informer lists                  |                                                     | Ready             | `informer-added`      | `informer_listing_creates_a_ready_pod_in_every_mode`            |
//! | —                        | anything else                   |                                                     | not created       |                       | `other_events_do_not_create_a_pod`                              |
//! | NotReady                 | QP `ready`                      | A                                                   | Ready             | `qp-ready`            | `qp_ready_promotes_not_ready`                                   |
//! | Ready                    | QP `ready`                      | A                                                   | Unchanged         |                       | `qp_ready_on_ready_only_refreshes_freshness`                    |
//! | Quarantined, Recovering  | QP `ready`                      | A, Q                                                | Unchanged         |                       | `qp_ready_does_not_lift_quarantine`                             |
//! | Quarantined, Recovering  | QP `ready`                      | A, not Q ★                                          | Ready             | `qp-ready`            | `qp_ready_releases_a_pod_left_in_quarantine_when_quarantine_is_off` |
//! | Ready                    | QP `not-ready`                  | A                                                   | NotReady          | `qp-not-ready`        | `qp_not_ready_demotes_ready`                                    |
//! | NotReady                 | QP `not-ready`                  | A                                                   | Unchanged         |                       | `qp_not_ready_on_not_ready_is_a_no_op`                          |
//! | Recovering               | QP `not-ready`                  | A                                                   | Unchanged         |                       | `qp_not_ready_does_not_change_recovering`                       |
//! | Quarantined              | QP `not-ready`                  | A                                                   | Unchanged         |                       | `qp_not_ready_does_not_change_quarantined`                      |
//! | Ready, Recovering        | QP `draining`                   | A                                                   | NotReady          | `qp-draining`         | `qp_draining_takes_ready_and_recovering_out_of_routing`         |
//! | NotReady                 | QP `draining`                   | A                                                   | Unchanged         | becomes `qp-draining` | `qp_draining_on_not_ready_only_updates_the_reason`              |
//! | Quarantined              | QP `draining`                   | A ★                                                 | NotReady          | `qp-draining`         | `qp_draining_takes_a_quarantined_pod_out_for_good`              |
//! | any                      | QP `startup`                    | A ★                                                 | Unchanged         |                       | `startup_for_a_known_pod_is_a_no_op`                            |
//! | any                      | any QP event                    | not A                                               | Unchanged         |                       | `qp_events_only_refresh_freshness_when_authority_is_off`        |
//! | NotReady                 | informer lists                  | A, QP silent                                        | Ready             | `informer-promoted`   | `informer_promotes_not_ready_when_the_queue_proxy_is_silent`    |
//! | NotReady                 | informer lists                  | A, QP `not-ready` < `qp_freshness`                  | Unchanged         |                       | `qp_not_ready_blocks_informer_promotion_while_fresh`            |
//! | NotReady                 | informer lists                  | A, QP `not-ready` < `qp_staleness`                  | Unchanged         |                       | `qp_not_ready_blocks_informer_promotion_until_staleness`        |
//! | NotReady                 | informer lists                  | A, QP `not-ready` ≥ `qp_staleness`                  | Ready             | `informer-promoted`   | `informer_promotes_not_ready_after_qp_staleness`                |
//! | NotReady                 | informer lists                  | A, last QP event `ready` (any age)                  | Ready             | `informer-promoted`   | `informer_promotes_not_ready_whose_last_qp_event_was_ready`     |
//! | NotReady                 | informer lists                  | not A ★                                             | Ready             | `informer-promoted`   | `informer_promotes_not_ready_when_authority_is_off`             |
//! | Ready                    | informer lists                  |                                                     | Unchanged         |                       | `informer_listing_leaves_ready_unchanged`                       |
//! | Quarantined, Recovering  | informer lists                  | Q                                                   | Unchanged         |                       | `informer_listing_does_not_force_recovering_or_quarantined_to_ready` |
//! | Quarantined, Recovering  | informer lists                  | not Q ★ (same QP rule as NotReady)                  | Ready             | `informer-promoted`   | `informer_releases_a_pod_left_in_quarantine_when_quarantine_is_off` |
//! | Ready                    | informer omits                  | A, QP `ready` < `qp_freshness`                      | Unchanged         |                       | `fresh_qp_ready_protects_against_informer_removal`              |
//! | Ready                    | informer omits                  | A, QP `ready` ≥ `qp_freshness` ★                    | as the next rows  |                       | `qp_ready_older_than_freshness_no_longer_protects_against_removal` |
//! | Ready, Recovering        | informer omits                  | in flight = 0                                       | **Remove**        | `informer-removed`    | `informer_removal_deletes_an_idle_ready_pod`                    |
//! | Ready, Recovering        | informer omits                  | in flight > 0                                       | NotReady          | `informer-removed`    | `informer_removal_keeps_a_busy_pod_not_ready_until_idle`        |
//! | Recovering               | informer omits                  | a fresh QP `ready` does not protect it              | as above          |                       | `informer_removal_of_recovering_ignores_qp_freshness`           |
//! | NotReady                 | informer omits                  | in flight = 0 / > 0                                 | **Remove** / Unchanged | `informer-removed` | `informer_removal_of_not_ready_waits_for_in_flight_requests`    |
//! | Quarantined              | informer omits                  | in flight = 0 / > 0 ★                               | **Remove** / NotReady | `informer-removed` | `informer_removal_of_quarantined_waits_for_in_flight_requests`  |
//! | Ready                    | health check failed             | Q                                                   | Quarantined       | `health-check-failed` | `health_check_failure_quarantines_ready_with_backoff`           |
//! | Recovering               | health check failed             | Q                                                   | Quarantined       | `health-check-failed` | `health_check_failure_on_recovering_requarantines_with_a_longer_backoff` |
//! | NotReady, Quarantined    | health check failed             | Q                                                   | Unchanged         |                       | `health_check_failure_on_not_ready_or_quarantined_is_ignored`   |
//! | Quarantined              | quarantine expired              | Q, now ≥ quarantine end / now < end                 | Recovering / Unchanged | `quarantine-expired` | `quarantine_expiry_moves_to_recovering_only_when_due`        |
//! | Recovering               | request succeeded, check passed | Q                                                   | Ready             | `recovered`           | `success_on_recovering_promotes_to_ready_and_resets_the_count`  |
//! | Ready, NotReady, Quarantined | request succeeded, check passed | Q                                               | Unchanged         |                       | `success_outside_recovering_changes_nothing`                    |
//! | any                      | any health event or expiry      | not Q                                               | Unchanged         |                       | `health_events_are_ignored_when_quarantine_is_off`              |
//! | any                      | IP reused by another revision   | any in-flight count                                 | **Remove**        | `ip-reused`           | `ip_reuse_removes_the_pod_in_every_state_and_mode`              |
//!
//! Routable ([`PodState::is_routable`]): Ready only, whatever the gates. ★ Recovering is not
//! routable: the pod was failing, so the prober checks it at once and only a passing probe
//! (`HealthCheckPassed`) makes it Ready; no user request is the first to touch it (the fork
//! routed Recovering on probation). NotReady and Quarantined never.
//! Tests: `only_ready_is_routable_whatever_the_gates`,
//! `only_ready_pods_of_a_mixed_set_are_routable`.
//!
//! Quarantine backoff by consecutive quarantine count: 1 → 1 s, 2 → 1 s, 3 → 2 s, 4 → 3 s,
//! 5 and more → 5 s ([`Pod::quarantine_backoff`], test `quarantine_backoff_follows_the_schedule`).
//! The count is the number of quarantines since the pod was last Ready: it resets whenever the
//! pod becomes Ready.
//!
//! Stale ([`Pod::is_stale`]): NotReady for more than 10 min, measured from when it became
//! NotReady, with nothing in flight. Tests: `not_ready_pod_is_stale_ten_minutes_after_it_became_not_ready`,
//! `busy_or_routable_pods_are_never_stale`.
//!
//! # Removal never drops in-flight requests
//!
//! [`Outcome::Remove`] means "delete the tracker now". The informer paths return it only when the
//! caller said nothing is in flight; otherwise the pod goes NotReady (out of routing at once) and
//! the caller asks again on its next reconciliation, or the stale sweep ([`Pod::is_stale`])
//! collects it. Keeping the tracker while requests run keeps its in-flight count, so a pod that
//! comes back is never handed more than containerConcurrency requests. The one exception is
//! [`Event::IpReused`]: the address now serves another revision, so this revision's tracker goes
//! at once whatever is in flight (those requests keep their own slot handles and finish).
//!
//! # Where this differs from the fork
//!
//! * ★ `startup` for a known pod is a no-op; the fork crashed the activator (`Fatalw`).
//! * ★ With QP authority off the informer promotes NotReady pods; the fork had no promotion
//!   path, so such a pod stayed NotReady until deleted.
//! * ★ With QP authority off a QP event for an unknown pod creates it NotReady
//!   (`informer-pending`) for the informer to promote; the fork created it Ready
//!   (`informer-added`) whatever the event — even `not-ready` — to make up for the missing
//!   promotion path. "With the gate off, events refresh freshness only" (SPEC §4).
//! * ★ Two windows: a `ready` protects against informer removal for `qp_freshness` (30 s; the
//!   fork: 60 s), a non-ready event blocks informer promotion for `qp_staleness` (60 s, as the
//!   fork). Staleness is "age ≥ 60 s"; the fork compared whole Unix seconds with "> 60".
//! * ★ A Quarantined pod the informer omits is removed only once nothing is in flight (the fork
//!   deleted it at once); until then it is NotReady, so its quarantine can no longer expire into
//!   Recovering and route again.
//! * ★ QP `draining` takes a Quarantined pod to NotReady; in the fork it stayed Quarantined and
//!   came back as Recovering (routable) when the quarantine expired, while shutting down.
//! * ★ With quarantine off, a pod left Quarantined or Recovering by an earlier setting (the gate
//!   is hot-reloaded) is treated as NotReady: QP `ready` or an informer listing promote it. In
//!   the fork it stayed unroutable until the informer dropped it.
//! * ★ Stale NotReady pods are measured from when they became NotReady, not from creation: the
//!   fork collected a pod created 10 min ago one second after it went NotReady.
//! * The quarantine count resets whenever the pod becomes Ready; the fork reset it only on the
//!   Recovering → Ready path.

use std::fmt;
use std::ops::Add;
use std::time::Duration;

/// Default of [`Windows::qp_freshness`]: 30 s, the figure of the fork's (unused)
/// `QPFreshnessNotReadyWindow`; the fork protected `ready` pods for 60 s (module doc, ★).
pub const DEFAULT_QP_FRESHNESS: Duration = Duration::from_secs(30);

/// Default of [`Windows::qp_staleness`]: 60 s, the fork's `QPStalenessThreshold`.
pub const DEFAULT_QP_STALENESS: Duration = Duration::from_secs(60);

/// How long a pod must have been NotReady, with nothing in flight, before the stale sweep may
/// collect it (fork `PodNotReadyStaleThreshold`).
pub const STALE_NOT_READY_AFTER: Duration = Duration::from_secs(10 * 60);

/// Quarantine length in seconds by consecutive quarantine count 1, 2, 3, 4, 5+ (fork
/// `quarantineBackoffSeconds`: short first steps so a transient blip costs little).
const QUARANTINE_BACKOFF_SECONDS: [u64; 5] = [1, 1, 2, 3, 5];

// === Time ===

/// A point in time, as an offset from an epoch the caller chose (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(Duration);

impl Timestamp {
    pub const fn from_epoch_offset(offset: Duration) -> Timestamp {
        Timestamp(offset)
    }

    pub const fn epoch_offset(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to `self`; zero if `earlier` is in fact later, so a caller that
    /// mixes clocks gets "just now" rather than a panic.
    pub fn elapsed_since(self, earlier: Timestamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;

    /// Saturates instead of panicking: no input may crash the state worker.
    fn add(self, duration: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration))
    }
}

// === Configuration ===

/// The two feature gates of `config-features`, hot-reloaded; the caller snapshots them once per
/// op so one op sees one setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gates {
    /// `queueproxy.pod-authority`: queue-proxy pushes change pod state. Default on.
    pub pod_authority: bool,
    /// `activator.pod-quarantine`: health failures quarantine pods, and the prober checks them.
    /// Default on.
    pub pod_quarantine: bool,
}

impl Gates {
    /// Both gates on: the production default.
    pub const HYBRID: Gates = Gates {
        pod_authority: true,
        pod_quarantine: true,
    };
    pub const QUEUE_PROXY_ONLY: Gates = Gates {
        pod_authority: true,
        pod_quarantine: false,
    };
    pub const QUARANTINE_ONLY: Gates = Gates {
        pod_authority: false,
        pod_quarantine: true,
    };
    /// Both gates off: upstream Knative behaviour, the informer alone decides.
    pub const MINIMAL: Gates = Gates {
        pod_authority: false,
        pod_quarantine: false,
    };

    /// The mode's name, for logs and the admin page.
    pub fn mode_label(self) -> &'static str {
        match (self.pod_authority, self.pod_quarantine) {
            (true, true) => "hybrid",
            (true, false) => "queue-proxy-only",
            (false, true) => "quarantine-only",
            (false, false) => "minimal",
        }
    }
}

impl Default for Gates {
    fn default() -> Gates {
        Gates::HYBRID
    }
}

/// How long a queue-proxy event outweighs the informer (the table in the module doc). Meant to
/// satisfy `qp_freshness <= qp_staleness`; the rules stay well defined if it does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Windows {
    /// `qp-freshness`: a `ready` younger than this keeps a Ready pod routed even when the
    /// informer omits it. Defaults to 30 seconds ([`DEFAULT_QP_FRESHNESS`]).
    pub qp_freshness: Duration,
    /// `qp-staleness`: a `startup`, `not-ready` or `draining` younger than this keeps the
    /// informer from promoting the pod; from this age on the informer decides. Defaults to
    /// 60 seconds ([`DEFAULT_QP_STALENESS`]).
    pub qp_staleness: Duration,
}

impl Default for Windows {
    fn default() -> Windows {
        Windows {
            qp_freshness: DEFAULT_QP_FRESHNESS,
            qp_staleness: DEFAULT_QP_STALENESS,
        }
    }
}

// === Vocabulary ===

/// A pod tracker's routing state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodState {
    /// Serving; routable.
    Ready,
    /// Starting, failing readiness, draining or leaving; not routable.
    NotReady,
    /// Failed a health check; not routable until its backoff expires.
    Quarantined,
    /// Quarantine expired; on probation, not routable, until a passing probe makes it Ready.
    Recovering,
}

impl PodState {
    /// Every state, e.g. for exporting each one's gauge from the start.
    pub const ALL: [PodState; 4] = [
        PodState::Ready,
        PodState::NotReady,
        PodState::Quarantined,
        PodState::Recovering,
    ];

    /// Whether requests may be sent to a pod in this state: Ready only, whatever the gates. ★ A
    /// Recovering pod was failing; it is probed at once and routes again only once a probe
    /// passed, so no user request is the first to touch it (the fork routed it on probation).
    pub fn is_routable(self) -> bool {
        match self {
            PodState::Ready => true,
            PodState::Recovering | PodState::NotReady | PodState::Quarantined => false,
        }
    }

    /// Metric and log label (the fork's `from_state`/`to_state` values).
    pub fn label(self) -> &'static str {
        match self {
            PodState::Ready => "ready",
            PodState::NotReady => "not-ready",
            PodState::Quarantined => "quarantined",
            PodState::Recovering => "recovering",
        }
    }
}

impl fmt::Display for PodState {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.label())
    }
}

pub use kactivator_api::registration::QueueProxyEvent;

/// The reason a queue-proxy event gives a transition.
fn queue_proxy_reason(event: QueueProxyEvent) -> Reason {
    match event {
        QueueProxyEvent::Startup => Reason::QueueProxyStartup,
        QueueProxyEvent::Ready => Reason::QueueProxyReady,
        QueueProxyEvent::NotReady => Reason::QueueProxyNotReady,
        QueueProxyEvent::Draining => Reason::QueueProxyDraining,
    }
}

/// Something that happened to one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// The pod's queue-proxy pushed a registration event.
    QueueProxy(QueueProxyEvent),
    /// The informer/prober lists the pod among the revision's healthy endpoints.
    InformerListed,
    /// The informer/prober no longer lists the pod. `in_flight` is this process's count of
    /// requests running on it, summed over shards: removal waits for it to reach zero.
    InformerOmitted { in_flight: u32 },
    /// An active probe failed or the proxy saw a passive failure (connect refused or reset).
    HealthCheckFailed,
    /// An active probe passed.
    HealthCheckPassed,
    /// The quarantine timer fired; honoured only once the quarantine end has passed, so a timer
    /// left over from an earlier quarantine is harmless.
    QuarantineExpired,
    /// A proxied request on this pod succeeded. No source sends it: only a Recovering pod
    /// would react, and a Recovering pod takes no requests (the prober's `HealthCheckPassed`
    /// ends probation).
    RequestSucceeded,
    /// A response named another revision in `X-Knative-Revision-Name`/`-Namespace`: the address
    /// now belongs to a different pod.
    IpReused,
}

/// Why a pod is in its state. [`Reason::label`] is both the log field and the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// QP `ready`.
    QueueProxyReady,
    /// QP `not-ready`.
    QueueProxyNotReady,
    /// QP `draining`.
    QueueProxyDraining,
    /// QP `startup` for a pod not yet tracked.
    QueueProxyStartup,
    /// The informer listed a pod not yet tracked.
    InformerAdded,
    /// Known from a QP push while QP authority is off: waits for the informer.
    InformerPending,
    /// The informer listed a NotReady pod and no fresh QP word forbade it.
    InformerPromoted,
    /// The informer stopped listing the pod.
    InformerRemoved,
    /// A health check failed: quarantined.
    HealthCheckFailed,
    /// The quarantine backoff elapsed: on probation.
    QuarantineExpired,
    /// A success on probation: back to Ready.
    Recovered,
    /// The address now serves another revision.
    IpReused,
    /// Recorded by the caller when it collects a pod for which [`Pod::is_stale`] holds.
    Stale,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::QueueProxyReady => "qp-ready",
            Reason::QueueProxyNotReady => "qp-not-ready",
            Reason::QueueProxyDraining => "qp-draining",
            Reason::QueueProxyStartup => "qp-startup",
            Reason::InformerAdded => "informer-added",
            Reason::InformerPending => "informer-pending",
            Reason::InformerPromoted => "informer-promoted",
            Reason::InformerRemoved => "informer-removed",
            Reason::HealthCheckFailed => "health-check-failed",
            Reason::QuarantineExpired => "quarantine-expired",
            Reason::Recovered => "recovered",
            Reason::IpReused => "ip-reused",
            Reason::Stale => "stale",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.label())
    }
}

/// Whose word decides what the informer may do to a pod right now (the table in the module
/// doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Authority {
    /// The informer: QP authority is off, the QP never spoke, or its word is too old.
    Informer,
    /// A fresh QP `ready`: an informer omission does not demote a Ready pod.
    QueueProxyReady,
    /// A QP `startup`, `not-ready` or `draining` not yet stale: an informer listing does not
    /// promote the pod.
    QueueProxyNotReady,
}

/// What [`Pod::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Routing state unchanged (a QP event was still recorded; a NotReady pod's reason may have
    /// been refined to `qp-draining`).
    Unchanged,
    /// The pod changed state.
    Transition {
        from: PodState,
        to: PodState,
        reason: Reason,
    },
    /// Delete the tracker now. `from` is the state it left, so the caller can settle gauges
    /// (a Quarantined pod leaves the quarantine gauge). Until the caller drops it, the pod is
    /// NotReady.
    Remove { from: PodState, reason: Reason },
}

// === Pod ===

/// One pod tracker's state-machine half: state, reason and the timing the rules need. The
/// in-flight count lives with the shards' slots and is passed in where a rule depends on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    state: PodState,
    reason: Reason,
    /// The last QP event and when it arrived; recorded in every gate mode.
    last_queue_proxy_event: Option<(QueueProxyEvent, Timestamp)>,
    /// Quarantines since the pod was last Ready (drives the backoff).
    quarantine_count: u32,
    /// Invariant: `Some` exactly while the state is Quarantined.
    quarantine_until: Option<Timestamp>,
    created_at: Timestamp,
    /// When `state` last changed; a refined reason does not move it.
    state_since: Timestamp,
}

impl Pod {
    /// A pod seen for the first time, from a QP event or from the informer. `None` when the
    /// event must not create a tracker: a `draining` pod is on its way out (fork: ignored in
    /// every mode), and omissions, health signals, timers and IP reuse only concern pods
    /// already tracked.
    pub fn first_seen(event: Event, gates: Gates, now: Timestamp) -> Option<Pod> {
        let (state, reason) = match event {
            Event::QueueProxy(QueueProxyEvent::Draining) => return None,
            // Without authority a push may not make a pod routable; it only pre-creates the
            // tracker so the informer's listing can promote it.
            Event::QueueProxy(_) if !gates.pod_authority => {
                (PodState::NotReady, Reason::InformerPending)
            }
            Event::QueueProxy(QueueProxyEvent::Ready) => (PodState::Ready, Reason::QueueProxyReady),
            Event::QueueProxy(queue_proxy_event) => {
                (PodState::NotReady, queue_proxy_reason(queue_proxy_event))
            }
            Event::InformerListed => (PodState::Ready, Reason::InformerAdded),
            Event::InformerOmitted { .. }
            | Event::HealthCheckFailed
            | Event::HealthCheckPassed
            | Event::QuarantineExpired
            | Event::RequestSucceeded
            | Event::IpReused => return None,
        };
        let last_queue_proxy_event = match event {
            Event::QueueProxy(queue_proxy_event) => Some((queue_proxy_event, now)),
            _ => None,
        };
        Some(Pod {
            state,
            reason,
            last_queue_proxy_event,
            quarantine_count: 0,
            quarantine_until: None,
            created_at: now,
            state_since: now,
        })
    }

    /// Applies one event to a tracked pod; see the transition table in the module doc.
    pub fn apply(
        &mut self,
        event: Event,
        gates: Gates,
        windows: Windows,
        now: Timestamp,
    ) -> Outcome {
        match event {
            Event::QueueProxy(queue_proxy_event) => {
                self.on_queue_proxy(queue_proxy_event, gates, now)
            }
            Event::InformerListed => self.on_informer_listed(gates, windows, now),
            Event::InformerOmitted { in_flight } => {
                self.on_informer_omitted(in_flight, gates, windows, now)
            }
            Event::HealthCheckFailed
            | Event::HealthCheckPassed
            | Event::QuarantineExpired
            | Event::RequestSucceeded
                if !gates.pod_quarantine =>
            {
                Outcome::Unchanged
            }
            Event::HealthCheckFailed => match self.state {
                PodState::Ready | PodState::Recovering => self.quarantine(now),
                // NotReady takes no traffic to protect; Quarantined is already out, and failures
                // of requests that started before the quarantine must not stretch it.
                PodState::NotReady | PodState::Quarantined => Outcome::Unchanged,
            },
            Event::QuarantineExpired => match self.quarantine_until {
                Some(until) if self.state == PodState::Quarantined && now >= until => {
                    self.transition(PodState::Recovering, Reason::QuarantineExpired, now)
                }
                _ => Outcome::Unchanged,
            },
            Event::HealthCheckPassed | Event::RequestSucceeded => match self.state {
                PodState::Recovering => self.transition(PodState::Ready, Reason::Recovered, now),
                // A quarantine lasts its whole backoff even if a probe passes meanwhile.
                PodState::Ready | PodState::NotReady | PodState::Quarantined => Outcome::Unchanged,
            },
            Event::IpReused => self.remove(Reason::IpReused, now),
        }
    }

    /// Whether requests may be sent to this pod now.
    pub fn is_routable(&self) -> bool {
        self.state.is_routable()
    }

    /// Whether the stale sweep may delete this pod: NotReady for more than
    /// [`STALE_NOT_READY_AFTER`] with nothing in flight. Measured from when it became NotReady,
    /// so a long-lived pod that just went NotReady gets the full grace period.
    pub fn is_stale(&self, now: Timestamp, in_flight: u32) -> bool {
        self.state == PodState::NotReady
            && in_flight == 0
            && now.elapsed_since(self.state_since) > STALE_NOT_READY_AFTER
    }

    /// Quarantine length for the `count`-th consecutive quarantine: 1, 1, 2, 3, then 5 s for
    /// every later one. A count of 0 never reaches here; it gets the first step.
    pub fn quarantine_backoff(count: u32) -> Duration {
        let step = (count.saturating_sub(1) as usize).min(QUARANTINE_BACKOFF_SECONDS.len() - 1);
        Duration::from_secs(QUARANTINE_BACKOFF_SECONDS[step])
    }

    /// Whose word decides what the informer may do to this pod at `now`.
    pub fn authority(&self, gates: Gates, windows: Windows, now: Timestamp) -> Authority {
        if !gates.pod_authority {
            return Authority::Informer;
        }
        let Some((event, at)) = self.last_queue_proxy_event else {
            return Authority::Informer;
        };
        let age = now.elapsed_since(at);
        match event {
            QueueProxyEvent::Ready if age < windows.qp_freshness => Authority::QueueProxyReady,
            QueueProxyEvent::Ready => Authority::Informer,
            QueueProxyEvent::Startup | QueueProxyEvent::NotReady | QueueProxyEvent::Draining
                if age < windows.qp_staleness =>
            {
                Authority::QueueProxyNotReady
            }
            QueueProxyEvent::Startup | QueueProxyEvent::NotReady | QueueProxyEvent::Draining => {
                Authority::Informer
            }
        }
    }

    pub fn state(&self) -> PodState {
        self.state
    }

    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The last QP event and when it arrived, in every gate mode.
    pub fn last_queue_proxy_event(&self) -> Option<(QueueProxyEvent, Timestamp)> {
        self.last_queue_proxy_event
    }

    pub fn quarantine_count(&self) -> u32 {
        self.quarantine_count
    }

    /// When a Quarantined pod may become Recovering: the caller arms its timer for this.
    pub fn quarantine_until(&self) -> Option<Timestamp> {
        self.quarantine_until
    }

    pub fn created_at(&self) -> Timestamp {
        self.created_at
    }

    /// When the state last changed.
    pub fn state_since(&self) -> Timestamp {
        self.state_since
    }

    fn on_queue_proxy(&mut self, event: QueueProxyEvent, gates: Gates, now: Timestamp) -> Outcome {
        // Recorded in every mode: with authority off this is all a QP event does, and it is
        // what the informer rules consult once authority is turned back on.
        self.last_queue_proxy_event = Some((event, now));
        if !gates.pod_authority {
            return Outcome::Unchanged;
        }
        let left_in_quarantine = !gates.pod_quarantine
            && matches!(self.state, PodState::Quarantined | PodState::Recovering);
        match (event, self.state) {
            // The fork crashed here. `startup` carries no readiness news for a pod already
            // tracked (readiness arrives as `ready`/`not-ready`), so it is only recorded.
            (QueueProxyEvent::Startup, _) => Outcome::Unchanged,
            (QueueProxyEvent::Ready, PodState::NotReady) => {
                self.transition(PodState::Ready, Reason::QueueProxyReady, now)
            }
            (QueueProxyEvent::Ready, _) if left_in_quarantine => {
                self.transition(PodState::Ready, Reason::QueueProxyReady, now)
            }
            // QP readiness does not vouch for what a health check found: it cannot lift a
            // quarantine or cut probation short (acceptance case 20).
            (QueueProxyEvent::Ready, _) => Outcome::Unchanged,
            (QueueProxyEvent::NotReady, PodState::Ready) => {
                self.transition(PodState::NotReady, Reason::QueueProxyNotReady, now)
            }
            // Recovering keeps its probation (fork behaviour, acceptance case 20: "podRecovering
            // can receive QP events"); the health checks decide it.
            (QueueProxyEvent::NotReady, _) => Outcome::Unchanged,
            (QueueProxyEvent::Draining, PodState::NotReady) => {
                // Not a transition, but the reason now says why the pod will not come back.
                self.reason = Reason::QueueProxyDraining;
                Outcome::Unchanged
            }
            (QueueProxyEvent::Draining, _) => {
                self.transition(PodState::NotReady, Reason::QueueProxyDraining, now)
            }
        }
    }

    fn on_informer_listed(&mut self, gates: Gates, windows: Windows, now: Timestamp) -> Outcome {
        let promotable = match self.state {
            PodState::NotReady => true,
            // With quarantine on, probation is the health checks' business (acceptance case
            // 25). With it off, these states are leftovers and nothing else would clear them.
            PodState::Quarantined | PodState::Recovering => !gates.pod_quarantine,
            PodState::Ready => false,
        };
        if !promotable || self.authority(gates, windows, now) == Authority::QueueProxyNotReady {
            return Outcome::Unchanged;
        }
        self.transition(PodState::Ready, Reason::InformerPromoted, now)
    }

    fn on_informer_omitted(
        &mut self,
        in_flight: u32,
        gates: Gates,
        windows: Windows,
        now: Timestamp,
    ) -> Outcome {
        match self.state {
            // Only Ready is shielded: a Recovering pod is already suspect, and with two signals
            // against it the informer wins (fork behaviour).
            PodState::Ready
                if self.authority(gates, windows, now) == Authority::QueueProxyReady =>
            {
                Outcome::Unchanged
            }
            _ if in_flight == 0 => self.remove(Reason::InformerRemoved, now),
            PodState::NotReady => Outcome::Unchanged,
            PodState::Ready | PodState::Recovering | PodState::Quarantined => {
                self.transition(PodState::NotReady, Reason::InformerRemoved, now)
            }
        }
    }

    fn quarantine(&mut self, now: Timestamp) -> Outcome {
        self.quarantine_count = self.quarantine_count.saturating_add(1);
        let outcome = self.transition(PodState::Quarantined, Reason::HealthCheckFailed, now);
        self.quarantine_until = Some(now + Pod::quarantine_backoff(self.quarantine_count));
        outcome
    }

    /// The only place `state` changes, so the invariants on `quarantine_until`,
    /// `quarantine_count` and `state_since` are kept here.
    fn transition(&mut self, to: PodState, reason: Reason, now: Timestamp) -> Outcome {
        let from = self.state;
        self.state = to;
        self.reason = reason;
        self.state_since = now;
        if to != PodState::Quarantined {
            self.quarantine_until = None;
        }
        if to == PodState::Ready {
            self.quarantine_count = 0;
        }
        Outcome::Transition { from, to, reason }
    }

    fn remove(&mut self, reason: Reason, now: Timestamp) -> Outcome {
        let from = self.state;
        // NotReady so a caller that holds the pod a moment longer never routes to it and no
        // quarantine timer can bring it back.
        self.transition(PodState::NotReady, reason, now);
        Outcome::Remove { from, reason }
    }
}

#[cfg(test)]
mod tests;
