//! Giving memory back to the system. Connections that go idle give back their buffers (an
//! HTTP/2 connection's frame buffers, `http2::server`), but glibc's `free` keeps the pages of
//! a chunk freed in the middle of the heap: the process's resident memory would not shrink
//! until new allocations reused them. So a shard that freed such buffers asks for a trim, and
//! its periodic sweep makes it (`malloc_trim`, which returns every whole free page of every
//! arena), at most once per sweep and never on the request path.

use std::cell::Cell;

thread_local! {
    /// Buffers were given back on this shard since its last trim.
    static RELEASED: Cell<bool> = const { Cell::new(false) };
}

/// Notes that this shard freed memory worth returning to the system.
pub fn released() {
    RELEASED.with(|released| released.set(true));
}

/// Returns the free pages to the system if this shard freed buffers since the last call.
/// True when it trimmed.
pub fn trim_if_released() -> bool {
    if !RELEASED.with(|released| released.replace(false)) {
        return false;
    }
    trim();
    true
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // one libc call that takes no pointer, see below
fn trim() {
    // SAFETY: malloc_trim takes no pointer and is thread-safe (it locks each arena in turn).
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_follows_a_release_once() {
        assert!(!trim_if_released());
        released();
        released();
        assert!(trim_if_released());
        assert!(!trim_if_released());
    }
}
