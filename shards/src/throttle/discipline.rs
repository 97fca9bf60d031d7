//! The order in which one shard's waiters for one revision are served: today's FIFO, or, with a
//! revision's priority policy on (issue 27), priority bands and fairness across flows.
//!
//! Pure: no clock, no atomics. [`LocalQueue`](super::gate::LocalQueue) keeps one of these and
//! publishes the rank of the waiter it would serve next ([`Waiters::head_key`]) in the
//! revision's gate, so that a slot freed on any shard goes to the highest waiting band first.
//!
//! With a policy, a waiter is keyed by (band, flow):
//!
//! * **Strict priority across bands.** A waiter of a higher band is served before any of a lower
//!   one, whenever it arrived.
//! * **Round robin across flows within a band.** Deficit round robin by request count with a
//!   quantum of one request, which is plain round robin: the flow whose turn it is gives its
//!   oldest waiter and goes to the back of the turn if it has more; a flow that starts waiting
//!   joins at the back. So a flow with 5 000 waiters delays another flow's first request by at
//!   most one turn of the flows ahead of it.
//! * **FCFS within a flow.**
//! * **Shedding.** When the queue is full, an arrival may take the place of the newest waiter of
//!   the lowest band below its own ([`Waiters::shed_below`]).
//!
//! Off (no policy) is a `VecDeque` in arrival order, as before.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

/// Identifies a queued request within its shard.
pub type WaiterId = u64;

/// Most bands a policy may have; bands are numbered `0..bands`, higher served first.
pub const MAX_BANDS: u8 = 16;

/// Bits of a head key below the band's rank: room for the ticket. 2^56 tickets last 228 years
/// at ten million queued requests a second.
const TICKET_BITS: u32 = 56;
const TICKET_MASK: u64 = (1 << TICKET_BITS) - 1;

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
/// one, and the ticket (arrival order) decides within a band. Without a policy every waiter is
/// in band 0.
pub fn head_key(band: u8, ticket: u64) -> u64 {
    let rank = u64::from(MAX_BANDS - 1 - band.min(MAX_BANDS - 1));
    rank << TICKET_BITS | (ticket & TICKET_MASK)
}

/// One shard's waiters for one revision, in the revision's discipline.
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
            Waiters::Banded(banded) => banded.len,
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
    /// discipline: into a policy they all go to `default` band's shared flow in arrival order,
    /// out of one they line up by ticket.
    pub fn set_policy(&mut self, bands: Option<u8>, default: u8) {
        let wanted = bands.map(|bands| bands.clamp(1, MAX_BANDS));
        match (&*self, wanted) {
            (Waiters::Fifo(_), None) => return,
            (Waiters::Banded(banded), Some(bands)) if banded.bands.len() == usize::from(bands) => {
                return;
            }
            _ => {}
        }
        let mut all = self.drain();
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
                    banded.push(class, waiter);
                }
                Waiters::Banded(Box::new(banded))
            }
        };
    }

    /// A request starts waiting. `class` is ignored without a policy; a band past the policy's
    /// last is its last.
    #[inline]
    pub fn push(&mut self, class: Class, waiter: Waiter) {
        match self {
            Waiters::Fifo(fifo) => fifo.push_back(waiter),
            Waiters::Banded(banded) => banded.push(class, waiter),
        }
    }

    /// The waiter to serve next, removed.
    #[inline]
    pub fn pop(&mut self) -> Option<Waiter> {
        match self {
            Waiters::Fifo(fifo) => fifo.pop_front(),
            Waiters::Banded(banded) => banded.pop(),
        }
    }

    /// The key of the waiter [`Waiters::pop`] would return ([`head_key`]), if any.
    #[inline]
    pub fn head_key(&self) -> Option<u64> {
        match self {
            Waiters::Fifo(fifo) => fifo.front().map(|waiter| head_key(0, waiter.ticket)),
            Waiters::Banded(banded) => banded.head().map(|(band, w)| head_key(band, w.ticket)),
        }
    }

    /// Removes waiter `id`; false if it is not here.
    pub fn remove(&mut self, id: WaiterId) -> bool {
        match self {
            Waiters::Fifo(fifo) => {
                let Some(at) = fifo.iter().position(|queued| queued.id == id) else {
                    return false;
                };
                fifo.remove(at);
                true
            }
            Waiters::Banded(banded) => banded.remove(id),
        }
    }

    /// Removes and returns the newest waiter of the lowest band below `band`, if any: the one
    /// an arrival of `band` takes the place of when the queue is full. Never anything without
    /// a policy.
    pub fn shed_below(&mut self, band: u8) -> Option<Waiter> {
        match self {
            Waiters::Fifo(_) => None,
            Waiters::Banded(banded) => banded.shed_below(band),
        }
    }

    /// Every waiter, removed, in no particular order.
    pub fn drain(&mut self) -> Vec<Waiter> {
        match self {
            Waiters::Fifo(fifo) => fifo.drain(..).collect(),
            Waiters::Banded(banded) => {
                let bands = banded.bands.len() as u8;
                let all = banded
                    .bands
                    .iter_mut()
                    .flat_map(|band| band.flows.drain().flat_map(|(_, flow)| flow))
                    .collect();
                **banded = Banded::new(bands);
                all
            }
        }
    }
}

