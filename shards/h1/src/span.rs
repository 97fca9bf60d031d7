//! Byte ranges into a caller's buffer, so parsed heads borrow nothing and can be reused.

/// Byte range into the buffer that was parsed. u32 offsets.
///
/// Heads are at most [`crate::MAX_HEAD_BYTES`] long, so u32 is plenty and halves the size of
/// the per-header bookkeeping compared with usize.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// Offset of the first byte.
    pub start: u32,
    /// Offset one past the last byte.
    pub end: u32,
}

impl Span {
    /// The bytes this span covers in `buf`.
    ///
    /// Returns an empty slice rather than panicking when `buf` is not the buffer the span came
    /// from and is too short for it.
    pub fn of<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        buf.get(self.start as usize..self.end as usize)
            .unwrap_or(&[])
    }

    /// Whether the span covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// Number of bytes covered.
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start) as usize
    }

    /// The span of `part` inside `whole`, or an empty span when `part` does not lie inside it.
    ///
    /// httparse hands back sub-slices of the buffer; this turns them back into offsets. The
    /// containment check matters because httparse substitutes a static `""` in a few places.
    pub(crate) fn within(whole: &[u8], part: &[u8]) -> Span {
        let whole_start = whole.as_ptr() as usize;
        let part_start = part.as_ptr() as usize;
        match part_start.checked_sub(whole_start) {
            Some(offset)
                if offset
                    .checked_add(part.len())
                    .is_some_and(|end| end <= whole.len()) =>
            {
                Span::from_range(offset, part.len())
            }
            _ => Span::default(),
        }
    }

    /// Offsets are bounded by [`crate::MAX_HEAD_BYTES`] at every call site, so saturating is
    /// only a guard against misuse, never a silent truncation in practice.
    pub(crate) fn from_range(start: usize, len: usize) -> Span {
        let start = u32::try_from(start).unwrap_or(u32::MAX);
        let end = u32::try_from(len).map_or(u32::MAX, |len| start.saturating_add(len));
        Span { start, end }
    }
}

/// Where one header field's name and value sit in the parsed buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderSpan {
    /// The field name, as sent (case preserved).
    pub name: Span,
    /// The field value, without leading and trailing whitespace.
    pub value: Span,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_is_total() {
        let span = Span { start: 2, end: 10 };
        assert_eq!(span.of(b"abc"), b"");
        assert_eq!(span.of(b"0123456789"), b"23456789");
        let backwards = Span { start: 5, end: 1 };
        assert!(backwards.is_empty());
        assert_eq!(backwards.of(b"0123456789"), b"");
        assert_eq!(backwards.len(), 0);
    }

    #[test]
    fn within_rejects_foreign_slices() {
        let buf = b"hello world";
        assert_eq!(Span::within(buf, &buf[6..]), Span { start: 6, end: 11 });
        assert_eq!(Span::within(buf, &buf[11..]), Span { start: 11, end: 11 });
        assert_eq!(Span::within(buf, b"static"), Span::default());
    }
}

/// Whether the field name `name` is `known`, ignoring ASCII case, compared eight bytes at a time.
///
/// Exact when `name` is a token (every field name a parser or `http::HeaderName` hands over is)
/// and `known` is made of letters, digits and `-` (every name this proxy looks for): setting bit
/// 0x20 maps a letter to its lower case and any other token character to itself or to a
/// character no token holds, so no two different token characters meet. The standard
/// `eq_ignore_ascii_case` goes byte by byte, which the names looked up on every request (24 and
/// 25 bytes for the Knative revision headers) paid for on every field.
#[inline]
pub fn name_eq(name: &[u8], known: &[u8]) -> bool {
    debug_assert!(known
        .iter()
        .all(|byte| byte.is_ascii_alphanumeric() || *byte == b'-'));
    if name.len() != known.len() {
        return false;
    }
    const FOLD: u64 = 0x2020_2020_2020_2020;
    let mut names = name.chunks_exact(8);
    let mut knowns = known.chunks_exact(8);
    for (word, known_word) in (&mut names).zip(&mut knowns) {
        // Both chunks are exactly eight bytes long (`chunks_exact`).
        let word = u64::from_le_bytes(word.try_into().unwrap_or_default());
        let known_word = u64::from_le_bytes(known_word.try_into().unwrap_or_default());
        if word | FOLD != known_word | FOLD {
            return false;
        }
    }
    names
        .remainder()
        .iter()
        .zip(knowns.remainder())
        .all(|(byte, known_byte)| byte | 0x20 == known_byte | 0x20)
}

#[cfg(test)]
mod name_tests {
    use super::name_eq;

    #[test]
    fn names_match_in_any_case_and_nothing_else_does() {
        assert!(name_eq(
            b"Knative-Serving-Namespace",
            b"knative-serving-namespace"
        ));
        assert!(name_eq(
            b"KNATIVE-SERVING-REVISION",
            b"Knative-Serving-Revision"
        ));
        assert!(name_eq(b"te", b"TE"));
        assert!(!name_eq(
            b"Knative-Serving-Namespacf",
            b"knative-serving-namespace"
        ));
        assert!(!name_eq(
            b"xnative-serving-namespace",
            b"knative-serving-namespace"
        ));
        assert!(!name_eq(b"host", b"hosts"));
        // Token characters that are not letters stay themselves: `_` is not `-`, `.` is not
        // `-`, `^` and `~` are not letters, digits keep their place.
        assert!(!name_eq(b"x_request_id", b"x-request-id"));
        assert!(!name_eq(b"x.request.id", b"x-request-id"));
        assert!(!name_eq(b"x-request-id1", b"x-request-id2"));
        assert!(!name_eq(b"content-length^", b"content-length1"));
    }

    #[test]
    fn every_token_pair_that_matches_is_the_same_letter_or_the_same_byte() {
        const TOKEN_EXTRA: &[u8] = b"!#$%&'*+-.^_`|~";
        let tokens: Vec<u8> = (0u8..=127)
            .filter(|byte| byte.is_ascii_alphanumeric() || TOKEN_EXTRA.contains(byte))
            .collect();
        let known: Vec<u8> = (0u8..=127)
            .filter(|byte| byte.is_ascii_alphanumeric() || *byte == b'-')
            .collect();
        for &byte in &tokens {
            for &known_byte in &known {
                // Padded to nine bytes, so both the word loop and the tail see each pair.
                for at in [0usize, 8] {
                    let mut name = *b"aaaaaaaaa";
                    let mut sought = *b"aaaaaaaaa";
                    name[at] = byte;
                    sought[at] = known_byte;
                    assert_eq!(
                        name_eq(&name, &sought),
                        byte.eq_ignore_ascii_case(&known_byte),
                        "{:?} against {:?}",
                        byte as char,
                        known_byte as char
                    );
                }
            }
        }
    }
}
