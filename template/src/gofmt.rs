//! Byte-exact re-implementations of the pieces of Go's standard library that
//! template output goes through: `fmt` number and string formatting,
//! `strconv.Quote`, `unicode/utf8` decoding, and the escapers behind the
//! `js`, `html` and `urlquery` template functions.

use std::fmt::Write as _;

use super::isprint::PRINTABLE;

/// Go's `utf8.RuneError`.
const RUNE_ERROR: u32 = 0xFFFD;

/// Decodes one rune like Go's `utf8.DecodeRune`: invalid or truncated input
/// yields `(U+FFFD, 1)`; surrogates and overlong forms are invalid.
pub(super) fn decode_rune(bytes: &[u8]) -> (u32, usize) {
    let Some(&first) = bytes.first() else {
        return (RUNE_ERROR, 0);
    };
    if first < 0x80 {
        return (u32::from(first), 1);
    }
    let (size, low, high, initial) = match first {
        0xC2..=0xDF => (2, 0x80, 0xBF, u32::from(first & 0x1F)),
        0xE0 => (3, 0xA0, 0xBF, 0),
        0xE1..=0xEC | 0xEE..=0xEF => (3, 0x80, 0xBF, u32::from(first & 0x0F)),
        0xED => (3, 0x80, 0x9F, 0xD),
        0xF0 => (4, 0x90, 0xBF, 0),
        0xF1..=0xF3 => (4, 0x80, 0xBF, u32::from(first & 0x07)),
        0xF4 => (4, 0x80, 0x8F, 4),
        _ => return (RUNE_ERROR, 1),
    };
    if bytes.len() < size {
        return (RUNE_ERROR, 1);
    }
    let second = bytes[1];
    if !(low..=high).contains(&second) {
        return (RUNE_ERROR, 1);
    }
    let mut rune = (initial << 6) | u32::from(second & 0x3F);
    for &continuation in &bytes[2..size] {
        if !(0x80..=0xBF).contains(&continuation) {
            return (RUNE_ERROR, 1);
        }
        rune = (rune << 6) | u32::from(continuation & 0x3F);
    }
    (rune, size)
}

/// Go's `utf8.RuneCount`: every invalid byte counts as one rune.
pub(super) fn rune_count(bytes: &[u8]) -> usize {
    let mut count = 0;
    let mut index = 0;
    while index < bytes.len() {
        index += decode_rune(&bytes[index..]).1;
        count += 1;
    }
    count
}

/// Go's `unicode.IsPrint` (letters, marks, numbers, punctuation, symbols and
/// the ASCII space), with the Unicode tables of the Go version that
/// generated `isprint.rs`.
pub(super) fn is_print(rune: u32) -> bool {
    if rune < 0x80 {
        return (0x20..0x7F).contains(&rune);
    }
    let index = PRINTABLE.partition_point(|&(_, high)| high < rune);
    PRINTABLE
        .get(index)
        .is_some_and(|&(low, high)| (low..=high).contains(&rune))
}

fn push_rune(out: &mut Vec<u8>, rune: u32) {
    let character = char::from_u32(rune).unwrap_or(char::REPLACEMENT_CHARACTER);
    let mut buffer = [0; 4];
    out.extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
}

const UPPER_HEX: &[u8; 16] = b"0123456789ABCDEF";
const LOWER_HEX: &[u8; 16] = b"0123456789abcdef";

/// `template.JSEscapeString`: backslash-escapes quotes and backslashes,
/// writes `<`, `>`, `&`, `=` and control bytes as `\u00XX`, keeps printable
/// non-ASCII runes, writes other valid runes as `\uXXXX`, and copies bytes of
/// invalid UTF-8 unchanged (Go decodes them as U+FFFD, which is printable).
pub(super) fn js_escape(out: &mut Vec<u8>, bytes: &[u8]) {
    let mut index = 0;
    while index < bytes.len() {
        // Most of a header or a path is printable ASCII that needs no escape: copied in runs.
        let plain = bytes[index..]
            .iter()
            .position(|&byte| !js_plain(byte))
            .unwrap_or(bytes.len() - index);
        out.extend_from_slice(&bytes[index..index + plain]);
        index += plain;
        let Some(&byte) = bytes.get(index) else {
            break;
        };
        index += match byte {
            b'\\' => escaped(out, b"\\\\"),
            b'\'' => escaped(out, b"\\'"),
            b'"' => escaped(out, b"\\\""),
            b'<' => escaped(out, b"\\u003C"),
            b'>' => escaped(out, b"\\u003E"),
            b'&' => escaped(out, b"\\u0026"),
            b'=' => escaped(out, b"\\u003D"),
            0x00..=0x1F => {
                out.extend_from_slice(b"\\u00");
                out.push(UPPER_HEX[usize::from(byte >> 4)]);
                out.push(UPPER_HEX[usize::from(byte & 0x0F)]);
                1
            }
            // Not ASCII (`js_plain` took the rest of it): one rune.
            _ => {
                let (rune, size) = decode_rune(&bytes[index..]);
                if is_print(rune) {
                    out.extend_from_slice(&bytes[index..index + size]);
                } else {
                    let _ = write!(ByteWriter(out), "\\u{rune:04X}");
                }
                size
            }
        };
    }
}

