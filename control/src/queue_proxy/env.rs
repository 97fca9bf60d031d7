//! `kactivator queue-proxy`'s configuration: the environment Knative's revision reconciler gives
//! its queue-proxy container, read with the rules upstream reads it with.
//!
//! Upstream (release-1.18 `pkg/queue/sharedmain/main.go`, `config`) decodes the environment with
//! envconfig (`reference/queue-proxy.md` §1.2): a *required* key must be present (an empty string
//! is a present string), a present number or boolean must parse, integers in Go's base-0 syntax
//! (`0x10`, `0o17`, `0b101`, `017`, `1_000` after a prefix), booleans as Go's `ParseBool`.
//! Every problem is reported at once, each naming its key, so one restart fixes them all.
//!
//! Differences, on purpose:
//! * `SERVING_LOGGING_CONFIG` and `SERVING_LOGGING_LEVEL` (required by 1.18) are optional: the
//!   zap configuration they carry has no meaning for this binary's logger, and later releases
//!   carry observability settings in `OBSERVABILITY_CONFIG` instead.
//! * Numbers are bounded where upstream's arithmetic would overflow or misbehave: ports are
//!   1..=65535 (upstream fails later, at listen), timeouts 0..=[`MAX_TIMEOUT_SECONDS`] (a
//!   negative timeout fires at once upstream), containerConcurrency at most [`MAX_CONCURRENCY`]
//!   (a negative one is "no limit", as upstream's `< 1`).
//!
//! Keys present that this binary does not act on are returned in
//! [`QueueProxyEnv::not_acted_on`] so start-up can say so; unknown keys are ignored, as envconfig
//! ignores them, so a newer reconciler's additions do not stop the container.

use std::net::IpAddr;

use kactivator_shards::routing::MAX_TIMEOUT_SECONDS;

/// Keys whose absence is an error (release-1.18's `required:"true"` fields, less the two logging
/// keys, see the module docs).
pub const REQUIRED: [&str; 10] = [
    "SERVING_NAMESPACE",
    "SERVING_CONFIGURATION",
    "SERVING_REVISION",
    "SERVING_POD",
    "SERVING_POD_IP",
    "QUEUE_SERVING_PORT",
    "QUEUE_SERVING_TLS_PORT",
    "USER_PORT",
    "CONTAINER_CONCURRENCY",
    "REVISION_TIMEOUT_SECONDS",
];

/// Keys Knative sets that are read and checked but change nothing here (yet): each is named in
/// the log at start-up when present with a non-default value, and in the README.
pub const NOT_ACTED_ON: [&str; 20] = [
    "SERVING_LOGGING_CONFIG",
    "SERVING_LOGGING_LEVEL",
    "SERVING_ENABLE_REQUEST_LOG",
    "SERVING_REQUEST_LOG_TEMPLATE",
    "SERVING_ENABLE_PROBE_REQUEST_LOG",
    "SERVING_REQUEST_METRICS_BACKEND",
    "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
    "METRICS_COLLECTOR_ADDRESS",
    "METRICS_DOMAIN",
    "TRACING_CONFIG_BACKEND",
    "TRACING_CONFIG_ZIPKIN_ENDPOINT",
    "TRACING_CONFIG_DEBUG",
    "TRACING_CONFIG_SAMPLE_RATE",
    "ENABLE_PROFILING",
    "ENABLE_HTTP2_AUTO_DETECTION",
    "ENABLE_HTTP_FULL_DUPLEX",
    "ENABLE_MULTI_CONTAINER_PROBES",
    "OBSERVABILITY_CONFIG",
    "SYSTEM_NAMESPACE",
    "ROOT_CA",
];

/// The largest containerConcurrency accepted: Knative's own ceiling is
/// `container-concurrency-max-limit` (1000 by default); the breaker's queue is ten times this.
pub const MAX_CONCURRENCY: u64 = 1 << 20;

/// The queue-proxy's settings, as read from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueProxyEnv {
    pub namespace: String,
    pub configuration: String,
    pub revision: String,
    /// `SERVING_SERVICE`; may be empty (a revision without a Service).
    pub service: String,
    pub pod: String,
    pub pod_ip: Option<IpAddr>,
    /// `QUEUE_SERVING_PORT`: the data port (8012, or 8013 for an `h2c` user port).
    pub serving_port: u16,
    /// `QUEUE_SERVING_TLS_PORT`: read and checked; TLS is not served (see README).
    pub tls_port: u16,
    /// `USER_PORT`: the user container, always at `127.0.0.1`.
    pub user_port: u16,
    /// 0 = no limit (upstream: any value below 1).
    pub container_concurrency: u32,
    pub timeout_seconds: u64,
    /// 0 = off.
    pub response_start_timeout_seconds: u64,
    /// 0 = off.
    pub idle_timeout_seconds: u64,
    /// `SERVING_READINESS_PROBE`, undecoded; empty or absent = always ready.
    pub readiness_probe: String,
    /// `ACTIVATOR_SERVICE_URL` (the fork's push side), when set and non-empty.
    pub activator_service_url: Option<String>,
    /// Keys of [`NOT_ACTED_ON`] that are present with a value.
    pub not_acted_on: Vec<&'static str>,
}

