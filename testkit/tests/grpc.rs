//! The gRPC + h2c test backend on its own, without a proxy: every RPC kind, large messages,
//! both protocols on one port, probes, and the counters the proxy tests will read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use kactivator_testkit::backend::BackendConfig;
use kactivator_testkit::grpc::pb::{EchoRequest, StreamRequest};
use kactivator_testkit::grpc::{
    connect, h2c_request, pattern_payload, spawn_grpc, GrpcHandle, GrpcStats,
};
use kactivator_testkit::pattern::find_pattern_mismatch;

const AUTHORITY: &str = "hello-00001.default.svc.cluster.local";
const MIB: usize = 1024 * 1024;

fn backend() -> GrpcHandle {
    spawn_grpc(BackendConfig::named("pod-a").with_revision("hello-00001", "default"))
        .expect("spawn the gRPC backend")
}

fn request(payload: &'static [u8]) -> EchoRequest {
    EchoRequest {
        payload: Bytes::from_static(payload),
        delay_ms: 0,
        reply_bytes: 0,
    }
}

/// Polls the backend's counters until `condition` holds, for at most a second.
async fn wait_for_stats(backend: &GrpcHandle, condition: impl Fn(&GrpcStats) -> bool) -> GrpcStats {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let stats = backend.stats();
        if condition(&stats) || Instant::now() > deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One HTTP/1.1 request over a raw socket; returns the whole response as text.
fn http1_get(addr: SocketAddr, extra_headers: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("set a read timeout");
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {AUTHORITY}\r\n{extra_headers}Connection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    response
}

#[tokio::test]
async fn unary_echoes_the_payload_and_names_the_backend() {
    let backend = backend();
    let mut client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let response = client.unary(request(b"ping")).await.expect("unary call");
    let headers = response.metadata().clone();
    let reply = response.into_inner();
    assert_eq!(reply.payload, Bytes::from_static(b"ping"));
    assert_eq!(reply.backend, "pod-a");
    assert_eq!(reply.seq, 0);
    assert_eq!(headers.get("x-backend").unwrap(), "pod-a");
    assert_eq!(
        headers.get("x-knative-revision-name").unwrap(),
        "hello-00001"
    );
    assert_eq!(headers.get("x-http-version").unwrap(), "HTTP/2.0");
    assert_eq!(headers.get("x-request-authority").unwrap(), AUTHORITY);
    let stats = wait_for_stats(&backend, |stats| stats.in_flight == 0).await;
    assert_eq!(stats.requests, 1);
    assert_eq!(stats.in_flight, 0);
    assert_eq!(stats.cancelled, 0);
    assert_eq!(stats.h2_connections, 1);
}

#[tokio::test]
async fn server_stream_sends_count_replies_in_order() {
    let backend = backend();
    let mut client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let mut replies = client
        .server_stream(StreamRequest {
            count: 5,
            interval_ms: 10,
            reply_bytes: 100,
        })
        .await
        .expect("server-stream call")
        .into_inner();
    let mut seqs = Vec::new();
    while let Some(reply) = replies.message().await.expect("next reply") {
        assert_eq!(reply.payload.len(), 100);
        assert_eq!(find_pattern_mismatch(0, &reply.payload), None);
        seqs.push(reply.seq);
    }
    assert_eq!(seqs, [0, 1, 2, 3, 4]);
    let stats = wait_for_stats(&backend, |stats| stats.in_flight == 0).await;
    assert_eq!((stats.in_flight, stats.cancelled), (0, 0));
}

#[tokio::test]
async fn client_stream_concatenates_and_counts_requests() {
    let backend = backend();
    let mut client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let requests = futures_util::stream::iter([request(b"a"), request(b"bc"), request(b"def")]);
    let reply = client
        .client_stream(requests)
        .await
        .expect("client-stream call")
        .into_inner();
    assert_eq!(reply.payload, Bytes::from_static(b"abcdef"));
    assert_eq!(reply.seq, 3);
}

#[tokio::test]
async fn bidi_answers_each_request_in_order() {
    let backend = backend();
    let mut client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let requests = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|request| (request, receiver))
    });
    let mut replies = client.bidi(requests).await.expect("bidi call").into_inner();
    // Strict ping-pong: each reply must arrive before the next request is sent, which only
    // works if both directions stream.
    for (seq, payload) in [&b"one"[..], b"two", b"three"].into_iter().enumerate() {
        sender
            .send(EchoRequest {
                payload: Bytes::copy_from_slice(payload),
                ..request(b"")
            })
            .await
            .expect("send a request");
        let reply = replies.message().await.expect("reply").expect("a reply");
        assert_eq!(reply.payload, payload);
        assert_eq!(reply.seq, seq as u64);
    }
    drop(sender);
    assert!(replies.message().await.expect("end of stream").is_none());
}

