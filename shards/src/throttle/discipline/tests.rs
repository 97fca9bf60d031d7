use super::*;

/// Arrivals as (band, flow), in ticket order.
type Arrivals = &'static [(u8, u64)];

/// One shard's waiters with the revision's clock, as the gate holds them.
struct Queue {
    waiters: Waiters,
    clock: FairClock,
    next: u64,
}

impl Queue {
    /// Queues a request as (band, flow); its id is its ticket.
    fn push(&mut self, band: u8, flow: u64) {
        let id = self.next;
        self.next += 1;
        self.waiters
            .push(Class { band, flow }, id, || id, || &mut self.clock);
    }

    fn pop(&mut self) -> Option<Waiter> {
        self.waiters.pop(|| &mut self.clock)
    }

    fn remove(&mut self, id: WaiterId) -> bool {
        self.waiters.remove(id, || &mut self.clock)
    }

    fn shed_below(&mut self, band: u8) -> Option<Waiter> {
        self.waiters.shed_below(band, || &mut self.clock)
    }

    fn set_policy(&mut self, bands: Option<u8>, default: u8) {
        self.waiters.set_policy(bands, default, || &mut self.clock);
    }

    /// Pops everything: the ids in service order, checking the published head each time:
    /// it names a waiter exactly when there is one, and never goes down.
    fn service_order(&mut self) -> Vec<u64> {
        let mut order = Vec::new();
        let mut last = 0;
        loop {
            let key = self.waiters.head_key();
            let Some(waiter) = self.pop() else {
                assert_eq!(key, None);
                break;
            };
            let key = key.expect("a head published for the waiter served");
            assert!(key >= last, "the head key went down");
            last = key;
            order.push(waiter.id);
        }
        assert!(self.waiters.is_empty());
        order
    }
}

/// A queue under `bands` bands (or FIFO), with waiters pushed as (band, flow) in ticket
/// order; ids equal tickets.
fn queue(bands: Option<u8>, arrivals: &[(u8, u64)]) -> Queue {
    let mut queue = Queue {
        waiters: Waiters::default(),
        clock: FairClock::default(),
        next: 0,
    };
    queue.set_policy(bands, 0);
    for &(band, flow) in arrivals {
        queue.push(band, flow);
    }
    queue
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
            "one turn each across flows, FCFS within each",
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
        let mut queue = queue(bands, arrivals);
        assert_eq!(queue.waiters.len(), arrivals.len(), "{what}");
        assert_eq!(queue.service_order(), expected, "{what}");
    }
}

#[test]
fn a_newcomer_flow_joins_the_turn_under_way() {
    // Flows 1 and 2 each wait with two requests (turns 0 and 1); flow 1's first has been
    // served. Flow 3 arrives: it takes turn 0, which is still being served (flow 2's first
    // request waits in it), so it goes before flow 1's second request. Round robin per shard
    // put it behind that one; either way it waits at most one request of each flow.
    let mut queue = queue(Some(1), &[(0, 1), (0, 1), (0, 2), (0, 2)]);
    assert_eq!(queue.pop().map(|w| w.id), Some(0));
    queue.push(0, 3);
    assert_eq!(queue.service_order(), [2, 4, 1, 3]);
}

#[test]
fn a_flow_served_this_turn_comes_back_in_the_next() {
    // Flow 1 has one request at a time (served, then another); flow 2 keeps two waiting.
    // Flow 1's second request is in turn 1, after flow 2's turn 0, not before it.
    let mut queue = queue(Some(1), &[(0, 1), (0, 2), (0, 2)]);
    assert_eq!(queue.pop().map(|w| w.id), Some(0));
    queue.push(0, 1);
    assert_eq!(queue.service_order(), [1, 2, 3]);
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
        let mut queue = queue(bands, arrivals);
        assert!(queue.remove(removed), "{what}");
        assert!(!queue.remove(removed), "{what}: already gone");
        assert_eq!(queue.service_order(), expected, "{what}");
    }
}

