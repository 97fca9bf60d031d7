//! gRPC and h2c through the real binary, with a real gRPC server for the pod (tonic, behind a
//! hyper server that speaks HTTP/1.1 and h2c on one port, as a queue-proxy does) and real
//! clients: tonic's, and Python's `grpcio` (another HTTP/2 stack). Pods that speak only HTTP/2
//! (Python's grpcio server, no queue-proxy in front) check that the health probes of an h2c
//! revision speak h2c.
//!
//! Each stream is one request: admitted with one slot, timed, counted, and its failures reach
//! the client as gRPC status codes.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kactivator_testkit::backend::BackendConfig;
use kactivator_testkit::grpc::pb::echo_client::EchoClient;
use kactivator_testkit::grpc::pb::{EchoReply, EchoRequest, StreamRequest};
use kactivator_testkit::grpc::{self, connect, h2c_request, spawn_grpc, GrpcHandle, GrpcStats};
use kactivator_testkit::grpcio::{self, GrpcioPod, Health};
use support::{eventually, revision, Activator};
use tonic::transport::Channel;
use tonic::Code;

const AUTHORITY: &str = "hello-00001.default.svc.cluster.local";

fn pod(name: &str) -> GrpcHandle {
    spawn_grpc(BackendConfig::named(name).with_revision("hello-00001", "default"))
        .expect("spawn the gRPC pod")
}

fn hello(pods: &[&GrpcHandle], extra: &str) -> String {
    let addrs: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    revision("default", "hello-00001", &addrs, extra)
}

fn echo(payload: &'static [u8]) -> EchoRequest {
    EchoRequest {
        payload: Bytes::from_static(payload),
        delay_ms: 0,
        reply_bytes: 0,
    }
}

/// A server-streaming call of `count` 10-byte replies, `interval_ms` apart.
async fn server_stream(
    client: &mut EchoClient<Channel>,
    count: u32,
    interval_ms: u32,
) -> tonic::Streaming<EchoReply> {
    client
        .server_stream(StreamRequest {
            count,
            interval_ms,
            reply_bytes: 10,
        })
        .await
        .expect("server stream")
        .into_inner()
}

/// `message` as a call with a client deadline of `limit`.
fn within(message: EchoRequest, limit: Duration) -> tonic::Request<EchoRequest> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(limit);
    request
}

/// Polls the pod's counters until `condition` holds, for at most `limit`.
async fn pod_stats(
    pod: &GrpcHandle,
    limit: Duration,
    condition: impl Fn(&GrpcStats) -> bool,
) -> GrpcStats {
    let deadline = Instant::now() + limit;
    loop {
        let stats = pod.stats();
        if condition(&stats) || Instant::now() > deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every kind of call works through either data port: unary, server streaming, client
/// streaming and bidirectional streaming, trailers (the gRPC status) included.
#[tokio::test]
async fn unary_and_streaming_calls_pass_through_both_ports() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], "container_concurrency = 4\n"));
    for port in [activator.http2, activator.http] {
        let mut client = connect(port, AUTHORITY).await.expect("connect");
        let reply = client
            .unary(echo(b"ping"))
            .await
            .expect("unary")
            .into_inner();
        assert_eq!(
            (reply.payload.as_ref(), reply.backend.as_str()),
            (&b"ping"[..], "pod-a")
        );

        let mut replies = client
            .server_stream(StreamRequest {
                count: 5,
                interval_ms: 5,
                reply_bytes: 100,
            })
            .await
            .expect("server stream")
            .into_inner();
        let mut seqs = Vec::new();
        while let Some(reply) = replies.message().await.expect("a reply or the end") {
            assert_eq!(reply.payload.len(), 100);
            seqs.push(reply.seq);
        }
        assert_eq!(seqs, [0, 1, 2, 3, 4]);

        let requests = futures_util::stream::iter(vec![echo(b"a"), echo(b"bc"), echo(b"def")]);
        let reply = client
            .client_stream(requests)
            .await
            .expect("client stream")
            .into_inner();
        assert_eq!((reply.payload.as_ref(), reply.seq), (&b"abcdef"[..], 3));

        // Bidi as a conversation: each request is sent only after the previous reply came back,
        // so the exchange needs both directions open at once.
        let (sender, receiver) = tokio::sync::mpsc::channel::<EchoRequest>(1);
        let outbound = tokio_stream_of(receiver);
        sender.send(echo(b"one")).await.unwrap();
        let mut replies = client.bidi(outbound).await.expect("bidi").into_inner();
        for (i, next) in [&b"two"[..], b"three"].iter().enumerate() {
            let reply = replies.message().await.unwrap().expect("a reply");
            assert_eq!(reply.seq, i as u64);
            sender
                .send(EchoRequest {
                    payload: Bytes::copy_from_slice(next),
                    delay_ms: 0,
                    reply_bytes: 0,
                })
                .await
                .unwrap();
        }
        let last = replies.message().await.unwrap().expect("the third reply");
        assert_eq!(last.payload.as_ref(), b"three");
        drop(sender);
        assert!(replies.message().await.expect("clean end").is_none());
    }
    let stats = pod.stats();
    assert_eq!(stats.requests, 8, "{stats:?}");
    assert!(
        stats.h2_connections >= 1,
        "the pod was reached over h2c: {stats:?}"
    );
    assert_eq!(stats.cancelled, 0, "{stats:?}");
}

