//! The queue-proxy's readiness of the user container: `SERVING_READINESS_PROBE` decoded
//! ([`decode`]), one probe attempt ([`attempt`]: TCP, HTTP/1.1 or gRPC health over h2c), when
//! to make attempts and what they mean ([`Schedule`], sans-IO, the clock passed in), and the
//! task that keeps a shared readiness flag current ([`prober`] → [`Prober::run`] and
//! [`QueueProxyHealth`]).
//!
//! Upstream (release-1.18, `reference/queue-proxy.md` §4) probes only when asked: each kubelet
//! or activator health request runs the probe, in aggressive mode (`periodSeconds` 0: every
//! 50 ms with a 100 ms timeout, up to 10 s) blocking the request meanwhile. ★ Here a background
//! task on the control thread keeps the answer ready, so a health request never waits:
//!
//! * from start the container is not ready, and attempts run aggressively (one every
//!   [`AGGRESSIVE_INTERVAL`], never two at once) until it passes, in standard mode too, so a
//!   cold start is noticed within 50 ms rather than a period;
//! * once ready, one attempt per period ([`READY_PERIOD_AGGRESSIVE`] when `periodSeconds` is 0);
//!   a failure makes it not ready, back to aggressive attempts;
//! * the thresholds are upstream's: in aggressive mode (`periodSeconds` 0) `successThreshold`
//!   passes in a row make it ready and `failureThreshold` failures not ready; in standard mode
//!   they are the kubelet's, which applies them to its own probes of the queue-proxy, so here one
//!   attempt decides, as upstream's queue-proxy makes one attempt per health request (review
//!   finding: applying them here too made a failing app leave its endpoints a `periodSeconds`
//!   × `failureThreshold` later than upstream's);
//! * a refused connection — seen by an attempt, or by the data path and reported with
//!   [`QueueProxyHealth::refused`] — makes it not ready at once: nothing listens any more.
//!
//! Each attempt's timeout is upstream's: [`AGGRESSIVE_TIMEOUT`] when `periodSeconds` is 0, else
//! `timeoutSeconds`. Differences from upstream's probe requests, on purpose:
//! * HTTP: redirects are not followed (Go's client follows them): a 3xx is the container
//!   answering, a pass, as the kubelet judges a redirect to another host. The path keeps its
//!   query (`/ready?full=1`, as the kubelet sends it; upstream escapes the `?`). A `Host` or
//!   `User-Agent` among `httpHeaders` replaces ours (as the kubelet does; Go's client drops
//!   both). Without one, the user agent is upstream's `kube-probe//` (its Kubernetes version is
//!   never set), which a container recognising `kube-probe/` still recognises.
//! * `scheme: HTTPS` is refused by [`decode`]: TLS to the user container is not built.
//! * Several probes (`ENABLE_MULTI_CONTAINER_PROBES`): an attempt probes them all at once, each
//!   with its own timeout, and passes when all pass; the schedule (period, thresholds) is the
//!   first probe's, the user container's.
//! * A probe without a handler, with two, with a named port (the queue-proxy cannot resolve
//!   names), or with a number out of its bounds is refused at start, where upstream would fail
//!   every attempt or misbehave.
//! * `initialDelaySeconds` and `terminationGracePeriodSeconds` are the kubelet's, which applies
//!   them to its probe of the queue-proxy; they are not read here.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kactivator_api::grpc_health::{self, code, ServingStatus};
use kactivator_api::headers::USER_AGENT;
use serde::Deserialize;
use tokio::sync::{watch, Notify};

use crate::sources::probe::{self as wire, Failure};

