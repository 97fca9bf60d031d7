//! The byte stream a probe speaks its protocol over: plain TCP, or TLS over it for a revision
//! whose pods the data plane dials over TLS (standalone `[revisions.tls]`). The TLS client is
//! the data plane's own for that revision ([`UpstreamTls`], built once by
//! [`crate::tls::PodTls`]): the same trust, server name, required name and TLS 1.3 without
//! ALPN, run here by tokio-rustls because the prober lives on the control thread's tokio
//! runtime, not on a shard's reactor.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use kactivator_shards::runtime::tls::UpstreamTls;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::Failure;

/// A connection to a pod, as its revision's pods are dialled.
pub(super) enum PodStream {
    Plain(TcpStream),
    /// Boxed: a TLS session is a few hundred bytes more than a socket.
    Tls(Box<TlsStream<TcpStream>>),
}

impl PodStream {
    /// Whether it speaks TLS.
    pub(super) fn is_tls(&self) -> bool {
        matches!(self, PodStream::Tls(_))
    }
}

/// A new connection to the pod listed at `addr`: plain TCP, or with `tls` the TCP connection
/// to where the data plane dials it over TLS ([`UpstreamTls::dial_addr`]) and the client
/// handshake, under the caller's timeout. A handshake that fails (a certificate the trust or
/// the names refuse, a pod that speaks no TLS) says `TLS handshake: …` with rustls' reason.
pub(super) async fn open(
    addr: SocketAddr,
    tls: Option<&UpstreamTls>,
) -> Result<PodStream, Failure> {
    let Some(tls) = tls else {
        return Ok(PodStream::Plain(super::dial(addr).await?));
    };
    let tcp = super::dial(tls.dial_addr(addr)).await?;
    TlsConnector::from(tls.config.clone())
        .connect(tls.server_name.clone(), tcp)
        .await
        .map(|stream| PodStream::Tls(Box::new(stream)))
        .map_err(|error| Failure::new(handshake_failure(&error), false))
}

/// Why a client handshake failed, for the probe's reason: rustls' own words (the certificate
/// error, the required name's `san "…" does not have a matching name in […]`, an alert the pod
/// sent), which tokio-rustls carries inside an I/O error.
pub(super) fn handshake_failure(error: &io::Error) -> String {
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::General(reason)) => format!("TLS handshake: {reason}"),
        Some(rustls) => format!("TLS handshake: {rustls}"),
        None => format!("TLS handshake: {error}"),
    }
}

impl AsyncRead for PodStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PodStream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            PodStream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PodStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PodStream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            PodStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PodStream::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            PodStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            PodStream::Plain(stream) => stream.is_write_vectored(),
            PodStream::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PodStream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            PodStream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PodStream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            PodStream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests;
