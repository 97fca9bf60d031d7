//! Which exchanges have been under way for a while: a coarse timer that costs a fast exchange
//! almost nothing.
//!
//! Two things in an HTTP/1 exchange wait on time: the read-ahead on the client starts
//! [`LATE_AFTER`] into the exchange (most responses come sooner, and a read started and
//! cancelled per request is costly), and the first response byte has a deadline. Each used to
//! arm a monoio `Sleep` per request (about 300 instructions to arm, poll and drop, 640 bytes with
//! 128-byte alignment inside every exchange's state). Here an exchange takes a [`Ticket`]: a slot
//! and a place at the back of one queue, in the order exchanges started, which is the order they
//! become late. One task per shard sleeps until the front of the queue is due and wakes every
//! ticket that is; a ticket dropped before that only frees its slot (its place in the queue is
//! skipped when reached). An exchange that finishes within [`LATE_AFTER`] never touches a timer;
//! one that does not becomes late and arms its precise deadline then (see `http1::exchange`).
//!
//! The bookkeeping is sans-IO ([`Lateness::expire`] takes the time); only [`run_sweeper`] touches
//! the clock and monoio's timer.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use monoio::time::Instant;

/// How long into an exchange its ticket becomes late: when the client connection starts being
/// read ahead (for a pipelined request or a FIN), and when the first-byte deadline is armed.
pub const LATE_AFTER: Duration = Duration::from_millis(5);

/// One shard's tickets.
#[derive(Default)]
pub struct Lateness {
    inner: RefCell<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Places in start order: (when it becomes late, slot, the slot's generation then).
    queue: VecDeque<(Instant, usize, u32)>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// The sweeper, parked while the queue is empty.
    sweeper: Option<Waker>,
}

#[derive(Default)]
struct Slot {
    /// Bumped when the slot is given back, so a place left in the queue no longer matches.
    generation: u32,
    late: bool,
    waker: Option<Waker>,
}

impl Lateness {
    /// A ticket for an exchange starting `now`; it becomes late at `now + LATE_AFTER`.
    /// `C`: the client's stream, only a name: one copy per kind of client connection, so the
    /// plain path's keeps a single caller (`http1::rewrite::H1Headers`).
    #[allow(clippy::extra_unused_type_parameters)] // a name per kind of client connection
    pub fn enter<C>(&self, now: Instant) -> Ticket<'_> {
        let due = now + LATE_AFTER;
        let mut inner = self.inner.borrow_mut();
        let slot = match inner.free.pop() {
            Some(slot) => slot,
            None => {
                inner.slots.push(Slot::default());
                inner.slots.len() - 1
            }
        };
        let generation = inner.slots[slot].generation;
        if inner.queue.is_empty() {
            if let Some(sweeper) = inner.sweeper.take() {
                sweeper.wake();
            }
        }
        inner.queue.push_back((due, slot, generation));
        Ticket {
            set: self,
            slot,
            due,
        }
    }

    /// Marks every ticket due at `now` late and wakes it; returns how many became late.
    pub fn expire(&self, now: Instant) -> usize {
        let mut woken = Vec::new();
        {
            let mut inner = self.inner.borrow_mut();
            while let Some(&(due, slot, generation)) = inner.queue.front() {
                if due > now {
                    break;
                }
                inner.queue.pop_front();
                let entry = &mut inner.slots[slot];
                if entry.generation == generation {
                    entry.late = true;
                    woken.extend(entry.waker.take());
                }
            }
        }
        // Woken outside the borrow: a waker may run code that takes another ticket.
        let count = woken.len();
        for waker in woken {
            waker.wake();
        }
        count
    }

    /// When the next live ticket becomes late; places of tickets already given back are dropped
    /// from the front on the way.
    pub fn next_due(&self) -> Option<Instant> {
        let mut inner = self.inner.borrow_mut();
        inner.drop_released_front();
        inner.queue.front().map(|&(due, _, _)| due)
    }

    /// Parks the sweeper until a ticket is taken; false when one is queued already.
    fn park(&self, waker: &Waker) -> bool {
        let mut inner = self.inner.borrow_mut();
        if !inner.queue.is_empty() {
            return false;
        }
        inner.sweeper = Some(waker.clone());
        true
    }

    fn release(&self, slot: usize) {
        let mut inner = self.inner.borrow_mut();
        let entry = &mut inner.slots[slot];
        entry.generation = entry.generation.wrapping_add(1);
        entry.late = false;
        entry.waker = None;
        inner.free.push(slot);
        // The places of released tickets at the front go now, so the queue of a shard whose
        // exchanges all finish early stays short without the sweeper waking for them.
        inner.drop_released_front();
    }

