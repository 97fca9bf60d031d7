//! The standalone configuration file: listeners, proxy settings, feature gates and revisions.
//!
//! TOML, parsed with the maintained `toml` crate. Unknown keys are errors (a typo must not be
//! silently ignored), and every error, the parser's or validation's, names the line and column
//! of the key or value it is about: validation looks values up in the parsed document's spans.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kactivator_shards::routing::{LbPolicy, Protocol, Timeouts};
use serde::Deserialize;
use toml::de::DeTable;

/// Default data port (Knative's `BackendHTTPPort`).
pub const DEFAULT_HTTP: &str = "0.0.0.0:8012";
/// Default admin port (metrics and health).
pub const DEFAULT_ADMIN: &str = "0.0.0.0:9090";
/// Default time between SIGTERM and closing the listeners (Knative's `DefaultDrainTimeout`).
pub const DEFAULT_DRAIN_GRACE_SECONDS: u64 = 45;

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub listen: Listen,
    #[serde(default)]
    pub proxy: ProxySettings,
    /// Feature gates, `config-features` style: `"queueproxy.pod-authority" = "enabled"`.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    #[serde(default)]
    pub control: ControlSettings,
    #[serde(default)]
    pub health: HealthSettings,
    #[serde(default)]
    pub cluster: ClusterSettings,
    #[serde(default)]
    pub revisions: Vec<RevisionConfig>,
}

/// The control plane's tunables.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ControlSettings {
    /// How often the configuration file is checked for changes, in milliseconds. Default 1000.
    pub watch_interval_ms: u64,
    /// State changes the worker's channel holds before producers wait. Default 500.
    pub state_queue_capacity: usize,
    /// Most pod trackers per revision; more pods are refused and counted. Default 5000.
    pub max_trackers_per_revision: usize,
    /// A queue-proxy `ready` outweighs the informer for this long, in seconds. Default 30.
    pub qp_freshness_seconds: u64,
    /// A queue-proxy `not-ready`/`draining` outweighs the informer for this long. Default 60.
    pub qp_staleness_seconds: u64,
    /// How often idle NotReady trackers are looked for, in seconds. Default 60.
    pub stale_sweep_seconds: u64,
}

impl Default for ControlSettings {
    fn default() -> Self {
        ControlSettings {
            watch_interval_ms: 1000,
            state_queue_capacity: 500,
            max_trackers_per_revision: 5000,
            qp_freshness_seconds: 30,
            qp_staleness_seconds: 60,
            stale_sweep_seconds: 60,
        }
    }
}

/// The active health check behind quarantine.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthSettings {
    /// Time between probes of each routable pod, in milliseconds. Default 1000.
    pub probe_interval_ms: u64,
    /// A probe slower than this fails, in milliseconds. Default 2000.
    pub probe_timeout_ms: u64,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            probe_interval_ms: 1000,
            probe_timeout_ms: 2000,
        }
    }
}

/// The other activators (standalone; Kubernetes reads them from the public endpoints).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSettings {
    /// This activator's IP among `activators`. Default: the `POD_IP` environment variable.
    pub self_ip: Option<std::net::IpAddr>,
    /// Every activator's IP, this one included, for splitting pods among them. Empty: alone.
    pub activators: Vec<std::net::IpAddr>,
    /// Data-port addresses of the other activators, to relay queue-proxy registrations to.
    pub peers: Vec<SocketAddr>,
}

/// Where to listen.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// Data port for HTTP/1.1. Default `0.0.0.0:8012`.
    #[serde(default = "default_http")]
    pub http: SocketAddr,
    /// Admin port: `/metrics`, `/healthz`, `/readyz`. Default `0.0.0.0:9090`.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            http: default_http(),
            admin: default_admin(),
        }
    }
}

fn default_http() -> SocketAddr {
    DEFAULT_HTTP.parse().expect("constant address parses")
}

fn default_admin() -> SocketAddr {
    DEFAULT_ADMIN.parse().expect("constant address parses")
}