/// Writes an escape for one byte; the byte count it stands for.
fn escaped(out: &mut Vec<u8>, escape: &[u8]) -> usize {
    out.extend_from_slice(escape);
    1
}

/// A byte `js` writes as it is: printable ASCII but for `\ ' " < > & =`.
fn js_plain(byte: u8) -> bool {
    matches!(byte, 0x20..=0x7F) && !matches!(byte, b'\\' | b'\'' | b'"' | b'<' | b'>' | b'&' | b'=')
}

/// `template.HTMLEscapeString`.
pub(super) fn html_escape(out: &mut Vec<u8>, bytes: &[u8]) {
    for &byte in bytes {
        match byte {
            0 => out.extend_from_slice("\u{FFFD}".as_bytes()),
            b'"' => out.extend_from_slice(b"&#34;"),
            b'\'' => out.extend_from_slice(b"&#39;"),
            b'&' => out.extend_from_slice(b"&amp;"),
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            _ => out.push(byte),
        }
    }
}

/// `url.QueryEscape`: keeps ASCII letters, digits and `-_.~`, writes a space
/// as `+` and every other byte as `%XX`.
pub(super) fn query_escape(out: &mut Vec<u8>, bytes: &[u8]) {
    for &byte in bytes {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(byte),
            b' ' => out.push(b'+'),
            _ => push_percent(out, byte),
        }
    }
}

pub(super) fn push_percent(out: &mut Vec<u8>, byte: u8) {
    out.push(b'%');
    out.push(UPPER_HEX[usize::from(byte >> 4)]);
    out.push(UPPER_HEX[usize::from(byte & 0x0F)]);
}

/// `strconv.Quote` (or `QuoteToASCII` when `ascii_only`).
pub(super) fn quote(out: &mut Vec<u8>, bytes: &[u8], ascii_only: bool) {
    out.push(b'"');
    let mut index = 0;
    while index < bytes.len() {
        let (rune, size) = decode_rune(&bytes[index..]);
        if size == 1 && rune == RUNE_ERROR {
            out.extend_from_slice(b"\\x");
            out.push(LOWER_HEX[usize::from(bytes[index] >> 4)]);
            out.push(LOWER_HEX[usize::from(bytes[index] & 0x0F)]);
            index += 1;
            continue;
        }
        index += size;
        if rune == u32::from(b'"') || rune == u32::from(b'\\') {
            out.push(b'\\');
            push_rune(out, rune);
            continue;
        }
        let keep = if ascii_only {
            rune < 0x80 && is_print(rune)
        } else {
            is_print(rune)
        };
        if keep {
            push_rune(out, rune);
            continue;
        }
        match rune {
            0x07 => out.extend_from_slice(b"\\a"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0C => out.extend_from_slice(b"\\f"),
            0x0A => out.extend_from_slice(b"\\n"),
            0x0D => out.extend_from_slice(b"\\r"),
            0x09 => out.extend_from_slice(b"\\t"),
            0x0B => out.extend_from_slice(b"\\v"),
            0..0x20 | 0x7F => {
                let _ = write!(ByteWriter(out), "\\x{rune:02x}");
            }
            0..0x10000 => {
                let _ = write!(ByteWriter(out), "\\u{rune:04x}");
            }
            _ => {
                let _ = write!(ByteWriter(out), "\\U{rune:08x}");
            }
        }
    }
    out.push(b'"');
}

/// Adapts a byte vector to `std::fmt::Write`.
pub(super) struct ByteWriter<'v>(pub &'v mut Vec<u8>);

impl std::fmt::Write for ByteWriter<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0.extend_from_slice(text.as_bytes());
        Ok(())
    }
}

/// A fixed stack buffer for short number renderings, so printing a number
/// does not allocate.
struct StackText {
    bytes: [u8; 40],
    len: usize,
}

