//! Criterion micro-benchmark of the request log's template engine: one line of Knative's default
//! template (1.18's, and 1.21's with `.TraceID`) rendered into a reused buffer, as a shard renders
//! it at the end of each request when request logs are on.
//!
//! Run: `cargo bench -p kactivator-microbench --bench request_log` (results in target/criterion/).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use kactivator_template::{
    Input, Proto, Request, Response, Revision, Template, KNATIVE_1_18_DEFAULT, KNATIVE_1_21_DEFAULT,
};

/// config-observability's `logging.request-log-template` in Knative 1.18 and 1.21.
const TEMPLATES: [(&str, &str); 2] = [
    ("knative_1_18", KNATIVE_1_18_DEFAULT),
    ("knative_1_21", KNATIVE_1_21_DEFAULT),
];

fn render(c: &mut Criterion) {
    let mut group = c.benchmark_group("request_log");
    let revision = Revision {
        pod_ip: "10.0.0.7".into(),
        ..Revision::default()
    };
    let headers: &[(&[u8], &[u8])] = &[
        (b"user-agent", b"curl/8.5.0"),
        (b"referer", b"https://example.com/?a=b"),
        (
            b"traceparent",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        (b"x-b3-traceid", b"80f198ee56343ba8"),
    ];
    let input = Input {
        request: Request {
            method: b"GET",
            request_uri: b"/predict?model=resnet&batch=1",
            proto: Proto::Http11,
            content_length: 0,
            host: b"hello.default.example.com",
            remote_addr: b"10.1.2.3:45678",
            headers,
        },
        response: Response {
            code: 200,
            size: 1234,
            latency_seconds: 0.001234567,
        },
        revision: &revision,
    };
    for (name, text) in TEMPLATES {
        let template = Template::parse(text).expect("Knative's template parses");
        let mut out = Vec::with_capacity(4096);
        group.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                black_box(&template)
                    .render(black_box(&input), &mut out)
                    .expect("renders");
                black_box(out.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, render);
criterion_main!(benches);
