//! ★ Which fairness keys (tenants) get series of their own in one shard: the heaviest few, with
//! the rest folded into one counter (issue 27: bounded label cardinality, the top keys shown).
//!
//! Pure: [`TenantRanking::count`] takes a request's flow and says which series counts it. The
//! shell ([`super::PriorityCounters`]) keeps the counters a scrape reads.
//!
//! * **While there is room**, a new key takes a series at once: with up to
//!   [`super::TENANT_SERIES`] keys in a shard every one is shown.
//! * **Past that, the heaviest keys win series**, by recent weight: each key with a series, and
//!   each of up to [`CANDIDATES`] without one, has a score (its requests, halved every
//!   [`DECAY_EVERY`] requests so that weight fades). Keys without a series are tracked by the
//!   space-saving algorithm (Metwally et al. 2005): a key not tracked replaces the lowest score
//!   and starts from it, with that much recorded as possible error, so its score may
//!   over-count and `score − error` never does.
//! * **A key takes the series of the lightest key shown only when it is surely heavier, by a
//!   margin**: when its requests counted for sure (`score − error`) reach twice that key's score
//!   plus [`PROMOTION_FLOOR`]. So two keys of equal weight do not swap series back and forth,
//!   and a client that makes up a new key per request never wins one (each such key's sure
//!   count stays at 1): the scrape's series do not churn.
//! * A key that loses its series goes back to being a candidate from nothing; its series stops
//!   (Prometheus ends it), and should it win one again its count starts over from zero.

use rustc_hash::FxHashMap;

/// Keys without a series tracked per shard and revision, as candidates.
pub const CANDIDATES: usize = 64;
/// Requests counted between two halvings of every score.
pub const DECAY_EVERY: u32 = 1024;
/// Requests a candidate needs for sure, beyond twice the lightest shown key's score, to take
/// its series.
pub const PROMOTION_FLOOR: u64 = 8;

/// Which series counts a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tally {
    /// The series in this slot: its key already had it.
    Series(usize),
    /// The key takes the series in this slot, free or taken from a lighter key: the slot is
    /// named after it and counts from zero, then counts this request.
    Takes(usize),
    /// The folded counter of keys without a series.
    Other,
}

/// One shard's ranking of one revision's fairness keys.
#[derive(Debug)]
pub struct TenantRanking {
    /// Keys with a series, by slot: (flow, score). Never more than the series there are.
    shown: Vec<(u64, u64)>,
    series: usize,
    /// Keys without a series: flow → (score, possible over-count).
    candidates: FxHashMap<u64, (u64, u64)>,
    since_decay: u32,
}

impl TenantRanking {
    /// A ranking with `series` slots.
    pub fn new(series: usize) -> TenantRanking {
        TenantRanking {
            shown: Vec::with_capacity(series),
            series,
            candidates: FxHashMap::default(),
            since_decay: 0,
        }
    }

    /// Counts a request of `flow`: which series it goes to.
    pub fn count(&mut self, flow: u64) -> Tally {
        self.since_decay += 1;
        if self.since_decay >= DECAY_EVERY {
            self.since_decay = 0;
            self.decay();
        }
        if let Some(slot) = self.shown.iter().position(|&(shown, _)| shown == flow) {
            self.shown[slot].1 += 1;
            return Tally::Series(slot);
        }
        if self.shown.len() < self.series {
            self.shown.push((flow, 1));
            return Tally::Takes(self.shown.len() - 1);
        }
        let (score, error) = self.track(flow);
        let Some((lightest, &(_, light))) = self
            .shown
            .iter()
            .enumerate()
            .min_by_key(|&(_, &(_, score))| score)
        else {
            return Tally::Other;
        };
        if score - error < light.saturating_mul(2).saturating_add(PROMOTION_FLOOR) {
            return Tally::Other;
        }
        let (demoted, _) = self.shown[lightest];
        self.candidates.remove(&flow);
        self.shown[lightest] = (flow, score - error);
        // The key that lost its series is a candidate again, from nothing.
        self.candidates.insert(demoted, (0, 0));
        self.trim();
        Tally::Takes(lightest)
    }

    /// Counts one request of an untracked or tracked candidate: its (score, error) after.
    fn track(&mut self, flow: u64) -> (u64, u64) {
        if let Some(entry) = self.candidates.get_mut(&flow) {
            entry.0 += 1;
            return *entry;
        }
        let mut floor = 0;
        if self.candidates.len() >= CANDIDATES {
            // Space-saving: the new key takes the lightest candidate's place and count.
            if let Some((&lightest, &(score, _))) =
                self.candidates.iter().min_by_key(|(_, &(score, _))| score)
            {
                self.candidates.remove(&lightest);
                floor = score;
            }
        }
        let entry = (floor + 1, floor);
        self.candidates.insert(flow, entry);
        entry
    }

