//! The kactivator process under test: a config file written here, the binary started with one
//! driver, its admin port scraped for metrics and `/proc/<pid>/status` read for its memory.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kactivator_testkit::ports::free_port;
use kactivator_testkit::raw_http1;

use crate::client::io_error;

/// How long a fresh kactivator gets to answer `/readyz`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between two `/readyz` checks while starting.
const READY_POLL: Duration = Duration::from_millis(20);
/// How long a stopped kactivator gets to exit before it is killed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// What to start.
#[derive(Clone, Debug)]
pub struct Launch<'a> {
    pub binary: &'a Path,
    /// `io-uring` or `epoll`.
    pub driver: &'a str,
    /// `--shards`; `None` leaves kactivator's default (the CPUs it may use).
    pub shards: Option<usize>,
    /// IP the data port listens on (the admin port is always on 127.0.0.1).
    pub http_ip: &'a str,
    /// `[proxy]` keys besides `drain_grace_seconds = 0`.
    pub proxy: &'a str,
    /// `[features]` lines, e.g. `"activator.pod-quarantine" = "disabled"`.
    pub features: &'a str,
    /// Other tables, e.g. `[autoscaler]`.
    pub tables: &'a str,
    /// The `[[revisions]]` tables.
    pub revisions: &'a str,
    /// Directory for the config file and the log.
    pub dir: &'a Path,
    /// Flags besides `--config`, `--driver` and `--shards`, e.g. `--source kubernetes`.
    pub args: &'a [&'a str],
    /// Environment besides `KACTIVATOR_LOG=warn` (which an entry here may override).
    pub env: &'a [(&'a str, &'a str)],
}

/// A running kactivator, killed on drop.
pub struct Activator {
    child: Option<Child>,
    pub http: SocketAddr,
    pub admin: SocketAddr,
    log: PathBuf,
}

/// A `[[revisions]]` table in the `default` namespace.
pub fn revision(name: &str, pods: &[SocketAddr], extra: &str) -> String {
    let pods: Vec<String> = pods.iter().map(|pod| format!("\"{pod}\"")).collect();
    format!(
        "[[revisions]]\nnamespace = \"default\"\nname = \"{name}\"\npods = [{}]\n{extra}\n",
        pods.join(", ")
    )
}

impl Activator {
    /// Writes the config, starts the binary and waits for `/readyz`.
    pub fn start(launch: &Launch<'_>) -> Result<Activator, String> {
        let mut activator = Activator::spawn(launch)?;
        activator.wait_ready(READY_TIMEOUT)?;
        Ok(activator)
    }

