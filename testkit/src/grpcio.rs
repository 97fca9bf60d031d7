//! A gRPC pod that speaks only HTTP/2: Python's grpcio server (`python/echo_server.py`, the C
//! core, which closes any connection that does not open with the HTTP/2 preface) serving the
//! Echo service of `proto/echo.proto`, as users run gRPC servers standalone. Where [`crate::grpc`]'s
//! backend is a friendly queue-proxy stand-in (HTTP/1.1 and h2c, answers probes itself), this
//! one answers only gRPC over HTTP/2: a proxy or prober that talks HTTP/1.1 to it fails.
//!
//! [`GrpcioPod::spawn`] starts the process and waits until it listens; dropping the handle
//! ends it (its standard input closes, so it also ends if the test process dies). What the
//! pod served is read from its output, one line per call ([`GrpcioPod::calls`],
//! [`GrpcioPod::health_checks`]).
//!
//! Needs grpcio, grpcio-tools and grpcio-health-checking in the interpreter [`python`] picks:
//! `scripts/test.sh` installs them in a virtual environment, `target/venv`, that `cargo test`
//! then finds by itself.

use std::io::{self, BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The server script.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/echo_server.py");

/// How long the server may take to generate its stubs and listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the pod has the standard health service (`grpc.health.v1.Health`), and what it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// No health service: a health check gets the gRPC status UNIMPLEMENTED.
    Absent,
    /// The service answers SERVING for the server as a whole.
    Serving,
    /// The service answers NOT_SERVING for the server as a whole.
    NotServing,
}

impl Health {
    fn flag(self) -> Option<&'static str> {
        match self {
            Health::Absent => None,
            Health::Serving => Some("serving"),
            Health::NotServing => Some("not-serving"),
        }
    }
}

/// A running grpcio pod; dropping it stops the process.
#[derive(Debug)]
pub struct GrpcioPod {
    addr: SocketAddr,
    child: Child,
    /// Held open: the server ends when it closes.
    stdin: Option<ChildStdin>,
    /// Every line the server printed so far.
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

/// Where `scripts/test.sh` keeps the Python packages of the gRPC tests, relative to the workspace.
const VENV_PYTHON: &str = "target/venv/bin/python3";

/// The Python interpreter of the gRPC tests: `$KACTIVATOR_PYTHON` if set, else the virtual
/// environment `scripts/test.sh` creates (`target/venv`) when it exists, else `python3` from the
/// PATH (with the packages installed some other way).
pub fn python() -> std::path::PathBuf {
    if let Some(python) = std::env::var_os("KACTIVATOR_PYTHON") {
        return python.into();
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|workspace| workspace.join(VENV_PYTHON));
    match venv {
        Some(venv) if venv.exists() => venv,
        _ => "python3".into(),
    }
}

/// What to say when the interpreter lacks the packages.
pub const INSTALL_HINT: &str = "run `bash scripts/test.sh` once (it creates target/venv), or \
     `python3 -m venv target/venv && target/venv/bin/pip install grpcio grpcio-tools \
     grpcio-health-checking`, or point KACTIVATOR_PYTHON at an interpreter that has them";

impl GrpcioPod {
    /// Starts a pod named `name` (the `backend` of its replies) on `listen` (port 0: a free
    /// one) and waits until it accepts connections.
    pub fn spawn(listen: SocketAddr, name: &str, health: Health) -> io::Result<GrpcioPod> {
        let mut command = Command::new(python());
        command
            .arg(SCRIPT)
            .args(["--listen", &listen.to_string(), "--name", name]);
        if let Some(flag) = health.flag() {
            command.args(["--health", flag]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(String::new()));
        let (listening_sender, listening) = mpsc::channel();
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            let lines = lines.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = line.strip_prefix("listening ") {
                        let _ = listening_sender.send(addr.to_string());
                    }
                    lines.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            }));
        }
        if let Some(mut stderr) = child.stderr.take() {
            let errors = errors.clone();
            readers.push(std::thread::spawn(move || {
                let mut text = String::new();
                let _ = stderr.read_to_string(&mut text);
                errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&text);
            }));
        }
        let mut pod = GrpcioPod {
            addr: listen,
            child,
            stdin,
            lines,
            readers,
        };
        let started = listening.recv_timeout(START_TIMEOUT);
        match started.ok().and_then(|addr| addr.parse().ok()) {
            Some(addr) => {
                pod.addr = addr;
                Ok(pod)
            }
            None => {
                pod.stop();
                let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Err(io::Error::other(format!(
                    "the grpcio pod did not start on {listen} ({}: {INSTALL_HINT}?): {errors}",
                    python().display()
                )))
            }
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every line the server printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Echo calls it handled (each kind of call counts once, a stream included).
    pub fn calls(&self) -> usize {
        self.count(|line| line.starts_with("call "))
    }

    /// Health checks that reached it: answered by its health service, or, without one,
    /// answered UNIMPLEMENTED.
    pub fn health_checks(&self) -> usize {
        self.count(|line| {
            line.starts_with("health ") || line == "unimplemented /grpc.health.v1.Health/Check"
        })
    }

    fn count(&self, matches: impl Fn(&str) -> bool) -> usize {
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|line| matches(line))
            .count()
    }

    fn stop(&mut self) {
        // Closing its input ends the server; the kill is for one that hangs.
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for GrpcioPod {
    fn drop(&mut self) {
        self.stop();
    }
}
