//! The environment of KEDA's HTTP add-on's interceptor and scaler (`interceptor/config/` and
//! `scaler/config.go` at v0.15.0), as `kactivator keda-http` reads it: the same keys, so that
//! the add-on's Deployments' environment carries over. Pure: a lookup function in, the
//! settings or every bad key out. Keys the add-on has and this role does not act on are named
//! in [`NOT_ACTED_ON`], and said at start-up when set.

use std::path::PathBuf;
use std::time::Duration;

use super::model::{Defaults, DEFAULT_RESPONSE_HEADER_TIMEOUT};
use crate::features::parse_duration;
use crate::tls::settings::{self, KEDA_HTTP};
use crate::tls::TlsSettings;
use kactivator_shards::routing::MAX_TIMEOUT_SECONDS;
// Go's `strconv.ParseBool`, which the add-on's `envconfig` uses too.
use crate::queue_proxy::env::go_bool;

/// The interceptor's proxy port when unset (the chart's).
pub const DEFAULT_PROXY_PORT: u16 = 8080;
/// The interceptor's admin port when unset (the chart's): `/readyz`, `/livez`, `/metrics`.
pub const DEFAULT_ADMIN_PORT: u16 = 9090;
/// The scaler's gRPC port when unset. The add-on runs it in its own pod on 9090; in the one
/// process here the admin port has 9090, so the scaler listens on 9091, and the
/// `keda-add-ons-http-external-scaler` Service maps its port 9090 to it (`deploy/keda-http/`).
pub const DEFAULT_SCALER_PORT: u16 = 9091;
/// `KEDA_HTTP_SHUTDOWN_DELAY` when unset: how long `/readyz` fails before the listeners close.
pub const DEFAULT_SHUTDOWN_DELAY: Duration = Duration::from_secs(5);
/// `KEDA_HTTP_CONNECT_TIMEOUT` when unset.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// `KEDA_HTTP_DRAIN_TIMEOUT` when unset: how long the requests in flight when the listeners
/// close may take.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `KEDA_HTTP_SCALER_STREAM_INTERVAL_MS` when unset.
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_millis(200);
/// `KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST` when unset: idle connections kept to one pod.
pub const DEFAULT_MAX_IDLE_PER_HOST: usize = 200;
/// `KEDA_HTTP_MAX_IDLE_CONNS` when unset: idle connections kept over every pod (Go's
/// `MaxIdleConns` in the add-on's transport).
pub const DEFAULT_MAX_IDLE: usize = 1000;
/// `OTEL_PROM_EXPORTER_PORT` when unset: where the add-on's interceptor serves `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 2223;
/// `KEDA_HTTP_PROXY_TLS_PORT` when unset.
pub const DEFAULT_TLS_PORT: u16 = 8443;
/// `KEDA_HTTP_PROXY_TLS_CERT_PATH` when unset.
pub const DEFAULT_TLS_CERT_PATH: &str = "/certs/tls.crt";
/// `KEDA_HTTP_PROXY_TLS_KEY_PATH` when unset.
pub const DEFAULT_TLS_KEY_PATH: &str = "/certs/tls.key";

/// Keys of the add-on this role reads and does not act on (yet); each is said at start-up
/// when set, so that nothing is silently ignored.
pub const NOT_ACTED_ON: [&str; 1] = [
    // Not a key of the add-on's sources here (its TLS port is `KEDA_HTTP_PROXY_TLS_ENABLED`'s);
    // said, in case a later release reads it.
    "KEDA_HTTP_TLS_ENABLED",
];

