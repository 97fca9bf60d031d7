//! Trace context as it crosses a proxy: W3C Trace Context (`traceparent`, `tracestate`) and
//! Zipkin's B3 parsed and formatted, trace and span ids made by a shard's own generator,
//! OpenTelemetry's `ParentBased(TraceIdRatioBased(ratio))` sampling, and [`decide`], what a
//! proxied request carries to its pod.
//!
//! Sans-IO and allocation-free: header values in as bytes, fixed-size arrays out. Nothing here
//! is wired into the request path yet (issue 39).
//!
//! References: W3C Trace Context (<https://www.w3.org/TR/trace-context/>, section 3 "Trace
//! Context HTTP Headers Format"); openzipkin/b3-propagation's README (multiple headers and the
//! single `b3` header); OpenTelemetry's trace SDK specification (`ParentBased`,
//! `TraceIdRatioBased`) and its Go SDK's `sdk/trace/sampling.go`, whose arithmetic [`Sampler`]
//! copies bit for bit. Knative 1.18 proxies with OpenCensus' `TraceContextB3Egress`: it reads
//! both formats, preferring Trace Context, and always writes both; [`decide`] does the same.

use std::fmt;

pub mod span;

#[cfg(test)]
mod tests;

// === Header names ===

/// W3C Trace Context's parent: `00-<trace-id>-<parent-id>-<flags>`. Sent lower-case, as the
/// spec asks.
pub const TRACEPARENT: &str = "traceparent";
/// W3C Trace Context's vendor list, companion of [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
/// B3's single header: `{trace-id}-{span-id}[-{sampling}[-{parent-span-id}]]`, or a bare
/// sampling state (`0`, `1`, `d`).
pub const B3: &str = "b3";
/// B3's trace id (multiple headers): 16 or 32 lower-case hex digits.
pub const B3_TRACE_ID: &str = "X-B3-TraceId";
/// B3's span id (multiple headers): 16 lower-case hex digits.
pub const B3_SPAN_ID: &str = "X-B3-SpanId";
/// B3's parent span id (multiple headers); absent on a root span.
pub const B3_PARENT_SPAN_ID: &str = "X-B3-ParentSpanId";
/// B3's sampling decision: `1` or `0` (`true` and `false` from older tracers are read too).
pub const B3_SAMPLED: &str = "X-B3-Sampled";
/// B3's debug flag: `1` forces sampling.
pub const B3_FLAGS: &str = "X-B3-Flags";

/// Every propagation header [`decide`] replaces: when it answers [`Propagation::Replace`] the
/// request path removes each of these (names compare without regard to case) and then writes
/// [`Forward::fields`].
pub const PROPAGATION_HEADERS: [&str; 8] = [
    TRACEPARENT,
    TRACESTATE,
    B3,
    B3_TRACE_ID,
    B3_SPAN_ID,
    B3_PARENT_SPAN_ID,
    B3_SAMPLED,
    B3_FLAGS,
];

/// Length of a version-00 `traceparent` value, the only version written.
pub const TRACEPARENT_LEN: usize = 55;
/// Length of the single `b3` header [`format_b3_single`] writes (128-bit trace id, no parent).
pub const B3_SINGLE_LEN: usize = 51;
/// The most `tracestate` bytes forwarded: the spec's "SHOULD propagate at least 512
/// characters" taken as the limit (see [`keep_tracestate`]).
pub const TRACESTATE_LIMIT: usize = 512;
/// The most list-members a `tracestate` may have; one more makes it invalid.
pub const TRACESTATE_MAX_MEMBERS: usize = 32;
/// Members longer than this are the first dropped when a `tracestate` must be truncated.
const TRACESTATE_LARGE_MEMBER: usize = 128;

// === Ids ===

/// A 16-byte trace id; never all zeros (both formats forbid it).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

/// An 8-byte span id (Trace Context's `parent-id`); never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId([u8; 8]);

impl TraceId {
    /// The id, or `None` for the invalid all-zero one.
    pub const fn new(bytes: [u8; 16]) -> Option<Self> {
        if u128::from_ne_bytes(bytes) == 0 {
            None
        } else {
            Some(Self(bytes))
        }
    }

    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// Bytes 8..16 read big-endian: what OpenTelemetry's ratio sampler looks at, and all a
    /// 64-bit B3 trace id holds.
    pub const fn low_u64(self) -> u64 {
        let [_, _, _, _, _, _, _, _, a, b, c, d, e, f, g, h] = self.0;
        u64::from_be_bytes([a, b, c, d, e, f, g, h])
    }
}

