//! Incremental, zero-copy body decoding for every framing a head can announce.

use crate::error::BodyError;
use crate::head::BodyKind;
use crate::MAX_HEADERS;

/// Longest accepted chunk-size line, extensions and CRLF included.
///
/// The decoder must hold a whole size line before it can act on it; the bound keeps that
/// buffering small while leaving ample room for extensions nobody uses.
pub const MAX_CHUNK_HEAD_BYTES: usize = 8 * 1024;

/// Longest accepted trailer section, the final empty line included.
pub const MAX_TRAILER_BYTES: usize = 64 * 1024;

/// One thing the decoder found in the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyEvent<'a> {
    /// Body bytes, borrowed from the input given to [`BodyDecoder::decode`].
    Data(&'a [u8]),
    /// Chunked only: the raw trailer field lines (each ending CRLF, without the terminating
    /// empty line). Only emitted when there is at least one trailer field.
    Trailers(&'a [u8]),
    /// The body is complete. Emitted exactly once. For Empty it is emitted on the first decode
    /// call.
    End,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Bytes still to come; never zero.
    Length(u64),
    UntilClose,
    ChunkSize,
    /// Bytes still to come in the current chunk; never zero.
    ChunkData(u64),
    /// The CRLF that closes a chunk's data.
    ChunkDataEnd,
    Trailers,
    /// The body is complete but End has not been reported yet.
    End,
    Done,
    Failed(BodyError),
}

/// Decodes one message body from bytes handed in piece by piece.
///
/// The decoder never buffers: framing it cannot act on yet (a chunk-size line, a CRLF, the
/// trailer section) is left unconsumed and looked at again on the next call, together with
/// whatever arrived since. Those are bounded by [`MAX_CHUNK_HEAD_BYTES`] and
/// [`MAX_TRAILER_BYTES`], so callers need a buffer of at least that size.
#[derive(Clone, Debug)]
pub struct BodyDecoder {
    kind: BodyKind,
    state: State,
    /// Payload bytes handed out so far, framing excluded.
    delivered: u64,
}

impl BodyDecoder {
    /// A decoder for a body framed as `kind`.
    pub fn new(kind: BodyKind) -> Self {
        let state = match kind {
            BodyKind::Empty | BodyKind::Length(0) => State::End,
            BodyKind::Length(length) => State::Length(length),
            BodyKind::Chunked => State::ChunkSize,
            BodyKind::UntilClose => State::UntilClose,
        };
        BodyDecoder {
            kind,
            state,
            delivered: 0,
        }
    }

    /// The payload bytes decoded so far (chunk framing and trailers excluded): what a request
    /// log reports as a body's size.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// The framing this decoder was made for.
    pub fn kind(&self) -> BodyKind {
        self.kind
    }

    /// Consume bytes from the front of `input`. Returns how many bytes were consumed and at
    /// most one event.
    ///
    /// Callers loop: call decode, drop `consumed` bytes from their buffer, act on the event,
    /// repeat until they get (0, None) meaning "need more input" (then read more from the
    /// socket). A result of (n, None) with n > 0 means n framing bytes were consumed and then
    /// more input is needed: the decoder walks through all framing it can before returning,
    /// so (n, None) never hides an event in the bytes left over. Any event, End included, may come with consumed > 0 (End
    /// with the last chunk and final CRLF), so always drop `consumed` bytes first. After End,
    /// bytes left in the buffer belong to the next message and decode consumes nothing more. Errors are final: every later call repeats
    /// the same error.
    pub fn decode<'a>(
        &mut self,
        input: &'a [u8],
    ) -> Result<(usize, Option<BodyEvent<'a>>), BodyError> {
        let mut consumed = 0;
        loop {
            let rest = &input[consumed..];
            match self.state {
                State::Failed(error) => return Err(error),
                State::Done => return Ok((consumed, None)),
                State::End => {
                    self.state = State::Done;
                    return Ok((consumed, Some(BodyEvent::End)));
                }
                State::UntilClose => {
                    if rest.is_empty() {
                        return Ok((consumed, None));
                    }
                    self.delivered += rest.len() as u64;
                    return Ok((consumed + rest.len(), Some(BodyEvent::Data(rest))));
                }
                State::Length(remaining) => {
                    let Some((data, left)) = take(rest, remaining) else {
                        return Ok((consumed, None));
                    };
                    self.state = if left == 0 {
                        State::End
                    } else {
                        State::Length(left)
                    };
                    self.delivered += data.len() as u64;
                    return Ok((consumed + data.len(), Some(BodyEvent::Data(data))));
                }
                State::ChunkData(remaining) => {
                    let Some((data, left)) = take(rest, remaining) else {
                        return Ok((consumed, None));
                    };
                    self.state = if left == 0 {
                        State::ChunkDataEnd
                    } else {
                        State::ChunkData(left)
                    };
                    self.delivered += data.len() as u64;
                    return Ok((consumed + data.len(), Some(BodyEvent::Data(data))));
                }
                State::ChunkSize => match chunk_size_line(rest) {
                    Err(error) => return self.fail(error),
                    Ok(None) => return Ok((consumed, None)),
                    Ok(Some((line_len, size))) => {
                        consumed += line_len;
                        self.state = if size == 0 {
                            State::Trailers
                        } else {
                            State::ChunkData(size)
                        };
                    }
                },
                State::ChunkDataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        consumed += 2;
                        self.state = State::ChunkSize;
                    }
                    [] | [b'\r'] => return Ok((consumed, None)),
                    _ => return self.fail(BodyError::InvalidChunkTerminator),
                },
                State::Trailers => match rest {
                    [b'\r', b'\n', ..] => {
                        consumed += 2;
                        self.state = State::End;
                    }
                    [] | [b'\r'] => return Ok((consumed, None)),
                    _ => match trailer_section(rest) {
                        Err(error) => return self.fail(error),
                        Ok(None) => return Ok((consumed, None)),
                        Ok(Some(section_len)) => {
                            self.state = State::End;
                            let fields = &rest[..section_len - 2];
                            return Ok((consumed + section_len, Some(BodyEvent::Trailers(fields))));
                        }
                    },
                },
            }
        }
    }

    /// The peer closed the stream.
    ///
    /// Ok(()) means the body ended properly: always for UntilClose (the close is its end, and
    /// no End event follows), and for any body that was already complete. Otherwise the body
    /// was cut short: Err(PrematureEnd).
    pub fn finish(&mut self) -> Result<(), BodyError> {
        match self.state {
            State::UntilClose | State::End | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            State::Failed(error) => Err(error),
            State::Length(_)
            | State::ChunkSize
            | State::ChunkData(_)
            | State::ChunkDataEnd
            | State::Trailers => self.fail(BodyError::PrematureEnd),
        }
    }

    /// Whether the body is complete: End was emitted, or [`BodyDecoder::finish`] returned Ok.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// For Length: bytes still expected; None for other kinds and after an error.
    pub fn remaining(&self) -> Option<u64> {
        match (self.kind, self.state) {
            (BodyKind::Length(_), State::Length(remaining)) => Some(remaining),
            (BodyKind::Length(_), State::Failed(_)) => None,
            (BodyKind::Length(_), _) => Some(0),
            _ => None,
        }
    }

    fn fail<T>(&mut self, error: BodyError) -> Result<T, BodyError> {
        self.state = State::Failed(error);
        Err(error)
    }
}

