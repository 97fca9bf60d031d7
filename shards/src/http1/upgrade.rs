//! After a `101 Switching Protocols`: a byte copy in each direction, each direction's FIN
//! forwarded as a half-close, no timer (★ upstream's request timeout cuts websockets).

use std::future::{poll_fn, Future};
use std::io;
use std::pin::pin;
use std::task::Poll;

use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf};

use super::client::ClientWriter;
use super::io::write_all;
use crate::runtime::buffer::InBuf;
use crate::runtime::stream::ByteStream;

/// Copies bytes both ways after a `101`, propagating each direction's FIN as a half-close.
pub(super) async fn splice_upgraded<C: ByteStream, U: ByteStream>(
    client_reader: &mut OwnedReadHalf<C>,
    client_inbuf: &mut InBuf,
    client_writer: &mut ClientWriter<C>,
    upstream_reader: &mut OwnedReadHalf<U>,
    upstream_inbuf: &mut InBuf,
    upstream_writer: &mut OwnedWriteHalf<U>,
) {
    let to_pod = copy_until_eof(client_reader, client_inbuf, upstream_writer);
    let to_client = copy_until_eof(upstream_reader, upstream_inbuf, client_writer);
    let mut to_pod = pin!(to_pod);
    let mut to_client = pin!(to_client);
    let (mut pod_done, mut client_done) = (false, false);
    poll_fn(|cx| {
        if !pod_done {
            if let Poll::Ready(result) = to_pod.as_mut().poll(cx) {
                if result.is_err() {
                    return Poll::Ready(());
                }
                pod_done = true;
            }
        }
        if !client_done {
            if let Poll::Ready(result) = to_client.as_mut().poll(cx) {
                if result.is_err() {
                    return Poll::Ready(());
                }
                client_done = true;
            }
        }
        if pod_done && client_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// Copies `reader` into `writer` until EOF, then shuts the writer down (half-close).
async fn copy_until_eof<R: AsyncReadRent, W: AsyncWriteRent>(
    reader: &mut R,
    inbuf: &mut InBuf,
    writer: &mut W,
) -> io::Result<()> {
    let mut buf = Vec::with_capacity(16 * 1024);
    buf.extend_from_slice(inbuf.data());
    let buffered = inbuf.len();
    inbuf.consume(buffered);
    loop {
        if !buf.is_empty() {
            write_all(writer, &mut buf).await?;
        }
        buf.clear();
        let (read, returned) = reader.read(buf).await;
        buf = returned;
        match read {
            Ok(0) => {
                writer.shutdown().await?;
                return Ok(());
            }
            Ok(_) => {}
            Err(error) => {
                let _ = writer.shutdown().await;
                return Err(error);
            }
        }
    }
}
