//! The environment of KEDA's HTTP add-on's interceptor and scaler (`interceptor/config/` and
//! `scaler/config.go` at v0.15.0), as `kactivator keda-http` reads it: the same keys, so that
//! the add-on's Deployments' environment carries over. Pure: a lookup function in, the
//! settings or every bad key out. Keys the add-on has and this role does not act on are named
//! in [`NOT_ACTED_ON`], and said at start-up when set.

use std::time::Duration;

use super::model::{Defaults, DEFAULT_RESPONSE_HEADER_TIMEOUT};
use crate::features::parse_duration;
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

/// Keys of the add-on this role reads and does not act on (yet); each is said at start-up
/// when set, so that nothing is silently ignored.
pub const NOT_ACTED_ON: [&str; 8] = [
    "KEDA_HTTP_PROXY_TLS_ENABLED",
    "KEDA_HTTP_TLS_ENABLED",
    "KEDA_HTTP_LOG_REQUESTS",
    "KEDA_HTTP_DRAIN_TIMEOUT",
    "KEDA_HTTP_MAX_IDLE_CONNS",
    "KEDA_HTTP_MAX_IDLE_CONNS_PER_HOST",
    "KEDA_HTTP_COLD_START_MAX_PENDING_REQUESTS",
    "KEDA_HTTP_SCALER_STREAM_INTERVAL_MS",
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
    pub defaults: Defaults,
    pub shutdown_delay: Duration,
    pub connect_timeout: Duration,
    /// Where the other replicas are listed: `KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE`,
    /// `_SERVICE` (the add-on's admin Service by default) and `_PORT` (the admin port by
    /// default), as the add-on's scaler reads them; `None` without a namespace: this replica
    /// answers KEDA with its own counts only.
    pub peers: Option<(String, String, u16)>,
    /// Keys of [`NOT_ACTED_ON`] that are set.
    pub not_acted_on: Vec<&'static str>,
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
        defaults: Defaults {
            request: request.filter(|duration| !duration.is_zero()),
            response_header,
            readiness: condition_wait
                .filter(|duration| !duration.is_zero())
                .or(readiness.filter(|duration| !duration.is_zero())),
        },
        shutdown_delay: shutdown_delay.unwrap_or(DEFAULT_SHUTDOWN_DELAY),
        connect_timeout: connect_timeout
            .filter(|duration| !duration.is_zero())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        peers: get("KEDA_HTTP_SCALER_TARGET_ADMIN_NAMESPACE").map(|namespace| {
            let service = get("KEDA_HTTP_SCALER_TARGET_ADMIN_SERVICE")
                .unwrap_or_else(|| DEFAULT_ADMIN_SERVICE.to_owned());
            (namespace, service, peers_port)
        }),
        not_acted_on: NOT_ACTED_ON
            .iter()
            .copied()
            .filter(|key| get(key).is_some())
            .collect(),
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
        ])
        .unwrap();
        assert_eq!(env.defaults.request, None);
        assert_eq!(env.watch_namespace.as_deref(), Some("apps"));
        assert!(!env.cold_start_header);
        assert_eq!(env.not_acted_on, vec!["KEDA_HTTP_LOG_REQUESTS"]);
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
}
