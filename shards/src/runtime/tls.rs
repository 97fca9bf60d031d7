//! TLS over a connection's socket, as a [`ByteStream`] like plain TCP: the fronts, the upgrade
//! copy and the pools take it unchanged. rustls does the protocol ([`rustls::ServerConnection`],
//! [`rustls::ClientConnection`]); this module moves its records through the reactor.
//!
//! The shape, in both directions:
//! * Reading: once the socket is readable, ciphertext is received straight into rustls' own
//!   record buffer (a few KiB per call; rustls stops at 16 KiB of decrypted bytes), and
//!   decrypted bytes are copied out only when the caller asks. A read that must be interruptible
//!   (monoio's cancelable reads) and the poll-style form go through `Engine::incoming` instead,
//!   fed to rustls a piece at a time. Nothing read is ever lost: bytes not yet fed stay in
//!   `incoming`, and the whole engine moves with the stream into its poll-style form when a
//!   connection turns out to speak HTTP/2 ([`poll::TlsPoll`]).
//! * Writing: the caller's bytes are sealed into records by rustls and written out whole before
//!   the write returns, so that the order of records on the wire is the order of writes.
//!
//! Split: the two halves of a split stream reach one `TlsStream` (monoio's `Split`, as for TCP).
//! The read half only ever reads the socket and the write half only ever writes it; neither
//! holds a borrow of the session across an await. What reading makes rustls want to send after
//! the handshake (a key update's answer) goes out with the next write.
//!
//! Memory: an idle connection holds rustls' session (its 4 KiB record buffer) and a small write
//! buffer, and waits for its peer with no read buffer of ours; larger ones are given back after
//! use ([`READ_SMALL`], [`READ_LARGE`] for the buffered reads, [`KEEP_WRITE_BUFFER`]).

// Slices over the caller's rent buffers (see each SAFETY).
#![allow(unsafe_code)]

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut, RawBuf};
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, CancelHandle, CancelableAsyncReadRent,
    IntoPollIo, OwnedReadHalf, Split,
};
use monoio::net::TcpStream;
use monoio::BufResult;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, ConnectionCommon, ServerConfig, ServerConnection};

use super::stream::{ByteStream, Connector, Socket};

pub mod poll;

/// Bytes asked of the socket per read while reads come back short (a request head, a small
/// body, an idle connection waiting): what an idle connection's read in flight holds.
pub const READ_SMALL: usize = 4 * 1024;
/// Bytes asked per read once a read filled the small buffer (a body streaming in): one full
/// record and the start of the next.
pub const READ_LARGE: usize = 17 * 1024;
/// A write buffer up to this size is kept for the next write; a larger one (a big body's
/// records) is given back once written.
pub const KEEP_WRITE_BUFFER: usize = 4 * 1024;

/// The cryptography every TLS configuration of the process is built with (rustls' aws-lc-rs
/// provider; `benches/tls-provider` measures the choice).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<rustls::crypto::CryptoProvider>> =
        std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// The server side of a TLS connection.
pub type ServerTls = TlsStream<ServerConnection>;
/// The client side of a TLS connection (to a pod).
pub type ClientTls = TlsStream<ClientConnection>;

/// What the read side needs next.
enum Next {
    /// Decrypted bytes are waiting to be copied out.
    Plaintext,
    /// The peer ended the stream (close_notify, or the socket's end).
    End,
    /// More ciphertext must come from the socket.
    Socket,
}

/// rustls' session with the read side's bookkeeping: everything but the socket, shared by the
/// completion-style stream and its poll-style form.
pub(crate) struct Engine<C> {
    session: C,
    /// Ciphertext read from the socket: `incoming[fed..]` is not yet given to rustls.
    incoming: Vec<u8>,
    fed: usize,
    /// Decrypted bytes rustls holds for the reader.
    plaintext: usize,
    /// The peer sent close_notify.
    closed: bool,
    /// The socket reached its end.
    eof: bool,
    /// rustls was given bytes (or the end) straight from the socket, not yet processed.
    unprocessed: bool,
    /// The next socket read asks for this many bytes.
    read_size: usize,
}

