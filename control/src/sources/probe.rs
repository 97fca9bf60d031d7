//! The active health check of one pod: `GET /healthz` with `K-Network-Probe: queue`, as the
//! upstream activator probes a queue-proxy, plus the fork's IP-reuse check on the revision
//! headers. Runs on the control thread, never on the request path.
//!
//! [`probe_on`] does the I/O over the data plane's HTTP/1 codec (`kactivator_h1`): one request
//! on a connection kept from the pod's last probe, or on a new one, everything under one
//! timeout; a healthy pod's connection comes back for its next probe. [`probe`] is one probe on
//! a new connection. [`judge`] decides from what came back and is what the tests of the rules
//! exercise.

use std::net::SocketAddr;
use std::time::Duration;

use kactivator_api::headers::{
    NETWORK_PROBE, SERVING_REVISION_NAME, SERVING_REVISION_NAMESPACE, USER_AGENT,
};
use kactivator_api::probe::{HEALTH_PATH, HEALTH_USER_AGENT, QUEUE};
use kactivator_api::RevisionKey;
use kactivator_h1::{parse_response, BodyDecoder, BodyEvent, Method, Parsed, ResponseHead};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// At most this much of a response body is read; a healthy one is five bytes.
pub const BODY_LIMIT: usize = 4 * 1024;

/// Longest piece of a wrong body quoted in [`ProbeResult::Answered`].
const QUOTED_BODY: usize = 64;

/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

/// What a probe found out about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// 200 with body `queue`, and no revision headers naming another revision.
    Healthy,
    /// No usable answer: the reason is for logs, e.g.
    /// `connect: Connection refused (os error 111)`, `timed out after 2s`.
    Unhealthy(String),
    /// An HTTP answer that is not a healthy queue-proxy's (another status, or another body);
    /// the reason is for logs: `status 503`, `body "nope"`.
    Answered { status: u16, reason: String },
    /// The pod answered in the name of another revision: its address was given to a new pod.
    /// Holds the headers' values (empty for an absent one).
    IpReused {
        /// `X-Knative-Revision-Namespace` of the response.
        namespace: String,
        /// `X-Knative-Revision-Name` of the response.
        revision: String,
    },
}

impl ProbeResult {
    /// The `result` label of the probe counters: `healthy`, `unhealthy` or `ip_reused`.
    pub fn label(&self) -> &'static str {
        match self {
            ProbeResult::Healthy => "healthy",
            ProbeResult::Unhealthy(_) | ProbeResult::Answered { .. } => "unhealthy",
            ProbeResult::IpReused { .. } => "ip_reused",
        }
    }

    /// A failure a service mesh could cause (upstream's `IsPotentialMeshErrorResponse`): no
    /// answer at all, or 502/503, what a sidecar says when it refuses plain traffic to the pod.
    /// Any other answer came from something that is not a mesh, which rules out falling back
    /// to the revision's Service.
    pub fn mesh_like(&self) -> bool {
        match self {
            ProbeResult::Unhealthy(_) => true,
            ProbeResult::Answered { status, .. } => matches!(status, 502 | 503),
            ProbeResult::Healthy | ProbeResult::IpReused { .. } => false,
        }
    }

    /// Why the probe did not pass, for logs (empty when it passed).
    pub fn reason(&self) -> String {
        match self {
            ProbeResult::Healthy => String::new(),
            ProbeResult::Unhealthy(reason) | ProbeResult::Answered { reason, .. } => reason.clone(),
            ProbeResult::IpReused {
                namespace,
                revision,
            } => format!("answered for {namespace}/{revision}"),
        }
    }
}

/// What a probe response said, as far as [`judge`] cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// `X-Knative-Revision-Name`, if sent.
    pub revision_name: Option<Vec<u8>>,
    /// `X-Knative-Revision-Namespace`, if sent.
    pub revision_namespace: Option<Vec<u8>>,
    /// The first [`BODY_LIMIT`] bytes of the body.
    pub body: Vec<u8>,
    /// The body was longer than [`BODY_LIMIT`] and the rest was not read.
    pub body_truncated: bool,
}

