use std::time::{Duration, Instant};

use kactivator_api::RevisionKey;
use kactivator_shards::routing::Protocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::super::tests::{NAMESPACE, REVISION};
use super::super::{Connection, ProbeResult, QUOTED_BODY};
use super::*;

fn key() -> RevisionKey {
    RevisionKey::new(NAMESPACE, REVISION).unwrap()
}
const TIMEOUT: Duration = Duration::from_secs(5);

/// [`super::super::probe`] of an HTTP/1 revision.
async fn probe(addr: SocketAddr, revision: &RevisionKey, timeout: Duration) -> ProbeResult {
    super::super::probe(addr, revision, Protocol::Http1, timeout).await
}

/// [`super::super::probe_on`] of an HTTP/1 revision.
async fn probe_on(
    kept: Option<Connection>,
    addr: SocketAddr,
    revision: &RevisionKey,
    timeout: Duration,
    keep_alive: bool,
) -> (ProbeResult, Option<Connection>) {
    super::super::probe_on(
        kept,
        addr,
        revision,
        Protocol::Http1,
        None,
        timeout,
        keep_alive,
    )
    .await
}

// === probe against real sockets ===

/// A pod that answers one connection with `response` (after reading the request head)
/// and hands the request head it got to the returned receiver.
async fn pod(
    response: impl AsRef<[u8]> + Send + 'static,
) -> (SocketAddr, oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (head_sender, head_receiver) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let head = read_head(&mut stream).await;
        let _ = head_sender.send(head);
        let _ = stream.write_all(response.as_ref()).await;
        let _ = stream.shutdown().await;
    });
    (addr, head_receiver)
}

async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|window| window == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => head.extend_from_slice(&buffer[..read]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

async fn probe_pod(response: &'static str) -> ProbeResult {
    let (addr, _head) = pod(response).await;
    probe(addr, &key(), TIMEOUT).await
}

#[tokio::test]
async fn a_queue_proxy_answering_queue_is_healthy_and_sees_the_probe_headers() {
    let (addr, head) = pod("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nqueue").await;
    assert_eq!(probe(addr, &key(), TIMEOUT).await, ProbeResult::Healthy);
    let head = head.await.unwrap();
    let lines: Vec<&str> = head.split("\r\n").collect();
    assert_eq!(lines[0], "GET /healthz HTTP/1.1");
    for expected in [
        format!("Host: {addr}"),
        "K-Network-Probe: queue".to_owned(),
        "User-Agent: Knative-Activator-Probe".to_owned(),
        "Connection: close".to_owned(),
    ] {
        assert!(
            lines.contains(&expected.as_str()),
            "{expected:?} in {head:?}"
        );
    }
}

#[tokio::test]
async fn chunked_and_close_delimited_bodies_are_read() {
    assert_eq!(
        probe_pod(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nque\r\n2\r\nue\r\n0\r\n\r\n"
        )
        .await,
        ProbeResult::Healthy
    );
    assert_eq!(
        probe_pod("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nqueue").await,
        ProbeResult::Healthy
    );
    assert_eq!(
        probe_pod("HTTP/1.0 200 OK\r\n\r\nqueue").await,
        ProbeResult::Healthy
    );
}

#[tokio::test]
async fn a_wrong_body_is_unhealthy() {
    assert_eq!(
        probe_pod("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnope").await,
        ProbeResult::Answered {
            status: 200,
            reason: r#"body "nope""#.into()
        }
    );
}

#[tokio::test]
async fn a_503_is_unhealthy() {
    assert_eq!(
        probe_pod("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n").await,
        ProbeResult::Answered {
            status: 503,
            reason: "status 503".into()
        }
    );
}

#[tokio::test]
async fn matching_revision_headers_are_healthy() {
    assert_eq!(
            probe_pod("HTTP/1.1 200 OK\r\nX-Knative-Revision-Name: hello-00001\r\nX-Knative-Revision-Namespace: default\r\nContent-Length: 5\r\n\r\nqueue").await,
            ProbeResult::Healthy
        );
}

#[tokio::test]
async fn another_revisions_headers_mean_the_ip_was_reused() {
    assert_eq!(
            probe_pod("HTTP/1.1 200 OK\r\nx-knative-revision-name: other-00003\r\nx-knative-revision-namespace: team\r\nContent-Length: 5\r\n\r\nqueue").await,
            ProbeResult::IpReused {
                namespace: "team".into(),
                revision: "other-00003".into()
            }
        );
    // Whatever the status.
    assert_eq!(
            probe_pod("HTTP/1.1 503 Service Unavailable\r\nX-Knative-Revision-Name: other-00003\r\nX-Knative-Revision-Namespace: default\r\nContent-Length: 0\r\n\r\n").await,
            ProbeResult::IpReused {
                namespace: "default".into(),
                revision: "other-00003".into()
            }
        );
}

#[tokio::test]
async fn one_wrong_revision_header_alone_means_the_ip_was_reused() {
    assert_eq!(
            probe_pod("HTTP/1.1 200 OK\r\nX-Knative-Revision-Name: other-00003\r\nContent-Length: 5\r\n\r\nqueue").await,
            ProbeResult::IpReused {
                namespace: String::new(),
                revision: "other-00003".into()
            }
        );
}

/// A pod that answers `answers` on each connection, up to `per_connection` requests each
/// (then closes it), counting the connections it accepted.
async fn keep_alive_pod(
    answer: &'static str,
    per_connection: usize,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                for _ in 0..per_connection {
                    if read_head(&mut stream).await.is_empty() {
                        return;
                    }
                    if stream.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

const KEEP_ALIVE_QUEUE: &str = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nqueue";

#[tokio::test]
async fn a_healthy_pods_connection_carries_its_next_probes() {
    let (addr, accepted) = keep_alive_pod(KEEP_ALIVE_QUEUE, usize::MAX).await;
    let mut kept = None;
    for _ in 0..3 {
        let (result, connection) = probe_on(kept, addr, &key(), TIMEOUT, true).await;
        assert_eq!(result, ProbeResult::Healthy);
        assert!(connection.is_some(), "kept for the next probe");
        kept = connection;
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_kept_connection_the_pod_closed_is_retried_on_a_new_one_without_blame() {
    let (addr, accepted) = keep_alive_pod(KEEP_ALIVE_QUEUE, 1).await;
    let (result, kept) = probe_on(None, addr, &key(), TIMEOUT, true).await;
    assert_eq!(result, ProbeResult::Healthy);
    // The pod closes its end after one answer.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (result, _) = probe_on(kept, addr, &key(), TIMEOUT, true).await;
    assert_eq!(result, ProbeResult::Healthy);
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_unhealthy_pods_connection_is_not_kept() {
    let (addr, _) = keep_alive_pod(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
        usize::MAX,
    )
    .await;
    let (result, kept) = probe_on(None, addr, &key(), TIMEOUT, true).await;
    assert_eq!(result.label(), "unhealthy");
    assert!(kept.is_none());
}

#[tokio::test]
async fn a_refused_connection_is_unhealthy() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let ProbeResult::Unhealthy(reason) = probe(addr, &key(), TIMEOUT).await else {
        panic!("nothing listens on {addr}");
    };
    assert!(reason.starts_with("connect: "), "{reason}");
    assert!(reason.to_lowercase().contains("refused"), "{reason}");
}

#[tokio::test]
async fn a_pod_that_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed_sender, closed_receiver) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        // Read until the prober gives up and closes its end.
        let mut sink = Vec::new();
        let _ = stream.read_to_end(&mut sink).await;
        let _ = closed_sender.send(());
    });
    let started = Instant::now();
    let result = probe(addr, &key(), Duration::from_millis(200)).await;
    assert_eq!(
        result,
        ProbeResult::Unhealthy("timed out after 200ms".into())
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    // The timeout closes the socket rather than leaving it to linger.
    tokio::time::timeout(TIMEOUT, closed_receiver)
        .await
        .expect("the prober closes its connection on timeout")
        .unwrap();
}

/// A pod that sends `head` and then `filler` forever, until the prober hangs up; returns
/// how many body bytes it managed to write.
async fn endless_pod(head: &'static str) -> (SocketAddr, oneshot::Receiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (written_sender, written_receiver) = oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        read_head(&mut stream).await;
        let filler = vec![b'q'; 16 * 1024];
        let mut written = 0;
        if stream.write_all(head.as_bytes()).await.is_ok() {
            while stream.write_all(&filler).await.is_ok() {
                written += filler.len();
            }
        }
        let _ = written_sender.send(written);
    });
    (addr, written_receiver)
}

