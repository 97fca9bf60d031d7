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
mod tests {
    use super::*;
    use crate::throttle::slots::PodSlots;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashMap, HashSet};

    const LIMITS: QueueLimits = QueueLimits {
        revision_depth: 1000,
    };

    fn acquire_from(pods: &[PodSlots]) -> impl FnMut() -> Option<usize> + '_ {
        move || pods.iter().position(PodSlots::try_acquire)
    }

    #[test]
    fn requests_proceed_while_nobody_waits_and_queue_when_full() {
        let gate = RevisionGate::new(1);
        let pods = [PodSlots::new(1)];
        let mut queue = LocalQueue::new(0);
        let mut effects = Vec::new();
        assert_eq!(
            queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Proceed(0)
        );
        assert_eq!(
            queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        assert!(effects.is_empty());
        // The holder finishes: release, then dispatch because someone waits.
        assert!(pods[0].release());
        queue.dispatch(&gate, acquire_from(&pods), &mut effects);
        assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
        assert_eq!(gate.waiting(), 0);
    }

    #[test]
    fn a_newcomer_does_not_barge_past_a_waiter() {
        let gate = RevisionGate::new(2);
        let pods = [PodSlots::new(1)];
        let (mut first, mut second) = (LocalQueue::new(0), LocalQueue::new(1));
        let mut effects = Vec::new();
        assert_eq!(
            first.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Proceed(0)
        );
        assert_eq!(
            first.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        // The slot frees but, before anyone dispatches, a newcomer arrives on another shard:
        // it must queue, and the dispatch it runs serves the older waiter on shard 0.
        assert!(pods[0].release());
        assert_eq!(
            second.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        assert_eq!(effects, vec![Effect::Grant { shard: 0, pod: 0 }]);
        let Effect::Grant { pod, .. } = effects.pop().unwrap() else {
            unreachable!()
        };
        assert_eq!(
            first.receive_grant(&gate, pod, acquire_from(&pods), &mut effects),
            None
        );
        assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
        assert_eq!(gate.waiting(), 1, "the newcomer still waits");
    }

    #[test]
    fn the_queue_bound_rejects_and_cancellation_frees_a_place() {
        let gate = RevisionGate::new(1);
        let pods = [PodSlots::new(0)];
        let mut queue = LocalQueue::new(0);
        let mut effects = Vec::new();
        let limits = QueueLimits { revision_depth: 2 };
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Queued(0)
        );
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Queued(1)
        );
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Rejected
        );
        assert!(queue.cancel(&gate, 0));
        assert_eq!(
            queue.admit(&gate, limits, acquire_from(&pods), &mut effects),
            Admission::Queued(2)
        );
    }

    #[test]
    fn the_process_cap_is_shared_by_every_revision() {
        let process = Arc::new(ProcessQueue::new(3));
        let a = RevisionGate::with_process_queue(1, process.clone());
        let b = RevisionGate::with_process_queue(1, process.clone());
        assert!(Arc::ptr_eq(a.process_queue(), b.process_queue()));
        let (pods_a, pods_b) = ([PodSlots::new(0)], [PodSlots::new(0)]);
        let (mut queue_a, mut queue_b) = (LocalQueue::new(0), LocalQueue::new(0));
        let mut effects = Vec::new();
        let limits = QueueLimits { revision_depth: 2 };
        let mut admit_a =
            |queue: &mut LocalQueue| queue.admit(&a, limits, acquire_from(&pods_a), &mut effects);
        assert_eq!(admit_a(&mut queue_a), Admission::Queued(0));
        assert_eq!(admit_a(&mut queue_a), Admission::Queued(1));
        assert_eq!(admit_a(&mut queue_a), Admission::Rejected, "a's depth");
        assert_eq!(process.queued(), 2);
        let admit_b = |queue: &mut LocalQueue| {
            queue.admit(&b, limits, acquire_from(&pods_b), &mut Vec::new())
        };
        assert_eq!(admit_b(&mut queue_b), Admission::Queued(0));
        assert_eq!(
            admit_b(&mut queue_b),
            Admission::Rejected,
            "the process cap, though b has room"
        );
        assert_eq!(b.waiting(), 1, "the revision place is given back");
        assert_eq!(process.queued(), 3);

        // A cancellation on one revision frees a place for the other.
        assert!(queue_a.cancel(&a, 0));
        assert_eq!(process.queued(), 2);
        assert_eq!(admit_b(&mut queue_b), Admission::Queued(1));
        assert_eq!(process.queued(), 3);

        // Serving frees both places.
        pods_b[0].set_capacity(2);
        let mut effects = Vec::new();
        queue_b.dispatch(&b, acquire_from(&pods_b), &mut effects);
        assert_eq!(effects.len(), 2);
        assert_eq!((b.waiting(), process.queued()), (0, 1));
        assert!(queue_a.cancel(&a, 1));
        assert_eq!((a.waiting(), process.queued()), (0, 0));
    }

    #[test]
    fn the_fast_path_needs_no_place_in_the_process_queue() {
        let process = Arc::new(ProcessQueue::new(0));
        let gate = RevisionGate::with_process_queue(1, process.clone());
        let pods = [PodSlots::new(1)];
        let mut queue = LocalQueue::new(0);
        let mut effects = Vec::new();
        assert_eq!(
            queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Proceed(0)
        );
        assert_eq!(
            queue.admit(&gate, LIMITS, acquire_from(&pods), &mut effects),
            Admission::Rejected
        );
        assert_eq!((gate.waiting(), process.queued()), (0, 0));
    }

    #[test]
    fn a_gate_made_with_new_has_an_unlimited_process_queue_of_its_own() {
        let (a, b) = (RevisionGate::new(1), RevisionGate::new(1));
        assert_eq!(a.process_queue().limit(), ProcessQueue::UNLIMITED);
        assert!(!Arc::ptr_eq(a.process_queue(), b.process_queue()));
        let pods = [PodSlots::new(0)];
        let mut effects = Vec::new();
        let admission = LocalQueue::new(0).admit(&a, LIMITS, acquire_from(&pods), &mut effects);
        assert_eq!(admission, Admission::Queued(0));
        assert_eq!(a.process_queue().queued(), 1);
        assert_eq!(b.process_queue().queued(), 0);
    }

    #[test]
    fn a_removed_revision_gives_back_every_place_of_its_waiters() {
        let process = Arc::new(ProcessQueue::new(10));
        let gate = RevisionGate::with_process_queue(2, process.clone());
        let pods = [PodSlots::new(0)];
        let mut queues = [LocalQueue::new(0), LocalQueue::new(1)];
        let mut effects = Vec::new();
        for shard in [0, 1, 0] {
            let admission = queues[shard].admit(&gate, LIMITS, acquire_from(&pods), &mut effects);
            assert!(matches!(admission, Admission::Queued(_)));
        }
        let [mut here, mut there] = queues;
        assert_eq!(gate.oldest_shard(), Some(0));
        assert_eq!(here.cancel_all(&gate), 2);
        assert!(here.is_empty());
        assert_eq!((gate.waiting(), process.queued()), (1, 1));
        assert_eq!(gate.oldest_shard(), Some(1), "shard 0 no longer has a head");
        assert!(!here.cancel(&gate, 0), "already gone");
        assert_eq!(there.cancel_all(&gate), 1);
        assert_eq!((gate.waiting(), process.queued()), (0, 0));
        assert_eq!(gate.oldest_shard(), None);
    }

    /// A queue under a priority policy of three bands.
    fn banded(shard: usize, gate: &RevisionGate) -> LocalQueue {
        let mut queue = LocalQueue::new(shard);
        queue.set_policy(gate, Some(3), 1);
        queue
    }

    fn band(band: u8) -> Class {
        Class { band, flow: 0 }
    }

    #[test]
    fn a_freed_slot_goes_to_the_highest_band_waiting_on_any_shard() {
        let gate = RevisionGate::new(2);
        let pods = [PodSlots::new(1)];
        let (mut low, mut high) = (banded(0, &gate), banded(1, &gate));
        let mut effects = Vec::new();
        let admit = |queue: &mut LocalQueue, class, effects: &mut Vec<_>| {
            queue.admit_as(&gate, LIMITS, class, acquire_from(&pods), effects)
        };
        assert_eq!(
            admit(&mut low, band(0), &mut effects),
            Admission::Proceed(0)
        );
        assert_eq!(admit(&mut low, band(0), &mut effects), Admission::Queued(0));
        assert_eq!(admit(&mut low, band(0), &mut effects), Admission::Queued(1));
        // Later, on the other shard, a request of the top band.
        assert_eq!(
            admit(&mut high, band(2), &mut effects),
            Admission::Queued(0)
        );
        assert!(effects.is_empty());
        // The slot frees on the low shard: it goes to the other shard's high waiter.
        assert!(pods[0].release());
        low.dispatch(&gate, acquire_from(&pods), &mut effects);
        assert_eq!(effects, vec![Effect::Grant { shard: 1, pod: 0 }]);
        effects.clear();
        assert_eq!(
            high.receive_grant(&gate, 0, acquire_from(&pods), &mut effects),
            None
        );
        assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
        effects.clear();
        // Then the low waiters, oldest first.
        assert!(pods[0].release());
        high.dispatch(&gate, acquire_from(&pods), &mut effects);
        assert_eq!(effects, vec![Effect::Grant { shard: 0, pod: 0 }]);
        effects.clear();
        assert_eq!(
            low.receive_grant(&gate, 0, acquire_from(&pods), &mut effects),
            None
        );
        assert_eq!(effects, vec![Effect::Wake { waiter: 0, pod: 0 }]);
    }

    #[test]
    fn a_full_queue_sheds_its_lowest_band_for_a_higher_arrival() {
        // (what, depth, process cap, bands of the waiters, the arrival's band, what becomes of
        // it, the waiter shed)
        type Row = (
            &'static str,
            u32,
            u32,
            &'static [u8],
            u8,
            Admission<usize>,
            Option<WaiterId>,
        );
        let table: &[Row] = &[
            ("room: queued", 3, 9, &[0, 0], 2, Admission::Queued(2), None),
            (
                "revision full: the newest of band 0",
                3,
                9,
                &[1, 0, 0],
                2,
                Admission::Queued(3),
                Some(2),
            ),
            (
                "process full: the same",
                9,
                3,
                &[1, 0, 0],
                2,
                Admission::Queued(3),
                Some(2),
            ),
            (
                "band 1 sheds band 0",
                3,
                9,
                &[0, 2, 0],
                1,
                Admission::Queued(3),
                Some(2),
            ),
            (
                "nothing lower: refused",
                2,
                9,
                &[1, 2],
                1,
                Admission::Rejected,
                None,
            ),
            (
                "the lowest band is refused",
                2,
                9,
                &[0, 0],
                0,
                Admission::Rejected,
                None,
            ),
        ];
        for &(what, depth, cap, waiting, arriving, ref admitted, shed) in table {
            let process = Arc::new(ProcessQueue::new(cap));
            let gate = RevisionGate::with_process_queue(1, process.clone());
            let pods = [PodSlots::new(0)];
            let mut queue = banded(0, &gate);
            let limits = QueueLimits {
                revision_depth: depth,
            };
            for &waiter in waiting {
                let admission = queue.admit_as(
                    &gate,
                    limits,
                    band(waiter),
                    acquire_from(&pods),
                    &mut Vec::new(),
                );
                assert!(matches!(admission, Admission::Queued(_)), "{what}");
            }
            let mut effects = Vec::new();
            let admission = queue.admit_as(
                &gate,
                limits,
                band(arriving),
                acquire_from(&pods),
                &mut effects,
            );
            assert_eq!(&admission, admitted, "{what}");
            let expected: Vec<_> = shed
                .map(|waiter| Effect::Shed { waiter })
                .into_iter()
                .collect();
            assert_eq!(effects, expected, "{what}");
            assert_eq!(
                queue.len(),
                waiting.len() + usize::from(shed.is_none() && admission != Admission::Rejected),
                "{what}"
            );
            assert_eq!(
                gate.waiting() as usize,
                queue.len(),
                "{what}: the places passed on"
            );
            assert_eq!(process.queued() as usize, queue.len(), "{what}");
            assert!(
                !queue.cancel(&gate, shed.unwrap_or(WaiterId::MAX)),
                "{what}: the shed left"
            );
        }
    }

    #[test]
    fn without_a_policy_nothing_is_shed() {
        let gate = RevisionGate::new(1);
        let pods = [PodSlots::new(0)];
        let mut queue = LocalQueue::new(0);
        let limits = QueueLimits { revision_depth: 1 };
        let mut effects = Vec::new();
        let mut admit =
            |class| queue.admit_as(&gate, limits, class, acquire_from(&pods), &mut effects);
        assert_eq!(admit(band(0)), Admission::Queued(0));
        assert_eq!(admit(band(2)), Admission::Rejected);
        assert!(effects.is_empty());
    }

    #[test]
    fn a_full_queue_has_another_shard_shed_its_lowest_band_for_a_higher_arrival() {
        // Two shards under three bands, a depth of 2 taken by shard 0's waiters (ids 0 and 1),
        // a pod with no slot; a band-2 arrival on shard 1 asks shard 0 to shed. What happens on
        // either shard between the ask and the answer decides the rest.
        type Meanwhile = fn(&mut LocalQueue, &mut LocalQueue, &RevisionGate);
        // (what, bands of shard 0's waiters, meanwhile, a waiter shed, the answer's fate, the
        // waiting count after)
        type Row = (
            &'static str,
            [u8; 2],
            Meanwhile,
            Option<WaiterId>,
            Placement,
            u32,
        );
        let nothing: Meanwhile = |_, _, _| {};
        let table: &[Row] = &[
            (
                "the newest of the lowest band is shed; the arrival queues in its place",
                [0, 0],
                nothing,
                Some(1),
                Placement::Queued,
                2,
            ),
            (
                "the lowest band, not the newest waiter",
                [0, 1],
                nothing,
                Some(0),
                Placement::Queued,
                2,
            ),
            (
                "the low waiters left meanwhile: nothing to shed, but room at a second try",
                [0, 0],
                |zero, _, gate| {
                    assert!(zero.cancel(gate, 0) && zero.cancel(gate, 1));
                },
                None,
                Placement::Queued,
                1,
            ),
            (
                "the low waiter left and a high one took its place: refused",
                [0, 2],
                |zero, _, gate| {
                    assert!(zero.cancel(gate, 0));
                    let admitted =
                        zero.admit_as(gate, LIMIT_2, band(2), || None::<usize>, &mut Vec::new());
                    assert_eq!(admitted, Admission::Queued(2));
                },
                None,
                Placement::Refused,
                2,
            ),
            (
                "the arrival left before the answer: the place it was given goes back",
                [0, 0],
                |_, one, gate| assert!(one.cancel(gate, 0), "a displacing request cancels"),
                Some(1),
                Placement::Gone,
                1,
            ),
        ];
        const LIMIT_2: QueueLimits = QueueLimits { revision_depth: 2 };
        for &(what, bands, meanwhile, shed, fate, waiting) in table {
            let gate = RevisionGate::new(2);
            let (mut zero, mut one) = (banded(0, &gate), banded(1, &gate));
            let mut effects: Vec<Effect<usize>> = Vec::new();
            for band_of in bands {
                let admitted = zero.admit_as(&gate, LIMIT_2, band(band_of), || None, &mut effects);
                assert!(matches!(admitted, Admission::Queued(_)), "{what}");
            }
            let arrival = one.admit_as(&gate, LIMIT_2, band(2), || None, &mut effects);
            assert_eq!(arrival, Admission::Displacing(0), "{what}");
            assert_eq!(
                effects,
                [Effect::Evict {
                    shard: 0,
                    below: 2,
                    waiter: 0
                }],
                "{what}"
            );
            effects.clear();
            meanwhile(&mut zero, &mut one, &gate);
            let placed = zero.evict(&gate, 2, &mut effects);
            assert_eq!(placed, shed.is_some(), "{what}");
            let shed_now: Vec<_> = effects
                .drain(..)
                .map(|effect| match effect {
                    Effect::Shed { waiter } => waiter,
                    other => panic!("{what}: {other:?}"),
                })
                .collect();
            assert_eq!(shed_now, shed.into_iter().collect::<Vec<_>>(), "{what}");
            let placement = one.receive_place(&gate, LIMIT_2, 0, placed, || None, &mut effects);
            assert_eq!(placement, fate, "{what}");
            assert!(effects.is_empty(), "{what}: no slot anywhere");
            assert_eq!(gate.waiting(), waiting, "{what}");
            assert_eq!(gate.process_queue().queued(), waiting, "{what}");
            assert_eq!(
                zero.len() + one.len(),
                waiting as usize,
                "{what}: the count is the queues'"
            );
        }
    }

    #[test]
    fn the_lowest_band_anywhere_is_shed_and_a_tie_stays_on_the_arrivals_shard() {
        // Two shards under three bands, depth 2: one waiter on each, then a band-2 arrival on
        // shard 0. (what, band waiting on shard 0, band waiting on shard 1, the arrival's fate)
        type Row = (
            &'static str,
            u8,
            u8,
            Admission<usize>,
            &'static [Effect<usize>],
        );
        let table: &[Row] = &[
            (
                "lower on the other shard: asked there",
                1,
                0,
                Admission::Displacing(1),
                &[Effect::Evict {
                    shard: 1,
                    below: 2,
                    waiter: 1,
                }],
            ),
            (
                "lower here: shed here",
                0,
                1,
                Admission::Queued(1),
                &[Effect::Shed { waiter: 0 }],
            ),
            (
                "the same band on both: shed here, no message",
                0,
                0,
                Admission::Queued(1),
                &[Effect::Shed { waiter: 0 }],
            ),
        ];
        let limits = QueueLimits { revision_depth: 2 };
        for &(what, here, there, ref fate, expected) in table {
            let gate = RevisionGate::new(2);
            let (mut zero, mut one) = (banded(0, &gate), banded(1, &gate));
            let mut effects: Vec<Effect<usize>> = Vec::new();
            assert_eq!(
                zero.admit_as(&gate, limits, band(here), || None, &mut effects),
                Admission::Queued(0)
            );
            assert_eq!(
                one.admit_as(&gate, limits, band(there), || None, &mut effects),
                Admission::Queued(0)
            );
            let arrival = zero.admit_as(&gate, limits, band(2), || None, &mut effects);
            assert_eq!(&arrival, fate, "{what}");
            assert_eq!(effects, expected, "{what}");
        }
    }

    #[test]
    fn a_lower_band_on_another_shard_is_asked_only_under_a_policy_and_only_when_lower() {
        let gate = RevisionGate::new(2);
        let limits = QueueLimits { revision_depth: 1 };
        let (mut zero, mut one) = (banded(0, &gate), banded(1, &gate));
        let mut effects: Vec<Effect<usize>> = Vec::new();
        assert_eq!(
            zero.admit_as(&gate, limits, band(1), || None, &mut effects),
            Admission::Queued(0)
        );
        assert_eq!(
            one.admit_as(&gate, limits, band(1), || None, &mut effects),
            Admission::Rejected,
            "the same band"
        );
        assert_eq!(
            one.admit_as(&gate, limits, band(0), || None, &mut effects),
            Admission::Rejected,
            "a lower band"
        );
        assert!(effects.is_empty());
        // Arrival order publishes no band: the same queue, switched off, is asked nothing.
        zero.set_policy(&gate, None, 0);
        one.set_policy(&gate, None, 0);
        assert_eq!(
            one.admit_as(&gate, limits, band(2), || None, &mut effects),
            Admission::Rejected
        );
        assert!(effects.is_empty());
    }

    #[test]
    fn a_grant_for_a_shard_whose_waiter_left_comes_back() {
        let gate = RevisionGate::new(2);
        let mut remote = LocalQueue::new(1);
        let mut effects = Vec::new();
        let returned = remote.receive_grant(&gate, 7, || None, &mut effects);
        assert_eq!(
            returned,
            Some(7),
            "nobody to give it to: release and re-dispatch"
        );
        assert!(effects.is_empty());
    }

    /// One step of a simulated run: shards act in any order, grants arrive late and in any order.
    #[derive(Clone, Debug)]
    enum Step {
        Arrive(usize),
        /// An arrival on a shard whose failed slot attempt races with a release on another
        /// shard: the release lands between the attempt and the enqueue, and its releaser saw
        /// nobody waiting (the window "No lost wake-up" is about).
        ArriveRacing(usize, usize),
        /// An arrival of a band (flow 0).
        ArriveAs(usize, u8),
        /// An arrival of a band and a flow.
        ArriveFlow(usize, u8, u64),
        Finish(usize),
        Deliver(usize),
        /// An eviction asked of another shard arrives there.
        DeliverEviction(usize),
        /// The answer to an eviction arrives back.
        DeliverPlace(usize),
        /// A queued or displacing request gives up.
        Cancel(usize),
        /// A new snapshot raises a pod's capacity; the shard applying it dispatches.
        Grow(usize, usize),
    }

    impl Step {
        /// The same step with its shard taken modulo `shards`.
        fn on(&self, shards: usize) -> Step {
            match *self {
                Step::Arrive(shard) => Step::Arrive(shard % shards),
                Step::ArriveAs(shard, band) => Step::ArriveAs(shard % shards, band),
                Step::ArriveFlow(shard, band, flow) => Step::ArriveFlow(shard % shards, band, flow),
                Step::ArriveRacing(shard, pick) => Step::ArriveRacing(shard % shards, pick),
                ref other => other.clone(),
            }
        }
    }

    fn step(shards: usize) -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..shards).prop_map(Step::Arrive),
            2 => (0..shards, 0..64usize).prop_map(|(shard, pick)| Step::ArriveRacing(shard, pick)),
            3 => (0..64usize).prop_map(Step::Finish),
            3 => (0..64usize).prop_map(Step::Deliver),
            2 => (0..64usize).prop_map(Step::DeliverEviction),
            2 => (0..64usize).prop_map(Step::DeliverPlace),
            1 => (0..64usize).prop_map(Step::Cancel),
            1 => (0..shards, 0..8usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
        ]
    }

    /// One revision of a simulated activator: its gate, pods and shard queues, and the
    /// bookkeeping to check every request is answered exactly once.
    struct Revision {
        gate: RevisionGate,
        limits: QueueLimits,
        pods: Vec<PodSlots>,
        queues: Vec<LocalQueue>,
        /// Requests holding a slot: (shard, pod).
        running: Vec<(usize, usize)>,
        /// Grants travelling between shards: (to shard, pod).
        in_transit: Vec<(usize, usize)>,
        /// Evictions travelling: (to shard, the band to shed below, from shard, its request).
        evictions: Vec<(usize, u8, usize, WaiterId)>,
        /// Answers travelling back: (to shard, its request, whether places come with it).
        places: Vec<(usize, WaiterId, bool)>,
        /// Requests waiting for the answer to their eviction, by (shard, id), with their band
        /// and arrival order.
        displacing: BTreeMap<(usize, WaiterId), (u8, u64)>,
        /// Displacing requests refused when the answer came.
        refused: u64,
        /// Queued requests per shard, by waiter id, with their band (0 without a policy) and
        /// arrival order.
        queued: BTreeMap<(usize, WaiterId), (u8, u64)>,
        /// The priority policy's bands, or `None`.
        bands: Option<u8>,
        /// Waiters that lost their place to a higher band.
        shed: u64,
        served: HashSet<(usize, WaiterId)>,
        /// The flow of each queued request that arrived with one (`Step::ArriveFlow`).
        flow_of: HashMap<(usize, WaiterId), u64>,
        /// Requests starting to wait and being served, in order, by (band, flow).
        log: Vec<Fairness>,
    }

    /// An entry of [`Revision::log`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Fairness {
        Waits { band: u8, flow: u64 },
        Served { band: u8, flow: u64 },
    }

    impl Revision {
        fn apply(&mut self, shard: usize, effects: Vec<Effect<usize>>) -> u64 {
            let mut overtakes = 0;
            for effect in effects {
                match effect {
                    Effect::Wake { waiter, pod } => overtakes += self.serve(shard, waiter, pod),
                    Effect::Grant { shard: to, pod } => self.in_transit.push((to, pod)),
                    Effect::Shed { waiter } => {
                        assert!(
                            self.queued.remove(&(shard, waiter)).is_some(),
                            "shed a request that was not waiting"
                        );
                        self.flow_of.remove(&(shard, waiter));
                        self.shed += 1;
                    }
                    Effect::Evict {
                        shard: to,
                        below,
                        waiter,
                    } => {
                        assert_ne!(to, shard, "an eviction asked of its own shard");
                        self.evictions.push((to, below, shard, waiter));
                    }
                }
            }
            overtakes
        }

        /// Places travelling with answers: counted as waiting, in no queue yet.
        fn travelling(&self) -> usize {
            self.places.iter().filter(|&&(_, _, placed)| placed).count()
        }

        /// An eviction arrives at its shard: a waiter below its band is shed, if one is left,
        /// and the answer starts back.
        fn deliver_eviction(&mut self, pick: usize) {
            let (to, below, from, waiter) = self.evictions.swap_remove(pick % self.evictions.len());
            let lowest = self
                .queued
                .iter()
                .filter(|((on, _), _)| *on == to)
                .map(|(_, &(band, _))| band)
                .min();
            let mut effects = Vec::new();
            let placed = self.queues[to].evict(&self.gate, below, &mut effects);
            assert_eq!(
                placed,
                lowest.is_some_and(|lowest| lowest < below),
                "shed exactly when a lower band waits"
            );
            if let [Effect::Shed { waiter: shed }] = effects[..] {
                assert_eq!(
                    self.queued[&(to, shed)].0,
                    lowest.unwrap(),
                    "not the lowest band"
                );
            } else {
                assert!(effects.is_empty() && !placed, "{effects:?}");
            }
            self.apply(to, effects);
            self.places.push((from, waiter, placed));
        }

        /// An answer arrives back: its request queues in the place it carries, tries the bounds
        /// once more, or is gone.
        fn deliver_place(&mut self, pick: usize, process: &ProcessQueue) -> u64 {
            let (to, waiter, placed) = self.places.swap_remove(pick % self.places.len());
            let waiting = self.queued.len() + self.travelling();
            let full = waiting >= self.limits.revision_depth as usize
                || process.queued() >= process.limit();
            let mut effects = Vec::new();
            let pods = &self.pods;
            let placement = self.queues[to].receive_place(
                &self.gate,
                self.limits,
                waiter,
                placed,
                || pods.iter().position(PodSlots::try_acquire),
                &mut effects,
            );
            let displacing = self.displacing.remove(&(to, waiter));
            match placement {
                Placement::Queued => {
                    assert!(placed || !full, "queued past a bound without a place");
                    let entry = displacing.expect("a displacing request queued");
                    self.queued.insert((to, waiter), entry);
                }
                Placement::Refused => {
                    assert!(
                        !placed && full,
                        "refused with a place, or below both bounds"
                    );
                    assert!(displacing.is_some());
                    self.refused += 1;
                }
                Placement::Gone => assert!(displacing.is_none(), "a waiting request was gone"),
            }
            self.apply(to, effects)
        }

        /// The band a request of `band` waits in.
        fn band_of(&self, band: u8) -> u8 {
            self.bands.map_or(0, |bands| band.min(bands - 1))
        }

        /// Serves a waiter; returns how many waiters of this revision it overtook: of a higher
        /// band, or of its band and older.
        fn serve(&mut self, shard: usize, waiter: WaiterId, pod: usize) -> u64 {
            let (band, arrival) = self
                .queued
                .remove(&(shard, waiter))
                .expect("a woken waiter was queued and not yet served");
            assert!(self.served.insert((shard, waiter)), "served twice");
            let flow = self.flow_of.remove(&(shard, waiter)).unwrap_or(0);
            self.log.push(Fairness::Served { band, flow });
            self.running.push((shard, pod));
            self.queued
                .values()
                .filter(|&&(other, older)| other > band || (other == band && older < arrival))
                .count() as u64
        }

        /// Dispatches on `shard`, as the shell does after a release or new capacity.
        fn dispatch_on(&mut self, shard: usize) -> u64 {
            let mut effects = Vec::new();
            let pods = &self.pods;
            self.queues[shard].dispatch(
                &self.gate,
                || pods.iter().position(PodSlots::try_acquire),
                &mut effects,
            );
            self.apply(shard, effects)
        }

        fn deliver(&mut self, shard: usize, pod: usize) -> u64 {
            let mut effects = Vec::new();
            let pods = &self.pods;
            let acquire = || pods.iter().position(PodSlots::try_acquire);
            let unused = self.queues[shard].receive_grant(&self.gate, pod, acquire, &mut effects);
            let mut overtakes = self.apply(shard, effects);
            if let Some(pod) = unused {
                assert!(self.pods[pod].release());
                overtakes += self.dispatch_on(shard);
            }
            overtakes
        }

        fn finish(&mut self, pick: usize) -> u64 {
            let (shard, pod) = self.running.swap_remove(pick % self.running.len());
            assert!(self.pods[pod].release());
            self.dispatch_on(shard)
        }

        /// Work conservation: with every grant delivered, nobody waits while a slot is free.
        fn check_work_conserving(&self) {
            if self.in_transit.is_empty() && !self.queued.is_empty() {
                for pod in &self.pods {
                    assert!(
                        !pod.has_free_slot(),
                        "a request waits while a slot is free ({}/{})",
                        pod.in_flight(),
                        pod.capacity()
                    );
                }
            }
        }

        fn check(&self) {
            for pod in &self.pods {
                assert!(
                    pod.in_flight() <= pod.capacity(),
                    "over-commit: {} > {}",
                    pod.in_flight(),
                    pod.capacity()
                );
            }
            let held = self.running.len() + self.in_transit.len();
            let in_flight: u32 = self.pods.iter().map(PodSlots::in_flight).sum();
            assert_eq!(
                in_flight as usize, held,
                "every slot is held by a request or a grant in transit"
            );
            let waiting = self.queued.len() + self.travelling();
            assert_eq!(
                self.gate.waiting() as usize,
                waiting,
                "the waiting count matches the queues and the places travelling"
            );
            assert!(
                waiting <= self.limits.revision_depth as usize,
                "{waiting} waiting past the revision depth {}",
                self.limits.revision_depth
            );
        }
    }

    /// A whole activator in one thread: shards, revisions sharing a process queue, in-flight
    /// grants.
    struct Simulation {
        process: Arc<ProcessQueue>,
        revisions: Vec<Revision>,
        arrivals: u64,
        overtakes: u64,
        rejected: u64,
    }

    impl Simulation {
        /// One revision with these pod capacities and an unlimited process queue.
        fn new(shards: usize, capacities: &[u32]) -> Simulation {
            Simulation::with_revisions(shards, &[(capacities, LIMITS)], ProcessQueue::UNLIMITED)
        }

        /// Revisions of their own pods and limits, all counting against one process cap.
        fn with_revisions(
            shards: usize,
            revisions: &[(&[u32], QueueLimits)],
            process_limit: u32,
        ) -> Simulation {
            let process = Arc::new(ProcessQueue::new(process_limit));
            let revisions = revisions
                .iter()
                .map(|&(capacities, limits)| Revision {
                    gate: RevisionGate::with_process_queue(shards, process.clone()),
                    limits,
                    pods: capacities
                        .iter()
                        .map(|&capacity| PodSlots::new(capacity))
                        .collect(),
                    queues: (0..shards).map(LocalQueue::new).collect(),
                    running: Vec::new(),
                    in_transit: Vec::new(),
                    evictions: Vec::new(),
                    places: Vec::new(),
                    displacing: BTreeMap::new(),
                    refused: 0,
                    queued: BTreeMap::new(),
                    bands: None,
                    shed: 0,
                    served: HashSet::new(),
                    flow_of: HashMap::new(),
                    log: Vec::new(),
                })
                .collect();
            Simulation {
                process,
                revisions,
                arrivals: 0,
                overtakes: 0,
                rejected: 0,
            }
        }

        /// Puts every revision under a priority policy of `bands` bands.
        fn with_bands(mut self, bands: u8) -> Simulation {
            for rev in &mut self.revisions {
                rev.bands = Some(bands);
                for queue in &mut rev.queues {
                    queue.set_policy(&rev.gate, Some(bands), 0);
                }
            }
            self
        }

        fn step(&mut self, revision: usize, step: &Step) {
            let revision = revision % self.revisions.len();
            let shards = self.revisions[revision].queues.len();
            let before = self.bounds(revision);
            let rev = &mut self.revisions[revision];
            let mut effects = Vec::new();
            match *step {
                Step::Arrive(shard) => {
                    let shard = shard % shards;
                    let pods = &rev.pods;
                    let admission = rev.queues[shard].admit(
                        &rev.gate,
                        rev.limits,
                        || pods.iter().position(PodSlots::try_acquire),
                        &mut effects,
                    );
                    self.record_arrival(revision, shard, 0, before, admission, effects);
                }
                Step::ArriveAs(shard, band) => {
                    let shard = shard % shards;
                    let pods = &rev.pods;
                    let admission = rev.queues[shard].admit_as(
                        &rev.gate,
                        rev.limits,
                        Class { band, flow: 0 },
                        || pods.iter().position(PodSlots::try_acquire),
                        &mut effects,
                    );
                    self.record_arrival(revision, shard, band, before, admission, effects);
                }
                Step::ArriveFlow(shard, band, flow) => {
                    let shard = shard % shards;
                    let pods = &rev.pods;
                    let admission = rev.queues[shard].admit_as(
                        &rev.gate,
                        rev.limits,
                        Class { band, flow },
                        || pods.iter().position(PodSlots::try_acquire),
                        &mut effects,
                    );
                    if let Admission::Queued(id) = admission {
                        // Before the effects, which may serve this very waiter.
                        rev.flow_of.insert((shard, id), flow);
                        let band = rev.band_of(band);
                        rev.log.push(Fairness::Waits { band, flow });
                    }
                    self.record_arrival(revision, shard, band, before, admission, effects);
                }
                Step::ArriveRacing(shard, pick) => {
                    let shard = shard % shards;
                    let gate = &rev.gate;
                    let pods = &rev.pods;
                    let running = &mut rev.running;
                    let mut raced = false;
                    let admission = rev.queues[shard].admit(
                        gate,
                        rev.limits,
                        || {
                            let got = pods.iter().position(PodSlots::try_acquire);
                            if got.is_none() && !raced && before.0 == 0 && !running.is_empty() {
                                // Another shard finishes right now; it reads `waiting` = 0 and so
                                // does not dispatch.
                                raced = true;
                                let (_, pod) = running.swap_remove(pick % running.len());
                                assert!(pods[pod].release());
                            }
                            got
                        },
                        &mut effects,
                    );
                    self.record_arrival(revision, shard, 0, before, admission, effects);
                }
                Step::Grow(shard, pod) => {
                    let shard = shard % shards;
                    let pod = pod % rev.pods.len();
                    rev.pods[pod].set_capacity(rev.pods[pod].capacity() + 2);
                    self.overtakes += rev.dispatch_on(shard);
                }
                Step::Finish(pick) if !rev.running.is_empty() => {
                    self.overtakes += rev.finish(pick);
                }
                Step::Deliver(pick) if !rev.in_transit.is_empty() => {
                    let (shard, pod) = rev.in_transit.swap_remove(pick % rev.in_transit.len());
                    self.overtakes += rev.deliver(shard, pod);
                }
                Step::DeliverEviction(pick) if !rev.evictions.is_empty() => {
                    rev.deliver_eviction(pick);
                }
                Step::DeliverPlace(pick) if !rev.places.is_empty() => {
                    self.overtakes += rev.deliver_place(pick, &self.process);
                }
                Step::Cancel(pick) if !rev.queued.is_empty() || !rev.displacing.is_empty() => {
                    let pick = pick % (rev.queued.len() + rev.displacing.len());
                    let &(shard, waiter) = match pick.checked_sub(rev.queued.len()) {
                        None => rev.queued.keys().nth(pick).unwrap(),
                        Some(pick) => rev.displacing.keys().nth(pick).unwrap(),
                    };
                    assert!(rev.queues[shard].cancel(&rev.gate, waiter));
                    rev.queued.remove(&(shard, waiter));
                    rev.displacing.remove(&(shard, waiter));
                    rev.flow_of.remove(&(shard, waiter));
                }
                _ => {}
            }
            self.check();
        }

        /// The revision's waiting count and the process's, before a step.
        fn bounds(&self, revision: usize) -> (u32, u32) {
            (
                self.revisions[revision].gate.waiting(),
                self.process.queued(),
            )
        }

        /// Books an arrival's outcome and applies the effects of its admission. A request may
        /// queue only below both bounds (or in the place of a lower band's waiter it shed), and
        /// be refused only at one of them.
        fn record_arrival(
            &mut self,
            revision: usize,
            shard: usize,
            band: u8,
            (waiting, queued): (u32, u32),
            admission: Admission<usize>,
            effects: Vec<Effect<usize>>,
        ) {
            let rev = &mut self.revisions[revision];
            let (depth, cap) = (rev.limits.revision_depth, self.process.limit());
            match admission {
                Admission::Proceed(pod) => {
                    assert_eq!(waiting, 0, "took a slot past a waiter");
                    rev.running.push((shard, pod));
                }
                Admission::Queued(id) => {
                    let band = rev.band_of(band);
                    let shed: Vec<WaiterId> = effects
                        .iter()
                        .filter_map(|effect| match effect {
                            Effect::Shed { waiter } => Some(*waiter),
                            _ => None,
                        })
                        .collect();
                    match shed[..] {
                        [] => assert!(
                            waiting < depth && queued < cap,
                            "queued at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                        ),
                        [waiter] => {
                            assert!(
                                waiting >= depth || queued >= cap,
                                "shed at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                            );
                            let (lower, _) = rev.queued[&(shard, waiter)];
                            assert!(lower < band, "shed a waiter of band {lower} for {band}");
                            let lowest = rev.queued.values().map(|&(other, _)| other).min();
                            assert_eq!(
                                lowest,
                                Some(lower),
                                "not the lowest band on any shard (ties go to the arrival's)"
                            );
                        }
                        _ => panic!("one arrival shed {shed:?}"),
                    }
                    rev.queued.insert((shard, id), (band, self.arrivals));
                }
                Admission::Displacing(id) => {
                    let band = rev.band_of(band);
                    assert!(
                        waiting >= depth || queued >= cap,
                        "displacing at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                    );
                    let [Effect::Evict {
                        shard: to,
                        below,
                        waiter,
                    }] = effects[..]
                    else {
                        panic!("a displacing arrival's effects: {effects:?}");
                    };
                    assert_eq!((below, waiter), (band, id));
                    let lowest_on = |on: usize| {
                        rev.queued
                            .iter()
                            .filter(|((at, _), _)| *at == on)
                            .map(|(_, &(other, _))| other)
                            .min()
                    };
                    let lowest = lowest_on(to).expect("asked a shard with nobody waiting");
                    assert!(
                        lowest_on(shard).is_none_or(|here| here > lowest),
                        "asked another shard while as low a band waits here"
                    );
                    assert!(lowest < band, "asked a shard whose lowest band is {lowest}");
                    let lowest_anywhere = (0..rev.queues.len()).filter_map(lowest_on).min();
                    assert_eq!(
                        Some(lowest),
                        lowest_anywhere,
                        "not the lowest band anywhere"
                    );
                    rev.displacing.insert((shard, id), (band, self.arrivals));
                }
                Admission::Rejected => {
                    assert!(
                        waiting >= depth || queued >= cap,
                        "refused at {waiting}/{depth} in the revision, {queued}/{cap} in the process"
                    );
                    assert!(effects.is_empty());
                    if let (Some(bands), Some(lowest)) = (
                        rev.bands,
                        rev.queued.values().map(|&(lower, _)| lower).min(),
                    ) {
                        assert!(
                            lowest >= band.min(bands - 1),
                            "refused while band {lowest} waits, below the arrival's {band}"
                        );
                    }
                    self.rejected += 1;
                }
            }
            self.arrivals += 1;
            self.overtakes += rev.apply(shard, effects);
        }

        fn check(&self) {
            for revision in &self.revisions {
                revision.check();
            }
            let waiting: usize = self
                .revisions
                .iter()
                .map(|rev| rev.queued.len() + rev.travelling())
                .sum();
            assert_eq!(
                self.process.queued() as usize,
                waiting,
                "the process count matches every revision's queues and places travelling"
            );
            assert!(
                self.process.queued() <= self.process.limit(),
                "{} waiting past the process cap {}",
                self.process.queued(),
                self.process.limit()
            );
        }

        /// Lets everything finish: deliver grants, finish requests, until quiet.
        fn drain(&mut self) {
            for revision in 0..self.revisions.len() {
                loop {
                    let rev = &mut self.revisions[revision];
                    if !rev.evictions.is_empty() {
                        rev.deliver_eviction(0);
                    } else if !rev.places.is_empty() {
                        self.overtakes += rev.deliver_place(0, &self.process);
                    } else if let Some((shard, pod)) = rev.in_transit.pop() {
                        self.overtakes += rev.deliver(shard, pod);
                    } else if !rev.running.is_empty() {
                        self.overtakes += rev.finish(0);
                    } else {
                        break;
                    }
                    self.check();
                }
            }
        }

        /// Nothing waits anywhere, and every count is back to zero.
        fn assert_all_served(&self) {
            for rev in &self.revisions {
                assert!(
                    rev.queued.is_empty() && rev.displacing.is_empty(),
                    "{} requests never served, {} never answered",
                    rev.queued.len(),
                    rev.displacing.len()
                );
                assert_eq!(rev.gate.waiting(), 0);
                assert_eq!(rev.gate.oldest_shard(), None);
            }
            assert_eq!(self.process.queued(), 0);
        }
    }

    /// Checks start-time fair queuing's bounds in a log of a run where grants were delivered at
    /// once and no waiter left except by being served. Within each band:
    ///
    /// * Two flows that both have waiters over a stretch of the run are served counts that
    ///   differ by at most two there: one turn's request each (the turn under way when the
    ///   stretch began may already have served one of them and not yet the other).
    /// * A flow that starts waiting for the first time is, for as long as it keeps waiting,
    ///   never served fewer than any other flow less one: another flow may take its turn's
    ///   request first, never a second one.
    fn check_fairness(log: &[Fairness]) {
        type Flow = (u8, u64);
        let mut waiting: HashMap<Flow, usize> = HashMap::new();
        let mut served: HashMap<Flow, u64> = HashMap::new();
        let mut seen: HashSet<Flow> = HashSet::new();
        // Per pair of flows waiting together: their served counts when the stretch began.
        let mut together: HashMap<(Flow, Flow), (u64, u64)> = HashMap::new();
        // Per newcomer still waiting: every flow's served count when it arrived.
        let mut newcomers: HashMap<Flow, HashMap<Flow, u64>> = HashMap::new();
        for (at, &event) in log.iter().enumerate() {
            match event {
                Fairness::Waits { band, flow } => {
                    let flow = (band, flow);
                    let count = waiting.entry(flow).or_default();
                    *count += 1;
                    if *count == 1 {
                        for (&other, &others) in &waiting {
                            if other != flow && other.0 == band && others > 0 {
                                let counts = (served_of(&served, flow), served_of(&served, other));
                                together.insert((flow, other), counts);
                                together.insert((other, flow), (counts.1, counts.0));
                            }
                        }
                    }
                    if seen.insert(flow) {
                        newcomers.insert(flow, served.clone());
                    }
                }
                Fairness::Served { band, flow } => {
                    let flow = (band, flow);
                    *served.entry(flow).or_default() += 1;
                    for (&(one, other), &(from_one, from_other)) in &together {
                        if one == flow {
                            let ahead = (served[&one] - from_one) as i64
                                - (served_of(&served, other) - from_other) as i64;
                            assert!(
                                ahead <= 2,
                                "event {at}: flow {one:?} served {ahead} more than {other:?} while both waited"
                            );
                        }
                    }
                    for (&newcomer, since) in &newcomers {
                        if newcomer != flow && newcomer.0 == band {
                            let own = served_of(&served, newcomer)
                                - since.get(&newcomer).copied().unwrap_or(0);
                            let theirs = served[&flow] - since.get(&flow).copied().unwrap_or(0);
                            assert!(
                                theirs <= own + 1,
                                "event {at}: flow {flow:?} served {theirs} since newcomer {newcomer:?} arrived, which was served {own}"
                            );
                        }
                    }
                    let count = waiting.get_mut(&flow).expect("served a flow not waiting");
                    *count -= 1;
                    if *count == 0 {
                        together.retain(|&(one, other), _| one != flow && other != flow);
                        newcomers.remove(&flow);
                    }
                }
            }
        }
    }

    fn served_of(served: &HashMap<(u8, u64), u64>, flow: (u8, u64)) -> u64 {
        served.get(&flow).copied().unwrap_or(0)
    }

    /// Serves one request at a time, grants delivered at once, until `done` holds; returns the
    /// log from there.
    fn serve_until(simulation: &mut Simulation, mut done: impl FnMut(&[Fairness]) -> bool) {
        while !done(&simulation.revisions[0].log) {
            assert!(
                !simulation.revisions[0].running.is_empty(),
                "nothing left to serve"
            );
            simulation.step(0, &Step::Finish(0));
            let rev = &mut simulation.revisions[0];
            while let Some((shard, pod)) = rev.in_transit.pop() {
                simulation.overtakes += rev.deliver(shard, pod);
            }
        }
    }

    /// Issue 27's "a tenant that queues 5 000 requests does not delay another tenant's first
    /// request by more than one service turn", across shards: backlogs spread over every shard,
    /// then a newcomer on one; one pod with one slot.
    #[test]
    fn a_backlog_on_every_shard_delays_a_newcomers_first_request_by_one_turn() {
        // (what, shards, backlogged flows and their requests, the newcomer's shard, most
        // requests served between its arrival and its own: one per other flow waiting)
        type Row = (&'static str, usize, &'static [(u64, usize)], usize, usize);
        let table: &[Row] = &[
            (
                "A's 500 over two shards, B on shard 1",
                2,
                &[(1, 500)],
                1,
                1,
            ),
            (
                "A's 500 over two shards, B on shard 0",
                2,
                &[(1, 500)],
                0,
                1,
            ),
            (
                "A's and C's 200 over three shards, B on shard 2",
                3,
                &[(1, 200), (3, 200)],
                2,
                2,
            ),
            ("one shard", 1, &[(1, 500)], 0, 1),
        ];
        for &(what, shards, backlog, newcomer_shard, most) in table {
            let mut simulation = Simulation::new(shards, &[1]).with_bands(1);
            // Flow 0's request takes the slot; everything after it waits.
            simulation.step(0, &Step::ArriveFlow(0, 0, 0));
            let mut arrival = 0;
            for round in 0..backlog.iter().map(|&(_, count)| count).max().unwrap_or(0) {
                for &(flow, count) in backlog {
                    if round < count {
                        simulation.step(0, &Step::ArriveFlow(arrival % shards, 0, flow));
                        arrival += 1;
                    }
                }
            }
            let newcomer = 2;
            simulation.step(0, &Step::ArriveFlow(newcomer_shard, 0, newcomer));
            let arrived = simulation.revisions[0].log.len();
            serve_until(&mut simulation, |log| {
                log.contains(&Fairness::Served {
                    band: 0,
                    flow: newcomer,
                })
            });
            let ahead = simulation.revisions[0].log[arrived..].len() - 1;
            assert!(
                ahead <= most,
                "{what}: the newcomer waited behind {ahead} requests (at most {most})"
            );
            simulation.drain();
            simulation.assert_all_served();
            check_fairness(&simulation.revisions[0].log);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary interleavings of arrivals, completions, late grants and cancellations on
        /// up to four shards: no pod is over-committed, every slot is accounted for, nobody is
        /// served twice, and once traffic stops every queued request is served (no lost wake-up,
        /// no stranded slot).
        #[test]
        fn handoff_is_safe_and_work_conserving(
            shards in 1..5usize,
            capacities in prop::collection::vec(0..3u32, 1..4),
            steps in prop::collection::vec(step(4), 1..300),
        ) {
            prop_assume!(capacities.iter().any(|&capacity| capacity > 0));
            let mut simulation = Simulation::new(shards, &capacities);
            for step in &steps {
                simulation.step(0, &step.on(shards));
            }
            simulation.drain();
            simulation.assert_all_served();
        }

        /// With grants delivered at once (no messages in flight), service is strictly in
        /// arrival order across shards.
        #[test]
        fn prompt_delivery_serves_in_arrival_order(
            shards in 1..5usize,
            steps in prop::collection::vec(prop_oneof![
                3 => (0..4usize).prop_map(Step::Arrive),
                1 => (0..4usize, 0..64usize).prop_map(|(shard, pick)| Step::ArriveRacing(shard, pick)),
                2 => (0..64usize).prop_map(Step::Finish),
                1 => (0..4usize, 0..2usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
            ], 1..300),
        ) {
            let mut simulation = Simulation::new(shards, &[1, 2]);
            for step in &steps {
                simulation.step(0, &step.on(shards));
                let rev = &mut simulation.revisions[0];
                while let Some((shard, pod)) = rev.in_transit.pop() {
                    simulation.overtakes += rev.deliver(shard, pod);
                }
                simulation.check();
                simulation.revisions[0].check_work_conserving();
            }
            simulation.drain();
            prop_assert_eq!(simulation.overtakes, 0, "someone was served before an older waiter");
            simulation.assert_all_served();
        }

        /// The same under a priority policy of three bands, arrivals of every band (and past the
        /// last), and queues small enough to shed: still safe and work conserving, and every
        /// shed was of a lower band.
        #[test]
        fn banded_handoff_is_safe_and_work_conserving(
            shards in 1..5usize,
            capacities in prop::collection::vec(0..3u32, 1..4),
            depth in 1..6u32,
            steps in prop::collection::vec(prop_oneof![
                3 => step(4),
                4 => (0..4usize, 0..4u8).prop_map(|(shard, band)| Step::ArriveAs(shard, band)),
            ], 1..300),
        ) {
            prop_assume!(capacities.iter().any(|&capacity| capacity > 0));
            let limits = QueueLimits { revision_depth: depth };
            let mut simulation =
                Simulation::with_revisions(shards, &[(&capacities, limits)], ProcessQueue::UNLIMITED)
                    .with_bands(3);
            for step in &steps {
                simulation.step(0, &step.on(shards));
            }
            simulation.drain();
            simulation.assert_all_served();
        }

        /// Under a priority policy, with grants delivered at once: a freed slot always goes to
        /// the highest band waiting on any shard, and within a band to the oldest.
        #[test]
        fn prompt_delivery_serves_higher_bands_first(
            shards in 1..5usize,
            steps in prop::collection::vec(prop_oneof![
                3 => (0..4usize, 0..3u8).prop_map(|(shard, band)| Step::ArriveAs(shard, band)),
                1 => (0..4usize, 0..64usize).prop_map(|(shard, pick)| Step::ArriveRacing(shard, pick)),
                3 => (0..64usize).prop_map(Step::Finish),
                1 => (0..4usize, 0..2usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
            ], 1..300),
        ) {
            let mut simulation = Simulation::new(shards, &[1, 2]).with_bands(3);
            for step in &steps {
                simulation.step(0, &step.on(shards));
                let rev = &mut simulation.revisions[0];
                while let Some((shard, pod)) = rev.in_transit.pop() {
                    simulation.overtakes += rev.deliver(shard, pod);
                }
                simulation.check();
                simulation.revisions[0].check_work_conserving();
            }
            simulation.drain();
            prop_assert_eq!(simulation.overtakes, 0, "served past a higher band or an older waiter");
            simulation.assert_all_served();
        }

        /// Under a priority policy, with grants delivered at once, flows of two bands arriving
        /// on any shard: across shards, within each band, a flow is never served more than one
        /// turn ahead of another flow that waits (`check_fairness`).
        #[test]
        fn prompt_delivery_shares_each_band_fairly_across_shards(
            shards in 1..5usize,
            steps in prop::collection::vec(prop_oneof![
                4 => (0..4usize, 0..2u8, 0..4u64)
                    .prop_map(|(shard, band, flow)| Step::ArriveFlow(shard, band, flow)),
                3 => (0..64usize).prop_map(Step::Finish),
                1 => (0..4usize, 0..2usize).prop_map(|(shard, pod)| Step::Grow(shard, pod)),
            ], 1..400),
        ) {
            let mut simulation = Simulation::new(shards, &[1, 1]).with_bands(2);
            for step in &steps {
                simulation.step(0, &step.on(shards));
                let rev = &mut simulation.revisions[0];
                while let Some((shard, pod)) = rev.in_transit.pop() {
                    simulation.overtakes += rev.deliver(shard, pod);
                }
            }
            simulation.drain();
            simulation.assert_all_served();
            check_fairness(&simulation.revisions[0].log);
        }

        /// Two revisions share one process queue, on up to four shards, in any interleaving:
        /// the total waiting never exceeds the cap nor any revision its depth, a request is
        /// refused only at one of them (checked at every arrival), and the counts return to zero
        /// once everything is served. Then a flood of arrivals fills the queues: the total
        /// waiting reaches exactly the smaller of the cap and the sum of the depths.
        #[test]
        fn a_process_cap_shared_by_two_revisions_bounds_every_queue(
            shards in 1..5usize,
            capacities in [prop::collection::vec(0..3u32, 1..3), prop::collection::vec(0..3u32, 1..3)],
            depths in [1..6u32, 1..6u32],
            cap in 1..8u32,
            steps in prop::collection::vec((0..2usize, step(4)), 1..300),
        ) {
            prop_assume!(capacities.iter().all(|pods| pods.iter().any(|&capacity| capacity > 0)));
            let revisions = [
                (&capacities[0][..], QueueLimits { revision_depth: depths[0] }),
                (&capacities[1][..], QueueLimits { revision_depth: depths[1] }),
            ];
            let mut simulation = Simulation::with_revisions(shards, &revisions, cap);
            for (revision, step) in &steps {
                simulation.step(*revision, &step.on(shards));
            }

            // The flood: each arrival takes a slot, queues or is refused, and slots and places
            // are finite, so after enough of them every arrival is refused.
            let slots: u32 = simulation
                .revisions
                .iter()
                .flat_map(|rev| rev.pods.iter().map(PodSlots::capacity))
                .sum();
            for arrival in 0..2 * (slots + depths[0] + depths[1] + 1) as usize {
                simulation.step(arrival % 2, &Step::Arrive(arrival / 2 % shards));
            }
            for revision in 0..2 {
                let rejected = simulation.rejected;
                simulation.step(revision, &Step::Arrive(0));
                prop_assert_eq!(simulation.rejected, rejected + 1, "the flood did not fill the queues");
            }
            prop_assert_eq!(simulation.process.queued(), cap.min(depths[0] + depths[1]));

            simulation.drain();
            simulation.assert_all_served();
        }
    }
}

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
mod loom_tests {
    use super::*;
    use loom::sync::Mutex;
    use loom::thread;
    use std::collections::VecDeque;

    const LIMITS: QueueLimits = QueueLimits { revision_depth: 8 };

    /// A pod with one slot: `PodSlots`'s acquire and release on a loom atomic.
    struct Pod {
        in_flight: AtomicU32,
    }

    impl Pod {
        fn try_acquire(&self) -> Option<()> {
            let mut current = self.in_flight.load(Ordering::Acquire);
            loop {
                if current >= 1 {
                    return None;
                }
                match self.in_flight.compare_exchange(
                    current,
                    current + 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Some(()),
                    Err(now) => current = now,
                }
            }
        }

        fn release(&self) {
            let before = self.in_flight.fetch_sub(1, Ordering::AcqRel);
            assert_eq!(before, 1, "released a slot nobody held");
        }

        fn in_flight(&self) -> u32 {
            self.in_flight.load(Ordering::Acquire)
        }
    }

    /// What one shard sends another: the shell's `routing::Handoff`.
    enum Message {
        Grant,
        Evict {
            below: u8,
            from: usize,
            waiter: WaiterId,
        },
        Place {
            waiter: WaiterId,
            placed: bool,
        },
    }

    /// What the shards share.
    struct World {
        gate: RevisionGate,
        pod: Pod,
        /// Per shard: messages sent to it, not yet received.
        mailboxes: [Mutex<VecDeque<Message>>; 2],
    }

    impl World {
        /// The slot starts held by a request running on shard 0.
        fn new() -> Arc<World> {
            Arc::new(World {
                gate: RevisionGate::with_process_queue(2, Arc::new(ProcessQueue::new(4))),
                pod: Pod {
                    in_flight: AtomicU32::new(1),
                },
                mailboxes: [Mutex::new(VecDeque::new()), Mutex::new(VecDeque::new())],
            })
        }
    }

    /// One shard's side of the revision, and what happened to its requests.
    struct Shard {
        index: usize,
        queue: LocalQueue,
        /// Requests on this shard holding the slot.
        running: u32,
        queued: Vec<WaiterId>,
        /// In the order they were woken.
        woken: Vec<WaiterId>,
        cancelled: Vec<WaiterId>,
        shed: Vec<WaiterId>,
        /// Displacing requests refused when the answer came, and arrivals refused at once.
        refused: Vec<WaiterId>,
        rejected: u32,
        /// The limits this shard's arrivals were admitted under (an answer uses them again).
        limits: QueueLimits,
    }

    impl Shard {
        fn new(index: usize) -> Shard {
            Shard {
                index,
                queue: LocalQueue::new(index),
                running: 0,
                queued: Vec::new(),
                woken: Vec::new(),
                cancelled: Vec::new(),
                shed: Vec::new(),
                refused: Vec::new(),
                rejected: 0,
                limits: LIMITS,
            }
        }

        /// A shard whose queue is under a priority policy of three bands.
        fn banded(index: usize, world: &World) -> Shard {
            let mut shard = Shard::new(index);
            shard.queue.set_policy(&world.gate, Some(3), 0);
            shard
        }

        fn arrive(&mut self, world: &World) -> Admission<()> {
            self.arrive_as(world, LIMITS, 0)
        }

        fn arrive_as(&mut self, world: &World, limits: QueueLimits, band: u8) -> Admission<()> {
            self.arrive_class(world, limits, Class { band, flow: 0 })
        }

        /// An arrival of `flow` in band 0.
        fn arrive_flow(&mut self, world: &World, flow: u64) -> Admission<()> {
            self.arrive_class(world, LIMITS, Class { band: 0, flow })
        }

        fn arrive_class(
            &mut self,
            world: &World,
            limits: QueueLimits,
            class: Class,
        ) -> Admission<()> {
            let mut effects = Vec::new();
            let admission = self.queue.admit_as(
                &world.gate,
                limits,
                class,
                || world.pod.try_acquire(),
                &mut effects,
            );
            match admission {
                Admission::Proceed(()) => self.running += 1,
                Admission::Queued(id) => self.queued.push(id),
                Admission::Rejected => panic!("refused below both bounds"),
                Admission::Displacing(_) => panic!("displacing below both bounds"),
            }
            self.apply(world, effects);
            admission
        }

        /// An arrival of `band` at tight limits, which may displace a lower band's waiter on
        /// the other shard, or be refused when none is left by the time it looks.
        fn arrive_at_bound(
            &mut self,
            world: &World,
            limits: QueueLimits,
            band: u8,
        ) -> Admission<()> {
            self.limits = limits;
            let mut effects = Vec::new();
            let class = Class { band, flow: 0 };
            let admission = self.queue.admit_as(
                &world.gate,
                limits,
                class,
                || world.pod.try_acquire(),
                &mut effects,
            );
            match admission {
                Admission::Proceed(()) => self.running += 1,
                Admission::Queued(id) | Admission::Displacing(id) => self.queued.push(id),
                Admission::Rejected => self.rejected += 1,
            }
            self.apply(world, effects);
            admission
        }

        /// A running request ends and gives its slot back.
        fn finish(&mut self, world: &World) {
            assert!(self.running > 0);
            self.running -= 1;
            self.give_back(world);
        }

        /// The shell's `LocalRevision::release`: free the slot, then dispatch if anyone waits.
        fn give_back(&mut self, world: &World) {
            world.pod.release();
            if world.gate.waiting() > 0 {
                let mut effects = Vec::new();
                self.queue
                    .dispatch(&world.gate, || world.pod.try_acquire(), &mut effects);
                self.apply(world, effects);
            }
        }

        /// Receives every message in this shard's mailbox; returns whether there was any.
        fn receive_grants(&mut self, world: &World) -> bool {
            let mut any = false;
            loop {
                let message = world.mailboxes[self.index].lock().unwrap().pop_front();
                let Some(message) = message else { return any };
                any = true;
                let mut effects = Vec::new();
                match message {
                    Message::Grant => {
                        let unused = self.queue.receive_grant(
                            &world.gate,
                            (),
                            || world.pod.try_acquire(),
                            &mut effects,
                        );
                        self.apply(world, effects);
                        if unused.is_some() {
                            self.give_back(world);
                        }
                    }
                    Message::Evict {
                        below,
                        from,
                        waiter,
                    } => {
                        let placed = self.queue.evict(&world.gate, below, &mut effects);
                        self.apply(world, effects);
                        let answer = Message::Place { waiter, placed };
                        world.mailboxes[from].lock().unwrap().push_back(answer);
                    }
                    Message::Place { waiter, placed } => {
                        let placement = self.queue.receive_place(
                            &world.gate,
                            self.limits,
                            waiter,
                            placed,
                            || world.pod.try_acquire(),
                            &mut effects,
                        );
                        match placement {
                            Placement::Queued => {}
                            Placement::Refused => self.refused.push(waiter),
                            Placement::Gone => {
                                assert!(self.cancelled.contains(&waiter), "gone but not cancelled")
                            }
                        }
                        self.apply(world, effects);
                    }
                }
            }
        }

        /// A queued request gives up: its place is freed, or the slot it was woken with goes
        /// back (the shell's `LocalRevision::cancel`).
        fn cancel(&mut self, world: &World, id: WaiterId) {
            if self.queue.cancel(&world.gate, id) {
                self.cancelled.push(id);
                return;
            }
            assert!(self.woken.contains(&id), "cancelled an unknown request");
            self.finish(world);
        }

        fn apply(&mut self, world: &World, effects: Vec<Effect<()>>) {
            for effect in effects {
                match effect {
                    Effect::Wake { waiter, pod: () } => {
                        assert!(self.queued.contains(&waiter), "woke a request never queued");
                        assert!(!self.woken.contains(&waiter), "woke a request twice");
                        assert!(
                            !self.cancelled.contains(&waiter),
                            "woke a cancelled request"
                        );
                        assert!(!self.shed.contains(&waiter), "woke a shed request");
                        self.woken.push(waiter);
                        self.running += 1;
                    }
                    Effect::Grant { shard, pod: () } => {
                        world.mailboxes[shard]
                            .lock()
                            .unwrap()
                            .push_back(Message::Grant);
                    }
                    Effect::Evict {
                        shard,
                        below,
                        waiter,
                    } => {
                        assert!(self.queued.contains(&waiter), "an eviction for nobody");
                        let ask = Message::Evict {
                            below,
                            from: self.index,
                            waiter,
                        };
                        world.mailboxes[shard].lock().unwrap().push_back(ask);
                    }
                    Effect::Shed { waiter } => {
                        assert!(self.queued.contains(&waiter), "shed a request never queued");
                        assert!(!self.woken.contains(&waiter), "shed a woken request");
                        self.shed.push(waiter);
                    }
                }
            }
        }
    }

    /// Delivers every grant still in a mailbox, as each shard eventually would.
    fn settle(world: &World, shards: &mut [Shard]) {
        while shards
            .iter_mut()
            .fold(false, |any, shard| shard.receive_grants(world) | any)
        {}
    }

    /// Checks a quiet point: no grant in flight.
    fn check_quiet(world: &World, shards: &[Shard]) {
        let running: u32 = shards.iter().map(|shard| shard.running).sum();
        let in_flight = world.pod.in_flight();
        assert!(in_flight <= 1, "over-commit: {in_flight} in flight");
        assert_eq!(
            in_flight, running,
            "a slot is taken by nobody, or held twice"
        );
        let waiting: usize = shards.iter().map(|shard| shard.queue.len()).sum();
        assert_eq!(world.gate.waiting() as usize, waiting);
        assert_eq!(world.gate.process_queue().queued() as usize, waiting);
        if in_flight == 0 {
            assert_eq!(
                waiting, 0,
                "lost wake-up: the slot is free and a request waits"
            );
        }
    }

    /// From the end of the threads: settle, check, let one running request finish, repeat;
    /// then check every queued request's fate and the counts.
    fn run_to_completion(world: &World, shards: &mut [Shard]) {
        loop {
            settle(world, shards);
            check_quiet(world, shards);
            match shards.iter_mut().find(|shard| shard.running > 0) {
                Some(shard) => shard.finish(world),
                None => break,
            }
        }
        for shard in shards.iter() {
            for id in &shard.queued {
                let fates = shard.woken.iter().filter(|&woken| woken == id).count()
                    + shard.cancelled.iter().filter(|&gone| gone == id).count()
                    + shard.shed.iter().filter(|&shed| shed == id).count()
                    + shard
                        .refused
                        .iter()
                        .filter(|&refused| refused == id)
                        .count();
                assert_eq!(fates, 1, "request {id} on shard {}", shard.index);
            }
        }
        assert_eq!(world.gate.waiting(), 0);
        assert_eq!(world.gate.process_queue().queued(), 0);
        assert_eq!(world.gate.oldest_shard(), None);
        assert_eq!(world.pod.in_flight(), 0);
    }

    /// From the end of the threads: serves everything one at a time as `run_to_completion`
    /// does, and returns who got the slot in which order, as (shard, waiter).
    fn serve_in_turn(world: &World, shards: &mut [Shard]) -> Vec<(usize, WaiterId)> {
        let mut order = Vec::new();
        loop {
            settle(world, shards);
            check_quiet(world, shards);
            for (index, shard) in shards.iter().enumerate() {
                for &id in &shard.woken {
                    if !order.contains(&(index, id)) {
                        order.push((index, id));
                    }
                }
            }
            match shards.iter_mut().find(|shard| shard.running > 0) {
                Some(shard) => shard.finish(world),
                None => break,
            }
        }
        for shard in shards.iter() {
            for id in &shard.queued {
                let woken = shard.woken.iter().filter(|&woken| woken == id).count();
                assert_eq!(woken, 1, "request {id} on shard {}", shard.index);
            }
        }
        order
    }

    /// Runs `zero` and `one` as shards 0 and 1 from the given state, then to completion;
    /// returns the shards as they ended.
    fn race(
        world: Arc<World>,
        shards: [Shard; 2],
        zero: impl FnOnce(&mut Shard, &World) + Send + 'static,
        one: impl FnOnce(&mut Shard, &World) + Send + 'static,
    ) -> [Shard; 2] {
        let [mut first, mut second] = shards;
        let shared = world.clone();
        let first = thread::spawn(move || {
            zero(&mut first, &shared);
            first.receive_grants(&shared);
            first
        });
        let shared = world.clone();
        let second = thread::spawn(move || {
            one(&mut second, &shared);
            second.receive_grants(&shared);
            second
        });
        let mut shards = [first.join().unwrap(), second.join().unwrap()];
        run_to_completion(&world, &mut shards);
        shards
    }

    /// Shards at the start of a run: the slot held by a request on shard 0.
    fn shards() -> [Shard; 2] {
        let mut shards = [Shard::new(0), Shard::new(1)];
        shards[0].running = 1;
        shards
    }

    /// The lost wake-up race: shard 0's request ends while a request on shard 1 finds no slot
    /// and queues. Either the releaser sees the waiter or the waiter sees the free slot.
    #[test]
    fn loom_a_release_racing_an_arrival_on_another_shard_wakes_it() {
        loom::model(|| {
            race(
                World::new(),
                shards(),
                |shard, world| shard.finish(world),
                |shard, world| {
                    shard.arrive(world);
                },
            );
        });
    }

    /// Two arrivals, one on each shard, and a release on shard 0 after its arrival: one of
    /// them gets the slot, the other waits for it, nobody is woken twice.
    #[test]
    fn loom_two_arrivals_and_one_release_across_shards() {
        loom::model(|| {
            race(
                World::new(),
                shards(),
                |shard, world| {
                    shard.arrive(world);
                    shard.finish(world);
                },
                |shard, world| {
                    shard.arrive(world);
                },
            );
        });
    }

    /// The same with the release before shard 0's arrival, which may then take the freed slot
    /// directly only if it sees nobody waiting.
    #[test]
    fn loom_a_release_then_an_arrival_racing_an_arrival_on_another_shard() {
        loom::model(|| {
            race(
                World::new(),
                shards(),
                |shard, world| {
                    shard.finish(world);
                    shard.arrive(world);
                },
                |shard, world| {
                    shard.arrive(world);
                },
            );
        });
    }

    /// A cancel racing a grant in flight: shard 1's request (the older) and shard 0's wait;
    /// shard 0's running request ends and sends the slot to shard 1, whose request gives up
    /// before or after the grant lands. The slot must reach shard 0's request either way.
    #[test]
    fn loom_a_cancel_racing_a_grant_in_flight() {
        loom::model(|| {
            let world = World::new();
            let mut shards = shards();
            let older = shards[1].arrive(&world);
            assert_eq!(older, Admission::Queued(0));
            assert_eq!(shards[0].arrive(&world), Admission::Queued(0));
            race(
                world,
                shards,
                |shard, world| shard.finish(world),
                |shard, world| {
                    shard.receive_grants(world);
                    shard.cancel(world, 0);
                },
            );
        });
    }

    /// The band hand-off: two low waiters on shard 1, and the slot held on shard 1. Shard 0
    /// queues a request of the top band while shard 1's request ends and dispatches. The high
    /// request is served first, or second when the dispatch that raced its arrival read the
    /// heads before its own was published (the bounded error of "Highest band first"), never
    /// after both.
    #[test]
    fn loom_a_high_band_arrival_racing_a_release_is_served_within_one_turn() {
        loom::model(|| {
            let world = World::new();
            let mut shards = [Shard::banded(0, &world), Shard::banded(1, &world)];
            // The slot moves to shard 1's request (shard 0's held it in `World::new`).
            shards[1].running = 1;
            for _ in 0..2 {
                assert!(matches!(shards[1].arrive(&world), Admission::Queued(_)));
            }
            let [first, second] = shards;
            let shared = world.clone();
            let high = thread::spawn(move || {
                let mut shard = first;
                let admission = shard.arrive_as(&shared, LIMITS, 2);
                assert_eq!(
                    admission,
                    Admission::Queued(0),
                    "no barging past the low waiters"
                );
                shard.receive_grants(&shared);
                shard
            });
            let shared = world.clone();
            let low = thread::spawn(move || {
                let mut shard = second;
                shard.finish(&shared);
                shard.receive_grants(&shared);
                shard
            });
            let mut shards = [high.join().unwrap(), low.join().unwrap()];
            let order = serve_in_turn(&world, &mut shards);
            let high_at = order.iter().position(|&served| served == (0, 0));
            assert!(
                matches!(high_at, Some(0 | 1)),
                "the high request was served at {high_at:?} of {order:?}"
            );
            assert_eq!(world.gate.waiting(), 0);
            assert_eq!(world.gate.oldest_shard(), None);
        });
    }

    /// Shedding racing a hand-off: shard 0's queue is full of low waiters (depth 2); a request
    /// of the top band arrives there and sheds the newest, while shard 1's request ends and
    /// sends the slot to shard 0's head. The counts never pass the depth, the shed request is
    /// never woken, and every request ends exactly once.
    #[test]
    fn loom_a_shed_racing_a_grant_in_flight() {
        loom::model(|| {
            let world = World::new();
            let limits = QueueLimits { revision_depth: 2 };
            let mut shards = [Shard::banded(0, &world), Shard::banded(1, &world)];
            shards[1].running = 1;
            for _ in 0..2 {
                let admission = shards[0].arrive_as(&world, limits, 0);
                assert!(matches!(admission, Admission::Queued(_)));
            }
            race(
                world,
                shards,
                move |shard, world| {
                    assert_eq!(shard.arrive_as(world, limits, 2), Admission::Queued(2));
                    assert_eq!(shard.shed, [1], "the newest low waiter");
                    assert!(world.gate.waiting() <= 2);
                },
                |shard, world| shard.finish(world),
            );
        });
    }

    /// Two shards under three bands, the slot held on shard 0 and the only place (`limits`
    /// of depth 1) taken by a band-0 waiter there.
    fn full_of_one_low_waiter(world: &World, limits: QueueLimits) -> [Shard; 2] {
        let mut shards = [Shard::banded(0, world), Shard::banded(1, world)];
        shards[0].running = 1;
        assert_eq!(
            shards[0].arrive_at_bound(world, limits, 0),
            Admission::Queued(0)
        );
        shards
    }

    /// Cross-shard shedding against the release that would have served the waiter it sheds:
    /// shard 0 has the only place (depth 1) taken by a band-0 waiter and its running request
    /// ends, while a band-2 request arrives on shard 1 and asks shard 0 to shed. Whatever the
    /// order: the low waiter is served or shed, never both; the high one is served, or refused
    /// only if it found the place taken and nothing lower left to shed; the place is never held
    /// twice (the counts end at zero, never past the depth at a quiet point) and the slot is
    /// never left free with a waiter.
    #[test]
    fn loom_an_eviction_racing_the_release_that_serves_its_victim() {
        loom::model(|| {
            let world = World::new();
            let limits = QueueLimits { revision_depth: 1 };
            let mut shards = full_of_one_low_waiter(&world, limits);
            let [zero, one] = race(
                world,
                shards,
                |shard, world| shard.finish(world),
                move |shard, world| {
                    shard.arrive_at_bound(world, limits, 2);
                    assert!(world.gate.waiting() <= 1, "past the depth");
                },
            );
            // An answer with nothing shed means the low waiter was served first, which freed
            // the place: the second try at the bounds takes it.
            assert!(one.refused.is_empty(), "refused with the place free");
            assert!(
                zero.shed.len() + zero.woken.len() == 1,
                "the low waiter is shed or served"
            );
            if one.rejected == 0 {
                assert_eq!(one.woken, [0], "the high request is served");
            }
        });
    }

    /// A displacing request that leaves before the answer comes: the place shed for it goes
    /// back, and nothing else moves.
    #[test]
    fn loom_a_displacing_request_leaving_before_the_answer() {
        loom::model(|| {
            let world = World::new();
            let limits = QueueLimits { revision_depth: 1 };
            let mut shards = full_of_one_low_waiter(&world, limits);
            assert_eq!(
                shards[1].arrive_at_bound(&world, limits, 2),
                Admission::Displacing(0)
            );
            race(
                world,
                shards,
                |shard, world| {
                    shard.receive_grants(world);
                },
                |shard, world| shard.cancel(world, 0),
            );
        });
    }

    /// Cross-shard fairness under the lock: one band, two flows. Flow 1 already waits on shard 1
    /// (turn 0). Shard 0 queues flow 2's first request and then its running request ends, while
    /// shard 1 queues flow 1's second (turn 1). Every request is woken once, the slot is never
    /// held twice nor left free with a waiter, and flow 1's second request is never served
    /// before flow 2's first (the turn order holds across shards even with the release racing
    /// the tagging).
    #[test]
    fn loom_two_flows_on_two_shards_take_turns() {
        loom::model(|| {
            let world = World::new();
            let mut shards = [Shard::banded(0, &world), Shard::banded(1, &world)];
            shards[0].running = 1;
            assert_eq!(shards[1].arrive_flow(&world, 1), Admission::Queued(0));
            let [first, second] = shards;
            let shared = world.clone();
            let zero = thread::spawn(move || {
                let mut shard = first;
                assert_eq!(shard.arrive_flow(&shared, 2), Admission::Queued(0));
                shard.finish(&shared);
                shard.receive_grants(&shared);
                shard
            });
            let shared = world.clone();
            let one = thread::spawn(move || {
                let mut shard = second;
                assert_eq!(shard.arrive_flow(&shared, 1), Admission::Queued(1));
                shard.receive_grants(&shared);
                shard
            });
            let mut shards = [zero.join().unwrap(), one.join().unwrap()];
            let order = serve_in_turn(&world, &mut shards);
            let served = |request| order.iter().position(|&served| served == request);
            let newcomer = served((0, 0)).expect("flow 2's request was served");
            let second_turn = served((1, 1)).expect("flow 1's second request was served");
            assert!(
                newcomer < second_turn,
                "flow 1's second request went before flow 2's first: {order:?}"
            );
            assert_eq!(world.gate.waiting(), 0);
            assert_eq!(world.gate.oldest_shard(), None);
        });
    }

    /// Two requests race for the last place in the process queue from two revisions (no slot
    /// free anywhere): exactly one queues, the loser's revision place is given back, and
    /// cancelling the winner brings every count to zero.
    #[test]
    fn loom_two_revisions_race_for_the_last_process_place() {
        loom::model(|| {
            let process = Arc::new(ProcessQueue::new(1));
            let gates = Arc::new([
                RevisionGate::with_process_queue(2, process.clone()),
                RevisionGate::with_process_queue(2, process.clone()),
            ]);
            race_for_places(gates, [0, 1], process);
        });
    }

    /// The same within one revision whose depth (2) is above the process cap (1): both may take
    /// a revision place, only one a process place.
    #[test]
    fn loom_two_arrivals_race_for_the_last_process_place_in_one_revision() {
        loom::model(|| {
            let process = Arc::new(ProcessQueue::new(1));
            let gates = Arc::new([
                RevisionGate::with_process_queue(2, process.clone()),
                RevisionGate::with_process_queue(2, process.clone()),
            ]);
            race_for_places(gates, [0, 0], process);
        });
    }

    /// Shard `i` sends one request to `gates[revisions[i]]`, with no slot free.
    fn race_for_places(
        gates: Arc<[RevisionGate; 2]>,
        revisions: [usize; 2],
        process: Arc<ProcessQueue>,
    ) {
        let limits = QueueLimits { revision_depth: 2 };
        let threads = [0, 1].map(|index| {
            let gates = gates.clone();
            thread::spawn(move || {
                let mut queue = LocalQueue::new(index);
                let admission = queue.admit(
                    &gates[revisions[index]],
                    limits,
                    || None::<()>,
                    &mut Vec::new(),
                );
                (queue, admission)
            })
        });
        let mut outcomes = threads.map(|thread| thread.join().unwrap());
        let queued: Vec<usize> = (0..2)
            .filter(|&index| outcomes[index].1 == Admission::Queued(0))
            .collect();
        let rejected = outcomes
            .iter()
            .filter(|(_, admission)| *admission == Admission::Rejected)
            .count();
        assert_eq!((queued.len(), rejected), (1, 1), "one place, two requests");
        let winner = queued[0];
        let waiting: Vec<u32> = gates.iter().map(RevisionGate::waiting).collect();
        let mut expected = [0, 0];
        expected[revisions[winner]] = 1;
        assert_eq!(
            waiting, expected,
            "the loser's revision place was given back"
        );
        assert_eq!(process.queued(), 1);
        assert!(outcomes[winner].0.cancel(&gates[revisions[winner]], 0));
        assert_eq!(process.queued(), 0);
        assert!(gates.iter().all(|gate| gate.waiting() == 0));
    }
}