/// Between the starts of two attempts while not ready (upstream's `retryInterval`).
pub const AGGRESSIVE_INTERVAL: Duration = Duration::from_millis(50);
/// Timeout of each attempt when `periodSeconds` is 0 (upstream's `aggressiveProbeTimeout`).
pub const AGGRESSIVE_TIMEOUT: Duration = Duration::from_millis(100);
/// Between attempts once ready when `periodSeconds` is 0 (upstream has no period then: it
/// probes on each health request, which the kubelet sends every 10 s by default).
pub const READY_PERIOD_AGGRESSIVE: Duration = Duration::from_secs(1);
/// `timeoutSeconds` when 0 or absent (Kubernetes' default; Knative's webhook sets it too).
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 1;
/// `failureThreshold` when 0 or absent (Kubernetes' default).
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// Largest `periodSeconds` and `timeoutSeconds` accepted: an hour.
pub const MAX_PROBE_SECONDS: u32 = 3600;
/// Largest `successThreshold` and `failureThreshold` accepted (Kubernetes' `int32`).
pub const MAX_THRESHOLD: u32 = i32::MAX as u32;
/// The user agent of HTTP and gRPC attempts unless `httpHeaders` has one: upstream's
/// `kube-probe/` + major + `/` + minor, with both versions empty.
pub const PROBE_USER_AGENT: &str = "kube-probe//";
/// Where the user container listens, and the host when a probe names none.
pub const LOCALHOST: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// Most probes in a multi-container list (a pod has a handful of containers).
pub const MAX_PROBES: usize = 64;
/// Most `httpHeaders` entries.
pub const MAX_HEADERS: usize = 64;
/// Longest host, path, header name or value, or gRPC service name, in bytes.
pub const MAX_FIELD: usize = 4096;

/// One probe of the user container (or of a sidecar), decoded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub action: Action,
    pub timing: Timing,
}

/// What one attempt does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Connect, then close. Also what an `exec` probe becomes (to the user port).
    Tcp(Target),
    /// `GET` over HTTP/1.1 on a new connection; 200 to 399 passes.
    Http(HttpGet),
    /// `grpc.health.v1.Health/Check` over h2c to `127.0.0.1:port`; `SERVING` passes.
    Grpc { port: u16, service: String },
}

/// Where to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// An IP address (no brackets) or a DNS name; `127.0.0.1` when the probe names none.
    pub host: String,
    pub port: u16,
}

/// An HTTP probe, ready to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpGet {
    pub target: Target,
    /// The request target: starts with `/`, query kept, bytes outside URI syntax
    /// percent-encoded (so never a space, CR or LF).
    pub path: String,
    /// `httpHeaders`, in order, checked (token names, values without CR, LF or NUL).
    pub headers: Vec<(String, String)>,
}

/// When attempts run and what their results mean, with Kubernetes' defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// `periodSeconds`; zero = upstream's aggressive mode.
    pub period: Duration,
    /// `timeoutSeconds` (default [`DEFAULT_TIMEOUT_SECONDS`]); unused in aggressive mode.
    pub timeout: Duration,
    /// `successThreshold` (default 1): consecutive passes to become ready.
    pub success_threshold: u32,
    /// `failureThreshold` (default [`DEFAULT_FAILURE_THRESHOLD`]): consecutive failures to
    /// stop being ready.
    pub failure_threshold: u32,
}

impl Timing {
    /// Upstream's aggressive mode: `periodSeconds` 0.
    pub fn aggressive(&self) -> bool {
        self.period.is_zero()
    }

    /// The timeout of one attempt.
    pub fn attempt_timeout(&self) -> Duration {
        if self.aggressive() {
            AGGRESSIVE_TIMEOUT
        } else {
            self.timeout
        }
    }

    /// Passes in a row that make the container ready: `successThreshold` in aggressive mode;
    /// in standard mode the kubelet counts them, and one pass here is enough.
    pub fn passes_needed(&self) -> u32 {
        if self.aggressive() {
            self.success_threshold
        } else {
            1
        }
    }

    /// Failures in a row that make a ready container not ready: `failureThreshold` in
    /// aggressive mode, one in standard mode (the kubelet counts).
    pub fn failures_needed(&self) -> u32 {
        if self.aggressive() {
            self.failure_threshold
        } else {
            1
        }
    }

    /// Between the starts of two attempts once ready.
    pub fn ready_period(&self) -> Duration {
        if self.aggressive() {
            READY_PERIOD_AGGRESSIVE
        } else {
            self.period
        }
    }
}