impl SpanId {
    /// The id, or `None` for the invalid all-zero one.
    pub const fn new(bytes: [u8; 8]) -> Option<Self> {
        if u64::from_ne_bytes(bytes) == 0 {
            None
        } else {
            Some(Self(bytes))
        }
    }

    pub const fn to_bytes(self) -> [u8; 8] {
        self.0
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

/// What both formats carry: the trace, the span (the caller's, or ours going out), and whether
/// the trace is sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SpanContext {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub sampled: bool,
}

/// Why a `traceparent` or B3 value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContextError {
    /// A value or a field of the wrong length.
    Length,
    /// A `-` missing where the format puts one, or one too many (B3's single header).
    Delimiter,
    /// A character that is not `0-9a-f` (upper-case hex included) where hex belongs.
    NotLowercaseHex,
    /// `traceparent` version `ff`.
    ForbiddenVersion,
    /// An all-zero trace id.
    ZeroTraceId,
    /// An all-zero span (parent) id.
    ZeroSpanId,
    /// A B3 sampling state other than `1`, `0`, `d` (single) or `1`, `0`, `true`, `false`
    /// (`X-B3-Sampled`).
    SamplingState,
    /// `X-B3-Flags` other than `1`.
    DebugFlag,
    /// B3 multiple headers with a trace id but no span id, or the other way round, or a parent
    /// span id without both.
    MissingId,
}

impl ContextError {
    /// Also the label a metric of refused headers would use.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Delimiter => "delimiter",
            Self::NotLowercaseHex => "not_lowercase_hex",
            Self::ForbiddenVersion => "forbidden_version",
            Self::ZeroTraceId => "zero_trace_id",
            Self::ZeroSpanId => "zero_span_id",
            Self::SamplingState => "sampling_state",
            Self::DebugFlag => "debug_flag",
            Self::MissingId => "missing_id",
        }
    }
}

impl fmt::Display for ContextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid trace context: {}", self.label())
    }
}

impl std::error::Error for ContextError {}

// === Hex ===

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex only: both formats say so, and a proxy that accepted `A` would forward a
/// value its pod's tracer refuses.
fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

fn parse_hex<const N: usize>(text: &[u8]) -> Result<[u8; N], ContextError> {
    if text.len() != 2 * N {
        return Err(ContextError::Length);
    }
    let mut bytes = [0u8; N];
    for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
        let (Some(high), Some(low)) = (hex_value(pair[0]), hex_value(pair[1])) else {
            return Err(ContextError::NotLowercaseHex);
        };
        *byte = high << 4 | low;
    }
    Ok(bytes)
}

/// Writes `bytes` as `2 * bytes.len()` hex digits at the start of `out`.
fn write_hex(out: &mut [u8], bytes: &[u8]) {
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX_DIGITS[usize::from(byte >> 4)];
        pair[1] = HEX_DIGITS[usize::from(byte & 0x0f)];
    }
}

// === traceparent ===

/// A parsed `traceparent`: the context, and what else the caller sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    /// `0` for the version this spec defines; a higher one was read by the forward-compatible
    /// rule (its first 55 characters) and is written back as `00`.
    pub version: u8,
    pub context: SpanContext,
    /// The flags byte as received; only its lowest bit (sampled) means anything to version 00,
    /// and only that bit is ever written.
    pub flags: u8,
}

/// Parses a `traceparent` value. Version `00` is exactly [`TRACEPARENT_LEN`] characters; a
/// higher version (not `ff`) is read by the spec's forward-compatibility rule: at least 55
/// characters whose first 55 parse as version 00's fields, followed by the end or a `-`.
pub fn parse_traceparent(value: &[u8]) -> Result<TraceParent, ContextError> {
    if value.len() < TRACEPARENT_LEN {
        return Err(ContextError::Length);
    }
    let [version] = parse_hex::<1>(&value[..2])?;
    if version == 0xff {
        return Err(ContextError::ForbiddenVersion);
    }
    if version == 0 && value.len() != TRACEPARENT_LEN {
        return Err(ContextError::Length);
    }
    // A higher version may only add fields after a `-`.
    let after = value.get(TRACEPARENT_LEN).copied();
    if [value[2], value[35], value[52]] != [b'-'; 3] || after.is_some_and(|byte| byte != b'-') {
        return Err(ContextError::Delimiter);
    }
    let trace_id = TraceId::new(parse_hex(&value[3..35])?).ok_or(ContextError::ZeroTraceId)?;
    let span_id = SpanId::new(parse_hex(&value[36..52])?).ok_or(ContextError::ZeroSpanId)?;
    let [flags] = parse_hex::<1>(&value[53..55])?;
    Ok(TraceParent {
        version,
        context: SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        },
        flags,
    })
}

