//! Interpretation of the header fields that decide framing and connection handling.

use crate::head::ConnectionTokens;
use crate::span::{name_eq, HeaderSpan, Span};

/// What one pass over the header fields learned.
#[derive(Debug, Default)]
pub(crate) struct FieldSummary {
    pub connection: ConnectionTokens,
    pub content_length: ContentLength,
    pub transfer_encoding: TransferEncoding,
    /// First Upgrade field value.
    pub upgrade: Option<Span>,
    pub expect_continue: bool,
    pub te_trailers: bool,
    /// How many Host fields there were (saturating).
    pub host_count: u8,
    /// First Host field value.
    pub host: Option<Span>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ContentLength {
    #[default]
    Absent,
    Valid(u64),
    Invalid,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TransferEncoding {
    pub present: bool,
    /// The last coding listed, across all Transfer-Encoding fields, is exactly `chunked`.
    pub chunked_last: bool,
    /// `chunked` appeared more than once, which RFC 9112 §6.1 forbids senders to do.
    pub chunked_repeated: bool,
    /// A list element that is not a token followed by optional parameters.
    pub malformed: bool,
    /// How many codings were listed, across all Transfer-Encoding fields (saturating).
    pub codings: u8,
}

impl TransferEncoding {
    /// Whether the coding list ends in a single `chunked` and is otherwise well formed.
    pub fn is_chunked(&self) -> bool {
        self.present && self.chunked_last && !self.chunked_repeated && !self.malformed
    }
}

pub(crate) fn summarize(buf: &[u8], headers: &[HeaderSpan]) -> FieldSummary {
    let mut summary = FieldSummary::default();
    let mut chunked_seen = false;
    for header in headers {
        let name = header.name.of(buf);
        let value = header.value.of(buf);
        // Dispatch on length first: almost every field is none of these, and this rejects
        // them with one comparison.
        match name.len() {
            10 if name_eq(name, b"connection") => {
                for token in list_elements(value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        summary.connection.close = true;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        summary.connection.keep_alive = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        summary.connection.upgrade = true;
                    }
                }
            }
            14 if name_eq(name, b"content-length") => {
                summary.content_length = merge_content_length(summary.content_length, value);
            }
            17 if name_eq(name, b"transfer-encoding") => {
                let encoding = &mut summary.transfer_encoding;
                encoding.present = true;
                for coding in list_elements(value) {
                    encoding.codings = encoding.codings.saturating_add(1);
                    let is_chunked = coding.eq_ignore_ascii_case(b"chunked");
                    if is_chunked {
                        encoding.chunked_repeated |= chunked_seen;
                        chunked_seen = true;
                    } else if !is_token(element_name(coding)) {
                        encoding.malformed = true;
                    }
                    encoding.chunked_last = is_chunked;
                }
            }
            // Every request has a Host field, so this arm runs on every parse: one word
            // compare instead of a byte loop.
            4 if is_host(name) => {
                summary.host_count = summary.host_count.saturating_add(1);
                summary.host.get_or_insert(header.value);
            }
            7 if name_eq(name, b"upgrade") => {
                summary.upgrade.get_or_insert(header.value);
            }
            6 if name_eq(name, b"expect") => {
                summary.expect_continue |= list_elements(value)
                    .any(|expectation| expectation.eq_ignore_ascii_case(b"100-continue"));
            }
            2 if name_eq(name, b"te") => {
                summary.te_trailers |= list_has_element(value, b"trailers");
            }
            _ => {}
        }
    }
    summary
}

/// `name` is `host` in any case. Setting bit 0x20 lowercases a letter and maps only `H` and `h`
/// to `h` (likewise for o, s, t), so the word compare is exact.
fn is_host(name: &[u8]) -> bool {
    match <[u8; 4]>::try_from(name) {
        Ok(word) => u32::from_le_bytes(word) | 0x2020_2020 == u32::from_le_bytes(*b"host"),
        Err(_) => false,
    }
}

/// Fold one more Content-Length field into what earlier fields said.
///
/// Repeats and comma lists are tolerated only when every value is the same number
/// (RFC 9112 §6.3 item 5); anything else is a framing ambiguity and is refused.
fn merge_content_length(so_far: ContentLength, value: &[u8]) -> ContentLength {
    let mut merged = so_far;
    if value.is_empty() {
        return ContentLength::Invalid;
    }
    for element in value.split(|&byte| byte == b',') {
        let number = match parse_decimal(trim_whitespace(element)) {
            Some(number) => number,
            None => return ContentLength::Invalid,
        };
        merged = match merged {
            ContentLength::Absent => ContentLength::Valid(number),
            ContentLength::Valid(previous) if previous == number => merged,
            ContentLength::Valid(_) | ContentLength::Invalid => return ContentLength::Invalid,
        };
    }
    merged
}

/// Plain ASCII decimal: no sign, no inner whitespace, no empty string, no overflow.
pub(crate) fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |number, &byte| {
        if !byte.is_ascii_digit() {
            return None;
        }
        number.checked_mul(10)?.checked_add(u64::from(byte - b'0'))
    })
}

