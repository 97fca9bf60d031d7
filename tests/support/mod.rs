//! Shared harness for end-to-end tests: starts the real `kactivator` binary on loopback with a
//! generated config, waits until it is ready, and offers small blocking HTTP helpers.
//!
//! The I/O driver comes from `KACTIVATOR_DRIVER` in the environment, so `.ci/run` runs every
//! test once per driver.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kactivator_testkit::ports::free_port;
use kactivator_testkit::raw_http1;

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A running kactivator process, killed on drop.
pub struct Activator {
    child: Option<Child>,
    /// The cgroup memory limit the process is shown ([`under_memory_limit`]), if any.
    memory_limit: Option<u64>,
    pub http: SocketAddr,
    /// The second data port (upstream's h2c port; both serve HTTP/1.1 and h2c).
    pub http2: SocketAddr,
    pub admin: SocketAddr,
    pub dir: PathBuf,
    pub config_path: PathBuf,
    /// More `[listen]` keys and tables (`https`, `[listen.tls]`), written with the ports.
    pub listen: String,
}

/// Turns quarantine off: for tests of how the proxy reports a broken pod, where the pod is
/// meant to stay routable (a raw socket cannot answer the health probe, and passive signals
/// would take a failing pod out of routing).
pub const NO_QUARANTINE: &str = "[features]\n\"activator.pod-quarantine\" = \"disabled\"\n\n";

/// A `[[revisions]]` table for the config.
pub fn revision(namespace: &str, name: &str, pods: &[SocketAddr], extra: &str) -> String {
    let pods: Vec<String> = pods.iter().map(|pod| format!("\"{pod}\"")).collect();
    format!(
        "[[revisions]]\nnamespace = \"{namespace}\"\nname = \"{name}\"\npods = [{}]\n{extra}\n",
        pods.join(", ")
    )
}

pub fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kactivator-test-{}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

impl Activator {
    /// Starts kactivator with these `[[revisions]]` and default settings (2 shards).
    pub fn start(revisions: &str) -> Activator {
        Activator::start_with(revisions, "", &["--shards", "2"], &[])
    }

