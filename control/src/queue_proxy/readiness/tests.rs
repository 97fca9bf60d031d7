use bytes::Bytes;
use kactivator_api::grpc_health::{HealthCheckRequest, HealthCheckResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::*;

const USER_PORT: u16 = 8080;

fn one(json: &str) -> Result<ProbeSpec, DecodeError> {
    decode(json, false, USER_PORT).map(|mut probes| {
        assert_eq!(probes.len(), 1);
        probes.remove(0)
    })
}

fn tcp(host: &str, port: u16) -> Action {
    Action::Tcp(Target {
        host: host.into(),
        port,
    })
}

// === decode ===

#[test]
fn the_reconcilers_probes_decode() {
    // `reference/queue-proxy.md` §1.3's examples, as upstream's reconciler writes them.
    let probe = one(r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"}}"#).unwrap();
    assert_eq!(probe.action, tcp("127.0.0.1", 8080));
    assert_eq!(
        probe.timing,
        Timing {
            period: Duration::ZERO,
            timeout: Duration::from_secs(1),
            success_threshold: 1,
            failure_threshold: 3,
        }
    );
    assert!(probe.timing.aggressive());
    assert_eq!(probe.timing.attempt_timeout(), AGGRESSIVE_TIMEOUT);

    let probe = one(
        r#"{"httpGet":{"path":"/","port":8080,"host":"127.0.0.1","scheme":"HTTP"},"periodSeconds":5,"timeoutSeconds":2,"successThreshold":2,"failureThreshold":4}"#,
    )
    .unwrap();
    assert_eq!(
        probe.action,
        Action::Http(HttpGet {
            target: Target {
                host: "127.0.0.1".into(),
                port: 8080
            },
            path: "/".into(),
            headers: Vec::new(),
        })
    );
    assert_eq!(
        probe.timing,
        Timing {
            period: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            success_threshold: 2,
            failure_threshold: 4,
        }
    );
    assert_eq!(probe.timing.attempt_timeout(), Duration::from_secs(2));
    assert_eq!(probe.timing.ready_period(), Duration::from_secs(5));

    let probe = one(r#"{"grpc":{"port":9000,"service":null}}"#).unwrap();
    assert_eq!(
        probe.action,
        Action::Grpc {
            port: 9000,
            service: String::new()
        }
    );
}

#[test]
fn defaults_fill_what_the_reconciler_leaves_out() {
    // Port 0, absent, "" or "0" is the user port; an empty host is 127.0.0.1.
    for json in [
        r#"{"tcpSocket":{}}"#,
        r#"{"tcpSocket":{"port":0,"host":""}}"#,
        r#"{"tcpSocket":{"port":""}}"#,
        r#"{"tcpSocket":{"port":"0"}}"#,
        r#"{"tcpSocket":{"port":null,"host":null}}"#,
        // exec becomes TCP to the user port, as upstream's reconciler makes it.
        r#"{"exec":{"command":["cat","/tmp/ready"]}}"#,
    ] {
        assert_eq!(
            one(json).unwrap().action,
            tcp("127.0.0.1", USER_PORT),
            "{json}"
        );
    }
    assert_eq!(
        one(r#"{"tcpSocket":{"port":"9090","host":"[::1]"}}"#)
            .unwrap()
            .action,
        tcp("::1", 9090)
    );
    let Action::Http(http) = one(r#"{"httpGet":{"path":"ready?full=1&x=a b"}}"#)
        .unwrap()
        .action
    else {
        panic!("an HTTP probe");
    };
    assert_eq!(
        http.target,
        Target {
            host: "127.0.0.1".into(),
            port: USER_PORT
        }
    );
    assert_eq!(http.path, "/ready?full=1&x=a%20b");
    // A CR LF in the path cannot inject a header.
    let Action::Http(http) = one(r#"{"httpGet":{"path":"/a\r\nX-Evil: 1"}}"#)
        .unwrap()
        .action
    else {
        panic!("an HTTP probe");
    };
    assert_eq!(http.path, "/a%0D%0AX-Evil:%201");
    // Unknown fields are ignored, as Go's decoder ignores them.
    assert!(one(r#"{"tcpSocket":{},"initialDelaySeconds":3,"later":{"a":[1]}}"#).is_ok());
}

#[test]
fn multi_container_probes_are_a_list_iff_asked() {
    let json = r#"[{"httpGet":{"port":8080,"path":"/"}},{"tcpSocket":{"port":9000}}]"#;
    let probes = decode(json, true, USER_PORT).unwrap();
    assert_eq!(probes.len(), 2);
    assert_eq!(probes[1].action, tcp("127.0.0.1", 9000));
    assert!(matches!(
        decode(json, false, USER_PORT),
        Err(DecodeError::Json(_))
    ));
    assert!(matches!(
        decode(r#"{"tcpSocket":{}}"#, true, USER_PORT),
        Err(DecodeError::Json(_))
    ));
    assert!(decode("[]", true, USER_PORT).is_err());
    let error = decode(r#"[{"tcpSocket":{}},null]"#, true, USER_PORT).unwrap_err();
    assert_eq!(error.to_string(), "SERVING_READINESS_PROBE: [1] is null");
    // Empty: no probe, always ready.
    assert_eq!(decode("", false, USER_PORT).unwrap(), Vec::new());
    assert_eq!(decode("", true, USER_PORT).unwrap(), Vec::new());
}

#[test]
fn what_cannot_be_probed_is_refused_naming_the_field() {
    let message = |json: &str| one(json).unwrap_err().to_string();
    assert_eq!(
        one(r#"{"httpGet":{"port":"http"}}"#).unwrap_err(),
        DecodeError::NamedPort {
            field: "httpGet.port".into(),
            name: "http".into()
        }
    );
    assert!(message(r#"{"tcpSocket":{"port":"http"}}"#)
        .contains("tcpSocket.port is the named port \"http\""));
    assert_eq!(
        one(r#"{"httpGet":{"scheme":"HTTPS"}}"#).unwrap_err(),
        DecodeError::Https {
            field: "httpGet.scheme".into()
        }
    );
    assert!(message(r#"{"httpGet":{"scheme":"https"}}"#).contains("over TLS is not built"));
    for (json, expected) in [
        (r#"{}"#, "the probe has no handler"),
        ("null", "the probe is null"),
        (
            r#"{"tcpSocket":{},"httpGet":{}}"#,
            "the probe has more than one handler",
        ),
        (r#"{"httpGet":{"scheme":"FTP"}}"#, "httpGet.scheme \"FTP\""),
        (r#"{"tcpSocket":{"port":65536}}"#, "tcpSocket.port is 65536"),
        (r#"{"tcpSocket":{"port":-1}}"#, "tcpSocket.port is -1"),
        (r#"{"grpc":{"port":70000}}"#, "grpc.port is 70000"),
        (r#"{"tcpSocket":{"host":"a b"}}"#, "tcpSocket.host"),
        (
            r#"{"tcpSocket":{},"periodSeconds":3601}"#,
            "periodSeconds is 3601",
        ),
        (
            r#"{"tcpSocket":{},"timeoutSeconds":-1}"#,
            "timeoutSeconds is -1",
        ),
        (
            r#"{"tcpSocket":{},"successThreshold":2147483648}"#,
            "successThreshold is 2147483648",
        ),
        (
            r#"{"tcpSocket":{},"failureThreshold":-3}"#,
            "failureThreshold is -3",
        ),
        (
            r#"{"httpGet":{"httpHeaders":[{"name":"X-A","value":"1\r\nX-B: 2"}]}}"#,
            "httpGet.httpHeaders[0].value",
        ),
        (
            r#"{"httpGet":{"httpHeaders":[{"name":"Bad Name","value":"1"}]}}"#,
            "httpGet.httpHeaders[0].name",
        ),
        (
            r#"{"httpGet":{"httpHeaders":[{"name":"Content-Length","value":"5"}]}}"#,
            "cannot be sent on a probe",
        ),
    ] {
        let text = message(json);
        assert!(text.contains(expected), "{json}: {text}");
    }
}

#[test]
fn hostile_json_is_an_error_never_a_panic() {
    let deep_array = "[".repeat(100_000);
    let deep_object = r#"{"tcpSocket":"#.repeat(10_000);
    let deep_unknown = format!(
        r#"{{"tcpSocket":{{}},"x":{}1{}}}"#,
        "[".repeat(5000),
        "]".repeat(5000)
    );
    let long_port = format!(r#"{{"tcpSocket":{{"port":"{}"}}}}"#, "9".repeat(100_000));
    let cases: Vec<String> = vec![
        "junk".into(),
        "{".into(),
        "\u{0}".into(),
        "\"\u{fffd}\"".into(),
        r#"{"tcpSocket":{"port":1e400}}"#.into(),
        r#"{"tcpSocket":{"port":99999999999999999999999}}"#.into(),
        r#"{"tcpSocket":{"port":8080.5}}"#.into(),
        r#"{"tcpSocket":{"port":true}}"#.into(),
        r#"{"tcpSocket":{},"periodSeconds":-9223372036854775808}"#.into(),
        r#"{"tcpSocket":{},"periodSeconds":18446744073709551616}"#.into(),
        r#"{"grpc":{"port":"8080"}}"#.into(),
        r#"{"httpGet":{"httpHeaders":{"name":"a"}}}"#.into(),
        r#"{"tcpSocket":[]}"#.into(),
        deep_array.clone(),
        deep_object,
        long_port,
    ];
    for json in &cases {
        for multi in [false, true] {
            let result = decode(json, multi, USER_PORT);
            assert!(result.is_err(), "{:?} gave {result:?}", clip(json));
        }
    }
    // Deep nesting inside an unknown field is skipped, as Go skips unknown fields, without
    // recursion.
    assert_eq!(
        one(&deep_unknown).unwrap().action,
        tcp("127.0.0.1", USER_PORT)
    );
    // Random bytes around a valid probe: whatever comes out, no panic, and nothing that is
    // not a probe decodes as one.
    let valid = r#"{"httpGet":{"path":"/","port":8080,"httpHeaders":[{"name":"a","value":"b"}]}}"#;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..2000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut bytes = valid.as_bytes().to_vec();
        let at = (state as usize) % bytes.len();
        bytes[at] = (state >> 32) as u8;
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(probes) = decode(&text, false, USER_PORT) {
            assert_eq!(probes.len(), 1);
        }
    }
}

// === the schedule, in simulated time ===

fn timing(period: u64, timeout: u64, success: u32, failure: u32) -> Timing {
    Timing {
        period: Duration::from_secs(period),
        timeout: Duration::from_secs(timeout),
        success_threshold: success,
        failure_threshold: failure,
    }
}

fn ms(value: u64) -> Duration {
    Duration::from_millis(value)
}

/// Drives a schedule: at each `(at_ms, outcome)` the attempt due is made (asserting that
/// one is due by then and none before), its outcome recorded; returns
/// `(attempt start ms, readiness edge)` per step.
fn drive(timing: Timing, steps: &[(u64, Outcome)]) -> Vec<(u64, Option<bool>)> {
    let start = Instant::now();
    let mut schedule = Schedule::new(timing, start);
    let mut trace = Vec::new();
    for (at, outcome) in steps {
        let now = start + ms(*at);
        // Not before it is due: the step before asked to sleep until exactly then.
        match schedule.next(now) {
            Step::Attempt { timeout } => assert_eq!(timeout, timing.attempt_timeout()),
            other => panic!("at {at} ms: {other:?}"),
        }
        assert_eq!(schedule.next(now), Step::AwaitAttempt);
        let edge = schedule.record(now, outcome);
        trace.push((*at, edge));
    }
    trace
}

/// When the next attempt is due after the last step.
fn next_due(timing: Timing, steps: &[(u64, Outcome)]) -> u64 {
    let start = Instant::now();
    let mut schedule = Schedule::new(timing, start);
    let mut last = start;
    for (at, outcome) in steps {
        last = start + ms(*at);
        assert!(matches!(schedule.next(last), Step::Attempt { .. }));
        schedule.record(last, outcome);
    }
    match schedule.next(last) {
        Step::SleepUntil(at) => at.duration_since(start).as_millis() as u64,
        Step::Attempt { .. } => last.duration_since(start).as_millis() as u64,
        Step::AwaitAttempt => panic!("nothing under way"),
    }
}

fn fail() -> Outcome {
    Outcome::Fail("status 500".into())
}

fn refused() -> Outcome {
    Outcome::Refused("connect: refused".into())
}

#[test]
fn aggressive_until_ready_then_every_period() {
    use Outcome::Pass;
    /// A name, the timing, the attempts `(start ms, outcome)`, the readiness edge each
    /// gives, when the next attempt is due (ms).
    type Case = (
        &'static str,
        Timing,
        Vec<(u64, Outcome)>,
        Vec<Option<bool>>,
        u64,
    );
    let table: Vec<Case> = vec![
        (
            "period 0: ready on the first pass, then every second",
            timing(0, 0, 1, 3),
            vec![(0, refused()), (50, refused()), (100, Pass)],
            vec![None, None, Some(true)],
            1100,
        ),
        (
            "successThreshold 3 needs three passes in a row; a failure restarts the count",
            timing(0, 0, 3, 3),
            vec![
                (0, Pass),
                (50, Pass),
                (100, fail()),
                (150, Pass),
                (200, Pass),
                (250, Pass),
            ],
            vec![None, None, None, None, None, Some(true)],
            1250,
        ),
        (
            "standard mode is aggressive until the first pass, then once per period",
            timing(10, 2, 1, 3),
            vec![(0, fail()), (50, Pass), (10_050, Pass)],
            vec![None, Some(true), None],
            20_050,
        ),
        (
            "period 0: failureThreshold failures in a row once ready: not ready, aggressive again",
            timing(0, 0, 1, 3),
            vec![
                (0, Pass),
                (1_000, fail()),
                (2_000, Pass),
                (3_000, fail()),
                (4_000, fail()),
                (5_000, fail()),
            ],
            vec![Some(true), None, None, None, None, Some(false)],
            5_050,
        ),
        (
            "standard mode: one failure once ready is not ready (the kubelet applies \
             failureThreshold to its own probes, as upstream's queue-proxy makes one attempt)",
            timing(10, 1, 1, 3),
            vec![(0, Pass), (10_000, fail()), (10_050, Pass)],
            vec![Some(true), Some(false), Some(true)],
            20_050,
        ),
        (
            "standard mode: one pass is ready, whatever successThreshold (the kubelet's)",
            timing(10, 1, 3, 3),
            vec![(0, fail()), (50, Pass)],
            vec![None, Some(true)],
            10_050,
        ),
        (
            "a refused attempt once ready: not ready at once",
            timing(10, 1, 1, 3),
            vec![(0, Pass), (10_000, refused())],
            vec![Some(true), Some(false)],
            10_050,
        ),
    ];
    for (name, timing, steps, edges, due) in table {
        let trace = drive(timing, &steps);
        let got: Vec<Option<bool>> = trace.iter().map(|(_, edge)| *edge).collect();
        assert_eq!(got, edges, "{name}");
        assert_eq!(next_due(timing, &steps), due, "{name}");
    }
}

#[test]
fn attempts_never_overlap_and_a_slow_one_delays_the_next() {
    let start = Instant::now();
    let mut schedule = Schedule::new(timing(5, 2, 1, 3), start);
    assert_eq!(
        schedule.next(start),
        Step::Attempt {
            timeout: Duration::from_secs(2)
        }
    );
    // Long past the 50 ms interval, the attempt is still under way.
    assert_eq!(schedule.next(start + ms(1500)), Step::AwaitAttempt);
    schedule.record(start + ms(2000), &Outcome::Fail("timed out".into()));
    // Overdue: the next attempt starts at once.
    assert!(matches!(
        schedule.next(start + ms(2000)),
        Step::Attempt { .. }
    ));
}

#[test]
fn refused_makes_not_ready_at_once_and_discards_the_attempt_under_way() {
    let start = Instant::now();
    let mut schedule = Schedule::new(timing(0, 0, 1, 3), start);
    assert!(matches!(schedule.next(start), Step::Attempt { .. }));
    assert_eq!(schedule.record(start, &Outcome::Pass), Some(true));
    assert_eq!(
        schedule.next(start + ms(10)),
        Step::SleepUntil(start + ms(1000))
    );
    // Refused while sleeping: not ready now, the next attempt due now.
    assert_eq!(schedule.refused(start + ms(10)), Some(false));
    assert!(!schedule.is_ready());
    assert!(matches!(
        schedule.next(start + ms(10)),
        Step::Attempt { .. }
    ));
    // Refused again with that attempt under way: no edge (already not ready), and the
    // attempt's late pass, which may predate the refusal, is not recorded.
    assert_eq!(schedule.refused(start + ms(20)), None);
    assert_eq!(schedule.record(start + ms(30), &Outcome::Pass), None);
    assert!(!schedule.is_ready());
    // The abandoned attempt keeps the pace: the next one 50 ms after it started, however
    // many refusals come meanwhile.
    for at in [30, 40, 50] {
        assert_eq!(schedule.refused(start + ms(at)), None);
        assert_eq!(
            schedule.next(start + ms(at)),
            Step::SleepUntil(start + ms(60))
        );
    }
    assert!(matches!(
        schedule.next(start + ms(60)),
        Step::Attempt { .. }
    ));
    assert_eq!(schedule.record(start + ms(61), &Outcome::Pass), Some(true));
}

// === attempts against real sockets ===

const LONG: Duration = Duration::from_secs(5);

async fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn tcp_attempt_is_refused_on_a_closed_port_and_passes_once_it_listens() {
    let port = free_port().await;
    let action = tcp("127.0.0.1", port);
    let outcome = attempt(&action, LONG).await;
    assert!(matches!(outcome, Outcome::Refused(_)), "{outcome:?}");
    let _listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    assert_eq!(attempt(&action, LONG).await, Outcome::Pass);
}

/// An HTTP/1.1 server answering each connection with `status`, reporting each request head.
async fn http_server(status: &'static str) -> (u16, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (heads, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let heads = heads.clone();
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let _ = heads.send(head);
                let response = format!(
                    "HTTP/1.1 {status}\r\nLocation: /elsewhere\r\nContent-Length: 4\r\n\r\nbody"
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    (port, received)
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

fn http_probe(port: u16, headers: &[(&str, &str)]) -> Action {
    Action::Http(HttpGet {
        target: Target {
            host: "127.0.0.1".into(),
            port,
        },
        path: "/ready?full=1".into(),
        headers: headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect(),
    })
}

#[tokio::test]
async fn http_attempt_passes_on_2xx_and_3xx_and_fails_on_5xx() {
    for (status, expected) in [
        ("200 OK", Outcome::Pass),
        ("302 Found", Outcome::Pass),
        ("399 Whatever", Outcome::Pass),
        ("400 Bad Request", Outcome::Fail("status 400".into())),
        ("404 Not Found", Outcome::Fail("status 404".into())),
        (
            "500 Internal Server Error",
            Outcome::Fail("status 500".into()),
        ),
    ] {
        let (port, _) = http_server(status).await;
        assert_eq!(
            attempt(&http_probe(port, &[]), LONG).await,
            expected,
            "{status}"
        );
    }
}

#[tokio::test]
async fn http_attempt_sends_upstreams_request_on_a_new_connection_each_time() {
    let (port, mut heads) = http_server("200 OK").await;
    let action = http_probe(port, &[("X-Custom", "a"), ("x-custom", "b")]);
    for _ in 0..2 {
        assert_eq!(attempt(&action, LONG).await, Outcome::Pass);
    }
    for _ in 0..2 {
        let head = heads.recv().await.unwrap();
        let lines: Vec<&str> = head.split("\r\n").collect();
        assert_eq!(
            lines[..6],
            [
                "GET /ready?full=1 HTTP/1.1",
                &format!("Host: 127.0.0.1:{port}"),
                "User-Agent: kube-probe//",
                "X-Custom: a",
                "x-custom: b",
                "Connection: close",
            ],
            "{head:?}"
        );
    }
    // The user's User-Agent and Host replace ours.
    let (port, mut heads) = http_server("200 OK").await;
    let action = http_probe(port, &[("User-Agent", "mine"), ("Host", "app.example")]);
    assert_eq!(attempt(&action, LONG).await, Outcome::Pass);
    let head = heads.recv().await.unwrap();
    assert!(!head.contains("kube-probe"), "{head:?}");
    assert!(
        head.contains("\r\nUser-Agent: mine\r\nHost: app.example\r\n"),
        "{head:?}"
    );
}

#[tokio::test]
async fn http_attempt_against_a_silent_server_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        std::future::pending::<()>().await;
        drop(stream);
    });
    let outcome = attempt(&http_probe(port, &[]), AGGRESSIVE_TIMEOUT).await;
    assert_eq!(outcome, Outcome::Fail("timed out after 100ms".into()));
}

/// A gRPC server that speaks only HTTP/2: `Health/Check` answers SERVING for `serving`,
/// NOT_SERVING for any other service. Reports each request's user agent.
async fn grpc_server(serving: &'static str) -> (u16, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (agents, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let agents = agents.clone();
            tokio::spawn(async move {
                let Ok(mut connection) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = connection.accept().await {
                    let (parts, mut body) = request.into_parts();
                    let mut received = Vec::new();
                    while let Some(Ok(data)) = body.data().await {
                        let _ = body.flow_control().release_capacity(data.len());
                        received.extend_from_slice(&data);
                    }
                    let agent = parts
                        .headers
                        .get("user-agent")
                        .map_or(String::new(), |agent| {
                            String::from_utf8_lossy(agent.as_bytes()).into_owned()
                        });
                    let _ = agents.send(agent);
                    let asks_serving = received
                        == grpc_health::frame(&HealthCheckRequest {
                            service: serving.into(),
                        });
                    let status = if asks_serving && parts.uri.path() == grpc_health::CHECK_PATH {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    let response = http::Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc")
                        .body(())
                        .unwrap();
                    let Ok(mut stream) = respond.send_response(response, false) else {
                        continue;
                    };
                    let message = grpc_health::frame(&HealthCheckResponse {
                        status: status as i32,
                    });
                    let _ = stream.send_data(Bytes::from(message), false);
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                    let _ = stream.send_trailers(trailers);
                }
            });
        }
    });
    (port, received)
}

#[tokio::test]
async fn grpc_attempt_passes_only_on_serving() {
    let (port, mut agents) = grpc_server("app.Hello").await;
    let asking = |service: &str| Action::Grpc {
        port,
        service: service.into(),
    };
    assert_eq!(attempt(&asking("app.Hello"), LONG).await, Outcome::Pass);
    assert_eq!(agents.recv().await.unwrap(), PROBE_USER_AGENT);
    assert_eq!(
        attempt(&asking(""), LONG).await,
        Outcome::Fail("health NOT_SERVING".into())
    );
    // An HTTP/1.1-only server is no gRPC server.
    let (http_port, _) = http_server("200 OK").await;
    let outcome = attempt(
        &Action::Grpc {
            port: http_port,
            service: String::new(),
        },
        LONG,
    )
    .await;
    assert!(matches!(outcome, Outcome::Fail(_)), "{outcome:?}");
    // Nothing listening: refused.
    let closed = free_port().await;
    let outcome = attempt(
        &Action::Grpc {
            port: closed,
            service: String::new(),
        },
        LONG,
    )
    .await;
    assert!(matches!(outcome, Outcome::Refused(_)), "{outcome:?}");
}

// === the prober and the shared flag ===

/// Waits until `edges` says `ready`.
async fn edge(edges: &mut watch::Receiver<bool>, ready: bool) {
    tokio::time::timeout(LONG, edges.wait_for(|value| *value == ready))
        .await
        .unwrap_or_else(|_| panic!("no edge to {ready}"))
        .unwrap();
}

#[tokio::test]
async fn the_prober_follows_the_container_and_a_refusal_is_not_ready_at_once() {
    let port = free_port().await;
    let probes = decode(
        &format!(r#"{{"tcpSocket":{{"port":{port}}}}}"#),
        false,
        USER_PORT,
    )
    .unwrap();
    let (health, prober) = prober(probes);
    let mut edges = health.edges();
    let task = tokio::spawn(prober.run());
    assert!(!health.is_ready());
    assert!(!*edges.borrow_and_update());
    // Nothing listens yet: the prober keeps trying, still not ready.
    tokio::time::sleep(ms(200)).await;
    assert!(!health.is_ready());

    // The container starts listening: ready within a few aggressive attempts.
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let started = std::time::Instant::now();
    edge(&mut edges, true).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(health.is_ready());

    // The data path sees a refusal: not ready from that very call on, then ready again after
    // an attempt passes (the listener is still there).
    edges.borrow_and_update();
    health.refused();
    assert!(!health.is_ready());
    // The prober publishes the edge (it may be back to ready by the time this looks).
    tokio::time::timeout(LONG, edges.changed())
        .await
        .expect("an edge after the refusal")
        .unwrap();
    edge(&mut edges, true).await;
    assert!(health.is_ready());

    // The container goes away with no traffic: the prober's own attempt (once a second with
    // periodSeconds 0) is refused and readiness drops without waiting for failureThreshold.
    drop(listener);
    edge(&mut edges, false).await;
    assert!(!health.is_ready());
    task.abort();
}

#[tokio::test]
async fn no_probe_is_always_ready_and_a_refusal_changes_nothing() {
    let (health, prober) = prober(decode("", false, USER_PORT).unwrap());
    assert!(health.is_ready());
    assert!(*health.edges().borrow());
    prober.run().await;
    health.refused();
    assert!(health.is_ready());
}
