//! `kactivator queue-proxy`, started as Knative starts its queue-proxy: no arguments but the
//! test's own port overrides, configured by the reconciler's environment, in front of a real
//! user-container process (the test backend), probed as the kubelet and the activator probe.

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use kactivator_template::KNATIVE_1_18_DEFAULT;
use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::ports::free_port;
use support::queue_proxy::{knative_env, QueueProxy};
use support::{eventually, exchange};

/// The user container: the test backend on `127.0.0.1:port`, as Knative's pod has it.
fn user_container(port: u16) -> backend::BackendHandle {
    backend::spawn_on(
        SocketAddr::from(([127, 0, 0, 1], port)),
        BackendConfig::named("user-container"),
    )
    .expect("user container")
}

/// The queue-proxy with a one-second quiet period, so that drains end within a test.
fn start(env: HashMap<String, String>) -> QueueProxy {
    QueueProxy::start_with(env, &["--drain-grace-seconds", "1"])
}

#[test]
fn a_missing_or_bad_environment_exits_2_naming_every_key() {
    let mut env = knative_env(free_port(), free_port(), 1);
    env.remove("SERVING_REVISION");
    env.remove("USER_PORT");
    env.insert("CONTAINER_CONCURRENCY".into(), "ten".into());
    env.insert("TRACING_CONFIG_SAMPLE_RATE".into(), "ten percent".into());
    let output = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("queue-proxy")
        .env_clear()
        .envs(env)
        .output()
        .expect("run kactivator queue-proxy");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("missing SERVING_REVISION, USER_PORT")
            && stderr.contains("CONTAINER_CONCURRENCY: \"ten\" is not an integer")
            && stderr.contains("TRACING_CONFIG_SAMPLE_RATE: \"ten percent\" is not a number"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("queue-proxy environment").count(),
        1,
        "said once: {stderr}"
    );
}

/// One of Knative's two certificate files alone is not TLS upstream either: the pod serves
/// plain HTTP and listens on no TLS port (`queue_proxy_tls.rs` has the pair).
#[test]
fn one_certificate_file_alone_asks_for_no_tls() {
    let certs = support::scratch_dir();
    std::fs::write(certs.join("tls.crt"), "-----BEGIN CERTIFICATE-----\n").unwrap();
    let user_port = free_port();
    let serving_port = free_port();
    let env = knative_env(user_port, serving_port, 0);
    let tls_port: u16 = env["QUEUE_SERVING_TLS_PORT"].parse().unwrap();
    let _user = user_container(user_port);
    let proxy = QueueProxy::start_with(
        env,
        &[
            "--drain-grace-seconds",
            "1",
            "--certs-dir",
            certs.to_str().unwrap(),
        ],
    );
    assert_eq!(proxy.get("/").status, 200);
    assert!(TcpStream::connect(("127.0.0.1", tls_port)).is_err());
    std::fs::remove_dir_all(certs).unwrap();
}

#[test]
fn requests_reach_the_user_container_and_health_checks_follow_its_readiness() {
    let user_port = free_port();
    let proxy = start(knative_env(user_port, free_port(), 0));

    // No user container yet: the kubelet's and the activator's health checks fail with 503.
    for agent in ["kube-probe/1.30", "Knative-Activator-Probe"] {
        let answer = proxy.health_check(agent);
        assert_eq!(
            (answer.status, answer.body.as_slice()),
            (503, &b""[..]),
            "{agent}"
        );
    }
    let user = user_container(user_port);
    assert!(
        eventually(Duration::from_secs(5), || proxy
            .health_check("kube-probe/1.30")
            .status
            == 200),
        "the health check never passed once the user container listened"
    );
    let answer = proxy.health_check("Knative-Activator-Probe");
    assert_eq!((answer.status, answer.text()), (200, "queue".to_string()));

    // Every request goes to the user container, whatever its Host names.
    let answer = proxy.get("/");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.text(), "hello from user-container\n");
    assert_eq!(user.stats().requests, 1);

    // The ingress's network probe is answered here, with the hash echoed.
    let answer = exchange(
        proxy.serving,
        b"GET / HTTP/1.1\r\nHost: x\r\nK-Network-Probe: probe\r\nK-Network-Hash: h-42\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        (answer.status, answer.header("K-Network-Hash")),
        (200, Some("h-42"))
    );
    assert_eq!(user.stats().requests, 1, "probes never reach the app");
}

