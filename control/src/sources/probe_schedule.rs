//! When each pod is probed (quarantine gate on): a pure schedule, the clock passed in, that the
//! prober ([`super::prober`]) asks which probes are due and tells what they found.
//!
//! Probes go where they tell something. Four classes, in the order they are served:
//!
//! | class        | who                                                          | when                                         | budget  |
//! |--------------|--------------------------------------------------------------|----------------------------------------------|---------|
//! | `recovering` | a pod whose quarantine ended (not routable until a pass)     | at once, then every `interval`                | outside |
//! | `suspect`    | back from quarantine, or failed a probe, until [`SETTLE_PASSES`] passes in a row | every `interval`           | outside |
//! | `new`        | a pod the prober has not probed yet                          | once within `interval`, spread by its address | outside |
//! | `settled`    | everything else                                              | every `settled_interval`                      | inside  |
//!
//! Settled probes are bounded by `budget_per_second`, released in batches on a [`BATCH`] grid
//! (each batch at most its share of the budget, so a second's batches make its budget). When
//! more settled pods are due than the budget allows, the oldest due go first and each pod's
//! turn comes later: with 50 000 pods and a budget of 200 a second, every ~250 s. A settled pod
//! is also watched by its queue-proxy's `not-ready` push, by the kubelet and, passively, by
//! every request it serves.
//!
//! Entries are keyed by an id the schedule hands out when a pod enters it: a result for a pod
//! that has since left the schedule (or left and came back) carries an old id and is ignored.
//! Each job says the protocol to probe in and the TLS to probe over, its revision's: when
//! either changes, the revision's pods get new entries, since a probe in the old protocol, or
//! over the old TLS (another trust, another name), says nothing of the new one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::RevisionKey;
use kactivator_shards::routing::Protocol;

use crate::pod_state::Timestamp;
pub use crate::state::{ProbePod, ProbeUpdate};
use crate::tls::PodTls;

/// Passes in a row after which a suspect pod is settled again.
pub const SETTLE_PASSES: u32 = 3;

/// The grid settled probes are released on: small batches often, so that one batch holds the
/// control thread (and a registration arriving meanwhile) only briefly.
pub const BATCH: Duration = Duration::from_millis(50);

/// Batches per second ([`BATCH`] is a twentieth of a second).
const BATCHES_PER_SECOND: u64 = 20;

/// The schedule's settings (from `[health]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleSettings {
    /// Recovering and suspect pods: time between probes. A new pod: its first probe within this.
    pub interval: Duration,
    /// Settled pods: time between probes (when the budget allows).
    pub settled_interval: Duration,
    /// Most settled probes a second.
    pub budget_per_second: u32,
}

/// Why a pod is probed, in the order classes are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeClass {
    Recovering,
    Suspect,
    New,
    Settled,
}

impl ProbeClass {
    pub const ALL: [ProbeClass; 4] = [
        ProbeClass::Recovering,
        ProbeClass::Suspect,
        ProbeClass::New,
        ProbeClass::Settled,
    ];

