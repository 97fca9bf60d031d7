//! `kactivator queue-proxy`, started as Knative starts its queue-proxy: the reconciler's
//! environment, no arguments but the test's own ports, killed on drop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kactivator_testkit::ports::free_port;

use super::{admin_get, eventually, exchange, scratch_dir, under_memory_limit, Response};

/// The pod name the environment gives the queue-proxy.
pub const POD: &str = "hello-00001-deployment-7d9f";
/// Its revision, in namespace `default`.
pub const REVISION: &str = "hello-00001";

/// What Knative 1.18's reconciler sets (`queue.go`), for a user container on `user_port`,
/// served on `serving_port`; the fork's push off (`ACTIVATOR_SERVICE_URL` empty: absent, the
/// queue-proxy would push to the in-cluster activator's name).
pub fn knative_env(user_port: u16, serving_port: u16, concurrency: u32) -> HashMap<String, String> {
    [
        ("SERVING_NAMESPACE", "default".to_string()),
        ("SERVING_SERVICE", "hello".into()),
        ("SERVING_CONFIGURATION", "hello".into()),
        ("SERVING_REVISION", REVISION.into()),
        ("SERVING_POD", POD.into()),
        ("SERVING_POD_IP", "127.0.0.1".into()),
        ("QUEUE_SERVING_PORT", serving_port.to_string()),
        ("QUEUE_SERVING_TLS_PORT", free_port().to_string()),
        ("USER_PORT", user_port.to_string()),
        ("CONTAINER_CONCURRENCY", concurrency.to_string()),
        ("REVISION_TIMEOUT_SECONDS", "300".into()),
        ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0".into()),
        ("REVISION_IDLE_TIMEOUT_SECONDS", "0".into()),
        (
            "SERVING_READINESS_PROBE",
            format!(
                r#"{{"tcpSocket":{{"port":{user_port},"host":"127.0.0.1"}},"successThreshold":1}}"#
            ),
        ),
        ("SERVING_LOGGING_CONFIG", "{}".into()),
        ("SERVING_LOGGING_LEVEL", String::new()),
        ("SERVING_REQUEST_METRICS_BACKEND", "prometheus".into()),
        ("ENABLE_HTTP2_AUTO_DETECTION", "false".into()),
        ("ACTIVATOR_SERVICE_URL", String::new()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect()
}

/// What Knative 1.23's reconciler sets, every key and no other, in its order
/// (`pkg/reconciler/revision/resources/queue.go:355-449`): a revision with `concurrency`, a
/// user container on `user_port` with a TCP readiness probe, served on `serving_port`,
/// config-deployment's TLS keys unset (`""`), and `observability_config` as the reconciler
/// marshals config-observability. No `ACTIVATOR_SERVICE_URL`: the fork's push goes to its
/// default in-cluster name, which does not resolve here (it never holds up a request).
pub fn knative_1_23_env(
    user_port: u16,
    serving_port: u16,
    concurrency: u32,
    observability_config: &str,
) -> HashMap<String, String> {
    [
        ("SERVING_NAMESPACE", "default".to_string()),
        ("SERVING_SERVICE", "hello".into()),
        ("SERVING_CONFIGURATION", "hello".into()),
        ("SERVING_REVISION", REVISION.into()),
        ("QUEUE_SERVING_PORT", serving_port.to_string()),
        ("QUEUE_SERVING_TLS_PORT", free_port().to_string()),
        ("CONTAINER_CONCURRENCY", concurrency.to_string()),
        ("REVISION_TIMEOUT_SECONDS", "300".into()),
        ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0".into()),
        ("REVISION_IDLE_TIMEOUT_SECONDS", "0".into()),
        // `fieldRef` metadata.name and status.podIP.
        ("SERVING_POD", POD.into()),
        ("SERVING_POD_IP", "127.0.0.1".into()),
        // config-logging's `zap-logger-config` and the queue-proxy's level.
        (
            "SERVING_LOGGING_CONFIG",
            r#"{"level": "info", "development": false, "outputPaths": ["stdout"], "errorOutputPaths": ["stderr"], "encoding": "json", "encoderConfig": {"timeKey": "timestamp", "levelKey": "severity", "nameKey": "logger", "callerKey": "caller", "messageKey": "message", "stacktraceKey": "stacktrace", "lineEnding": "", "levelEncoder": "", "timeEncoder": "iso8601", "durationEncoder": "", "callerEncoder": ""}}"#.into(),
        ),
        ("SERVING_LOGGING_LEVEL", "info".into()),
        ("USER_PORT", user_port.to_string()),
        ("SYSTEM_NAMESPACE", "knative-serving".into()),
        (
            "SERVING_READINESS_PROBE",
            format!(
                r#"{{"tcpSocket":{{"port":{user_port},"host":"127.0.0.1"}},"successThreshold":1}}"#
            ),
        ),
        // `fieldRef` status.hostIP.
        ("HOST_IP", "127.0.0.1".into()),
        ("ENABLE_HTTP2_AUTO_DETECTION", "false".into()),
        ("ENABLE_HTTP_FULL_DUPLEX", "false".into()),
        ("ROOT_CA", String::new()),
        ("QUEUE_PROXY_TLS_MIN_VERSION", String::new()),
        ("QUEUE_PROXY_TLS_MAX_VERSION", String::new()),
        ("QUEUE_PROXY_TLS_CIPHER_SUITES", String::new()),
        ("QUEUE_PROXY_TLS_CURVE_PREFERENCES", String::new()),
        ("ENABLE_MULTI_CONTAINER_PROBES", "false".into()),
        ("OBSERVABILITY_CONFIG", observability_config.into()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect()
}

/// A running queue-proxy, killed on drop.
pub struct QueueProxy {
    pub child: Child,
    pub serving: SocketAddr,
    pub drain_admin: SocketAddr,
    pub autoscaler_metrics: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: PathBuf,
}

impl QueueProxy {
    /// Starts it with `env` and waits until its `/readyz` answers 200.
    pub fn start(env: HashMap<String, String>) -> QueueProxy {
        QueueProxy::start_with(env, &[])
    }

    /// [`QueueProxy::start`] with more flags (e.g. `--drain-grace-seconds`).
    pub fn start_with(env: HashMap<String, String>, args: &[&str]) -> QueueProxy {
        QueueProxy::start_in(Command::new(env!("CARGO_BIN_EXE_kactivator")), env, args)
    }

    /// [`QueueProxy::start_with`], the process shown a memory limit of `limit` bytes
    /// ([`under_memory_limit`]).
    pub fn start_under_memory_limit(
        env: HashMap<String, String>,
        args: &[&str],
        limit: u64,
    ) -> QueueProxy {
        QueueProxy::start_in(under_memory_limit(limit), env, args)
    }

    fn start_in(mut command: Command, env: HashMap<String, String>, args: &[&str]) -> QueueProxy {
        let serving: SocketAddr = format!("127.0.0.1:{}", env["QUEUE_SERVING_PORT"])
            .parse()
            .unwrap();
        let local = || -> SocketAddr { format!("127.0.0.1:{}", free_port()).parse().unwrap() };
        let (drain_admin, autoscaler_metrics, metrics) = (local(), local(), local());
        let dir = scratch_dir();
        let stderr = std::fs::File::create(dir.join("stderr.log")).unwrap();
        // Knative's request log goes to stdout.
        let stdout = std::fs::File::create(dir.join("stdout.log")).unwrap();
        let child = command
            .arg("queue-proxy")
            .args(["--drain-admin", &drain_admin.to_string()])
            .args(["--admin", &metrics.to_string()])
            .args(["--autoscaler-metrics", &autoscaler_metrics.to_string()])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "KACTIVATOR_DRIVER",
                std::env::var("KACTIVATOR_DRIVER").unwrap_or_else(|_| "auto".into()),
            )
            .envs(env)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn kactivator queue-proxy");
        let mut proxy = QueueProxy {
            child,
            serving,
            drain_admin,
            autoscaler_metrics,
            metrics,
            dir,
        };
        let up = eventually(Duration::from_secs(15), || {
            admin_get(proxy.metrics, "/readyz").is_some_and(|(status, _)| status == 200)
        });
        if !up {
            let _ = proxy.child.kill();
            panic!("queue-proxy never came up: {}", proxy.stderr());
        }
        proxy
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }

    /// What it wrote to stdout so far: the request log.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default()
    }

    /// Waits up to `within` for the process to exit: `Some(its exit code)` (`None` inside when a
    /// signal ended it), or `None` if it is still running then.
    pub fn wait_for_exit(&mut self, within: Duration) -> Option<Option<i32>> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status.code());
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn still_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// A health check as `user_agent` (the kubelet's, the activator's) sends it.
    pub fn health_check(&self, user_agent: &str) -> Response {
        exchange(
            self.serving,
            format!(
                "GET / HTTP/1.1\r\nHost: hello.default\r\nUser-Agent: {user_agent}\r\nK-Network-Probe: queue\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
    }

    pub fn get(&self, path: &str) -> Response {
        exchange(
            self.serving,
            format!("GET {path} HTTP/1.1\r\nHost: hello.default.example.com\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
    }

    /// `/metrics` on the user-metrics port: the sum of `name`'s samples whose labels contain
    /// every one of `labels`.
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        admin_get(self.metrics, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
            .filter(|line| labels.iter().all(|label| line.contains(label)))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits (5 s at most) until the series of `name` with `labels` sum to at least `sent`,
    /// for a test to then hold them to exact figures. A request is counted when it ends, after
    /// its last byte went to the client, so a scrape right after the client read the answer
    /// may not have it yet (Knative's queue-proxy records after its handler returns, alike).
    pub fn counted(&self, name: &str, labels: &[&str], sent: f64) {
        eventually(Duration::from_secs(5), || self.metric(name, labels) >= sent);
    }
}

impl Drop for QueueProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- queue-proxy stderr ---\n{}", self.stderr());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The queue-proxy with Knative's environment for a user container on `user_port` and `certs`
/// as the directory Knative mounts `serving-certs` in (a one-second quiet period, then `extra`
/// flags); with the pair there, it serves TLS on the port this returns.
pub fn start_with_certs(
    user_port: u16,
    certs: &std::path::Path,
    extra: &[&str],
) -> (QueueProxy, u16) {
    let env = knative_env(user_port, free_port(), 0);
    let tls_port = env["QUEUE_SERVING_TLS_PORT"].parse().unwrap();
    let mut args = vec![
        "--drain-grace-seconds",
        "1",
        "--certs-dir",
        certs.to_str().expect("a UTF-8 path"),
    ];
    args.extend_from_slice(extra);
    (QueueProxy::start_with(env, &args), tls_port)
}