/// A connection to a pod kept from its last probe, clean (nothing unread) and idle.
pub struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

/// Probes the pod at `addr` for `revision` on a new connection, closed afterwards whatever
/// happened. Connecting, writing and reading all count against `timeout`.
pub async fn probe(addr: SocketAddr, revision: &RevisionKey, timeout: Duration) -> ProbeResult {
    probe_on(None, addr, revision, timeout, false).await.0
}

/// Probes the pod at `addr` for `revision`, on `kept` when given, else on a new connection;
/// with `keep_alive`, returns the connection when it can carry the next probe. A kept
/// connection that fails before any byte of an answer (the pod closed it while it was idle) is
/// not the pod's fault: the probe is made again on a new connection. Connecting, writing and
/// reading all count against `timeout`.
pub async fn probe_on(
    kept: Option<Connection>,
    addr: SocketAddr,
    revision: &RevisionKey,
    timeout: Duration,
    keep_alive: bool,
) -> (ProbeResult, Option<Connection>) {
    match tokio::time::timeout(timeout, attempt(kept, addr, keep_alive)).await {
        Err(_) => (
            ProbeResult::Unhealthy(format!("timed out after {timeout:?}")),
            None,
        ),
        Ok(Err(failure)) => (ProbeResult::Unhealthy(failure.reason), None),
        Ok(Ok((answer, connection))) => {
            let result = judge(&answer, revision.namespace(), revision.name());
            // Only a healthy pod's connection is worth keeping.
            let connection = connection.filter(|_| result == ProbeResult::Healthy);
            (result, connection)
        }
    }
}

/// Why an exchange failed, and whether any byte of an answer had arrived.
struct Failure {
    reason: String,
    answered: bool,
}

impl Failure {
    fn new(reason: String, answered: bool) -> Failure {
        Failure { reason, answered }
    }
}

async fn attempt(
    kept: Option<Connection>,
    addr: SocketAddr,
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    if let Some(connection) = kept {
        match exchange(connection, addr, keep_alive).await {
            Err(failure) if !failure.answered => {
                tracing::debug!(pod = %addr, "kept probe connection closed: {}", failure.reason);
            }
            done => return done,
        }
    }
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|error| Failure::new(format!("connect: {error}"), false))?;
    let _ = stream.set_nodelay(true);
    let connection = Connection {
        stream,
        buffer: Vec::new(),
    };
    exchange(connection, addr, keep_alive).await
}