    /// The `class` label of `kactivator_probe_targets`.
    pub fn label(self) -> &'static str {
        match self {
            ProbeClass::Recovering => "recovering",
            ProbeClass::Suspect => "suspect",
            ProbeClass::New => "new",
            ProbeClass::Settled => "settled",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A probe to make now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeJob {
    pub revision: RevisionKey,
    pub addr: SocketAddr,
    /// What to probe in: the revision's protocol.
    pub protocol: Protocol,
    /// What to probe over: the revision's TLS to its pods ([`ProbeUpdate::tls`]), or plain.
    pub tls: Option<Arc<PodTls>>,
    /// The pod was on probation when the probe went out.
    pub recovering: bool,
    pub class: ProbeClass,
    /// Hand back with the result ([`ProbeSchedule::complete`]).
    pub ticket: Ticket,
}

/// Names the schedule entry a probe was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(u64);

struct Entry {
    revision: RevisionKey,
    addr: SocketAddr,
    protocol: Protocol,
    tls: Option<Arc<PodTls>>,
    tracker: u64,
    recovering: bool,
    class: ProbeClass,
    /// When the next probe is due; meaningless while one is in flight.
    due: Timestamp,
    in_flight: bool,
    /// Passes in a row (a suspect pod settles at [`SETTLE_PASSES`]).
    passes: u32,
}

/// A revision's pods in the schedule, and how they are probed.
struct Probed {
    protocol: Protocol,
    tls: Option<Arc<PodTls>>,
    /// Address → entry id.
    pods: BTreeMap<SocketAddr, u64>,
}

/// Which pods to probe when. See the module doc.
pub struct ProbeSchedule {
    settings: ScheduleSettings,
    entries: HashMap<u64, Entry>,
    /// Each revision's protocol, TLS and pods (address → entry id).
    revisions: HashMap<RevisionKey, Probed>,
    /// Entries waiting for their next probe, per class, by due time.
    queues: [BTreeSet<(Timestamp, u64)>; 4],
    /// Entries per class, in flight or not (the gauge).
    counts: [usize; 4],
    next_id: u64,
    /// The batch slot settled probes last went out in.
    last_batch: Option<u64>,
}

impl ProbeSchedule {
    pub fn new(settings: ScheduleSettings) -> ProbeSchedule {
        ProbeSchedule {
            settings,
            entries: HashMap::new(),
            revisions: HashMap::new(),
            queues: Default::default(),
            counts: [0; 4],
            next_id: 0,
            last_batch: None,
        }
    }

    /// Pods in the schedule per class, in [`ProbeClass::ALL`] order.
    pub fn counts(&self) -> [usize; 4] {
        self.counts
    }

    /// Pods in the schedule.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Replaces a revision's probe set. Returns the addresses whose kept connections can go:
    /// those that left the schedule, and every one of a revision whose protocol or TLS changed.
    pub fn update(&mut self, update: ProbeUpdate, now: Timestamp) -> Vec<SocketAddr> {
        let mut gone = Vec::new();
        let mut old = match self.revisions.remove(&update.revision) {
            Some(old) if old.protocol == update.protocol && old.tls == update.tls => old.pods,
            Some(old) => {
                // Another protocol or TLS: every pod starts over as a new entry.
                for (addr, id) in old.pods {
                    self.remove(id);
                    gone.push(addr);
                }
                BTreeMap::new()
            }
            None => BTreeMap::new(),
        };
        let mut current = BTreeMap::new();
        for pod in &update.pods {
            let id = match old.remove(&pod.addr) {
                Some(id)
                    if self
                        .entries
                        .get(&id)
                        .is_some_and(|e| e.tracker == pod.tracker) =>
                {
                    self.reclassify(id, pod.recovering, now);
                    id
                }
                replaced => {
                    // Another pod at the same address: the old one's late result must not
                    // count for this one, so it gets a new entry.
                    if let Some(id) = replaced {
                        self.remove(id);
                    }
                    self.insert(&update, pod, now)
                }
            };
            current.insert(pod.addr, id);
        }
        for (addr, id) in old {
            self.remove(id);
            gone.push(addr);
        }
        if !current.is_empty() {
            self.revisions.insert(
                update.revision,
                Probed {
                    protocol: update.protocol,
                    tls: update.tls,
                    pods: current,
                },
            );
        }
        gone
    }

    /// Probes due at `now`, at most `room` of them: recovering first, then suspect, then new,
    /// then settled ones within the budget.
    pub fn due(&mut self, now: Timestamp, room: usize) -> Vec<ProbeJob> {
        let mut jobs = Vec::new();
        for class in [ProbeClass::Recovering, ProbeClass::Suspect, ProbeClass::New] {
            self.pop_due(class, now, room, usize::MAX, &mut jobs);
        }
        let slot = slot_of(now);
        if jobs.len() < room
            && self.last_batch != Some(slot)
            && self.queues[ProbeClass::Settled.index()]
                .first()
                .is_some_and(|(due, _)| *due <= slot_start(slot))
        {
            self.last_batch = Some(slot);
            let allowance = self.allowance(slot);
            self.pop_due(
                ProbeClass::Settled,
                slot_start(slot),
                room,
                jobs.len() + allowance,
                &mut jobs,
            );
        }
        jobs
    }

    /// When [`ProbeSchedule::due`] next has something (`None`: nothing is waiting).
    pub fn next_wakeup(&self) -> Option<Timestamp> {
        let urgent = [ProbeClass::Recovering, ProbeClass::Suspect, ProbeClass::New]
            .iter()
            .filter_map(|class| self.queues[class.index()].first().map(|(due, _)| *due))
            .min();
        let settled = self.queues[ProbeClass::Settled.index()]
            .first()
            .map(|(due, _)| {
                let mut slot = slot_of_ceil(*due);
                if self.last_batch.is_some_and(|last| slot <= last) {
                    slot = self.last_batch.unwrap_or(0) + 1;
                }
                slot_start(slot)
            });
        match (urgent, settled) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A probe's result. Returns whether it is about the pod as the schedule knows it now;
    /// `false` for a pod that left (or left and came back) while the probe was out, whose
    /// result must not change anything.
    pub fn complete(&mut self, ticket: Ticket, passed: bool, now: Timestamp) -> bool {
        let Some(entry) = self.entries.get_mut(&ticket.0) else {
            return false;
        };
        if !entry.in_flight {
            return false;
        }
        entry.in_flight = false;
        let settings = self.settings;
        let (class, due) = if passed {
            entry.passes += 1;
            match entry.class {
                ProbeClass::Recovering => (ProbeClass::Recovering, now + settings.interval),
                ProbeClass::Suspect if entry.passes < SETTLE_PASSES => {
                    (ProbeClass::Suspect, now + settings.interval)
                }
                ProbeClass::Suspect | ProbeClass::New | ProbeClass::Settled => {
                    (ProbeClass::Settled, now + settings.settled_interval)
                }
            }
        } else {
            entry.passes = 0;
            let class = if entry.recovering {
                ProbeClass::Recovering
            } else {
                ProbeClass::Suspect
            };
            (class, now + settings.interval)
        };
        self.set_class(ticket.0, class);
        self.enqueue(ticket.0, due);
        true
    }

    // === internals ===

    /// A new entry for `pod` of `update`'s revision, probed as `update` says.
    fn insert(&mut self, update: &ProbeUpdate, pod: &ProbePod, now: Timestamp) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let (class, due) = if pod.recovering {
            (ProbeClass::Recovering, now)
        } else {
            (
                ProbeClass::New,
                now + spread(pod.addr, self.settings.interval),
            )
        };
        self.entries.insert(
            id,
            Entry {
                revision: update.revision.clone(),
                addr: pod.addr,
                protocol: update.protocol,
                tls: update.tls.clone(),
                tracker: pod.tracker,
                recovering: pod.recovering,
                class,
                due,
                in_flight: false,
                passes: 0,
            },
        );
        self.counts[class.index()] += 1;
        self.queues[class.index()].insert((due, id));
        id
    }

    fn remove(&mut self, id: u64) {
        if let Some(entry) = self.entries.remove(&id) {
            self.counts[entry.class.index()] -= 1;
            if !entry.in_flight {
                self.queues[entry.class.index()].remove(&(entry.due, id));
            }
        }
    }

    /// The state worker's view of a pod changed (it entered or left probation).
    fn reclassify(&mut self, id: u64, recovering: bool, now: Timestamp) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if entry.recovering == recovering {
            return;
        }
        entry.recovering = recovering;
        entry.passes = 0;
        if recovering {
            // Probation starts with a probe at once.
            self.set_class(id, ProbeClass::Recovering);
            self.enqueue(id, now);
        } else {
            // Back from probation: watched closely until it passes a few in a row.
            let due = now + self.settings.interval;
            self.set_class(id, ProbeClass::Suspect);
            self.enqueue(id, due);
        }
    }

    fn set_class(&mut self, id: u64, class: ProbeClass) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if !entry.in_flight {
            self.queues[entry.class.index()].remove(&(entry.due, id));
        }
        self.counts[entry.class.index()] -= 1;
        self.counts[class.index()] += 1;
        entry.class = class;
    }

