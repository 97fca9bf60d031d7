//! A growable read buffer with a consumed-prefix cursor, filled by monoio's owned-buffer reads.

use std::io;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, CancelHandle, CancelableAsyncReadRent};

/// Bytes read from a socket and not yet consumed. Reads append into spare capacity; consuming
/// advances a cursor; the buffer compacts itself before growing.
#[derive(Debug, Default)]
pub struct InBuf {
    buf: Vec<u8>,
    pos: usize,
    /// The last read filled all the room it was given: the socket may hold more, so the next
    /// read gets a full `READ_CHUNK`.
    filled: bool,
}

/// How much a read asks the kernel for.
pub const READ_CHUNK: usize = 64 * 1024;

/// What an empty buffer (new or released) allocates for its first read: enough for a usual
/// request head.
pub const START_CAPACITY: usize = 2 * 1024;

impl InBuf {
    pub fn with_capacity(capacity: usize) -> InBuf {
        InBuf {
            buf: Vec::with_capacity(capacity),
            pos: 0,
            filled: false,
        }
    }

    /// Unconsumed bytes.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Drops `n` bytes from the front.
    #[inline]
    pub fn consume(&mut self, n: usize) {
        self.pos += n;
        debug_assert!(self.pos <= self.buf.len());
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
    }

    /// Reads once more from `reader`, appending. Returns the number of bytes read; 0 means EOF.
    ///
    /// If this future is dropped mid-read the buffered bytes are lost (the kernel may still own
    /// the buffer); only drop it when the connection is being abandoned. Use
    /// [`InBuf::fill_cancelable`] where a read must be interrupted without losing data.
    pub async fn fill<R: AsyncReadRent>(&mut self, reader: &mut R) -> io::Result<usize> {
        self.make_room();
        let (buf, pos) = self.lend();
        let end = buf.capacity();
        let start = buf.len();
        let (result, slice) = reader.read(buf.slice_mut(start..end)).await;
        self.restore(slice.into_inner(), pos);
        self.filled = matches!(result, Ok(n) if n == end - start);
        result
    }

    /// Like [`InBuf::fill`], but can be interrupted through `cancel` without losing bytes: the
    /// read then completes with an error of kind `Interrupted` and the buffer is intact.
    pub async fn fill_cancelable<R: CancelableAsyncReadRent>(
        &mut self,
        reader: &mut R,
        cancel: CancelHandle,
    ) -> io::Result<usize> {
        self.make_room();
        let (buf, pos) = self.lend();
        let end = buf.capacity();
        let start = buf.len();
        let (result, slice) = reader
            .cancelable_read(buf.slice_mut(start..end), cancel)
            .await;
        self.restore(slice.into_inner(), pos);
        self.filled = matches!(result, Ok(n) if n == end - start);
        result.map_err(|error| {
            if error.raw_os_error() == Some(libc::ECANCELED) {
                io::Error::new(io::ErrorKind::Interrupted, "read cancelled")
            } else {
                error
            }
        })
    }

    /// Gives the allocation back while nothing is buffered (a request waiting in a queue holds
    /// no read buffer); the next read allocates a small one again.
    pub fn release_if_empty(&mut self) {
        if self.is_empty() {
            self.buf = Vec::new();
            self.pos = 0;
        }
    }

    /// Moves the buffer out for a read, leaving `self` empty but consistent if the read is
    /// dropped.
    fn lend(&mut self) -> (Vec<u8>, usize) {
        let pos = std::mem::take(&mut self.pos);
        (std::mem::take(&mut self.buf), pos)
    }

    fn restore(&mut self, buf: Vec<u8>, pos: usize) {
        self.buf = buf;
        self.pos = pos;
    }

    /// Ensures spare capacity for a full read without letting the buffer grow past what is
    /// needed: consumed bytes are shifted out first. An empty buffer keeps its (small) initial
    /// capacity until a read fills it, so an idle or queued connection holds no 64 KiB.
    fn make_room(&mut self) {
        if self.pos > 0
            && (self.pos == self.buf.len() || self.buf.capacity() - self.buf.len() < READ_CHUNK / 4)
        {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(START_CAPACITY);
            return;
        }
        let spare = self.buf.capacity() - self.buf.len();
        let more_expected = self.filled || !self.buf.is_empty();
        if spare == 0 || (spare < READ_CHUNK / 4 && more_expected) {
            self.buf.reserve(READ_CHUNK);
        }
    }

    /// Appends bytes as if read from a socket (unit tests of code that consumes an `InBuf`).
    #[cfg(test)]
    pub fn extend_for_test(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_buffer_keeps_its_small_capacity_until_a_read_fills_it() {
        let mut inbuf = InBuf::with_capacity(2048);
        inbuf.make_room();
        assert_eq!(inbuf.buf.capacity(), 2048, "no growth before data says so");
        inbuf.filled = true;
        inbuf.make_room();
        assert!(inbuf.buf.capacity() >= READ_CHUNK, "a full read grows it");
    }

    #[test]
    fn a_released_buffer_holds_nothing_and_starts_small_again() {
        let mut inbuf = InBuf::with_capacity(READ_CHUNK);
        inbuf.extend_for_test(b"GET / HTTP/1.1\r\n");
        inbuf.release_if_empty();
        assert!(inbuf.buf.capacity() >= READ_CHUNK, "bytes buffered: kept");
        inbuf.consume(inbuf.len());
        inbuf.release_if_empty();
        assert_eq!(inbuf.buf.capacity(), 0);
        inbuf.make_room();
        assert_eq!(inbuf.buf.capacity(), START_CAPACITY);
    }

    #[test]
    fn a_partial_head_gets_room_for_a_full_read() {
        let mut inbuf = InBuf::with_capacity(2048);
        inbuf.extend_for_test(b"GET / HTTP/1.1\r\nHost: x\r\n");
        inbuf.make_room();
        assert!(inbuf.buf.capacity() - inbuf.buf.len() >= READ_CHUNK);
        assert_eq!(inbuf.data(), b"GET / HTTP/1.1\r\nHost: x\r\n");
    }
}