/// An app may set any header, `X-Knative-Revision-Name` included (one relaying another Knative
/// service's answer does). Its response is relayed as it came and changes nothing: the pod is
/// not taken for another revision's. Which revision this pod serves is said by the queue-proxy
/// itself, on its health-check answers, where an activator's prober reads it.
#[test]
fn an_app_that_names_another_revision_is_relayed_and_keeps_serving() {
    let user_port = free_port();
    let user = user_container(user_port);
    let proxy = start(knative_env(user_port, free_port(), 1));
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));
    let answer = proxy.health_check("Knative-Activator-Probe");
    assert_eq!(
        (
            answer.header("X-Knative-Revision-Namespace"),
            answer.header("X-Knative-Revision-Name")
        ),
        (Some("default"), Some(support::queue_proxy::REVISION))
    );
    for _ in 0..5 {
        let answer = proxy.get("/respond-header/X-Knative-Revision-Name/other-00001");
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(
            answer.header("X-Knative-Revision-Name"),
            Some("other-00001")
        );
        assert_eq!(answer.text(), "with a header of my own\n");
    }
    let answer = proxy.get("/");
    assert_eq!(
        (answer.status, answer.text()),
        (200, "hello from user-container\n".into())
    );
    assert_eq!(user.stats().requests, 6);
    assert_eq!(proxy.health_check("kube-probe/1.30").status, 200);
}

#[test]
fn the_breaker_holds_containerconcurrency_at_the_app_and_ten_times_that_waiting() {
    let user_port = free_port();
    let user = user_container(user_port);
    let proxy = start(knative_env(user_port, free_port(), 1));
    let serving = proxy.serving;
    let send = move |path: &'static str| {
        std::thread::spawn(move || {
            let mut stream = TcpStream::connect(serving).unwrap();
            stream
                .write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .unwrap();
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).unwrap();
            support::parse_response(&raw).expect("a response")
        })
    };
    // One request holds the one slot; ten wait behind it: the breaker's 11 × CC.
    let holder = send("/delay/1500");
    assert!(eventually(Duration::from_secs(5), || user
        .stats()
        .in_flight
        == 1));
    let waiting: Vec<_> = (0..10).map(|_| send("/delay/1")).collect();
    assert!(
        eventually(Duration::from_secs(5), || proxy
            .metric("kactivator_revision_queued", &[])
            >= 10.0),
        "ten requests never waited: {}",
        proxy.metric("kactivator_revision_queued", &[])
    );
    assert_eq!(user.stats().in_flight, 1, "containerConcurrency 1 held");
    let refused = proxy.get("/");
    assert_eq!(refused.status, 503);
    assert_eq!(refused.text(), "pending request queue full\n");
    assert_eq!(holder.join().unwrap().status, 200);
    for request in waiting {
        assert_eq!(request.join().unwrap().status, 200);
    }
    assert_eq!(user.stats().requests, 11);
}