impl<C, SD> Engine<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>>,
    SD: rustls::SideData,
{
    fn new(session: C) -> Engine<C> {
        Engine {
            session,
            incoming: Vec::new(),
            fed: 0,
            plaintext: 0,
            closed: false,
            eof: false,
            unprocessed: false,
            read_size: READ_SMALL,
        }
    }

    /// Feeds rustls what is buffered until it has plaintext, the stream ended, or it needs more
    /// from the socket. An error is the peer's (a bad record, a failed handshake); rustls then
    /// has an alert queued for it.
    fn advance(&mut self) -> io::Result<Next> {
        loop {
            if self.plaintext > 0 {
                return Ok(Next::Plaintext);
            }
            if self.closed {
                return Ok(Next::End);
            }
            if self.unprocessed {
                self.unprocessed = false;
                self.process()?;
                continue;
            }
            if self.fed < self.incoming.len() {
                let mut unread = &self.incoming[self.fed..];
                let n = self.session.read_tls(&mut unread)?;
                if n == 0 {
                    // rustls took nothing from bytes it was offered: it cannot go on.
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "TLS: the peer's records do not fit",
                    ));
                }
                self.fed += n;
                self.process()?;
                continue;
            }
            if self.eof {
                return Ok(Next::End);
            }
            return Ok(Next::Socket);
        }
    }

    fn process(&mut self) -> io::Result<()> {
        let state = self
            .session
            .process_new_packets()
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        self.plaintext = state.plaintext_bytes_to_read();
        self.closed = state.peer_has_closed();
        Ok(())
    }

    /// The buffer for the next socket read, empty, with room for `read_size` bytes; the one
    /// kept from the last read when it is the right size.
    fn take_read_buffer(&mut self) -> Vec<u8> {
        let mut buffer = std::mem::take(&mut self.incoming);
        self.fed = 0;
        if buffer.capacity() != self.read_size {
            buffer = Vec::with_capacity(self.read_size);
        }
        buffer.clear();
        buffer
    }

    /// Takes back the read buffer holding what the socket gave (`buffer.len()` bytes; none is
    /// the socket's end) and sizes the next read: large once a read filled a small buffer, small
    /// again after a short read.
    fn put_read_buffer(&mut self, buffer: Vec<u8>) -> io::Result<()> {
        let n = buffer.len();
        self.read_size = if n == buffer.capacity() {
            READ_LARGE
        } else if n < READ_SMALL {
            READ_SMALL
        } else {
            self.read_size
        };
        self.incoming = buffer;
        self.fed = 0;
        if n == 0 {
            self.eof = true;
            // Tells rustls the stream ended, so that a close without close_notify is seen.
            let _ = self.session.read_tls(&mut &[][..]);
            self.process()?;
        }
        Ok(())
    }

    /// Gives rustls what the socket `fd` has now, read into rustls' own record buffer;
    /// `WouldBlock` when it has nothing yet. Only when everything read before was fed.
    fn receive_now(&mut self, fd: std::os::fd::RawFd) -> io::Result<()> {
        debug_assert!(self.fed >= self.incoming.len());
        // Nothing of ours is held while waiting (the buffered path's one is given back).
        self.incoming = Vec::new();
        self.fed = 0;
        let n = self.session.read_tls(&mut ReceiveNow(fd))?;
        if n == 0 {
            // rustls saw the end of the stream too: a close without close_notify is seen.
            self.eof = true;
        }
        // Processed by the next `advance`, whose errors send the alert rustls has.
        self.unprocessed = true;
        Ok(())
    }

    /// Copies up to `out.len()` decrypted bytes out.
    fn copy_plaintext(&mut self, out: &mut [u8]) -> io::Result<usize> {
        match self.session.reader().read(out) {
            Ok(n) => {
                self.plaintext -= n.min(self.plaintext);
                Ok(n)
            }
            // Neither is an error to the reader here: no bytes are buffered after all, or the
            // stream ended without close_notify (HTTP frames its messages; a truncated one is
            // seen by its framing).
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::UnexpectedEof
                ) =>
            {
                self.plaintext = 0;
                Ok(0)
            }
            Err(error) => Err(error),
        }
    }

    /// Moves the records rustls has ready into `out` (appended).
    fn seal_into(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.session.wants_write() {
            self.session.write_tls(out)?;
        }
        Ok(())
    }
}

/// A socket read that does not wait: `recv(2)` with `MSG_DONTWAIT`.
struct ReceiveNow(std::os::fd::RawFd);

impl Read for ReceiveNow {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes for this call; the socket
            // is the stream's, open for as long as the stream is.
            let n = unsafe {
                libc::recv(
                    self.0,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let error = io::Error::last_os_error();
            if error.kind() != io::ErrorKind::Interrupted {
                return Err(error);
            }
        }
    }
}

