//! Shard-local signals: a set-once event that wakes every waiter (drain, stop accepting), a
//! repeatable notification, and a way for a task to let the tasks already woken go first.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// Set once; every `wait` before or after completes. Single-threaded by design (a shard).
///
/// Every idle connection waits on one (a drain closes it), so a wait that ends without the
/// event (the connection got a request, or closed) takes its waker back out: a waker keeps its
/// task's allocation alive, and one left behind per connection was a leak that grew with every
/// connection the shard ever served (found by the chaos soak). The waiters live in a slab, so a
/// wait costs a slot taken and given back, whatever the number of waiters.
#[derive(Debug, Default)]
pub struct LocalEvent {
    set: Cell<bool>,
    waiters: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

impl LocalEvent {
    pub fn set(&self) {
        if !self.set.replace(true) {
            let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
            self.free.borrow_mut().clear();
            for waker in waiters.into_iter().flatten() {
                waker.wake();
            }
        }
    }

    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub fn wait(&self) -> EventWait<'_> {
        EventWait {
            event: self,
            slot: None,
        }
    }

    /// Wakers registered and not yet taken back.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.waiters.borrow().iter().flatten().count()
    }

    fn register(&self, slot: Option<usize>, waker: &Waker) -> usize {
        let mut waiters = self.waiters.borrow_mut();
        if let Some(slot) = slot {
            if let Some(entry) = waiters.get_mut(slot) {
                if !entry.as_ref().is_some_and(|known| known.will_wake(waker)) {
                    *entry = Some(waker.clone());
                }
                return slot;
            }
        }
        match self.free.borrow_mut().pop() {
            Some(slot) => {
                waiters[slot] = Some(waker.clone());
                slot
            }
            None => {
                waiters.push(Some(waker.clone()));
                waiters.len() - 1
            }
        }
    }

    fn unregister(&self, slot: usize) {
        let mut waiters = self.waiters.borrow_mut();
        // After `set` the slab is gone and the slot means nothing.
        if let Some(entry) = waiters.get_mut(slot) {
            if entry.take().is_some() {
                self.free.borrow_mut().push(slot);
            }
        }
    }
}

/// A wait for a [`LocalEvent`]; dropped before the event, it takes its waker back.
pub struct EventWait<'a> {
    event: &'a LocalEvent,
    slot: Option<usize>,
}

impl std::future::Future for EventWait<'_> {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        if self.event.set.get() {
            self.slot = None;
            return Poll::Ready(());
        }
        let slot = self.event.register(self.slot, cx.waker());
        self.slot = Some(slot);
        Poll::Pending
    }
}

impl Drop for EventWait<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            if !self.event.set.get() {
                self.event.unregister(slot);
            }
        }
    }
}

/// Wakes waiters every time it fires (a revision got new pods, for example). Waiters re-check
/// their condition after waking.
#[derive(Debug, Default)]
pub struct LocalNotify {
    waiters: RefCell<Vec<Waker>>,
    generation: Cell<u64>,
}

