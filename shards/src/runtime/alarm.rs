//! Deadlines of waiting requests on one shard, served by a single timer.
//!
//! A request queued for a slot, or a client slow to send its head, needs a deadline. monoio's
//! own `Sleep` is 640 bytes with 128-byte alignment, and living inside a connection's future it
//! would be paid by every connection, waiting or not. Here a deadline costs one ordered-map
//! entry while armed and a few words in the future: every alarm on the shard sits in one map, and
//! one task sleeps until the earliest, wakes whatever is due and sleeps again.
//!
//! The bookkeeping is sans-IO ([`Alarms::expire`] takes the time); only [`run_timer`] touches
//! the clock and monoio's timer.

use monoio::time::Instant;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::runtime::race::{race, Either};

/// One shard's armed deadlines.
#[derive(Default)]
pub struct Alarms {
    inner: RefCell<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Armed alarms by (deadline, arming order).
    armed: BTreeMap<(Instant, u64), Waker>,
    next_id: u64,
    /// The deadline the timer task sleeps towards, if it sleeps towards one.
    timer_until: Option<Instant>,
    /// The timer task, woken when an alarm earlier than `timer_until` is armed.
    timer: Option<Waker>,
}

/// An armed alarm's key in [`Alarms`].
type Key = (Instant, u64);

impl Alarms {
    /// A future that completes at `deadline` (at once when it is past).
    pub fn at(&self, deadline: Instant) -> Alarm<'_> {
        Alarm {
            alarms: self,
            deadline,
            key: None,
        }
    }

    /// Arms an alarm, or refreshes the waker of one already armed. `None` when it is no longer
    /// armed, which means it fired.
    fn arm(&self, key: Option<Key>, deadline: Instant, waker: &Waker) -> Option<Key> {
        let mut inner = self.inner.borrow_mut();
        if let Some(key) = key {
            let slot = inner.armed.get_mut(&key)?;
            if !slot.will_wake(waker) {
                slot.clone_from(waker);
            }
            return Some(key);
        }
        let key = (deadline, inner.next_id);
        inner.next_id += 1;
        inner.armed.insert(key, waker.clone());
        if inner.timer_until.is_none_or(|until| deadline < until) {
            if let Some(timer) = inner.timer.take() {
                timer.wake();
            }
        }
        Some(key)
    }

    fn disarm(&self, key: Key) {
        self.inner.borrow_mut().armed.remove(&key);
    }

    /// Fires every alarm due at `now`; returns how many fired.
    pub fn expire(&self, now: Instant) -> usize {
        let due = {
            let mut inner = self.inner.borrow_mut();
            let later = inner.armed.split_off(&(now, u64::MAX));
            std::mem::replace(&mut inner.armed, later)
        };
        let fired = due.len();
        // Woken outside the borrow: a waker may run code that arms another alarm.
        for waker in due.into_values() {
            waker.wake();
        }
        fired
    }

    /// The earliest armed deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.inner
            .borrow()
            .armed
            .first_key_value()
            .map(|(key, _)| key.0)
    }

    /// How many alarms are armed.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.borrow().armed.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records what the timer task sleeps towards and how to wake it for an earlier deadline.
    /// True when an alarm earlier than `until` is armed already (the timer must not sleep).
    fn park_timer(&self, until: Option<Instant>, waker: &Waker) -> bool {
        let mut inner = self.inner.borrow_mut();
        let earliest = inner.armed.first_key_value().map(|(key, _)| key.0);
        if earliest != until {
            return true;
        }
        inner.timer_until = until;
        inner.timer = Some(waker.clone());
        false
    }
}

/// Completes at its deadline. Dropped earlier, it disarms itself.
pub struct Alarm<'a> {
    alarms: &'a Alarms,
    deadline: Instant,
    key: Option<Key>,
}

impl Future for Alarm<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let was_armed = self.key.is_some();
        if Instant::now() >= self.deadline {
            if let Some(key) = self.key.take() {
                self.alarms.disarm(key);
            }
            return Poll::Ready(());
        }
        let key = self.alarms.arm(self.key, self.deadline, cx.waker());
        self.key = key;
        if was_armed && key.is_none() {
            // The timer fired it.
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Alarm<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.alarms.disarm(key);
        }
    }
}