#[tokio::test]
async fn sixteen_mib_request_and_reply() {
    let backend = backend();
    let mut client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let payload = pattern_payload(16 * MIB as u32);
    let echoed = client
        .unary(EchoRequest {
            payload: payload.clone(),
            delay_ms: 0,
            reply_bytes: 0,
        })
        .await
        .expect("16 MiB echo")
        .into_inner();
    assert_eq!(echoed.payload.len(), payload.len());
    assert!(echoed.payload == payload, "echoed payload differs");
    let generated = client
        .unary(EchoRequest {
            payload: Bytes::new(),
            delay_ms: 0,
            reply_bytes: 16 * MIB as u32,
        })
        .await
        .expect("16 MiB reply")
        .into_inner();
    assert_eq!(generated.payload.len(), 16 * MIB);
    assert_eq!(find_pattern_mismatch(0, &generated.payload), None);
}

#[tokio::test]
async fn h2c_get_reports_http2() {
    let backend = backend();
    let response = h2c_request(backend.addr(), AUTHORITY, Method::GET, "/", &[])
        .await
        .expect("h2c GET /");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-http-version"], "HTTP/2.0");
    assert_eq!(response.headers()["x-request-authority"], AUTHORITY);
    assert_eq!(response.headers()["x-backend"], "pod-a");
    assert_eq!(response.body().as_ref(), b"hello from pod-a\n");
    let stats = backend.stats();
    assert_eq!(
        (stats.h2_connections, stats.in_flight, stats.cancelled),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn http1_get_on_the_same_port_reports_http1() {
    let backend = backend();
    let response = http1_get(backend.addr(), "");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("x-http-version: HTTP/1.1\r\n"),
        "{response}"
    );
    assert!(response.contains("x-knative-revision-namespace: default\r\n"));
    assert!(response.contains(&format!("x-request-authority: {AUTHORITY}\r\n")));
    assert!(response.ends_with("hello from pod-a\n"), "{response}");
    let stats = backend.stats();
    assert_eq!(
        (stats.requests, stats.h2_connections, stats.cancelled),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn probes_are_answered_over_both_protocols_and_not_counted_as_requests() {
    let backend = backend();
    let response = http1_get(backend.addr(), "K-Network-Probe: queue\r\n");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("\r\n\r\nqueue"), "{response}");
    let response = h2c_request(
        backend.addr(),
        AUTHORITY,
        Method::GET,
        "/anything",
        &[("k-network-probe", "queue")],
    )
    .await
    .expect("h2c probe");
    assert_eq!(response.status(), 200);
    assert_eq!(response.body().as_ref(), b"queue");
    let stats = backend.stats();
    assert_eq!((stats.probes, stats.requests), (2, 0));
}

#[tokio::test]
async fn concurrent_calls_show_in_max_in_flight() {
    const CALLS: usize = 4;
    let backend = backend();
    let client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let calls = (0..CALLS).map(|_| {
        let mut client = client.clone();
        async move {
            client
                .unary(EchoRequest {
                    delay_ms: 300,
                    ..request(b"x")
                })
                .await
        }
    });
    for result in futures_util::future::join_all(calls).await {
        result.expect("delayed unary call");
    }
    let stats = wait_for_stats(&backend, |stats| stats.in_flight == 0).await;
    assert_eq!(stats.max_in_flight, CALLS as u64);
    assert_eq!((stats.requests, stats.in_flight), (CALLS as u64, 0));
}

#[tokio::test]
async fn dropping_a_server_stream_mid_way_counts_as_cancelled() {
    let backend = backend();
    let mut client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let mut replies = client
        .server_stream(StreamRequest {
            count: 1000,
            interval_ms: 20,
            reply_bytes: 10,
        })
        .await
        .expect("server-stream call")
        .into_inner();
    replies
        .message()
        .await
        .expect("first reply")
        .expect("a reply");
    assert_eq!(backend.stats().in_flight, 1);
    drop(replies);
    let stats = wait_for_stats(&backend, |stats| {
        stats.cancelled == 1 && stats.in_flight == 0
    })
    .await;
    assert_eq!((stats.cancelled, stats.in_flight), (1, 0), "{stats:?}");
    // The connection survives the reset: the next call on it works.
    let reply = client.unary(request(b"after")).await.expect("unary");
    assert_eq!(reply.into_inner().payload, Bytes::from_static(b"after"));
}

#[tokio::test]
async fn abandoning_a_delayed_unary_call_counts_as_cancelled() {
    let backend = backend();
    let mut client = connect(backend.addr(), AUTHORITY).await.expect("connect");
    let call = client.unary(EchoRequest {
        delay_ms: 10_000,
        ..request(b"slow")
    });
    // Dropping the call future resets the stream while the handler still sleeps.
    let abandoned = tokio::time::timeout(Duration::from_millis(100), call).await;
    assert!(abandoned.is_err(), "the call should still be running");
    let stats = wait_for_stats(&backend, |stats| {
        stats.cancelled == 1 && stats.in_flight == 0
    })
    .await;
    assert_eq!(
        (stats.cancelled, stats.in_flight, stats.requests),
        (1, 0, 1)
    );
}
