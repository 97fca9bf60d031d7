//! The active health check of one pod, in the revision's protocol, plus the fork's IP-reuse
//! check on the revision headers. Runs on the control thread, never on the request path.
//!
//! * An HTTP/1 revision's pod gets what the upstream activator sends a queue-proxy:
//!   `GET /healthz` with `K-Network-Probe: queue` over HTTP/1.1 ([`http1`], over the data
//!   plane's codec `kactivator_h1`).
//! * An h2c revision's pod gets the standard gRPC health check over h2c with prior knowledge
//!   ([`h2c`]): `POST /grpc.health.v1.Health/Check` asking about the server as a whole, with the
//!   same `K-Network-Probe` and `User-Agent`, so that a queue-proxy in front of the pod answers
//!   it as a probe (200 `queue`) and a plain gRPC server answers it as a call. A pod that
//!   speaks only HTTP/2 (grpcio refuses HTTP/1.1) would fail any HTTP/1.1 probe.
//! * Either goes over TLS when asked ([`stream`]): a pod the data plane dials over TLS at its
//!   listed address (standalone `[revisions.tls]`) is probed with that same client, and a
//!   handshake it fails is an unhealthy probe saying `TLS handshake: …` and why.
//!
//! [`probe_on`] runs one probe, on a connection kept from the pod's last probe or on a new one,
//! everything under one timeout; a healthy pod's connection comes back for its next probe.
//! [`probe`] is one probe on a new connection. What came back, from either protocol, is an
//! [`Answer`]; [`judge`] decides from it and is what the tests of the rules exercise.

mod h2c;
mod http1;
mod stream;

use std::net::SocketAddr;
use std::time::Duration;

use kactivator_api::grpc_health::{self, code, ServingStatus};
use kactivator_api::probe::QUEUE;
use kactivator_api::RevisionKey;
use kactivator_shards::routing::Protocol;
use kactivator_shards::runtime::tls::UpstreamTls;
use tokio::net::TcpStream;

use self::stream::PodStream;

/// At most this much of a response body is read; a healthy one is five bytes (`queue`), or
/// seven (one gRPC message frame holding a `HealthCheckResponse`).
pub const BODY_LIMIT: usize = 4 * 1024;

/// Longest piece of a wrong body quoted in [`ProbeResult::Answered`].
const QUOTED_BODY: usize = 64;

/// What a probe found out about a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// A healthy answer (see [`judge`]), and no revision headers naming another revision.
    Healthy,
    /// No usable answer: the reason is for logs, e.g.
    /// `connect: Connection refused (os error 111)`, `timed out after 2s`.
    Unhealthy(String),
    /// An HTTP answer that is not a healthy pod's (another status, another body, a gRPC status
    /// that is not a pass); the reason is for logs: `status 503`, `body "nope"`,
    /// `health NOT_SERVING`.
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

/// What a probe response said, as far as [`judge`] cares, whichever protocol carried it.
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
    /// A gRPC answer (h2c only: a gRPC `content-type`, or a `grpc-status`): the call's status.
    /// `None`: a plain HTTP answer, judged as a queue-proxy's.
    pub grpc: Option<GrpcStatus>,
}

/// The status of a gRPC answer, from its trailers (or from its head when it came
/// trailers-only), as sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrpcStatus {
    /// `grpc-status`, if sent.
    pub code: Option<Vec<u8>>,
    /// `grpc-message`, if sent.
    pub message: Option<Vec<u8>>,
}

/// A connection to a pod kept from its last probe, clean (nothing unread) and idle, in the
/// protocol it was probed in, plain or over TLS as it was dialled.
pub struct Connection(Kept);

enum Kept {
    Http1(http1::Connection),
    H2c(h2c::Connection),
}

impl Connection {
    fn protocol(&self) -> Protocol {
        match self.0 {
            Kept::Http1(_) => Protocol::Http1,
            Kept::H2c(_) => Protocol::H2c,
        }
    }

    /// Whether it speaks TLS.
    fn is_tls(&self) -> bool {
        match &self.0 {
            Kept::Http1(connection) => connection.is_tls(),
            Kept::H2c(connection) => connection.is_tls(),
        }
    }
}

/// Probes the pod at `addr` for `revision`, speaking `protocol` over plain TCP, on a new
/// connection, closed afterwards whatever happened. Connecting, writing and reading all count
/// against `timeout`. (The Kubernetes source's backend probes: a pod's listed port is its plain
/// one even when the data plane dials it over TLS elsewhere, as upstream probes it.)
pub async fn probe(
    addr: SocketAddr,
    revision: &RevisionKey,
    protocol: Protocol,
    timeout: Duration,
) -> ProbeResult {
    probe_on(None, addr, revision, protocol, None, timeout, false)
        .await
        .0
}

