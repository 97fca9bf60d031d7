//! A shard's idle keep-alive connections: those between two requests, waiting for the next.
//!
//! Two things close them, and nothing else does (upstream's server keeps them open without a
//! timer, and so do we):
//! * **the connection cap**: when a shard is at `max_connections` and a new client waits, the
//!   connection idle the longest gives way ([`IdleConnections::evict_oldest`]), as nginx frees
//!   idle keep-alive connections when it runs out;
//! * **the end of a drain**: once every listener is closed ([`IdleConnections::close_all`]). During
//!   the grace period before that they stay open: a client that sends on one is answered (with
//!   `Connection: close`), where closing them at SIGTERM lost the requests that crossed the FIN.
//!
//! A connection waits with [`IdleConnections::wait`] beside its read; when the wait completes it
//! cancels the read, and serves whatever arrived meanwhile before it closes. Entries live in a
//! slab, so going idle and waking up cost a slot taken and given back, whatever their number;
//! only an eviction scans it (for the smallest sequence number: the longest idle).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Default)]
pub struct IdleConnections {
    entries: RefCell<Vec<Entry>>,
    free: RefCell<Vec<usize>>,
    /// Sequence number of the next connection to go idle: smaller means idle longer.
    next: Cell<u64>,
    /// Set by `close_all`: every wait, present and future, completes at once.
    closing: Cell<bool>,
    /// Waiting and not told to close.
    waiting: Cell<usize>,
}

#[derive(Debug, Default)]
struct Entry {
    /// In use by a wait.
    taken: bool,
    /// Told to close; no longer a candidate for eviction.
    told: bool,
    sequence: u64,
    waker: Option<Waker>,
}

impl IdleConnections {
    /// Waits until this connection should close: it is the longest idle at the connection cap,
    /// or the drain has ended. Registers on its first poll; dropped, it unregisters.
    pub fn wait(&self) -> IdleWait<'_> {
        IdleWait {
            set: self,
            slot: None,
        }
    }

    /// Connections waiting that have not been told to close.
    pub fn len(&self) -> usize {
        self.waiting.get()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tells the connection idle the longest to close. False when none is idle.
    pub fn evict_oldest(&self) -> bool {
        let mut entries = self.entries.borrow_mut();
        let oldest = entries
            .iter_mut()
            .filter(|entry| entry.taken && !entry.told)
            .min_by_key(|entry| entry.sequence);
        let Some(entry) = oldest else {
            return false;
        };
        entry.told = true;
        self.waiting.set(self.waiting.get() - 1);
        if let Some(waker) = entry.waker.take() {
            waker.wake();
        }
        true
    }

    /// Tells every idle connection to close, and every one that goes idle from now on.
    pub fn close_all(&self) {
        self.closing.set(true);
        for entry in self.entries.borrow_mut().iter_mut() {
            if entry.taken && !entry.told {
                entry.told = true;
                if let Some(waker) = entry.waker.take() {
                    waker.wake();
                }
            }
        }
        self.waiting.set(0);
    }

    fn register(&self, waker: &Waker) -> usize {
        let sequence = self.next.get();
        self.next.set(sequence + 1);
        self.waiting.set(self.waiting.get() + 1);
        let entry = Entry {
            taken: true,
            told: false,
            sequence,
            waker: Some(waker.clone()),
        };
        let mut entries = self.entries.borrow_mut();
        match self.free.borrow_mut().pop() {
            Some(slot) => {
                entries[slot] = entry;
                slot
            }
            None => {
                entries.push(entry);
                entries.len() - 1
            }
        }
    }

    /// Whether the wait in `slot` was told to close; else its waker is refreshed.
    fn poll_slot(&self, slot: usize, waker: &Waker) -> bool {
        let mut entries = self.entries.borrow_mut();
        let entry = &mut entries[slot];
        if entry.told {
            return true;
        }
        if !entry
            .waker
            .as_ref()
            .is_some_and(|known| known.will_wake(waker))
        {
            entry.waker = Some(waker.clone());
        }
        false
    }

    fn release(&self, slot: usize) {
        let mut entries = self.entries.borrow_mut();
        let entry = std::mem::take(&mut entries[slot]);
        if !entry.told {
            self.waiting.set(self.waiting.get() - 1);
        }
        self.free.borrow_mut().push(slot);
    }
}

/// One idle connection's wait; see [`IdleConnections::wait`].
pub struct IdleWait<'a> {
    set: &'a IdleConnections,
    slot: Option<usize>,
}

impl Future for IdleWait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let set = self.set;
        match self.slot {
            None if set.closing.get() => Poll::Ready(()),
            None => {
                self.slot = Some(set.register(cx.waker()));
                Poll::Pending
            }
            Some(slot) => {
                if set.poll_slot(slot, cx.waker()) {
                    set.release(slot);
                    self.slot = None;
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl Drop for IdleWait<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.set.release(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::Context;

    fn poll(wait: Pin<&mut IdleWait<'_>>) -> Poll<()> {
        let waker = futures_util::task::noop_waker();
        wait.poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn the_longest_idle_connection_is_evicted_first_and_only_once() {
        let idle = IdleConnections::default();
        let mut first = pin!(idle.wait());
        let mut second = pin!(idle.wait());
        let mut third = pin!(idle.wait());
        for wait in [first.as_mut(), second.as_mut(), third.as_mut()] {
            assert_eq!(poll(wait), Poll::Pending);
        }
        assert_eq!(idle.len(), 3);
        assert!(idle.evict_oldest());
        assert_eq!(poll(first.as_mut()), Poll::Ready(()));
        assert_eq!(poll(second.as_mut()), Poll::Pending);
        assert!(idle.evict_oldest());
        assert_eq!(poll(second.as_mut()), Poll::Ready(()));
        assert_eq!(poll(third.as_mut()), Poll::Pending);
        assert_eq!(idle.len(), 1);
    }

    #[test]
    fn a_connection_that_got_a_request_leaves_the_set_and_is_not_evicted() {
        let idle = IdleConnections::default();
        {
            let mut busy = pin!(idle.wait());
            assert_eq!(poll(busy.as_mut()), Poll::Pending);
            // Dropped: its client sent a request.
        }
        assert!(idle.is_empty());
        assert!(!idle.evict_oldest());
        // The slot is reused, in sequence order after the one that left.
        let mut later = pin!(idle.wait());
        assert_eq!(poll(later.as_mut()), Poll::Pending);
        assert!(idle.evict_oldest());
        assert_eq!(poll(later.as_mut()), Poll::Ready(()));
    }

    #[test]
    fn close_all_ends_every_wait_and_every_later_one() {
        let idle = IdleConnections::default();
        let mut waiting = pin!(idle.wait());
        assert_eq!(poll(waiting.as_mut()), Poll::Pending);
        idle.close_all();
        assert!(idle.is_empty());
        assert_eq!(poll(waiting.as_mut()), Poll::Ready(()));
        let mut late = pin!(idle.wait());
        assert_eq!(poll(late.as_mut()), Poll::Ready(()));
        assert!(!idle.evict_oldest());
    }
}
