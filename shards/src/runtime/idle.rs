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
//! An HTTP/2 connection with no stream open is idle too, and registers with
//! [`IdleConnections::enter_waking`]: told to close, it is woken, and sends GOAWAY (naming the
//! last stream it took, so its client knows what to send again elsewhere) before it closes.
//!
//! A connection registers with [`IdleConnections::enter`] and then reads as usual. Told to
//! close, its socket's read side is shut down (`shutdown(SHUT_RD)`): the read in flight then
//! completes with whatever had arrived (a request that crossed the decision is served, and the
//! connection closes after it), or with end of file when nothing had. So an idle read is a plain
//! read: no cancellation to arm per request (monoio's cancel handles keep a hashed set per
//! operation, which cost about 600 instructions a request), and no second future to poll beside
//! it. Entries live in a slab, so going idle and waking up cost a slot taken and given back,
//! whatever their number; only an eviction scans it (for the smallest sequence number: the
//! longest idle).

use std::cell::{Cell, RefCell};
use std::os::fd::RawFd;
use std::task::Waker;

#[derive(Debug, Default)]
pub struct IdleConnections {
    entries: RefCell<Vec<Entry>>,
    free: RefCell<Vec<usize>>,
    /// Sequence number of the next connection to go idle: smaller means idle longer.
    next: Cell<u64>,
    /// Set by `close_all`: every idle connection, present and future, is told to close.
    closing: Cell<bool>,
    /// Idle and not told to close.
    waiting: Cell<usize>,
}

#[derive(Debug, Default)]
struct Entry {
    /// In use by an [`Idle`].
    taken: bool,
    /// Told to close; no longer a candidate for eviction.
    told: bool,
    sequence: u64,
    /// How it is told to close.
    how: Tell,
}

/// How an idle connection is told to close.
#[derive(Debug, Default)]
enum Tell {
    /// Its socket, open for as long as its [`Idle`] lives: the read side is shut down.
    Shutdown(RawFd),
    /// Its task, which closes the connection itself.
    Wake(Waker),
    /// Told already (or a free slot).
    #[default]
    Done,
}