#[test]
fn sigterm_fails_health_checks_serves_on_and_wait_for_drain_returns_when_drained() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let mut proxy = start(knative_env(user_port, free_port(), 0));
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));

    // The user container's preStop and the queue-proxy's SIGTERM come together.
    let drain_admin = proxy.drain_admin;
    let started = Instant::now();
    let pre_stop = std::thread::spawn(move || {
        let answer = exchange(
            drain_admin,
            b"GET /wait-for-drain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        (answer.status, started.elapsed())
    });
    send_signal(proxy.child.id(), "TERM");
    assert!(eventually(Duration::from_secs(2), || {
        let answer = proxy.health_check("kube-probe/1.30");
        answer.status == 503 && answer.text() == "shutting down\n"
    }));
    assert_eq!(proxy.get("/").status, 200, "still serving while draining");
    let (status, waited) = pre_stop.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        waited >= Duration::from_millis(900),
        "returned after {waited:?}, before the 1 s grace period ended"
    );
    let code = proxy
        .wait_for_exit(Duration::from_secs(10))
        .expect("did not exit after the drain");
    assert_eq!(code, Some(0));
}

/// The preStop hook starts the drain as upstream's does: health checks fail from that moment,
/// so activators stop choosing a pod that is going away. Without a SIGTERM within a second it
/// is a restart of the user container, not a pod deletion: health checks pass again.
#[test]
fn wait_for_drain_fails_health_checks_at_once_and_without_a_sigterm_undoes_it_after_a_second() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let proxy = start(knative_env(user_port, free_port(), 0));
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));
    let drain_admin = proxy.drain_admin;
    let started = Instant::now();
    let pre_stop = std::thread::spawn(move || {
        let answer = exchange(
            drain_admin,
            b"GET /wait-for-drain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        (answer.status, started.elapsed())
    });
    assert!(
        eventually(Duration::from_millis(800), || {
            let answer = proxy.health_check("Knative-Activator-Probe");
            answer.status == 503 && answer.text() == "shutting down\n"
        }),
        "health checks still pass while the preStop hook waits"
    );
    assert_eq!(proxy.get("/").status, 200, "requests are still served");
    let (status, waited) = pre_stop.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        (Duration::from_millis(900)..Duration::from_secs(5)).contains(&waited),
        "{waited:?}"
    );
    let answer = proxy.health_check("kube-probe/1.30");
    assert_eq!((answer.status, answer.text()), (200, "queue".to_string()));
}

/// Review finding: the queue-proxy closed 30 s after SIGTERM however much traffic still came,
/// and the activator's next requests got 502. Upstream's drainer serves until a quiet period
/// has passed with no new request: each arrival re-arms it. Here the period is 1 s and a client
/// sends a request every 200 ms for 3 s after the signal: every one is served, and the process
/// exits about a period after the last.
#[test]
fn the_drain_serves_until_a_quiet_period_passes_with_no_new_request() {
    let user_port = free_port();
    let user = user_container(user_port);
    let mut proxy = start(knative_env(user_port, free_port(), 0));
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));
    send_signal(proxy.child.id(), "TERM");
    let signalled = Instant::now();
    let mut statuses = Vec::new();
    while signalled.elapsed() < Duration::from_secs(3) {
        statuses.push(proxy.get("/").status);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(statuses.iter().all(|status| *status == 200), "{statuses:?}");
    assert!(statuses.len() >= 10, "{statuses:?}");
    assert!(proxy.still_running(), "closed while requests still came");
    let last = Instant::now();
    let code = proxy
        .wait_for_exit(Duration::from_secs(10))
        .expect("did not exit after the quiet period");
    assert_eq!(code, Some(0));
    let quiet = last.elapsed();
    assert!(
        (Duration::from_millis(700)..Duration::from_secs(4)).contains(&quiet),
        "exited {quiet:?} after the last request"
    );
    assert_eq!(user.stats().requests as usize, statuses.len());
}

fn send_signal(pid: u32, signal: &str) {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill");
}