/// Up to `limit` bytes from the front of `input` and how many would still be due after them,
/// or None when there is nothing to take.
fn take(input: &[u8], limit: u64) -> Option<(&[u8], u64)> {
    if input.is_empty() {
        return None;
    }
    let available = u64::try_from(input.len()).unwrap_or(u64::MAX);
    let taken = available.min(limit);
    // `taken` is at most input.len(), so it fits in usize.
    let data = &input[..usize::try_from(taken).unwrap_or(input.len())];
    Some((data, limit - taken))
}

/// Length of the chunk-size line and the size it announces, or None until the line is whole.
///
/// httparse is lenient in ways that matter to a proxy: it reads an empty line or a bare
/// `;ext` as size 0, and lets a bare LF through inside extensions. Both would let two hops
/// disagree on where the body ends, so the line must start with a hex digit and end in CRLF,
/// with no LF before that.
fn chunk_size_line(input: &[u8]) -> Result<Option<(usize, u64)>, BodyError> {
    let window = &input[..input.len().min(MAX_CHUNK_HEAD_BYTES)];
    let Some(&first) = window.first() else {
        return Ok(None);
    };
    if !first.is_ascii_hexdigit() {
        return Err(BodyError::InvalidChunkSize);
    }
    let Some(newline) = window.iter().position(|&byte| byte == b'\n') else {
        // Fail early on bytes that can never become a valid line rather than waiting for 8 KiB.
        return match httparse::parse_chunk_size(window) {
            Err(_) => Err(BodyError::InvalidChunkSize),
            Ok(_) if window.len() >= MAX_CHUNK_HEAD_BYTES => Err(BodyError::ChunkHeadTooLong),
            Ok(_) => Ok(None),
        };
    };
    let line = &window[..=newline];
    if newline == 0 || line[newline - 1] != b'\r' {
        return Err(BodyError::InvalidChunkSize);
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((len, size))) if len == line.len() => Ok(Some((len, size))),
        _ => Err(BodyError::InvalidChunkSize),
    }
}

