//! The order in which one shard's waiters for one revision are served: today's FIFO, or, with a
//! revision's priority policy on (issue 27), priority bands and fairness across flows that holds
//! across shards.
//!
//! Pure: no clock, no atomics. [`LocalQueue`](super::gate::LocalQueue) keeps one [`Waiters`] and
//! publishes the key of the waiter it would serve next ([`Waiters::head_key`]) in the revision's
//! gate, so that a slot freed on any shard goes to the waiter with the lowest key on any shard.
//! The gate also holds the revision's one [`FairClock`], shared by every shard, which a policy's
//! waiters are tagged by.
//!
//! With a policy, a waiter is keyed by (band, flow):
//!
//! * **Strict priority across bands.** A waiter of a higher band is served before any of a lower
//!   one, whenever it arrived.
//! * **Fairness across flows within a band: start-time fair queuing** (SFQ, Goyal et al. 1996)
//!   with every request costing one. Per band the clock keeps a virtual time `V`, and per flow
//!   the finish tag of its latest request. An arriving request's start tag is
//!   `max(V, finish[flow])`, and the flow's finish becomes that tag plus one; serving a request
//!   raises `V` to its tag. Waiters are served lowest tag first (then oldest), and the gate
//!   compares tags across shards, so the fairness holds across the process, not per shard:
//!   tag `t` is a flow's `t`-th turn, and every flow waiting takes its turn `t` before any
//!   takes `t + 1`. A flow arriving with nothing waiting gets tag `V`, the turn being served,
//!   so a flow with 5 000 waiters, on any shards, delays another flow's first request by at
//!   most one request of each flow ahead of it. A flow served in this turn that comes back gets
//!   the next turn, so a client sending one request at a time takes no more than its share.
//! * **FCFS within a flow**: a flow's tags increase with its arrivals.
//! * **Shedding.** When the queue is full, an arrival may take the place of the newest waiter of
//!   the lowest band below its own ([`Waiters::shed_below`]).
//!
//! Off (no policy) is a `VecDeque` in arrival order, as before, and never touches the clock.

use std::collections::{BTreeMap, VecDeque};
use std::ops::DerefMut;

use rustc_hash::FxHashMap;

/// Identifies a queued request within its shard.
pub type WaiterId = u64;

/// Most bands a policy may have; bands are numbered `0..bands`, higher served first.
pub const MAX_BANDS: u8 = 16;

/// Bits of a head key below the band's rank: room for the ticket (no policy) or the start tag
/// (a policy). 2^56 tickets last 228 years at ten million queued requests a second. A tag is
/// below the number of tags handed out (each is at most the largest finish so far, which grows
/// by at most one per arrival, and `V` only ever takes a tag's or a finish's value), which is
/// below the number of tickets: tags fit wherever tickets do.
const ORDER_BITS: u32 = 56;
const ORDER_MASK: u64 = (1 << ORDER_BITS) - 1;

/// Flows a band's clock remembers past those with a request waiting, before it closes the turn
/// early (see [`FairClock`]).
pub const REMEMBERED_FLOWS: usize = 1024;

/// What orders a waiting request under a priority policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Class {
    /// `0..bands`; higher is served first.
    pub band: u8,
    /// The fairness key's hash; every request without one shares flow 0.
    pub flow: u64,
}

/// A queued request: its place in the revision's arrival order, and its id on this shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub ticket: u64,
    pub id: WaiterId,
}

/// The key a shard publishes for the waiter it would serve next: lower is served first. The
/// band's rank is in the top bits, so every waiter of a higher band sorts before any of a lower
/// one; below it, `order` decides within a band: the ticket (arrival order) without a policy,
/// the start tag with one. Without a policy every waiter is in band 0.
pub fn head_key(band: u8, order: u64) -> u64 {
    let rank = u64::from(MAX_BANDS - 1 - band.min(MAX_BANDS - 1));
    rank << ORDER_BITS | (order & ORDER_MASK)
}

