//! Chunked transfer-coding output: size lines, chunk framing and the last chunk.

/// The line terminator, also what closes each chunk's data.
pub const CRLF: &[u8] = b"\r\n";

/// A chunk-size line (hex size and CRLF) built on the stack, for vectored writes that send the
/// line, the caller's data and [`CRLF`] without copying the data.
#[derive(Clone, Copy, Debug)]
pub struct ChunkSizeLine {
    bytes: [u8; 18],
    len: u8,
}

impl ChunkSizeLine {
    /// The line, ready to write.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The chunk-size line for a chunk of `len` bytes.
///
/// `len` 0 gives `0\r\n`, which starts the last chunk; use [`encode_last_chunk`] for that.
pub fn chunk_size_line(len: u64) -> ChunkSizeLine {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut bytes = [0u8; 18];
    let digits = if len == 0 {
        1
    } else {
        (64 - len.leading_zeros()).div_ceil(4) as usize
    };
    for (index, slot) in bytes[..digits].iter_mut().enumerate() {
        let shift = 4 * (digits - 1 - index);
        *slot = HEX[((len >> shift) & 0xf) as usize];
    }
    bytes[digits] = b'\r';
    bytes[digits + 1] = b'\n';
    ChunkSizeLine {
        bytes,
        // At most 16 hex digits plus CRLF.
        len: (digits + 2) as u8,
    }
}

/// Append one chunk (hex size line, data, CRLF) to out. Empty data appends nothing (an empty
/// chunk would end the body).
pub fn encode_chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    let line = chunk_size_line(data.len() as u64);
    out.reserve(line.as_bytes().len() + data.len() + CRLF.len());
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(CRLF);
}

/// Append the chunk-size line only, for callers that write the data separately; they then
/// finish the chunk with [`encode_chunk_end`] (or by writing [`CRLF`]).
///
/// `len` 0 appends nothing, like [`encode_chunk`] with empty data, so the caller must then
/// also skip the data and its CRLF.
pub fn encode_chunk_header(len: usize, out: &mut Vec<u8>) {
    if len == 0 {
        return;
    }
    out.extend_from_slice(chunk_size_line(len as u64).as_bytes());
}

/// Append the CRLF that closes a chunk's data.
pub fn encode_chunk_end(out: &mut Vec<u8>) {
    out.extend_from_slice(CRLF);
}

/// Append the last-chunk, optional raw trailer lines, and the final CRLF.
///
/// `trailers` are raw field lines each ending in CRLF, as in [`crate::BodyEvent::Trailers`];
/// a missing CRLF after the last line is added so the section stays well formed.
pub fn encode_last_chunk(trailers: Option<&[u8]>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n");
    if let Some(trailers) = trailers.filter(|trailers| !trailers.is_empty()) {
        out.extend_from_slice(trailers);
        if !trailers.ends_with(CRLF) {
            out.extend_from_slice(CRLF);
        }
    }
    out.extend_from_slice(CRLF);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_lines() {
        let cases: &[(u64, &[u8])] = &[
            (0, b"0\r\n"),
            (1, b"1\r\n"),
            (15, b"f\r\n"),
            (16, b"10\r\n"),
            (0x1234, b"1234\r\n"),
            (u64::MAX, b"ffffffffffffffff\r\n"),
        ];
        for (len, expected) in cases {
            assert_eq!(chunk_size_line(*len).as_bytes(), *expected, "len {len}");
        }
    }

    #[test]
    fn chunks() {
        let mut out = Vec::new();
        encode_chunk(b"", &mut out);
        assert!(out.is_empty());
        encode_chunk(b"hello", &mut out);
        assert_eq!(out, b"5\r\nhello\r\n");

        out.clear();
        encode_chunk_header(0, &mut out);
        assert!(out.is_empty());
        encode_chunk_header(300, &mut out);
        out.extend_from_slice(&[b'x'; 300]);
        encode_chunk_end(&mut out);
        assert!(out.starts_with(b"12c\r\nxxx"));
        assert!(out.ends_with(b"x\r\n"));
    }

    #[test]
    fn last_chunks() {
        let mut out = Vec::new();
        encode_last_chunk(None, &mut out);
        assert_eq!(out, b"0\r\n\r\n");
        out.clear();
        encode_last_chunk(Some(b""), &mut out);
        assert_eq!(out, b"0\r\n\r\n");
        out.clear();
        encode_last_chunk(Some(b"a: b\r\nc: d\r\n"), &mut out);
        assert_eq!(out, b"0\r\na: b\r\nc: d\r\n\r\n");
        out.clear();
        encode_last_chunk(Some(b"a: b"), &mut out);
        assert_eq!(out, b"0\r\na: b\r\n\r\n");
    }
}