/// Proxy behaviour.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProxySettings {
    /// Cluster domain for the Host fallback `<rev>.<ns>.svc.<domain>`. Default: from
    /// /etc/resolv.conf, then `CLUSTER_DOMAIN`, then `cluster.local`.
    #[serde(default)]
    pub cluster_domain: Option<String>,
    /// Longest time to dial a pod, in milliseconds. Default 5000.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Idle upstream connections are closed after this many seconds. Default 90.
    #[serde(default = "default_idle_seconds")]
    pub upstream_idle_timeout_seconds: u64,
    /// Idle upstream connections kept per pod and shard. Default 100.
    #[serde(default = "default_max_idle")]
    pub max_idle_per_pod: usize,
    /// Seconds between SIGTERM (readiness fails at once) and closing the listeners. Default 45.
    #[serde(default = "default_drain_grace")]
    pub drain_grace_seconds: u64,
    /// Most requests waiting for a pod over all revisions; more get 503
    /// `pending request queue full`. Default 100 000.
    #[serde(default = "default_max_queued")]
    pub max_queued_requests: u32,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            cluster_domain: None,
            connect_timeout_ms: default_connect_timeout_ms(),
            upstream_idle_timeout_seconds: default_idle_seconds(),
            max_idle_per_pod: default_max_idle(),
            drain_grace_seconds: default_drain_grace(),
            max_queued_requests: default_max_queued(),
        }
    }
}

fn default_connect_timeout_ms() -> u64 {
    5000
}
fn default_idle_seconds() -> u64 {
    90
}
fn default_max_idle() -> usize {
    100
}
fn default_max_queued() -> u32 {
    100_000
}
fn default_drain_grace() -> u64 {
    DEFAULT_DRAIN_GRACE_SECONDS
}

/// One revision and its pods.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RevisionConfig {
    pub namespace: String,
    pub name: String,
    /// Metric label `service_name`. Default empty.
    #[serde(default)]
    pub service: String,
    /// Metric label `configuration_name`. Default empty.
    #[serde(default)]
    pub configuration: String,
    /// Requests one pod may take at once; 0 = unlimited. Default 0.
    #[serde(default)]
    pub container_concurrency: u32,
    /// `http1`, the default and the only protocol supported. `h2c` is refused at load until
    /// HTTP/2 to pods is built.
    #[serde(default)]
    pub protocol: ProtocolName,
    /// Whole-request timeout in seconds, queueing included. Default 300.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// Time to first response byte in seconds; 0 = off. Default 0.
    #[serde(default)]
    pub response_start_timeout_seconds: u64,
    /// Longest gap between response writes in seconds; 0 = off. Default 0.
    #[serde(default)]
    pub idle_timeout_seconds: u64,
    /// `random-choice-2`, `first-available`, `round-robin` or `least-connections`. Default by
    /// containerConcurrency, as upstream.
    #[serde(default)]
    pub load_balancing_policy: Option<LbPolicyName>,
    /// Most requests that may wait for a free pod slot; more get 503
    /// `pending request queue full`. Default 10 000.
    #[serde(default = "default_queue_depth")]
    pub queue_depth: u32,
    /// Port a queue-proxy's bare `pod_ip` maps to. Default 8012 (`http1`) or 8013 (`h2c`).
    #[serde(default)]
    pub serving_port: Option<u16>,
    /// Pod addresses `ip:port`, routable from the start (the informer's view, standalone).
    #[serde(default)]
    pub pods: Vec<SocketAddr>,
}

fn default_queue_depth() -> u32 {
    kactivator_shards::routing::DEFAULT_QUEUE_DEPTH
}

fn default_timeout_seconds() -> u64 {
    300
}

/// Protocol names the file may spell. `H2c` parses but validation refuses it for now.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(try_from = "String")]
pub enum ProtocolName {
    #[default]
    Http1,
    H2c,
}

impl TryFrom<String> for ProtocolName {
    type Error = String;