/// What the role is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KedaEnv {
    pub proxy_port: u16,
    pub admin_port: u16,
    pub scaler_port: u16,
    /// `KEDA_HTTP_WATCH_NAMESPACE`; `None` (empty): every namespace.
    pub watch_namespace: Option<String>,
    /// `KEDA_HTTP_ENABLE_COLD_START_HEADER`.
    pub cold_start_header: bool,
    /// `KEDA_HTTP_LOG_REQUESTS`: a combined-format line per request on stdout.
    pub log_requests: bool,
    pub defaults: Defaults,
    pub shutdown_delay: Duration,
    /// `KEDA_HTTP_DRAIN_TIMEOUT`; `None` (the add-on's 0): every request in flight finishes.
    pub drain_timeout: Option<Duration>,
    pub connect_timeout: Duration,
    /// `KEDA_HTTP_SCALER_STREAM_INTERVAL_MS`: how often `StreamIsActive` sends.
    pub stream_interval: Duration,
    /// `KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST`: idle connections kept to one pod (0: none).
    pub max_idle_per_host: usize,
    /// `KEDA_HTTP_MAX_IDLE_CONNS`: idle connections kept over every pod; `None` (0, Go's "no
    /// limit"): no cap but each pod's.
    pub max_idle: Option<usize>,
    /// Where the other replicas are listed: `KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE`,
    /// `_SERVICE` (the add-on's admin Service by default) and `_PORT` (the admin port by
    /// default), as the add-on's scaler reads them; `None` without a namespace: this replica
    /// answers KEDA with its own counts only.
    pub peers: Option<(String, String, u16)>,
    /// `OTEL_PROM_EXPORTER_PORT` while `OTEL_PROM_EXPORTER_ENABLED` (true): a second port
    /// serving what the admin port serves, `/metrics` with the add-on's `interceptor_*` among
    /// them; `None`: off.
    pub metrics_port: Option<u16>,
    /// `KEDA_HTTP_PROXY_TLS_ENABLED`: the TLS port; `None`: off.
    pub tls: Option<ProxyTls>,
    /// Keys of [`NOT_ACTED_ON`] that are set.
    pub not_acted_on: Vec<&'static str>,
}

/// The interceptor's TLS port (`interceptor/config/serving.go`, `tls_config.go` and, for the
/// version, suite and curve keys, 0.16's `config/tls.go`), and how its requests reach pods: over
/// TLS, as the add-on's `https://` upstream does for them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyTls {
    /// `KEDA_HTTP_PROXY_TLS_PORT`.
    pub port: u16,
    /// `KEDA_HTTP_PROXY_TLS_CERT_PATH` and `_KEY_PATH`: the main pair, served when no other is
    /// valid for the name a client asks for.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// `KEDA_HTTP_PROXY_TLS_CERT_STORE_PATHS`: directories of more pairs, chosen by name.
    pub store_dirs: Vec<PathBuf>,
    /// `KEDA_HTTP_TLS_{MIN_VERSION,MAX_VERSION,CIPHER_SUITES,CURVE_PREFERENCES}` (or the
    /// `KEDA_HTTP_PROXY_TLS_*` names, which win when set); Go's defaults when unset: TLS 1.2
    /// to 1.3. For both the port and the dial to pods.
    pub settings: TlsSettings,
    /// `KEDA_HTTP_TLS_SKIP_VERIFY` (or `KEDA_HTTP_PROXY_TLS_SKIP_VERIFY`): pods' certificates
    /// are not verified.
    pub skip_verify: bool,
    /// `KEDA_HTTP_TLS_CA_DIRS`: directories of PEM CA certificates pods' certificates may
    /// chain to, besides the system's and the served ones.
    pub ca_dirs: Vec<PathBuf>,
}

/// The interceptors' admin Service when `KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE` is unset (the
/// chart's name).
pub const DEFAULT_ADMIN_SERVICE: &str = "keda-add-ons-http-interceptor-admin";

/// Every key that could not be read, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvErrors(pub Vec<(&'static str, String)>);

impl std::fmt::Display for EnvErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (index, (key, why)) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{key}: {why}")?;
        }
        Ok(())
    }
}

impl std::error::Error for EnvErrors {}