/// `00-<trace-id>-<span-id>-<flags>`, flags `01` when sampled and `00` otherwise (the spec:
/// flags this version does not define are set to zero).
pub fn format_traceparent(context: &SpanContext) -> [u8; TRACEPARENT_LEN] {
    let mut out = [b'-'; TRACEPARENT_LEN];
    out[..2].copy_from_slice(b"00");
    write_hex(&mut out[3..35], &context.trace_id.0);
    write_hex(&mut out[36..52], &context.span_id.0);
    write_hex(&mut out[53..55], &[u8::from(context.sampled)]);
    out
}

// === tracestate ===

/// Why a `tracestate` was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceStateError {
    /// More than [`TRACESTATE_MAX_MEMBERS`] list-members.
    TooManyMembers,
    /// A list-member with no `=`.
    MissingEquals,
    /// A key outside the grammar (see [`keep_tracestate`]).
    Key,
    /// A value outside the grammar: empty, over 256 characters, or a character other than
    /// printable ASCII but `,` and `=`.
    Value,
    /// The same key twice ("only one entry per key is allowed").
    DuplicateKey,
}

impl TraceStateError {
    pub const fn label(self) -> &'static str {
        match self {
            Self::TooManyMembers => "too_many_members",
            Self::MissingEquals => "missing_equals",
            Self::Key => "key",
            Self::Value => "value",
            Self::DuplicateKey => "duplicate_key",
        }
    }
}

impl fmt::Display for TraceStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid tracestate: {}", self.label())
    }
}

impl std::error::Error for TraceStateError {}

/// A `tracestate` fit to forward: valid, non-empty, at most [`TRACESTATE_LIMIT`] bytes.
// Large by design: a truncated value is kept in place, not allocated; one lives per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceState<'a> {
    /// The value as received.
    Verbatim(&'a [u8]),
    /// Whole members of a longer value, joined by `,` without whitespace.
    Truncated(TruncatedTraceState),
}

/// The members of a `tracestate` that were kept, in their order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TruncatedTraceState {
    bytes: [u8; TRACESTATE_LIMIT],
    len: usize,
}

impl TraceState<'_> {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Verbatim(bytes) => bytes,
            Self::Truncated(truncated) => &truncated.bytes[..truncated.len],
        }
    }
}