/// A receiver as a stream, for a client-side request stream fed from the test.
fn tokio_stream_of(
    mut receiver: tokio::sync::mpsc::Receiver<EchoRequest>,
) -> impl futures_util::Stream<Item = EchoRequest> {
    futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// 16 MiB messages go both ways, streamed under flow control rather than buffered whole.
#[tokio::test]
async fn sixteen_mib_messages_both_ways() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], "container_concurrency = 1\n"));
    let mut client = connect(activator.http2, AUTHORITY).await.expect("connect");
    let big = Bytes::from(vec![0x5au8; 16 << 20]);
    let reply = client
        .unary(EchoRequest {
            payload: big.clone(),
            delay_ms: 0,
            reply_bytes: 0,
        })
        .await
        .expect("16 MiB up and back")
        .into_inner();
    assert_eq!(reply.payload.len(), big.len());
    assert!(reply.payload == big, "the echoed payload differs");
    let reply = client
        .unary(EchoRequest {
            payload: Bytes::from_static(b"x"),
            delay_ms: 0,
            reply_bytes: 16 << 20,
        })
        .await
        .expect("16 MiB down")
        .into_inner();
    assert_eq!(reply.payload.len(), 16 << 20);
    // The activator held a window's worth, not the message.
    assert!(
        activator.rss_kib() < 64 * 1024,
        "VmRSS {} KiB after 16 MiB messages",
        activator.rss_kib()
    );
}

/// A client that cancels a stream mid-way frees its slot at once, and the pod sees the reset.
#[tokio::test]
async fn a_client_cancel_mid_stream_frees_the_slot_and_resets_the_pod_stream() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], "container_concurrency = 1\n"));
    let mut client = connect(activator.http2, AUTHORITY).await.expect("connect");
    let mut replies = server_stream(&mut client, 1000, 20).await;
    replies.message().await.expect("first").expect("a reply");
    drop(replies);
    let stats = pod_stats(&pod, Duration::from_secs(3), |stats| {
        stats.cancelled == 1 && stats.in_flight == 0
    })
    .await;
    assert_eq!((stats.cancelled, stats.in_flight), (1, 0), "{stats:?}");
    // With containerConcurrency 1, the next call gets the slot the cancelled one gave back.
    let request = within(echo(b"next"), Duration::from_secs(2));
    let reply = client.unary(request).await.expect("the slot came back");
    assert_eq!(reply.into_inner().payload.as_ref(), b"next");
}