impl StackText {
    fn new() -> StackText {
        StackText {
            bytes: [0; 40],
            len: 0,
        }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        let end = self.len + text.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(text.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Writes an integer in decimal.
pub(super) fn push_int(out: &mut Vec<u8>, value: i64) {
    // Digits from the last, into a buffer as long as the longest i64 (without going through
    // `core::fmt`, which costs a few hundred instructions per number: three per line).
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut magnitude = value.unsigned_abs();
    loop {
        start -= 1;
        digits[start] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[start..]);
}

/// Decimal digits of a float: `0.digits × 10^point`, without trailing
/// zeros (Go's `decimalSlice`); zero has no digits.
struct Digits<'d> {
    digits: &'d [u8],
    point: i64,
}

impl<'d> Digits<'d> {
    /// Reads Rust's `{:e}` rendering of a non-negative finite number, keeping
    /// the digits in `storage` (at least as long as `text`).
    fn from_exponent_form(text: &[u8], storage: &'d mut [u8]) -> Digits<'d> {
        let split = text.iter().position(|&b| b == b'e').unwrap_or(text.len());
        let exponent: i64 = std::str::from_utf8(text.get(split + 1..).unwrap_or(b"0"))
            .ok()
            .and_then(|exponent| exponent.parse().ok())
            .unwrap_or(0);
        let mut count = 0;
        for &byte in text[..split].iter().filter(|b| b.is_ascii_digit()) {
            if let Some(slot) = storage.get_mut(count) {
                *slot = byte;
                count += 1;
            }
        }
        while count > 0 && storage[count - 1] == b'0' {
            count -= 1;
        }
        let point = if count == 0 { 0 } else { exponent + 1 };
        Digits {
            digits: &storage[..count],
            point,
        }
    }

    fn digit(&self, index: i64) -> u8 {
        usize::try_from(index)
            .ok()
            .and_then(|index| self.digits.get(index).copied())
            .unwrap_or(b'0')
    }

    /// Go's `fmtE`.
    fn write_exponent_form(&self, out: &mut Vec<u8>, precision: i64, upper: bool) {
        out.push(self.digit(0));
        if precision > 0 {
            out.push(b'.');
            for index in 1..=precision {
                out.push(self.digit(index));
            }
        }
        out.push(if upper { b'E' } else { b'e' });
        let exponent = if self.digits.is_empty() {
            0
        } else {
            self.point - 1
        };
        out.push(if exponent < 0 { b'-' } else { b'+' });
        let magnitude = exponent.unsigned_abs();
        if magnitude < 10 {
            out.push(b'0');
        }
        push_int(out, magnitude as i64);
    }

    /// Go's `fmtF`.
    fn write_fixed_form(&self, out: &mut Vec<u8>, precision: i64) {
        if self.point > 0 {
            for index in 0..self.point {
                out.push(self.digit(index));
            }
        } else {
            out.push(b'0');
        }
        if precision > 0 {
            out.push(b'.');
            for index in 1..=precision {
                out.push(self.digit(self.point + index - 1));
            }
        }
    }
}

/// Go's `strconv.AppendFloat(v, verb, precision, 64)` for the verbs
/// `e E f F g G` (and `v`, which is `g`); a precision of -1 means the
/// shortest form that reads back exactly. `value` must be finite and not
/// negative (the caller writes the sign).
fn push_float_magnitude(out: &mut Vec<u8>, value: f64, verb: u8, precision: i64) {
    let upper = verb.is_ascii_uppercase();
    let verb = verb.to_ascii_lowercase();
    if verb == b'f' && precision >= 0 {
        let _ = write!(ByteWriter(out), "{value:.*}", precision as usize);
        return;
    }
    // Shortest digits fit a stack buffer; a requested precision may not.
    let mut short_text = StackText::new();
    let mut short_storage = [0u8; 40];
    let long_text;
    let mut long_storage;
    let digits = if precision < 0 {
        let _ = write!(short_text, "{value:e}");
        Digits::from_exponent_form(short_text.as_bytes(), &mut short_storage)
    } else {
        let significant = if verb == b'e' {
            precision + 1
        } else {
            precision.max(1)
        };
        long_text = format!("{value:.*e}", (significant - 1) as usize);
        long_storage = vec![0u8; long_text.len()];
        Digits::from_exponent_form(long_text.as_bytes(), &mut long_storage)
    };
    let count = digits.digits.len() as i64;
    match verb {
        b'e' => {
            let precision = if precision < 0 {
                (count - 1).max(0)
            } else {
                precision
            };
            digits.write_exponent_form(out, precision, upper);
        }
        b'f' => digits.write_fixed_form(out, (count - digits.point).max(0)),
        _ => {
            let shortest = precision < 0;
            let mut precision = if shortest { count } else { precision.max(1) };
            let mut exponent_limit = precision;
            if exponent_limit > count && count >= digits.point {
                exponent_limit = count;
            }
            if shortest {
                exponent_limit = 6;
            }
            let exponent = digits.point - 1;
            if exponent < -4 || exponent >= exponent_limit {
                if precision > count {
                    precision = count;
                }
                digits.write_exponent_form(out, precision - 1, upper);
            } else {
                if precision > digits.point {
                    precision = count;
                }
                digits.write_fixed_form(out, (precision - digits.point).max(0));
            }
        }
    }
}

/// Flags, width and precision of one `printf` verb (Go's `fmt.fmt` flags).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Spec {
    pub verb: u8,
    pub minus: bool,
    pub plus: bool,
    pub space: bool,
    pub zero: bool,
    pub width: Option<usize>,
    pub precision: Option<usize>,
}

/// Go's `fmt.pad`: pads to the width counted in runes, with spaces.
pub(super) fn pad(out: &mut Vec<u8>, spec: &Spec, text: &[u8]) {
    let fill = spec
        .width
        .map_or(0, |width| width.saturating_sub(rune_count(text)));
    if !spec.minus {
        out.resize(out.len() + fill, b' ');
    }
    out.extend_from_slice(text);
    if spec.minus {
        out.resize(out.len() + fill, b' ');
    }
}

/// Go's `fmt` float formatting (`%v` is `Spec { verb: b'v' }`): sign flags,
/// `+Inf`, `NaN`, zero padding after the sign. Allocates only when padding.
pub(super) fn push_float(out: &mut Vec<u8>, spec: &Spec, value: f64) {
    let default_precision = match spec.verb {
        b'e' | b'E' | b'f' | b'F' => 6,
        _ => -1,
    };
    let precision = spec.precision.map_or(default_precision, |p| p as i64);
    let start = out.len();
    let sign = sign_of(value.is_sign_negative() && !value.is_nan(), spec);
    if sign != 0 {
        out.push(sign);
    }
    let special = value.is_nan() || value.is_infinite();
    if value.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if value.is_infinite() {
        if sign == 0 {
            out.push(b'+');
        }
        out.extend_from_slice(b"Inf");
    } else {
        push_float_magnitude(out, value.abs(), spec.verb, precision);
    }
    if spec.width.is_some() {
        let number = out.split_off(start);
        if special {
            pad(out, spec, &number);
        } else {
            push_number(out, spec, &number, sign != 0);
        }
    }
}

/// The sign fmt writes before a number: `-`, else `+` or a space when the flags ask, else none
/// (0).
fn sign_of(negative: bool, spec: &Spec) -> u8 {
    if negative {
        b'-'
    } else if spec.plus {
        b'+'
    } else if spec.space {
        b' '
    } else {
        0
    }
}

/// Pads a formatted number, putting zero padding between sign and digits.
fn push_number(out: &mut Vec<u8>, spec: &Spec, number: &[u8], has_sign: bool) {
    match spec.width {
        Some(width) if spec.zero && !spec.minus && width > number.len() => {
            let (sign, digits) = number.split_at(usize::from(has_sign));
            out.extend_from_slice(sign);
            out.resize(out.len() + width - number.len(), b'0');
            out.extend_from_slice(digits);
        }
        _ => pad(out, spec, number),
    }
}

/// Go's `fmt` integer formatting for `%d`, `%x`, `%X` (no precision).
pub(super) fn push_integer(out: &mut Vec<u8>, spec: &Spec, value: i64) {
    let mut number = Vec::with_capacity(24);
    let sign = sign_of(value < 0, spec);
    if sign != 0 {
        number.push(sign);
    }
    let magnitude = value.unsigned_abs();
    let _ = match spec.verb {
        b'x' => write!(ByteWriter(&mut number), "{magnitude:x}"),
        b'X' => write!(ByteWriter(&mut number), "{magnitude:X}"),
        _ => write!(ByteWriter(&mut number), "{magnitude}"),
    };
    push_number(out, spec, &number, sign != 0);
}

/// Go's `%x`/`%X` of a string: two hex digits per byte.
pub(super) fn push_hex_string(out: &mut Vec<u8>, spec: &Spec, bytes: &[u8]) {
    let digits = if spec.verb == b'X' {
        UPPER_HEX
    } else {
        LOWER_HEX
    };
    let mut text = Vec::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        text.push(digits[usize::from(byte >> 4)]);
        text.push(digits[usize::from(byte & 0x0F)]);
    }
    pad(out, spec, &text);
}

/// Go's `fmt.truncateString`: keeps at most `precision` runes.
pub(super) fn truncate(bytes: &[u8], precision: Option<usize>) -> &[u8] {
    let Some(mut remaining) = precision else {
        return bytes;
    };
    let mut index = 0;
    while index < bytes.len() {
        if remaining == 0 {
            return &bytes[..index];
        }
        remaining -= 1;
        index += decode_rune(&bytes[index..]).1;
    }
    bytes
}

/// `%v` of a float64 with no flags, as fmt prints it.
pub(super) fn push_float_plain(out: &mut Vec<u8>, value: f64) {
    push_float(
        out,
        &Spec {
            verb: b'v',
            ..Spec::default()
        },
        value,
    );
}