/// Why `SERVING_READINESS_PROBE` cannot be used; the text names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("SERVING_READINESS_PROBE is not a Kubernetes probe in JSON: {0}")]
    Json(String),
    #[error("SERVING_READINESS_PROBE: {0}")]
    Invalid(String),
    #[error("SERVING_READINESS_PROBE: {field} is the named port {name:?}; the queue-proxy cannot resolve port names, give the number")]
    NamedPort { field: String, name: String },
    #[error("SERVING_READINESS_PROBE: {field} asks for HTTPS; probing the user container over TLS is not built")]
    Https { field: String },
}

// === The JSON, as Kubernetes' corev1.Probe encodes it ===

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawProbe {
    exec: Option<serde::de::IgnoredAny>,
    http_get: Option<RawHttpGet>,
    tcp_socket: Option<RawTcp>,
    grpc: Option<RawGrpc>,
    period_seconds: Option<i64>,
    timeout_seconds: Option<i64>,
    success_threshold: Option<i64>,
    failure_threshold: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHttpGet {
    path: Option<String>,
    port: Option<IntOrString>,
    host: Option<String>,
    scheme: Option<String>,
    http_headers: Option<Vec<RawHeader>>,
}

#[derive(Deserialize)]
struct RawHeader {
    name: String,
    value: String,
}

#[derive(Deserialize)]
struct RawTcp {
    port: Option<IntOrString>,
    host: Option<String>,
}

#[derive(Deserialize)]
struct RawGrpc {
    port: Option<i64>,
    service: Option<String>,
}

/// Kubernetes' IntOrString: a JSON number or a JSON string.
#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    Str(String),
}

/// Decodes `SERVING_READINESS_PROBE`: one probe object, or a list of them when
/// `multi_container` (`ENABLE_MULTI_CONTAINER_PROBES`), the user container's first. An empty
/// string is no probe at all (always ready, as upstream). A port of 0 (or absent) is
/// `user_port`; an `exec` probe becomes a TCP probe of `127.0.0.1:user_port`, as upstream's
/// reconciler makes it.
pub fn decode(
    json: &str,
    multi_container: bool,
    user_port: u16,
) -> Result<Vec<ProbeSpec>, DecodeError> {
    if json.is_empty() {
        return Ok(Vec::new());
    }
    let json_error = |error: serde_json::Error| DecodeError::Json(error.to_string());
    if multi_container {
        let raw: Option<Vec<Option<RawProbe>>> = serde_json::from_str(json).map_err(json_error)?;
        let raw = raw.unwrap_or_default();
        if raw.is_empty() {
            return Err(DecodeError::Invalid("an empty list of probes".into()));
        }
        if raw.len() > MAX_PROBES {
            return Err(DecodeError::Invalid(format!(
                "{} probes, more than {MAX_PROBES}",
                raw.len()
            )));
        }
        raw.into_iter()
            .enumerate()
            .map(|(index, probe)| {
                let field = format!("[{index}]");
                let probe = probe.ok_or_else(|| invalid(&field, "is null"))?;
                convert(probe, &field, user_port)
            })
            .collect()
    } else {
        let raw: Option<RawProbe> = serde_json::from_str(json).map_err(json_error)?;
        let probe = raw.ok_or_else(|| DecodeError::Invalid("the probe is null".into()))?;
        Ok(vec![convert(probe, "", user_port)?])
    }
}