/// Decides what of a received `tracestate` (multiple fields already joined with `,`, as RFC
/// 9110 combines them) goes on: `Ok(None)` when it lists no member, `Err` when it is invalid
/// (then none of it goes on: an invalid value is never forwarded as is).
///
/// The grammar is Trace Context Level 2's, which accepts every Level 1 key:
/// * a list of at most 32 list-members separated by `,`, each with optional spaces and tabs
///   around it; empty members are allowed and neither count nor are kept;
/// * key: `(a-z / 0-9)` then up to 255 of `a-z 0-9 _ - * / @`;
/// * value: 1 to 256 characters of `0x20..=0x7e` but `,` and `=`, the last not a space;
/// * each key at most once.
///
/// Size: a valid value of at most [`TRACESTATE_LIMIT`] bytes is forwarded verbatim, spaces
/// and all. A longer one is truncated as the spec says a vendor MUST (whole entries) and SHOULD
/// (members over 128 characters removed first, then members from the end) until its members,
/// joined by `,`, fit in [`TRACESTATE_LIMIT`] bytes; if none fits, nothing is forwarded.
pub fn keep_tracestate(value: &[u8]) -> Result<Option<TraceState<'_>>, TraceStateError> {
    // Where each non-empty member lies in `value` (trimmed), in order.
    let mut members = [(0usize, 0usize); TRACESTATE_MAX_MEMBERS];
    let mut count = 0;
    let mut start = 0;
    for raw in value.split(|byte| *byte == b',') {
        let (offset, member) = trim_ows(raw);
        let member_start = start + offset;
        start += raw.len() + 1;
        if member.is_empty() {
            continue;
        }
        if count == TRACESTATE_MAX_MEMBERS {
            return Err(TraceStateError::TooManyMembers);
        }
        let key = check_member(member)?;
        let duplicate = members[..count]
            .iter()
            .any(|&(at, len)| key_of(&value[at..at + len]) == key);
        if duplicate {
            return Err(TraceStateError::DuplicateKey);
        }
        members[count] = (member_start, member.len());
        count += 1;
    }
    let members = &members[..count];
    if members.is_empty() {
        return Ok(None);
    }
    if value.len() <= TRACESTATE_LIMIT {
        return Ok(Some(TraceState::Verbatim(value)));
    }

    // Truncation: the smallest cut in the spec's order. Terminates: with nothing kept the
    // joined length is 0.
    let joined_len = |keep: &[bool]| {
        let kept = members.iter().zip(keep).filter(|(_, keep)| **keep);
        let (bytes, count) = kept.fold((0usize, 0usize), |(bytes, count), ((_, len), _)| {
            (bytes + len, count + 1)
        });
        bytes + count.saturating_sub(1)
    };
    let mut keep = [true; TRACESTATE_MAX_MEMBERS];
    let keep = &mut keep[..members.len()];
    if joined_len(keep) > TRACESTATE_LIMIT {
        for (keep, &(_, len)) in keep.iter_mut().zip(members) {
            *keep = len <= TRACESTATE_LARGE_MEMBER;
        }
        let mut last = members.len();
        while joined_len(keep) > TRACESTATE_LIMIT {
            last -= 1;
            keep[last] = false;
        }
    }
    let mut truncated = TruncatedTraceState {
        bytes: [0; TRACESTATE_LIMIT],
        len: 0,
    };
    for (&(at, len), _) in members.iter().zip(keep).filter(|(_, keep)| **keep) {
        if truncated.len > 0 {
            truncated.bytes[truncated.len] = b',';
            truncated.len += 1;
        }
        // Fits: the kept members were chosen so that they and their commas take at most
        // TRACESTATE_LIMIT bytes.
        truncated.bytes[truncated.len..truncated.len + len].copy_from_slice(&value[at..at + len]);
        truncated.len += len;
    }
    Ok((truncated.len > 0).then_some(TraceState::Truncated(truncated)))
}

/// The member without the spaces and tabs around it, and how many bytes were cut at its start.
fn trim_ows(raw: &[u8]) -> (usize, &[u8]) {
    let is_ows = |byte: &u8| matches!(byte, b' ' | b'\t');
    let start = raw
        .iter()
        .position(|byte| !is_ows(byte))
        .unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|byte| !is_ows(byte))
        .map_or(start, |last| last + 1);
    (start, &raw[start..end])
}

fn key_of(member: &[u8]) -> &[u8] {
    member
        .split(|byte| *byte == b'=')
        .next()
        .unwrap_or_default()
}

/// Checks one trimmed, non-empty member; returns its key.
fn check_member(member: &[u8]) -> Result<&[u8], TraceStateError> {
    let equals = member
        .iter()
        .position(|byte| *byte == b'=')
        .ok_or(TraceStateError::MissingEquals)?;
    let (key, value) = (&member[..equals], &member[equals + 1..]);
    let key_ok = match key {
        [first, rest @ ..] => {
            (first.is_ascii_lowercase() || first.is_ascii_digit())
                && rest.len() <= 255
                && rest.iter().all(|byte| {
                    byte.is_ascii_lowercase()
                        || byte.is_ascii_digit()
                        || matches!(byte, b'_' | b'-' | b'*' | b'/' | b'@')
                })
        }
        [] => false,
    };
    if !key_ok {
        return Err(TraceStateError::Key);
    }
    // The member is trimmed, so a value cannot end with a space; `=` excluded here, `,` cannot
    // occur (the list was split on it).
    let value_ok = (1..=256).contains(&value.len())
        && value
            .iter()
            .all(|byte| matches!(byte, 0x20..=0x7e) && *byte != b'=');
    if !value_ok {
        return Err(TraceStateError::Value);
    }
    Ok(key)
}

// === B3 ===

/// B3's sampling state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum B3Sampling {
    /// No decision: the receiver decides (no `X-B3-Sampled`, or `b3` without a third field).
    Deferred,
    /// `0`: not sampled.
    Deny,
    /// `1`: sampled.
    Accept,
    /// `d` or `X-B3-Flags: 1`: debug, which implies sampled.
    Debug,
}