    /// Puts a probe-less entry in its class's queue at `due` (an entry in flight is queued when
    /// its result comes back).
    fn enqueue(&mut self, id: u64, due: Timestamp) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if entry.in_flight {
            return;
        }
        self.queues[entry.class.index()].remove(&(entry.due, id));
        entry.due = due;
        self.queues[entry.class.index()].insert((due, id));
    }

    fn pop_due(
        &mut self,
        class: ProbeClass,
        until: Timestamp,
        room: usize,
        limit: usize,
        jobs: &mut Vec<ProbeJob>,
    ) {
        let queue = &mut self.queues[class.index()];
        while jobs.len() < room.min(limit) {
            let Some(&(due, id)) = queue.first() else {
                break;
            };
            if due > until {
                break;
            }
            queue.pop_first();
            // Every queued id has an entry: `remove` takes both out together.
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            entry.in_flight = true;
            jobs.push(ProbeJob {
                revision: entry.revision.clone(),
                addr: entry.addr,
                protocol: entry.protocol,
                tls: entry.tls.clone(),
                recovering: entry.recovering,
                class,
                ticket: Ticket(id),
            });
        }
    }

    /// Settled probes the batch of `slot` may send: the budget spread over the second's
    /// batches so that any second's worth in a row send exactly the budget.
    fn allowance(&self, slot: u64) -> usize {
        let budget = u64::from(self.settings.budget_per_second);
        let within = slot % BATCHES_PER_SECOND;
        let upto = |k: u64| k * budget / BATCHES_PER_SECOND;
        (upto(within + 1) - upto(within)) as usize
    }
}