impl LocalNotify {
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get() + 1);
        for waker in self.waiters.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Completes at the next `notify_all` after this call.
    pub async fn notified(&self) {
        let start = self.generation.get();
        poll_fn(|cx| {
            if self.generation.get() != start {
                return Poll::Ready(());
            }
            self.waiters.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

/// Lets a task step behind every task already woken on this shard.
///
/// monoio runs a task that wakes itself again at once: a plain yield goes to the front of the
/// run queue. A task that has just handed a pod slot to a queued request wants the opposite:
/// that request should reach the pod before this task goes on with its client. `yield_now`
/// parks the caller with a relay task and wakes the relay; the relay is queued behind
/// everything woken so far, and when it runs it wakes the parked tasks, which queue behind
/// those in turn.
#[derive(Debug, Default)]
pub struct BackOfQueue {
    parked: RefCell<Vec<Waker>>,
    relay: RefCell<Option<Waker>>,
}

impl BackOfQueue {
    /// Completes once every task woken before this call has run. Without a running relay it is
    /// a plain yield.
    pub async fn yield_now(&self) {
        let mut parked = false;
        poll_fn(|cx| {
            if parked {
                return Poll::Ready(());
            }
            parked = true;
            match &*self.relay.borrow() {
                Some(relay) => {
                    self.parked.borrow_mut().push(cx.waker().clone());
                    relay.wake_by_ref();
                }
                None => cx.waker().wake_by_ref(),
            }
            Poll::Pending
        })
        .await
    }

    /// The relay; runs for the shard's lifetime.
    pub async fn run_relay(&self) {
        let mut ready = Vec::new();
        poll_fn(|cx| {
            std::mem::swap(&mut ready, &mut *self.parked.borrow_mut());
            for waker in ready.drain(..) {
                waker.wake();
            }
            let mut relay = self.relay.borrow_mut();
            if !relay
                .as_ref()
                .is_some_and(|relay| relay.will_wake(cx.waker()))
            {
                *relay = Some(cx.waker().clone());
            }
            Poll::<()>::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn a_wait_that_ends_without_the_event_leaves_no_waker_behind() {
        use std::future::Future;
        let event = LocalEvent::default();
        let waker = Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        // A million connections that each waited and went away: the slab stays one slot.
        for _ in 0..1_000_000 {
            let mut wait = std::pin::pin!(event.wait());
            assert!(wait.as_mut().poll(&mut cx).is_pending());
            assert!(wait.as_mut().poll(&mut cx).is_pending(), "polled again");
            assert_eq!(event.waiting(), 1);
        }
        assert_eq!(event.waiting(), 0);
        assert_eq!(event.waiters.borrow().len(), 1);
        // Waits still pending when the event is set complete.
        let mut first = Box::pin(event.wait());
        let mut second = Box::pin(event.wait());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        event.set();
        assert!(first.as_mut().poll(&mut cx).is_ready());
        drop(second);
        assert!(event.wait().completes_at_once());
    }

    trait ReadyNow {
        fn completes_at_once(self) -> bool;
    }

    impl<F: std::future::Future> ReadyNow for F {
        fn completes_at_once(self) -> bool {
            let mut future = std::pin::pin!(self);
            let mut cx = std::task::Context::from_waker(Waker::noop());
            future.as_mut().poll(&mut cx).is_ready()
        }
    }

    /// Runs `steps` on one monoio thread and returns the order in which they logged.
    fn order_of(with_relay: bool) -> Vec<&'static str> {
        let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let back = Rc::new(BackOfQueue::default());
            let log = Rc::new(RefCell::new(Vec::new()));
            if with_relay {
                let relay = back.clone();
                monoio::spawn(async move { relay.run_relay().await });
                // Let the relay register itself.
                monoio::spawn(async {}).await;
            }
            // The "waiter": parked until the "releaser" wakes it.
            let go = Rc::new(LocalEvent::default());
            let waiter = {
                let (go, log) = (go.clone(), log.clone());
                monoio::spawn(async move {
                    go.wait().await;
                    log.borrow_mut().push("waiter runs");
                })
            };
            let releaser = {
                let (back, log) = (back.clone(), log.clone());
                monoio::spawn(async move {
                    // Let the waiter park first.
                    monoio::spawn(async {}).await;
                    go.set();
                    back.yield_now().await;
                    log.borrow_mut().push("releaser goes on");
                })
            };
            releaser.await;
            waiter.await;
            Rc::try_unwrap(log).unwrap().into_inner()
        })
    }

    #[test]
    fn a_task_that_steps_back_runs_after_the_task_it_woke() {
        assert_eq!(order_of(true), ["waiter runs", "releaser goes on"]);
    }

    #[test]
    fn without_a_relay_stepping_back_is_a_plain_yield_and_never_hangs() {
        // monoio polls a task that woke itself again first: the releaser goes on before the
        // waiter. The point is that it goes on at all.
        assert_eq!(order_of(false), ["releaser goes on", "waiter runs"]);
    }
}