/// A call past its deadline ends for the client; its slot is freed and the pod's stream reset,
/// so the next call is served at once.
#[tokio::test]
async fn a_deadline_exceeded_call_gives_its_slot_back() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], "container_concurrency = 1\n"));
    let mut client = connect(activator.http2, AUTHORITY).await.expect("connect");
    let slow = within(
        EchoRequest {
            delay_ms: 10_000,
            ..echo(b"slow")
        },
        Duration::from_millis(300),
    );
    let status = client.unary(slow).await.expect_err("past its deadline");
    // tonic's client ends a call at its own deadline as CANCELLED "Timeout expired" (and resets
    // the stream); a server-side expiry would be DEADLINE_EXCEEDED. Either way, the call ended.
    assert!(
        status.code() == Code::DeadlineExceeded
            || (status.code() == Code::Cancelled && status.message().contains("Timeout")),
        "{status:?}"
    );
    let stats = pod_stats(&pod, Duration::from_secs(3), |stats| stats.in_flight == 0).await;
    assert_eq!((stats.in_flight, stats.cancelled), (0, 1), "{stats:?}");
    let started = Instant::now();
    let next = within(echo(b"next"), Duration::from_secs(2));
    client
        .unary(next)
        .await
        .expect("served after the slot came back");
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// containerConcurrency 1 holds for streams: 64 concurrent calls on 4 connections, two ports,
/// two shards; the pod never has more than one at a time, and every call succeeds.
#[tokio::test]
async fn containerconcurrency_one_holds_for_64_streams_on_4_connections() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], "container_concurrency = 1\n"));
    let mut clients = Vec::new();
    for port in [
        activator.http2,
        activator.http2,
        activator.http,
        activator.http,
    ] {
        clients.push(connect(port, AUTHORITY).await.expect("connect"));
    }
    let mut calls = Vec::new();
    for i in 0..64 {
        let mut client = clients[i % 4].clone();
        calls.push(tokio::spawn(async move {
            client
                .unary(EchoRequest {
                    payload: Bytes::from(format!("call {i}")),
                    delay_ms: 5,
                    reply_bytes: 0,
                })
                .await
                .map(|reply| reply.into_inner().payload)
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        let payload = call.await.unwrap().expect("every call succeeds");
        assert_eq!(payload, Bytes::from(format!("call {i}")));
    }
    let stats = pod.stats();
    assert_eq!(stats.requests, 64, "{stats:?}");
    assert_eq!(
        stats.max_in_flight, 1,
        "containerConcurrency exceeded: {stats:?}"
    );
}

/// Review finding: one h2c connection per pod and shard, so at containerConcurrency 0 the
/// streams beyond the pod's `SETTINGS_MAX_CONCURRENT_STREAMS` waited behind the others, and
/// with calls that last, the waiting ones ran into the revision's timeout. A pod that allows
/// 100 streams gets 300 concurrent calls, each held at the pod until all have arrived: each
/// stream that finds the connections full opens another, as Go's transport does, and every
/// call reaches the pod at once.
#[tokio::test]
async fn streams_beyond_the_pods_stream_limit_go_on_another_connection() {
    const CALLS: usize = 300;
    let pod = spawn_grpc(
        BackendConfig::named("pod-a")
            .with_revision("hello-00001", "default")
            .with_max_concurrent_streams(100),
    )
    .expect("spawn the gRPC pod");
    let activator = Activator::start(&hello(&[&pod], "timeout_seconds = 60\n"));
    let mut clients = Vec::new();
    for port in [activator.http2, activator.http] {
        clients.push(connect(port, AUTHORITY).await.expect("connect"));
    }
    let mut calls = Vec::new();
    for i in 0..CALLS {
        let mut client = clients[i % 2].clone();
        calls.push(tokio::spawn(async move {
            client
                .unary(EchoRequest {
                    payload: Bytes::from(format!("call {i}")),
                    delay_ms: grpc::HOLD,
                    reply_bytes: 0,
                })
                .await
                .map(|reply| reply.into_inner().payload)
        }));
    }
    // Every call at the pod at once: none waits behind the first connection's stream limit.
    let stats = pod_stats(&pod, Duration::from_secs(30), |stats| {
        stats.in_flight == CALLS as u64
    })
    .await;
    assert_eq!(
        stats.in_flight, CALLS as u64,
        "not all at the pod: {stats:?}"
    );
    assert!(stats.h2_connections >= 3, "{stats:?}");
    pod.release_held();
    let mut failed = Vec::new();
    for (i, call) in calls.into_iter().enumerate() {
        match call.await.unwrap() {
            Ok(payload) => assert_eq!(payload, Bytes::from(format!("call {i}"))),
            Err(status) => failed.push((i, status.code(), status.message().to_string())),
        }
    }
    assert!(
        failed.is_empty(),
        "{} failed: {failed:?}; at the pod: {:?} (when all had arrived: {stats:?})",
        failed.len(),
        pod.stats()
    );
    assert_eq!(pod.stats().requests, CALLS as u64);
}

/// A gRPC call to a revision with no pod waits (the autoscaler is poked) and is served by the
/// first pod that appears.
#[tokio::test]
async fn a_grpc_call_waits_through_scale_from_zero() {
    let activator = Activator::start(&revision("default", "hello-00001", &[], ""));
    let mut client = connect(activator.http2, AUTHORITY).await.expect("connect");
    let call = tokio::spawn(async move { client.unary(echo(b"cold")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!call.is_finished(), "the call must wait for a pod");
    let pod = pod("pod-late");
    activator.write_config(&hello(&[&pod], ""), "");
    let reply = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("served once the pod appeared")
        .unwrap()
        .expect("a reply");
    assert_eq!(reply.into_inner().backend, "pod-late");
}

/// As upstream, the protocol a request arrived in is the one it goes to the pod in, whatever the
/// revision's protocol: h2c to an `http1` revision goes as h2c, HTTP/1.1 to an `h2c` revision as
/// HTTP/1.1 (a queue-proxy takes both on either port). The pod sees `:authority`/Host = itself.
#[tokio::test]
async fn the_inbound_protocol_is_the_outbound_one_for_either_revision_protocol() {
    let pod = pod("pod-a");
    let grpc_pod = spawn_grpc(BackendConfig::named("pod-b").with_revision("grpc-00001", "default"))
        .expect("spawn the gRPC pod");
    let grpc_revision = revision(
        "default",
        "grpc-00001",
        &[grpc_pod.addr()],
        "protocol = \"h2c\"\n",
    );
    let activator = Activator::start(&format!("{}{grpc_revision}", hello(&[&pod], "")));
    let response = h2c_request(activator.http2, AUTHORITY, http::Method::GET, "/", &[])
        .await
        .expect("h2c to an http1 revision");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-http-version"], "HTTP/2.0");
    assert_eq!(
        response.headers()["x-request-authority"],
        pod.addr().to_string().as_str()
    );

    let response = support::exchange(
        activator.http2,
        b"GET / HTTP/1.1\r\nHost: grpc-00001.default.svc.cluster.local\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-http-version"), Some("HTTP/1.1"));
}

/// Over HTTP/2 the activator answers its own probes and unknown revisions as over HTTP/1.
#[tokio::test]
async fn probes_and_unknown_revisions_are_answered_over_h2() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], ""));
    let probe = h2c_request(
        activator.http2,
        AUTHORITY,
        http::Method::GET,
        "/",
        &[("k-network-probe", "activator")],
    )
    .await
    .expect("probe");
    assert_eq!(probe.status(), 200);
    assert_eq!(probe.body().as_ref(), b"activator");
    let unknown = h2c_request(
        activator.http,
        "nope.default.svc.cluster.local",
        http::Method::GET,
        "/",
        &[],
    )
    .await
    .expect("unknown revision");
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        unknown.body().as_ref(),
        b"Error getting active endpoint: revision.serving.knative.dev \"nope\" not found\n"
    );
    assert_eq!(pod.stats().requests, 0);
}

