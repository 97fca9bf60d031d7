//! Command-line flags and environment. Every flag has an environment twin for container use.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kactivator_shards::runtime::reactor::DriverChoice;

/// What `--version` prints after the name: the crate's version and the git commit it was built
/// from (build.rs; `unknown` outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KACTIVATOR_GIT_COMMIT"),
    ")"
);

/// A thread-per-core Knative activator.
#[derive(Debug, Parser)]
#[command(name = "kactivator", version = VERSION, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Configuration file (TOML). Standalone, it declares the revisions; watching Kubernetes,
    /// only its settings are used (listeners, proxy, timeouts).
    #[arg(long, short = 'c', env = "KACTIVATOR_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Where revisions and pods come from: `kubernetes` watches the cluster as the upstream
    /// activator does (kubeconfig or in-cluster service account), `file` reads `--config`;
    /// `auto` is `file` with `--config` and `kubernetes` without.
    #[arg(long, env = "KACTIVATOR_SOURCE", default_value = "auto", global = true)]
    pub source: SourceChoice,

    /// Number of shards (reactor threads). Default: the CPUs this process may use (affinity mask
    /// capped by the cgroup CPU quota).
    #[arg(long, env = "KACTIVATOR_SHARDS", global = true)]
    pub shards: Option<usize>,

    /// I/O driver: `auto` tries io_uring and falls back to epoll when the kernel refuses it.
    #[arg(long, env = "KACTIVATOR_DRIVER", default_value = "auto", value_parser = parse_driver, global = true)]
    pub driver: DriverChoice,

    /// Data port address, overriding the file's `listen.http`.
    #[arg(long, env = "KACTIVATOR_HTTP", global = true)]
    pub http: Option<SocketAddr>,

    /// Second data port address (upstream's h2c port; both ports serve HTTP/1.1 and h2c),
    /// overriding the file's `listen.http2`.
    #[arg(long, env = "KACTIVATOR_HTTP2", global = true)]
    pub http2: Option<SocketAddr>,

    /// Admin port address (metrics, health), overriding the file's `listen.admin`.
    #[arg(long, env = "KACTIVATOR_ADMIN", global = true)]
    pub admin: Option<SocketAddr>,

    /// Seconds between SIGTERM and closing the listeners, overriding `proxy.drain_grace_seconds`.
    #[arg(long, env = "KACTIVATOR_DRAIN_GRACE_SECONDS", global = true)]
    pub drain_grace_seconds: Option<u64>,

    /// The autoscaler's stat server, `ws://host:port`, overriding `autoscaler.url`. With one,
    /// each revision's load is reported every second and readiness waits for the connection.
    #[arg(long, env = "KACTIVATOR_AUTOSCALER_URL", global = true)]
    pub autoscaler_url: Option<String>,

    /// This activator's pod name (metric label `pod_name`), as Knative passes it.
    #[arg(long, env = "POD_NAME", default_value = "kactivator", global = true)]
    pub pod_name: String,

    #[command(flatten)]
    pub logging: Logging,
}

#[derive(Debug, Args)]
pub struct Logging {
    /// Log format.
    #[arg(
        long,
        env = "KACTIVATOR_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,

