use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::queue_proxy::readiness::{decode, prober};

use QueueProxyEvent::{Draining, NotReady, Ready, Startup};

fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

// === The core, in simulated time ===

/// One thing that happens to a [`Push`], at the time the case has reached.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// The clock moves on.
    Advance(u64),
    /// The prober publishes readiness.
    Readiness(bool),
    /// SIGTERM.
    Drain,
    /// `next` must say this.
    Expect(Expected),
    /// The request under way went so; `sent` must say this.
    Sent(Delivery, Expected),
}

/// A step or an after, with instants as milliseconds from the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expected {
    Send(QueueProxyEvent),
    SleepUntil(u64),
    AwaitSend,
    Idle,
    Done,
    Accepted,
    Retry(u64),
    GaveUp,
    Superseded,
}

use Delivery::{Accepted as Ok200, Failed as Lost, Refused as No};
use Expected as E;
use Op::{Advance, Drain, Expect, Readiness, Sent};

fn run_case(name: &str, starts_ready: bool, ops: &[Op]) {
    let start = Instant::now();
    let millis = |at: Instant| at.duration_since(start).as_millis() as u64;
    let mut now = start;
    let mut push = Push::new(starts_ready, now);
    for (index, op) in ops.iter().enumerate() {
        let context = format!("{name}: op {index} {op:?} at {} ms", millis(now));
        match *op {
            Advance(by) => now += ms(by),
            Readiness(ready) => push.readiness(ready, now),
            Drain => push.draining(now),
            Expect(expected) => {
                let got = match push.next(now) {
                    Step::Send(event) => E::Send(event),
                    Step::SleepUntil(at) => E::SleepUntil(millis(at)),
                    Step::AwaitSend => E::AwaitSend,
                    Step::Idle => E::Idle,
                    Step::Done => E::Done,
                };
                assert_eq!(got, expected, "{context}");
            }
            Sent(delivery, expected) => {
                let got = match push.sent(delivery, now).expect(&context) {
                    After::Accepted => E::Accepted,
                    After::Retry(at) => E::Retry(millis(at)),
                    After::GaveUp => E::GaveUp,
                    After::Superseded => E::Superseded,
                };
                assert_eq!(got, expected, "{context}");
            }
        }
    }
}

