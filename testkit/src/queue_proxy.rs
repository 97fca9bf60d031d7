//! A stand-in for the registration calls of the Cerebrium fork's queue-proxy: one
//! `POST /api/v1/pod-registration` per event, JSON body, `User-Agent: knative-queue-proxy`,
//! a fresh connection each time and no retries, as the real one does.
//!
//! Written from the wire description, independently of kactivator's parser, so that a test
//! using it checks the parser rather than agreeing with it.

use std::fmt::Display;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use kactivator_api::registration::{
    PATH as REGISTRATION_PATH, USER_AGENT as QUEUE_PROXY_USER_AGENT,
};

/// The queue-proxy's whole-call timeout (`RegistrationTimeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Most of a response body read; the real queue-proxy reads 4 KiB, tests may want more of an
/// error message.
const RESPONSE_LIMIT: usize = 64 * 1024;

/// Sends registration events for one pod to one activator.
#[derive(Clone, Debug)]
pub struct QueueProxyClient {
    activator: SocketAddr,
    namespace: String,
    revision: String,
    pod_name: String,
    pod_ip: String,
    timeout: Duration,
}

/// The body, field for field and in the order the queue-proxy marshals it.
#[derive(serde::Serialize)]
struct RegistrationBody<'a> {
    pod_name: &'a str,
    pod_ip: &'a str,
    namespace: &'a str,
    revision: &'a str,
    event_type: &'a str,
    timestamp: String,
}

impl QueueProxyClient {
    /// A client for pod `pod_name` at `pod_ip` (a bare address, no port, as the queue-proxy
    /// sends it; anything printable is taken so that tests can send invalid ones) of revision
    /// `namespace/revision`, talking to the activator's data port at `activator`.
    pub fn new(
        activator: SocketAddr,
        namespace: impl Into<String>,
        revision: impl Into<String>,
        pod_name: impl Into<String>,
        pod_ip: impl Display,
    ) -> Self {
        Self {
            activator,
            namespace: namespace.into(),
            revision: revision.into(),
            pod_name: pod_name.into(),
            pod_ip: pod_ip.to_string(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Replaces the whole-call timeout (default [`DEFAULT_TIMEOUT`], the queue-proxy's).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The JSON body for `event` (`ready`, `not-ready`, `draining`, `startup`, or anything a
    /// test wants to try), stamped with the current time like the queue-proxy's.
    pub fn body(&self, event: &str) -> Vec<u8> {
        let body = RegistrationBody {
            pod_name: &self.pod_name,
            pod_ip: &self.pod_ip,
            namespace: &self.namespace,
            revision: &self.revision,
            event_type: event,
            timestamp: rfc3339_nano(SystemTime::now()),
        };
        serde_json::to_vec(&body).expect("a struct of strings always serialises")
    }

    /// Sends `event` as the queue-proxy would and returns the status and body of the answer.
    ///
    /// # Panics
    ///
    /// When no HTTP answer arrives (refused, reset, timeout): a test sending a well-formed
    /// event always expects one. Use [`QueueProxyClient::send_raw`] to observe such failures.
    pub async fn send(&self, event: &str) -> (u16, String) {
        match self
            .send_raw(Some(QUEUE_PROXY_USER_AGENT), self.body(event))
            .await
        {
            Ok(answer) => answer,
            Err(error) => panic!(
                "registering {event:?} for {}/{} pod {} with {}: {error}",
                self.namespace, self.revision, self.pod_ip, self.activator
            ),
        }
    }

    /// [`QueueProxyClient::send`] for tests without a tokio runtime: runs the call on a
    /// runtime of its own. Must not be called from inside a runtime.
    pub fn send_blocking(&self, event: &str) -> (u16, String) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("building a current-thread runtime")
            .block_on(self.send(event))
    }

    /// Posts `body` as is to the registration path, with `user_agent` (none when `None`) and
    /// `Content-Type: application/json`: for tests of refused requests. Errors are transport
    /// failures, including the timeout (`TimedOut`).
    pub async fn send_raw(
        &self,
        user_agent: Option<&str>,
        body: impl Into<Bytes>,
    ) -> io::Result<(u16, String)> {
        let exchange = post(self.activator, user_agent, body.into());
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(answer) => answer,
            Err(_elapsed) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.timeout),
            )),
        }
    }
}

async fn post(
    activator: SocketAddr,
    user_agent: Option<&str>,
    body: Bytes,
) -> io::Result<(u16, String)> {
    let stream = TcpStream::connect(activator).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io::Error::other)?;
    let mut request = Request::post(REGISTRATION_PATH)
        .header(HOST, activator.to_string())
        .header(CONTENT_TYPE, "application/json")
        // Stated even for an empty body, as Go does for a POST; hyper would leave it out.
        .header(CONTENT_LENGTH, body.len())
        // The queue-proxy disables keep-alive for these calls.
        .header(CONNECTION, "close");
    if let Some(user_agent) = user_agent {
        request = request.header(USER_AGENT, user_agent);
    }
    let request = request
        .body(Full::new(body))
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error))?;

    let answer = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(io::Error::other)?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), RESPONSE_LIMIT)
            .collect()
            .await
            .map_err(io::Error::other)?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    // Driven here rather than spawned, so the client works on any tokio runtime flavour and
    // a timeout drops the socket with everything else.
    let mut connection = pin!(connection);
    let mut answer = pin!(answer);
    tokio::select! {
        biased;
        answer = &mut answer => answer,
        _ended = &mut connection => answer.await,
    }
}

/// `time` as Go's `time.RFC3339Nano` in UTC: `2025-10-31T12:00:00.123456789Z`, the fraction
/// without trailing zeros and left out when zero.
fn rfc3339_nano(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since_epoch.as_secs();
    let (days, second_of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = kactivator_h1::date::civil_from_days(days);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    );
    let nanos = since_epoch.subsec_nanos();
    if nanos != 0 {
        let fraction = format!("{nanos:09}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_nano_in_utc() {
        let at = |seconds: u64, nanos: u32| UNIX_EPOCH + Duration::new(seconds, nanos);
        assert_eq!(rfc3339_nano(at(0, 0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_nano(at(1_761_912_000, 123_456_789)),
            "2025-10-31T12:00:00.123456789Z"
        );
        assert_eq!(
            rfc3339_nano(at(951_782_400, 500_000_000)),
            "2000-02-29T00:00:00.5Z"
        );
        assert_eq!(
            rfc3339_nano(at(4_107_542_399, 1_000)),
            "2100-02-28T23:59:59.000001Z"
        );
    }

    #[test]
    fn the_body_has_the_queue_proxys_fields() {
        let client = QueueProxyClient::new(
            "127.0.0.1:1".parse().unwrap(),
            "default",
            "hello-00001",
            "hello-pod",
            std::net::Ipv4Addr::new(127, 0, 0, 2),
        );
        let body: serde_json::Value = serde_json::from_slice(&client.body("ready")).unwrap();
        let object = body.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 6, "{body}");
        assert_eq!(body["pod_name"], "hello-pod");
        assert_eq!(body["pod_ip"], "127.0.0.2");
        assert_eq!(body["namespace"], "default");
        assert_eq!(body["revision"], "hello-00001");
        assert_eq!(body["event_type"], "ready");
        let timestamp = body["timestamp"].as_str().unwrap();
        assert!(
            timestamp.len() >= 20 && timestamp.ends_with('Z'),
            "{timestamp}"
        );
    }
}
