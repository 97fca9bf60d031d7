//! A shard-local, set-once event that wakes every waiter (drain, stop accepting).

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
