//! A waker that counts its wake-ups, for the tests of the shard's timers (`alarm`, `late`),
//! which poll by hand with simulated time.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::{Wake, Waker};

/// How many times the waker from [`counter`] was woken (`.0`).
pub(crate) struct Count(pub(crate) AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A waker and the count of its wake-ups.
pub(crate) fn counter() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count(AtomicUsize::new(0)));
    (count.clone(), Waker::from(count))
}