/// A pod that dies mid-stream fails only that stream, with UNAVAILABLE and the cause; the
/// next call goes to the pod that is left.
#[tokio::test]
async fn a_pod_killed_mid_stream_fails_that_stream_with_unavailable() {
    let doomed = pod("pod-doomed");
    let survivor = pod("pod-survivor");
    let activator = Activator::start_with(
        &hello(
            &[&doomed, &survivor],
            "container_concurrency = 1\nload_balancing_policy = \"first-available\"\n",
        ),
        "",
        &["--shards", "1"],
        &[],
    );
    let mut client = connect(activator.http2, AUTHORITY).await.expect("connect");
    let mut replies = server_stream(&mut client, 1000, 20).await;
    let first = replies.message().await.expect("first").expect("a reply");
    let victim = if first.backend == "pod-doomed" {
        doomed
    } else {
        survivor
    };
    let victim_name = first.backend.clone();
    victim.shutdown();
    let status = loop {
        match replies.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended cleanly although its pod died"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let next = within(echo(b"next"), Duration::from_secs(5));
    let reply = client.unary(next).await.expect("the other pod serves");
    assert_ne!(reply.into_inner().backend, victim_name);
}

/// SIGTERM: clients get GOAWAY at the start of the grace period (an idle connection closes at
/// once), the streams they have open finish, and a new connection is served while the listeners
/// still accept.
#[tokio::test]
async fn a_drain_lets_open_streams_finish() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], ""));
    let mut client = connect(activator.http2, AUTHORITY).await.expect("connect");
    let mut replies = server_stream(&mut client, 10, 50).await;
    replies.message().await.expect("first").expect("a reply");
    // A second client connection, idle: it must be told to go (GOAWAY) at the start of the
    // grace period, not when the listeners close.
    let idle = tokio::net::TcpStream::connect(activator.http2)
        .await
        .unwrap();
    let (idle_sender, idle_connection) = h2::client::handshake(idle).await.expect("handshake");
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = ended_tx.send(idle_connection.await);
    });
    let idle_sender = idle_sender.ready().await.expect("the connection is up");
    activator.send_signal("TERM");
    let signalled = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), ended_rx)
        .await
        .expect("the idle connection ends")
        .unwrap();
    assert!(
        signalled.elapsed() < Duration::from_millis(700),
        "the idle h2 connection ended {:?} after SIGTERM: after the grace period, not at its start",
        signalled.elapsed()
    );
    assert!(
        ended
            .as_ref()
            .map_or_else(|error| error.is_go_away(), |()| true),
        "ended without GOAWAY: {ended:?}"
    );
    drop(idle_sender);
    // The listeners still accept during the grace period: a new connection is served.
    let fresh = h2c_request(activator.http2, AUTHORITY, http::Method::GET, "/", &[])
        .await
        .expect("a new connection during the grace period");
    assert_eq!(fresh.status(), 200);
    let mut received = 1;
    while let Some(_reply) = replies.message().await.expect("the open stream finishes") {
        received += 1;
    }
    assert_eq!(received, 10);
    assert_eq!(pod.stats().cancelled, 0);
}