    /// Writes the config and starts the binary; [`Activator::wait_ready`] waits for it.
    pub fn spawn(launch: &Launch<'_>) -> Result<Activator, String> {
        let http: SocketAddr = format!("{}:{}", launch.http_ip, free_port())
            .parse()
            .map_err(|e| format!("data address {}: {e}", launch.http_ip))?;
        let admin: SocketAddr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let tag = format!("kactivator-{}", launch.driver);
        let config_path = launch.dir.join(format!("{tag}.toml"));
        let log = launch.dir.join(format!("{tag}.log"));
        let features = if launch.features.is_empty() {
            String::new()
        } else {
            format!("[features]\n{}\n\n", launch.features)
        };
        let config = format!(
            "[listen]\nhttp = \"{http}\"\nhttp2 = \"127.0.0.1:0\"\nadmin = \"{admin}\"\n\n[proxy]\ndrain_grace_seconds = 0\n{}\n\n{features}{}\n\n{}",
            launch.proxy, launch.tables, launch.revisions
        );
        std::fs::write(&config_path, config)
            .map_err(|e| format!("writing {}: {e}", config_path.display()))?;
        let stderr =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;

        let mut command = Command::new(launch.binary);
        // The ports as flags too: a role that takes its settings from the environment
        // (`keda-http`) reads no file, and for the others they are the file's own.
        command
            .arg("--config")
            .arg(&config_path)
            .arg("--http")
            .arg(http.to_string())
            .arg("--admin")
            .arg(admin.to_string())
            .arg("--driver")
            .arg(launch.driver)
            .env("KACTIVATOR_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .args(launch.args)
            .envs(launch.env.iter().copied());
        if let Some(shards) = launch.shards {
            command.arg("--shards").arg(shards.to_string());
        }
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: the closure runs in the forked child before exec and only makes
            // async-signal-safe system calls (prctl, getrlimit, setrlimit) on stack data.
            unsafe {
                command.pre_exec(|| {
                    // A harness that dies must not leave a kactivator behind.
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // As many descriptors as the hard limit allows: one per client connection.
                    raise_nofile_soft_limit().map(|_| ())
                });
            }
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", launch.binary.display()))?;
        Ok(Activator {
            child: Some(child),
            http,
            admin,
            log,
        })
    }

    /// Waits until `/readyz` answers 200, checking every 20 ms.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!(
                    "kactivator exited during start-up ({status}); its log:\n{}",
                    self.log_tail()
                ));
            }
            if admin_request(self.admin, "GET", "/readyz").is_ok_and(|(status, _)| status == 200) {
                return Ok(());
            }
            std::thread::sleep(READY_POLL);
        }
        Err(format!(
            "kactivator did not answer /readyz within {timeout:?}; its log:\n{}",
            self.log_tail()
        ))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The last lines of the process's stderr.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The whole `/metrics` text.
    pub fn metrics(&self) -> Result<String, String> {
        let (status, body) = admin_request(self.admin, "GET", "/metrics")
            .map_err(|e| format!("scraping {}/metrics: {e}", self.admin))?;
        if status != 200 {
            return Err(format!("{}/metrics answered {status}", self.admin));
        }
        Ok(body)
    }

    /// The whole `/metrics` text, waiting up to `read_timeout` for the answer (a process busy
    /// with a backlog of watch events may take longer than [`Activator::metrics`]' 10 s).
    pub fn metrics_within(&self, read_timeout: Duration) -> Result<String, String> {
        let (status, body) = request(
            self.admin,
            "GET",
            "/metrics",
            "",
            "",
            (Duration::from_secs(1), read_timeout),
        )
        .map_err(|e| format!("scraping {}/metrics: {e}", self.admin))?;
        if status != 200 {
            return Err(format!("{}/metrics answered {status}", self.admin));
        }
        Ok(body)
    }

    /// Sum of a metric's samples whose label set contains every `labels` fragment.
    pub fn metric_sum(&self, name: &str, labels: &[&str]) -> Result<f64, String> {
        Ok(sum_of(&self.metrics()?, name, labels))
    }

    /// `VmRSS` and `RssAnon` of the process, in KiB.
    pub fn memory_kib(&self) -> Result<Memory, String> {
        let path = format!("/proc/{}/status", self.pid());
        let status = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
        let field = |name: &str| -> Result<u64, String> {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
                .ok_or_else(|| format!("{path} has no {name} line"))
        };
        Ok(Memory {
            rss: field("VmRSS:")?,
            anon: field("RssAnon:")?,
        })
    }

    /// CPU time the process has used so far (user + system), from `/proc/<pid>/stat`.
    pub fn cpu_time(&self) -> Result<Duration, String> {
        let path = format!("/proc/{}/stat", self.pid());
        let stat = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
        // After the command name in parentheses (which may hold spaces): state is field 3,
        // utime and stime are fields 14 and 15.
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map_or(Vec::new(), |(_, rest)| rest.split(' ').collect());
        let ticks = |index: usize| fields.get(index).and_then(|f| f.parse::<u64>().ok());
        let (Some(user), Some(system)) = (ticks(11), ticks(12)) else {
            return Err(format!("{path}: no utime/stime"));
        };
        // SAFETY: sysconf only reads a system constant.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Ok(Duration::from_millis((user + system) * 1000 / per_second))
    }

    /// CPU time (user + system) of each of the process's threads so far: (name, time), from
    /// `/proc/<pid>/task/<tid>/{comm,stat}`. Threads that exit in between are skipped.
    pub fn thread_cpu_times(&self) -> Result<Vec<(String, Duration)>, String> {
        let dir = format!("/proc/{}/task", self.pid());
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("reading {dir}: {e}"))?;
        // SAFETY: sysconf only reads a system constant.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let mut threads = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let (Ok(name), Ok(stat)) = (
                std::fs::read_to_string(path.join("comm")),
                std::fs::read_to_string(path.join("stat")),
            ) else {
                continue;
            };
            let fields: Vec<&str> = stat
                .rsplit_once(") ")
                .map_or(Vec::new(), |(_, rest)| rest.split(' ').collect());
            let ticks = |index: usize| fields.get(index).and_then(|f| f.parse::<u64>().ok());
            if let (Some(user), Some(system)) = (ticks(11), ticks(12)) {
                threads.push((
                    name.trim().to_owned(),
                    Duration::from_millis((user + system) * 1000 / per_second),
                ));
            }
        }
        Ok(threads)
    }

    /// Asks for a clean exit (`POST /quitquitquit`); kills the process if it is still there
    /// after `EXIT_TIMEOUT`. Returns a note when it had to be killed.
    pub fn stop(mut self) -> Option<String> {
        let mut child = self.child.take()?;
        let _ = admin_request(self.admin, "POST", "/quitquitquit");
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Some(format!(
            "kactivator (pid {}) did not exit within {EXIT_TIMEOUT:?} of /quitquitquit and was killed",
            child.id()
        ))
    }
}

impl Drop for Activator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sum of the samples of metric `name` in a `/metrics` text whose label set contains every
/// `labels` fragment.
pub fn sum_of(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Resident memory, KiB.
#[derive(Clone, Copy, Debug)]
pub struct Memory {
    pub rss: u64,
    pub anon: u64,
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit; returns the new limit.
pub fn raise_nofile_soft_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

/// One request to the admin port with `Connection: close`: (status, body).
pub fn admin_request(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    request(
        addr,
        method,
        path,
        "",
        "",
        (Duration::from_secs(1), Duration::from_secs(10)),
    )
}

/// One HTTP/1.1 request with `Connection: close` and a `Content-Type` when `content_type` is
/// not empty: (status, body as text). `timeouts`: (connect, read).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
    (connect, read): (Duration, Duration),
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, connect)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(read))?;
    let content_type = if content_type.is_empty() {
        String::new()
    } else {
        format!("Content-Type: {content_type}\r\n")
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {}\r\n{content_type}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        addr.ip(),
        body.len()
    )?;
    let response = raw_http1::Connection::new(stream)?
        .read_response()
        .map_err(io_error)?;
    Ok((response.status, response.text()))
}
