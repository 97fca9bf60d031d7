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