fn invalid(field: &str, problem: impl std::fmt::Display) -> DecodeError {
    DecodeError::Invalid(format!("{field} {problem}").trim_start().to_string())
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

fn convert(raw: RawProbe, prefix: &str, user_port: u16) -> Result<ProbeSpec, DecodeError> {
    let handlers = [
        raw.exec.is_some(),
        raw.http_get.is_some(),
        raw.tcp_socket.is_some(),
        raw.grpc.is_some(),
    ]
    .into_iter()
    .filter(|set| *set)
    .count();
    if handlers != 1 {
        let what = if handlers == 0 { "no" } else { "more than one" };
        let subject = if prefix.is_empty() {
            "the probe"
        } else {
            prefix
        };
        return Err(DecodeError::Invalid(format!(
            "{subject} has {what} handler (exactly one of exec, httpGet, tcpSocket, grpc)"
        )));
    }
    let action = if let Some(http) = raw.http_get {
        let field = join(prefix, "httpGet");
        match http.scheme.as_deref().unwrap_or("") {
            "" => {}
            scheme if scheme.eq_ignore_ascii_case("http") => {}
            scheme if scheme.eq_ignore_ascii_case("https") => {
                return Err(DecodeError::Https {
                    field: join(&field, "scheme"),
                })
            }
            scheme => {
                return Err(invalid(
                    &join(&field, "scheme"),
                    format!("{:?} is neither HTTP nor HTTPS", clip(scheme)),
                ))
            }
        }
        let target = Target {
            host: host(http.host, &join(&field, "host"))?,
            port: port(http.port, &join(&field, "port"), user_port)?,
        };
        let path = request_target(http.path.as_deref().unwrap_or(""), &join(&field, "path"))?;
        let raw_headers = http.http_headers.unwrap_or_default();
        if raw_headers.len() > MAX_HEADERS {
            return Err(invalid(
                &join(&field, "httpHeaders"),
                format!("has {} entries, more than {MAX_HEADERS}", raw_headers.len()),
            ));
        }
        let mut headers = Vec::with_capacity(raw_headers.len());
        for (index, header) in raw_headers.into_iter().enumerate() {
            let field = format!("{}[{index}]", join(&field, "httpHeaders"));
            headers.push(checked_header(header, &field)?);
        }
        Action::Http(HttpGet {
            target,
            path,
            headers,
        })
    } else if let Some(tcp) = raw.tcp_socket {
        let field = join(prefix, "tcpSocket");
        Action::Tcp(Target {
            host: host(tcp.host, &join(&field, "host"))?,
            port: port(tcp.port, &join(&field, "port"), user_port)?,
        })
    } else if let Some(grpc) = raw.grpc {
        let field = join(prefix, "grpc");
        let service = grpc.service.unwrap_or_default();
        if service.len() > MAX_FIELD || service.chars().any(char::is_control) {
            return Err(invalid(
                &join(&field, "service"),
                "is longer than 4096 bytes or holds control characters",
            ));
        }
        Action::Grpc {
            port: port(
                grpc.port.map(IntOrString::Int),
                &join(&field, "port"),
                user_port,
            )?,
            service,
        }
    } else {
        // exec: what upstream's reconciler turns it into; the kubelet still runs the command.
        Action::Tcp(Target {
            host: LOCALHOST.to_string(),
            port: user_port,
        })
    };
    let seconds = |value: Option<i64>, name: &str, default: u32| {
        bounded(value, &join(prefix, name), MAX_PROBE_SECONDS, default)
    };
    let period = seconds(raw.period_seconds, "periodSeconds", 0)?;
    let timeout = seconds(
        raw.timeout_seconds,
        "timeoutSeconds",
        DEFAULT_TIMEOUT_SECONDS,
    )?;
    let timing = Timing {
        period: Duration::from_secs(period.into()),
        timeout: Duration::from_secs(timeout.into()),
        success_threshold: bounded(
            raw.success_threshold,
            &join(prefix, "successThreshold"),
            MAX_THRESHOLD,
            1,
        )?,
        failure_threshold: bounded(
            raw.failure_threshold,
            &join(prefix, "failureThreshold"),
            MAX_THRESHOLD,
            DEFAULT_FAILURE_THRESHOLD,
        )?,
    };
    Ok(ProbeSpec { action, timing })
}

/// A number in `0..=max`; 0 or absent is `default`.
fn bounded(value: Option<i64>, field: &str, max: u32, default: u32) -> Result<u32, DecodeError> {
    match value.unwrap_or(0) {
        0 => Ok(default),
        value if (1..=i64::from(max)).contains(&value) => Ok(value as u32),
        value => Err(invalid(field, format!("is {value}, outside 0 to {max}"))),
    }
}

/// A port: a number, or a string holding one; 0, `""` or absent is the user port.
fn port(value: Option<IntOrString>, field: &str, user_port: u16) -> Result<u16, DecodeError> {
    let number = match value {
        None => 0,
        Some(IntOrString::Int(number)) => number,
        Some(IntOrString::Str(text)) if text.is_empty() => 0,
        Some(IntOrString::Str(text)) => match text.parse::<i64>() {
            Ok(number) => number,
            Err(_) => {
                return Err(DecodeError::NamedPort {
                    field: field.to_string(),
                    name: clip(&text).to_string(),
                })
            }
        },
    };
    match number {
        0 => Ok(user_port),
        1..=65535 => Ok(number as u16),
        _ => Err(invalid(
            field,
            format!("is {number}, not a port (1 to 65535)"),
        )),
    }
}

/// A host: `127.0.0.1` when empty, else an IP address (IPv6 with or without brackets) or a
/// DNS name.
fn host(value: Option<String>, field: &str) -> Result<String, DecodeError> {
    let text = value.unwrap_or_default();
    if text.is_empty() {
        return Ok(LOCALHOST.to_string());
    }
    let bare = text
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(&text);
    if bare.parse::<IpAddr>().is_ok() {
        return Ok(bare.to_string());
    }
    let name_like = bare.len() <= 253
        && bare
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'-' | b'_'));
    if name_like {
        Ok(bare.to_string())
    } else {
        Err(invalid(
            field,
            format!("{:?} is neither an IP address nor a host name", clip(&text)),
        ))
    }
}