fn trim_whitespace(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// Whether the comma-separated list `value` has an element named `name` (its parameters aside),
/// compared without regard to ASCII case: `TE: trailers`, `TE: gzip, trailers;q=1`.
pub fn list_has_element(value: &[u8], name: &[u8]) -> bool {
    list_elements(value).any(|element| element_name(element).eq_ignore_ascii_case(name))
}

/// The part of a list element before its parameters.
fn element_name(element: &[u8]) -> &[u8] {
    let end = element
        .iter()
        .position(|&byte| byte == b';')
        .unwrap_or(element.len());
    trim_whitespace(&element[..end])
}

/// RFC 9110 §5.6.2 token characters.
fn is_token(bytes: &[u8]) -> bool {
    !bytes.is_empty()
        && bytes
            .iter()
            .all(|&byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

/// Elements of a comma-separated field value (RFC 9110 §5.6.1), trimmed, empty ones skipped.
///
/// Commas inside quoted strings (possible in parameters) do not split, so a parameter value
/// cannot smuggle in a fake `chunked` element.
pub(crate) fn list_elements(value: &[u8]) -> ListElements<'_> {
    ListElements { rest: value }
}

pub(crate) struct ListElements<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for ListElements<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        while !self.rest.is_empty() {
            let mut in_quotes = false;
            let mut escaped = false;
            let mut end = self.rest.len();
            for (index, &byte) in self.rest.iter().enumerate() {
                if escaped {
                    escaped = false;
                } else if in_quotes && byte == b'\\' {
                    escaped = true;
                } else if byte == b'"' {
                    in_quotes = !in_quotes;
                } else if byte == b',' && !in_quotes {
                    end = index;
                    break;
                }
            }
            let element = trim_whitespace(&self.rest[..end]);
            self.rest = self.rest.get(end + 1..).unwrap_or(&[]);
            if !element.is_empty() {
                return Some(element);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(value: &str) -> Vec<&str> {
        list_elements(value.as_bytes())
            .map(|element| std::str::from_utf8(element).unwrap())
            .collect()
    }

    #[test]
    fn list_splitting() {
        assert_eq!(elements("keep-alive, Upgrade"), ["keep-alive", "Upgrade"]);
        assert_eq!(elements(" a ,, b,\t"), ["a", "b"]);
        assert_eq!(elements(""), Vec::<&str>::new());
        assert_eq!(elements("x;q=\"a,chunked\", y"), ["x;q=\"a,chunked\"", "y"]);
        assert_eq!(elements("x;q=\"a\\\",b\", y"), ["x;q=\"a\\\",b\"", "y"]);
        assert_eq!(
            elements("x;q=\"unterminated, chunked"),
            ["x;q=\"unterminated, chunked"]
        );
    }

    #[test]
    fn decimals() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"007"), Some(7));
        assert_eq!(parse_decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_decimal(b"18446744073709551616"), None);
        assert_eq!(parse_decimal(b"+5"), None);
        assert_eq!(parse_decimal(b"-5"), None);
        assert_eq!(parse_decimal(b"5 5"), None);
        assert_eq!(parse_decimal(b""), None);
        assert_eq!(parse_decimal(b"5a"), None);
    }

    #[test]
    fn content_length_merging() {
        use ContentLength::*;
        assert_eq!(merge_content_length(Absent, b"5"), Valid(5));
        assert_eq!(merge_content_length(Absent, b"5, 5"), Valid(5));
        assert_eq!(merge_content_length(Valid(5), b"5"), Valid(5));
        assert_eq!(merge_content_length(Valid(5), b"6"), Invalid);
        assert_eq!(merge_content_length(Absent, b"5, 6"), Invalid);
        assert_eq!(merge_content_length(Absent, b"5,"), Invalid);
        assert_eq!(merge_content_length(Absent, b""), Invalid);
        assert_eq!(merge_content_length(Invalid, b"5"), Invalid);
    }

    #[test]
    fn host_names() {
        for name in [&b"host"[..], b"Host", b"HOST", b"hOsT"] {
            assert!(is_host(name), "{name:?}");
        }
        for name in [
            &b"hos"[..],
            b"hosts",
            b"ho5t",
            b"h\x0fst",
            b"Hos\x14",
            b"xost",
            b"",
        ] {
            assert!(!is_host(name), "{name:?}");
        }
        // Every byte that folds onto a letter of `host` is that letter in either case.
        for byte in 0..=255u8 {
            for (index, letter) in b"host".iter().enumerate() {
                let mut name = *b"host";
                name[index] = byte;
                assert_eq!(
                    is_host(&name),
                    byte.to_ascii_lowercase() == *letter,
                    "{name:?}"
                );
            }
        }
    }

    #[test]
    fn tokens() {
        assert!(is_token(b"gzip"));
        assert!(is_token(b"x-custom_1"));
        assert!(!is_token(b""));
        assert!(!is_token(b"a b"));
        assert!(!is_token(b"\"q\""));
    }
}
