//! Cross-shard admission for one revision: who gets the next free slot, on which shard.
//!
//! Sans-IO: shards call in with the current state and get back *effects* (wake a local waiter,
//! send a slot to another shard). The I/O shell delivers grants over channels; tests deliver
//! them in any order a simulation picks.
//!
//! Shared state per revision ([`RevisionGate`]): a ticket dispenser giving every queued
//! request its place in arrival order, the number of waiters on all shards, for each shard the
//! key of the waiter it would serve next (`discipline::head_key`: its band's rank, then its
//! ticket without a priority policy, where every waiter is in one band so the key orders by
//! ticket alone, or its start tag with one), and, used only under a policy, the fair clock that
//! hands out start tags (`discipline::FairClock`, behind a lock). Each shard keeps its own
//! waiters ([`LocalQueue`]) in its revision's discipline (`discipline::Waiters`: FIFO, or bands
//! and flows ordered by tag).
//! Shared by the gates of every revision: the process-wide count of waiters ([`ProcessQueue`]).
//!
//! The rules, and the invariant each one keeps:
//!
//! * **No barging.** A request takes a slot directly only while nobody waits anywhere; otherwise
//!   it takes a ticket and queues, even if a slot happens to be free (a dispatch then serves the
//!   oldest waiter, which may be this one).
//! * **No lost wake-up.** A queueing request counts itself as waiting and publishes its ticket
//!   *then* dispatches; a finishing request releases its slot *then* reads the waiting count and
//!   dispatches if non-zero. Between its write and its reads each side runs a `SeqCst` fence
//!   (the fence opens [`RevisionGate::waiting`] and [`LocalQueue::dispatch`]). The two fences
//!   fall in one order or the other, and the side whose fence comes second sees what the other
//!   wrote before its fence: either the releaser sees the waiter (count and ticket) and
//!   dispatches, or the waiter's own dispatch sees the free slot. Fences, not only `SeqCst`
//!   accesses on the gate, because the slot counter belongs to the load balancer and is not
//!   `SeqCst`: the total order of `SeqCst` accesses says nothing about it, so without the fences
//!   the C11 model (and loom, which checks this under `--cfg loom`) allows both sides to miss
//!   each other.
//! * **Highest band first, then oldest (or fairest), within a bounded error.** A dispatch
//!   serves the shard whose next waiter has the lowest key: a waiter of a higher band on any
//!   shard goes before every waiter of a lower band. Within a band, without a policy, the lowest
//!   ticket goes first: arrival order across shards. With one, the lowest start tag goes first:
//!   tags come from one clock for every shard, so start-time fair queuing holds across the
//!   process (every flow waiting on any shard takes its turn `t` before any takes `t + 1`, and a
//!   flow's first request waits behind at most one request of each other flow; equal tags on
//!   two shards go to the lower shard). Two dispatchers racing may both pick the same shard;
//!   the surplus grant finds the next waiter there, or none and is released and re-dispatched.
//!   So a waiter can be overtaken only by waiters served through grants that were in flight at
//!   that moment.
//! * **No slot is stranded.** A slot travels inside a grant; whoever receives a grant either
//!   hands it to a waiter or releases it and dispatches again.
//! * **Bounded.** A per-revision depth ([`QueueLimits`]) and a process-wide cap on waiters shared
//!   by every revision ([`ProcessQueue`]; ★ upstream's queue is effectively unbounded); over
//!   either, the request is refused (503 `pending request queue full`). A queueing request
//!   reserves its place in the revision, then in the process, and gives the first back if the
//!   second is refused. Each reservation is a compare-and-swap that refuses at the bound, so
//!   neither count ever exceeds its bound, not even for an instant. The revision goes first so
//!   that a revision already at its depth is refused without touching the count every revision
//!   shares (a place taken there even briefly could refuse another revision's request). Every
//!   pop and every cancel gives both places back. The fast path (nobody waiting, a slot free)
//!   touches neither count and runs no fence.
//! * **The fair clock is off the FIFO path.** Without a policy no call locks it. With one, a
//!   shard locks it to tag a waiter (taking the ticket under the same lock, so that a flow's
//!   tags and tickets rise together: FCFS within a flow across shards), to report one served
//!   (raising the band's virtual time) or gone, and to switch policy. It orders waiters only:
//!   the counts, heads and fences above decide who may take a slot, whatever the tags say.
//! * **Shedding keeps the bounds.** Under a priority policy, an arrival refused by either bound
//!   takes the place of the newest waiter of the lowest lower band, which is answered 503: the
//!   places pass from one to the other and no count moves. Each shard publishes the lowest band
//!   it has waiting. When the arrival's own shard has the lowest (or ties for it), that is one
//!   step there. Else the arrival asks the shard with the lowest to shed for it
//!   ([`Effect::Evict`], a message like a grant): the request waits as
//!   [`Admission::Displacing`] meanwhile, holding no place. That shard sheds its newest waiter
//!   of its lowest band below the arrival's, if it still has one, and sends
//!   the places back with the answer ([`LocalQueue::evict`]); they travel as a slot does in a
//!   grant, counted all the way, so no count moves and none is stranded: the arrival queues in
//!   them, or, gone meanwhile, gives them back ([`LocalQueue::receive_place`]). An answer with
//!   nothing shed (the waiter was served or left meanwhile) leaves the arrival one more try at
//!   the bounds, then a refusal. While places travel the waiting count includes them with no
//!   head published: a dispatcher finds no waiter and stops, and the arrival's own dispatch,
//!   once it is queued, serves it ("No lost wake-up" holds as for any queueing request).