/// The request target of an HTTP probe: a leading `/` added when missing (upstream), the query
/// kept, every byte outside URI syntax percent-encoded.
fn request_target(path: &str, field: &str) -> Result<String, DecodeError> {
    if path.len() > MAX_FIELD {
        return Err(invalid(field, format!("is longer than {MAX_FIELD} bytes")));
    }
    let mut target = String::with_capacity(path.len() + 1);
    if !path.starts_with('/') {
        target.push('/');
    }
    for byte in path.bytes() {
        let allowed = byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&byte);
        if allowed {
            target.push(char::from(byte));
        } else {
            target.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(target)
}

fn checked_header(header: RawHeader, field: &str) -> Result<(String, String), DecodeError> {
    let is_token = |byte: u8| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte);
    if header.name.is_empty() || header.name.len() > MAX_FIELD || !header.name.bytes().all(is_token)
    {
        return Err(invalid(
            &join(field, "name"),
            format!("{:?} is not a header name", clip(&header.name)),
        ));
    }
    // A body framing header on a GET without a body would leave the exchange waiting.
    if header.name.eq_ignore_ascii_case("content-length")
        || header.name.eq_ignore_ascii_case("transfer-encoding")
    {
        return Err(invalid(
            &join(field, "name"),
            format!("{:?} cannot be sent on a probe", header.name),
        ));
    }
    if header.value.len() > MAX_FIELD
        || header
            .value
            .bytes()
            .any(|byte| matches!(byte, b'\r' | b'\n' | 0))
    {
        return Err(invalid(
            &join(field, "value"),
            "is longer than 4096 bytes or holds CR, LF or NUL",
        ));
    }
    Ok((header.name, header.value))
}

/// The start of a value, for an error message.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

// === One attempt ===

/// What one attempt found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// No pass; why, for logs.
    Fail(String),
    /// The connection was refused: nothing listens on the port. Not ready at once.
    Refused(String),
}

impl From<Failure> for Outcome {
    fn from(failure: Failure) -> Outcome {
        if failure.refused() {
            Outcome::Refused(failure.reason().to_string())
        } else {
            Outcome::Fail(failure.reason().to_string())
        }
    }
}

/// One attempt of `action`, everything (name lookup, connecting, exchanging) within `timeout`,
/// on a new connection closed afterwards.
pub async fn attempt(action: &Action, timeout: Duration) -> Outcome {
    match tokio::time::timeout(timeout, attempt_unbounded(action)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Fail(format!("timed out after {timeout:?}")),
    }
}

async fn attempt_unbounded(action: &Action) -> Outcome {
    match action {
        Action::Tcp(target) => match resolve(target).await {
            Err(reason) => Outcome::Fail(reason),
            Ok(addr) => match wire::connect(addr).await {
                Ok(_stream) => Outcome::Pass,
                Err(failure) => failure.into(),
            },
        },
        Action::Http(http) => {
            let addr = match resolve(&http.target).await {
                Ok(addr) => addr,
                Err(reason) => return Outcome::Fail(reason),
            };
            match wire::http1_get(addr, http_request(http).as_bytes()).await {
                Err(failure) => failure.into(),
                Ok(answer) if (200..400).contains(&answer.status) => Outcome::Pass,
                Ok(answer) => Outcome::Fail(format!("status {}", answer.status)),
            }
        }
        Action::Grpc { port, service } => {
            let addr = SocketAddr::from((LOCALHOST, *port));
            let headers = [(USER_AGENT, PROBE_USER_AGENT)];
            match wire::grpc_health_check(addr, service, &headers).await {
                Err(failure) => failure.into(),
                Ok(answer) => judge_grpc(&answer),
            }
        }
    }
}

