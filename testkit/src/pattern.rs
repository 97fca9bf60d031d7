//! The deterministic byte pattern served by `/bytes` and `/chunked`, and the cheap
//! order-sensitive checksum reported by `/sink`.
//!
//! Byte `i` of every pattern stream is `i % 251`. 251 is prime and not a power of two, so a
//! dropped, duplicated or reordered frame of any power-of-two size shifts the pattern and
//! is caught. The checksum weights each byte by `i % 7 + 1`, which makes it sensitive to
//! order as well as content while staying a single multiply-add per byte.

use std::sync::OnceLock;

use bytes::Bytes;

/// Period of the byte pattern.
pub const PATTERN_PERIOD: u64 = 251;

/// Period of the checksum weights.
const WEIGHT_PERIOD: u64 = 7;

/// Period of the product of pattern byte and weight (251 and 7 are coprime).
const COMBINED_PERIOD: u64 = PATTERN_PERIOD * WEIGHT_PERIOD;

/// Size of the frames in which pattern bodies are produced.
pub const FRAME_SIZE: usize = 64 * 1024;

/// Byte `index` of the pattern.
pub fn pattern_byte(index: u64) -> u8 {
    (index % PATTERN_PERIOD) as u8
}

/// The checksum that `/sink` reports for a body consisting of the first `length` pattern
/// bytes. Runs in constant time, because tests compare against multi-gigabyte streams.
pub fn pattern_checksum(length: u64) -> u64 {
    // The weighted term only depends on `index % COMBINED_PERIOD`, so whole periods can be
    // multiplied out; wrapping arithmetic keeps this equal to the byte-by-byte sum mod 2^64.
    static PERIOD_SUM: OnceLock<u64> = OnceLock::new();
    let period_sum = *PERIOD_SUM.get_or_init(|| {
        let mut checksum = Checksum::new();
        for index in 0..COMBINED_PERIOD {
            checksum.update(&[pattern_byte(index)]);
        }
        checksum.value()
    });
    let whole_periods = length / COMBINED_PERIOD;
    let mut tail = Checksum::starting_at(whole_periods * COMBINED_PERIOD);
    for index in 0..length % COMBINED_PERIOD {
        tail.update(&[pattern_byte(index)]);
    }
    whole_periods
        .wrapping_mul(period_sum)
        .wrapping_add(tail.value())
}

/// Checksum of a complete byte slice, as `/sink` would report it.
pub fn checksum(data: &[u8]) -> u64 {
    let mut checksum = Checksum::new();
    checksum.update(data);
    checksum.value()
}

/// Incremental form of the `/sink` checksum, for bodies that arrive in pieces.
#[derive(Clone, Copy, Debug, Default)]
pub struct Checksum {
    position: u64,
    sum: u64,
}

impl Checksum {
    /// A checksum over zero bytes.
    pub fn new() -> Self {
        Self::default()
    }

    /// A checksum whose next byte has stream position `position`; only the weight of the
    /// following bytes depends on it, the sum starts at zero.
    fn starting_at(position: u64) -> Self {
        Self { position, sum: 0 }
    }

    /// Feeds the next bytes of the stream.
    pub fn update(&mut self, data: &[u8]) {
        // Track the weight incrementally instead of dividing once per byte: /sink runs this
        // over every byte of gigabyte uploads.
        let mut weight = self.position % WEIGHT_PERIOD + 1;
        let mut sum = self.sum;
        for &byte in data {
            sum = sum.wrapping_add(u64::from(byte) * weight);
            weight = if weight == WEIGHT_PERIOD {
                1
            } else {
                weight + 1
            };
        }
        self.sum = sum;
        self.position += data.len() as u64;
    }

    /// Number of bytes fed so far.
    pub fn bytes(&self) -> u64 {
        self.position
    }

    /// The checksum of the bytes fed so far.
    pub fn value(&self) -> u64 {
        self.sum
    }
}

/// Checks that `data` equals the pattern starting at stream position `offset`; returns
/// the position of the first mismatching byte.
pub fn find_pattern_mismatch(offset: u64, data: &[u8]) -> Option<u64> {
    data.iter()
        .zip(offset..)
        .find(|&(&byte, index)| byte != pattern_byte(index))
        .map(|(_, index)| index)
}

/// `length` pattern bytes starting at stream position `offset`, at most [`FRAME_SIZE`].
///
/// The result is a reference-counted slice of one shared buffer, so producing a frame
/// neither allocates nor copies: a 1 GiB response costs no more memory than a small one.
pub fn pattern_frame(offset: u64, length: usize) -> Bytes {
    assert!(
        length <= FRAME_SIZE,
        "pattern frames are at most {FRAME_SIZE} bytes"
    );
    static SHARED: OnceLock<Bytes> = OnceLock::new();
    let shared = SHARED.get_or_init(|| {
        // One period longer than a frame so that a frame can start at any phase.
        (0..FRAME_SIZE as u64 + PATTERN_PERIOD)
            .map(pattern_byte)
            .collect::<Vec<u8>>()
            .into()
    });
    let phase = (offset % PATTERN_PERIOD) as usize;
    shared.slice(phase..phase + length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_form_checksum_matches_byte_by_byte_sum() {
        for length in [0, 1, 250, 251, 1756, 1757, 1758, 10_000, 100_003] {
            let bytes: Vec<u8> = (0..length).map(pattern_byte).collect();
            assert_eq!(
                pattern_checksum(length),
                checksum(&bytes),
                "length {length}"
            );
        }
    }

    #[test]
    fn incremental_checksum_matches_single_update() {
        let bytes: Vec<u8> = (0..5000).map(pattern_byte).collect();
        let mut incremental = Checksum::new();
        for piece in bytes.chunks(13) {
            incremental.update(piece);
        }
        assert_eq!(incremental.value(), checksum(&bytes));
        assert_eq!(incremental.bytes(), 5000);
    }

    #[test]
    fn checksum_is_order_sensitive() {
        assert_ne!(checksum(&[1, 2]), checksum(&[2, 1]));
    }

    #[test]
    fn frames_continue_the_pattern_at_any_offset() {
        for offset in [0, 1, 250, 251, 65_536, 1 << 30] {
            let frame = pattern_frame(offset, FRAME_SIZE);
            assert_eq!(frame.len(), FRAME_SIZE);
            assert_eq!(
                find_pattern_mismatch(offset, &frame),
                None,
                "offset {offset}"
            );
        }
    }
}