#[tokio::test]
async fn an_endless_body_is_capped_not_buffered() {
    for head in [
        "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n",
    ] {
        let (addr, written) = endless_pod(head).await;
        let result = probe(addr, &key(), TIMEOUT).await;
        let expected = format!("body {:?}...", "q".repeat(QUOTED_BODY));
        assert_eq!(
            result,
            ProbeResult::Answered {
                status: 200,
                reason: expected
            },
            "{head:?}"
        );
        // The pod's writes fail soon after the prober stops reading and hangs up; what
        // it got out is bounded by socket buffers, not by what it wanted to send.
        let written = tokio::time::timeout(TIMEOUT, written)
            .await
            .expect("the prober hangs up")
            .unwrap();
        assert!(written < 64 * 1024 * 1024, "{written} bytes for {head:?}");
    }
}

#[tokio::test]
async fn an_endless_response_head_is_refused() {
    let (addr, _written) = endless_pod("HTTP/1.1 200 OK\r\nX-Long: ").await;
    let ProbeResult::Unhealthy(reason) = probe(addr, &key(), TIMEOUT).await else {
        panic!("an endless head is not healthy");
    };
    assert!(reason.starts_with("response: "), "{reason}");
}

#[tokio::test]
async fn malformed_responses_are_unhealthy() {
    for response in [
        "garbage\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\nqueue",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nqueue\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nque",
        "",
    ] {
        let result = probe_pod(response).await;
        let ProbeResult::Unhealthy(reason) = &result else {
            panic!("{response:?} gave {result:?}");
        };
        assert!(
            reason.starts_with("response: ") || reason.starts_with("body: "),
            "{response:?}: {reason}"
        );
    }
}