/// A revision's start-time fair queuing clock: tags for arriving requests under a priority
/// policy, shared by every shard (the gate holds it behind a lock; no policy, no lock).
///
/// Bounded: a flow whose finish is at or below `V` tags exactly as an absent one, so such
/// entries are swept once the map has doubled since the last sweep (amortised O(1) per
/// arrival). What stays are flows whose latest tag is at least `V`: those with a request
/// waiting (at most the band's waiters, so the revision's depth) and those served in the turn
/// under way. A band whose every tagged request was served or left is idle and forgets every
/// flow (SFQ's rule for an idle server: `V` moves to the largest finish). Should a turn gather
/// more than [`REMEMBERED_FLOWS`] flows past those waiting (each a new fairness key served
/// once, while another flow's next turn keeps the band busy), the sweep closes the turn early
/// by raising `V` past the oldest entries: those flows may then take one more request in the
/// turn, the price of the bound. So a band's map holds at most twice
/// `max(REMEMBERED_FLOWS, waiters)` entries, plus 64.
#[derive(Debug, Default)]
pub struct FairClock {
    /// Indexed by band number; grown on first use.
    bands: Vec<BandClock>,
}

#[derive(Debug, Default)]
struct BandClock {
    /// `V`: the largest start tag served.
    virtual_time: u64,
    /// Per flow: its latest request's tag plus one. Absent is the same as `virtual_time`.
    finish: FxHashMap<u64, u64>,
    /// Requests tagged and not yet served or gone.
    outstanding: usize,
    /// The size of `finish` that triggers the next sweep.
    sweep_at: usize,
}

/// Smallest size of a band's flow map that is swept.
const FIRST_SWEEP: usize = 64;

impl FairClock {
    /// The start tag of a request of `class` arriving now (`class.band` as queued, already
    /// within the policy's bands).
    pub fn arrive(&mut self, class: Class) -> u64 {
        let band = usize::from(class.band.min(MAX_BANDS - 1));
        if self.bands.len() <= band {
            self.bands.resize_with(band + 1, BandClock::default);
        }
        let clock = &mut self.bands[band];
        let finish = clock.finish.entry(class.flow).or_insert(clock.virtual_time);
        let tag = (*finish).max(clock.virtual_time);
        *finish = tag + 1;
        clock.outstanding += 1;
        if clock.finish.len() > clock.sweep_at {
            clock.sweep();
        }
        tag
    }

    /// A request of `band` with start tag `tag` was served.
    pub fn served(&mut self, band: u8, tag: u64) {
        if let Some(clock) = self.bands.get_mut(usize::from(band)) {
            clock.virtual_time = clock.virtual_time.max(tag);
            clock.left();
        }
    }

    /// A request of `band` left without being served (cancelled, shed, or re-queued under a
    /// new policy).
    pub fn gone(&mut self, band: u8) {
        if let Some(clock) = self.bands.get_mut(usize::from(band)) {
            clock.left();
        }
    }

    /// Flows the clock of `band` remembers.
    #[cfg(test)]
    fn remembered(&self, band: u8) -> usize {
        self.bands
            .get(usize::from(band))
            .map_or(0, |clock| clock.finish.len())
    }
}

impl BandClock {
    fn left(&mut self) {
        debug_assert!(self.outstanding > 0, "a request left that was never tagged");
        self.outstanding = self.outstanding.saturating_sub(1);
        if self.outstanding == 0 {
            // Idle: every flow starts afresh at the largest finish.
            let largest = self.finish.values().copied().max().unwrap_or(0);
            self.virtual_time = self.virtual_time.max(largest);
            self.finish.clear();
            self.sweep_at = FIRST_SWEEP;
        }
    }

    fn sweep(&mut self) {
        let now = self.virtual_time;
        self.finish.retain(|_, finish| *finish > now);
        let most = REMEMBERED_FLOWS.max(self.outstanding);
        if self.finish.len() > most {
            // Close the turn early: `V` rises to the finish that leaves at most `most` flows.
            let mut finishes: Vec<u64> = self.finish.values().copied().collect();
            let excess = finishes.len() - most;
            let (_, &mut threshold, _) = finishes.select_nth_unstable(excess - 1);
            self.virtual_time = self.virtual_time.max(threshold);
            let now = self.virtual_time;
            self.finish.retain(|_, finish| *finish > now);
        }
        self.sweep_at = (2 * self.finish.len()).max(FIRST_SWEEP);
    }
}

/// One shard's waiters for one revision, in the revision's discipline.
///
/// Calls that may tag or untag a waiter under a policy take `clock`, which gives the revision's
/// [`FairClock`] (the gate locks it); without a policy it is never called.
#[derive(Debug)]
pub enum Waiters {
    /// No policy: arrival order.
    Fifo(VecDeque<Waiter>),
    /// A priority policy with this many bands.
    Banded(Box<Banded>),
}