    #[cfg(test)]
    fn queued(&self) -> usize {
        self.inner.borrow().queue.len()
    }
}

impl Inner {
    /// Drops the places at the front of the queue whose tickets were given back.
    fn drop_released_front(&mut self) {
        while let Some(&(_, slot, generation)) = self.queue.front() {
            if self.slots[slot].generation == generation {
                break;
            }
            self.queue.pop_front();
        }
    }
}

/// One exchange's place; see [`Lateness::enter`]. Dropped, it gives the place back.
pub struct Ticket<'a> {
    set: &'a Lateness,
    slot: usize,
    due: Instant,
}

impl Ticket<'_> {
    /// When it becomes late.
    pub fn due(&self) -> Instant {
        self.due
    }

    /// Completes once the ticket is late (at once if it is already).
    pub fn late(&self) -> impl Future<Output = ()> + '_ {
        poll_fn(move |cx| self.poll_late(cx))
    }

    fn poll_late(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut inner = self.set.inner.borrow_mut();
        let entry = &mut inner.slots[self.slot];
        if entry.late {
            return Poll::Ready(());
        }
        match &mut entry.waker {
            Some(known) if known.will_wake(cx.waker()) => {}
            waker => *waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.set.release(self.slot);
    }
}

/// The shard's sweeper: sleeps until the front ticket is due, marks what is due late, repeats;
/// parked while no ticket is out. Runs for the shard's life.
pub async fn run_sweeper(set: &Lateness) {
    loop {
        match set.next_due() {
            Some(due) => {
                monoio::time::sleep_until(due).await;
                set.expire(Instant::now());
            }
            None => {
                poll_fn(|cx| {
                    if set.park(cx.waker()) {
                        Poll::Pending
                    } else {
                        Poll::Ready(())
                    }
                })
                .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::runtime::wakes::counter;

    fn poll_late(ticket: &Ticket<'_>, waker: &Waker) -> Poll<()> {
        ticket.poll_late(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_ticket_becomes_late_at_its_due_time_and_not_before() {
        let set = Lateness::default();
        let start = Instant::now();
        let ticket = set.enter::<()>(start);
        let (woken, waker) = counter();
        assert_eq!(poll_late(&ticket, &waker), Poll::Pending);
        assert_eq!(set.next_due(), Some(start + LATE_AFTER));
        assert_eq!(set.expire(start + LATE_AFTER - Duration::from_micros(1)), 0);
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        assert_eq!(set.expire(start + LATE_AFTER), 1);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll_late(&ticket, &waker), Poll::Ready(()));
        assert_eq!(set.next_due(), None);
    }

    #[test]
    fn tickets_become_late_in_the_order_they_were_taken() {
        let set = Lateness::default();
        let start = Instant::now();
        let first = set.enter::<()>(start);
        let second = set.enter::<()>(start + Duration::from_millis(2));
        let (_, waker) = counter();
        assert_eq!(poll_late(&first, &waker), Poll::Pending);
        assert_eq!(poll_late(&second, &waker), Poll::Pending);
        assert_eq!(set.expire(start + LATE_AFTER), 1);
        assert_eq!(poll_late(&first, &waker), Poll::Ready(()));
        assert_eq!(poll_late(&second, &waker), Poll::Pending);
        assert_eq!(
            set.next_due(),
            Some(start + Duration::from_millis(2) + LATE_AFTER)
        );
    }

    #[test]
    fn a_ticket_given_back_early_is_never_woken_and_its_slot_is_not_confused_with_the_next() {
        let set = Lateness::default();
        let start = Instant::now();
        let (woken, waker) = counter();
        let early = set.enter::<()>(start);
        assert_eq!(poll_late(&early, &waker), Poll::Pending);
        let behind = set.enter::<()>(start + Duration::from_millis(1));
        drop(early);
        // The slot is reused by a later ticket; the old place in the queue must not make it
        // late at the old time.
        let reuser = set.enter::<()>(start + Duration::from_millis(3));
        assert_eq!(poll_late(&reuser, &waker), Poll::Pending);
        assert_eq!(
            set.expire(start + LATE_AFTER),
            0,
            "only the dropped one was due"
        );
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        assert_eq!(poll_late(&reuser, &waker), Poll::Pending);
        drop(behind);
        assert_eq!(
            set.next_due(),
            Some(start + Duration::from_millis(3) + LATE_AFTER)
        );
    }

    #[test]
    fn the_queue_of_exchanges_that_finish_early_stays_short() {
        let set = Lateness::default();
        let start = Instant::now();
        for step in 0..10_000u64 {
            let ticket = set.enter::<()>(start + Duration::from_micros(step));
            drop(ticket);
        }
        assert_eq!(set.queued(), 0);
        assert_eq!(set.next_due(), None);
    }
}