fn slot_of(at: Timestamp) -> u64 {
    (at.epoch_offset().as_nanos() / BATCH.as_nanos()) as u64
}

/// The first slot that starts at or after `at`.
fn slot_of_ceil(at: Timestamp) -> u64 {
    let nanos = at.epoch_offset().as_nanos();
    let batch = BATCH.as_nanos();
    nanos.div_ceil(batch) as u64
}

fn slot_start(slot: u64) -> Timestamp {
    Timestamp::from_epoch_offset(Duration::from_nanos(
        slot.saturating_mul(BATCH.as_nanos() as u64),
    ))
}

/// A fixed offset within `period` for `addr`, so that pods that appear together (a start-up, a
/// big listing) are probed spread out rather than in one burst.
fn spread(addr: SocketAddr, period: Duration) -> Duration {
    // FNV-1a over the address: stable across runs, no hasher state.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes: Vec<u8> = match addr.ip() {
        std::net::IpAddr::V4(ip) => ip.octets().to_vec(),
        std::net::IpAddr::V6(ip) => ip.octets().to_vec(),
    };
    for byte in bytes.iter().chain(addr.port().to_be_bytes().iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let nanos = period.as_nanos().max(1) as u64;
    Duration::from_nanos(hash % nanos)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const INTERVAL: Duration = Duration::from_secs(1);
    const SETTLED: Duration = Duration::from_secs(30);

    fn settings() -> ScheduleSettings {
        ScheduleSettings {
            interval: INTERVAL,
            settled_interval: SETTLED,
            budget_per_second: 200,
        }
    }

    fn ms(milliseconds: u64) -> Timestamp {
        Timestamp::from_epoch_offset(Duration::from_millis(milliseconds))
    }

    fn revision() -> RevisionKey {
        RevisionKey::new("default", "hello-00001").unwrap()
    }

    fn pod(index: u32, recovering: bool) -> ProbePod {
        let [a, b, c, d] = (0x0a00_0000 + index).to_be_bytes();
        ProbePod {
            addr: SocketAddr::from(([a, b, c, d], 8012)),
            tracker: u64::from(index),
            recovering,
        }
    }

    fn set(pods: Vec<ProbePod>) -> ProbeUpdate {
        ProbeUpdate {
            revision: revision(),
            protocol: Protocol::Http1,
            tls: None,
            pods,
        }
    }

    /// Runs the schedule from `from` to `until` as the prober would, waking when it says and
    /// completing every probe at once with `passed(addr)`; returns what went out, when.
    fn simulate(
        schedule: &mut ProbeSchedule,
        from: Timestamp,
        until: Timestamp,
        passed: impl Fn(SocketAddr) -> bool,
    ) -> Vec<(Timestamp, ProbeJob)> {
        let mut sent = Vec::new();
        let mut now = from;
        loop {
            for job in schedule.due(now, usize::MAX) {
                assert!(schedule.complete(job.ticket, passed(job.addr), now));
                sent.push((now, job));
            }
            match schedule.next_wakeup() {
                Some(next) if next <= until => now = next.max(now),
                _ => return sent,
            }
        }
    }

    #[test]
    fn a_recovering_pod_is_probed_at_once_then_every_interval() {
        let mut schedule = ProbeSchedule::new(settings());
        schedule.update(set(vec![pod(1, true)]), ms(500));
        let sent = simulate(&mut schedule, ms(500), ms(3_600), |_| false);
        let times: Vec<Timestamp> = sent.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [ms(500), ms(1_500), ms(2_500), ms(3_500)]);
        assert!(sent.iter().all(|(_, job)| job.recovering));
        assert_eq!(schedule.counts(), [1, 0, 0, 0]);
    }

    #[test]
    fn a_new_pod_is_probed_once_within_the_interval_then_settles() {
        let mut schedule = ProbeSchedule::new(settings());
        let pods: Vec<ProbePod> = (0..50).map(|index| pod(index, false)).collect();
        schedule.update(set(pods), ms(0));
        assert_eq!(schedule.counts(), [0, 0, 50, 0]);
        let first = simulate(&mut schedule, ms(0), ms(29_000), |_| true);
        assert_eq!(first.len(), 50, "one probe each");
        assert!(first
            .iter()
            .all(|(at, job)| *at < ms(1_000) && job.class == ProbeClass::New));
        // Spread over the interval, not in one burst.
        let distinct: BTreeSet<Timestamp> = first.iter().map(|(at, _)| *at).collect();
        assert!(distinct.len() > 40, "{distinct:?}");
        assert_eq!(schedule.counts(), [0, 0, 0, 50]);
        // The next probe of each comes a settled interval later, on the batch grid.
        let next = simulate(&mut schedule, ms(29_000), ms(32_000), |_| true);
        assert_eq!(next.len(), 50);
        for (at, job) in &next {
            assert_eq!(job.class, ProbeClass::Settled);
            assert!(*at >= ms(30_000) && *at <= ms(31_100), "{at:?}");
            assert_eq!(
                at.epoch_offset().as_nanos() % BATCH.as_nanos(),
                0,
                "{at:?} on the grid"
            );
        }
    }

    #[test]
    fn a_pod_back_from_probation_is_suspect_until_it_passes_three_in_a_row() {
        let mut schedule = ProbeSchedule::new(settings());
        schedule.update(set(vec![pod(1, true)]), ms(0));
        let probation = schedule.due(ms(0), usize::MAX);
        assert_eq!(probation.len(), 1);
        assert!(schedule.complete(probation[0].ticket, true, ms(10)));
        // The state worker made it Ready on that pass: probed an interval later.
        schedule.update(set(vec![pod(1, false)]), ms(20));
        assert_eq!(schedule.counts(), [0, 1, 0, 0]);
        let sent = simulate(&mut schedule, ms(20), ms(40_000), |_| true);
        let classes: Vec<(u64, ProbeClass)> = sent
            .iter()
            .map(|(at, job)| (at.epoch_offset().as_millis() as u64, job.class))
            .collect();
        assert_eq!(
            classes,
            [
                (1_020, ProbeClass::Suspect),
                (2_020, ProbeClass::Suspect),
                (3_020, ProbeClass::Suspect),
                // Settled 30 s after the third pass, on the batch grid.
                (
                    slot_start(slot_of_ceil(ms(33_020)))
                        .epoch_offset()
                        .as_millis() as u64,
                    ProbeClass::Settled
                ),
            ]
        );
    }

    #[test]
    fn a_failed_probe_makes_a_settled_pod_suspect() {
        let mut schedule = ProbeSchedule::new(settings());
        schedule.update(set(vec![pod(1, false)]), ms(0));
        simulate(&mut schedule, ms(0), ms(1_000), |_| true);
        assert_eq!(schedule.counts(), [0, 0, 0, 1]);
        let jobs = schedule.due(ms(40_000), usize::MAX);
        assert_eq!(jobs.len(), 1);
        assert!(schedule.complete(jobs[0].ticket, false, ms(40_000)));
        assert_eq!(schedule.counts(), [0, 1, 0, 0]);
        assert_eq!(schedule.next_wakeup(), Some(ms(41_000)));
    }

    #[test]
    fn the_budget_holds_with_ten_thousand_settled_pods() {
        let mut schedule = ProbeSchedule::new(settings());
        let pods: Vec<ProbePod> = (0..10_000).map(|index| pod(index, false)).collect();
        schedule.update(set(pods), ms(0));
        let sent = simulate(&mut schedule, ms(0), ms(300_000), |_| true);
        let settled: Vec<(Timestamp, SocketAddr)> = sent
            .iter()
            .filter(|(_, job)| job.class == ProbeClass::Settled)
            .map(|(at, job)| (*at, job.addr))
            .collect();
        // At most the budget in any second (windows on the batch grid).
        let mut per_slot: BTreeMap<u64, usize> = BTreeMap::new();
        for (at, _) in &settled {
            *per_slot.entry(slot_of(*at)).or_default() += 1;
        }
        let last = *per_slot.keys().last().unwrap();
        for start in 0..=last {
            let in_second: usize = (start..start + BATCHES_PER_SECOND)
                .map(|slot| per_slot.get(&slot).copied().unwrap_or(0))
                .sum();
            assert!(
                in_second <= 200,
                "{in_second} settled probes from slot {start}"
            );
        }
        // The budget is used: the pods need more than it allows.
        assert!(settled.len() > 200 * 260, "{}", settled.len());
        // Each pod still comes round, every ~10 000 / 200 = 50 s.
        let mut last_probe: HashMap<SocketAddr, Timestamp> = HashMap::new();
        for (at, addr) in &settled {
            if let Some(previous) = last_probe.insert(*addr, *at) {
                let gap = at.elapsed_since(previous);
                assert!(
                    gap >= SETTLED && gap <= Duration::from_secs(55),
                    "{addr}: {gap:?}"
                );
            }
        }
        assert_eq!(last_probe.len(), 10_000);
    }

    #[test]
    fn settled_probes_go_out_in_batches_sharing_the_budget() {
        let mut schedule = ProbeSchedule::new(settings());
        let pods: Vec<ProbePod> = (0..1_000).map(|index| pod(index, false)).collect();
        schedule.update(set(pods), ms(0));
        simulate(&mut schedule, ms(0), ms(1_000), |_| true);
        let sent = simulate(&mut schedule, ms(31_000), ms(31_999), |_| true);
        let mut batches: BTreeMap<Timestamp, usize> = BTreeMap::new();
        for (at, _) in &sent {
            *batches.entry(*at).or_default() += 1;
        }
        let step = BATCH.as_millis() as u64;
        let expected: BTreeMap<Timestamp, usize> = (0..BATCHES_PER_SECOND)
            .map(|k| (ms(31_000 + step * k), 200 / BATCHES_PER_SECOND as usize))
            .collect();
        assert_eq!(batches, expected);
    }

    #[test]
    fn urgent_probes_go_out_while_the_settled_budget_is_spent() {
        let mut schedule = ProbeSchedule::new(settings());
        let pods: Vec<ProbePod> = (0..1_000).map(|index| pod(index, false)).collect();
        schedule.update(set(pods.clone()), ms(0));
        simulate(&mut schedule, ms(0), ms(1_000), |_| true);
        // 1 000 settled pods overdue: this slot's batch takes the budget.
        let batch = schedule.due(ms(40_000), usize::MAX);
        assert_eq!(batch.len(), 200 / BATCHES_PER_SECOND as usize);
        for job in batch {
            assert!(schedule.complete(job.ticket, true, ms(40_010)));
        }
        assert!(schedule.due(ms(40_015), usize::MAX).is_empty());
        // A pod enters probation mid-slot: probed at once all the same.
        let mut with_recovering = pods;
        with_recovering[7].recovering = true;
        schedule.update(set(with_recovering), ms(40_016));
        let jobs = schedule.due(ms(40_016), usize::MAX);
        assert_eq!(jobs.len(), 1);
        assert!(jobs[0].recovering);
        assert_eq!(jobs[0].addr, pod(7, true).addr);
        // And first when room is short.
        let mut schedule = ProbeSchedule::new(settings());
        let mut pods: Vec<ProbePod> = (0..100).map(|index| pod(index, false)).collect();
        pods[99].recovering = true;
        schedule.update(set(pods), ms(0));
        let jobs = schedule.due(ms(5_000), 1);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].class, ProbeClass::Recovering);
    }

    #[test]
    fn a_late_result_for_a_removed_or_re_added_pod_changes_nothing() {
        let mut schedule = ProbeSchedule::new(settings());
        schedule.update(set(vec![pod(1, true)]), ms(0));
        let first = schedule.due(ms(0), usize::MAX).remove(0);
        // Quarantined again while the probe is out: it leaves the probe set.
        assert_eq!(schedule.update(set(vec![]), ms(5)), vec![pod(1, true).addr]);
        assert!(schedule.is_empty());
        assert!(!schedule.complete(first.ticket, true, ms(10)));
        assert!(schedule.is_empty());
        // Out, then back (its next probation) before the result of a probe from before.
        let second = {
            schedule.update(set(vec![pod(1, true)]), ms(20));
            schedule.due(ms(20), usize::MAX).remove(0)
        };
        schedule.update(set(vec![]), ms(25));
        schedule.update(set(vec![pod(1, true)]), ms(30));
        assert!(!schedule.complete(second.ticket, true, ms(35)));
        // The pod as it is now is still due at once.
        assert_eq!(schedule.due(ms(35), usize::MAX).len(), 1);
        // A new pod at the same address (another tracker) is a new entry too.
        let mut schedule = ProbeSchedule::new(settings());
        schedule.update(set(vec![pod(1, false)]), ms(0));
        let job = schedule.due(ms(1_000), usize::MAX).remove(0);
        let mut replaced = pod(1, true);
        replaced.tracker = 99;
        schedule.update(set(vec![replaced]), ms(1_001));
        assert!(!schedule.complete(job.ticket, false, ms(1_002)));
        assert_eq!(schedule.counts(), [1, 0, 0, 0]);
    }

    #[test]
    fn jobs_carry_the_revisions_protocol_and_a_new_protocol_starts_its_pods_over() {
        let mut schedule = ProbeSchedule::new(settings());
        let h2c = |pods: Vec<ProbePod>| ProbeUpdate {
            protocol: Protocol::H2c,
            ..set(pods)
        };
        schedule.update(h2c(vec![pod(1, true), pod(2, false)]), ms(0));
        let first = schedule.due(ms(0), usize::MAX).remove(0);
        assert_eq!(
            (first.addr, first.protocol),
            (pod(1, true).addr, Protocol::H2c)
        );
        // The revision is HTTP/1 now: both pods leave their kept connections and start over,
        // and the result of the probe made in the old protocol counts for nothing.
        let gone = schedule.update(set(vec![pod(1, true), pod(2, false)]), ms(5));
        assert_eq!(gone, [pod(1, true).addr, pod(2, false).addr]);
        assert!(!schedule.complete(first.ticket, true, ms(10)));
        assert_eq!(schedule.counts(), [1, 0, 1, 0]);
        let again = schedule.due(ms(10), usize::MAX);
        assert_eq!(again.len(), 1);
        assert_eq!(
            (again[0].addr, again[0].protocol),
            (pod(1, true).addr, Protocol::Http1)
        );
        let later = schedule.due(ms(1_000), usize::MAX);
        assert!(later.iter().all(|job| job.protocol == Protocol::Http1));
        // The same protocol again keeps the entries.
        assert!(schedule
            .update(set(vec![pod(1, true), pod(2, false)]), ms(1_001))
            .is_empty());
    }

    /// A revision's TLS to its pods, as `[revisions.tls]` loads it, trusting `ca`.
    fn tls(ca: &crate::tls::tests::Ca, server_name: &str) -> Arc<PodTls> {
        Arc::new(PodTls::new("ca.pem", ca.cert.pem().as_bytes(), server_name, None).unwrap())
    }

    #[test]
    fn jobs_carry_the_revisions_tls_and_another_tls_starts_its_pods_over() {
        let ca = crate::tls::tests::ca("pods");
        let over = |tls: &Arc<PodTls>, pods: Vec<ProbePod>| ProbeUpdate {
            tls: Some(tls.clone()),
            ..set(pods)
        };
        let first_tls = tls(&ca, "data-plane.knative.dev");
        let mut schedule = ProbeSchedule::new(settings());
        schedule.update(over(&first_tls, vec![pod(1, true), pod(2, false)]), ms(0));
        let first = schedule.due(ms(0), usize::MAX).remove(0);
        assert_eq!(first.tls.as_ref(), Some(&first_tls));
        // The same TLS said again (the file read again: another `PodTls`, the same
        // description) keeps the entries and their kept connections.
        let same = tls(&ca, "data-plane.knative.dev");
        assert!(schedule
            .update(over(&same, vec![pod(1, true), pod(2, false)]), ms(1))
            .is_empty());
        // Another server name: a probe over the old TLS says nothing of the new one.
        let renamed = tls(&ca, "models.example");
        let gone = schedule.update(over(&renamed, vec![pod(1, true), pod(2, false)]), ms(5));
        assert_eq!(gone, [pod(1, true).addr, pod(2, false).addr]);
        assert!(!schedule.complete(first.ticket, true, ms(10)));
        let again = schedule.due(ms(10), usize::MAX).remove(0);
        assert_eq!(again.tls.as_ref(), Some(&renamed));
        // Plain again: started over too, and its jobs dial plain.
        let gone = schedule.update(set(vec![pod(1, true), pod(2, false)]), ms(20));
        assert_eq!(gone.len(), 2);
        let plain = schedule.due(ms(2_000), usize::MAX);
        assert_eq!(plain.len(), 2);
        assert!(plain.iter().all(|job| job.tls.is_none()));
    }
}