/// The request head of an HTTP attempt: `GET`, `Host` (unless given), `User-Agent:
/// kube-probe//` (unless given), the user's headers in order, `Connection: close` (unless
/// given; each attempt uses a new connection).
pub fn http_request(http: &HttpGet) -> String {
    let given = |name: &str| {
        http.headers
            .iter()
            .any(|(header, _)| header.eq_ignore_ascii_case(name))
    };
    let mut head = format!("GET {} HTTP/1.1\r\n", http.path);
    if !given("host") {
        let host = match http.target.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("[{ip}]"),
            _ => http.target.host.clone(),
        };
        head.push_str(&format!("Host: {host}:{}\r\n", http.target.port));
    }
    if !given("user-agent") {
        head.push_str(&format!("{USER_AGENT}: {PROBE_USER_AGENT}\r\n"));
    }
    for (name, value) in &http.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !given("connection") {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    head
}

/// The kubelet's rule for a gRPC probe: the call succeeds and says `SERVING`.
fn judge_grpc(answer: &wire::Answer) -> Outcome {
    if answer.status != 200 {
        return Outcome::Fail(format!("status {}", answer.status));
    }
    let Some(grpc) = &answer.grpc else {
        return Outcome::Fail("not a gRPC answer".into());
    };
    match grpc.code.as_deref().map(grpc_health::parse_status) {
        None => return Outcome::Fail("gRPC answer without grpc-status".into()),
        Some(Some(code::OK)) => {}
        Some(Some(other)) => {
            return Outcome::Fail(format!(
                "grpc-status {other} {}",
                grpc_health::code_name(other)
            ))
        }
        Some(None) => return Outcome::Fail("grpc-status not a number".into()),
    }
    if answer.body_truncated {
        return Outcome::Fail("health response too long".into());
    }
    match grpc_health::decode_check_response(&answer.body) {
        Err(error) => Outcome::Fail(format!("health response: {error}")),
        Ok(response) => match ServingStatus::try_from(response.status) {
            Ok(ServingStatus::Serving) => Outcome::Pass,
            Ok(other) => Outcome::Fail(format!("health {}", other.as_str_name())),
            Err(_) => Outcome::Fail(format!("health status {}", response.status)),
        },
    }
}

/// The address of a target: its IP, or the first address its name resolves to.
async fn resolve(target: &Target) -> Result<SocketAddr, String> {
    if let Ok(ip) = target.host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, target.port));
    }
    tokio::net::lookup_host((target.host.as_str(), target.port))
        .await
        .map_err(|error| format!("resolve {}: {error}", target.host))?
        .next()
        .ok_or_else(|| format!("resolve {}: no address", target.host))
}

/// One attempt of every probe at once, each with its own timeout: refused if any was refused,
/// else failed if any failed (the first reason), else a pass.
pub async fn attempt_all(probes: &[ProbeSpec]) -> Outcome {
    let outcomes = futures_util::future::join_all(
        probes
            .iter()
            .map(|probe| attempt(&probe.action, probe.timing.attempt_timeout())),
    )
    .await;
    let refused = outcomes
        .iter()
        .find(|outcome| matches!(outcome, Outcome::Refused(_)));
    let failed = outcomes
        .iter()
        .find(|outcome| matches!(outcome, Outcome::Fail(_)));
    refused.or(failed).cloned().unwrap_or(Outcome::Pass)
}

// === The schedule (sans-IO) ===

/// What the prober does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Start an attempt now with this timeout, then [`Schedule::record`] its outcome.
    Attempt { timeout: Duration },
    /// Nothing before this instant (unless [`Schedule::refused`]).
    SleepUntil(Instant),
    /// An attempt is under way: wait for its outcome.
    AwaitAttempt,
}