impl B3Sampling {
    /// The decision as a parent's sampled flag; `None` when deferred.
    pub const fn decision(self) -> Option<bool> {
        match self {
            Self::Deferred => None,
            Self::Deny => Some(false),
            Self::Accept | Self::Debug => Some(true),
        }
    }
}

/// What B3 headers say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum B3 {
    /// A span to continue. `context.sampled` is whether `sampling` decided to sample.
    Span {
        context: SpanContext,
        parent_span_id: Option<SpanId>,
        sampling: B3Sampling,
    },
    /// Only a sampling decision, no ids (`b3: 0`, `X-B3-Sampled: 1` alone): a new trace with
    /// that decision. Never `Deferred`.
    SamplingOnly(B3Sampling),
}

/// The values of B3's multiple headers, each `None` when absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct B3Headers<'a> {
    pub trace_id: Option<&'a [u8]>,
    pub span_id: Option<&'a [u8]>,
    pub parent_span_id: Option<&'a [u8]>,
    pub sampled: Option<&'a [u8]>,
    pub flags: Option<&'a [u8]>,
}

/// B3's multiple headers as [`format_b3_multi`] writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct B3Fields {
    /// `X-B3-TraceId`: always 128 bits.
    pub trace_id: [u8; 32],
    /// `X-B3-SpanId`.
    pub span_id: [u8; 16],
    /// `X-B3-Sampled`: `1` or `0`.
    pub sampled: &'static [u8],
}

/// A 64-bit trace id (16 hex digits) is the low half of a 128-bit one, zeros on the left.
fn parse_b3_trace_id(text: &[u8]) -> Result<TraceId, ContextError> {
    let bytes = match text.len() {
        16 => {
            let low: [u8; 8] = parse_hex(text)?;
            let mut bytes = [0; 16];
            bytes[8..].copy_from_slice(&low);
            bytes
        }
        32 => parse_hex(text)?,
        _ => return Err(ContextError::Length),
    };
    TraceId::new(bytes).ok_or(ContextError::ZeroTraceId)
}

fn parse_b3_span_id(text: &[u8]) -> Result<SpanId, ContextError> {
    SpanId::new(parse_hex(text)?).ok_or(ContextError::ZeroSpanId)
}

fn b3_span(
    trace_id: &[u8],
    span_id: &[u8],
    parent_span_id: Option<&[u8]>,
    sampling: B3Sampling,
) -> Result<B3, ContextError> {
    let context = SpanContext {
        trace_id: parse_b3_trace_id(trace_id)?,
        span_id: parse_b3_span_id(span_id)?,
        sampled: sampling.decision() == Some(true),
    };
    let parent_span_id = parent_span_id.map(parse_b3_span_id).transpose()?;
    Ok(B3::Span {
        context,
        parent_span_id,
        sampling,
    })
}

/// Parses the single `b3` header: `{trace-id}-{span-id}`, then optionally `-{1|0|d}` and then
/// optionally `-{parent-span-id}`; or only the sampling state `0`, `1` or `d`.
pub fn parse_b3_single(value: &[u8]) -> Result<B3, ContextError> {
    let single_sampling = |state: &[u8]| match state {
        b"0" => Ok(B3Sampling::Deny),
        b"1" => Ok(B3Sampling::Accept),
        b"d" => Ok(B3Sampling::Debug),
        _ => Err(ContextError::SamplingState),
    };
    let mut fields = value.split(|byte| *byte == b'-');
    // `split` yields at least one field, the whole value when there is no `-`.
    let first = fields.next().unwrap_or_default();
    let Some(span_id) = fields.next() else {
        return single_sampling(first).map(B3::SamplingOnly);
    };
    let sampling = fields
        .next()
        .map_or(Ok(B3Sampling::Deferred), single_sampling)?;
    let parent_span_id = fields.next();
    if fields.next().is_some() {
        return Err(ContextError::Delimiter);
    }
    b3_span(first, span_id, parent_span_id, sampling)
}