use std::sync::Arc;

use crossbeam_utils::CachePadded;

pub use super::discipline::{Class, WaiterId};
use super::discipline::{FairClock, Waiters};

use self::sync::{fence, AtomicU32, AtomicU64, Mutex, MutexGuard, Ordering};

/// The gate's atomics and lock: loom's when model-checking (`RUSTFLAGS="--cfg loom"`, see
/// `loom_tests`), std's otherwise. loom is only a dev-dependency, so its types are used only in
/// test builds; a `--cfg loom` build of the library proper keeps std's.
mod sync {
    #[cfg(all(loom, test))]
    pub(super) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    #[cfg(all(loom, test))]
    pub(super) use loom::sync::{Mutex, MutexGuard};
    #[cfg(not(all(loom, test)))]
    pub(super) use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
    #[cfg(not(all(loom, test)))]
    pub(super) use std::sync::{Mutex, MutexGuard};
}

/// No waiter on a shard.
const NONE: u64 = u64::MAX;

/// No waiter under a priority policy on a shard (the lowest band published).
const NO_BAND: u32 = u32::MAX;

/// What one shard publishes about its waiters, on a cache line of its own that only it writes.
#[derive(Debug)]
struct ShardHead {
    /// The key (`discipline::head_key`) of the waiter it would serve next, or `NONE`.
    key: AtomicU64,
    /// Under a priority policy, the lowest band it has waiting (an arrival of a higher band on
    /// another shard may ask it to shed one), or `NO_BAND`. Never written without a policy.
    lowest_band: AtomicU32,
}

/// The process-wide cap on waiting requests, one object shared by the gates of every revision.
#[derive(Debug)]
pub struct ProcessQueue {
    /// Written only by whoever owns the setting (the Kubernetes source, from `config-features`);
    /// a lower limit turns new waiters away and leaves those already waiting in place.
    limit: AtomicU32,
    /// Requests waiting for any revision. Written by every shard that queues or serves a waiter,
    /// so it gets a cache line of its own.
    queued: CachePadded<AtomicU32>,
}

impl ProcessQueue {
    /// A limit meaning "no cap".
    pub const UNLIMITED: u32 = u32::MAX;

