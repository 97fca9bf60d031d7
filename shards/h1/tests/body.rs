//! Body decoding and chunked encoding: fixed cases, exhaustive splits, and round-trip properties.

use kactivator_h1::{
    encode_chunk, encode_chunk_end, encode_chunk_header, encode_last_chunk, BodyDecoder, BodyError,
    BodyEvent, BodyKind,
};
use proptest::prelude::*;

/// Everything a decoder produced from a sequence of reads.
#[derive(Debug, Default, PartialEq, Eq)]
struct Decoded {
    data: Vec<u8>,
    trailers: Vec<u8>,
    trailer_events: usize,
    ends: usize,
    /// Bytes the decoder left in the buffer: they belong to the next message.
    unconsumed: Vec<u8>,
}

/// Feed `pieces` the way a connection would: append each read to a buffer, then run the
/// decode loop until the decoder asks for more. With `eof`, the peer closes after the last
/// piece.
fn decode_pieces(kind: BodyKind, pieces: &[&[u8]], eof: bool) -> Result<Decoded, BodyError> {
    let mut decoder = BodyDecoder::new(kind);
    let mut buffer = Vec::new();
    let mut decoded = Decoded::default();
    let mut rounds = 0;
    for piece in pieces {
        buffer.extend_from_slice(piece);
        loop {
            rounds += 1;
            assert!(rounds < 100_000, "decoder does not make progress");
            let (consumed, event) = decoder.decode(&buffer)?;
            assert!(consumed <= buffer.len());
            let idle = consumed == 0 && event.is_none();
            match event {
                Some(BodyEvent::Data(data)) => {
                    assert!(!data.is_empty(), "empty Data event");
                    assert!(data.len() <= consumed, "more data than consumed");
                    decoded.data.extend_from_slice(data);
                }
                Some(BodyEvent::Trailers(trailers)) => {
                    decoded.trailer_events += 1;
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
    if eof {
        decoder.finish()?;
    }
    decoded.unconsumed = buffer;
    Ok(decoded)
}

fn decode_whole(kind: BodyKind, input: &[u8]) -> Result<Decoded, BodyError> {
    decode_pieces(kind, &[input], false)
}

/// Feed `input` one byte per read.
fn decode_bytewise(kind: BodyKind, input: &[u8]) -> Result<Decoded, BodyError> {
    let pieces: Vec<&[u8]> = input.chunks(1).collect();
    decode_pieces(kind, &pieces, false)
}

#[test]
fn empty_body_ends_at_once() {
    let mut decoder = BodyDecoder::new(BodyKind::Empty);
    assert!(!decoder.is_done());
    assert_eq!(decoder.decode(b"GET /next"), Ok((0, Some(BodyEvent::End))));
    assert!(decoder.is_done());
    assert_eq!(decoder.decode(b"GET /next"), Ok((0, None)));
    assert_eq!(decoder.finish(), Ok(()));

    let decoded = decode_whole(BodyKind::Length(0), b"next").unwrap();
    assert_eq!(decoded.ends, 1);
    assert_eq!(decoded.unconsumed, b"next");
}

#[test]
fn content_length_exact() {
    let mut decoder = BodyDecoder::new(BodyKind::Length(5));
    assert_eq!(decoder.remaining(), Some(5));
    assert_eq!(decoder.decode(b""), Ok((0, None)));
    assert_eq!(decoder.decode(b"he"), Ok((2, Some(BodyEvent::Data(b"he")))));
    assert_eq!(decoder.remaining(), Some(3));
    assert_eq!(
        decoder.decode(b"lloGET / HTTP/1.1"),
        Ok((3, Some(BodyEvent::Data(b"llo"))))
    );
    assert_eq!(decoder.remaining(), Some(0));
    assert!(!decoder.is_done());
    assert_eq!(
        decoder.decode(b"GET / HTTP/1.1"),
        Ok((0, Some(BodyEvent::End)))
    );
    assert!(decoder.is_done());
    assert_eq!(decoder.decode(b"GET / HTTP/1.1"), Ok((0, None)));

    let decoded = decode_whole(BodyKind::Length(5), b"helloPIPELINED").unwrap();
    assert_eq!(decoded.data, b"hello");
    assert_eq!(decoded.ends, 1);
    assert_eq!(decoded.unconsumed, b"PIPELINED");
}

#[test]
fn content_length_premature_end() {
    let mut decoder = BodyDecoder::new(BodyKind::Length(5));
    assert_eq!(
        decoder.decode(b"abc"),
        Ok((3, Some(BodyEvent::Data(b"abc"))))
    );
    assert_eq!(decoder.finish(), Err(BodyError::PrematureEnd));
    assert_eq!(decoder.decode(b"de"), Err(BodyError::PrematureEnd));
    assert_eq!(decoder.remaining(), None);
}

#[test]
fn until_close_and_finish() {
    let mut decoder = BodyDecoder::new(BodyKind::UntilClose);
    assert_eq!(decoder.remaining(), None);
    assert_eq!(
        decoder.decode(b"abc"),
        Ok((3, Some(BodyEvent::Data(b"abc"))))
    );
    assert_eq!(decoder.decode(b""), Ok((0, None)));
    assert!(!decoder.is_done());
    assert_eq!(decoder.finish(), Ok(()));
    assert!(decoder.is_done());
    assert_eq!(decoder.decode(b"more"), Ok((0, None)));

    let decoded = decode_pieces(BodyKind::UntilClose, &[b"a", b"bc", b"", b"d"], true).unwrap();
    assert_eq!(decoded.data, b"abcd");
    assert_eq!(decoded.ends, 0);
}

const CHUNKED_WITH_TRAILERS: &[u8] =
    b"5;name=value;quoted=\"a;b\"\r\nhello\r\n9 \r\n, world!!\r\n0;last\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\nNEXT";

#[test]
fn chunked_with_extensions_and_trailers() {
    let expected = Decoded {
        data: b"hello, world!!".to_vec(),
        trailers: b"X-Checksum: abc\r\nX-Other: 1\r\n".to_vec(),
        trailer_events: 1,
        ends: 1,
        unconsumed: b"NEXT".to_vec(),
    };
    assert_eq!(
        decode_whole(BodyKind::Chunked, CHUNKED_WITH_TRAILERS).unwrap(),
        expected
    );
    assert_eq!(
        decode_bytewise(BodyKind::Chunked, CHUNKED_WITH_TRAILERS).unwrap(),
        expected
    );
    // Every two-piece split, including inside size lines, CRLFs and trailers.
    for split in 0..=CHUNKED_WITH_TRAILERS.len() {
        let (first, second) = CHUNKED_WITH_TRAILERS.split_at(split);
        assert_eq!(
            decode_pieces(BodyKind::Chunked, &[first, second], false).unwrap(),
            expected,
            "split at {split}"
        );
    }
}

#[test]
fn chunked_without_trailers() {
    let input = b"3\r\nabc\r\n0\r\n\r\nNEXT";
    let expected = Decoded {
        data: b"abc".to_vec(),
        ends: 1,
        unconsumed: b"NEXT".to_vec(),
        ..Decoded::default()
    };
    assert_eq!(decode_whole(BodyKind::Chunked, input).unwrap(), expected);
    assert_eq!(decode_bytewise(BodyKind::Chunked, input).unwrap(), expected);

    let mut decoder = BodyDecoder::new(BodyKind::Chunked);
    assert_eq!(decoder.decode(b"0\r\n\r\n"), Ok((5, Some(BodyEvent::End))));
    assert!(decoder.is_done());
}

#[test]
fn chunked_errors() {
    let cases: &[(&[u8], BodyError)] = &[
        (b"g\r\n", BodyError::InvalidChunkSize),
        (b"5x\r\nhello\r\n", BodyError::InvalidChunkSize),
        (b"\r\n", BodyError::InvalidChunkSize),
        (b" 5\r\nhello\r\n", BodyError::InvalidChunkSize),
        (b"-1\r\n", BodyError::InvalidChunkSize),
        (b"5\nhello\r\n", BodyError::InvalidChunkSize),
        (b"fffffffffffffffff\r\n", BodyError::InvalidChunkSize),
        (b"10000000000000000\r\n", BodyError::InvalidChunkSize),
        (b"5\r\nhelloXY", BodyError::InvalidChunkTerminator),
        (b"5\r\nhello\n0\r\n\r\n", BodyError::InvalidChunkTerminator),
        (b"5\r\nhello!\r\n", BodyError::InvalidChunkTerminator),
        (b"0\r\nbad trailer\r\n\r\n", BodyError::InvalidTrailers),
        (b"0\r\nX: a\r\n b\r\n\r\n", BodyError::InvalidTrailers),
        (b"0\r\nX: a\n\r\n", BodyError::InvalidTrailers),
        (b"0\r\n\n", BodyError::InvalidTrailers),
    ];
    for (input, expected) in cases {
        assert_eq!(
            decode_whole(BodyKind::Chunked, input),
            Err(*expected),
            "{:?}",
            String::from_utf8_lossy(input)
        );
        assert_eq!(
            decode_bytewise(BodyKind::Chunked, input),
            Err(*expected),
            "bytewise {:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn errors_are_sticky() {
    let mut decoder = BodyDecoder::new(BodyKind::Chunked);
    assert_eq!(decoder.decode(b"zz"), Err(BodyError::InvalidChunkSize));
    assert_eq!(
        decoder.decode(b"5\r\nhello\r\n"),
        Err(BodyError::InvalidChunkSize)
    );
    assert_eq!(decoder.finish(), Err(BodyError::InvalidChunkSize));
    assert!(!decoder.is_done());
}

#[test]
fn chunked_limits() {
    let mut long_extension = b"5;".to_vec();
    long_extension.resize(kactivator_h1::MAX_CHUNK_HEAD_BYTES + 1, b'x');
    assert_eq!(
        decode_whole(BodyKind::Chunked, &long_extension),
        Err(BodyError::ChunkHeadTooLong)
    );

    let mut huge_trailers = b"0\r\n".to_vec();
    while huge_trailers.len() < kactivator_h1::MAX_TRAILER_BYTES + 100 {
        huge_trailers.extend_from_slice(b"X-Pad: 0123456789012345678901234567890123456789\r\n");
    }
    assert_eq!(
        decode_whole(BodyKind::Chunked, &huge_trailers),
        Err(BodyError::TrailersTooLarge)
    );

    let mut many_trailers = b"0\r\n".to_vec();
    for index in 0..=kactivator_h1::MAX_HEADERS {
        many_trailers.extend_from_slice(format!("X-{index}: v\r\n").as_bytes());
    }
    many_trailers.extend_from_slice(b"\r\n");
    assert_eq!(
        decode_whole(BodyKind::Chunked, &many_trailers),
        Err(BodyError::TrailersTooLarge)
    );
}

#[test]
fn chunked_premature_end() {
    let prefixes: &[&[u8]] = &[
        b"",
        b"5",
        b"5\r\n",
        b"5\r\nhel",
        b"5\r\nhello",
        b"5\r\nhello\r\n",
        b"0\r\n",
        b"0\r\nX: y\r\n",
    ];
    for prefix in prefixes {
        assert_eq!(
            decode_pieces(BodyKind::Chunked, &[prefix], true),
            Err(BodyError::PrematureEnd),
            "{:?}",
            String::from_utf8_lossy(prefix)
        );
    }
    let complete = decode_pieces(BodyKind::Chunked, &[b"0\r\n\r\n"], true).unwrap();
    assert_eq!(complete.ends, 1);
}

#[test]
fn encoder_output_decodes() {
    let mut encoded = Vec::new();
    encode_chunk(b"hello", &mut encoded);
    encode_chunk(b"", &mut encoded);
    encode_chunk_header(6, &mut encoded);
    encoded.extend_from_slice(b" world");
    encode_chunk_end(&mut encoded);
    encode_last_chunk(Some(b"X-T: 1\r\n"), &mut encoded);
    assert_eq!(encoded, b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\n");
    let decoded = decode_whole(BodyKind::Chunked, &encoded).unwrap();
    assert_eq!(decoded.data, b"hello world");
    assert_eq!(decoded.trailers, b"X-T: 1\r\n");
}

// ---- properties -------------------------------------------------------------------------

/// Split `input` at the given points (taken modulo its length).
fn split_at_points<'a>(input: &'a [u8], points: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = points
        .iter()
        .map(|point| point.index(input.len() + 1))
        .collect();
    cuts.push(0);
    cuts.push(input.len());
    cuts.sort_unstable();
    cuts.windows(2)
        .map(|pair| &input[pair[0]..pair[1]])
        .collect()
}

fn trailer_lines() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        ("[A-Za-z][A-Za-z0-9-]{0,10}", "([!-~]([ !-~]{0,20}[!-~])?)?"),
        0..4,
    )
    .prop_map(|fields| {
        let mut lines = Vec::new();
        for (name, value) in fields {
            lines.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        lines
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn chunked_round_trip(
        body in prop::collection::vec(any::<u8>(), 0..2048),
        chunk_points in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        extensions in prop::collection::vec(prop::option::of("[a-z]{1,6}(=[a-z0-9]{0,6})?"), 12),
        trailers in trailer_lines(),
        read_points in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
        next_message in prop::collection::vec(any::<u8>(), 0..32),
    ) {
        let mut encoded = Vec::new();
        for (index, chunk) in split_at_points(&body, &chunk_points).into_iter().enumerate() {
            match &extensions[index % extensions.len()] {
                Some(extension) if !chunk.is_empty() => {
                    encoded.extend_from_slice(format!("{:X};{extension}\r\n", chunk.len()).as_bytes());
                    encoded.extend_from_slice(chunk);
                    encode_chunk_end(&mut encoded);
                }
                _ => encode_chunk(chunk, &mut encoded),
            }
        }
        encode_last_chunk(Some(&trailers), &mut encoded);
        encoded.extend_from_slice(&next_message);

        let pieces = split_at_points(&encoded, &read_points);
        let decoded = decode_pieces(BodyKind::Chunked, &pieces, false).unwrap();
        prop_assert_eq!(&decoded.data, &body);
        prop_assert_eq!(decoded.ends, 1);
        prop_assert_eq!(&decoded.trailers, &trailers);
        prop_assert_eq!(decoded.trailer_events, usize::from(!trailers.is_empty()));
        prop_assert_eq!(&decoded.unconsumed, &next_message);
    }

    #[test]
    fn length_yields_exactly_n_bytes(
        body in prop::collection::vec(any::<u8>(), 0..2048),
        next_message in prop::collection::vec(any::<u8>(), 0..64),
        read_points in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let mut input = body.clone();
        input.extend_from_slice(&next_message);
        let pieces = split_at_points(&input, &read_points);
        let decoded = decode_pieces(BodyKind::Length(body.len() as u64), &pieces, false).unwrap();
        prop_assert_eq!(&decoded.data, &body);
        prop_assert_eq!(decoded.ends, 1);
        prop_assert_eq!(&decoded.unconsumed, &next_message);
    }

    #[test]
    fn decoder_is_total(
        kind in prop_oneof![
            Just(BodyKind::Empty),
            Just(BodyKind::Chunked),
            Just(BodyKind::UntilClose),
            (0u64..4096).prop_map(BodyKind::Length),
        ],
        input in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..512),
            prop::collection::vec(
                prop::sample::select(vec![&b"0"[..], b"5", b"f", b"\r", b"\n", b"\r\n", b";", b" ", b":", b"ab", b"X: y"]),
                0..64,
            ).prop_map(|parts| parts.concat()),
        ],
        read_points in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let pieces = split_at_points(&input, &read_points);
        if let Ok(decoded) = decode_pieces(kind, &pieces, false) {
            prop_assert!(decoded.data.len() + decoded.unconsumed.len() <= input.len());
            prop_assert!(decoded.ends <= 1);
        }
    }
}