#[test]
fn which_event_goes_when() {
    let cases: &[(&str, bool, &[Op])] = &[
        (
            "a cold start says startup, then ready when readiness first passes",
            false,
            &[
                Expect(E::Send(Startup)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
                Readiness(false),
                Expect(E::Idle),
                Advance(700),
                Readiness(true),
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Readiness(true),
                Expect(E::Idle),
            ],
        ),
        (
            "a container ready at start is announced ready, without startup",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "ready before startup went out replaces it",
            false,
            &[
                Readiness(true),
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "each edge is one event: ready, not-ready, ready",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Advance(5),
                Readiness(false),
                Readiness(false),
                Expect(E::Send(NotReady)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
                Readiness(true),
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "one request at a time: news during a request waits for it, then goes",
            true,
            &[
                Expect(E::Send(Ready)),
                Readiness(false),
                Expect(E::AwaitSend),
                Sent(Ok200, E::Accepted),
                Expect(E::Send(NotReady)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "a flap back during a request is sent again: the activator applied the middle one",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Readiness(false),
                Expect(E::Send(NotReady)),
                Readiness(true),
                Sent(Ok200, E::Accepted),
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "a superseded request that failed is not retried; the news goes at once",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Readiness(false),
                Expect(E::Send(NotReady)),
                Advance(2000),
                Readiness(true),
                // It may have been applied: the activator's view is unknown, so `ready` goes
                // again although it was the last one accepted.
                Sent(Lost, E::Superseded),
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "a superseded request that was refused leaves the last applied one standing",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Readiness(false),
                Expect(E::Send(NotReady)),
                Readiness(true),
                Sent(No, E::Superseded),
                Expect(E::Idle),
            ],
        ),
        (
            "a failure is retried after 100 ms, doubling up to 2 s, six attempts in all",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Lost, E::Retry(100)),
                Expect(E::SleepUntil(100)),
                Advance(99),
                Expect(E::SleepUntil(100)),
                Advance(1),
                Expect(E::Send(Ready)),
                Advance(2000),
                Sent(Lost, E::Retry(2300)),
                Advance(300),
                Expect(E::Send(Ready)),
                Sent(Lost, E::Retry(2800)),
                Advance(400),
                Expect(E::Send(Ready)),
                Sent(Lost, E::Retry(3600)),
                Advance(800),
                Expect(E::Send(Ready)),
                Sent(Lost, E::Retry(5200)),
                Advance(1600),
                Expect(E::Send(Ready)),
                Sent(Lost, E::GaveUp),
                Expect(E::Idle),
                Advance(60_000),
                Expect(E::Idle),
            ],
        ),
        (
            "a retry that gets through ends the retries",
            false,
            &[
                Expect(E::Send(Startup)),
                Sent(Lost, E::Retry(100)),
                Advance(100),
                Expect(E::Send(Startup)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "a refusal is given up at once, and the next news goes as usual",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(No, E::GaveUp),
                Expect(E::Idle),
                Readiness(false),
                Expect(E::Send(NotReady)),
                Sent(Ok200, E::Accepted),
                Expect(E::Idle),
            ],
        ),
        (
            "news during a backoff goes at once, with a fresh count of attempts",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Lost, E::Retry(100)),
                Advance(10),
                Readiness(false),
                Expect(E::Send(NotReady)),
                Sent(Lost, E::Retry(110)),
            ],
        ),
        (
            "draining is sent at SIGTERM and ends the push",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Ok200, E::Accepted),
                Drain,
                Expect(E::Send(Draining)),
                Sent(Ok200, E::Accepted),
                Expect(E::Done),
                Readiness(false),
                Drain,
                Expect(E::Done),
            ],
        ),
        (
            "draining replaces a retry in backoff and goes at once",
            true,
            &[
                Expect(E::Send(Ready)),
                Sent(Lost, E::Retry(100)),
                Advance(20),
                Drain,
                Expect(E::Send(Draining)),
                Sent(Ok200, E::Accepted),
                Expect(E::Done),
            ],
        ),
        (
            "draining during a request follows it",
            false,
            &[
                Expect(E::Send(Startup)),
                Drain,
                Expect(E::AwaitSend),
                Sent(Ok200, E::Accepted),
                Expect(E::Send(Draining)),
                Sent(Ok200, E::Accepted),
                Expect(E::Done),
            ],
        ),
        (
            "readiness after draining is not reported",
            true,
            &[
                Drain,
                Readiness(false),
                Readiness(true),
                Expect(E::Send(Draining)),
                Sent(Ok200, E::Accepted),
                Readiness(false),
                Expect(E::Done),
            ],
        ),
        (
            "a draining that is refused or never gets through ends the push too",
            true,
            &[
                Drain,
                Expect(E::Send(Draining)),
                Sent(Lost, E::Retry(100)),
                Advance(100),
                Expect(E::Send(Draining)),
                Sent(No, E::GaveUp),
                Expect(E::Done),
            ],
        ),
    ];
    for (name, starts_ready, ops) in cases {
        run_case(name, *starts_ready, ops);
    }
}

#[test]
fn sent_without_a_request_under_way_is_ignored() {
    let now = Instant::now();
    let mut push = Push::new(true, now);
    assert_eq!(push.sent(Delivery::Accepted, now), None);
    assert_eq!(push.next(now), Step::Send(Ready));
}

#[test]
fn what_an_answer_means() {
    let table = [
        (200, Delivery::Accepted),
        (202, Delivery::Accepted),
        (299, Delivery::Accepted),
        (100, Delivery::Refused),
        (301, Delivery::Refused),
        (307, Delivery::Refused),
        (400, Delivery::Refused),
        (401, Delivery::Refused),
        (404, Delivery::Refused),
        (405, Delivery::Refused),
        (408, Delivery::Failed),
        (429, Delivery::Failed),
        (500, Delivery::Failed),
        (502, Delivery::Failed),
        (503, Delivery::Failed),
        (599, Delivery::Failed),
        (600, Delivery::Refused),
    ];
    for (status, delivery) in table {
        assert_eq!(Delivery::of_status(status), delivery, "{status}");
    }
}

