//! Moving a body from one side to the other: decode the incoming framing, write the outgoing
//! one (chunked or raw), a buffer's worth at a time. Pure: the caller owns the sockets.

use kactivator_h1::{encode_chunk, encode_last_chunk, BodyDecoder, BodyError, BodyEvent};

use crate::runtime::buffer::InBuf;

/// Flush to the socket once this much is buffered.
pub const WRITE_CHUNK: usize = 64 * 1024;

/// How far [`reframe`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reframed {
    /// The body ended; its end is framed in the output.
    Finished,
    /// The output holds a write's worth; undecoded input may remain.
    OutputFull,
    /// Everything buffered was used; read more.
    NeedInput,
}

/// Moves decoded body bytes from `input` into `out` in the outgoing framing (chunked or raw),
/// until the output holds a write's worth, the input runs dry, or the body ends. Trailers are
/// kept and written with the last chunk.
pub fn reframe(
    decoder: &mut BodyDecoder,
    input: &mut InBuf,
    chunked: bool,
    trailers: &mut Option<Vec<u8>>,
    out: &mut Vec<u8>,
) -> Result<Reframed, BodyError> {
    loop {
        let (consumed, event) = decoder.decode(input.data())?;
        match event {
            Some(BodyEvent::Data(data)) => {
                if chunked {
                    encode_chunk(data, out);
                } else {
                    out.extend_from_slice(data);
                }
                input.consume(consumed);
                if out.len() >= WRITE_CHUNK {
                    return Ok(Reframed::OutputFull);
                }
            }
            Some(BodyEvent::Trailers(raw)) => {
                *trailers = Some(raw.to_vec());
                input.consume(consumed);
            }
            Some(BodyEvent::End) => {
                input.consume(consumed);
                if chunked {
                    encode_last_chunk(trailers.as_deref(), out);
                }
                return Ok(Reframed::Finished);
            }
            None => {
                input.consume(consumed);
                return Ok(Reframed::NeedInput);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kactivator_h1::BodyKind;

    #[test]
    fn reframing_stops_at_a_full_output_without_dropping_the_buffered_end() {
        // One chunk larger than a write, with the body's end already in the same buffer.
        let size = WRITE_CHUNK + 100;
        let mut raw = format!("{size:x}\r\n").into_bytes();
        raw.extend(std::iter::repeat_n(b'x', size));
        raw.extend_from_slice(b"\r\n0\r\n\r\nNEXT");
        let mut input = InBuf::with_capacity(raw.len());
        input.extend_for_test(&raw);
        let mut decoder = BodyDecoder::new(BodyKind::Chunked);
        let (mut trailers, mut out) = (None, Vec::new());
        let first = reframe(&mut decoder, &mut input, false, &mut trailers, &mut out).unwrap();
        assert_eq!(first, Reframed::OutputFull);
        out.clear();
        // The caller must come back before reading the socket: the end is here already.
        let second = reframe(&mut decoder, &mut input, false, &mut trailers, &mut out).unwrap();
        assert_eq!(second, Reframed::Finished);
        assert_eq!(
            input.data(),
            b"NEXT",
            "the next message's bytes stay buffered"
        );
    }

    #[test]
    fn chunked_output_carries_trailers_in_the_last_chunk() {
        let raw = b"3\r\nabc\r\n0\r\nx-sum: 1\r\n\r\n";
        let mut input = InBuf::with_capacity(raw.len());
        input.extend_for_test(raw);
        let mut decoder = BodyDecoder::new(BodyKind::Chunked);
        let (mut trailers, mut out) = (None, Vec::new());
        assert_eq!(
            reframe(&mut decoder, &mut input, true, &mut trailers, &mut out).unwrap(),
            Reframed::Finished
        );
        assert_eq!(out, b"3\r\nabc\r\n0\r\nx-sum: 1\r\n\r\n");
    }
}
