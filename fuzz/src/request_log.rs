//! A request log template and the request it is rendered for: the template comes from the
//! operator, but the request (its target, which `.Request.URL` parses, its headers, its host)
//! from any client. Parsing any text either succeeds or says where it failed; rendering any
//! request with a parsed template never panics, gives the same bytes twice, and reads no header
//! beyond those the template said it reads.
//!
//! Input layout, split at NUL bytes: the template, the method, the request-target, the host,
//! then header names and values in turn. The input's length picks the protocol.

use kactivator_template::{
    fallback_line, HeadersRead, Input, Proto, Request, Response, Revision, Template,
};

pub fn request_log(data: &[u8]) {
    let mut parts = data.split(|&byte| byte == 0);
    let text = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let template = match Template::parse(&text) {
        Ok(template) => template,
        Err(error) => {
            // The position is inside the text (or just past its end, with the newline added).
            let lines = text.lines().count().max(1) + 1;
            assert!(error.line >= 1 && error.line <= lines, "{error}");
            assert!(error.column >= 1, "{error}");
            return;
        }
    };
    let method = parts.next().unwrap_or(b"GET");
    let target = parts.next().unwrap_or(b"/");
    let host = parts.next().unwrap_or_default();
    let rest: Vec<&[u8]> = parts.collect();
    let all: Vec<(&[u8], &[u8])> = rest
        .chunks(2)
        .map(|pair| (pair[0], pair.get(1).copied().unwrap_or_default()))
        .collect();
    let proto = match data.len() % 3 {
        0 => Proto::Http10,
        1 => Proto::Http11,
        _ => Proto::Http2,
    };
    let revision = Revision {
        name: "hello-00001".into(),
        namespace: "default".into(),
        service: "hello".into(),
        configuration: "hello".into(),
        pod_name: "hello-00001-deployment-1".into(),
        pod_ip: "10.0.0.7".into(),
    };
    let input = |headers| Input {
        request: Request {
            method,
            request_uri: target,
            proto,
            content_length: data.len() as i64 - 100,
            host,
            remote_addr: b"10.0.0.1:40000",
            headers,
        },
        response: Response {
            code: 200 + (data.len() % 400) as u16,
            size: data.len() as u64,
            latency_seconds: data.len() as f64 / 7.0,
        },
        revision: &revision,
    };
    let rendered = |headers| {
        let mut out = Vec::new();
        match template.render(&input(headers), &mut out) {
            Ok(()) => Ok(out),
            Err(error) => {
                assert!(out.is_empty(), "a failed render leaves nothing behind");
                let mut fallback = Vec::new();
                fallback_line(&input(headers), &mut fallback);
                assert!(fallback.ends_with(b"\n"));
                Err(error)
            }
        }
    };
    let first = rendered(&all);
    assert_eq!(first, rendered(&all), "the same request, the same line");
    // The line is the same when only the headers the template reads are passed: what a shard
    // copies per request (`request::log`).
    let wanted: Vec<(&[u8], &[u8])> = all
        .iter()
        .copied()
        .filter(|(name, _)| template.headers_read().wants(name))
        .collect();
    assert_eq!(first, rendered(&wanted), "{:?}", template.headers_read());
    if matches!(template.headers_read(), HeadersRead::None) {
        assert_eq!(first, rendered(&[]));
    }
}