    /// By hand rather than derived, so an unknown name is not answered with "expected `http1`
    /// or `h2c`" while h2c is refused.
    fn try_from(name: String) -> Result<ProtocolName, String> {
        match name.as_str() {
            "http1" => Ok(ProtocolName::Http1),
            "h2c" => Ok(ProtocolName::H2c),
            _ => Err(format!("unknown protocol {name:?}, expected \"http1\"")),
        }
    }
}

/// Load-balancing policy names accepted in the file.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum LbPolicyName {
    RandomChoice2,
    FirstAvailable,
    RoundRobin,
    LeastConnections,
}

impl RevisionConfig {
    pub fn protocol(&self) -> Protocol {
        match self.protocol {
            ProtocolName::Http1 => Protocol::Http1,
            ProtocolName::H2c => Protocol::H2c,
        }
    }

    pub fn lb_policy(&self) -> LbPolicy {
        match self.load_balancing_policy {
            None => LbPolicy::default_for(self.container_concurrency),
            Some(LbPolicyName::RandomChoice2) => LbPolicy::RandomChoice2,
            Some(LbPolicyName::FirstAvailable) => LbPolicy::FirstAvailable,
            Some(LbPolicyName::RoundRobin) => LbPolicy::RoundRobin,
            Some(LbPolicyName::LeastConnections) => LbPolicy::LeastConnections,
        }
    }

    pub fn serving_port(&self) -> u16 {
        self.serving_port.unwrap_or(match self.protocol {
            ProtocolName::Http1 => 8012,
            ProtocolName::H2c => 8013,
        })
    }

    pub fn timeouts(&self) -> Timeouts {
        let optional = |seconds: u64| (seconds > 0).then(|| Duration::from_secs(seconds));
        Timeouts {
            total: Duration::from_secs(self.timeout_seconds),
            response_start: optional(self.response_start_timeout_seconds),
            idle: optional(self.idle_timeout_seconds),
        }
    }
}