/// A TLS connection over a TCP socket, its handshake done ([`accept`], [`TlsConnector`]).
pub struct TlsStream<C> {
    io: TcpStream,
    engine: Engine<C>,
    /// Records on their way to the socket; kept between writes while small.
    outgoing: Vec<u8>,
}

// SAFETY: the read half's methods touch only the socket's read side and the engine's read
// bookkeeping, the write half's only the socket's write side and `outgoing`; both reach rustls
// through short calls that never span an await (module documentation).
unsafe impl<C> Split for TlsStream<C> {}

impl<C, SD> TlsStream<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>>,
    SD: rustls::SideData,
{
    fn new(io: TcpStream, session: C) -> TlsStream<C> {
        TlsStream {
            io,
            engine: Engine::new(session),
            outgoing: Vec::new(),
        }
    }

    /// The session, for what the handshake settled (ALPN, the server name, the peer's chain).
    pub fn session(&self) -> &C {
        &self.engine.session
    }

    /// Runs the handshake to its end. On a failure the alert rustls has for the peer is sent
    /// (best effort) before the error is returned.
    async fn handshake(&mut self) -> io::Result<()> {
        loop {
            self.flush_records().await?;
            if !self.engine.session.is_handshaking() {
                return Ok(());
            }
            match self.engine.advance() {
                // The handshake ended with what was fed; what followed it stays for the reader.
                Ok(_) if !self.engine.session.is_handshaking() => {}
                // What rustls answered goes out (the top of the loop) before more is awaited.
                Ok(Next::Socket) if self.engine.session.wants_write() => {}
                Ok(Next::Socket) => self.read_socket(None).await?,
                Ok(Next::Plaintext) => {
                    // Application bytes before the handshake ended: early data, never enabled.
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "TLS: application data before the handshake ended",
                    ));
                }
                Ok(Next::End) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "TLS: the peer closed the connection during the handshake",
                    ));
                }
                Err(error) => {
                    let _ = self.flush_records().await;
                    return Err(error);
                }
            }
        }
    }

    /// Reads more of the peer's records for rustls. Without a cancel handle (an idle
    /// connection waiting for its next request, a request head, the handshake) the socket is
    /// read straight into rustls' own record buffer once it is readable: no buffer of ours is
    /// held while the peer says nothing, and the bytes are copied once. A read that must be
    /// interruptible without losing data goes through a buffer of ours, as monoio's own reads.
    async fn read_socket(&mut self, cancel: Option<CancelHandle>) -> io::Result<()> {
        let Some(cancel) = cancel else {
            let fd = std::os::fd::AsRawFd::as_raw_fd(&self.io);
            loop {
                match self.engine.receive_now(fd) {
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        self.io.readable(false).await?
                    }
                    done => return done,
                }
            }
        };
        let buffer = self.engine.take_read_buffer();
        let (result, buffer) = self.io.cancelable_read(buffer, cancel).await;
        result?;
        self.engine.put_read_buffer(buffer)
    }

    /// Writes out every record rustls has ready, whole.
    async fn flush_records(&mut self) -> io::Result<()> {
        while self.engine.session.wants_write() {
            let mut out = std::mem::take(&mut self.outgoing);
            out.clear();
            if let Err(error) = self.engine.seal_into(&mut out) {
                self.outgoing = out;
                return Err(error);
            }
            let (result, out) = self.io.write_all(out).await;
            self.outgoing = if out.capacity() <= KEEP_WRITE_BUFFER {
                out
            } else {
                Vec::new()
            };
            result?;
        }
        Ok(())
    }

    async fn read_into<T: IoBufMut>(
        &mut self,
        mut buf: T,
        cancel: Option<CancelHandle>,
    ) -> BufResult<usize, T> {
        let room = buf.bytes_total();
        if room == 0 {
            return (Ok(0), buf);
        }
        loop {
            match self.engine.advance() {
                Ok(Next::Plaintext) => break,
                Ok(Next::End) => return (Ok(0), buf),
                Ok(Next::Socket) => {
                    if let Err(error) = self.read_socket(cancel.clone()).await {
                        return (Err(error), buf);
                    }
                }
                Err(error) => return (Err(error), buf),
            }
        }
        let n = room.min(self.engine.plaintext);
        // SAFETY: `write_ptr` points at `bytes_total()` writable bytes of the caller's buffer,
        // which this call owns until it returns it; the first `n` of them are zeroed before a
        // slice is made over them, so the slice never covers uninitialised memory.
        let out = unsafe {
            let ptr = buf.write_ptr();
            std::ptr::write_bytes(ptr, 0, n);
            std::slice::from_raw_parts_mut(ptr, n)
        };
        match self.engine.copy_plaintext(out) {
            Ok(copied) => {
                // SAFETY: `copied` ≤ `n` bytes from the start were just written.
                unsafe { buf.set_init(copied) };
                (Ok(copied), buf)
            }
            Err(error) => (Err(error), buf),
        }
    }

    /// A vectored read: into the first iovec, as monoio's own streams without `readv` do.
    async fn readv_into<T: IoVecBufMut>(
        &mut self,
        mut buf: T,
        cancel: Option<CancelHandle>,
    ) -> BufResult<usize, T> {
        // SAFETY: the raw buffer is the first iovec of `buf`, which is held here until the read
        // has returned.
        let Some(raw) = (unsafe { RawBuf::new_from_iovec_mut(&mut buf) }) else {
            return (Ok(0), buf);
        };
        let (result, _) = self.read_into(raw, cancel).await;
        if let Ok(n) = result {
            // SAFETY: `n` bytes of the first iovec were written.
            unsafe { buf.set_init(n) };
        }
        (result, buf)
    }

    async fn write_slices(&mut self, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let n = self.engine.session.writer().write_vectored(slices)?;
        self.flush_records().await?;
        Ok(n)
    }
}