/// Parses B3's multiple headers; `Ok(None)` when they say nothing (none present).
pub fn parse_b3_multi(headers: &B3Headers<'_>) -> Result<Option<B3>, ContextError> {
    let debug = match headers.flags {
        None => false,
        Some(b"1") => true,
        Some(_) => return Err(ContextError::DebugFlag),
    };
    let sampled = match headers.sampled {
        None => None,
        Some(b"1" | b"true") => Some(true),
        Some(b"0" | b"false") => Some(false),
        Some(_) => return Err(ContextError::SamplingState),
    };
    let sampling = match (debug, sampled) {
        (true, _) => B3Sampling::Debug,
        (false, Some(true)) => B3Sampling::Accept,
        (false, Some(false)) => B3Sampling::Deny,
        (false, None) => B3Sampling::Deferred,
    };
    match (headers.trace_id, headers.span_id, headers.parent_span_id) {
        (Some(trace_id), Some(span_id), parent_span_id) => {
            b3_span(trace_id, span_id, parent_span_id, sampling).map(Some)
        }
        (None, None, None) if sampling == B3Sampling::Deferred => Ok(None),
        (None, None, None) => Ok(Some(B3::SamplingOnly(sampling))),
        _ => Err(ContextError::MissingId),
    }
}

/// `{trace-id}-{span-id}-{1|0}`: the 128-bit trace id, no parent.
pub fn format_b3_single(context: &SpanContext) -> [u8; B3_SINGLE_LEN] {
    let mut out = [b'-'; B3_SINGLE_LEN];
    write_hex(&mut out[..32], &context.trace_id.0);
    write_hex(&mut out[33..49], &context.span_id.0);
    out[50] = if context.sampled { b'1' } else { b'0' };
    out
}

/// `X-B3-TraceId`, `X-B3-SpanId` and `X-B3-Sampled`, as OpenCensus' B3 egress writes them.
pub fn format_b3_multi(context: &SpanContext) -> B3Fields {
    let mut fields = B3Fields {
        trace_id: [0; 32],
        span_id: [0; 16],
        sampled: if context.sampled { b"1" } else { b"0" },
    };
    write_hex(&mut fields.trace_id, &context.trace_id.0);
    write_hex(&mut fields.span_id, &context.span_id.0);
    fields
}

// === Id generator ===

/// Trace and span ids for one shard: xoshiro256++ (Blackman and Vigna) seeded through
/// SplitMix64, as its authors recommend. Owned by the shard that uses it (`&mut self`): no
/// lock, no shared state, no allocation. Not cryptographic, and needs not be: the ids only have
/// to be distinct, and uniform enough for the ratio sampler.
///
/// Not `Clone`: two copies would hand out the same ids.
pub struct IdGenerator {
    state: [u64; 4],
}

impl IdGenerator {
    /// A generator from `seed`. Seed each one differently, and differently in each process
    /// (two replicas seeded alike make the same trace ids): [`IdGenerator::from_random_seed`].
    pub fn new(seed: u64) -> Self {
        // SplitMix64's output function is a bijection of distinct counters, so the four words
        // are distinct and never all zero (xoshiro's one forbidden state).
        let mut counter = seed;
        let mut next = || {
            counter = counter.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = counter;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Self {
            state: [next(), next(), next(), next()],
        }
    }

    /// A generator seeded from std's per-thread hash keys (read from the OS once per thread,
    /// then stepped on each call): a different seed per call and per process.
    pub fn from_random_seed() -> Self {
        use std::hash::{BuildHasher, Hasher};
        Self::new(
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
        )
    }

    /// A generator in a chosen state, which must not be all zeros: for the tests that need
    /// xoshiro to output zeros.
    #[cfg(test)]
    fn from_state(state: [u64; 4]) -> Self {
        assert_ne!(state, [0; 4]);
        Self { state }
    }

    /// xoshiro256++'s step.
    fn next_u64(&mut self) -> u64 {
        let [s0, s1, s2, s3] = &mut self.state;
        let result = s0.wrapping_add(*s3).rotate_left(23).wrapping_add(*s0);
        let t = *s1 << 17;
        *s2 ^= *s0;
        *s3 ^= *s1;
        *s1 ^= *s2;
        *s0 ^= *s3;
        *s2 ^= t;
        *s3 = s3.rotate_left(45);
        result
    }

    /// A new trace id: two outputs, big-endian; drawn again in the (2^-128) case of zeros.
    pub fn trace_id(&mut self) -> TraceId {
        loop {
            let mut bytes = [0; 16];
            bytes[..8].copy_from_slice(&self.next_u64().to_be_bytes());
            bytes[8..].copy_from_slice(&self.next_u64().to_be_bytes());
            if let Some(id) = TraceId::new(bytes) {
                return id;
            }
        }
    }

    /// A new span id: one output; drawn again in the (2^-64) case of zero.
    pub fn span_id(&mut self) -> SpanId {
        loop {
            if let Some(id) = SpanId::new(self.next_u64().to_be_bytes()) {
                return id;
            }
        }
    }
}

impl fmt::Debug for IdGenerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdGenerator").finish_non_exhaustive()
    }
}