/// One request and its response on `connection`; the connection back when it may carry another.
async fn exchange(
    mut connection: Connection,
    addr: SocketAddr,
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    let close = if keep_alive {
        ""
    } else {
        "Connection: close\r\n"
    };
    let request = format!(
        "GET {HEALTH_PATH} HTTP/1.1\r\nHost: {addr}\r\n{NETWORK_PROBE}: {QUEUE}\r\n{USER_AGENT}: {HEALTH_USER_AGENT}\r\n{close}\r\n"
    );
    let Connection { stream, buffer } = &mut connection;
    buffer.clear();
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|error| Failure::new(format!("request: {error}"), false))?;
    let mut head = ResponseHead::default();
    loop {
        match parse_response(buffer, Method::Get, &mut head) {
            Ok(Parsed::Complete) if head.is_informational() && head.status != 101 => {
                buffer.drain(..head.len);
                continue;
            }
            Ok(Parsed::Complete) => break,
            Ok(Parsed::Partial) => {}
            Err(error) => return Err(Failure::new(format!("response: {error}"), true)),
        }
        let answered = !buffer.is_empty();
        let read = read_more(stream, buffer)
            .await
            .map_err(|error| Failure::new(format!("response: {error}"), answered))?;
        if read == 0 {
            return Err(Failure::new(
                "response: connection closed before a complete response head".into(),
                answered,
            ));
        }
    }
    let header = |name: &str| head.header(buffer, name).map(<[u8]>::to_vec);
    let mut answer = Answer {
        status: head.status,
        revision_name: header(SERVING_REVISION_NAME),
        revision_namespace: header(SERVING_REVISION_NAMESPACE),
        ..Answer::default()
    };
    let reusable = keep_alive && head.keep_alive();
    buffer.drain(..head.len);
    let mut decoder = BodyDecoder::new(head.body);
    let body_failure = |error: String| Failure::new(format!("body: {error}"), true);
    let mut ended = false;
    loop {
        let (consumed, event) = decoder
            .decode(buffer)
            .map_err(|error| body_failure(error.to_string()))?;
        let idle = consumed == 0 && event.is_none();
        match event {
            Some(BodyEvent::Data(data)) => {
                let room = BODY_LIMIT - answer.body.len();
                if data.len() > room {
                    answer.body.extend_from_slice(&data[..room]);
                    answer.body_truncated = true;
                } else {
                    answer.body.extend_from_slice(data);
                }
            }
            Some(BodyEvent::End) => ended = true,
            Some(BodyEvent::Trailers(_)) | None => {}
        }
        buffer.drain(..consumed);
        if ended || answer.body_truncated {
            break;
        }
        if idle {
            let read = read_more(stream, buffer)
                .await
                .map_err(|error| body_failure(error.to_string()))?;
            if read == 0 {
                // The close ends a close-delimited body; any other body was cut short.
                decoder
                    .finish()
                    .map_err(|error| body_failure(error.to_string()))?;
                break;
            }
        }
    }
    let clean = ended && !answer.body_truncated && buffer.is_empty();
    Ok((answer, (reusable && clean).then_some(connection)))
}