/// Iovecs of a rent buffer vector as slices.
///
/// SAFETY (for callers): the iovecs must point at initialised memory owned by `buf`, which
/// outlives the returned slices (monoio's `IoVecBuf` contract).
unsafe fn iovec_slices<T: IoVecBuf>(buf: &T) -> Vec<io::IoSlice<'_>> {
    let iovecs = std::slice::from_raw_parts(buf.read_iovec_ptr(), buf.read_iovec_len());
    iovecs
        .iter()
        .map(|iovec| {
            io::IoSlice::new(std::slice::from_raw_parts(
                iovec.iov_base as *const u8,
                iovec.iov_len,
            ))
        })
        .collect()
}

impl<C, SD> AsyncReadRent for TlsStream<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>>,
    SD: rustls::SideData,
{
    fn read<T: IoBufMut>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        self.read_into(buf, None)
    }

    fn readv<T: IoVecBufMut>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        self.readv_into(buf, None)
    }
}

impl<C, SD> CancelableAsyncReadRent for TlsStream<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>>,
    SD: rustls::SideData,
{
    fn cancelable_read<T: IoBufMut>(
        &mut self,
        buf: T,
        cancel: CancelHandle,
    ) -> impl Future<Output = BufResult<usize, T>> {
        self.read_into(buf, Some(cancel))
    }

    fn cancelable_readv<T: IoVecBufMut>(
        &mut self,
        buf: T,
        cancel: CancelHandle,
    ) -> impl Future<Output = BufResult<usize, T>> {
        self.readv_into(buf, Some(cancel))
    }
}

impl<C, SD> AsyncWriteRent for TlsStream<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>>,
    SD: rustls::SideData,
{
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: `read_ptr` points at `bytes_init()` initialised bytes of `buf`, which is held
        // here until the write returns it.
        let slice = unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) };
        let result = self.write_slices(&[io::IoSlice::new(slice)]).await;
        (result, buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        // SAFETY: monoio's `IoVecBuf` points at initialised bytes owned by `buf`, held here
        // until the write returns it.
        let slices = unsafe { iovec_slices(&buf) };
        let result = self.write_slices(&slices).await;
        drop(slices);
        (result, buf)
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.flush_records().await?;
        self.io.flush().await
    }

    /// Sends close_notify, then ends the socket's sending side.
    async fn shutdown(&mut self) -> io::Result<()> {
        self.engine.session.send_close_notify();
        self.flush_records().await?;
        self.io.shutdown().await
    }
}

impl<C, SD> IntoPollIo for TlsStream<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>> + Unpin + 'static,
    SD: rustls::SideData,
{
    type PollIo = poll::TlsPoll<C>;

    fn try_into_poll_io(self) -> Result<poll::TlsPoll<C>, (io::Error, Self)> {
        let TlsStream {
            io,
            engine,
            outgoing,
        } = self;
        match io.try_into_poll_io() {
            Ok(io) => Ok(poll::TlsPoll::new(io, engine, outgoing)),
            Err((error, io)) => Err((
                error,
                TlsStream {
                    io,
                    engine,
                    outgoing,
                },
            )),
        }
    }
}