#[test]
fn a_user_container_that_refuses_connections_fails_health_checks_at_once() {
    let user_port = free_port();
    let user = user_container(user_port);
    let mut env = knative_env(user_port, free_port(), 0);
    // Probed every 10 s once ready: a failure seen sooner comes from the request path.
    env.insert(
        "SERVING_READINESS_PROBE".into(),
        format!(r#"{{"tcpSocket":{{"port":{user_port}}},"periodSeconds":10,"timeoutSeconds":1,"failureThreshold":3}}"#),
    );
    let proxy = start(env);
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));
    user.shutdown();
    let started = Instant::now();
    let answer = proxy.get("/");
    assert_eq!(answer.status, 502, "{}", answer.text());
    let answer = proxy.health_check("kube-probe/1.30");
    assert_eq!(answer.status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}: the prober's period, not the refusal",
        started.elapsed()
    );
}

#[test]
fn a_request_past_the_revision_timeout_gets_upstreams_504() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let mut env = knative_env(user_port, free_port(), 0);
    env.insert("REVISION_TIMEOUT_SECONDS".into(), "1".into());
    let proxy = start(env);
    let started = Instant::now();
    let answer = proxy.get("/delay/5000");
    assert_eq!(
        (answer.status, answer.text()),
        (504, "request timeout".to_string())
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

/// The headers the user container received for `raw`, sent through `proxy`, in order.
fn headers_at_the_app(proxy: &QueueProxy, raw: &str) -> Vec<(String, String)> {
    let answer = exchange(proxy.serving, raw.as_bytes());
    assert_eq!(answer.status, 200, "{}", answer.text());
    let described: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    described["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap().to_string(),
                pair[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_app_sees_the_request_as_upstreams_queue_proxy_hands_it_over() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let proxy = start(knative_env(user_port, free_port(), 0));
    let field = |fields: &[(String, String)], name: &str| -> Option<String> {
        fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };

    // From the activator: it put the pod address in Host and the client's in K-Original-Host.
    let from_activator = headers_at_the_app(
        &proxy,
        "GET /headers HTTP/1.1\r\nHost: 127.0.0.1:8012\r\nK-Original-Host: hello.example.com\r\n\
         Knative-Serving-Namespace: default\r\nKnative-Serving-Revision: hello-00001\r\n\
         K-Proxy-Request: activator\r\nX-Forwarded-For: 203.0.113.7, 10.0.0.9\r\n\
         X-Forwarded-Proto: https\r\nConnection: close\r\n\r\n",
    );
    let expected: &[(&str, Option<&str>)] = &[
        ("host", Some("hello.example.com")),
        ("k-original-host", None),
        ("knative-serving-namespace", None),
        ("knative-serving-revision", None),
        ("k-proxy-request", Some("activator")),
        ("x-forwarded-for", Some("203.0.113.7, 10.0.0.9, 127.0.0.1")),
        ("x-forwarded-proto", Some("https")),
        (
            "forwarded",
            Some("for=203.0.113.7;proto=https, for=10.0.0.9"),
        ),
        ("connection", None),
    ];
    for (name, value) in expected {
        assert_eq!(
            field(&from_activator, name).as_deref(),
            *value,
            "{name} in {from_activator:?}"
        );
    }

    // Straight from an ingress: the client's Host, nothing of the activator's added.
    let direct = headers_at_the_app(
        &proxy,
        "GET /headers HTTP/1.1\r\nHost: hello.example.com\r\nConnection: close\r\n\r\n",
    );
    for (name, value) in [
        ("host", Some("hello.example.com")),
        ("k-proxy-request", None),
        ("k-original-host", None),
        ("forwarded", None),
        ("x-forwarded-for", Some("127.0.0.1")),
    ] {
        assert_eq!(
            field(&direct, name).as_deref(),
            value,
            "{name} in {direct:?}"
        );
    }
}

/// Stops the queue-proxy as Kubernetes does and waits for it to exit: every line is written by
/// then.
fn stop(proxy: &mut QueueProxy) {
    send_signal(proxy.child.id(), "TERM");
    proxy
        .wait_for_exit(Duration::from_secs(15))
        .expect("did not exit after SIGTERM");
}

/// The request log's lines, each parsed as the JSON Knative's template makes.
fn log_lines(proxy: &QueueProxy) -> Vec<serde_json::Value> {
    proxy
        .stdout()
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("not JSON ({error}): {line:?}"))
        })
        .collect()
}

