//! The checks behind the kactivator-h1 fuzz targets, shared by libFuzzer and the replay fallback.
//!
//! Each check must hold for every input: the library may reject bytes, but it must never
//! panic, never hand back more than it was given, and never disagree with itself about a head
//! depending on how many bytes were available.

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

use kactivator_h1::{
    encode_chunk, encode_last_chunk, parse_request as parse_request_head,
    parse_response as parse_response_head, BodyDecoder, BodyEvent, BodyKind, Method, Parsed,
    RequestHead, ResponseHead, Span, MAX_HEADERS, MAX_HEAD_BYTES,
};

/// Parse arbitrary bytes as a request head.
pub fn parse_request(data: &[u8]) {
    let mut head = RequestHead::default();
    if parse_request_head(data, &mut head) != Ok(Parsed::Complete) {
        return;
    }
    assert!(head.len <= data.len() && head.len <= MAX_HEAD_BYTES);
    assert!(head.headers.len() <= MAX_HEADERS);
    assert_ne!(head.body, BodyKind::UntilClose);
    let inside = |span: Span| span.start <= span.end && span.end as usize <= head.len;
    assert!(inside(head.method_span) && inside(head.target));
    for header in &head.headers {
        assert!(inside(header.name) && inside(header.value));
    }
    if let Some(upgrade) = head.upgrade {
        assert!(inside(upgrade) && head.connection.upgrade);
    }
    if let Some(authority) = head.authority {
        assert!(inside(authority));
    }

    // The verdict depends only on the head's own bytes, and any shorter prefix is Partial.
    let mut again = RequestHead::default();
    assert_eq!(
        parse_request_head(&data[..head.len], &mut again),
        Ok(Parsed::Complete)
    );
    assert_eq!(format!("{head:?}"), format!("{again:?}"));
    for end in [head.len - 1, head.len / 2] {
        assert_eq!(
            parse_request_head(&data[..end], &mut again),
            Ok(Parsed::Partial),
            "prefix of {end} bytes"
        );
    }
}

/// First byte picks the request method, the rest is parsed as a response head.
pub fn parse_response(data: &[u8]) {
    let Some((&selector, data)) = data.split_first() else {
        return;
    };
    let method = match selector % 4 {
        0 => Method::Get,
        1 => Method::Head,
        2 => Method::Connect,
        _ => Method::Post,
    };
    let mut head = ResponseHead::default();
    if parse_response_head(data, method, &mut head) != Ok(Parsed::Complete) {
        return;
    }
    assert!(head.len <= data.len() && head.len <= MAX_HEAD_BYTES);
    assert!((100..=999).contains(&head.status));
    let inside = |span: Span| span.start <= span.end && span.end as usize <= head.len;
    assert!(inside(head.reason));
    for header in &head.headers {
        assert!(inside(header.name) && inside(header.value));
    }
    if method == Method::Head || head.is_informational() || head.status == 204 {
        assert_eq!(head.body, BodyKind::Empty);
    }
    if head.body == BodyKind::UntilClose {
        assert!(!head.keep_alive());
    }

    let mut again = ResponseHead::default();
    assert_eq!(
        parse_response_head(&data[..head.len], method, &mut again),
        Ok(Parsed::Complete)
    );
    assert_eq!(format!("{head:?}"), format!("{again:?}"));
    assert_eq!(
        parse_response_head(&data[..head.len - 1], method, &mut again),
        Ok(Parsed::Partial)
    );
}

/// What one decoding run produced.
#[derive(Debug, Default, PartialEq, Eq)]
struct Decoded {
    data: Vec<u8>,
    trailers: Vec<u8>,
    ends: usize,
    failed: bool,
}