/// Waiters under a priority policy.
#[derive(Debug)]
pub struct Banded {
    /// Indexed by band number.
    bands: Vec<Band>,
    /// Where each waiter is: (band, flow).
    location: FxHashMap<WaiterId, Class>,
    len: usize,
}

/// One band's waiters: a FIFO per flow, and the flows' turns.
#[derive(Debug, Default)]
struct Band {
    flows: FxHashMap<u64, VecDeque<Waiter>>,
    /// Flows with waiters, the one whose turn it is first. Each flow is here exactly once while
    /// it has waiters.
    turns: VecDeque<u64>,
}

impl Banded {
    fn new(bands: u8) -> Banded {
        Banded {
            bands: (0..bands.max(1)).map(|_| Band::default()).collect(),
            location: FxHashMap::default(),
            len: 0,
        }
    }

    fn push(&mut self, class: Class, waiter: Waiter) {
        let band = class.band.min(self.bands.len() as u8 - 1);
        let at = &mut self.bands[usize::from(band)];
        let flow = at.flows.entry(class.flow).or_default();
        if flow.is_empty() {
            at.turns.push_back(class.flow);
        }
        flow.push_back(waiter);
        self.location.insert(
            waiter.id,
            Class {
                band,
                flow: class.flow,
            },
        );
        self.len += 1;
    }

    /// The highest band with waiters.
    fn top(&self) -> Option<usize> {
        self.bands.iter().rposition(|band| !band.turns.is_empty())
    }

    fn head(&self) -> Option<(u8, &Waiter)> {
        let band = self.top()?;
        let flow = self.bands[band].turns.front()?;
        let waiter = self.bands[band].flows.get(flow)?.front()?;
        Some((band as u8, waiter))
    }

    fn pop(&mut self) -> Option<Waiter> {
        let top = self.top()?;
        let band = &mut self.bands[top];
        let flow_key = band.turns.pop_front()?;
        let flow = band.flows.get_mut(&flow_key)?;
        let waiter = flow.pop_front()?;
        if flow.is_empty() {
            band.flows.remove(&flow_key);
        } else {
            band.turns.push_back(flow_key);
        }
        self.location.remove(&waiter.id);
        self.len -= 1;
        Some(waiter)
    }

    fn remove(&mut self, id: WaiterId) -> bool {
        let Some(class) = self.location.remove(&id) else {
            return false;
        };
        let band = &mut self.bands[usize::from(class.band)];
        if let Some(flow) = band.flows.get_mut(&class.flow) {
            if let Some(at) = flow.iter().position(|queued| queued.id == id) {
                flow.remove(at);
            }
            if flow.is_empty() {
                band.flows.remove(&class.flow);
                band.turns.retain(|&turn| turn != class.flow);
            }
        }
        self.len -= 1;
        true
    }