#[test]
fn request_logs_follow_knatives_template_one_line_per_request_without_probes() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let mut env = knative_env(user_port, free_port(), 0);
    env.insert("SERVING_ENABLE_REQUEST_LOG".into(), "true".into());
    env.insert(
        "SERVING_REQUEST_LOG_TEMPLATE".into(),
        KNATIVE_1_18_DEFAULT.into(),
    );
    let mut proxy = start(env);
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));

    // One keep-alive connection, no retries: a GET with everything the template reads, a
    // chunked POST, an app error, then twenty more.
    let mut client = TcpStream::connect(proxy.serving).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let remote = client.local_addr().unwrap().to_string();
    let mut buffered = Vec::new();
    let mut send = |raw: &str| {
        client.write_all(raw.as_bytes()).unwrap();
        support::read_response(&mut client, &mut buffered).expect("a response")
    };
    let answer = send(
        "GET /bytes/1234?x=1&y=%22 HTTP/1.1\r\nHost: hello.default\r\nUser-Agent: test-client/1 \"quoted\"\r\nReferer: https://ref.example/a<b>\r\nx-b3-traceid: 80f198ee56343ba8\r\n\r\n",
    );
    assert_eq!((answer.status, answer.body.len()), (200, 1234));
    let answer = send(
        "POST /echo HTTP/1.1\r\nHost: hello.default\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    );
    assert_eq!(answer.text(), "hello world");
    assert_eq!(
        send("GET /status/418 HTTP/1.1\r\nHost: hello.default\r\n\r\n").status,
        418
    );
    for _ in 0..20 {
        assert_eq!(send("GET / HTTP/1.1\r\nHost: h\r\n\r\n").status, 200);
    }
    // The kubelet's and the activator's probes are not logged.
    assert_eq!(proxy.health_check("kube-probe/1.30").status, 200);
    assert_eq!(proxy.health_check("Knative-Activator-Probe").status, 200);
    let delayed = exchange(
        proxy.serving,
        b"GET /delay/250 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(delayed.status, 200);
    stop(&mut proxy);

    let lines = log_lines(&proxy);
    assert_eq!(lines.len(), 24, "one line per request, none for probes");
    let first = &lines[0];
    let request = &first["httpRequest"];
    assert_eq!(request["requestMethod"], "GET");
    assert_eq!(request["requestUrl"], "/bytes/1234?x=1&y=%22");
    assert_eq!(request["requestSize"], "0");
    assert_eq!(request["status"], 200);
    assert_eq!(request["responseSize"], "1234");
    assert_eq!(request["userAgent"], "test-client/1 \"quoted\"");
    assert_eq!(request["referer"], "https://ref.example/a<b>");
    assert_eq!(request["remoteIp"], remote.as_str());
    assert_eq!(request["serverIp"], "127.0.0.1");
    assert_eq!(request["protocol"], "HTTP/1.1");
    assert_eq!(
        first["traceId"], "[80f198ee56343ba8]",
        "Go prints a []string"
    );

    let post = &lines[1]["httpRequest"];
    assert_eq!(
        (
            &post["requestMethod"],
            &post["requestSize"],
            &post["responseSize"]
        ),
        (&"POST".into(), &"-1".into(), &"11".into()),
        "a chunked body's length is unknown; the response's is its payload"
    );
    assert_eq!(lines[1]["traceId"], "[]");
    assert_eq!(lines[2]["httpRequest"]["status"], 418);

    let latency = |line: &serde_json::Value| -> f64 {
        let text = line["httpRequest"]["latency"].as_str().unwrap();
        text.strip_suffix('s').unwrap().parse().unwrap()
    };
    assert!(latency(&lines[23]) >= 0.25, "{}", lines[23]);
    assert!(latency(&lines[3]) < 0.25, "{}", lines[3]);
}

/// An h2c user container (a gRPC server that also answers plain HTTP), probe logs on.
#[test]
fn probe_and_h2c_requests_are_logged_when_asked_and_an_unsupported_template_exits_2() {
    let user_port = free_port();
    let _user = kactivator_testkit::grpc::spawn_grpc_on(
        SocketAddr::from(([127, 0, 0, 1], user_port)),
        BackendConfig::named("user-container"),
    )
    .expect("user container");
    let mut env = knative_env(user_port, free_port(), 0);
    env.insert("SERVING_ENABLE_REQUEST_LOG".into(), "true".into());
    env.insert("SERVING_ENABLE_PROBE_REQUEST_LOG".into(), "true".into());
    env.insert(
        "SERVING_REQUEST_LOG_TEMPLATE".into(),
        "{{.Request.Method}} {{.Response.Code}} {{.Request.UserAgent}} {{.Revision.Name}} {{.Request.Proto}} {{.Response.Size}} {{.Request.ContentLength}}".into(),
    );
    let mut proxy = start(env.clone());
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));
    let h2c = Command::new("curl")
        .args(["-sS", "--http2-prior-knowledge", "-A", "h2-client"])
        .arg(format!("http://{}/", proxy.serving))
        .output()
        .expect("curl");
    assert_eq!(
        String::from_utf8_lossy(&h2c.stdout),
        "hello from user-container\n"
    );
    stop(&mut proxy);
    let out = proxy.stdout();
    let revision = support::queue_proxy::REVISION;
    assert!(
        out.lines()
            .any(|line| line == format!("GET 200 kube-probe/1.30 {revision} HTTP/1.1 5 0")),
        "the probe's line, its body `queue`: {out}"
    );
    assert!(
        out.lines()
            .any(|line| line == format!("GET 200 h2-client {revision} HTTP/2.0 26 0")),
        "the h2c request's line: {out}"
    );

    // Go would parse this and fail on every request; here it is refused before serving.
    env.insert(
        "SERVING_REQUEST_LOG_TEMPLATE".into(),
        "{{.Request.Method}} {{.Request.Body}}".into(),
    );
    let output = Command::new(env!("CARGO_BIN_EXE_kactivator"))
        .arg("queue-proxy")
        .env_clear()
        .envs(env)
        .output()
        .expect("run kactivator queue-proxy");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("SERVING_REQUEST_LOG_TEMPLATE") && stderr.contains("Body"),
        "{stderr}"
    );
}