/// A configuration that could not be loaded, with where and why.
#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, when loaded from one.
    pub source: Option<String>,
    /// 1-based line and column of the problem, when known.
    pub position: Option<(usize, usize)>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(source) = &self.source {
            write!(f, "{source}:")?;
        }
        if let Some((line, column)) = self.position {
            write!(f, "{line}:{column}: ")?;
        } else if self.source.is_some() {
            f.write_str(" ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// A value the file sets that validation refused, at `position` when known.
    fn invalid(position: Option<(usize, usize)>, message: String) -> ConfigError {
        ConfigError {
            source: None,
            position,
            message,
        }
    }
}

impl Config {
    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let toml_error = |error: toml::de::Error| ConfigError {
            source: None,
            position: error.span().map(|span| line_and_column(text, span.start)),
            message: error.message().trim_end().to_string(),
        };
        // The spanned document is kept for validation, which needs to say where a value is.
        let document = DeTable::parse(text).map_err(toml_error)?;
        let config = Config::deserialize(toml::de::Deserializer::from(document.clone()))
            .map_err(toml_error)?;
        config.validate(&Spans {
            text,
            root: document.get_ref(),
        })?;
        Ok(config)
    }

    /// Reads and parses a file; errors carry the file name.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError {
            source: Some(path.display().to_string()),
            position: None,
            message: format!("cannot read: {error}"),
        })?;
        Config::parse(&text).map_err(|mut error| {
            error.source = Some(path.display().to_string());
            error
        })
    }

    /// Checks what the types cannot say. Every error points at the value it is about.
    fn validate(&self, spans: &Spans<'_>) -> Result<(), ConfigError> {
        let control = &self.control;
        if control.qp_freshness_seconds > control.qp_staleness_seconds {
            // One of the two is set in the file (the defaults agree); point at that one.
            let position = spans
                .table_value("control", "qp_freshness_seconds")
                .or_else(|| spans.table_value("control", "qp_staleness_seconds"));
            return Err(ConfigError::invalid(
                position,
                format!(
                    "control.qp_freshness_seconds ({}) may not exceed control.qp_staleness_seconds ({})",
                    control.qp_freshness_seconds, control.qp_staleness_seconds
                ),
            ));
        }
        for (table, key, value) in [
            ("control", "watch_interval_ms", control.watch_interval_ms),
            (
                "control",
                "state_queue_capacity",
                control.state_queue_capacity as u64,
            ),
            (
                "control",
                "stale_sweep_seconds",
                control.stale_sweep_seconds,
            ),
            ("health", "probe_interval_ms", self.health.probe_interval_ms),
            ("health", "probe_timeout_ms", self.health.probe_timeout_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(
                    spans.table_value(table, key),
                    format!("{table}.{key} must be at least 1"),
                ));
            }
        }
        let mut seen = HashSet::new();
        for (index, revision) in self.revisions.iter().enumerate() {
            let at = |key: &str| spans.revision_value(index, key);
            for (key, value) in [("namespace", &revision.namespace), ("name", &revision.name)] {
                if value.is_empty() || value.contains('/') || value.chars().any(char::is_whitespace)
                {
                    return Err(ConfigError::invalid(
                        at(key),
                        format!(
                            "revision {key} {value:?} must be non-empty, without '/' or spaces"
                        ),
                    ));
                }
            }
            let key = format!("{}/{}", revision.namespace, revision.name);
            if !seen.insert((revision.namespace.as_str(), revision.name.as_str())) {
                return Err(ConfigError::invalid(
                    at("name"),
                    format!("revision {key} is declared twice"),
                ));
            }
            if revision.protocol == ProtocolName::H2c {
                // The name stays for when HTTP/2 is built; until then nothing may take it,
                // or the pods' h2c ports would get HTTP/1.
                return Err(ConfigError::invalid(
                    at("protocol"),
                    format!(
                        "revision {key}: protocol \"h2c\" is not supported yet (HTTP/2 to pods is \
                         not built); use \"http1\""
                    ),
                ));
            }
            if revision.timeout_seconds == 0 {
                return Err(ConfigError::invalid(
                    at("timeout_seconds"),
                    format!("revision {key}: timeout_seconds must be at least 1"),
                ));
            }
        }
        Ok(())
    }
}

/// The parsed document beside the typed config: where each value sits in the text.
struct Spans<'a> {
    text: &'a str,
    root: &'a DeTable<'a>,
}

impl Spans<'_> {
    /// Line and column of `[table]`'s `key` value, when the file sets it.
    fn table_value(&self, table: &str, key: &str) -> Option<(usize, usize)> {
        self.value_in(self.root.get(table)?.get_ref().as_table()?, key)
    }

    /// Line and column of `key`'s value in the `index`th `[[revisions]]` table, when set.
    fn revision_value(&self, index: usize, key: &str) -> Option<(usize, usize)> {
        let revisions = self.root.get("revisions")?.get_ref().as_array()?;
        self.value_in(revisions.get(index)?.get_ref().as_table()?, key)
    }

    fn value_in(&self, table: &DeTable<'_>, key: &str) -> Option<(usize, usize)> {
        let value = table.get(key)?;
        Some(line_and_column(self.text, value.span().start))
    }
}

fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |last| last.chars().count())
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[listen]
http = "127.0.0.1:18012"
admin = "127.0.0.1:19090"

[features]
"queueproxy.pod-authority" = "Enabled"