/// Probes the pod at `addr` for `revision`, speaking `protocol`, over `tls` when given (the
/// client the data plane dials the revision's pods with) or plain TCP, on `kept` when given
/// (and of that protocol and transport), else on a new connection; with `keep_alive`, returns
/// the connection when it can carry the next probe. A kept connection that fails before any
/// answer (the pod closed it while it was idle) is not the pod's fault: the probe is made
/// again on a new connection. Connecting, the TLS handshake, writing and reading all count
/// against `timeout`.
pub async fn probe_on(
    kept: Option<Connection>,
    addr: SocketAddr,
    revision: &RevisionKey,
    protocol: Protocol,
    tls: Option<&UpstreamTls>,
    timeout: Duration,
    keep_alive: bool,
) -> (ProbeResult, Option<Connection>) {
    match tokio::time::timeout(timeout, attempt(kept, addr, protocol, tls, keep_alive)).await {
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

/// Why an exchange failed, and whether the pod had answered anything (then the failure is the
/// pod's, even on a kept connection).
#[derive(Debug)]
pub struct Failure {
    reason: String,
    answered: bool,
    /// The connection was refused: nothing listens on the port.
    refused: bool,
}

impl Failure {
    fn new(reason: String, answered: bool) -> Failure {
        Failure {
            reason,
            answered,
            refused: false,
        }
    }

    /// Why, for logs: `connect: Connection refused (os error 111)`, `response: …`.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Whether the connection was refused (nothing listens on the port), as opposed to a
    /// connection that was made and then failed.
    pub fn refused(&self) -> bool {
        self.refused
    }
}

// === Building blocks shared with the queue-proxy's readiness probe ===
// (`crate::queue_proxy::readiness`): the same connection handling and codecs, other requests.

/// A new TCP connection to `addr`, Nagle off; a refused connection says so
/// ([`Failure::refused`]). No timeout: the caller bounds the whole exchange.
pub async fn connect(addr: SocketAddr) -> Result<TcpStream, Failure> {
    dial(addr).await
}

/// One HTTP/1.1 exchange on a new connection to `addr`, closed afterwards: `request` is the
/// whole `GET` request head (blank line included), the [`Answer`] holds the status and at most
/// [`BODY_LIMIT`] bytes of the body (the rest is not read). No timeout: the caller bounds it.
pub async fn http1_get(addr: SocketAddr, request: &[u8]) -> Result<Answer, Failure> {
    let stream = PodStream::Plain(dial(addr).await?);
    let (answer, _) = http1::round_trip(http1::Connection::new(stream), request, false).await?;
    Ok(answer)
}

/// One gRPC `Health/Check` call asking about `service` over h2c with prior knowledge, on a new
/// connection to `addr`, closed afterwards, with `headers` beside gRPC's own. The [`Answer`]
/// holds the HTTP status, the gRPC status ([`Answer::grpc`], `None` for a plain HTTP answer)
/// and the body. No timeout: the caller bounds it.
pub async fn grpc_health_check(
    addr: SocketAddr,
    service: &str,
    headers: &[(&str, &str)],
) -> Result<Answer, Failure> {
    let stream = PodStream::Plain(dial(addr).await?);
    let connection = h2c::Connection::handshake(stream).await?;
    let request = grpc_health::frame(&grpc_health::HealthCheckRequest {
        service: service.to_owned(),
    });
    let (answer, _) = h2c::check(connection, addr, headers, request, false).await?;
    Ok(answer)
}

async fn attempt(
    kept: Option<Connection>,
    addr: SocketAddr,
    protocol: Protocol,
    tls: Option<&UpstreamTls>,
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    // A connection of the other protocol, or plain where TLS is asked or the other way round
    // (the revision's changed), is closed here.
    if let Some(connection) = kept.filter(|connection| {
        connection.protocol() == protocol && connection.is_tls() == tls.is_some()
    }) {
        match exchange(connection, addr, keep_alive).await {
            Err(failure) if !failure.answered => {
                tracing::debug!(pod = %addr, "kept probe connection closed: {}", failure.reason);
            }
            done => return done,
        }
    }
    let stream = stream::open(addr, tls).await?;
    let connection = match protocol {
        Protocol::Http1 => Connection(Kept::Http1(http1::Connection::new(stream))),
        Protocol::H2c => Connection(Kept::H2c(h2c::Connection::handshake(stream).await?)),
    };
    exchange(connection, addr, keep_alive).await
}

/// One probe on `connection`, in its protocol; the connection back when it may carry another.
async fn exchange(
    connection: Connection,
    addr: SocketAddr,
    keep_alive: bool,
) -> Result<(Answer, Option<Connection>), Failure> {
    match connection.0 {
        Kept::Http1(connection) => {
            let (answer, kept) = http1::exchange(connection, addr, keep_alive).await?;
            Ok((answer, kept.map(|kept| Connection(Kept::Http1(kept)))))
        }
        Kept::H2c(connection) => {
            let (answer, kept) = h2c::exchange(connection, addr, keep_alive).await?;
            Ok((answer, kept.map(|kept| Connection(Kept::H2c(kept)))))
        }
    }
}

/// A new TCP connection to the pod, Nagle off (a probe is one small write).
async fn dial(addr: SocketAddr) -> Result<TcpStream, Failure> {
    let stream = TcpStream::connect(addr).await.map_err(|error| Failure {
        refused: error.kind() == std::io::ErrorKind::ConnectionRefused,
        ..Failure::new(format!("connect: {error}"), false)
    })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Decides a probe from its response.
///
/// * Identity first, whatever the status: if either revision header is non-empty, both must
///   equal the expected revision, otherwise [`ProbeResult::IpReused`]. An empty header counts
///   as absent (Go's `Header.Get` cannot tell them apart, and the fork compared its results).
///   With both absent (a queue-proxy older than the fork) the pod is judged on the rest.
/// * Then the status must be exactly 200 (upstream's prober; the fork took any 2xx). gRPC
///   answers every call with 200, its own status going in `grpc-status`.
/// * A plain answer (a queue-proxy's) must then have the body exactly `queue`: no trimming.
///   That is upstream's check and what a queue-proxy writes; something answering `queue\n` is
///   not a queue-proxy.
/// * A gRPC answer (h2c, a pod without a queue-proxy in front) passes with the status OK and a
///   `HealthCheckResponse` saying SERVING, or with UNIMPLEMENTED: a gRPC server without the
///   health service is up and dispatching calls, which is all a probe of a plain gRPC server
///   can learn (it could not pass otherwise, and most servers do not register the service).
///   Any other status (NOT_FOUND for a server that does not know the empty service name,
///   UNAVAILABLE, …), any other serving status (NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN) or a
///   body that is not one such message fails.
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
    let failed = |reason: String| ProbeResult::Answered {
        status: answer.status,
        reason,
    };
    if answer.status != 200 {
        return failed(format!("status {}", answer.status));
    }
    if let Some(grpc) = &answer.grpc {
        return judge_grpc(answer, grpc).map_or(ProbeResult::Healthy, failed);
    }
    if answer.body_truncated || answer.body != QUEUE.as_bytes() {
        return failed(format!("body {}", quote(answer)));
    }
    ProbeResult::Healthy
}

/// A gRPC answer's verdict: `None` when it passes, else why not.
fn judge_grpc(answer: &Answer, grpc: &GrpcStatus) -> Option<String> {
    let message = || {
        grpc.message
            .as_deref()
            .filter(|message| !message.is_empty())
            .map(|message| format!(": {}", quote_bytes(message, false)))
            .unwrap_or_default()
    };
    let Some(raw) = &grpc.code else {
        return Some("gRPC answer without grpc-status".into());
    };
    let Some(status) = grpc_health::parse_status(raw) else {
        return Some(format!("grpc-status {}", quote_bytes(raw, false)));
    };
    match status {
        code::UNIMPLEMENTED => None,
        code::OK => {
            if answer.body_truncated {
                return Some(format!("health response: body {}", quote(answer)));
            }
            match grpc_health::decode_check_response(&answer.body) {
                Err(error) => Some(format!("health response: {error}")),
                Ok(response) => match ServingStatus::try_from(response.status) {
                    Ok(ServingStatus::Serving) => None,
                    Ok(other) => Some(format!("health {}", other.as_str_name())),
                    Err(_) => Some(format!("health status {}", response.status)),
                },
            }
        }
        other => Some(format!(
            "grpc-status {other} {}{}",
            grpc_health::code_name(other),
            message()
        )),
    }
}

/// The start of a wrong body, quoted for a log line.
fn quote(answer: &Answer) -> String {
    quote_bytes(&answer.body, answer.body_truncated)
}

/// The start of `bytes` (at most [`QUOTED_BODY`]), quoted; `...` when there was more.
fn quote_bytes(bytes: &[u8], truncated: bool) -> String {
    let shown = &bytes[..bytes.len().min(QUOTED_BODY)];
    let mut quoted = format!("{:?}", String::from_utf8_lossy(shown));
    if truncated || bytes.len() > QUOTED_BODY {
        quoted.push_str("...");
    }
    quoted
}

#[cfg(test)]
mod tests {
    use kactivator_api::grpc_health::HealthCheckResponse;

    use super::*;

    pub(super) const NAMESPACE: &str = "default";
    pub(super) const REVISION: &str = "hello-00001";

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

    fn reused(namespace: &str, revision: &str) -> ProbeResult {
        ProbeResult::IpReused {
            namespace: namespace.into(),
            revision: revision.into(),
        }
    }

    fn unhealthy(status: u16, reason: &str) -> ProbeResult {
        ProbeResult::Answered {
            status,
            reason: reason.into(),
        }
    }

    #[test]
    fn judge_follows_the_rules_in_order() {
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

    /// A gRPC answer: status 200, `grpc-status` = `code` (raw; `None` = absent), `body`.
    fn grpc(code: Option<&str>, body: Vec<u8>) -> Answer {
        Answer {
            status: 200,
            body,
            grpc: Some(GrpcStatus {
                code: code.map(|code| code.as_bytes().to_vec()),
                message: None,
            }),
            ..Answer::default()
        }
    }

    fn health(status: i32) -> Vec<u8> {
        grpc_health::frame(&HealthCheckResponse { status })
    }

    #[test]
    fn judge_h2c_passes_serving_or_unimplemented_and_fails_the_rest() {
        let serving = ServingStatus::Serving as i32;
        let with_message = |mut answer: Answer, message: &str| {
            if let Some(grpc) = &mut answer.grpc {
                grpc.message = Some(message.as_bytes().to_vec());
            }
            answer
        };
        let cases = [
            // The standard health service: SERVING passes, every other status fails.
            (grpc(Some("0"), health(serving)), ProbeResult::Healthy),
            (
                grpc(Some("0"), health(ServingStatus::NotServing as i32)),
                unhealthy(200, "health NOT_SERVING"),
            ),
            (
                grpc(Some("0"), health(ServingStatus::ServiceUnknown as i32)),
                unhealthy(200, "health SERVICE_UNKNOWN"),
            ),
            (
                grpc(Some("0"), health(ServingStatus::Unknown as i32)),
                unhealthy(200, "health UNKNOWN"),
            ),
            (
                grpc(Some("0"), health(7)),
                unhealthy(200, "health status 7"),
            ),
            // No health service: the server is up and dispatching calls.
            (grpc(Some("12"), Vec::new()), ProbeResult::Healthy),
            // Any other gRPC status fails, NOT_FOUND (the empty service unknown) included.
            (
                with_message(grpc(Some("5"), Vec::new()), "unknown service"),
                unhealthy(200, r#"grpc-status 5 NOT_FOUND: "unknown service""#),
            ),
            (
                grpc(Some("14"), Vec::new()),
                unhealthy(200, "grpc-status 14 UNAVAILABLE"),
            ),
            (
                grpc(Some("13"), health(serving)),
                unhealthy(200, "grpc-status 13 INTERNAL"),
            ),
            (
                grpc(Some("99"), Vec::new()),
                unhealthy(200, "grpc-status 99 UNKNOWN_CODE"),
            ),
            (
                grpc(Some("ok"), health(serving)),
                unhealthy(200, r#"grpc-status "ok""#),
            ),
            (
                grpc(None, health(serving)),
                unhealthy(200, "gRPC answer without grpc-status"),
            ),
            // OK needs exactly one uncompressed HealthCheckResponse.
            (
                grpc(Some("0"), Vec::new()),
                unhealthy(200, "health response: no message (0 bytes)"),
            ),
            (
                grpc(Some("0"), [health(serving), health(serving)].concat()),
                unhealthy(
                    200,
                    "health response: a message of 2 bytes declared, 9 bytes sent",
                ),
            ),
            (
                grpc(Some("0"), vec![1, 0, 0, 0, 2, 0x08, 1]),
                unhealthy(200, "health response: a compressed message"),
            ),
            // The HTTP status comes first: gRPC answers every call with 200.
            (
                Answer {
                    status: 503,
                    ..grpc(Some("12"), Vec::new())
                },
                unhealthy(503, "status 503"),
            ),
            // A queue-proxy in front answers the probe itself.
            (answer(200, "queue"), ProbeResult::Healthy),
            (answer(200, "SERVING"), unhealthy(200, r#"body "SERVING""#)),
            // The IP-reuse rule holds for gRPC answers too, whatever they say.
            (
                with_identity(grpc(Some("0"), health(serving)), Some("other"), Some("x")),
                reused("other", "x"),
            ),
            (
                with_identity(grpc(Some("14"), Vec::new()), Some(NAMESPACE), None),
                reused(NAMESPACE, ""),
            ),
            (
                with_identity(
                    grpc(Some("12"), Vec::new()),
                    Some(NAMESPACE),
                    Some(REVISION),
                ),
                ProbeResult::Healthy,
            ),
        ];
        for (answer, expected) in cases {
            assert_eq!(judge(&answer, NAMESPACE, REVISION), expected, "{answer:?}");
        }
        let mut truncated = grpc(Some("0"), health(serving));
        truncated.body_truncated = true;
        assert_eq!(judge(&truncated, NAMESPACE, REVISION).label(), "unhealthy");
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
        assert!(!reused("other", "r").mesh_like());
        assert!(!ProbeResult::Healthy.mesh_like());
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
}