// === Sampling ===

/// 2^63 as a float: OpenTelemetry's bound is `ratio * 2^63`, compared with the low 64 bits
/// shifted right by one.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// OpenTelemetry's `ParentBased(root = TraceIdRatioBased(ratio))`: a span with a parent follows
/// the parent's sampled flag; a root span (or a B3 parent that deferred the decision) is
/// sampled when its trace id's low 64 bits, read big-endian from bytes 8..16, are below
/// `ratio * 2^64`. Computed as the Go and Rust SDKs do, `(low >> 1) < (ratio * 2^63) as u64`,
/// so that every service sampling one trace at one ratio decides alike; ratio 0 never samples
/// a root, ratio 1 always does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    ratio: f64,
    /// `ratio * 2^63`, truncated; 2^63 for ratio 1, above every `low >> 1`.
    bound: u64,
}

/// A sampling ratio outside `0..=1`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RatioError {
    NotANumber,
    OutOfRange(f64),
}

impl fmt::Display for RatioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotANumber => write!(f, "tracing sampling ratio is NaN; give one in 0..=1"),
            Self::OutOfRange(ratio) => {
                write!(f, "tracing sampling ratio {ratio} is outside 0..=1")
            }
        }
    }
}

impl std::error::Error for RatioError {}

impl Sampler {
    /// A sampler for `ratio`, refused when it is NaN or outside `0..=1` (not clamped: a
    /// configuration that says 10 likely meant 10 %, not "always").
    pub fn new(ratio: f64) -> Result<Self, RatioError> {
        if ratio.is_nan() {
            return Err(RatioError::NotANumber);
        }
        if !(0.0..=1.0).contains(&ratio) {
            return Err(RatioError::OutOfRange(ratio));
        }
        // In 0..=2^63, so the cast is exact in range and truncates like Go's uint64().
        let bound = (ratio * TWO_POW_63) as u64;
        Ok(Self { ratio, bound })
    }

    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// Whether a span of `trace_id` is sampled, given its parent's decision (`None`: no parent,
    /// or one that left the decision to us).
    pub fn should_sample(&self, parent_sampled: Option<bool>, trace_id: TraceId) -> bool {
        match parent_sampled {
            Some(sampled) => sampled,
            None => trace_id.low_u64() >> 1 < self.bound,
        }
    }
}

// === What goes to the pod ===

/// A request's propagation headers, as received. A field received more than once is passed
/// joined with `,` (RFC 9110 §5.3): right for `tracestate`, and for every other field a value
/// that is then invalid, as the spec wants of a repeated `traceparent`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Incoming<'a> {
    pub traceparent: Option<&'a [u8]>,
    pub tracestate: Option<&'a [u8]>,
    pub b3: Option<&'a [u8]>,
    pub x_b3: B3Headers<'a>,
}

/// Which incoming header the forwarded trace continues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// A valid `traceparent` (its `tracestate` kept when valid).
    TraceContext,
    /// The single `b3` header, valid, with ids.
    B3Single,
    /// B3's multiple headers, valid, with ids.
    B3Multi,
    /// None: a new trace (possibly with a B3 sampling-only decision), because nothing valid
    /// came.
    Fresh,
}

/// What [`decide`] says to do with a request's propagation headers.
// Large by design: the formatted headers are arrays, not allocations; a return value.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation<'a> {
    /// Tracing is off: leave every header as it came.
    Untouched,
    /// Remove every one of [`PROPAGATION_HEADERS`], then write [`Forward::fields`].
    Replace(Forward<'a>),
}

/// The child context going to the pod, formatted in both formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forward<'a> {
    /// Our span: the parent's trace (or a new one), a new span id, sampled per [`Sampler`].
    pub context: SpanContext,
    /// The caller's span, when the trace continues one.
    pub parent_span_id: Option<SpanId>,
    pub source: Source,
    traceparent: [u8; TRACEPARENT_LEN],
    tracestate: Option<TraceState<'a>>,
    b3: B3Fields,
}