    /// Starts kactivator with revisions, extra `[proxy]` keys, flags and environment.
    pub fn start_with(
        revisions: &str,
        proxy: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Activator {
        let mut activator = Activator::configure(revisions, proxy);
        activator.spawn_with(args, env, false);
        if let Err(error) = activator.wait_ready() {
            panic!("kactivator {error}");
        }
        activator
    }

    /// Ports chosen and the config written, nothing started: for tests that need to know an
    /// activator's address before it runs (peers). Start it with [`Activator::launch`].
    pub fn prepare(revisions: &str, proxy: &str) -> Activator {
        Activator::configure(revisions, proxy)
    }

    /// [`Activator::prepare`] with the data port on `ip` rather than 127.0.0.1: for a test
    /// that lists the activator at a pod address in the API server (activator-service).
    pub fn prepare_on(ip: std::net::IpAddr, revisions: &str, proxy: &str) -> Activator {
        let mut activator = Activator::configure(revisions, proxy);
        activator.http = SocketAddr::new(ip, free_port());
        activator.http2 = SocketAddr::new(ip, free_port());
        activator.write_config(revisions, proxy);
        activator
    }

    /// A prepared activator that will see a cgroup memory limit of `limit` bytes, as a
    /// container's limit shows ([`under_memory_limit`]).
    pub fn with_memory_limit(mut self, limit: u64) -> Activator {
        self.memory_limit = Some(limit);
        self
    }

    /// Starts a prepared activator with 2 shards and waits until it is ready.
    pub fn launch(mut self) -> Activator {
        self.spawn_with(&["--shards", "2"], &[], false);
        if let Err(error) = self.wait_ready() {
            panic!("kactivator {error}");
        }
        self
    }

    /// Starts a prepared activator with 2 shards and does not wait for it: for start-up
    /// failures, read with [`Activator::wait_exit`] and [`Activator::stderr`].
    pub fn spawn(mut self) -> Activator {
        self.spawn_with(&["--shards", "2"], &[], false);
        self
    }

    /// Starts a prepared activator with these flags and environment and does not wait for
    /// readiness (see [`Activator::until_ready`]).
    pub fn spawn_args(mut self, args: &[&str], env: &[(&str, &str)]) -> Activator {
        self.spawn_with(args, env, false);
        self
    }

    /// Waits until `/readyz` answers 200, or panics with the process's log.
    pub fn until_ready(mut self) -> Activator {
        if let Err(error) = self.wait_ready() {
            panic!("kactivator {error}");
        }
        self
    }

    /// Like `start_with`, but the child runs under a seccomp filter that refuses io_uring.
    pub fn start_without_io_uring(
        revisions: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Activator, String> {
        let mut activator = Activator::configure(revisions, "");
        activator.spawn_with(args, env, true);
        activator.wait_ready()?;
        Ok(activator)
    }

    /// Free ports and a config file; nothing started yet.
    fn configure(revisions: &str, proxy: &str) -> Activator {
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let http2: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let dir = scratch_dir();
        let config_path = dir.join("kactivator.toml");
        let activator = Activator {
            child: None,
            memory_limit: None,
            http,
            http2,
            admin,
            dir,
            config_path,
            listen: String::new(),
        };
        activator.write_config(revisions, proxy);
        activator
    }

    /// [`Activator::prepare`] with more `[listen]` keys (`listen` is written inside `[listen]`,
    /// so it may end with `[listen.tls]`).
    pub fn prepare_listen(revisions: &str, proxy: &str, listen: &str) -> Activator {
        let mut activator = Activator::configure(revisions, proxy);
        activator.listen = listen.to_string();
        activator.write_config(revisions, proxy);
        activator
    }

    /// The config text for these revisions and `[proxy]` keys on this activator's ports.
    /// `revisions` may start with other tables (`[health]`, `[control]`, …).
    pub fn config_text(&self, revisions: &str, proxy: &str) -> String {
        format!(
            "[listen]\nhttp = \"{}\"\nhttp2 = \"{}\"\nadmin = \"{}\"\n{}\n\n[proxy]\ndrain_grace_seconds = 1\n{proxy}\n\n{revisions}",
            self.http, self.http2, self.admin, self.listen
        )
    }

    /// Rewrites the config file (a running kactivator picks it up at its next check).
    pub fn write_config(&self, revisions: &str, proxy: &str) {
        // Written beside and renamed over, so the watcher never reads half a file.
        let staging = self.dir.join("kactivator.toml.new");
        std::fs::write(&staging, self.config_text(revisions, proxy)).expect("write config");
        std::fs::rename(&staging, &self.config_path).expect("replace config");
    }

    fn spawn_with(&mut self, args: &[&str], env: &[(&str, &str)], refuse_io_uring: bool) {
        let stderr = std::fs::File::create(self.dir.join("stderr.log")).expect("stderr log");
        let mut command = match self.memory_limit {
            Some(limit) => under_memory_limit(limit),
            None => Command::new(env!("CARGO_BIN_EXE_kactivator")),
        };
        command
            .arg("--config")
            .arg(&self.config_path)
            .args(args)
            .env("KACTIVATOR_LOG", "info,kactivator_shards=debug");
        for (key, value) in env {
            command.env(key, value);
        }
        let stdout = std::fs::File::create(self.dir.join("stdout.log")).expect("stdout log");
        command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and only calls
            // async-signal-safe prctl(2) with data that lives on its stack.
            unsafe {
                command.pre_exec(move || {
                    // A test runner that is killed must not leave kactivators behind.
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if refuse_io_uring {
                        refuse_io_uring_setup()?;
                    }
                    Ok(())
                });
            }
        }
        self.child = Some(command.spawn().expect("spawn kactivator"));
    }

    /// Waits for `/readyz`; the error says why it never came (with the process's log).
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten())
            {
                return Err(format!("exited with {status}: {}", self.stderr()));
            }
            if admin_get(self.admin, "/readyz").is_some_and(|(status, _)| status == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("never became ready: {}", self.stderr()))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// What the process wrote to stdout (the request log, when on).
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default()
    }

    pub fn metrics(&self) -> String {
        admin_get(self.admin, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Sum of a metric's samples whose label set contains every `labels` fragment.
    pub fn metric_sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .lines()
            .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Resident memory of the process in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn send_signal(&self, signal: &str) {
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut()?.try_wait().ok().flatten() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.http).expect("connect to kactivator");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    }

    /// A connection that shard `shard` accepted. The kernel picks the shard of each new
    /// connection; this connects until one lands there, seen in the per-shard count of
    /// accepted connections (so nothing else may connect meanwhile), and closes the others.
    pub fn connect_on_shard(&self, shard: usize) -> TcpStream {
        let accepted = |on: usize| {
            self.metric_sum(
                "kactivator_shard_connections_accepted_total",
                &[&format!("shard=\"{on}\"")],
            )
        };
        for _ in 0..64 {
            let (here, total) = (
                accepted(shard),
                self.metric_sum("kactivator_shard_connections_accepted_total", &[]),
            );
            let stream = self.connect();
            assert!(
                eventually(Duration::from_secs(10), || {
                    self.metric_sum("kactivator_shard_connections_accepted_total", &[]) > total
                }),
                "the connection was never accepted"
            );
            if accepted(shard) > here {
                return stream;
            }
        }
        panic!("64 connections in a row went to other shards than {shard}");
    }
}

