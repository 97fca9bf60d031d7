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
    /// The connection's socket, open for as long as its [`Idle`] lives.
    fd: RawFd,
}

impl IdleConnections {
    /// Registers the connection on socket `fd` as idle until the returned guard is dropped.
    /// After the drain has ended (`close_all`) it is told to close at once.
    ///
    /// The caller keeps `fd` open for as long as the guard lives: telling it to close shuts the
    /// socket down.
    pub fn enter(&self, fd: RawFd) -> Idle<'_> {
        let slot = self.register(fd);
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

    fn register(&self, fd: RawFd) -> usize {
        let sequence = self.next.get();
        self.next.set(sequence + 1);
        self.waiting.set(self.waiting.get() + 1);
        let entry = Entry {
            taken: true,
            told: false,
            sequence,
            fd,
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

    /// Marks `slot` told and shuts its socket's read side down, which ends the read in flight.
    #[allow(unsafe_code)] // one system call on a descriptor the caller keeps open, see below
    fn tell(&self, slot: usize) {
        let fd = {
            let mut entries = self.entries.borrow_mut();
            let entry = &mut entries[slot];
            entry.told = true;
            entry.fd
        };
        self.waiting.set(self.waiting.get() - 1);
        // SAFETY: a plain system call on a descriptor the connection holds open while its
        // `Idle` lives (`enter`'s contract). It fails harmlessly (ENOTCONN) when the peer is
        // already gone.
        unsafe {
            libc::shutdown(fd, libc::SHUT_RD);
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
    /// Whether this connection was told to close (its read side is shut down).
    pub fn told(&self) -> bool {
        self.set.entries.borrow()[self.slot].told
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
}
