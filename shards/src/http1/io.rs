//! Whole writes that keep their buffer, for the HTTP/1 front. They know writers, not the
//! client connection (`client::write_out` builds on them); the socket shortcuts are
//! `runtime::stream::Socket`'s.

use std::io;

use monoio::buf::IoBuf;
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt};

/// Writes all of `out` and clears it, keeping its allocation.
pub(super) async fn write_all<W: AsyncWriteRent>(
    writer: &mut W,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let result = write_rest(writer, out, 0).await;
    out.clear();
    result
}

/// Writes `out[from..]` and leaves `out` as it was.
pub(super) async fn write_rest<W: AsyncWriteRent>(
    writer: &mut W,
    out: &mut Vec<u8>,
    from: usize,
) -> io::Result<()> {
    let buf = std::mem::take(out);
    let (result, rest) = writer.write_all(buf.slice(from..)).await;
    *out = rest.into_inner();
    result.map(|_| ())
}