/// What is wrong with the environment: every missing key and every bad value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvError {
    pub missing: Vec<&'static str>,
    /// `(key, problem)`.
    pub invalid: Vec<(&'static str, String)>,
}

impl std::fmt::Display for EnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "queue-proxy environment:")?;
        if !self.missing.is_empty() {
            write!(f, " missing {}", self.missing.join(", "))?;
            if !self.invalid.is_empty() {
                write!(f, ";")?;
            }
        }
        for (index, (key, problem)) in self.invalid.iter().enumerate() {
            let separator = if index == 0 { "" } else { ";" };
            write!(f, "{separator} {key}: {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for EnvError {}

/// Reads the settings through `lookup` (the process environment in production, a map in tests).
pub fn parse(lookup: impl Fn(&str) -> Option<String>) -> Result<QueueProxyEnv, EnvError> {
    let mut reader = Reader {
        lookup: &lookup,
        error: EnvError {
            missing: Vec::new(),
            invalid: Vec::new(),
        },
    };
    for key in REQUIRED {
        if lookup(key).is_none() {
            reader.error.missing.push(key);
        }
    }
    let pod_ip = reader.string("SERVING_POD_IP");
    let pod_ip = match pod_ip.trim() {
        // Present but empty is accepted upstream (it is only a log field there).
        "" => None,
        text => match text.parse() {
            Ok(ip) => Some(ip),
            Err(_) => {
                reader.invalid("SERVING_POD_IP", format!("{text:?} is not an IP address"));
                None
            }
        },
    };
    let env = QueueProxyEnv {
        namespace: reader.string("SERVING_NAMESPACE"),
        configuration: reader.string("SERVING_CONFIGURATION"),
        revision: reader.string("SERVING_REVISION"),
        service: reader.string("SERVING_SERVICE"),
        pod: reader.string("SERVING_POD"),
        pod_ip,
        serving_port: reader.port("QUEUE_SERVING_PORT"),
        tls_port: reader.port("QUEUE_SERVING_TLS_PORT"),
        user_port: reader.port("USER_PORT"),
        container_concurrency: reader.concurrency("CONTAINER_CONCURRENCY"),
        timeout_seconds: reader.seconds("REVISION_TIMEOUT_SECONDS"),
        response_start_timeout_seconds: reader.seconds("REVISION_RESPONSE_START_TIMEOUT_SECONDS"),
        idle_timeout_seconds: reader.seconds("REVISION_IDLE_TIMEOUT_SECONDS"),
        readiness_probe: reader.string("SERVING_READINESS_PROBE"),
        activator_service_url: Some(reader.string("ACTIVATOR_SERVICE_URL"))
            .filter(|url| !url.trim().is_empty()),
        not_acted_on: NOT_ACTED_ON
            .into_iter()
            .filter(|key| lookup(key).is_some_and(|value| !value.is_empty()))
            .collect(),
    };
    for key in [
        "SERVING_ENABLE_REQUEST_LOG",
        "SERVING_ENABLE_PROBE_REQUEST_LOG",
        "ENABLE_PROFILING",
        "ENABLE_HTTP2_AUTO_DETECTION",
        "ENABLE_HTTP_FULL_DUPLEX",
        "ENABLE_MULTI_CONTAINER_PROBES",
        "TRACING_CONFIG_DEBUG",
    ] {
        if let Some(value) = lookup(key) {
            if go_bool(&value).is_none() {
                reader.invalid(key, format!("{value:?} is not a boolean"));
            }
        }
    }
    if let Some(value) = lookup("SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS") {
        if go_int(&value).is_none() {
            reader.invalid(
                "SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS",
                format!("{value:?} is not an integer"),
            );
        }
    }
    if reader.error.missing.is_empty() && reader.error.invalid.is_empty() {
        Ok(env)
    } else {
        Err(reader.error)
    }
}

struct Reader<'a, F: Fn(&str) -> Option<String>> {
    lookup: &'a F,
    error: EnvError,
}

impl<F: Fn(&str) -> Option<String>> Reader<'_, F> {
    fn invalid(&mut self, key: &'static str, problem: String) {
        self.error.invalid.push((key, problem));
    }

    fn string(&mut self, key: &'static str) -> String {
        (self.lookup)(key).unwrap_or_default()
    }

    /// A present integer; `None` when absent (a missing required key is reported elsewhere).
    fn integer(&mut self, key: &'static str) -> Option<i128> {
        let value = (self.lookup)(key)?;
        let parsed = go_int(&value);
        if parsed.is_none() {
            self.invalid(key, format!("{value:?} is not an integer"));
        }
        parsed
    }

    fn port(&mut self, key: &'static str) -> u16 {
        // Upstream keeps ports as strings and fails at listen; a clear error now is kinder.
        let Some(value) = (self.lookup)(key) else {
            return 0;
        };
        match value.trim().parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => {
                self.invalid(key, format!("{value:?} is not a port (1 to 65535)"));
                0
            }
        }
    }

    fn seconds(&mut self, key: &'static str) -> u64 {
        match self.integer(key) {
            None => 0,
            Some(seconds) if (0..=i128::from(MAX_TIMEOUT_SECONDS)).contains(&seconds) => {
                seconds as u64
            }
            Some(seconds) => {
                self.invalid(
                    key,
                    format!("{seconds} is outside 0 to {MAX_TIMEOUT_SECONDS} seconds"),
                );
                0
            }
        }
    }

    fn concurrency(&mut self, key: &'static str) -> u32 {
        match self.integer(key) {
            None => 0,
            // Upstream: any value below 1 means no breaker.
            Some(value) if value < 1 => 0,
            Some(value) if value <= i128::from(MAX_CONCURRENCY) => value as u32,
            Some(value) => {
                self.invalid(key, format!("{value} is above {MAX_CONCURRENCY}"));
                0
            }
        }
    }
}