/// Reads the environment through `get`.
pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<KedaEnv, EnvErrors> {
    let mut errors = Vec::new();
    let get = |key: &str| get(key).filter(|value| !value.is_empty());
    let mut port = |key: &'static str, default: u16| match get(key) {
        None => default,
        Some(text) => match text.trim().parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => {
                errors.push((key, format!("{text:?} is not a port (1-65535)")));
                default
            }
        },
    };
    let proxy_port = port("KEDA_HTTP_PROXY_PORT", DEFAULT_PROXY_PORT);
    let admin_port = port("KEDA_HTTP_ADMIN_PORT", DEFAULT_ADMIN_PORT);
    let scaler_port = port("KEDA_HTTP_SCALER_PORT", DEFAULT_SCALER_PORT);
    let peers_port = port("KEDA_HTTP_SCALER_TARGET_ADMIN_PORT", admin_port);
    let tls_port = port("KEDA_HTTP_PROXY_TLS_PORT", DEFAULT_TLS_PORT);
    let metrics_port = port("OTEL_PROM_EXPORTER_PORT", DEFAULT_METRICS_PORT);
    let mut duration = |key: &'static str| -> Option<Duration> {
        let text = get(key)?;
        match parse_duration(&text) {
            Some(duration) if duration.as_secs() > MAX_TIMEOUT_SECONDS => {
                errors.push((
                    key,
                    format!("{text:?} is more than the {MAX_TIMEOUT_SECONDS} s kactivator accepts"),
                ));
                None
            }
            Some(duration) => Some(duration),
            None => {
                errors.push((
                    key,
                    format!("{text:?} is not a duration (Go's, as 30s or 1m)"),
                ));
                None
            }
        }
    };
    let request = duration("KEDA_HTTP_REQUEST_TIMEOUT");
    let response_header = duration("KEDA_HTTP_RESPONSE_HEADER_TIMEOUT");
    // The deprecated name wins when above zero, as the add-on reads it.
    let deprecated_response_header = duration("KEDA_RESPONSE_HEADER_TIMEOUT");
    let readiness = duration("KEDA_HTTP_READINESS_TIMEOUT");
    // Likewise, the deprecated name of the readiness timeout.
    let condition_wait = duration("KEDA_CONDITION_WAIT_TIMEOUT");
    let shutdown_delay = duration("KEDA_HTTP_SHUTDOWN_DELAY");
    let connect_timeout = duration("KEDA_HTTP_CONNECT_TIMEOUT");
    let drain_timeout = duration("KEDA_HTTP_DRAIN_TIMEOUT");
    let mut boolean = |key: &'static str, default: bool| match get(key) {
        None => default,
        Some(text) => go_bool(&text).unwrap_or_else(|| {
            errors.push((key, format!("{text:?} is not a boolean")));
            default
        }),
    };
    let tls_enabled = boolean("KEDA_HTTP_PROXY_TLS_ENABLED", false);
    let metrics_enabled = boolean("OTEL_PROM_EXPORTER_ENABLED", true);
    let log_requests = boolean("KEDA_HTTP_LOG_REQUESTS", false);
    // The 0.15 name wins when set, as 0.16 reads them.
    let skip_verify = match get("KEDA_HTTP_PROXY_TLS_SKIP_VERIFY") {
        Some(_) => boolean("KEDA_HTTP_PROXY_TLS_SKIP_VERIFY", false),
        None => boolean("KEDA_HTTP_TLS_SKIP_VERIFY", false),
    };
    let tls = tls_enabled.then(|| {
        let settings = tls_settings(&get);
        errors.extend(settings.problems.iter().cloned());
        let dirs = |key| {
            get(key)
                .map(|text| {
                    text.split(',')
                        .map(str::trim)
                        .filter(|dir| !dir.is_empty())
                        .map(PathBuf::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        ProxyTls {
            port: tls_port,
            cert: get("KEDA_HTTP_PROXY_TLS_CERT_PATH")
                .unwrap_or_else(|| DEFAULT_TLS_CERT_PATH.into())
                .into(),
            key: get("KEDA_HTTP_PROXY_TLS_KEY_PATH")
                .unwrap_or_else(|| DEFAULT_TLS_KEY_PATH.into())
                .into(),
            store_dirs: dirs("KEDA_HTTP_PROXY_TLS_CERT_STORE_PATHS"),
            settings,
            skip_verify,
            ca_dirs: dirs("KEDA_HTTP_TLS_CA_DIRS"),
        }
    });
    let mut count = |key: &'static str, default: u64, least: u64| match get(key) {
        None => default,
        Some(text) => match text.trim().parse::<u64>() {
            Ok(value) if value >= least => value,
            _ => {
                errors.push((
                    key,
                    format!("{text:?} is not a whole number of at least {least}"),
                ));
                default
            }
        },
    };
    let stream_interval = Duration::from_millis(count(
        "KEDA_HTTP_SCALER_STREAM_INTERVAL_MS",
        DEFAULT_STREAM_INTERVAL.as_millis() as u64,
        // Go's ticker panics at 0.
        1,
    ));
    let max_idle_per_host = count(
        "KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST",
        DEFAULT_MAX_IDLE_PER_HOST as u64,
        0,
    );
    let max_idle = count("KEDA_HTTP_MAX_IDLE_CONNS", DEFAULT_MAX_IDLE as u64, 0);
    // 0.16's (the chart's `interceptor.coldStart.maxPendingRequests`); 0: unlimited there, the
    // route's own bound here.
    let max_pending = count("KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS", 0, 0);
    let cold_start_header = match get("KEDA_HTTP_ENABLE_COLD_START_HEADER") {
        None => true,
        Some(text) => match go_bool(&text) {
            Some(value) => value,
            None => {
                errors.push((
                    "KEDA_HTTP_ENABLE_COLD_START_HEADER",
                    format!("{text:?} is not a boolean"),
                ));
                true
            }
        },
    };
    if !errors.is_empty() {
        return Err(EnvErrors(errors));
    }
    let response_header = deprecated_response_header
        .filter(|duration| !duration.is_zero())
        .or(response_header.filter(|duration| !duration.is_zero()))
        .unwrap_or(DEFAULT_RESPONSE_HEADER_TIMEOUT);
    Ok(KedaEnv {
        proxy_port,
        admin_port,
        scaler_port,
        watch_namespace: get("KEDA_HTTP_WATCH_NAMESPACE"),
        cold_start_header,
        log_requests,
        defaults: Defaults {
            request: request.filter(|duration| !duration.is_zero()),
            response_header,
            readiness: condition_wait
                .filter(|duration| !duration.is_zero())
                .or(readiness.filter(|duration| !duration.is_zero())),
            max_pending: (max_pending > 0).then(|| u32::try_from(max_pending).unwrap_or(u32::MAX)),
        },
        shutdown_delay: shutdown_delay.unwrap_or(DEFAULT_SHUTDOWN_DELAY),
        drain_timeout: match drain_timeout {
            None => Some(DEFAULT_DRAIN_TIMEOUT),
            Some(zero) if zero.is_zero() => None,
            some => some,
        },
        stream_interval,
        max_idle_per_host: usize::try_from(max_idle_per_host).unwrap_or(usize::MAX),
        max_idle: (max_idle > 0).then(|| usize::try_from(max_idle).unwrap_or(usize::MAX)),
        connect_timeout: connect_timeout
            .filter(|duration| !duration.is_zero())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        peers: get("KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE").map(|namespace| {
            let service = get("KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE")
                .unwrap_or_else(|| DEFAULT_ADMIN_SERVICE.to_owned());
            (namespace, service, peers_port)
        }),
        metrics_port: metrics_enabled.then_some(metrics_port),
        tls,
        not_acted_on: NOT_ACTED_ON
            .iter()
            .copied()
            .filter(|key| get(key).is_some())
            .collect(),
    })
}

/// The version, suite and curve keys as the add-on reads them: the 0.15 name
/// (`KEDA_HTTP_PROXY_TLS_*`) when set, else 0.16's (`KEDA_HTTP_TLS_*`, the names problems are
/// reported under); a version also as `TLS12`/`TLS13` in any case (0.16's grammar); unset, Go's
/// server defaults (TLS 1.2 to 1.3), not Knative's TLS 1.3 only.
fn tls_settings(get: &impl Fn(&str) -> Option<String>) -> TlsSettings {
    settings::read(KEDA_HTTP, |key| {
        let old = key.replacen("KEDA_HTTP_TLS_", "KEDA_HTTP_PROXY_TLS_", 1);
        let value = get(&old).or_else(|| get(key));
        if key != KEDA_HTTP.min_version && key != KEDA_HTTP.max_version {
            return value;
        }
        match value {
            // Go's `tls.Config` minimum for a server.
            None if key == KEDA_HTTP.min_version => Some("1.2".into()),
            None => None,
            Some(value) => Some(match value.to_ascii_lowercase().as_str() {
                "tls12" => "1.2".into(),
                "tls13" => "1.3".into(),
                _ => value,
            }),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn parsed(pairs: &[(&str, &str)]) -> Result<KedaEnv, EnvErrors> {
        let env: BTreeMap<String, String> = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        parse(|key| env.get(key).cloned())
    }

    #[test]
    fn nothing_set_is_the_add_ons_chart() {
        let env = parsed(&[]).unwrap();
        assert_eq!(env.proxy_port, 8080);
        assert_eq!(env.admin_port, 9090);
        assert_eq!(env.scaler_port, DEFAULT_SCALER_PORT);
        assert_eq!(env.watch_namespace, None);
        assert!(env.cold_start_header);
        assert_eq!(env.defaults, Defaults::default());
        assert_eq!(env.shutdown_delay, Duration::from_secs(5));
        assert_eq!(env.drain_timeout, Some(Duration::from_secs(30)));
        assert_eq!(env.stream_interval, Duration::from_millis(200));
        assert_eq!(env.max_idle_per_host, 200);
        assert_eq!(env.metrics_port, Some(2223));
        let off = parsed(&[("OTEL_PROM_EXPORTER_ENABLED", "false")]).unwrap();
        assert_eq!(off.metrics_port, None);
        assert_eq!(
            env.peers, None,
            "one replica unless told where the others are"
        );
        assert!(env.not_acted_on.is_empty());
    }

    #[test]
    fn the_deprecated_condition_wait_timeout_wins_when_above_zero() {
        let both = parsed(&[
            ("KEDA_HTTP_READINESS_TIMEOUT", "10s"),
            ("KEDA_CONDITION_WAIT_TIMEOUT", "20s"),
        ])
        .unwrap();
        assert_eq!(both.defaults.readiness, Some(Duration::from_secs(20)));
        let new_only = parsed(&[("KEDA_HTTP_READINESS_TIMEOUT", "10s")]).unwrap();
        assert_eq!(new_only.defaults.readiness, Some(Duration::from_secs(10)));
        let zero = parsed(&[("KEDA_HTTP_READINESS_TIMEOUT", "0s")]).unwrap();
        assert_eq!(zero.defaults.readiness, None, "0 is no readiness bound");
    }

    #[test]
    fn the_deprecated_response_header_timeout_wins_when_above_zero() {
        let both = parsed(&[
            ("KEDA_HTTP_RESPONSE_HEADER_TIMEOUT", "10s"),
            ("KEDA_RESPONSE_HEADER_TIMEOUT", "20s"),
        ])
        .unwrap();
        assert_eq!(both.defaults.response_header, Duration::from_secs(20));
        let zero = parsed(&[
            ("KEDA_HTTP_RESPONSE_HEADER_TIMEOUT", "10s"),
            ("KEDA_RESPONSE_HEADER_TIMEOUT", "0s"),
        ])
        .unwrap();
        assert_eq!(zero.defaults.response_header, Duration::from_secs(10));
    }

    #[test]
    fn a_zero_request_timeout_is_none_and_keys_not_acted_on_are_named() {
        let env = parsed(&[
            ("KEDA_HTTP_REQUEST_TIMEOUT", "0s"),
            ("KEDA_HTTP_WATCH_NAMESPACE", "apps"),
            ("KEDA_HTTP_ENABLE_COLD_START_HEADER", "false"),
            ("KEDA_HTTP_LOG_REQUESTS", "true"),
            ("KEDA_HTTP_MAX_IDLE_CONNS", "10"),
            ("KEDA_HTTP_TLS_ENABLED", "true"),
        ])
        .unwrap();
        assert_eq!(env.defaults.request, None);
        assert_eq!(env.watch_namespace.as_deref(), Some("apps"));
        assert!(!env.cold_start_header);
        assert!(env.log_requests);
        assert_eq!(env.max_idle, Some(10));
        assert_eq!(env.not_acted_on, vec!["KEDA_HTTP_TLS_ENABLED"]);
    }

    #[test]
    fn the_replicas_are_found_where_the_add_ons_scaler_looks() {
        let env = parsed(&[
            ("KEDA_HTTP_ADMIN_PORT", "9095"),
            ("KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE", "keda"),
        ])
        .unwrap();
        assert_eq!(
            env.peers,
            Some(("keda".into(), DEFAULT_ADMIN_SERVICE.into(), 9095))
        );
    }

    #[test]
    fn every_bad_key_is_named() {
        let errors = parsed(&[
            ("KEDA_HTTP_PROXY_PORT", "80800"),
            ("KEDA_HTTP_REQUEST_TIMEOUT", "soon"),
            ("KEDA_HTTP_ENABLE_COLD_START_HEADER", "yes"),
            ("KEDA_HTTP_READINESS_TIMEOUT", "9999999999h"),
        ])
        .unwrap_err();
        let keys: Vec<&str> = errors.0.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            vec![
                "KEDA_HTTP_PROXY_PORT",
                "KEDA_HTTP_REQUEST_TIMEOUT",
                "KEDA_HTTP_READINESS_TIMEOUT",
                "KEDA_HTTP_ENABLE_COLD_START_HEADER"
            ]
        );
    }

    #[test]
    fn the_tls_port_is_read_as_the_add_on_reads_it_and_only_when_on() {
        let off = parsed(&[("KEDA_HTTP_TLS_MIN_VERSION", "1.1")]).unwrap();
        assert_eq!(off.tls, None, "off, and its settings not read");
        let on = parsed(&[("KEDA_HTTP_PROXY_TLS_ENABLED", "true")]).unwrap();
        let tls = on.tls.expect("on");
        assert_eq!(tls.port, 8443);
        assert_eq!(tls.cert, PathBuf::from("/certs/tls.crt"));
        assert_eq!(tls.key, PathBuf::from("/certs/tls.key"));
        assert!(tls.store_dirs.is_empty() && tls.ca_dirs.is_empty() && !tls.skip_verify);
        assert_eq!(
            tls.settings.min_version,
            Some(crate::tls::TlsVersion::Tls12),
            "Go's server minimum, not Knative's 1.3"
        );
        let tls = parsed(&[
            ("KEDA_HTTP_PROXY_TLS_ENABLED", "1"),
            ("KEDA_HTTP_PROXY_TLS_PORT", "9443"),
            ("KEDA_HTTP_PROXY_TLS_CERT_STORE_PATHS", "/a, /b,,"),
            ("KEDA_HTTP_TLS_CA_DIRS", "/cas"),
            // 0.16's name, and the 0.15 name that wins over it when set.
            ("KEDA_HTTP_TLS_MIN_VERSION", "1.2"),
            ("KEDA_HTTP_PROXY_TLS_MIN_VERSION", "TLS13"),
            ("KEDA_HTTP_TLS_SKIP_VERIFY", "false"),
            ("KEDA_HTTP_PROXY_TLS_SKIP_VERIFY", "true"),
        ])
        .unwrap()
        .tls
        .unwrap();
        assert_eq!(tls.port, 9443);
        assert_eq!(tls.store_dirs, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(tls.ca_dirs, [PathBuf::from("/cas")]);
        assert_eq!(
            tls.settings.min_version,
            Some(crate::tls::TlsVersion::Tls13)
        );
        assert!(tls.skip_verify);
        // A maximum of 1.2 leaves Go's default minimum something to serve.
        let capped = parsed(&[
            ("KEDA_HTTP_PROXY_TLS_ENABLED", "true"),
            ("KEDA_HTTP_TLS_MAX_VERSION", "tls12"),
        ])
        .unwrap();
        assert_eq!(
            capped.tls.unwrap().settings.max_version,
            Some(crate::tls::TlsVersion::Tls12)
        );
    }

    #[test]
    fn a_bad_tls_value_is_named_by_its_key_when_the_port_is_on() {
        let errors = parsed(&[
            ("KEDA_HTTP_PROXY_TLS_ENABLED", "yes"),
            ("KEDA_HTTP_PROXY_TLS_PORT", "0"),
        ])
        .unwrap_err();
        let keys: Vec<&str> = errors.0.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            ["KEDA_HTTP_PROXY_TLS_PORT", "KEDA_HTTP_PROXY_TLS_ENABLED"]
        );
        let errors = parsed(&[
            ("KEDA_HTTP_PROXY_TLS_ENABLED", "true"),
            ("KEDA_HTTP_TLS_CIPHER_SUITES", "TLS_RSA_WITH_RC4_128_SHA"),
            ("KEDA_HTTP_PROXY_TLS_MAX_VERSION", "1.4"),
        ])
        .unwrap_err();
        let keys: Vec<&str> = errors.0.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            ["KEDA_HTTP_TLS_MAX_VERSION", "KEDA_HTTP_TLS_CIPHER_SUITES"]
        );
    }

    #[test]
    fn drain_timeout_stream_interval_and_idle_cap_are_read_with_their_edges() {
        let env = parsed(&[
            ("KEDA_HTTP_DRAIN_TIMEOUT", "0s"),
            ("KEDA_HTTP_SCALER_STREAM_INTERVAL_MS", "1"),
            ("KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST", "0"),
        ])
        .unwrap();
        assert_eq!(env.drain_timeout, None, "0: every request finishes");
        assert_eq!(env.stream_interval, Duration::from_millis(1));
        assert_eq!(env.max_idle_per_host, 0);
        assert_eq!(parsed(&[]).unwrap().max_idle, Some(DEFAULT_MAX_IDLE));
        let no_cap = parsed(&[("KEDA_HTTP_MAX_IDLE_CONNS", "0")]).unwrap();
        assert_eq!(no_cap.max_idle, None, "Go's 0: no limit");
        let errors = parsed(&[
            ("KEDA_HTTP_DRAIN_TIMEOUT", "soon"),
            ("KEDA_HTTP_SCALER_STREAM_INTERVAL_MS", "0"),
            ("KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST", "-1"),
        ])
        .unwrap_err();
        let keys: Vec<&str> = errors.0.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            [
                "KEDA_HTTP_DRAIN_TIMEOUT",
                "KEDA_HTTP_SCALER_STREAM_INTERVAL_MS",
                "KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST"
            ]
        );
    }

    #[test]
    fn the_cold_start_cap_is_read_with_its_edges() {
        let cap = |value: &str| {
            parsed(&[("KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS", value)])
                .map(|env| env.defaults.max_pending)
        };
        assert_eq!(parsed(&[]).unwrap().defaults.max_pending, None);
        assert_eq!(
            cap("0").unwrap(),
            None,
            "the add-on's unlimited: the route's own bound"
        );
        assert_eq!(cap("25").unwrap(), Some(25));
        assert_eq!(cap("99999999999").unwrap(), Some(u32::MAX));
        let refused = cap("-1").unwrap_err();
        assert_eq!(refused.0[0].0, "KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS");
        assert!(cap("many").is_err());
    }
}