/// Python's grpcio (C core, another HTTP/2 implementation) through the activator: unary,
/// streaming both ways and a 16 MiB message. Needs grpcio and grpcio-tools in the interpreter
/// `grpcio::python` picks (`scripts/test.sh` installs them in target/venv).
#[test]
fn grpcio_calls_through_the_activator() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], "container_concurrency = 2\n"));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/testkit/python/echo_client.py");
    for (port, call) in [
        (activator.http2, vec!["unary"]),
        (activator.http, vec!["server-stream", "5"]),
        (activator.http2, vec!["bidi", "5"]),
        (activator.http2, vec!["big", "16"]),
    ] {
        let output = Command::new(grpcio::python())
            .arg(script)
            .args(["--target", &port.to_string(), "--authority", AUTHORITY])
            .args(&call)
            .output()
            .expect("run the Python interpreter");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "grpcio {call:?} failed ({}: {}?)\n{stdout}\n{stderr}",
            grpcio::python().display(),
            grpcio::INSTALL_HINT
        );
        assert!(stdout.contains("\"ok\": true"), "{stdout}");
    }
    assert!(pod.stats().requests >= 4);
}

/// Requests counted on the activator's metrics like HTTP/1 ones (`activator_request_count`),
/// per status.
#[tokio::test]
async fn h2_streams_are_counted_in_the_request_metrics() {
    let pod = pod("pod-a");
    let activator = Activator::start(&hello(&[&pod], ""));
    let mut client = connect(activator.http2, AUTHORITY).await.expect("connect");
    for _ in 0..3 {
        client.unary(echo(b"x")).await.expect("unary");
    }
    // A stream is counted when it ends, after its last frame went out: the scrape may race
    // the last one, so wait for the count to reach what was sent, then hold it to exactly that.
    let counted = || activator.metric_sum("activator_request_count", &["response_code=\"200\""]);
    support::eventually(Duration::from_secs(5), || counted() >= 3.0);
    assert_eq!(counted(), 3.0, "{}", activator.metrics());
}