impl<'a> Forward<'a> {
    /// The decision `decide` made before, written again for the same request sent anew (an
    /// HTTP/2 stream the pod refused): the same `context`, `parent_span_id` and `source`, and
    /// the received `tracestate` kept as `decide` keeps it (only after a Trace Context parent).
    pub fn again(
        incoming: &Incoming<'a>,
        context: SpanContext,
        parent_span_id: Option<SpanId>,
        source: Source,
    ) -> Self {
        let tracestate = match source {
            Source::TraceContext => incoming
                .tracestate
                .and_then(|value| keep_tracestate(value).ok().flatten()),
            _ => None,
        };
        Forward {
            context,
            parent_span_id,
            source,
            traceparent: format_traceparent(&context),
            tracestate,
            b3: format_b3_multi(&context),
        }
    }

    pub fn traceparent(&self) -> &[u8; TRACEPARENT_LEN] {
        &self.traceparent
    }

    /// The kept `tracestate`: only ever with a valid `traceparent`, whose companion it is.
    pub fn tracestate(&self) -> Option<&TraceState<'a>> {
        self.tracestate.as_ref()
    }

    pub fn b3(&self) -> &B3Fields {
        &self.b3
    }

    /// The headers to write, names as the constants above spell them: `traceparent`,
    /// `tracestate` when one is kept, and B3's `X-B3-TraceId`, `X-B3-SpanId`, `X-B3-Sampled`
    /// (Knative's egress writes both formats).
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &[u8])> + '_ {
        [
            Some((TRACEPARENT, &self.traceparent[..])),
            self.tracestate
                .as_ref()
                .map(|state| (TRACESTATE, state.as_bytes())),
            Some((B3_TRACE_ID, &self.b3.trace_id[..])),
            Some((B3_SPAN_ID, &self.b3.span_id[..])),
            Some((B3_SAMPLED, self.b3.sampled)),
        ]
        .into_iter()
        .flatten()
    }
}

/// What to send the pod. Tracing off: [`Propagation::Untouched`]. Tracing on: always
/// [`Propagation::Replace`], with a child of the first valid parent among `traceparent`, `b3`
/// and B3's multiple headers (Trace Context first, as Knative reads them; the single B3 header
/// before the multiple ones, as OpenTelemetry's B3 propagator does), or of a new trace when
/// none is valid. An invalid header is never forwarded: every propagation header is replaced.
/// Sampling is [`Sampler::should_sample`] with the parent's decision; a B3 sampling-only
/// header (`b3: 1`) is the decision of the new trace it starts.
pub fn decide<'a>(
    incoming: &Incoming<'a>,
    enabled: bool,
    ids: &mut IdGenerator,
    sampler: &Sampler,
) -> Propagation<'a> {
    if !enabled {
        return Propagation::Untouched;
    }
    let mut tracestate = None;
    let mut decision = None;
    let mut parent = None;
    if let Some(traceparent) = incoming.traceparent.and_then(|v| parse_traceparent(v).ok()) {
        // The spec: tracestate is only read with a traceparent that parsed.
        tracestate = incoming
            .tracestate
            .and_then(|value| keep_tracestate(value).ok().flatten());
        decision = Some(traceparent.context.sampled);
        parent = Some((traceparent.context, Source::TraceContext));
    } else {
        let single = incoming
            .b3
            .and_then(|value| parse_b3_single(value).ok())
            .map(|b3| (b3, Source::B3Single));
        let multi = || {
            parse_b3_multi(&incoming.x_b3)
                .ok()
                .flatten()
                .map(|b3| (b3, Source::B3Multi))
        };
        match single.or_else(multi) {
            Some((
                B3::Span {
                    context, sampling, ..
                },
                source,
            )) => {
                decision = sampling.decision();
                parent = Some((context, source));
            }
            Some((B3::SamplingOnly(sampling), _)) => decision = sampling.decision(),
            None => {}
        }
    }
    let (trace_id, parent_span_id, source) = match parent {
        Some((context, source)) => (context.trace_id, Some(context.span_id), source),
        None => (ids.trace_id(), None, Source::Fresh),
    };
    let context = SpanContext {
        trace_id,
        span_id: ids.span_id(),
        sampled: sampler.should_sample(decision, trace_id),
    };
    Propagation::Replace(Forward {
        context,
        parent_span_id,
        source,
        traceparent: format_traceparent(&context),
        tracestate,
        b3: format_b3_multi(&context),
    })
}