/// Kilobytes of the binary's own code resident in `pid` (`/proc/PID/smaps`, its `r-xp`
/// mappings).
fn resident_code_kib(pid: u32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let exe = exe.to_string_lossy().into_owned();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut total = 0;
    let mut counting = false;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first().is_some_and(|range| range.contains('-')) && fields.len() >= 5 {
            counting = fields[1] == "r-xp" && fields.get(5).copied() == Some(exe.as_str());
        } else if counting && fields.first() == Some(&"Rss:") {
            total += fields[1].parse::<u64>().expect("Rss");
        }
    }
    total
}

#[test]
fn the_code_start_up_ran_leaves_memory_and_requests_are_served_on() {
    let user_port = free_port();
    let user = user_container(user_port);
    let proxy = start(knative_env(user_port, free_port(), 0));
    let pid = proxy.child.id();
    let at_start_up = resident_code_kib(pid);
    assert!(at_start_up > 0);
    // Unmapped a few seconds after start-up (`start::UNMAP_START_UP_CODE_AFTER`, 3 s).
    let mut now = at_start_up;
    assert!(
        eventually(Duration::from_secs(10), || {
            now = resident_code_kib(pid);
            now < at_start_up * 3 / 4
        }),
        "the binary's resident code went from {at_start_up} KiB only to {now} KiB"
    );
    // Serving maps back what it runs, and nothing else changes for a client.
    for _ in 0..20 {
        let answer = proxy.get("/");
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (200, "hello from user-container\n")
        );
        assert_eq!(proxy.health_check("kube-probe/1.30").status, 200);
    }
    assert_eq!(user.stats().requests, 20);
    let serving = resident_code_kib(pid);
    assert!(
        serving < at_start_up,
        "serving maps {serving} KiB of code, start-up {at_start_up} KiB"
    );
}