impl Drop for Activator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- kactivator stderr ---\n{}", self.stderr());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `GET path` on the admin port: (status, body), or None if it does not answer.
pub fn admin_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut connection =
        raw_http1::Connection::connect_with_timeout(addr, Duration::from_millis(500)).ok()?;
    connection.set_idle_timeout(Duration::from_secs(5)).ok()?;
    connection
        .send(format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let response = connection.read_response().ok()?;
    Some((response.status, response.text()))
}

/// One response as testkit's raw HTTP/1 client reads it.
pub use kactivator_testkit::raw_http1::Response;

/// Reads one response out of `raw`, the whole of what the peer sent (its end is the close).
pub fn parse_response(raw: &[u8]) -> Result<Response, raw_http1::Error> {
    raw_http1::parse_response(raw)
}

/// Reads one response (to a request that was not HEAD) off `stream`; `buffered` holds the
/// bytes already read off it and keeps those after the response. A failed read leaves every
/// byte it saw in `buffered`.
pub fn read_response(
    stream: &mut TcpStream,
    buffered: &mut Vec<u8>,
) -> Result<Response, raw_http1::Error> {
    read_response_for(stream, buffered, false)
}

/// [`read_response`], to a HEAD request when `head_request`.
pub fn read_response_for(
    stream: &mut TcpStream,
    buffered: &mut Vec<u8>,
    head_request: bool,
) -> Result<Response, raw_http1::Error> {
    let mut connection = raw_http1::Connection::resume(stream, std::mem::take(buffered))
        .expect("a read timeout on the test's own socket");
    let response = connection.read_response_to(if head_request { "HEAD" } else { "GET" });
    *buffered = connection.into_parts().1;
    response
}

/// Sends `raw` on a new connection and reads one response.
pub fn exchange(addr: SocketAddr, raw: &[u8]) -> Response {
    raw_http1::exchange(addr, raw)
        .unwrap_or_else(|error| panic!("no response from {addr}: {error}"))
}

/// A GET for revision `default/<name>` via the Knative headers.
pub fn get(name: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: example.com\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: {name}\r\n\r\n")
}

/// curl to `https://<name>:<port><path>`, `name` resolved to loopback, trusting only `ca`, with
/// `extra` flags; `(exit ok, stdout, stderr)`.
pub fn curl_https(
    port: u16,
    name: &str,
    path: &str,
    ca: &std::path::Path,
    extra: &[&str],
) -> (bool, String, String) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("{name}:{port}:127.0.0.1")])
        .args(extra)
        .arg(format!("https://{name}:{port}{path}"))
        .output()
        .expect("curl is installed");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Runs curl with the given arguments; returns (exit ok, stdout).