#[test]
fn the_backoff_doubles_from_100_ms_up_to_2_s() {
    let table = [
        (0, 100),
        (1, 100),
        (2, 200),
        (3, 400),
        (4, 800),
        (5, 1600),
        (6, 2000),
        (40, 2000),
        (u32::MAX, 2000),
    ];
    for (failures, wait) in table {
        assert_eq!(retry_wait(failures), ms(wait), "{failures}");
    }
}

#[test]
fn timestamps_are_written_as_gos_rfc3339_nano_in_utc() {
    let at = |seconds: u64, nanos: u32| SystemTime::UNIX_EPOCH + Duration::new(seconds, nanos);
    let table = [
        (at(0, 0), "1970-01-01T00:00:00Z"),
        (
            at(1_761_912_000, 123_456_789),
            "2025-10-31T12:00:00.123456789Z",
        ),
        (at(1_761_912_000, 120_000_000), "2025-10-31T12:00:00.12Z"),
        (at(1_761_912_000, 1), "2025-10-31T12:00:00.000000001Z"),
        (at(951_868_799, 0), "2000-02-29T23:59:59Z"),
        (
            SystemTime::UNIX_EPOCH - Duration::from_secs(1),
            "1970-01-01T00:00:00Z",
        ),
    ];
    for (time, text) in table {
        assert_eq!(rfc3339_nano(time), text);
    }
}

// === The shell, against a real listener ===

/// A request as the test activator read it.
#[derive(Debug)]
struct Seen {
    head: String,
    body: serde_json::Value,
}

/// A stand-in activator on loopback: answers each request with the next scripted status (200
/// once the script is used up), `None` meaning "read the request, then say nothing".
async fn activator(
    script: Vec<Option<u16>>,
) -> (
    SocketAddr,
    Arc<Mutex<Vec<Seen>>>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (each, arrivals) = tokio::sync::mpsc::unbounded_channel();
    let record = seen.clone();
    tokio::spawn(async move {
        let mut script = VecDeque::from(script);
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let request = read_request(&mut stream).await;
            record.lock().unwrap().push(request);
            let _ = each.send(());
            match script.pop_front().unwrap_or(Some(200)) {
                Some(status) => {
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: 22\r\nConnection: close\r\n\r\n{{\"status\":\"accepted\"}}\n"
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                }
                // Silent: keep the connection open until the client gives up.
                None => {
                    tokio::spawn(async move {
                        let mut rest = Vec::new();
                        let _ = stream.read_to_end(&mut rest).await;
                    });
                }
            }
        }
    });
    (addr, seen, arrivals)
}

async fn read_request(stream: &mut TcpStream) -> Seen {
    let mut raw = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0, "the request ended early: {raw:?}");
        raw.extend_from_slice(&chunk[..read]);
        let Some(end) = raw.windows(4).position(|window| window == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8(raw[..end].to_vec()).unwrap();
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().unwrap())
            })
            .expect("a Content-Length");
        if raw.len() >= end + 4 + length {
            let body = serde_json::from_slice(&raw[end + 4..end + 4 + length]).unwrap();
            return Seen { head, body };
        }
    }
}

fn url(addr: SocketAddr, base: &str) -> ActivatorUrl {
    ActivatorUrl::parse(&format!("http://{addr}{base}")).unwrap()
}

fn pod() -> PodIdentity {
    PodIdentity {
        pod_name: "hello-00001-deployment-abc".into(),
        pod_ip: "10.0.0.7".parse().unwrap(),
        namespace: "default".into(),
        revision: "hello-00001".into(),
    }
}

async fn arrival(arrivals: &mut tokio::sync::mpsc::UnboundedReceiver<()>) {
    tokio::time::timeout(Duration::from_secs(10), arrivals.recv())
        .await
        .expect("a request reached the activator")
        .unwrap();
}