/// The shard's timer: sleeps until the earliest armed deadline, fires what is due, repeats.
/// Runs for the shard's life.
pub async fn run_timer(alarms: &Alarms) {
    loop {
        let until = alarms.next_deadline();
        // Woken early when an earlier alarm is armed; a fresh look at the map follows either way.
        let rearm = poll_fn(|cx| {
            if alarms.park_timer(until, cx.waker()) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        match until {
            Some(deadline) => {
                let sleep = monoio::time::sleep_until(deadline);
                if let Either::Left(()) = race(sleep, rearm).await {
                    alarms.expire(Instant::now());
                }
            }
            None => rearm.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;
    use crate::runtime::wakes::counter;

    fn poll(alarm: &mut Alarm<'_>, waker: &Waker) -> Poll<()> {
        Pin::new(alarm).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn an_alarm_fires_when_the_timer_expires_its_deadline_and_not_before() {
        let alarms = Alarms::default();
        let start = Instant::now();
        let deadline = start + Duration::from_secs(3600);
        let mut alarm = alarms.at(deadline);
        let (woken, waker) = counter();
        assert!(poll(&mut alarm, &waker).is_pending());
        assert_eq!(alarms.next_deadline(), Some(deadline));

        assert_eq!(alarms.expire(deadline - Duration::from_millis(1)), 0);
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        assert!(poll(&mut alarm, &waker).is_pending(), "not due yet");

        assert_eq!(alarms.expire(deadline), 1);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(poll(&mut alarm, &waker).is_ready());
        assert!(alarms.is_empty());
    }

    #[test]
    fn expiring_fires_every_due_alarm_in_deadline_order_and_keeps_the_rest() {
        let alarms = Alarms::default();
        let base = Instant::now() + Duration::from_secs(3600);
        let (woken, waker) = counter();
        let mut all: Vec<Alarm<'_>> = [30, 10, 20, 10, 40]
            .iter()
            .map(|ms| alarms.at(base + Duration::from_millis(*ms)))
            .collect();
        for alarm in &mut all {
            assert!(poll(alarm, &waker).is_pending());
        }
        assert_eq!(
            alarms.next_deadline(),
            Some(base + Duration::from_millis(10))
        );
        assert_eq!(alarms.expire(base + Duration::from_millis(20)), 3);
        assert_eq!(woken.0.load(Ordering::SeqCst), 3);
        assert_eq!(
            alarms.next_deadline(),
            Some(base + Duration::from_millis(30))
        );
        let fired: Vec<bool> = all
            .iter_mut()
            .map(|alarm| poll(alarm, &waker).is_ready())
            .collect();
        assert_eq!(fired, [false, true, true, true, false]);
        assert_eq!(alarms.len(), 2);
    }

    #[test]
    fn a_dropped_alarm_disarms_itself() {
        let alarms = Alarms::default();
        let (woken, waker) = counter();
        let deadline = Instant::now() + Duration::from_secs(3600);
        {
            let mut alarm = alarms.at(deadline);
            assert!(poll(&mut alarm, &waker).is_pending());
            assert_eq!(alarms.len(), 1);
        }
        assert!(alarms.is_empty());
        assert_eq!(alarms.expire(deadline), 0);
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_past_deadline_completes_without_arming() {
        let alarms = Alarms::default();
        let (_woken, waker) = counter();
        let mut alarm = alarms.at(Instant::now() - Duration::from_millis(1));
        assert!(poll(&mut alarm, &waker).is_ready());
        assert!(alarms.is_empty());
    }

    #[test]
    fn an_earlier_alarm_wakes_the_sleeping_timer_and_a_later_one_does_not() {
        let alarms = Alarms::default();
        let base = Instant::now() + Duration::from_secs(3600);
        let (_w, waker) = counter();
        let mut first = alarms.at(base + Duration::from_secs(10));
        assert!(poll(&mut first, &waker).is_pending());

        let (timer_woken, timer) = counter();
        assert!(!alarms.park_timer(alarms.next_deadline(), &timer));
        let mut later = alarms.at(base + Duration::from_secs(20));
        assert!(poll(&mut later, &waker).is_pending());
        assert_eq!(
            timer_woken.0.load(Ordering::SeqCst),
            0,
            "later: keep sleeping"
        );

        let mut earlier = alarms.at(base + Duration::from_secs(5));
        assert!(poll(&mut earlier, &waker).is_pending());
        assert_eq!(timer_woken.0.load(Ordering::SeqCst), 1, "earlier: re-arm");
        // Parked against a stale deadline, the timer is told to look again instead of sleeping.
        assert!(alarms.park_timer(Some(base + Duration::from_secs(10)), &timer));
    }

    #[test]
    fn the_timer_task_fires_alarms_on_a_real_runtime() {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .enable_timer()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let alarms = std::rc::Rc::new(Alarms::default());
            let timer = alarms.clone();
            monoio::spawn(async move { run_timer(&timer).await });
            let start = Instant::now();
            // Armed after the timer parked with nothing to do: it must wake and re-arm.
            monoio::time::sleep(Duration::from_millis(5)).await;
            let late = alarms.at(start + Duration::from_millis(60));
            let early = alarms.at(start + Duration::from_millis(30));
            let early_done = async {
                early.await;
                start.elapsed()
            };
            let (early_at, ()) = futures_join(early_done, late).await;
            assert!(early_at >= Duration::from_millis(30), "{early_at:?}");
            assert!(start.elapsed() >= Duration::from_millis(60));
            assert!(alarms.is_empty());
        });
    }

    /// Polls two futures to completion on the current task.
    async fn futures_join<A: Future, B: Future>(a: A, b: B) -> (A::Output, B::Output) {
        let mut a = std::pin::pin!(a);
        let mut b = std::pin::pin!(b);
        let mut out_a = None;
        let mut out_b = None;
        poll_fn(|cx| {
            if out_a.is_none() {
                if let Poll::Ready(value) = a.as_mut().poll(cx) {
                    out_a = Some(value);
                }
            }
            if out_b.is_none() {
                if let Poll::Ready(value) = b.as_mut().poll(cx) {
                    out_b = Some(value);
                }
            }
            if out_a.is_some() && out_b.is_some() {
                Poll::Ready((out_a.take().unwrap(), out_b.take().unwrap()))
            } else {
                Poll::Pending
            }
        })
        .await
    }
}