    /// Log filter, `RUST_LOG` syntax (e.g. `info`, `kactivator_shards=debug`).
    #[arg(long, env = "KACTIVATOR_LOG", default_value = "info", global = true)]
    pub log: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SourceChoice {
    Auto,
    File,
    Kubernetes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a few demo backends and a kactivator in front of them, and print what to try.
    Demo(DemoArgs),
    /// Run as Knative's queue-proxy sidecar, configured by the environment Knative's revision
    /// reconciler sets (SERVING_NAMESPACE, SERVING_REVISION, USER_PORT, ...; README: As
    /// Knative's queue-proxy). Missing or bad keys: exit 2, naming each.
    QueueProxy(QueueProxyArgs),
    /// Run as KEDA's HTTP add-on's interceptor and external scaler in one process, for plain
    /// Deployments scaled by KEDA: routes from the cluster's HTTPScaledObjects, configured by
    /// the add-on's environment (KEDA_HTTP_PROXY_PORT, KEDA_HTTP_ADMIN_PORT, ...; README: As
    /// KEDA's HTTP add-on). Bad keys: exit 2, naming each.
    KedaHttp,
}

/// Whether the queue-proxy unmaps the code start-up ran (`--unmap-start-up-code`). On: it is what
/// brings the sidecar's VmRSS (`ps`, the idle-RSS target) under 5 MB, for a few minor faults
/// once. It does not lower what the cgroup is charged, nor the kubelet's working set: the pages
/// stay in the page cache (BENCHMARKS.md, "Idle memory and the code layout").
pub const UNMAP_START_UP_CODE: bool = true;

#[derive(Debug, Args)]
pub struct QueueProxyArgs {
    /// Address of the drain hook `/wait-for-drain` (upstream's admin port, 8022). Knative's
    /// pod spec names port 8022; change it only outside Knative (tests, a local run).
    #[arg(
        long,
        env = "KACTIVATOR_QUEUE_PROXY_ADMIN",
        default_value = "[::]:8022"
    )]
    pub drain_admin: SocketAddr,

    /// Address of the autoscaler metrics `/metrics` (upstream's `http-autometric` port, 9090),
    /// which Knative's autoscaler scrapes. Change it only outside Knative.
    #[arg(
        long,
        env = "KACTIVATOR_QUEUE_PROXY_AUTOSCALER_METRICS",
        default_value = "[::]:9090"
    )]
    pub autoscaler_metrics: SocketAddr,

    /// Where Knative mounts the pod's TLS certificate (`tls.crt`, `tls.key`) when
    /// system-internal-tls is on: with both files there, `QUEUE_SERVING_TLS_PORT` serves TLS
    /// beside the plain port. Change it only outside Knative.
    #[arg(
        long,
        env = "KACTIVATOR_QUEUE_PROXY_CERTS_DIR",
        default_value = kactivator_control::queue_proxy::certs::CERT_DIR
    )]
    pub certs_dir: std::path::PathBuf,

    /// Seconds between looks at the mounted certificate; a changed pair is served to new
    /// handshakes. Default: upstream's one minute.
    #[arg(
        long,
        env = "KACTIVATOR_QUEUE_PROXY_CERTS_RELOAD_SECONDS",
        default_value_t = kactivator_control::queue_proxy::certs::RELOAD_EVERY.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub certs_reload_seconds: u64,

    /// Unmap the pages of code and constants start-up ran, 3 s after the shards start (they stay
    /// in the page cache; serving maps back what it runs): `true` or `false`.
    #[arg(
        long,
        env = "KACTIVATOR_QUEUE_PROXY_UNMAP_START_UP_CODE",
        default_value_t = UNMAP_START_UP_CODE,
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new(),
    )]
    pub unmap_start_up_code: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Number of demo backends (pods), 1 to 64.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub pods: u16,
}

fn parse_driver(text: &str) -> Result<DriverChoice, String> {
    text.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_proxy_args(args: &[&str]) -> QueueProxyArgs {
        let cli =
            Cli::try_parse_from(["kactivator", "queue-proxy"].iter().chain(args)).expect("parses");
        match cli.command {
            Some(Command::QueueProxy(args)) => args,
            other => panic!("not the queue-proxy: {other:?}"),
        }
    }

    #[test]
    fn the_queue_proxy_unmaps_start_up_code_unless_told_not_to() {
        // The environment twin is not set in the test's process, so the default applies.
        if std::env::var_os("KACTIVATOR_QUEUE_PROXY_UNMAP_START_UP_CODE").is_some() {
            return;
        }
        assert_eq!(
            queue_proxy_args(&[]).unmap_start_up_code,
            UNMAP_START_UP_CODE
        );
        assert!(!queue_proxy_args(&["--unmap-start-up-code", "false"]).unmap_start_up_code);
        assert!(queue_proxy_args(&["--unmap-start-up-code", "true"]).unmap_start_up_code);
        assert!(Cli::try_parse_from([
            "kactivator",
            "queue-proxy",
            "--unmap-start-up-code",
            "maybe"
        ])
        .is_err());
    }
}