#[tokio::test]
async fn each_event_is_the_forks_request_in_order_and_draining_ends_the_task() {
    let (addr, seen, mut arrivals) = activator(Vec::new()).await;
    // The user container's readiness follows a real listener.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let probes = decode(
        &format!(r#"{{"tcpSocket":{{"port":{port}}}}}"#),
        false,
        port,
    )
    .unwrap();
    let (health, prober) = prober(probes);
    let prober = tokio::spawn(prober.run());
    let (drain, drain_phase) = watch::channel(DrainPhase::Serving);
    let pusher = Pusher::new(url(addr, "/base/"), pod()).unwrap();
    let task = tokio::spawn(pusher.run(health.edges(), drain_phase));

    arrival(&mut arrivals).await;
    let user = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    arrival(&mut arrivals).await;
    drop(user);
    arrival(&mut arrivals).await;
    drain.send_replace(DrainPhase::Draining);
    arrival(&mut arrivals).await;
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the push ends once draining is delivered")
        .unwrap();
    prober.abort();

    let seen = seen.lock().unwrap();
    let events: Vec<&str> = seen
        .iter()
        .map(|request| request.body["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["startup", "ready", "not-ready", "draining"]);
    for request in seen.iter() {
        let lines: Vec<&str> = request.head.lines().collect();
        assert_eq!(lines[0], "POST /base/api/v1/pod-registration HTTP/1.1");
        for header in [
            "user-agent: knative-queue-proxy".to_string(),
            "content-type: application/json".into(),
            format!("host: {addr}"),
            "connection: close".into(),
        ] {
            assert!(
                lines.iter().any(|line| line.eq_ignore_ascii_case(&header)),
                "{header} in {lines:?}"
            );
        }
        let body = request.body.as_object().unwrap();
        assert_eq!(body["pod_name"], "hello-00001-deployment-abc");
        assert_eq!(body["pod_ip"], "10.0.0.7");
        assert_eq!(body["namespace"], "default");
        assert_eq!(body["revision"], "hello-00001");
        let timestamp = body["timestamp"].as_str().unwrap();
        assert!(
            timestamp.starts_with("20") && timestamp.ends_with('Z'),
            "{timestamp}"
        );
        // What the activator's own parser accepts.
        let raw = serde_json::to_vec(&request.body).unwrap();
        assert!(registration::parse(&raw).is_ok());
    }
}

#[tokio::test]
async fn a_5xx_is_retried_and_a_4xx_is_not() {
    let (addr, seen, mut arrivals) = activator(vec![Some(503), Some(200), Some(404)]).await;
    let (health, _prober) = prober(Vec::new());
    let (drain, drain_phase) = watch::channel(DrainPhase::Serving);
    let task = tokio::spawn(
        Pusher::new(url(addr, ""), pod())
            .unwrap()
            .run(health.edges(), drain_phase),
    );
    arrival(&mut arrivals).await;
    let first = std::time::Instant::now();
    arrival(&mut arrivals).await;
    assert!(first.elapsed() >= RETRY_FIRST, "{:?}", first.elapsed());
    // `ready` is applied; the 404 to `draining` is final.
    drain.send_replace(DrainPhase::Draining);
    arrival(&mut arrivals).await;
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("a refused draining ends the push")
        .unwrap();
    let events: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|request| request.body["event_type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(events, ["ready", "ready", "draining"]);
}

#[tokio::test]
async fn a_silent_activator_costs_one_timeout_then_a_retry() {
    let (addr, _seen, mut arrivals) = activator(vec![None]).await;
    let (health, _prober) = prober(Vec::new());
    let (_drain, drain_phase) = watch::channel(DrainPhase::Serving);
    let task = tokio::spawn(
        Pusher::new(url(addr, ""), pod())
            .unwrap()
            .run(health.edges(), drain_phase),
    );
    arrival(&mut arrivals).await;
    let first = std::time::Instant::now();
    arrival(&mut arrivals).await;
    let waited = first.elapsed();
    assert!(
        waited >= REQUEST_TIMEOUT && waited < REQUEST_TIMEOUT + Duration::from_secs(2),
        "{waited:?}"
    );
    task.abort();
}

#[test]
fn a_pod_the_activator_would_refuse_is_refused_at_start() {
    let url = url("127.0.0.1:1".parse().unwrap(), "");
    let cases = [
        (
            PodIdentity {
                pod_ip: "0.0.0.0".parse().unwrap(),
                ..pod()
            },
            RegistrationError::InvalidPodIp,
        ),
        (
            PodIdentity {
                pod_name: String::new(),
                ..pod()
            },
            RegistrationError::MissingFields,
        ),
        (
            PodIdentity {
                namespace: "a/b".into(),
                ..pod()
            },
            RegistrationError::InvalidBody,
        ),
    ];
    for (identity, error) in cases {
        let refused = Pusher::new(url.clone(), identity);
        assert_eq!(refused.unwrap_err(), error);
    }
}