#[test]
fn the_lowest_band_waiting_is_what_another_shards_arrival_may_shed() {
    // (what, bands, arrivals, the lowest band published)
    type Row = (&'static str, Option<u8>, Arrivals, Option<u8>);
    let table: &[Row] = &[
        ("off: none", None, &[(0, 0)], None),
        ("nobody waits: none", Some(3), &[], None),
        (
            "the lowest band with a waiter",
            Some(3),
            &[(2, 0), (1, 0), (2, 1)],
            Some(1),
        ),
        (
            "a band past the last waits in the last",
            Some(3),
            &[(9, 0)],
            Some(2),
        ),
    ];
    for &(what, bands, arrivals, lowest) in table {
        assert_eq!(
            queue(bands, arrivals).waiters.lowest_band(),
            lowest,
            "{what}"
        );
    }
    let mut emptied = queue(Some(3), &[(0, 0), (2, 0)]);
    assert_eq!(emptied.shed_below(2).map(|w| w.id), Some(0));
    assert_eq!(
        emptied.waiters.lowest_band(),
        Some(2),
        "once shed, the next band up"
    );
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
        let mut queue = queue(bands, arrivals);
        assert_eq!(queue.shed_below(band).map(|w| w.id), shed, "{what}");
        assert_eq!(queue.service_order(), expected, "{what}");
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
    assert_eq!(off.waiters.head_key(), Some(head_key(0, 0)));
}

#[test]
fn switching_policy_keeps_every_waiter_in_arrival_order() {
    let mut queue = queue(None, &[(0, 0), (0, 0), (0, 0)]);
    queue.set_policy(Some(3), 1);
    assert_eq!(queue.waiters.bands(), 3);
    assert_eq!(
        queue.waiters.head_key(),
        Some(head_key(1, 0)),
        "in the default band, tagged in arrival order from turn 0"
    );
    queue.push(2, 0);
    queue.set_policy(Some(3), 1);
    assert_eq!(queue.waiters.len(), 4, "the same policy changes nothing");
    queue.set_policy(None, 0);
    assert_eq!(queue.service_order(), [0, 1, 2, 3]);
    assert_eq!(
        queue.clock.remembered(1) + queue.clock.remembered(2),
        0,
        "leaving the policy untagged every waiter: the bands are idle"
    );
}

/// What the clock hands out: (what, steps, the tag of each arrival in order).
#[test]
fn the_fair_clock_tags_each_turn() {
    #[derive(Clone, Copy)]
    enum Op {
        /// A request of (band, flow) arrives.
        Arrive(u8, u64),
        /// The request of the n-th arrival is served.
        Served(usize),
        /// The request of the n-th arrival leaves unserved.
        Gone(usize),
    }
    use Op::*;
    let table: &[(&str, &[Op], &[u64])] = &[
        (
            "a flow's requests take consecutive turns",
            &[Arrive(0, 1), Arrive(0, 1), Arrive(0, 1)],
            &[0, 1, 2],
        ),
        (
            "a newcomer takes the turn being served",
            &[
                Arrive(0, 1),
                Arrive(0, 1),
                Arrive(0, 1),
                Served(0),
                Served(1),
                Arrive(0, 2),
            ],
            &[0, 1, 2, 1],
        ),
        (
            "a flow served in this turn comes back in the next",
            &[
                Arrive(0, 1),
                Arrive(0, 2),
                Arrive(0, 2),
                Served(0),
                Arrive(0, 1),
            ],
            &[0, 0, 1, 1],
        ),
        (
            "bands keep their own turns",
            &[
                Arrive(1, 1),
                Arrive(1, 1),
                Served(0),
                Served(1),
                Arrive(1, 2),
                Arrive(0, 2),
            ],
            &[0, 1, 2, 0],
        ),
        (
            "an idle band starts every flow afresh",
            &[
                Arrive(0, 1),
                Arrive(0, 1),
                Arrive(0, 2),
                Served(0),
                Gone(1),
                Served(2),
                Arrive(0, 1),
                Arrive(0, 2),
            ],
            &[0, 1, 0, 2, 2],
        ),
    ];
    for &(what, ops, expected) in table {
        let mut clock = FairClock::default();
        let mut arrivals: Vec<(u8, u64)> = Vec::new();
        for &op in ops {
            match op {
                Arrive(band, flow) => {
                    let tag = clock.arrive(Class { band, flow });
                    arrivals.push((band, tag));
                }
                Served(n) => clock.served(arrivals[n].0, arrivals[n].1),
                Gone(n) => clock.gone(arrivals[n].0),
            }
        }
        let tags: Vec<u64> = arrivals.iter().map(|&(_, tag)| tag).collect();
        assert_eq!(tags, expected, "{what}");
    }
}

#[test]
fn the_fair_clock_forgets_flows_it_no_longer_needs() {
    let mut clock = FairClock::default();
    let shared = Class { band: 0, flow: 0 };
    // Flow 0 was served in turn 0 and waits in turn 1, so the band never idles; meanwhile
    // 100 000 new flows arrive one at a time and are served in turn 0, each remembered as
    // served in it (finish 1 > V = 0) until the turn is closed early.
    let first = clock.arrive(shared);
    let second = clock.arrive(shared);
    clock.served(0, first);
    let mut most = 0;
    for flow in 1..100_000 {
        let tag = clock.arrive(Class { band: 0, flow });
        clock.served(0, tag);
        most = most.max(clock.remembered(0));
    }
    assert!(
        most <= 2 * REMEMBERED_FLOWS + FIRST_SWEEP,
        "{most} flows remembered"
    );
    assert!(most > REMEMBERED_FLOWS, "the early close was not reached");
    // Flow 0's second request is served: the band is idle and forgets every flow.
    clock.served(0, second);
    assert_eq!(clock.remembered(0), 0);
}

proptest::proptest! {
    /// Sweeping is exact below `REMEMBERED_FLOWS`: the clock hands out the tags a clock
    /// that remembers every flow would, whatever arrives, is served or leaves.
    #[test]
    fn sweeping_the_fair_clock_changes_no_tag(
        ops in proptest::collection::vec((0..3u8, 0..300u64, 0..4u8), 1..2000),
    ) {
        let mut clock = FairClock::default();
        // The reference: every flow's finish kept, the same formulas.
        let mut virtual_time = 0u64;
        let mut finish: std::collections::HashMap<u64, u64> = Default::default();
        let mut waiting: Vec<u64> = Vec::new();
        for (kind, flow, pick) in ops {
            if kind == 0 || waiting.is_empty() {
                let tag = clock.arrive(Class { band: 0, flow });
                let reference = finish.get(&flow).copied().unwrap_or(0).max(virtual_time);
                finish.insert(flow, reference + 1);
                proptest::prop_assert_eq!(tag, reference);
                waiting.push(tag);
            } else {
                let at = usize::from(pick) % waiting.len();
                let tag = waiting.swap_remove(at);
                if kind == 1 {
                    clock.served(0, tag);
                    virtual_time = virtual_time.max(tag);
                } else {
                    clock.gone(0);
                }
                if waiting.is_empty() {
                    virtual_time = finish.values().copied().max().unwrap_or(0).max(virtual_time);
                    finish.clear();
                }
            }
        }
    }
}