    /// Keeps the candidates within bound after a demotion put one more in.
    fn trim(&mut self) {
        while self.candidates.len() > CANDIDATES {
            let Some((&lightest, _)) = self.candidates.iter().min_by_key(|(_, &(score, _))| score)
            else {
                return;
            };
            self.candidates.remove(&lightest);
        }
    }

    fn decay(&mut self) {
        for (_, score) in &mut self.shown {
            *score /= 2;
        }
        self.candidates.retain(|_, (score, error)| {
            *score /= 2;
            *error /= 2;
            *score > 0
        });
    }

    /// The flows shown, by slot.
    #[cfg(test)]
    fn shown(&self) -> Vec<u64> {
        self.shown.iter().map(|&(flow, _)| flow).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests as (flow, how many in a row).
    type Burst = &'static [(u64, u32)];

    #[test]
    fn the_heaviest_keys_hold_the_series() {
        // (what, series, requests in order, the flows shown after, requests folded)
        type Row = (&'static str, usize, Burst, &'static [u64], u64);
        let table: &[Row] = &[
            (
                "room for every key: each takes a series at once",
                3,
                &[(1, 1), (2, 1), (3, 5)],
                &[1, 2, 3],
                0,
            ),
            (
                "full: a light newcomer is folded",
                2,
                &[(1, 10), (2, 10), (3, 5)],
                &[1, 2],
                5,
            ),
            (
                "a heavy newcomer takes the lightest key's series once surely twice as heavy \
                 plus the floor",
                2,
                &[(1, 10), (2, 3), (3, 2 * 3 + PROMOTION_FLOOR as u32)],
                &[1, 3],
                2 * 3 + PROMOTION_FLOOR - 1,
            ),
            (
                "one request short of that: still folded",
                2,
                &[(1, 10), (2, 3), (3, 2 * 3 + PROMOTION_FLOOR as u32 - 1)],
                &[1, 2],
                2 * 3 + PROMOTION_FLOOR - 1,
            ),
            (
                "a client making up a new key per request never wins a series",
                1,
                &[
                    (1, 2),
                    (10, 1),
                    (11, 1),
                    (12, 1),
                    (13, 1),
                    (14, 1),
                    (15, 1),
                    (16, 1),
                    (17, 1),
                    (18, 1),
                    (19, 1),
                    (20, 1),
                    (21, 1),
                ],
                &[1],
                12,
            ),
        ];
        for &(what, series, requests, shown, folded) in table {
            let mut ranking = TenantRanking::new(series);
            let mut other = 0;
            for &(flow, times) in requests {
                for _ in 0..times {
                    if ranking.count(flow) == Tally::Other {
                        other += 1;
                    }
                }
            }
            assert_eq!(ranking.shown(), shown, "{what}");
            assert_eq!(other, folded, "{what}");
        }
    }

    #[test]
    fn two_keys_of_equal_weight_do_not_swap_series() {
        let mut ranking = TenantRanking::new(1);
        let mut takes = 0;
        for _ in 0..10_000 {
            for flow in [1, 2] {
                if let Tally::Takes(_) = ranking.count(flow) {
                    takes += 1;
                }
            }
        }
        assert_eq!(
            takes, 1,
            "only the first key's first request takes the series"
        );
        assert_eq!(ranking.shown(), [1]);
    }

    #[test]
    fn a_key_that_went_quiet_gives_its_series_to_one_that_is_busy_now() {
        let mut ranking = TenantRanking::new(1);
        for _ in 0..5_000 {
            ranking.count(1);
        }
        // Flow 1 stops; flow 2 is busy. Within a few halvings flow 1's weight has faded.
        let mut took_at = None;
        for request in 0..10 * DECAY_EVERY {
            if ranking.count(2) == Tally::Takes(0) {
                took_at = Some(request);
                break;
            }
        }
        let took_at = took_at.expect("the busy key took the series");
        assert!(took_at < 4 * DECAY_EVERY, "took {took_at} requests");
        assert_eq!(ranking.shown(), [2]);
        // And flow 1, back at a trickle, does not take it back.
        for _ in 0..100 {
            ranking.count(2);
            ranking.count(2);
            assert_eq!(ranking.count(1), Tally::Other);
        }
    }

    #[test]
    fn candidates_stay_bounded_whatever_the_keys() {
        let mut ranking = TenantRanking::new(4);
        for flow in 0..100_000u64 {
            ranking.count(flow);
            assert!(ranking.candidates.len() <= CANDIDATES);
        }
        assert_eq!(
            ranking.shown(),
            [0, 1, 2, 3],
            "the first four, never displaced"
        );
    }
}