// === pods that speak only HTTP/2 ===

const GRPC_AUTHORITY: &str = "grpc-00001.default.svc.cluster.local";

/// A grpcio pod on 127.0.0.1: gRPC over HTTP/2 only, no queue-proxy in front.
fn grpcio_pod(name: &str, health: Health) -> GrpcioPod {
    GrpcioPod::spawn(SocketAddr::from(([127, 0, 0, 1], 0)), name, health)
        .expect("spawn the grpcio pod")
}

/// The h2c revision `default/grpc-00001` with these pods, everything else default.
fn grpc_revision(pods: &[&GrpcioPod]) -> String {
    let addrs: Vec<SocketAddr> = pods.iter().map(|pod| pod.addr()).collect();
    revision("default", "grpc-00001", &addrs, "protocol = \"h2c\"\n")
}

/// `message` with a client deadline of `limit`, for any kind of call.
fn deadline<T>(message: T, limit: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(limit);
    request
}

/// Unary, server-streaming and bidi calls and 16 MiB messages both ways through `port`; every
/// call has a deadline, so a pod that is never routable fails the test instead of hanging it.
async fn every_kind_of_call(port: SocketAddr, backend: &str) {
    const LIMIT: Duration = Duration::from_secs(10);
    let mut client = connect(port, GRPC_AUTHORITY).await.expect("connect");
    let reply = client
        .unary(deadline(echo(b"ping"), LIMIT))
        .await
        .unwrap_or_else(|status| panic!("unary through {port}: {status:?}"))
        .into_inner();
    assert_eq!(
        (reply.payload.as_ref(), reply.backend.as_str()),
        (&b"ping"[..], backend)
    );

    let stream = StreamRequest {
        count: 5,
        interval_ms: 5,
        reply_bytes: 100,
    };
    let mut replies = client
        .server_stream(deadline(stream, LIMIT))
        .await
        .expect("server stream")
        .into_inner();
    let mut seqs = Vec::new();
    while let Some(reply) = replies.message().await.expect("a reply or the end") {
        assert_eq!(reply.payload.len(), 100);
        seqs.push(reply.seq);
    }
    assert_eq!(seqs, [0, 1, 2, 3, 4]);

    // Bidi as a conversation: each request goes only after the previous reply came back.
    let (sender, receiver) = tokio::sync::mpsc::channel::<EchoRequest>(1);
    sender.send(echo(b"one")).await.unwrap();
    let mut replies = client
        .bidi(deadline(tokio_stream_of(receiver), LIMIT))
        .await
        .expect("bidi")
        .into_inner();
    for (i, next) in [&b"two"[..], b"three"].iter().enumerate() {
        let reply = replies.message().await.unwrap().expect("a reply");
        assert_eq!(reply.seq, i as u64);
        let next = EchoRequest {
            payload: Bytes::copy_from_slice(next),
            ..echo(b"")
        };
        sender.send(next).await.unwrap();
    }
    let last = replies.message().await.unwrap().expect("the third reply");
    assert_eq!((last.payload.as_ref(), last.seq), (&b"three"[..], 2));
    drop(sender);
    assert!(replies.message().await.expect("clean end").is_none());

    let big = Bytes::from(vec![0xa5u8; 16 << 20]);
    let up = EchoRequest {
        payload: big.clone(),
        ..echo(b"")
    };
    let reply = client
        .unary(deadline(up, Duration::from_secs(60)))
        .await
        .expect("16 MiB up and back")
        .into_inner();
    assert!(reply.payload == big, "the echoed 16 MiB differ");
    let down = EchoRequest {
        reply_bytes: 16 << 20,
        ..echo(b"x")
    };
    let reply = client
        .unary(deadline(down, Duration::from_secs(60)))
        .await
        .expect("16 MiB down")
        .into_inner();
    assert_eq!(reply.payload.len(), 16 << 20);
    assert!(
        reply
            .payload
            .iter()
            .enumerate()
            .all(|(i, byte)| *byte == kactivator_testkit::pattern_byte(i as u64)),
        "the 16 MiB reply is not the pattern"
    );
}