/// Length of the trailer section including its final empty line, or None until it is whole.
///
/// Trailer lines are forwarded verbatim, so bare LF line endings are refused: the next hop
/// might not split lines the same way.
fn trailer_section(input: &[u8]) -> Result<Option<usize>, BodyError> {
    let window = &input[..input.len().min(MAX_TRAILER_BYTES)];
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match httparse::parse_headers(window, &mut slots) {
        Ok(httparse::Status::Complete((len, _))) => {
            let section = &window[..len];
            let bare_newline = section
                .iter()
                .enumerate()
                .any(|(index, &byte)| byte == b'\n' && (index == 0 || section[index - 1] != b'\r'));
            if bare_newline || len < 4 {
                return Err(BodyError::InvalidTrailers);
            }
            Ok(Some(len))
        }
        Ok(httparse::Status::Partial) if window.len() >= MAX_TRAILER_BYTES => {
            Err(BodyError::TrailersTooLarge)
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(BodyError::TrailersTooLarge),
        Err(_) => Err(BodyError::InvalidTrailers),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` in pieces of `step` bytes and returns the payload bytes counted.
    fn delivered_in_steps(kind: BodyKind, input: &[u8], step: usize) -> u64 {
        let mut decoder = BodyDecoder::new(kind);
        let mut buffered = Vec::new();
        for piece in input.chunks(step) {
            buffered.extend_from_slice(piece);
            loop {
                let (consumed, event) = decoder.decode(&buffered).expect("valid body");
                let more = event.is_some();
                buffered.drain(..consumed);
                if !more {
                    break;
                }
            }
        }
        decoder.delivered()
    }

    #[test]
    fn delivered_counts_the_payload_not_the_framing() {
        let chunked = b"3\r\nabc\r\n10;ext=1\r\n0123456789abcdef\r\n0\r\nx-sum: 9\r\n\r\n";
        for step in [1, 2, 7, chunked.len()] {
            assert_eq!(delivered_in_steps(BodyKind::Chunked, chunked, step), 19);
            assert_eq!(delivered_in_steps(BodyKind::Length(5), b"hello", step), 5);
            assert_eq!(delivered_in_steps(BodyKind::UntilClose, b"hello!", step), 6);
        }
        assert_eq!(delivered_in_steps(BodyKind::Empty, b"", 1), 0);
    }

    #[test]
    fn chunk_size_lines() {
        assert_eq!(chunk_size_line(b""), Ok(None));
        assert_eq!(chunk_size_line(b"1"), Ok(None));
        assert_eq!(chunk_size_line(b"1a\r"), Ok(None));
        assert_eq!(chunk_size_line(b"1a\r\nxx"), Ok(Some((4, 26))));
        assert_eq!(chunk_size_line(b"1a;name=value\r\n"), Ok(Some((15, 26))));
        assert_eq!(chunk_size_line(b"1a ; name=\"q\"\r\n"), Ok(Some((15, 26))));
        assert_eq!(chunk_size_line(b"\r\n"), Err(BodyError::InvalidChunkSize));
        assert_eq!(chunk_size_line(b";x\r\n"), Err(BodyError::InvalidChunkSize));
        assert_eq!(chunk_size_line(b"5\n"), Err(BodyError::InvalidChunkSize));
        assert_eq!(
            chunk_size_line(b"5;a\nb\r\n"),
            Err(BodyError::InvalidChunkSize)
        );
        assert_eq!(chunk_size_line(b"5z"), Err(BodyError::InvalidChunkSize));
        assert_eq!(chunk_size_line(b"-5\r\n"), Err(BodyError::InvalidChunkSize));
        assert_eq!(
            chunk_size_line(b"5 6\r\n"),
            Err(BodyError::InvalidChunkSize)
        );
        assert_eq!(
            chunk_size_line(b"fffffffffffffffff\r\n"),
            Err(BodyError::InvalidChunkSize)
        );
        assert_eq!(
            chunk_size_line(b"fffffffffffffff\r\n"),
            Ok(Some((17, 0x0fff_ffff_ffff_ffff)))
        );
    }

    #[test]
    fn chunk_head_limit() {
        let mut line = b"5;".to_vec();
        line.resize(MAX_CHUNK_HEAD_BYTES - 2, b'x');
        line.extend_from_slice(b"\r\n");
        assert_eq!(line.len(), MAX_CHUNK_HEAD_BYTES);
        assert_eq!(chunk_size_line(&line), Ok(Some((MAX_CHUNK_HEAD_BYTES, 5))));
        assert_eq!(chunk_size_line(&line[..line.len() - 1]), Ok(None));

        let mut longer = b"5;".to_vec();
        longer.resize(MAX_CHUNK_HEAD_BYTES - 1, b'x');
        longer.extend_from_slice(b"\r\n");
        assert_eq!(chunk_size_line(&longer), Err(BodyError::ChunkHeadTooLong));
    }

    #[test]
    fn trailer_sections() {
        assert_eq!(trailer_section(b"a: b\r\n"), Ok(None));
        assert_eq!(trailer_section(b"a: b\r\n\r\nrest"), Ok(Some(8)));
        assert_eq!(
            trailer_section(b"a: b\n\r\n"),
            Err(BodyError::InvalidTrailers)
        );
        assert_eq!(
            trailer_section(b"a b\r\n\r\n"),
            Err(BodyError::InvalidTrailers)
        );
        assert_eq!(
            trailer_section(b" a: b\r\n\r\n"),
            Err(BodyError::InvalidTrailers)
        );
    }

    #[test]
    fn take_bounds() {
        assert_eq!(take(b"", 5), None);
        assert_eq!(take(b"abc", 5), Some((&b"abc"[..], 2)));
        assert_eq!(take(b"abcdef", 5), Some((&b"abcde"[..], 0)));
    }
}