pub fn curl(args: &[&str]) -> (bool, Vec<u8>) {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "60"])
        .args(args)
        .output()
        .expect("curl is installed");
    if !output.status.success() {
        eprintln!(
            "curl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    (output.status.success(), output.stdout)
}

/// Waits up to `limit` for a process expected to exit (a refused start), kills it if it did
/// not, and gives back whether it exited by itself and what it wrote.
pub fn exit_within(
    mut child: std::process::Child,
    limit: Duration,
) -> (bool, std::process::Output) {
    let exited = eventually(limit, || child.try_wait().expect("wait").is_some());
    if !exited {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("its output");
    (exited, output)
}

/// Waits until `condition` holds or the limit passes.
pub fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    condition()
}

/// Reads a line-oriented stream until `needle` shows up.
pub fn read_until(reader: &mut BufReader<TcpStream>, needle: &str) -> String {
    let mut seen = String::new();
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap_or(0) > 0 {
        seen.push_str(&line);
        if seen.contains(needle) {
            break;
        }
        line.clear();
    }
    seen
}

/// Installs a seccomp filter making `io_uring_setup` fail with EPERM, as Docker's and
/// containerd's default profiles do. Runs in the child between fork and exec.
fn refuse_io_uring_setup() -> std::io::Result<()> {
    const IO_URING_SETUP: u32 = 425; // same number on x86_64 and aarch64
    let filter = [
        // Load the syscall number.
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: IO_URING_SETUP,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain prctl calls; `program` and `filter` outlive them.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Reads a response head a byte at a time, so nothing after it is consumed (upgraded streams),
/// and returns it as text.
pub fn read_head(stream: &mut TcpStream) -> String {
    let mut connection =
        raw_http1::Connection::new(stream).expect("a read timeout on the test's own socket");
    let head = connection
        .read_head_alone()
        .unwrap_or_else(|error| panic!("a complete response head: {error}"));
    String::from_utf8_lossy(&head.raw).into_owned()
}

/// Opens `GET /ws-half-close` with `Upgrade: echo` for revision `default/<name>` and returns the
/// upgraded stream and the 101 head.
pub fn open_upgrade(activator: &Activator, name: &str) -> (TcpStream, String) {
    let mut stream = activator.connect();
    let request = format!(
        "GET /ws-half-close HTTP/1.1\r\nHost: {name}.default.svc.cluster.local\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let head = read_head(&mut stream);
    (stream, head)
}

/// A hand-written pod on loopback: `serve` runs on its own thread for every accepted
/// connection. Returns its address and a count of connections accepted.
pub fn raw_pod(
    serve: impl Fn(TcpStream) + Send + Sync + 'static,
) -> (SocketAddr, std::sync::Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a raw pod");
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let serve = std::sync::Arc::new(serve);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            let serve = serve.clone();
            std::thread::spawn(move || serve(stream));
        }
    });
    (addr, accepted)
}
/// The `memory budget` line of a process's log: the caps start-up fitted to its memory limit.
pub fn memory_budget_line(stderr: &str) -> String {
    stderr
        .lines()
        .find(|line| line.contains("memory budget"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no budget line: {stderr}"))
}

/// A command that runs the binary (its arguments follow) seeing a cgroup memory limit of
/// `limit` bytes, as a container's limit shows: in a mount namespace of its own, a tmpfs over
/// `/sys/fs/cgroup` holds the files the binary reads at its cgroup's path (v2's `memory.max`,
/// v1's `memory.limit_in_bytes`). Nothing on the host changes; the shell execs the binary, so
/// the child's pid is the binary's.
pub fn under_memory_limit(limit: u64) -> Command {
    const SHOW_LIMIT: &str = r#"limit=$1; shift
mount -t tmpfs cgroup-for-test /sys/fs/cgroup || exit 97
while IFS=: read -r _ controllers path; do
  case "$controllers" in
    "") mkdir -p "/sys/fs/cgroup$path" && echo "$limit" > "/sys/fs/cgroup$path/memory.max" ;;
    *memory*) mkdir -p "/sys/fs/cgroup/memory$path" &&
      echo "$limit" > "/sys/fs/cgroup/memory$path/memory.limit_in_bytes" ;;
  esac
done < /proc/self/cgroup
exec "$@""#;
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            SHOW_LIMIT,
            "sh",
        ])
        .arg(limit.to_string())
        .arg(env!("CARGO_BIN_EXE_kactivator"));
    command
}

pub mod go;
pub mod ipv6;
pub mod queue_proxy;
