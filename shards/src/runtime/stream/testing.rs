//! A stream for tests that stands where an encrypting stream will: plain TCP underneath, but
//! its bytes are not the socket's as far as the shortcuts know, so every write goes through the
//! reactor. It counts what was written through it, so a test can tell which path carried the
//! bytes.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{
    AsyncReadRent, AsyncWriteRent, CancelHandle, CancelableAsyncReadRent, IntoPollIo,
    OwnedReadHalf, Split,
};
use monoio::net::TcpStream;
use monoio::BufResult;

use super::{ByteStream, Connector, Socket};

/// TCP that keeps the shortcuts' raw send away from its socket.
pub(crate) struct Sealed {
    inner: TcpStream,
    /// Bytes written through the reactor, shared with the test.
    written: Rc<Cell<usize>>,
}

impl Sealed {
    pub(crate) fn new(inner: TcpStream, written: Rc<Cell<usize>>) -> Sealed {
        Sealed { inner, written }
    }
}

impl AsyncReadRent for Sealed {
    fn read<T: IoBufMut>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        self.inner.read(buf)
    }

    fn readv<T: IoVecBufMut>(&mut self, buf: T) -> impl Future<Output = BufResult<usize, T>> {
        self.inner.readv(buf)
    }
}

impl CancelableAsyncReadRent for Sealed {
    fn cancelable_read<T: IoBufMut>(
        &mut self,
        buf: T,
        cancel: CancelHandle,
    ) -> impl Future<Output = BufResult<usize, T>> {
        self.inner.cancelable_read(buf, cancel)
    }

    fn cancelable_readv<T: IoVecBufMut>(
        &mut self,
        buf: T,
        cancel: CancelHandle,
    ) -> impl Future<Output = BufResult<usize, T>> {
        self.inner.cancelable_readv(buf, cancel)
    }
}

impl AsyncWriteRent for Sealed {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let (result, buf) = self.inner.write(buf).await;
        if let Ok(n) = result {
            self.written.set(self.written.get() + n);
        }
        (result, buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let (result, buf) = self.inner.writev(buf).await;
        if let Ok(n) = result {
            self.written.set(self.written.get() + n);
        }
        (result, buf)
    }

    fn flush(&mut self) -> impl Future<Output = io::Result<()>> {
        self.inner.flush()
    }

    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> {
        self.inner.shutdown()
    }
}

// SAFETY: reads and writes go to the TCP stream inside, which monoio splits the same way.
#[allow(unsafe_code)]
unsafe impl Split for Sealed {}

impl IntoPollIo for Sealed {
    type PollIo = <TcpStream as IntoPollIo>::PollIo;

    fn try_into_poll_io(self) -> Result<Self::PollIo, (io::Error, Self)> {
        let written = self.written;
        IntoPollIo::try_into_poll_io(self.inner)
            .map_err(|(error, inner)| (error, Sealed { inner, written }))
    }
}

impl ByteStream for Sealed {
    fn socket(&self) -> Socket {
        // Its bytes are not the socket's: `send_now` stays the trait's, which sends nothing.
        Socket {
            fd: self.inner.as_raw_fd(),
        }
    }

    fn readable(reader: &OwnedReadHalf<Sealed>) -> impl Future<Output = io::Result<()>> {
        // SAFETY: as for plain TCP: a shared borrow while nothing else uses the stream.
        #[allow(unsafe_code)]
        let stream: &Sealed = unsafe { &*reader.0.get() };
        stream.inner.readable(false)
    }
}

/// Dials [`Sealed`] streams, counting the dials and the bytes written through all of them.
#[derive(Default)]
pub(crate) struct SealedConnector {
    pub(crate) dials: Cell<usize>,
    pub(crate) written: Rc<Cell<usize>>,
}

impl Connector for SealedConnector {
    type Stream = Sealed;
    type Target = ();

    async fn connect(&self, addr: SocketAddr, _: &()) -> io::Result<Sealed> {
        self.dials.set(self.dials.get() + 1);
        let inner = TcpStream::connect_addr(addr).await?;
        Ok(Sealed::new(inner, self.written.clone()))
    }
}

/// A reactor on the driver `KACTIVATOR_DRIVER` names (`io-uring`, `epoll`; otherwise whichever
/// the kernel offers), as the binary's tests choose theirs.
pub(crate) fn reactor() -> crate::runtime::reactor::Reactor {
    use crate::runtime::reactor::{build, DriverChoice};
    let choice = match std::env::var("KACTIVATOR_DRIVER").as_deref() {
        Ok("epoll") => DriverChoice::Epoll,
        Ok("io-uring") => DriverChoice::IoUring,
        _ => DriverChoice::Auto,
    };
    build(choice).expect("a reactor for the test")
}

/// A connected pair over loopback: the reactor's end and a blocking standard one for the test's
/// side (run it on another thread, or with short reads that the kernel's buffers satisfy).
pub(crate) async fn loopback_pair() -> (TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let ours = TcpStream::connect_addr(addr).await.unwrap();
    let (theirs, _) = listener.accept().unwrap();
    (ours, theirs)
}