/// A pod that speaks only HTTP/2 — a plain grpcio server without the health service, as users
/// run one standalone — behind the default configuration (quarantine on): the prober checks it
/// over h2c (the health check answered UNIMPLEMENTED: up and dispatching calls), it stays
/// routable, and every kind of call and 16 MiB messages go through both data ports. Probed over
/// HTTP/1.1, the pod failed (`invalid HTTP version`) and was quarantined for good: every call
/// waited until its deadline.
#[tokio::test]
async fn an_http2_only_grpc_pod_serves_with_the_default_configuration() {
    let pod = grpcio_pod("grpcio-a", Health::Absent);
    let activator = Activator::start(&grpc_revision(&[&pod]));
    // A new pod's first probe comes within `health.probe_interval_ms` (1 s).
    assert!(
        eventually(Duration::from_secs(10), || activator
            .metric_sum("activator_pod_probes_total", &[])
            >= 1.0),
        "{}",
        activator.metrics()
    );
    for port in [activator.http2, activator.http] {
        every_kind_of_call(port, "grpcio-a").await;
    }
    // A pod logs each call before it answers; the log reaches the test a moment later.
    assert!(
        eventually(Duration::from_secs(5), || pod.calls() >= 10),
        "{:?}",
        pod.lines()
    );
    assert_eq!(pod.calls(), 10, "{:?}", pod.lines());
    assert!(
        pod.health_checks() >= 1,
        "probed with the gRPC health check: {:?}",
        pod.lines()
    );
    let metrics = activator.metrics();
    assert_eq!(
        activator.metric_sum("activator_pod_probes_total", &["result=\"unhealthy\""]),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        activator.metric_sum("activator_pod_quarantine_entries_total", &[]),
        0.0,
        "{metrics}"
    );
}

/// The h2c probe still fails a pod that says it is not serving: of two HTTP/2-only pods with
/// the standard health service, the one answering NOT_SERVING is quarantined and gets no call,
/// the one answering SERVING serves them all.
#[tokio::test]
async fn a_not_serving_grpc_pod_is_quarantined_while_a_serving_one_serves() {
    let sick = grpcio_pod("grpcio-sick", Health::NotServing);
    let well = grpcio_pod("grpcio-well", Health::Serving);
    let activator = Activator::start(&grpc_revision(&[&sick, &well]));
    assert!(
        eventually(Duration::from_secs(10), || {
            activator.metric_sum("activator_pod_quarantine_entries_total", &[]) >= 1.0
                && activator.metric_sum("activator_pod_probes_total", &["result=\"healthy\""])
                    >= 1.0
        }),
        "{}",
        activator.metrics()
    );
    let mut client = connect(activator.http2, GRPC_AUTHORITY)
        .await
        .expect("connect");
    for _ in 0..20 {
        let reply = client
            .unary(deadline(echo(b"x"), Duration::from_secs(5)))
            .await
            .expect("served")
            .into_inner();
        assert_eq!(reply.backend, "grpcio-well");
    }
    // A pod logs each call before it answers; the log reaches the test a moment later.
    assert!(
        eventually(Duration::from_secs(5), || well.calls() >= 20),
        "{:?}",
        well.lines()
    );
    assert_eq!(well.calls(), 20, "{:?}", well.lines());
    assert_eq!(sick.calls(), 0, "{:?}", sick.lines());
    assert!(
        sick.lines().iter().any(|line| line == "health NOT_SERVING"),
        "{:?}",
        sick.lines()
    );
    assert!(
        well.lines().iter().any(|line| line == "health SERVING"),
        "{:?}",
        well.lines()
    );
    // Only the sick pod ever left routing.
    assert_eq!(
        activator.metric_sum(
            "pod_state_transitions_total",
            &["from_state=\"ready\"", "to_state=\"quarantined\""]
        ),
        1.0,
        "{}",
        activator.metrics()
    );
}
