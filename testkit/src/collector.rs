//! A trace and metrics collector for the tests, built from the official definitions: the Python
//! receiver `otel_receiver.py` (grpcio with the `opentelemetry-proto` package's TraceService and
//! MetricsService, an OTLP/HTTP server decoding with the same package (`…/v1/metrics` as
//! metrics, any other path as spans), and a Zipkin v2 server that checks every span against
//! Zipkin's model), started as a child process and read line by line.
//!
//! Python: [`crate::grpcio::python`] (`$KACTIVATOR_PYTHON`, else `target/venv`); it needs
//! grpcio and opentelemetry-proto (scripts/test.sh installs both).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The receiver script.
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/collector/otel_receiver.py");
/// The longest any awaited event may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A running receiver, killed on drop.
pub struct Collector {
    child: Child,
    stdin: ChildStdin,
    events: mpsc::Receiver<Value>,
    /// The OTLP/gRPC port on 127.0.0.1.
    pub grpc: u16,
    /// The HTTP port on 127.0.0.1: OTLP/HTTP and Zipkin.
    pub http: u16,
}

impl Collector {
    /// Starts the receiver and waits until it listens; panics, naming the interpreter, when
    /// it cannot.
    pub fn start() -> Collector {
        let python = crate::grpcio::python();
        let mut child = Command::new(&python)
            .arg(SCRIPT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", python.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take().expect("piped stdin");
        let (events_tx, events) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let event: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|error| panic!("the receiver wrote {line:?}: {error}"));
                if events_tx.send(event).is_err() {
                    break;
                }
            }
        });
        let Ok(listening) = events.recv_timeout(WAIT) else {
            let _ = child.kill();
            panic!(
                "the receiver did not start: {} needs grpcio and opentelemetry-proto \
                 (bash scripts/test.sh installs them in target/venv; or set KACTIVATOR_PYTHON)",
                python.display()
            );
        };
        assert_eq!(listening["event"], "listening", "{listening}");
        let port = |key: &str| {
            listening[key]
                .as_u64()
                .and_then(|port| u16::try_from(port).ok())
                .unwrap_or_else(|| panic!("no {key} port in {listening}"))
        };
        Collector {
            grpc: port("grpc"),
            http: port("http"),
            child,
            stdin,
            events,
        }
    }

    /// Sends a command and waits for its acknowledgement.
    pub fn command(&mut self, command: Value) {
        writeln!(self.stdin, "{command}").expect("write to the receiver");
        self.stdin.flush().expect("flush to the receiver");
        self.wait_for("the receiver's ack", |event| event["event"] == "ack");
    }

    /// `transport` is `grpc` or `http`; `mode` is `ok`, `fail` (gRPC UNAVAILABLE, HTTP 500) or
    /// `hang` (never answers).
    pub fn mode(&mut self, transport: &str, mode: &str) {
        self.command(json!({"command": "mode", "transport": transport, "mode": mode}));
    }

    /// Stops listening on `transport` and closes its connections.
    pub fn stop(&mut self, transport: &str) {
        self.command(json!({"command": "stop", "transport": transport}));
    }

    /// Listens on `transport` again, on the same port.
    pub fn start_again(&mut self, transport: &str) {
        self.command(json!({"command": "start", "transport": transport}));
    }

    /// The next event that `matches`, skipping others; a request the receiver found invalid
    /// fails the test at once.
    pub fn wait_for(&mut self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        self.within(WAIT, matches)
            .unwrap_or_else(|| panic!("waited {WAIT:?} for {what}"))
    }

    /// The next event that `matches` within `limit`, or `None`.
    pub fn within(&mut self, limit: Duration, matches: impl Fn(&Value) -> bool) -> Option<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(event) if event["event"] == "invalid" => {
                    panic!("the receiver refused a request: {event}")
                }
                Ok(event) if matches(&event) => return Some(event),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// The next `count` spans received.
    pub fn spans(&mut self, count: usize) -> Vec<Value> {
        (0..count)
            .map(|_| self.wait_for("a span", |event| event["event"] == "span"))
            .collect()
    }

    /// The next metric named `name` received (an `{"event": "metric"}` line: its resource,
    /// scope, type, temporality and points).
    pub fn metric(&mut self, name: &str) -> Value {
        self.wait_for(&format!("metric {name}"), |event| {
            event["event"] == "metric" && event["name"] == name
        })
    }

    /// Spans received until `done` says the list is complete (or [`WAIT`] runs out: a panic).
    pub fn spans_until(&mut self, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut spans = Vec::new();
        while !done(&spans) {
            spans.push(self.wait_for("a span", |event| event["event"] == "span"));
        }
        spans
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