impl Default for Waiters {
    fn default() -> Waiters {
        Waiters::Fifo(VecDeque::new())
    }
}

impl Waiters {
    pub fn len(&self) -> usize {
        match self {
            Waiters::Fifo(fifo) => fifo.len(),
            Waiters::Banded(banded) => banded.location.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of bands: 1 without a policy.
    pub fn bands(&self) -> u8 {
        match self {
            Waiters::Fifo(_) => 1,
            Waiters::Banded(banded) => banded.bands.len() as u8,
        }
    }

    /// Switches discipline: `bands` of `None` is FIFO. Waiters already queued stay, in the new
    /// discipline: into a policy they all go to `default` band's shared flow, tagged in arrival
    /// order; out of one they line up by ticket.
    pub fn set_policy<C: DerefMut<Target = FairClock>>(
        &mut self,
        bands: Option<u8>,
        default: u8,
        clock: impl FnOnce() -> C,
    ) {
        let wanted = bands.map(|bands| bands.clamp(1, MAX_BANDS));
        match (&*self, wanted) {
            (Waiters::Fifo(_), None) => return,
            (Waiters::Banded(banded), Some(bands)) if banded.bands.len() == usize::from(bands) => {
                return;
            }
            _ => {}
        }
        let mut clock = clock();
        let mut all = self.drain(|| &mut *clock);
        all.sort_by_key(|waiter| waiter.ticket);
        *self = match wanted {
            None => Waiters::Fifo(all.into()),
            Some(bands) => {
                let mut banded = Banded::new(bands);
                let class = Class {
                    band: default.min(bands - 1),
                    flow: 0,
                };
                for waiter in all {
                    banded.push(class, waiter, &mut clock);
                }
                Waiters::Banded(Box::new(banded))
            }
        };
    }

    /// A request starts waiting with id `id`, and the ticket `ticket` hands out. `class` is
    /// ignored without a policy; a band past the policy's last is its last. Under a policy the
    /// ticket is taken while the clock is held, so that tags and tickets are handed out in the
    /// same order.
    #[inline]
    pub fn push<C: DerefMut<Target = FairClock>>(
        &mut self,
        class: Class,
        id: WaiterId,
        ticket: impl FnOnce() -> u64,
        clock: impl FnOnce() -> C,
    ) {
        match self {
            Waiters::Fifo(fifo) => fifo.push_back(Waiter {
                ticket: ticket(),
                id,
            }),
            Waiters::Banded(banded) => {
                let mut clock = clock();
                let waiter = Waiter {
                    ticket: ticket(),
                    id,
                };
                banded.push(class, waiter, &mut clock);
            }
        }
    }

    /// The waiter to serve next, removed.
    #[inline]
    pub fn pop<C: DerefMut<Target = FairClock>>(
        &mut self,
        clock: impl FnOnce() -> C,
    ) -> Option<Waiter> {
        match self {
            Waiters::Fifo(fifo) => fifo.pop_front(),
            Waiters::Banded(banded) => {
                let (band, tag, waiter) = banded.pop()?;
                clock().served(band, tag);
                Some(waiter)
            }
        }
    }

    /// The key of the waiter [`Waiters::pop`] would return ([`head_key`]), if any.
    #[inline]
    pub fn head_key(&self) -> Option<u64> {
        match self {
            Waiters::Fifo(fifo) => fifo.front().map(|waiter| head_key(0, waiter.ticket)),
            Waiters::Banded(banded) => banded.head().map(|(band, tag)| head_key(band, tag)),
        }
    }

    /// Removes waiter `id`; false if it is not here.
    pub fn remove<C: DerefMut<Target = FairClock>>(
        &mut self,
        id: WaiterId,
        clock: impl FnOnce() -> C,
    ) -> bool {
        match self {
            Waiters::Fifo(fifo) => {
                let Some(at) = fifo.iter().position(|queued| queued.id == id) else {
                    return false;
                };
                fifo.remove(at);
                true
            }
            Waiters::Banded(banded) => match banded.remove(id) {
                Some(band) => {
                    clock().gone(band);
                    true
                }
                None => false,
            },
        }
    }

    /// Removes and returns the newest waiter of the lowest band below `band`, if any: the one
    /// an arrival of `band` takes the place of when the queue is full. Never anything without
    /// a policy.
    pub fn shed_below<C: DerefMut<Target = FairClock>>(
        &mut self,
        band: u8,
        clock: impl FnOnce() -> C,
    ) -> Option<Waiter> {
        match self {
            Waiters::Fifo(_) => None,
            Waiters::Banded(banded) => {
                let (lowest, newest) = banded.shed_below(band)?;
                clock().gone(lowest);
                Some(newest)
            }
        }
    }

    /// The lowest band with a waiter here, under a policy: what [`Waiters::shed_below`] would
    /// take from for an arrival of any higher band. `None` without a policy or without waiters.
    pub fn lowest_band(&self) -> Option<u8> {
        match self {
            Waiters::Fifo(_) => None,
            Waiters::Banded(banded) => banded
                .bands
                .iter()
                .position(|band| !band.is_empty())
                .map(|band| band as u8),
        }
    }

    /// Every waiter, removed, in no particular order.
    pub fn drain<C: DerefMut<Target = FairClock>>(
        &mut self,
        clock: impl FnOnce() -> C,
    ) -> Vec<Waiter> {
        match self {
            Waiters::Fifo(fifo) => fifo.drain(..).collect(),
            Waiters::Banded(banded) => {
                let mut clock = clock();
                let mut all = Vec::with_capacity(banded.location.len());
                for (band, waiters) in banded.bands.iter_mut().enumerate() {
                    for (_, waiter) in std::mem::take(waiters) {
                        clock.gone(band as u8);
                        all.push(waiter);
                    }
                }
                banded.location.clear();
                all
            }
        }
    }
}

/// Waiters under a priority policy.
#[derive(Debug)]
pub struct Banded {
    /// Indexed by band number: the band's waiters by (start tag, ticket), served first to last.
    bands: Vec<BTreeMap<(u64, u64), Waiter>>,
    /// Where each waiter is: (band, start tag, ticket).
    location: FxHashMap<WaiterId, (u8, u64, u64)>,
}

impl Banded {
    fn new(bands: u8) -> Banded {
        Banded {
            bands: (0..bands.max(1)).map(|_| BTreeMap::new()).collect(),
            location: FxHashMap::default(),
        }
    }

    fn push(&mut self, class: Class, waiter: Waiter, clock: &mut FairClock) {
        let band = class.band.min(self.bands.len() as u8 - 1);
        let tag = clock.arrive(Class {
            band,
            flow: class.flow,
        });
        self.bands[usize::from(band)].insert((tag, waiter.ticket), waiter);
        self.location.insert(waiter.id, (band, tag, waiter.ticket));
    }

    /// The highest band with waiters.
    fn top(&self) -> Option<usize> {
        self.bands.iter().rposition(|band| !band.is_empty())
    }

    /// The band and start tag of the waiter to serve next.
    fn head(&self) -> Option<(u8, u64)> {
        let band = self.top()?;
        let (&(tag, _), _) = self.bands[band].first_key_value()?;
        Some((band as u8, tag))
    }

    /// The waiter to serve next, removed, with its band and start tag.
    fn pop(&mut self) -> Option<(u8, u64, Waiter)> {
        let band = self.top()?;
        let ((tag, _), waiter) = self.bands[band].pop_first()?;
        self.location.remove(&waiter.id);
        Some((band as u8, tag, waiter))
    }

    /// Removes waiter `id`; its band, or `None` if it is not here.
    fn remove(&mut self, id: WaiterId) -> Option<u8> {
        let (band, tag, ticket) = self.location.remove(&id)?;
        self.bands[usize::from(band)].remove(&(tag, ticket));
        Some(band)
    }

    fn shed_below(&mut self, band: u8) -> Option<(u8, Waiter)> {
        // A band past the last waits in the last: it sheds only what is below that.
        let band = band.min(self.bands.len() as u8 - 1);
        let lowest = self
            .bands
            .iter()
            .take(usize::from(band))
            .position(|band| !band.is_empty())?;
        // Shedding runs only with the queue full; a scan of one band is fine there.
        let newest = *self.bands[lowest]
            .values()
            .max_by_key(|waiter| waiter.ticket)?;
        let band = self.remove(newest.id)?;
        Some((band, newest))
    }
}

#[cfg(test)]
mod tests;