[[revisions]]
namespace = "default"
name = "hello-00001"
service = "hello"
container_concurrency = 2
timeout_seconds = 30
idle_timeout_seconds = 5
pods = ["127.0.0.1:8081", "[::1]:8082"]
"#;

    #[test]
    fn a_full_file_parses_with_defaults_filled_in() {
        let config = Config::parse(EXAMPLE).unwrap();
        assert_eq!(config.listen.http, "127.0.0.1:18012".parse().unwrap());
        assert_eq!(config.features["queueproxy.pod-authority"], "Enabled");
        let revision = &config.revisions[0];
        assert_eq!(revision.pods.len(), 2);
        assert_eq!(
            revision.lb_policy(),
            LbPolicy::FirstAvailable,
            "CC 2 defaults to first-available"
        );
        assert_eq!(revision.timeouts().total, Duration::from_secs(30));
        assert_eq!(revision.timeouts().idle, Some(Duration::from_secs(5)));
        assert_eq!(revision.timeouts().response_start, None);
        assert_eq!(config.proxy.drain_grace_seconds, 45);
    }

    #[test]
    fn an_empty_file_is_a_valid_config_with_defaults() {
        let config = Config::parse("").unwrap();
        assert_eq!(config.listen.http, "0.0.0.0:8012".parse().unwrap());
        assert!(config.revisions.is_empty());
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let error = Config::parse("[listen]\nhttp = \"127.0.0.1:80\"\nadmin = \n").unwrap_err();
        assert_eq!(error.position.map(|(line, _)| line), Some(3), "{error}");
    }

    #[test]
    fn bad_addresses_and_unknown_keys_are_rejected_where_they_are() {
        let error = Config::parse(
            "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\npods = [\"not-an-address\"]\n",
        )
        .unwrap_err();
        assert_eq!(error.position.map(|(line, _)| line), Some(4), "{error}");
        let error = Config::parse(
            "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\ncontainer_concurency = 1\n",
        )
        .unwrap_err();
        assert!(error.message.contains("container_concurency"), "{error}");
        assert_eq!(error.position.map(|(line, _)| line), Some(4), "{error}");
    }

    #[test]
    fn duplicate_revisions_and_bad_names_are_rejected() {
        let twice = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\n[[revisions]]\nnamespace = \"a\"\nname = \"b\"\n";
        assert!(Config::parse(twice)
            .unwrap_err()
            .message
            .contains("declared twice"));
        let slash = "[[revisions]]\nnamespace = \"a/b\"\nname = \"c\"\n";
        assert!(Config::parse(slash)
            .unwrap_err()
            .message
            .contains("without '/'"));
    }

    #[test]
    fn unknown_protocols_and_policies_are_rejected() {
        let bad = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nprotocol = \"h3\"\n";
        let (position, message) = error_at(bad);
        assert_eq!(position, Some((4, 12)), "{message}");
        assert!(
            message.contains("\"h3\"") && message.contains("\"http1\"") && !message.contains("h2c"),
            "an unknown protocol must not suggest the unsupported h2c: {message}"
        );
        let bad =
            "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nload_balancing_policy = \"random\"\n";
        assert!(Config::parse(bad).is_err());
    }

    /// Line and column the error for `text` points at, and its message.
    fn error_at(text: &str) -> (Option<(usize, usize)>, String) {
        let error = Config::parse(text).expect_err("the file is invalid");
        (error.position, error.message)
    }

    #[test]
    fn a_zero_timeout_is_found_on_its_own_line_not_in_longer_keys_ending_the_same() {
        let text = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nidle_timeout_seconds = 5\n\
                    response_start_timeout_seconds = 5\ntimeout_seconds = 0\n";
        let (position, message) = error_at(text);
        assert_eq!(position, Some((6, 19)), "{message}");
        assert!(message.contains("timeout_seconds"), "{message}");
    }

    #[test]
    fn a_zero_timeout_in_the_second_revision_is_found_in_the_second_revision() {
        let text = "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\ntimeout_seconds = 30\n\n\
                    [[revisions]]\nnamespace = \"a\"\nname = \"c\"\ntimeout_seconds = 0\n";
        let (position, message) = error_at(text);
        assert_eq!(position, Some((9, 19)), "{message}");
        assert!(message.contains("a/c"), "{message}");
    }

    #[test]
    fn a_duplicate_revision_is_found_at_its_second_name_not_where_the_text_first_appears() {
        let text = "# \"hello\" is declared twice below\n\
                    [[revisions]]\nnamespace = \"hello\"\nname = \"hello\"\n\n\
                    [[revisions]]\nnamespace = \"hello\"\nname = \"hello\"\n";
        let (position, message) = error_at(text);
        assert_eq!(position, Some((8, 8)), "{message}");
        assert!(message.contains("declared twice"), "{message}");
    }

    #[test]
    fn an_invalid_namespace_is_found_in_its_revision_not_in_an_earlier_table() {
        let text = "[features]\n\"team/x\" = \"enabled\"\n\n\
                    [[revisions]]\nnamespace = \"team/x\"\nname = \"b\"\n";
        let (position, message) = error_at(text);
        assert_eq!(position, Some((5, 13)), "{message}");
        assert!(message.contains("namespace"), "{message}");
    }

    #[test]
    fn h2c_is_refused_until_http2_to_pods_is_built() {
        let text =
            "[[revisions]]\nnamespace = \"default\"\nname = \"web\"\nprotocol = \"http1\"\n\n\
                    [[revisions]]\nnamespace = \"default\"\nname = \"hello\"\nprotocol = \"h2c\"\n";
        let (position, message) = error_at(text);
        assert_eq!(position, Some((9, 12)), "{message}");
        assert_eq!(
            message,
            "revision default/hello: protocol \"h2c\" is not supported yet (HTTP/2 to pods is not \
             built); use \"http1\""
        );
    }

    #[test]
    fn every_validation_error_points_at_the_value_it_is_about() {
        // (file, line and column of the offending value, a fragment of the message). Each file
        // mentions the key (or value) earlier too, where a text search would have found it.
        let cases: &[(&str, (usize, usize), &str)] = &[
            (
                "# qp_freshness_seconds = 90 would be wrong\n[control]\n\
                 qp_staleness_seconds = 80\nqp_freshness_seconds = 90\n",
                (4, 24),
                "control.qp_freshness_seconds",
            ),
            (
                "# qp_staleness_seconds below the default freshness\n[control]\n\
                 qp_staleness_seconds = 10\n",
                (3, 24),
                "control.qp_staleness_seconds",
            ),
            (
                "# watch_interval_ms = 0 is refused\n[control]\nwatch_interval_ms = 0\n",
                (3, 21),
                "control.watch_interval_ms",
            ),
            (
                "# state_queue_capacity = 0\n[control]\nstate_queue_capacity = 0\n",
                (3, 24),
                "control.state_queue_capacity",
            ),
            (
                "[control]\n# stale_sweep_seconds\nstale_sweep_seconds = 0\n",
                (3, 23),
                "control.stale_sweep_seconds",
            ),
            (
                "# probe_interval_ms\n[health]\nprobe_interval_ms = 0\n",
                (3, 21),
                "health.probe_interval_ms",
            ),
            (
                "# probe_timeout_ms\n[health]\nprobe_timeout_ms = 0\n",
                (3, 20),
                "health.probe_timeout_ms",
            ),
            (
                "[[revisions]]\nnamespace = \"a\"\nname = \"has space\"\n",
                (3, 8),
                "name",
            ),
            (
                "[[revisions]]\nnamespace = \"\"\nname = \"b\"\n",
                (2, 13),
                "namespace",
            ),
            (
                "[[revisions]]\nnamespace = \"a\"\nname = \"b\"\nservice = \"b\"\n\
                 [[revisions]]\nname = \"b\"\nnamespace = \"a\"\n",
                (6, 8),
                "declared twice",
            ),
            (
                "revisions = [\n  { namespace = \"a\", name = \"b\", timeout_seconds = 0 },\n]\n",
                (2, 52),
                "timeout_seconds",
            ),
        ];
        for (text, expected, fragment) in cases {
            let (position, message) = error_at(text);
            assert_eq!(position, Some(*expected), "{message}\n{text}");
            assert!(message.contains(fragment), "{message:?} lacks {fragment:?}");
        }
    }

    #[test]
    fn load_errors_carry_the_file_name() {
        let error = Config::load(Path::new("/nonexistent/kactivator.toml")).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("/nonexistent/kactivator.toml: cannot read"),
            "{error}"
        );
    }
}