impl IdleConnections {
    /// Registers the connection on socket `fd` as idle until the returned guard is dropped.
    /// After the drain has ended (`close_all`) it is told to close at once.
    ///
    /// The caller keeps `fd` open for as long as the guard lives: telling it to close shuts the
    /// socket down.
    pub fn enter(&self, fd: RawFd) -> Idle<'_> {
        self.enter_as(Tell::Shutdown(fd))
    }

    /// Registers a connection that closes itself when told: told to close, `waker` is woken and
    /// [`Idle::told`] says so. Refresh the waker with [`Idle::wake_with`] if the task's changes.
    pub fn enter_waking(&self, waker: &Waker) -> Idle<'_> {
        self.enter_as(Tell::Wake(waker.clone()))
    }

    fn enter_as(&self, how: Tell) -> Idle<'_> {
        let slot = self.register(how);
        if self.closing.get() {
            self.tell(slot);
        }
        Idle { set: self, slot }
    }

    /// Connections idle that have not been told to close.
    pub fn len(&self) -> usize {
        self.waiting.get()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tells the connection idle the longest to close. False when none is idle.
    pub fn evict_oldest(&self) -> bool {
        let oldest = self
            .entries
            .borrow()
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.taken && !entry.told)
            .min_by_key(|(_, entry)| entry.sequence)
            .map(|(slot, _)| slot);
        match oldest {
            Some(slot) => {
                self.tell(slot);
                true
            }
            None => false,
        }
    }

    /// Tells every idle connection to close, and every one that goes idle from now on.
    pub fn close_all(&self) {
        self.closing.set(true);
        let idle: Vec<usize> = self
            .entries
            .borrow()
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.taken && !entry.told)
            .map(|(slot, _)| slot)
            .collect();
        for slot in idle {
            self.tell(slot);
        }
    }

    fn register(&self, how: Tell) -> usize {
        let sequence = self.next.get();
        self.next.set(sequence + 1);
        self.waiting.set(self.waiting.get() + 1);
        let entry = Entry {
            taken: true,
            told: false,
            sequence,
            how,
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

    /// Marks `slot` told, and shuts its socket's read side down (which ends the read in flight)
    /// or wakes its task.
    #[allow(unsafe_code)] // one system call on a descriptor the caller keeps open, see below
    fn tell(&self, slot: usize) {
        let how = {
            let mut entries = self.entries.borrow_mut();
            let entry = &mut entries[slot];
            entry.told = true;
            std::mem::take(&mut entry.how)
        };
        self.waiting.set(self.waiting.get() - 1);
        match how {
            // SAFETY: a plain system call on a descriptor the connection holds open while its
            // `Idle` lives (`enter`'s contract). It fails harmlessly (ENOTCONN) when the peer is
            // already gone.
            Tell::Shutdown(fd) => unsafe {
                libc::shutdown(fd, libc::SHUT_RD);
            },
            Tell::Wake(waker) => waker.wake(),
            Tell::Done => {}
        }
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

/// One idle connection's place in the set; see [`IdleConnections::enter`]. Dropped when the
/// connection's read completes.
pub struct Idle<'a> {
    set: &'a IdleConnections,
    slot: usize,
}

impl Idle<'_> {
    /// Whether this connection was told to close (its read side is shut down, or its waker
    /// woken).
    pub fn told(&self) -> bool {
        self.set.entries.borrow()[self.slot].told
    }

    /// Replaces the waker of a connection registered with `enter_waking`, if it would not wake
    /// the same task.
    pub fn wake_with(&self, waker: &Waker) {
        let mut entries = self.set.entries.borrow_mut();
        if let Tell::Wake(old) = &mut entries[self.slot].how {
            if !old.will_wake(waker) {
                old.clone_from(waker);
            }
        }
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        self.set.release(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// A connected pair: the idle connection's socket and its client's.
    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().expect("a socket pair")
    }

    /// Whether a read on `socket` now ends at once with end of file (its read side shut down and
    /// nothing buffered), rather than finding nothing to read yet.
    fn reads_end_of_file(socket: &mut UnixStream) -> bool {
        socket.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        matches!(socket.read(&mut byte), Ok(0))
    }

    #[test]
    fn the_longest_idle_connection_is_shut_first_and_only_once() {
        let idle = IdleConnections::default();
        let (mut a, _client_a) = pair();
        let (mut b, _client_b) = pair();
        let (mut c, _client_c) = pair();
        let first = idle.enter(a.as_raw_fd());
        let second = idle.enter(b.as_raw_fd());
        let third = idle.enter(c.as_raw_fd());
        assert_eq!(idle.len(), 3);
        assert!(idle.evict_oldest());
        assert!(first.told() && reads_end_of_file(&mut a));
        assert!(!second.told() && !reads_end_of_file(&mut b));
        assert!(idle.evict_oldest());
        assert!(second.told() && reads_end_of_file(&mut b));
        assert!(!third.told() && !reads_end_of_file(&mut c));
        assert_eq!(idle.len(), 1);
    }

    #[test]
    fn a_request_that_crossed_the_eviction_is_still_read() {
        let idle = IdleConnections::default();
        let (mut server, mut client) = pair();
        let waiting = idle.enter(server.as_raw_fd());
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert!(idle.evict_oldest());
        assert!(waiting.told());
        let mut request = Vec::new();
        server.set_nonblocking(true).unwrap();
        let mut chunk = [0u8; 64];
        loop {
            match server.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => request.extend_from_slice(&chunk[..n]),
                Err(error) => panic!("the read should end, not {error}"),
            }
        }
        assert_eq!(request, b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn a_connection_that_got_a_request_leaves_the_set_and_is_not_evicted() {
        let idle = IdleConnections::default();
        let (mut busy_socket, _busy_client) = pair();
        drop(idle.enter(busy_socket.as_raw_fd()));
        assert!(idle.is_empty());
        assert!(!idle.evict_oldest());
        assert!(!reads_end_of_file(&mut busy_socket));
        // The slot is reused, in sequence order after the one that left.
        let (mut later_socket, _later_client) = pair();
        let later = idle.enter(later_socket.as_raw_fd());
        assert!(idle.evict_oldest());
        assert!(later.told() && reads_end_of_file(&mut later_socket));
    }

    #[test]
    fn close_all_shuts_every_idle_connection_and_every_later_one() {
        let idle = IdleConnections::default();
        let (mut waiting_socket, _waiting_client) = pair();
        let waiting = idle.enter(waiting_socket.as_raw_fd());
        idle.close_all();
        assert!(idle.is_empty());
        assert!(waiting.told() && reads_end_of_file(&mut waiting_socket));
        let (mut late_socket, _late_client) = pair();
        let late = idle.enter(late_socket.as_raw_fd());
        assert!(late.told() && reads_end_of_file(&mut late_socket));
        assert!(!idle.evict_oldest());
    }

    #[test]
    fn a_connection_that_closes_itself_is_woken_once_in_its_turn_by_idle_time() {
        use std::sync::atomic::Ordering;
        let idle = IdleConnections::default();
        let (mut socket, _client) = pair();
        let (wakes, waker) = crate::runtime::wakes::counter();
        let http1 = idle.enter(socket.as_raw_fd());
        let http2 = idle.enter_waking(&waker);
        assert!(idle.evict_oldest());
        assert!(http1.told() && reads_end_of_file(&mut socket));
        assert!(!http2.told());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        assert!(idle.evict_oldest());
        assert!(http2.told());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        idle.close_all();
        assert!(!idle.evict_oldest());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "told once");
        // After the drain's end, one that goes idle is told at once.
        let (later_wakes, later_waker) = crate::runtime::wakes::counter();
        let later = idle.enter_waking(&later_waker);
        assert!(later.told());
        assert_eq!(later_wakes.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_refreshed_waker_is_the_one_woken() {
        use std::sync::atomic::Ordering;
        let idle = IdleConnections::default();
        let (first_wakes, first) = crate::runtime::wakes::counter();
        let (second_wakes, second) = crate::runtime::wakes::counter();
        let waiting = idle.enter_waking(&first);
        waiting.wake_with(&second);
        assert!(idle.evict_oldest());
        assert_eq!(first_wakes.0.load(Ordering::SeqCst), 0);
        assert_eq!(second_wakes.0.load(Ordering::SeqCst), 1);
    }
}