/// When to make attempts and what their outcomes mean (module docs), with the clock passed in.
/// The one writer of readiness: [`Schedule::record`] and [`Schedule::refused`] return the new
/// readiness when it changed.
#[derive(Clone, Debug)]
pub struct Schedule {
    timing: Timing,
    ready: bool,
    successes: u32,
    failures: u32,
    /// When the next attempt may start.
    due: Instant,
    /// When the attempt under way started.
    in_flight: Option<Instant>,
}

impl Schedule {
    /// Not ready, the first attempt due at `now`.
    pub fn new(timing: Timing, now: Instant) -> Schedule {
        Schedule {
            timing,
            ready: false,
            successes: 0,
            failures: 0,
            due: now,
            in_flight: None,
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    fn interval(&self) -> Duration {
        if self.ready {
            self.timing.ready_period()
        } else {
            AGGRESSIVE_INTERVAL
        }
    }

    pub fn next(&mut self, now: Instant) -> Step {
        if self.in_flight.is_some() {
            return Step::AwaitAttempt;
        }
        if now < self.due {
            return Step::SleepUntil(self.due);
        }
        self.in_flight = Some(now);
        self.due = now + self.interval();
        Step::Attempt {
            timeout: self.timing.attempt_timeout(),
        }
    }

    /// The outcome of the attempt under way (ignored when none is: it was abandoned).
    pub fn record(&mut self, now: Instant, outcome: &Outcome) -> Option<bool> {
        let started = self.in_flight.take()?;
        match outcome {
            Outcome::Pass => {
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                if !self.ready && self.successes >= self.timing.passes_needed() {
                    self.ready = true;
                    self.due = now + self.timing.ready_period();
                    return Some(true);
                }
            }
            Outcome::Fail(_) => {
                self.successes = 0;
                self.failures = self.failures.saturating_add(1);
                if self.ready && self.failures >= self.timing.failures_needed() {
                    return self.not_ready(started + AGGRESSIVE_INTERVAL);
                }
            }
            Outcome::Refused(_) => {
                self.successes = 0;
                if self.ready {
                    return self.not_ready(started + AGGRESSIVE_INTERVAL);
                }
            }
        }
        None
    }

    /// The data path saw a refused connection. When ready: not ready at once, the next attempt
    /// now. Either way an attempt under way is abandoned (its outcome may predate the
    /// refusal) and passes count afresh; when already not ready the next attempt keeps its
    /// time, so a flood of refusals makes no more than one attempt per
    /// [`AGGRESSIVE_INTERVAL`].
    pub fn refused(&mut self, now: Instant) -> Option<bool> {
        self.in_flight = None;
        self.successes = 0;
        if self.ready {
            self.not_ready(now)
        } else {
            None
        }
    }

    /// Forgets the attempt under way, if any; its outcome will not be recorded.
    pub fn abandon(&mut self) {
        self.in_flight = None;
    }

    fn not_ready(&mut self, due: Instant) -> Option<bool> {
        self.ready = false;
        self.failures = 0;
        self.successes = 0;
        self.due = due;
        Some(false)
    }
}

// === The shared flag and the task ===

/// The readiness of the user container, shared by the prober (the one writer) with the request
/// path, the health handler and the push side. Cheap to clone; `Send + Sync`.
///
/// * [`is_ready`](Self::is_ready): what a kubelet or activator probe is answered with.
/// * [`refused`](Self::refused): the data path saw a connection to the user container refused;
///   callable from any thread. Not ready at once (`is_ready` is false from this call on) and
///   the prober goes back to aggressive attempts; ready again when they pass.
/// * [`edges`](Self::edges): readiness as the prober publishes it, changed only on edges (the
///   push side's `ready` / `not-ready`).
#[derive(Clone, Debug)]
pub struct QueueProxyHealth {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Written by the prober only.
    ready: AtomicBool,
    /// Set by [`QueueProxyHealth::refused`], taken by the prober.
    refused: AtomicBool,
    /// False without probes: always ready, a refusal changes nothing.
    probing: bool,
    wake: Notify,
    edges: watch::Sender<bool>,
}

/// The request path's view (`kactivator_shards::role::QueueProxy`).
impl kactivator_shards::role::UserContainer for QueueProxyHealth {
    fn is_ready(&self) -> bool {
        QueueProxyHealth::is_ready(self)
    }

    fn refused(&self) {
        QueueProxyHealth::refused(self)
    }
}

impl QueueProxyHealth {
    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::Acquire) && !self.shared.refused.load(Ordering::Acquire)
    }