    /// A cap of `limit` waiting requests ([`ProcessQueue::UNLIMITED`] for none).
    pub fn new(limit: u32) -> ProcessQueue {
        ProcessQueue {
            limit: AtomicU32::new(limit),
            queued: CachePadded::new(AtomicU32::new(0)),
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// A new cap, for requests that queue from now on.
    pub fn set_limit(&self, limit: u32) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Requests waiting for any revision whose gate shares this queue.
    pub fn queued(&self) -> u32 {
        self.queued.load(Ordering::Relaxed)
    }

    // The count orders no other memory: exactness comes from every change being a single
    // read-modify-write, which holds at any ordering, so `Relaxed` is enough here.

    /// Takes a place unless the cap is reached. Even unlimited, the count stops at `u32::MAX`.
    fn reserve(&self) -> bool {
        let limit = self.limit();
        self.queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |queued| {
                (queued < limit).then_some(queued + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        let before = self.queued.fetch_sub(1, Ordering::Relaxed);
        debug_assert!(before > 0, "released a process queue place nobody held");
    }
}

/// A revision's admission state shared by all shards.
#[derive(Debug)]
pub struct RevisionGate {
    next_ticket: AtomicU64,
    waiting: AtomicU32,
    /// Per shard: its next waiter's key and its lowest band.
    heads: Box<[CachePadded<ShardHead>]>,
    process: Arc<ProcessQueue>,
    /// Start-time fair queuing tags for the priority policy's waiters, shared by every shard so
    /// that fairness holds across them. Locked only under a policy, and only to tag a waiter,
    /// untag one (served, cancelled, shed) or switch policy: never on the FIFO path.
    fair: Mutex<FairClock>,
}

impl RevisionGate {
    /// A gate with an unlimited process queue of its own.
    pub fn new(shards: usize) -> RevisionGate {
        RevisionGate::with_process_queue(
            shards,
            Arc::new(ProcessQueue::new(ProcessQueue::UNLIMITED)),
        )
    }

    /// A gate whose waiters also count against `process`, shared with other revisions' gates.
    pub fn with_process_queue(shards: usize, process: Arc<ProcessQueue>) -> RevisionGate {
        RevisionGate {
            next_ticket: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            heads: (0..shards.max(1))
                .map(|_| {
                    CachePadded::new(ShardHead {
                        key: AtomicU64::new(NONE),
                        lowest_band: AtomicU32::new(NO_BAND),
                    })
                })
                .collect(),
            process,
            fair: Mutex::new(FairClock::default()),
        }
    }

    /// The revision's fair clock, locked. Held for a few map operations at most, by one shard
    /// at a time; no other lock is taken while it is held. A poisoned lock (a panic while held)
    /// still gives the clock: at worst some tags are off, which orders waiters, never admits.
    fn fair_clock(&self) -> MutexGuard<'_, FairClock> {
        self.fair
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The process-wide queue this revision's waiters count against.
    pub fn process_queue(&self) -> &Arc<ProcessQueue> {
        &self.process
    }

    /// Requests waiting on all shards.
    ///
    /// Opens with a `SeqCst` fence: after giving a slot back (a request finished, a grant found
    /// nobody, capacity grew) the shell reads this to decide whether to dispatch, and the fence
    /// is the releasing side's half of "No lost wake-up" (see the module docs).
    pub fn waiting(&self) -> u32 {
        fence(Ordering::SeqCst);
        self.waiting_now()
    }

    /// The waiting count without the fence, where no slot was just given back.
    fn waiting_now(&self) -> u32 {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Takes a place in the revision's queue and in the process's, or neither.
    fn reserve(&self, limits: QueueLimits) -> bool {
        let revision = self
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |waiting| {
                (waiting < limits.revision_depth).then_some(waiting + 1)
            });
        if revision.is_err() {
            return false;
        }
        if self.process.reserve() {
            return true;
        }
        // The process is full: give the revision place back. Meanwhile the count was one too
        // high, which at worst makes a racing request queue instead of taking a free slot (its
        // own dispatch then serves it) or a dispatcher look for a head that is not there.
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        false
    }

    /// Gives back the places of a waiter that was served or cancelled.
    fn unreserve(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        self.process.release();
    }

    /// The shard holding the waiter to serve next: the highest band's oldest.
    fn oldest_shard(&self) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (shard, head) in self.heads.iter().enumerate() {
            let ticket = head.key.load(Ordering::SeqCst);
            if ticket != NONE && best.is_none_or(|(oldest, _)| ticket < oldest) {
                best = Some((ticket, shard));
            }
        }
        best.map(|(_, shard)| shard)
    }

    /// The lowest band waiting on a shard other than `except`, and that shard, if the band is
    /// below `band`: where an arrival of `band` may have a waiter shed for it. Read without
    /// ordering anything: it is advice, and the shard asked sheds only what it still has.
    fn lowest_band_below(&self, band: u8, except: usize) -> Option<(u8, usize)> {
        let mut best: Option<(u32, usize)> = None;
        for (shard, head) in self.heads.iter().enumerate() {
            let lowest = head.lowest_band.load(Ordering::Relaxed);
            if shard != except
                && lowest < u32::from(band)
                && best.is_none_or(|(found, _)| lowest < found)
            {
                best = Some((lowest, shard));
            }
        }
        // Below `band`, so it fits.
        best.map(|(lowest, shard)| (lowest as u8, shard))
    }

    /// Gives back the places an answer to an eviction carried, when the arrival they were for
    /// is gone and so is its revision on that shard (the shell's orphaned answer).
    pub fn give_back_place(&self) {
        self.unreserve();
    }
}

/// Limits on waiting requests (the process-wide cap is the gate's [`ProcessQueue`]).
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    /// Most requests waiting for this revision, on all shards.
    pub revision_depth: u32,
}

/// What became of an arriving request.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission<P> {
    /// A slot on this pod is held for the request.
    Proceed(P),
    /// The request waits; it will be named in a [`Effect::Wake`].
    Queued(WaiterId),
    /// The revision's queue or the process's is full: answer 503.
    Rejected,
    /// Both are full, and another shard has a waiter of a lower band: it is asked to shed one
    /// for this request ([`Effect::Evict`]). The request waits as a queued one does: it is
    /// woken with a slot once it has a place and its turn, or told it was refused
    /// ([`Placement::Refused`]) when the other shard had nothing left to shed.
    Displacing(WaiterId),
}

/// What became of a request that was [`Admission::Displacing`] when the answer came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// It queues in the place it was given (or found one free at a second try).
    Queued,
    /// Nothing was shed and the queue is still full: answer it 503, as for a full queue.
    Refused,
    /// It had left meanwhile; a place it was given went back.
    Gone,
}