async fn read_more(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> std::io::Result<usize> {
    buffer.reserve(READ_CHUNK);
    stream.read_buf(buffer).await
}

/// Decides a probe from its response.
///
/// * Identity first, whatever the status: if either revision header is non-empty, both must
///   equal the expected revision, otherwise [`ProbeResult::IpReused`]. An empty header counts
///   as absent (Go's `Header.Get` cannot tell them apart, and the fork compared its results).
///   With both absent (a queue-proxy older than the fork) the pod is judged on the rest.
/// * Then the status must be exactly 200 (upstream's prober; the fork took any 2xx).
/// * Then the body must be exactly `queue`: no trimming. That is upstream's check and what a
///   queue-proxy writes; something answering `queue\n` is not a queue-proxy.
pub fn judge(answer: &Answer, namespace: &str, revision: &str) -> ProbeResult {
    if let Some((namespace, revision)) = kactivator_shards::request::identity::other_revision(
        answer.revision_name.as_deref(),
        answer.revision_namespace.as_deref(),
        namespace,
        revision,
    ) {
        return ProbeResult::IpReused {
            namespace,
            revision,
        };
    }
    if answer.status != 200 {
        return ProbeResult::Answered {
            status: answer.status,
            reason: format!("status {}", answer.status),
        };
    }
    if answer.body_truncated || answer.body != QUEUE.as_bytes() {
        return ProbeResult::Answered {
            status: answer.status,
            reason: format!("body {}", quote(answer)),
        };
    }
    ProbeResult::Healthy
}

/// The start of a wrong body, quoted for a log line.
fn quote(answer: &Answer) -> String {
    let shown = &answer.body[..answer.body.len().min(QUOTED_BODY)];
    let mut quoted = format!("{:?}", String::from_utf8_lossy(shown));
    if answer.body_truncated || answer.body.len() > QUOTED_BODY {
        quoted.push_str("...");
    }
    quoted
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::oneshot;

    use super::*;

    const NAMESPACE: &str = "default";
    const REVISION: &str = "hello-00001";

    fn key() -> RevisionKey {
        RevisionKey::new(NAMESPACE, REVISION).unwrap()
    }
    const TIMEOUT: Duration = Duration::from_secs(5);

    // === judge (no I/O) ===

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status,
            body: body.as_bytes().to_vec(),
            ..Answer::default()
        }
    }

    fn with_identity(mut answer: Answer, namespace: Option<&str>, name: Option<&str>) -> Answer {
        answer.revision_namespace = namespace.map(|value| value.as_bytes().to_vec());
        answer.revision_name = name.map(|value| value.as_bytes().to_vec());
        answer
    }

    #[test]
    fn judge_follows_the_rules_in_order() {
        let reused = |namespace: &str, revision: &str| ProbeResult::IpReused {
            namespace: namespace.into(),
            revision: revision.into(),
        };
        let unhealthy = |status: u16, reason: &str| ProbeResult::Answered {
            status,
            reason: reason.into(),
        };
        let cases = [
            (answer(200, "queue"), ProbeResult::Healthy),
            (answer(200, "queue\n"), unhealthy(200, r#"body "queue\n""#)),
            (answer(200, ""), unhealthy(200, r#"body """#)),
            (answer(204, "queue"), unhealthy(204, "status 204")),
            (answer(503, ""), unhealthy(503, "status 503")),
            (
                with_identity(answer(200, "queue"), Some(NAMESPACE), Some(REVISION)),
                ProbeResult::Healthy,
            ),
            (
                with_identity(answer(503, ""), Some(NAMESPACE), Some(REVISION)),
                unhealthy(503, "status 503"),
            ),
            (
                with_identity(answer(200, "queue"), Some(NAMESPACE), Some("other-00001")),
                reused(NAMESPACE, "other-00001"),
            ),
            (
                with_identity(answer(503, ""), Some("other"), Some(REVISION)),
                reused("other", REVISION),
            ),
            // One header alone, even a right one, cannot vouch for the pod.
            (
                with_identity(answer(200, "queue"), None, Some(REVISION)),
                reused("", REVISION),
            ),
            (
                with_identity(answer(200, "queue"), Some(NAMESPACE), None),
                reused(NAMESPACE, ""),
            ),
            // Empty values are as good as absent.
            (
                with_identity(answer(200, "queue"), Some(""), Some("")),
                ProbeResult::Healthy,
            ),
            (
                with_identity(answer(200, "queue"), Some(""), Some(REVISION)),
                reused("", REVISION),
            ),
        ];
        for (answer, expected) in cases {
            assert_eq!(judge(&answer, NAMESPACE, REVISION), expected, "{answer:?}");
        }
    }

    #[test]
    fn only_no_answer_or_a_502_or_503_could_be_a_mesh() {
        let answered = |status| ProbeResult::Answered {
            status,
            reason: String::new(),
        };
        assert!(ProbeResult::Unhealthy("connect: refused".into()).mesh_like());
        assert!(answered(502).mesh_like());
        assert!(answered(503).mesh_like());
        for status in [200, 404, 500, 504] {
            assert!(!answered(status).mesh_like(), "{status}");
        }
        assert!(!reused_result().mesh_like());
        assert!(!ProbeResult::Healthy.mesh_like());
    }

    fn reused_result() -> ProbeResult {
        ProbeResult::IpReused {
            namespace: "other".into(),
            revision: "r".into(),
        }
    }

    #[test]
    fn a_truncated_body_is_never_healthy_and_is_quoted_short() {
        let mut long = answer(200, "queue");
        long.body_truncated = true;
        assert_eq!(
            judge(&long, NAMESPACE, REVISION),
            ProbeResult::Answered {
                status: 200,
                reason: r#"body "queue"..."#.into()
            }
        );
        let big = answer(200, &"x".repeat(1000));
        let ProbeResult::Answered { reason, .. } = judge(&big, NAMESPACE, REVISION) else {
            panic!("a 1000-byte body is not `queue`");
        };
        assert_eq!(reason, format!("body {:?}...", "x".repeat(QUOTED_BODY)));
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
            probe_pod("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nque\r\n2\r\nue\r\n0\r\n\r\n").await,
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
}
