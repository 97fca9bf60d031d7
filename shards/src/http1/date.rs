//! The `Date` header of locally made responses (RFC 9110 §6.6.1 IMF-fixdate), formatted at most
//! once per second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

use kactivator_h1::date::imf_fixdate;
pub use kactivator_h1::date::LEN;

thread_local! {
    static CACHE: RefCell<(u64, [u8; LEN])> = const { RefCell::new((u64::MAX, [0; LEN])) };
}

/// Today's `Date` value, from a per-thread cache refreshed when the second changes.
pub fn now() -> [u8; LEN] {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.0 != seconds {
            *cache = (seconds, imf_fixdate(seconds));
        }
        cache.1
    })
}