/// Go's `strconv.ParseInt(text, 0, 64)`: optional sign, then decimal, `0x`/`0o`/`0b`-prefixed,
/// or `0`-prefixed octal; underscores only between digits and only with a prefix. `None` when
/// it does not parse or leaves the 64-bit range (as Go's range error).
pub fn go_int(text: &str) -> Option<i128> {
    let (negative, body) = match text.as_bytes().first()? {
        b'+' => (false, &text[1..]),
        b'-' => (true, &text[1..]),
        _ => (false, text),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest.to_string(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_string(), true)
    } else {
        (10, lower.clone(), false)
    };
    if digits.is_empty() {
        return None;
    }
    if digits.contains('_') {
        // Go: underscores only in base-prefixed literals, each between two digits (or right
        // after the prefix).
        if !prefixed || digits.ends_with('_') || digits.contains("__") {
            return None;
        }
    }
    let cleaned: String = digits.chars().filter(|c| *c != '_').collect();
    let magnitude = i128::from_str_radix(&cleaned, radix).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    (i128::from(i64::MIN)..=i128::from(i64::MAX))
        .contains(&value)
        .then_some(value)
}

/// Go's `strconv.ParseBool`.
pub fn go_bool(text: &str) -> Option<bool> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// What Knative 1.18's reconciler sets for a revision with CC 10 (`queue.go:354-469`).
    fn knative() -> HashMap<&'static str, String> {
        [
            ("SERVING_NAMESPACE", "default"),
            ("SERVING_SERVICE", "hello"),
            ("SERVING_CONFIGURATION", "hello"),
            ("SERVING_REVISION", "hello-00001"),
            ("SERVING_POD", "hello-00001-deployment-abc"),
            ("SERVING_POD_IP", "10.0.0.7"),
            ("QUEUE_SERVING_PORT", "8012"),
            ("QUEUE_SERVING_TLS_PORT", "8112"),
            ("USER_PORT", "8080"),
            ("CONTAINER_CONCURRENCY", "10"),
            ("REVISION_TIMEOUT_SECONDS", "300"),
            ("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "0"),
            ("REVISION_IDLE_TIMEOUT_SECONDS", "0"),
            (
                "SERVING_READINESS_PROBE",
                r#"{"tcpSocket":{"port":8080,"host":"127.0.0.1"},"successThreshold":1}"#,
            ),
            ("SERVING_LOGGING_CONFIG", "{}"),
            ("SERVING_LOGGING_LEVEL", ""),
            ("SERVING_REQUEST_METRICS_BACKEND", "prometheus"),
            ("ENABLE_HTTP2_AUTO_DETECTION", "false"),
            ("SOME_KEY_OF_A_LATER_RELEASE", "whatever"),
        ]
        .into_iter()
        .map(|(key, value)| (key, value.to_string()))
        .collect()
    }

    fn parse_map(env: &HashMap<&'static str, String>) -> Result<QueueProxyEnv, EnvError> {
        parse(|key| env.get(key).cloned())
    }

    #[test]
    fn knatives_environment_reads_as_set() {
        let env = parse_map(&knative()).expect("valid");
        assert_eq!(env.namespace, "default");
        assert_eq!(env.revision, "hello-00001");
        assert_eq!(env.pod_ip, Some("10.0.0.7".parse().unwrap()));
        assert_eq!(
            (env.serving_port, env.tls_port, env.user_port),
            (8012, 8112, 8080)
        );
        assert_eq!(env.container_concurrency, 10);
        assert_eq!(env.timeout_seconds, 300);
        assert!(env.readiness_probe.contains("tcpSocket"));
        assert_eq!(env.activator_service_url, None);
        assert_eq!(
            env.not_acted_on,
            vec![
                "SERVING_LOGGING_CONFIG",
                "SERVING_REQUEST_METRICS_BACKEND",
                "ENABLE_HTTP2_AUTO_DETECTION"
            ]
        );
    }

    #[test]
    fn every_missing_key_is_named_at_once_and_empty_strings_count_as_present() {
        let error = parse(|_| None).unwrap_err();
        assert_eq!(error.missing, REQUIRED.to_vec());
        let text = error.to_string();
        assert!(text.contains("missing SERVING_NAMESPACE, SERVING_CONFIGURATION"));

        let mut env = knative();
        env.remove("USER_PORT");
        env.remove("SERVING_REVISION");
        env.insert("SERVING_CONFIGURATION", String::new());
        let error = parse_map(&env).unwrap_err();
        assert_eq!(error.missing, vec!["SERVING_REVISION", "USER_PORT"]);
        assert!(error.invalid.is_empty());
    }

    #[test]
    fn numbers_parse_as_go_does_and_are_bounded() {
        let table: [(&str, Option<i128>); 16] = [
            ("10", Some(10)),
            ("+7", Some(7)),
            ("-1", Some(-1)),
            ("0x10", Some(16)),
            ("0X1f", Some(31)),
            ("0o17", Some(15)),
            ("017", Some(15)),
            ("0b101", Some(5)),
            ("0x_1_0", Some(16)),
            ("0", Some(0)),
            ("", None),
            ("1_000", None),
            ("0x", None),
            (" 5", None),
            ("9223372036854775808", None),
            ("-9223372036854775808", Some(i128::from(i64::MIN))),
        ];
        for (text, expected) in table {
            assert_eq!(go_int(text), expected, "{text:?}");
        }

        let mut env = knative();
        env.insert("CONTAINER_CONCURRENCY", "-3".into());
        assert_eq!(parse_map(&env).unwrap().container_concurrency, 0);
        env.insert("CONTAINER_CONCURRENCY", "0x10".into());
        assert_eq!(parse_map(&env).unwrap().container_concurrency, 16);

        env.insert("CONTAINER_CONCURRENCY", "99999999999".into());
        env.insert("REVISION_TIMEOUT_SECONDS", "18446744073709551615".into());
        env.insert("REVISION_IDLE_TIMEOUT_SECONDS", "-5".into());
        env.insert("USER_PORT", "70000".into());
        env.insert("SERVING_POD_IP", "not-an-ip".into());
        env.insert("ENABLE_HTTP_FULL_DUPLEX", "yes".into());
        env.insert("REVISION_RESPONSE_START_TIMEOUT_SECONDS", "".into());
        let error = parse_map(&env).unwrap_err();
        let keys: Vec<&str> = error.invalid.iter().map(|(key, _)| *key).collect();
        assert_eq!(
            keys,
            vec![
                "SERVING_POD_IP",
                "USER_PORT",
                "CONTAINER_CONCURRENCY",
                "REVISION_TIMEOUT_SECONDS",
                "REVISION_RESPONSE_START_TIMEOUT_SECONDS",
                "REVISION_IDLE_TIMEOUT_SECONDS",
                "ENABLE_HTTP_FULL_DUPLEX",
            ]
        );
        assert!(error.missing.is_empty());
        assert!(error
            .to_string()
            .contains("USER_PORT: \"70000\" is not a port"));
    }

    #[test]
    fn booleans_parse_as_go_does() {
        for text in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(go_bool(text), Some(true));
        }
        for text in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(go_bool(text), Some(false));
        }
        for text in ["", "yes", "tRUE", " true"] {
            assert_eq!(go_bool(text), None);
        }
    }
}
