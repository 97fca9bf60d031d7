//! Trace context headers as a client sends them (input: `traceparent \0 tracestate \0 b3 \0
//! X-B3-TraceId \0 X-B3-SpanId \0 X-B3-ParentSpanId \0 X-B3-Sampled \0 X-B3-Flags`, a missing
//! part is an absent header, an empty one an empty header), through the parsers of
//! `kactivator_api::trace` and `decide`, what the request path will forward. What must hold
//! besides "no panic":
//! * a `traceparent` that parses formats back to its bytes when it was version 00 (flags: the
//!   sampled bit only), and to its fields when it was a higher version;
//! * a kept `tracestate` is at most 512 bytes, the value itself when it was that short, and is
//!   kept again unchanged;
//! * a B3 context formats (single and multiple headers) to values that parse to it;
//! * with tracing off nothing is touched; with it on, whatever is forwarded parses again to the
//!   context forwarded, which continues the incoming `traceparent` when that was valid.

use kactivator_api::trace::{
    decide, format_b3_multi, format_b3_single, format_traceparent, keep_tracestate, parse_b3_multi,
    parse_b3_single, parse_traceparent, B3Headers, Forward, IdGenerator, Incoming, Propagation,
    Sampler, Source, SpanContext, TraceState, B3, TRACESTATE_LIMIT,
};

pub fn trace_context(data: &[u8]) {
    let mut parts = data.split(|byte| *byte == 0);
    let mut next = || parts.next();
    let incoming = Incoming {
        traceparent: next(),
        tracestate: next(),
        b3: next(),
        x_b3: B3Headers {
            trace_id: next(),
            span_id: next(),
            parent_span_id: next(),
            sampled: next(),
            flags: next(),
        },
    };

    let traceparent = incoming.traceparent.map(parse_traceparent);
    if let (Some(value), Some(Ok(parsed))) = (incoming.traceparent, traceparent) {
        let formatted = format_traceparent(&parsed.context);
        if parsed.version == 0 {
            assert_eq!(value.len(), formatted.len());
            assert_eq!(value[..53], formatted[..53]);
        } else {
            assert!(value.len() >= formatted.len());
            assert_eq!(value[2..53], formatted[2..53]);
        }
        assert_eq!(parsed.flags & 1 == 1, parsed.context.sampled);
        assert_eq!(
            &formatted[53..],
            if parsed.context.sampled { b"01" } else { b"00" }
        );
        assert_eq!(
            parse_traceparent(&formatted).map(|again| again.context),
            Ok(parsed.context)
        );
    }

    if let Some(value) = incoming.tracestate {
        if let Ok(Some(state)) = keep_tracestate(value) {
            check_tracestate(&state);
            if value.len() <= TRACESTATE_LIMIT {
                assert_eq!(state, TraceState::Verbatim(value));
            }
        }
    }

    if let Some(Ok(B3::Span { context, .. })) = incoming.b3.map(parse_b3_single) {
        check_b3(&context);
    }
    if let Ok(Some(B3::Span { context, .. })) = parse_b3_multi(&incoming.x_b3) {
        check_b3(&context);
    }

    let mut ids = IdGenerator::new(data.len() as u64);
    for ratio in [0.0, 0.5, 1.0] {
        let sampler = Sampler::new(ratio).expect("a ratio in 0..=1");
        assert_eq!(
            decide(&incoming, false, &mut ids, &sampler),
            Propagation::Untouched
        );
        let Propagation::Replace(forward) = decide(&incoming, true, &mut ids, &sampler) else {
            panic!("tracing on replaces the headers");
        };
        check_forward(&forward);
        match traceparent {
            Some(Ok(parsed)) => {
                assert_eq!(forward.source, Source::TraceContext);
                assert_eq!(forward.context.trace_id, parsed.context.trace_id);
                assert_eq!(forward.context.sampled, parsed.context.sampled);
                assert_eq!(forward.parent_span_id, Some(parsed.context.span_id));
            }
            _ => assert!(forward.tracestate().is_none()),
        }
    }
}

fn check_tracestate(state: &TraceState<'_>) {
    let bytes = state.as_bytes();
    assert!(!bytes.is_empty() && bytes.len() <= TRACESTATE_LIMIT);
    assert_eq!(
        keep_tracestate(bytes),
        Ok(Some(TraceState::Verbatim(bytes)))
    );
}

fn check_b3(context: &SpanContext) {
    let single = format_b3_single(context);
    let Ok(B3::Span { context: again, .. }) = parse_b3_single(&single) else {
        panic!("a formatted b3 header parses");
    };
    assert_eq!(again, *context);
    let fields = format_b3_multi(context);
    let headers = B3Headers {
        trace_id: Some(&fields.trace_id),
        span_id: Some(&fields.span_id),
        sampled: Some(fields.sampled),
        ..B3Headers::default()
    };
    let Ok(Some(B3::Span { context: again, .. })) = parse_b3_multi(&headers) else {
        panic!("formatted B3 headers parse");
    };
    assert_eq!(again, *context);
}

fn check_forward(forward: &Forward<'_>) {
    let traceparent = parse_traceparent(forward.traceparent()).expect("a forwarded traceparent");
    assert_eq!(traceparent.version, 0);
    assert_eq!(traceparent.context, forward.context);
    if let Some(state) = forward.tracestate() {
        assert_eq!(forward.source, Source::TraceContext);
        check_tracestate(state);
    }
    check_b3(&forward.context);
    assert_eq!(format_b3_multi(&forward.context), *forward.b3());
    assert!(forward.fields().all(|(_, value)| !value.is_empty()));
}
