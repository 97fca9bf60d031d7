//! `kactivator queue-proxy`'s metrics, scraped as Knative scrapes them: the autoscaler's
//! protobuf `Stat` on the autometric port (`:9090/metrics`, decoded with the project's own
//! generated code) and upstream's request metrics on the user-metrics port (`:9091`). The
//! queue-proxy is started as Knative starts it (the reconciler's environment, a real
//! user-container process), with only the ports moved for the test.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kactivator_api::autoscaler::{decode_stat, Stat};
use kactivator_testkit::backend::{self, BackendConfig, BackendHandle};
use kactivator_testkit::ports::free_port;
use support::queue_proxy::{knative_env, QueueProxy, POD};
use support::{admin_get, eventually};

/// A scrape as the autoscaler's (`http_scrape_client.go`): `GET /metrics` with `accept`, the
/// status, the Content-Type and the body.
fn scrape(addr: SocketAddr, path: &str, accept: Option<&str>) -> (u16, String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).expect("connect to the autometric port");
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let accept = accept.map_or(String::new(), |accept| format!("Accept: {accept}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let response = support::parse_response(&raw).expect("an HTTP response");
    let content_type = response.header("Content-Type").unwrap_or("").to_string();
    (response.status, content_type, response.body)
}

/// A user container on a free port and, in front of it, a queue-proxy started as Knative starts
/// it with `container_concurrency`.
fn user_container_and_proxy(container_concurrency: u32) -> (BackendHandle, QueueProxy) {
    let user_port = free_port();
    let user = backend::spawn_on(
        SocketAddr::from(([127, 0, 0, 1], user_port)),
        BackendConfig::named("user-container"),
    )
    .expect("user container");
    let proxy = QueueProxy::start(knative_env(user_port, free_port(), container_concurrency));
    (user, proxy)
}

fn stat_of(addr: SocketAddr) -> Stat {
    let (status, content_type, body) = scrape(addr, "/metrics", Some("application/protobuf"));
    assert_eq!(status, 200);
    assert_eq!(
        content_type, "application/protobuf",
        "exactly, as the scraper checks"
    );
    decode_stat(&body).expect("a protobuf Stat")
}

/// Sends `GET path` (with `K-Proxy-Request: activator` when `proxied`) and reads the answer.
fn request(serving: SocketAddr, path: &str, proxied: bool) -> u16 {
    let mark = if proxied {
        "K-Proxy-Request: activator\r\n"
    } else {
        ""
    };
    request_with(serving, path, mark)
}

/// Sends `GET path` with `fields` (each line ending in CRLF) and reads the answer's status.
fn request_with(serving: SocketAddr, path: &str, fields: &str) -> u16 {
    let mut stream = TcpStream::connect(serving).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: hello.default.svc\r\n{fields}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    support::parse_response(&raw).expect("a response").status
}

#[test]
fn the_autoscaler_scrapes_each_windows_load_with_the_proxied_part_apart() {
    const PLAIN: usize = 6;
    const PROXIED: usize = 4;
    /// Longer than two windows: some window has every request in flight from start to end.
    const HOLD_MS: u64 = 2_500;
    let (_user, proxy) = user_container_and_proxy(10);

    // Upstream's handler serves the protobuf whatever the Accept says, on /metrics only.
    for accept in [None, Some("text/plain"), Some("application/protobuf")] {
        let (status, content_type, body) = scrape(proxy.autoscaler_metrics, "/metrics", accept);
        assert_eq!(
            (status, content_type.as_str()),
            (200, "application/protobuf")
        );
        assert_eq!(decode_stat(&body).unwrap().pod_name, POD);
    }
    assert_eq!(scrape(proxy.autoscaler_metrics, "/", None).0, 404);

    // Every window the reporter closes, in order, as a scraper polling often sees them.
    let windows: Arc<Mutex<Vec<Stat>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (windows, done, addr) = (windows.clone(), done.clone(), proxy.autoscaler_metrics);
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let stat = stat_of(addr);
                let mut windows = windows.lock().unwrap();
                if windows
                    .last()
                    .is_none_or(|last| last.process_uptime != stat.process_uptime)
                {
                    windows.push(stat);
                }
                drop(windows);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    assert!(eventually(Duration::from_secs(5), || !windows
        .lock()
        .unwrap()
        .is_empty()));

    let serving = proxy.serving;
    let path = format!("/delay/{HOLD_MS}");
    let clients: Vec<_> = (0..PLAIN + PROXIED)
        .map(|index| {
            let path = path.clone();
            std::thread::spawn(move || request(serving, &path, index >= PLAIN))
        })
        .collect();
    // While they are all at the app: upstream's queue depth (breaker in flight) on :9091.
    assert!(
        eventually(Duration::from_secs(5), || proxy
            .metric("revision_queue_depth", &[])
            == (PLAIN + PROXIED) as f64),
        "revision_queue_depth never showed the {} requests",
        PLAIN + PROXIED
    );
    assert_eq!(
        proxy.metric("kn_serving_queue_depth", &[]),
        (PLAIN + PROXIED) as f64
    );
    for client in clients {
        assert_eq!(client.join().unwrap(), 200);
    }
    // A window after the last request ended, with nothing in it.
    let quiet = |stat: &Stat| stat.request_count == 0.0 && stat.average_concurrent_requests == 0.0;
    assert!(eventually(Duration::from_secs(5), || {
        let windows = windows.lock().unwrap();
        let busy = windows.iter().rposition(|stat| !quiet(stat));
        busy.is_some_and(|busy| busy + 1 < windows.len())
    }));
    done.store(true, Ordering::Release);
    poller.join().unwrap();
    let windows = windows.lock().unwrap().clone();

    for pair in windows.windows(2) {
        let length = pair[1].process_uptime - pair[0].process_uptime;
        assert!(
            (0.5..1.5).contains(&length),
            "a window of {length} s: the poller missed one ({windows:?})"
        );
    }
    assert!(windows
        .iter()
        .all(|stat| stat.pod_name == POD && stat.timestamp == 0));
    // Counts are per second over a one-second period: the windows' sum is every request.
    let total = |field: fn(&Stat) -> f64| windows.iter().map(field).sum::<f64>();
    assert_eq!(total(|stat| stat.request_count), (PLAIN + PROXIED) as f64);
    assert_eq!(total(|stat| stat.proxied_request_count), PROXIED as f64);
    // Some window had every request in flight throughout: its averages are exact.
    let peak = windows
        .iter()
        .map(|stat| {
            (
                stat.average_concurrent_requests,
                stat.average_proxied_concurrent_requests,
            )
        })
        .fold((0.0, 0.0), |most: (f64, f64), next| {
            (most.0.max(next.0), most.1.max(next.1))
        });
    assert_eq!(
        peak,
        ((PLAIN + PROXIED) as f64, PROXIED as f64),
        "{windows:?}"
    );
    // Over all the windows, the time-weighted concurrency adds up to the requests' time at
    // the queue-proxy: at least the app's hold each, and not much more.
    let request_seconds = |average: fn(&Stat) -> f64| {
        windows
            .windows(2)
            .map(|pair| average(&pair[1]) * (pair[1].process_uptime - pair[0].process_uptime))
            .sum::<f64>()
    };
    let hold = HOLD_MS as f64 / 1000.0;
    let all = request_seconds(|stat| stat.average_concurrent_requests);
    let proxied = request_seconds(|stat| stat.average_proxied_concurrent_requests);
    let expected = (PLAIN + PROXIED) as f64 * hold;
    assert!(
        (expected * 0.99..expected * 1.2).contains(&all),
        "{all} request-seconds, expected about {expected}"
    );
    let expected = PROXIED as f64 * hold;
    assert!(
        (expected * 0.99..expected * 1.2).contains(&proxied),
        "{proxied} proxied request-seconds, expected about {expected}"
    );
}

#[test]
fn the_user_metrics_port_serves_upstreams_queue_proxy_names() {
    let (_user, proxy) = user_container_and_proxy(0);
    for proxied in [false, true, false] {
        assert_eq!(request(proxy.serving, "/delay/30", proxied), 200);
    }
    assert_eq!(request(proxy.serving, "/status/404", false), 404);
    proxy.counted("revision_request_count", &[], 4.0);

    let base = [
        "configuration_name=\"hello\"",
        "container_name=\"queue-proxy\"",
        "namespace_name=\"default\"",
        &format!("pod_name=\"{POD}\""),
        "revision_name=\"hello-00001\"",
        "service_name=\"hello\"",
    ];
    let with = |extra: &[&'static str]| -> Vec<String> {
        base.iter()
            .map(|label| label.to_string())
            .chain(extra.iter().map(|label| label.to_string()))
            .collect()
    };
    let count = |name: &str, labels: &[String]| {
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        proxy.metric(name, &labels)
    };
    let ok = with(&["response_code=\"200\"", "response_code_class=\"2xx\""]);
    let not_found = with(&["response_code=\"404\"", "response_code_class=\"4xx\""]);
    assert_eq!(count("revision_request_count", &ok), 3.0);
    assert_eq!(count("revision_request_count", &not_found), 1.0);
    assert_eq!(count("revision_request_latencies_count", &ok), 3.0);
    let mut below = ok.clone();
    below.push("le=\"20\"".into());
    let mut above = ok.clone();
    above.push("le=\"40\"".into());
    assert_eq!(
        count("revision_request_latencies_bucket", &below),
        0.0,
        "each took at least the app's 30 ms"
    );
    assert!(count("revision_request_latencies_bucket", &above) <= 3.0);
    assert_eq!(
        proxy.metric(
            "http_server_request_duration_seconds_count",
            &[
                "kn_revision_name=\"hello-00001\"",
                "http_response_status_code=\"200\""
            ]
        ),
        3.0
    );
    let text = admin_get(proxy.metrics, "/metrics").unwrap().1;
    assert!(
        !text.contains("activator_request_count") && !text.contains("kn_revision_request"),
        "a queue-proxy does not export the activator's names"
    );
    assert!(
        !text.contains("revision_queue_depth"),
        "containerConcurrency 0: no breaker, no depth, as upstream"
    );
    assert!(
        text.contains("kactivator_shard_requests_total"),
        "kactivator's own metrics stay"
    );
}

#[test]
fn requests_are_counted_by_the_route_tag_the_ingress_set_as_upstream_counts_them() {
    let (_user, proxy) = user_container_and_proxy(0);
    // Upstream's four cases (`GetRouteTagNameFromRequest`): no tag headers (tag-header routing
    // off), the default route, a tag that names no target (routed by the default route), and
    // a tag by name; an empty value counts as none, as Go's `Header.Get` reads it.
    let sent = [
        ("", 1),
        ("Knative-Serving-Tag: \r\n", 1),
        ("Knative-Serving-Default-Route: true\r\n", 1),
        (
            "Knative-Serving-Tag: gone\r\nKnative-Serving-Default-Route: true\r\n",
            1,
        ),
        ("Knative-Serving-Tag: blue\r\n", 2),
        (
            "knative-serving-tag: green\r\nKnative-Serving-Default-Route: false\r\n",
            1,
        ),
    ];
    for (fields, times) in sent {
        for _ in 0..times {
            assert_eq!(request_with(proxy.serving, "/", fields), 200);
        }
    }
    proxy.counted("revision_request_count", &[], 7.0);
    let count = |tag: &str| {
        proxy.metric(
            "revision_request_count",
            &[&format!("route_tag=\"{tag}\""), "response_code=\"200\""],
        )
    };
    let tags = ["DISABLED", "DEFAULT", "UNDEFINED", "blue", "green"];
    let counts: Vec<f64> = tags.iter().map(|tag| count(tag)).collect();
    let text = admin_get(proxy.metrics, "/metrics").unwrap().1;
    assert_eq!(counts, [2.0, 1.0, 1.0, 2.0, 1.0], "{text}");
    assert_eq!(
        proxy.metric("revision_request_latencies_count", &["route_tag=\"blue\""]),
        2.0
    );
    // 1.19+ names: the tag is an attribute of the server duration.
    let otel = |tag: &str| {
        proxy.metric(
            "http_server_request_duration_seconds_count",
            &[&format!("kn_route_tag=\"{tag}\"")],
        )
    };
    let otel_tags = ["kn:disabled", "kn:default", "kn:undefined", "blue", "green"];
    let counts: Vec<f64> = otel_tags.iter().map(|tag| otel(tag)).collect();
    assert_eq!(counts, [2.0, 1.0, 1.0, 2.0, 1.0], "{text}");
    // As upstream: the app-side series carry no tag.
    assert!(
        text.lines()
            .filter(|line| line.starts_with("revision_app_request")
                || line.starts_with("kn_serving_invocation"))
            .all(|line| !line.contains("route_tag")),
        "{text}"
    );
}

#[test]
fn the_app_metrics_count_the_time_at_the_user_container_not_in_the_breaker() {
    // containerConcurrency 1: the second request waits in the breaker while the first is at
    // the app.
    let (_user, proxy) = user_container_and_proxy(1);
    let serving = proxy.serving;
    let first = std::thread::spawn(move || request(serving, "/delay/300", false));
    assert!(
        eventually(Duration::from_secs(10), || {
            proxy.metric("revision_queue_depth", &[]) == 1.0
        }),
        "the first request is at the app"
    );
    assert_eq!(request(proxy.serving, "/delay/30", false), 200);
    assert_eq!(first.join().unwrap(), 200);
    assert_eq!(request(proxy.serving, "/status/404", false), 404);
    proxy.counted("revision_request_count", &[], 3.0);

    let labels = |code: &str, le: Option<&str>| -> Vec<String> {
        let mut labels = vec![
            "container_name=\"queue-proxy\"".to_string(),
            format!("response_code=\"{code}\""),
        ];
        labels.extend(le.map(|le| format!("le=\"{le}\"")));
        labels
    };
    let metric = |name: &str, labels: Vec<String>| {
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        proxy.metric(name, &labels)
    };
    // Both 200s reached the app, and so did the 404, which the app answered.
    assert_eq!(
        metric("revision_app_request_count", labels("200", None)),
        2.0
    );
    assert_eq!(
        metric("revision_app_request_count", labels("404", None)),
        1.0
    );
    // The second request's 30 ms at the app is under 40 ms there; its time in the queue-proxy
    // includes its wait behind the first one, so none of the requests is under 40 ms overall.
    assert_eq!(
        metric(
            "revision_app_request_latencies_bucket",
            labels("200", Some("40"))
        ),
        1.0,
        "{}",
        admin_get(proxy.metrics, "/metrics").unwrap().1
    );
    assert_eq!(
        metric(
            "revision_request_latencies_bucket",
            labels("200", Some("40"))
        ),
        0.0
    );
    assert_eq!(
        proxy.metric(
            "kn_serving_invocation_duration_seconds_count",
            &[
                "kn_revision_name=\"hello-00001\"",
                "http_response_status_code=\"200\""
            ]
        ),
        2.0
    );
}

#[test]
fn knative_1_18_without_a_request_metrics_backend_serves_none_of_upstreams_names() {
    for backend in [None, Some(""), Some("opencensus")] {
        let user_port = free_port();
        let _user = backend::spawn_on(
            SocketAddr::from(([127, 0, 0, 1], user_port)),
            BackendConfig::named("user-container"),
        )
        .expect("user container");
        let mut env = knative_env(user_port, free_port(), 0);
        match backend {
            Some(backend) => env.insert("SERVING_REQUEST_METRICS_BACKEND".into(), backend.into()),
            None => env.remove("SERVING_REQUEST_METRICS_BACKEND"),
        };
        let proxy = QueueProxy::start(env);
        assert_eq!(request(proxy.serving, "/", false), 200);
        // kactivator's own count shows the request; upstream's names are not served.
        proxy.counted("kactivator_shard_requests_total", &[], 1.0);
        let text = admin_get(proxy.metrics, "/metrics").unwrap().1;
        for name in [
            "revision_request_count",
            "http_server_request_duration_seconds",
        ] {
            assert!(!text.contains(name), "{backend:?}: {name} in {text}");
        }
    }
}