    pub fn refused(&self) {
        if self.shared.probing {
            self.shared.refused.store(true, Ordering::Release);
            self.shared.wake.notify_one();
        }
    }

    /// A receiver of readiness edges; its first value is the readiness now.
    pub fn edges(&self) -> watch::Receiver<bool> {
        self.shared.edges.subscribe()
    }

    /// Takes a pending refusal: readiness is cleared before the request is, so `is_ready`
    /// never reads true in between.
    fn take_refused(&self) -> bool {
        if !self.shared.refused.load(Ordering::Acquire) {
            return false;
        }
        self.shared.ready.store(false, Ordering::Release);
        self.shared.refused.store(false, Ordering::Release);
        true
    }

    fn publish(&self, ready: bool) {
        self.shared.ready.store(ready, Ordering::Release);
        self.shared.edges.send_if_modified(|current| {
            let changed = *current != ready;
            *current = ready;
            changed
        });
    }
}

/// The task keeping a [`QueueProxyHealth`] current; [`Prober::run`] on the control thread.
#[derive(Debug)]
pub struct Prober {
    probes: Vec<ProbeSpec>,
    health: QueueProxyHealth,
}

/// The shared readiness of `probes` (from [`decode`]) and the task that keeps it current. With
/// no probes the container is always ready and the task ends at once.
pub fn prober(probes: Vec<ProbeSpec>) -> (QueueProxyHealth, Prober) {
    let probing = !probes.is_empty();
    let (edges, _) = watch::channel(!probing);
    let health = QueueProxyHealth {
        shared: Arc::new(Shared {
            ready: AtomicBool::new(!probing),
            refused: AtomicBool::new(false),
            probing,
            wake: Notify::new(),
            edges,
        }),
    };
    (health.clone(), Prober { probes, health })
}

impl Prober {
    /// Probes for as long as it is polled (it never ends while there are probes).
    pub async fn run(self) {
        let Some(first) = self.probes.first() else {
            return;
        };
        let health = &self.health;
        let now = || tokio::time::Instant::now().into_std();
        let mut schedule = Schedule::new(first.timing, now());
        let mut last_failure = String::new();
        loop {
            if health.take_refused() {
                schedule.refused(now());
                tracing::info!("user container refused a connection: not ready");
            }
            health.publish(schedule.is_ready());
            match schedule.next(now()) {
                Step::SleepUntil(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at.into()) => {}
                        _ = health.shared.wake.notified() => {}
                    }
                }
                Step::Attempt { .. } => {
                    // Each probe has its own timeout (`attempt_all`); the step's is the first's.
                    let mut attempt = pin!(attempt_all(&self.probes));
                    let outcome = loop {
                        tokio::select! {
                            outcome = &mut attempt => break Some(outcome),
                            _ = health.shared.wake.notified() => {
                                if health.shared.refused.load(Ordering::Acquire) {
                                    break None;
                                }
                            }
                        }
                    };
                    // A refusal during the attempt wins over its outcome (loop head).
                    let Some(outcome) = outcome else { continue };
                    if health.shared.refused.load(Ordering::Acquire) {
                        continue;
                    }
                    if let Outcome::Fail(reason) | Outcome::Refused(reason) = &outcome {
                        tracing::debug!("readiness attempt failed: {reason}");
                        last_failure.clone_from(reason);
                    }
                    match schedule.record(now(), &outcome) {
                        Some(true) => tracing::info!("user container ready"),
                        Some(false) => {
                            tracing::info!("user container not ready: {last_failure}")
                        }
                        None => {}
                    }
                }
                // Every attempt above ends recorded or abandoned (a refusal): not reached.
                Step::AwaitAttempt => schedule.abandon(),
            }
        }
    }
}

#[cfg(test)]
mod tests;