/// Byte 0 picks the body kind (for Length, bytes 1 and 2 are the length); the next byte seeds
/// the read sizes; the rest is the stream, fed in pieces as a connection would.
pub fn body_decoder(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (kind, rest) = match selector % 4 {
        0 => (BodyKind::Chunked, rest),
        1 => (BodyKind::UntilClose, rest),
        2 => (BodyKind::Empty, rest),
        _ => match rest {
            [low, high, rest @ ..] => (
                BodyKind::Length(u64::from(u16::from_le_bytes([*low, *high]))),
                rest,
            ),
            _ => return,
        },
    };
    let Some((&seed, stream)) = rest.split_first() else {
        return;
    };
    let decoded = feed(kind, stream, seed);
    assert!(decoded.data.len() + decoded.trailers.len() <= stream.len());
    assert!(decoded.ends <= 1);
    match kind {
        BodyKind::Empty => assert!(decoded.data.is_empty() && decoded.ends == 1),
        BodyKind::Length(length) => {
            assert!(decoded.data.len() as u64 <= length);
            if (stream.len() as u64) >= length {
                assert_eq!(decoded.data.len() as u64, length);
                assert_eq!(decoded.ends, 1);
            }
        }
        BodyKind::UntilClose => assert_eq!(decoded.data, stream),
        BodyKind::Chunked => {}
    }

    // A chunked body that decoded cleanly must survive re-encoding, whatever the read sizes.
    if kind == BodyKind::Chunked && decoded.ends == 1 {
        let mut encoded = Vec::new();
        for piece in decoded.data.chunks(usize::from(seed) + 1) {
            encode_chunk(piece, &mut encoded);
        }
        encode_last_chunk(Some(&decoded.trailers), &mut encoded);
        let again = feed(kind, &encoded, seed.wrapping_add(1));
        assert_eq!(again, decoded);
    }
}

/// Decode `stream` in pieces whose sizes come from a small generator seeded by `seed`.
fn feed(kind: BodyKind, stream: &[u8], seed: u8) -> Decoded {
    let mut decoder = BodyDecoder::new(kind);
    let mut buffer = Vec::new();
    let mut decoded = Decoded::default();
    let mut generator = u32::from(seed) | 0x100;
    let mut offset = 0;
    // At least one round even for an empty stream: Empty and Length(0) end without input.
    let mut first_round = true;
    while first_round || offset < stream.len() {
        first_round = false;
        generator ^= generator << 13;
        generator ^= generator >> 17;
        generator ^= generator << 5;
        let size = 1 + (generator % 64) as usize;
        let end = (offset + size).min(stream.len());
        buffer.extend_from_slice(&stream[offset..end]);
        offset = end;
        loop {
            let Ok((consumed, event)) = decoder.decode(&buffer) else {
                decoded.failed = true;
                return decoded;
            };
            assert!(consumed <= buffer.len());
            let idle = consumed == 0 && event.is_none();
            match event {
                Some(BodyEvent::Data(data)) => {
                    assert!(!data.is_empty() && data.len() <= consumed);
                    decoded.data.extend_from_slice(data);
                }
                Some(BodyEvent::Trailers(trailers)) => {
                    assert!(trailers.len() <= consumed && trailers.ends_with(b"\r\n"));
                    decoded.trailers.extend_from_slice(trailers);
                }
                Some(BodyEvent::End) => {
                    decoded.ends += 1;
                    assert!(decoder.is_done());
                }
                None => {}
            }
            let framing_only = consumed > 0 && event.is_none();
            buffer.drain(..consumed);
            if framing_only {
                // (n, None) promises that nothing more can be decoded without new input.
                assert_eq!(decoder.decode(&buffer), Ok((0, None)));
                break;
            }
            if idle {
                break;
            }
        }
    }
    // Nothing is left to read: whatever finish says, it must not panic.
    let _ = decoder.finish();
    decoded
}

/// Entry point of the targets when not built by cargo-fuzz: run `check` over every file named
/// on the command line, and every file inside every directory named there.
pub fn replay_main(check: fn(&[u8])) -> ExitCode {
    let mut count = 0usize;
    for argument in std::env::args_os().skip(1) {
        match replay(Path::new(&argument), check) {
            Ok(files) => count += files,
            Err(error) => {
                eprintln!("{}: {error}", Path::new(&argument).display());
                return ExitCode::FAILURE;
            }
        }
    }
    if count == 0 {
        eprintln!("usage: TARGET FILE_OR_DIRECTORY... (no inputs were found)");
        return ExitCode::FAILURE;
    }
    println!("replayed {count} inputs");
    ExitCode::SUCCESS
}

fn replay(path: &Path, check: fn(&[u8])) -> std::io::Result<usize> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)?
            .map(|entry| entry.map(|entry| entry.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        let mut count = 0;
        for entry in entries {
            count += replay(&entry, check)?;
        }
        Ok(count)
    } else {
        check(&std::fs::read(path)?);
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed corpus passes every check.
    #[test]
    fn seeds() {
        let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
        type Check = fn(&[u8]);
        let targets: [(&str, Check); 3] = [
            ("parse_request", parse_request),
            ("parse_response", parse_response),
            ("body_decoder", body_decoder),
        ];
        for (name, check) in targets {
            let count = replay(&seeds.join(name), check).unwrap();
            assert!(count > 0, "no seeds for {name}");
        }
    }
}