impl<C, SD> ByteStream for TlsStream<C>
where
    C: DerefMut + Deref<Target = ConnectionCommon<SD>> + Unpin + 'static,
    SD: rustls::SideData + 'static,
{
    const TLS: bool = true;

    #[inline]
    fn socket(&self) -> Socket {
        self.io.socket()
    }

    fn readable(reader: &OwnedReadHalf<Self>) -> impl Future<Output = io::Result<()>> {
        // SAFETY: as for plain TCP (`stream::ByteStream for TcpStream`): both halves reach the
        // stream through one `UnsafeCell`; this shared borrow lives only while a request waits
        // for a slot, when the read half is used for nothing else, and it touches only the
        // socket.
        let stream: &TlsStream<C> = unsafe { &*reader.0.get() };
        stream.io.readable(false)
    }
}

/// Runs the server side of a handshake on an accepted connection.
pub async fn accept(config: Arc<ServerConfig>, io: TcpStream) -> io::Result<ServerTls> {
    let session = ServerConnection::new(config).map_err(io::Error::other)?;
    let mut stream = TlsStream::new(io, session);
    stream.handshake().await?;
    Ok(stream)
}

/// Runs the client side of a handshake on a connected socket.
pub async fn connect(
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    io: TcpStream,
) -> io::Result<ClientTls> {
    let session = ClientConnection::new(config, server_name).map_err(io::Error::other)?;
    let mut stream = TlsStream::new(io, session);
    stream.handshake().await?;
    Ok(stream)
}

/// How a revision's pods are reached over TLS: what the client verifies (trust, names, versions,
/// all in `config`) and the name it sends and checks.
pub struct UpstreamTls {
    pub config: Arc<ClientConfig>,
    /// The configuration an HTTP/2 connection is dialled with when it is not `config`: the same
    /// trust and names, ALPN `h2` (KEDA's HTTP add-on's pods, Go servers, speak HTTP/2 inside
    /// TLS only when ALPN says so, and HTTP/1.1 only when it does not). `None`: `config`
    /// (Knative's: no ALPN, HTTP/2 by prior knowledge).
    pub config_h2: Option<Arc<ClientConfig>>,
    /// Sent as SNI and verified against the pod's certificate.
    pub server_name: ServerName<'static>,
    /// The port TLS is dialled on when it is not the listed one: Knative lists a queue-proxy
    /// at its plain serving port (8012/8013, where it is probed) and takes TLS on 8112, and a
    /// private Service at 80 with TLS on 443 (`reference/tls.md` §2.3).
    pub port: Option<u16>,
    /// Only a request whose client came over TLS is sent over TLS; any other goes to the pod in
    /// plain TCP (KEDA's HTTP add-on: its TLS port's requests go to `https://`, its plain
    /// port's to `http://`, `interceptor/middleware/routing.go` L118-133 at v0.15.0). `false`:
    /// every request (Knative's).
    pub clients_over_tls_only: bool,
}

impl UpstreamTls {
    /// Where a target listed at `addr` is dialled.
    pub fn dial_addr(&self, addr: SocketAddr) -> SocketAddr {
        match self.port {
            Some(port) => SocketAddr::new(addr.ip(), port),
            None => addr,
        }
    }
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .field("alpn", &self.config.alpn_protocols)
            .field("port", &self.port)
            .field("clients_over_tls_only", &self.clients_over_tls_only)
            .finish()
    }
}

/// Dials pods over TLS: TCP with Nagle off, then the client handshake with the revision's
/// settings; a shard's TLS pool (HTTP/1.1) and its TLS HTTP/2 connections each have one, and
/// serve every TLS revision.
#[derive(Clone, Copy, Debug, Default)]
pub struct TlsDialer {
    /// For HTTP/2 connections: [`UpstreamTls::config_h2`] where a revision has one.
    pub http2: bool,
}

impl Connector for TlsDialer {
    type Stream = ClientTls;
    type Target = UpstreamTls;

    async fn connect(&self, addr: SocketAddr, target: &UpstreamTls) -> io::Result<ClientTls> {
        let io = TcpStream::connect_addr(target.dial_addr(addr)).await?;
        let _ = io.set_nodelay(true);
        let config = match (&target.config_h2, self.http2) {
            (Some(h2), true) => h2.clone(),
            _ => target.config.clone(),
        };
        connect(config, target.server_name.clone(), io).await
    }

    fn dial_addr(&self, addr: SocketAddr, target: &UpstreamTls) -> SocketAddr {
        target.dial_addr(addr)
    }
}

#[cfg(test)]
mod tests;