    fn shed_below(&mut self, band: u8) -> Option<Waiter> {
        // A band past the last waits in the last: it sheds only what is below that.
        let band = band.min(self.bands.len() as u8 - 1);
        let lowest = self
            .bands
            .iter()
            .take(usize::from(band))
            .position(|band| !band.turns.is_empty())?;
        let newest = *self.bands[lowest]
            .flows
            .values()
            .filter_map(|flow| flow.back())
            .max_by_key(|waiter| waiter.ticket)?;
        self.remove(newest.id);
        Some(newest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arrivals as (band, flow), in ticket order.
    type Arrivals = &'static [(u8, u64)];

    /// A queue under `bands` bands (or FIFO), with waiters pushed as (band, flow) in ticket
    /// order; ids equal tickets.
    fn queue(bands: Option<u8>, arrivals: &[(u8, u64)]) -> Waiters {
        let mut waiters = Waiters::default();
        waiters.set_policy(bands, 0);
        for (ticket, &(band, flow)) in arrivals.iter().enumerate() {
            let ticket = ticket as u64;
            waiters.push(Class { band, flow }, Waiter { ticket, id: ticket });
        }
        waiters
    }

    /// Pops everything: the ids in service order, checking the published head each time.
    fn service_order(waiters: &mut Waiters) -> Vec<u64> {
        let mut order = Vec::new();
        loop {
            let key = waiters.head_key();
            let Some(waiter) = waiters.pop() else {
                assert_eq!(key, None);
                break;
            };
            assert_eq!(key.map(|key| key & TICKET_MASK), Some(waiter.ticket));
            order.push(waiter.id);
        }
        assert!(waiters.is_empty());
        order
    }

    #[test]
    fn the_service_order_of_each_rule() {
        // (what it shows, bands, arrivals as (band, flow), service order by arrival index)
        let table: &[(&str, Option<u8>, Arrivals, &[u64])] = &[
            (
                "off: arrival order, whatever the class",
                None,
                &[(0, 1), (2, 2), (1, 1), (2, 3)],
                &[0, 1, 2, 3],
            ),
            (
                "one band, one flow: FCFS",
                Some(1),
                &[(0, 0), (0, 0), (0, 0)],
                &[0, 1, 2],
            ),
            (
                "strict priority: a later higher band goes first",
                Some(3),
                &[(0, 0), (0, 0), (1, 0), (2, 0), (1, 0)],
                &[3, 2, 4, 0, 1],
            ),
            (
                "a band past the last is the last",
                Some(2),
                &[(0, 0), (9, 0)],
                &[1, 0],
            ),
            (
                "round robin across flows, FCFS within each",
                Some(1),
                &[(0, 1), (0, 1), (0, 1), (0, 2), (0, 2), (0, 3)],
                &[0, 3, 5, 1, 4, 2],
            ),
            (
                "a flow that queued many delays a newcomer's first by one turn",
                Some(1),
                &[(0, 1), (0, 1), (0, 1), (0, 1), (0, 1), (0, 2)],
                &[0, 5, 1, 2, 3, 4],
            ),
            (
                "fairness within a band, priority across",
                Some(2),
                &[(0, 1), (0, 1), (0, 2), (1, 1), (1, 1), (1, 2)],
                &[3, 5, 4, 0, 2, 1],
            ),
        ];
        for &(what, bands, arrivals, expected) in table {
            let mut waiters = queue(bands, arrivals);
            assert_eq!(waiters.len(), arrivals.len(), "{what}");
            assert_eq!(service_order(&mut waiters), expected, "{what}");
        }
    }

    #[test]
    fn a_newcomer_flow_joins_at_the_back_of_the_turn() {
        // Flows 1 and 2 are both waiting; flow 1 has been served once (so 2 is next); flow 3
        // arrives and waits behind 2 and 1, not before them.
        let mut waiters = queue(Some(1), &[(0, 1), (0, 1), (0, 2), (0, 2)]);
        assert_eq!(waiters.pop().map(|w| w.id), Some(0));
        waiters.push(Class { band: 0, flow: 3 }, Waiter { ticket: 4, id: 4 });
        assert_eq!(service_order(&mut waiters), [2, 1, 4, 3]);
    }

    #[test]
    fn removal_takes_a_waiter_out_of_its_flow_and_its_turn() {
        // (what, bands, arrivals, removed, service order of the rest)
        type Row = (&'static str, Option<u8>, Arrivals, u64, &'static [u64]);
        let table: &[Row] = &[
            ("off", None, &[(0, 0), (0, 0), (0, 0)], 1, &[0, 2]),
            (
                "a flow's only waiter: the flow leaves the turn",
                Some(1),
                &[(0, 1), (0, 2), (0, 1)],
                1,
                &[0, 2],
            ),
            (
                "the head of a band",
                Some(2),
                &[(0, 0), (1, 0), (1, 0)],
                1,
                &[2, 0],
            ),
        ];
        for &(what, bands, arrivals, removed, expected) in table {
            let mut waiters = queue(bands, arrivals);
            assert!(waiters.remove(removed), "{what}");
            assert!(!waiters.remove(removed), "{what}: already gone");
            assert_eq!(service_order(&mut waiters), expected, "{what}");
        }
    }

    #[test]
    fn shedding_takes_the_newest_waiter_of_the_lowest_band_below() {
        // (what, bands, arrivals, arriving band, shed id, the rest's service order)
        type Row = (
            &'static str,
            Option<u8>,
            Arrivals,
            u8,
            Option<u64>,
            &'static [u64],
        );
        let table: &[Row] = &[
            ("off: never", None, &[(0, 0), (0, 0)], 5, None, &[0, 1]),
            (
                "the newest of the lowest band, across its flows",
                Some(3),
                &[(0, 1), (0, 2), (0, 1), (1, 0)],
                2,
                Some(2),
                &[3, 0, 1],
            ),
            (
                "the lowest band with waiters",
                Some(3),
                &[(1, 0), (1, 0), (2, 0)],
                2,
                Some(1),
                &[2, 0],
            ),
            (
                "no band below the arrival's: nothing",
                Some(3),
                &[(1, 0), (2, 0)],
                1,
                None,
                &[1, 0],
            ),
            (
                "a band past the last is the last: it does not shed the last",
                Some(3),
                &[(2, 0), (2, 0)],
                7,
                None,
                &[0, 1],
            ),
            (
                "the same band does not shed",
                Some(2),
                &[(0, 0), (0, 0)],
                0,
                None,
                &[0, 1],
            ),
        ];
        for &(what, bands, arrivals, band, shed, expected) in table {
            let mut waiters = queue(bands, arrivals);
            assert_eq!(waiters.shed_below(band).map(|w| w.id), shed, "{what}");
            assert_eq!(service_order(&mut waiters), expected, "{what}");
        }
    }

    #[test]
    fn head_keys_rank_bands_before_tickets() {
        assert!(head_key(1, 1_000) < head_key(0, 0), "a higher band first");
        assert!(head_key(0, 3) < head_key(0, 4), "then arrival order");
        assert!(head_key(MAX_BANDS - 1, u64::MAX) < head_key(MAX_BANDS - 2, 0));
        assert_eq!(head_key(200, 7), head_key(MAX_BANDS - 1, 7), "bounded");
        // Off, every waiter is band 0: the key orders by ticket alone.
        let off = queue(None, &[(7, 0), (3, 0)]);
        assert_eq!(off.head_key(), Some(head_key(0, 0)));
    }

    #[test]
    fn switching_policy_keeps_every_waiter_in_arrival_order() {
        let mut waiters = queue(None, &[(0, 0), (0, 0), (0, 0)]);
        waiters.set_policy(Some(3), 1);
        assert_eq!(waiters.bands(), 3);
        assert_eq!(
            waiters.head_key(),
            Some(head_key(1, 0)),
            "in the default band"
        );
        waiters.push(Class { band: 2, flow: 0 }, Waiter { ticket: 3, id: 3 });
        waiters.set_policy(Some(3), 1);
        assert_eq!(waiters.len(), 4, "the same policy changes nothing");
        waiters.set_policy(None, 0);
        assert_eq!(service_order(&mut waiters), [0, 1, 2, 3]);
    }
}