/// Something the shard must do after a gate call.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect<P> {
    /// Give this local waiter the slot it was waiting for.
    Wake { waiter: WaiterId, pod: P },
    /// Send this held slot to another shard (its oldest waiter is older than ours).
    Grant { shard: usize, pod: P },
    /// This local waiter lost its place to a request of a higher band: answer it 503, as for a
    /// full queue. Its places in the revision and the process went to that request.
    Shed { waiter: WaiterId },
    /// Ask `shard` to shed a waiter of a band below `below` for this shard's request `waiter`
    /// (which is [`Admission::Displacing`]); its answer goes to [`LocalQueue::receive_place`]
    /// here. The shell carries both as it carries grants; an ask that cannot be delivered is
    /// answered "nothing shed" at once.
    Evict {
        shard: usize,
        below: u8,
        waiter: WaiterId,
    },
}

/// One shard's waiters for one revision.
#[derive(Debug)]
pub struct LocalQueue {
    shard: usize,
    waiters: Waiters,
    /// Requests waiting for another shard's answer to an eviction ([`Admission::Displacing`]),
    /// with their class. Empty without a policy.
    displacing: Vec<(WaiterId, Class)>,
    next_id: WaiterId,
}

impl LocalQueue {
    pub fn new(shard: usize) -> LocalQueue {
        LocalQueue {
            shard,
            waiters: Waiters::default(),
            displacing: Vec::new(),
            next_id: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// The revision's priority policy: `Some(bands)`, or `None` for arrival order. Waiters
    /// already queued keep their places (`Waiters::set_policy`); the head is published again.
    pub fn set_policy(&mut self, gate: &RevisionGate, bands: Option<u8>, default_band: u8) {
        self.waiters
            .set_policy(bands, default_band, || gate.fair_clock());
        if bands.is_none() {
            // Arrival order publishes no band: nothing here may be shed for another shard.
            gate.heads[self.shard]
                .lowest_band
                .store(NO_BAND, Ordering::Relaxed);
        }
        self.publish_head(gate);
    }

    /// A request arrives on this shard. `try_acquire` picks a pod and takes a slot on it (the
    /// load balancer over the shard's routable pods).
    #[inline]
    pub fn admit<P>(
        &mut self,
        gate: &RevisionGate,
        limits: QueueLimits,
        try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) -> Admission<P> {
        self.admit_as(gate, limits, Class::default(), try_acquire, effects)
    }

    /// [`LocalQueue::admit`] for a request of `class` (which only a priority policy reads).
    /// When the queue is full, a request of a higher band than some waiter here takes the place
    /// of the newest waiter of the lowest such band, which is shed ([`Effect::Shed`]).
    pub fn admit_as<P>(
        &mut self,
        gate: &RevisionGate,
        limits: QueueLimits,
        class: Class,
        mut try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) -> Admission<P> {
        // The fast path: one load of a line that is written only when requests queue.
        if gate.waiting_now() == 0 {
            if let Some(pod) = try_acquire() {
                return Admission::Proceed(pod);
            }
        }
        if !gate.reserve(limits) {
            // Full. The newest waiter of the lowest band below this request's loses its place
            // to it: here when no other shard publishes a lower band (no message needed), else
            // on the shard with the lowest. A waiter shed here passes its places, in the
            // revision and in the process, to this request without giving them back, so
            // neither count moves, not even for an instant.
            let Waiters::Banded(_) = self.waiters else {
                return Admission::Rejected;
            };
            // A band past the last waits in the last, and sheds only what is below that.
            let band = class.band.min(self.waiters.bands() - 1);
            let here = self.waiters.lowest_band().filter(|&lowest| lowest < band);
            if let Some((there, shard)) = gate.lowest_band_below(band, self.shard) {
                if here.is_none_or(|here| there < here) {
                    return self.displace(class, band, shard, effects);
                }
            }
            let Some(shed) = self.waiters.shed_below(band, || gate.fair_clock()) else {
                return Admission::Rejected;
            };
            effects.push(Effect::Shed { waiter: shed.id });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue_in_place(gate, class, id, try_acquire, effects);
        Admission::Queued(id)
    }

    /// Full, and `shard` has a lower band waiting than this one: asks it to shed a waiter below
    /// `band` (the request's, within the policy's bands) for this request.
    fn displace<P>(
        &mut self,
        class: Class,
        band: u8,
        shard: usize,
        effects: &mut Vec<Effect<P>>,
    ) -> Admission<P> {
        let id = self.next_id;
        self.next_id += 1;
        self.displacing.push((id, class));
        effects.push(Effect::Evict {
            shard,
            below: band,
            waiter: id,
        });
        Admission::Displacing(id)
    }

    /// Another shard asks this one to shed a waiter of a band below `below` for its arrival.
    /// True when one was shed ([`Effect::Shed`]): its places now belong to that arrival and
    /// travel with the answer, to [`LocalQueue::receive_place`] on the asking shard.
    pub fn evict<P>(
        &mut self,
        gate: &RevisionGate,
        below: u8,
        effects: &mut Vec<Effect<P>>,
    ) -> bool {
        let Some(shed) = self.waiters.shed_below(below, || gate.fair_clock()) else {
            return false;
        };
        self.publish_head(gate);
        effects.push(Effect::Shed { waiter: shed.id });
        true
    }

    /// The answer to this shard's eviction for `waiter` arrives: `placed` when a waiter was
    /// shed for it, whose places it carries. The request queues in them; with nothing shed it
    /// tries the bounds once more (a place may have come free meanwhile). A request that left
    /// meanwhile gives the places back.
    pub fn receive_place<P>(
        &mut self,
        gate: &RevisionGate,
        limits: QueueLimits,
        waiter: WaiterId,
        placed: bool,
        try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) -> Placement {
        let Some(class) = self.take_displacing(waiter) else {
            if placed {
                gate.unreserve();
            }
            return Placement::Gone;
        };
        if !placed && !gate.reserve(limits) {
            return Placement::Refused;
        }
        self.queue_in_place(gate, class, waiter, try_acquire, effects);
        Placement::Queued
    }

    /// Removes `waiter` from the requests displacing; its class, if it was one.
    fn take_displacing(&mut self, waiter: WaiterId) -> Option<Class> {
        let at = self.displacing.iter().position(|&(id, _)| id == waiter)?;
        Some(self.displacing.swap_remove(at).1)
    }

    /// Queues request `id`, whose places are held, and dispatches.
    fn queue_in_place<P>(
        &mut self,
        gate: &RevisionGate,
        class: Class,
        id: WaiterId,
        try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) {
        self.waiters.push(
            class,
            id,
            || gate.next_ticket.fetch_add(1, Ordering::SeqCst),
            || gate.fair_clock(),
        );
        self.publish_head(gate);
        // Counted as waiting and published before this dispatch (which opens with the fence)
        // looks for a slot: see "No lost wake-up".
        self.dispatch(gate, try_acquire, effects);
    }

    /// Hands free slots to the oldest waiters, here or on other shards, until either runs out.
    /// Call after releasing a slot when `gate.waiting() > 0`, and after a grant could not be used.
    pub fn dispatch<P>(
        &mut self,
        gate: &RevisionGate,
        mut try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) {
        // Orders what this shard wrote before (a waiter queued, a slot given back) before the
        // reads below; the other side of "No lost wake-up" has its own fence.
        fence(Ordering::SeqCst);
        while gate.waiting_now() > 0 {
            let Some(shard) = gate.oldest_shard() else {
                return;
            };
            let Some(pod) = try_acquire() else { return };
            if shard == self.shard {
                // Only this shard writes its head, so a head naming us means our queue is not
                // empty; should that ever break, bounce the slot through a grant to ourselves,
                // which releases it and dispatches again.
                match self.pop_oldest(gate) {
                    Some(waiter) => effects.push(Effect::Wake { waiter, pod }),
                    None => {
                        debug_assert!(false, "head published for an empty queue");
                        effects.push(Effect::Grant { shard, pod });
                        return;
                    }
                }
            } else {
                effects.push(Effect::Grant { shard, pod });
                // The remote shard pops its waiter when the grant arrives; until then our view
                // of heads is unchanged, so stop rather than send it every free slot.
                return;
            }
        }
    }

    /// A slot sent by another shard arrives. With a waiter here it is woken and the dispatch
    /// chain continues (more slots may be free: a grant moves one slot, a dispatch that sent it
    /// stopped there). With none, the slot comes back: the caller releases it and calls
    /// [`LocalQueue::dispatch`] so it finds the next oldest waiter.
    pub fn receive_grant<P>(
        &mut self,
        gate: &RevisionGate,
        pod: P,
        try_acquire: impl FnMut() -> Option<P>,
        effects: &mut Vec<Effect<P>>,
    ) -> Option<P> {
        let Some(waiter) = self.pop_oldest(gate) else {
            return Some(pod);
        };
        effects.push(Effect::Wake { waiter, pod });
        self.dispatch(gate, try_acquire, effects);
        None
    }

    /// A waiter gave up (client gone, timeout): its place is freed at once. One still
    /// displacing holds no place yet; the one it may be given goes back when the answer comes.
    pub fn cancel(&mut self, gate: &RevisionGate, waiter: WaiterId) -> bool {
        if !self.waiters.remove(waiter, || gate.fair_clock()) {
            return self.take_displacing(waiter).is_some();
        }
        gate.unreserve();
        self.publish_head(gate);
        true
    }

    /// The revision is gone from this shard: every local waiter leaves the queue and gives its
    /// places back, in the revision and in the process (the shell answers the requests itself).
    /// Without this, waiters of a removed revision would hold process-wide places for good.
    /// Returns how many left.
    pub fn cancel_all(&mut self, gate: &RevisionGate) -> usize {
        let left = self.waiters.len() + self.displacing.len();
        self.displacing.clear();
        for _ in self.waiters.drain(|| gate.fair_clock()) {
            gate.unreserve();
        }
        self.publish_head(gate);
        left
    }

    fn pop_oldest(&mut self, gate: &RevisionGate) -> Option<WaiterId> {
        let waiter = self.waiters.pop(|| gate.fair_clock())?;
        gate.unreserve();
        self.publish_head(gate);
        Some(waiter.id)
    }

    fn publish_head(&self, gate: &RevisionGate) {
        let published = &gate.heads[self.shard];
        let head = self.waiters.head_key().unwrap_or(NONE);
        published.key.store(head, Ordering::SeqCst);
        if let Waiters::Banded(_) = self.waiters {
            let lowest = self.waiters.lowest_band().map_or(NO_BAND, u32::from);
            published.lowest_band.store(lowest, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

/// Model checks of the cross-shard hand-off under loom, which runs every interleaving of the
/// shards' atomic accesses (and the weak-memory outcomes the C11 model allows for them). Run
/// with `RUSTFLAGS="--cfg loom" cargo test -p kactivator-shards --release --lib loom`.
///
/// Two shards, one revision, one pod with one slot. Each shard is a thread driving the gate the
/// way `replica::LocalRevision` does: a release is a decrement of the slot counter followed by
/// a dispatch if [`RevisionGate::waiting`] is non-zero, and grants travel through a mailbox per
/// shard that only its own thread drains. After the threads end, the remaining grants are
/// delivered and the requests still running finish one by one, checking at every quiet point
/// that the pod is not over-committed, that every taken slot is held by a running request,
/// and that a free slot never leaves a request waiting; at the end every queued request was
/// woken exactly once or cancelled and every count is back to zero.
#[cfg(all(test, loom))]
mod loom_tests;