/// `KACTIVATOR_QUEUE_PROXY_UNMAP_START_UP_CODE=false` keeps start-up's code mapped: well past the
/// moment it would have gone, the binary's resident code is what it was.
#[test]
fn with_the_unmap_turned_off_the_code_start_up_ran_stays() {
    let user_port = free_port();
    let _user = user_container(user_port);
    let mut env = knative_env(user_port, free_port(), 0);
    env.insert(
        "KACTIVATOR_QUEUE_PROXY_UNMAP_START_UP_CODE".into(),
        "false".into(),
    );
    let proxy = start(env);
    let pid = proxy.child.id();
    let at_start_up = resident_code_kib(pid);
    assert!(at_start_up > 0);
    // Twice `start::UNMAP_START_UP_CODE_AFTER`.
    std::thread::sleep(Duration::from_secs(6));
    let now = resident_code_kib(pid);
    assert!(
        now >= at_start_up * 3 / 4,
        "the binary's resident code went from {at_start_up} KiB to {now} KiB"
    );
    assert_eq!(proxy.get("/").status, 200);
}

/// Review finding: the sidecar got the activator's budget, so a queue-proxy under a 64 MiB
/// limit exited 2 and crash-looped. Under 32 MiB, at containerConcurrency 10, it starts, says
/// the budget it fitted, and its breaker admits what upstream's does: 10 requests at the app and
/// 100 waiting, every one served.
#[test]
fn under_a_32_mib_limit_it_starts_and_admits_its_whole_breaker() {
    const LIMIT: u64 = 32 << 20;
    let user_port = free_port();
    let user = user_container(user_port);
    let proxy = QueueProxy::start_under_memory_limit(
        knative_env(user_port, free_port(), 10),
        &["--drain-grace-seconds", "1"],
        LIMIT,
    );
    let budget = support::memory_budget_line(&proxy.stderr());
    assert!(budget.contains("limit=32 MiB"), "{budget}");
    assert!(eventually(Duration::from_secs(5), || proxy
        .health_check("kube-probe/1.30")
        .status
        == 200));
    let serving = proxy.serving;
    let clients: Vec<_> = (0..110)
        .map(|_| {
            std::thread::spawn(move || {
                exchange(
                    serving,
                    b"GET /delay/300 HTTP/1.1\r\nHost: hello.default\r\nConnection: close\r\n\r\n",
                )
                .status
            })
        })
        .collect();
    let statuses: Vec<u16> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|status| *status == 200),
        "{:?}",
        statuses
            .iter()
            .filter(|status| **status != 200)
            .collect::<Vec<_>>()
    );
    let stats = user.stats();
    assert_eq!(stats.max_in_flight, 10, "{stats:?}");
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", proxy.child.id()))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap();
    assert!(rss_kib * 1024 < LIMIT, "resident {rss_kib} KiB");
}

/// A limit that cannot hold the breaker is refused at start, naming what asked for it, rather
/// than answering 503 to requests the breaker promised to hold.
#[test]
fn a_limit_too_small_for_its_breaker_is_refused_naming_containerconcurrency() {
    let output = support::under_memory_limit(32 << 20)
        .arg("queue-proxy")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(knative_env(free_port(), free_port(), 100))
        .output()
        .expect("run kactivator queue-proxy");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("CONTAINER_CONCURRENCY") && stderr.contains("32 MiB"),
        "{stderr}"
    );
}
