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

    fn arrive_class(&mut self, world: &World, limits: QueueLimits, class: Class) -> Admission<()> {
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
    fn arrive_at_bound(&mut self, world: &World, limits: QueueLimits, band: u8) -> Admission<()> {
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
