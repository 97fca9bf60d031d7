//! Shard-local signals: a set-once event that wakes every waiter (drain, stop accepting), a
//! repeatable notification, and a way for a task to let the tasks already woken go first.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// Set once; every `wait` before or after completes. Single-threaded by design (a shard).
#[derive(Debug, Default)]
pub struct LocalEvent {
    set: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl LocalEvent {
    pub fn set(&self) {
        if !self.set.replace(true) {
            for waker in self.waiters.borrow_mut().drain(..) {
                waker.wake();
            }
        }
    }

    pub fn is_set(&self) -> bool {
        self.set.get()
    }

    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.set.get() {
                return Poll::Ready(());
            }
            let mut waiters = self.waiters.borrow_mut();
            if !waiters.iter().any(|waker| waker.will_wake(cx.waker())) {
                waiters.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
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
