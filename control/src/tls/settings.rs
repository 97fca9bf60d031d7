//! TLS server parameters in upstream's grammar: Knative 1.21.2+/1.22+'s
//! `QUEUE_PROXY_TLS_{MIN_VERSION,MAX_VERSION,CIPHER_SUITES,CURVE_PREFERENCES}` and
//! `ACTIVATOR_TLS_*` ([`QUEUE_PROXY`], [`ACTIVATOR`]), and the same words in the file's
//! `[listen.tls]` ([`FILE`]). `tls::server_config` applies them.
//!
//! Upstream (release-1.23): the reconciler always sets the queue-proxy's four keys, from
//! config-deployment's `queue-sidecar-tls-*` keys, unchecked, `""` when unset
//! (`pkg/reconciler/revision/resources/queue.go:432-442`); the activator's Deployment sets none.
//! Both read them with knative.dev/pkg's `tls.DefaultConfigFromEnv(prefix)`
//! (`pkg/queue/sharedmain/main.go:293-296`; `vendor/knative.dev/pkg/network/tls/config.go:40-156`;
//! `reference/tls.md` §2.1, §3):
//! * an empty value is the default: minimum TLS 1.3, no maximum, Go's suites and curves;
//! * a version is exactly `1.2` or `1.3`;
//! * a list is split at commas, each item trimmed, empty items skipped; a cipher suite is a
//!   name of Go's `tls.CipherSuites()` (the secure ones; [`CIPHER_SUITES`]), a curve one of
//!   [`CURVES`]; an unknown name is an error naming it.
//!
//! Upstream reads them only when TLS is on, and then an invalid value is fatal; with TLS off a
//! bad value never stops it. ★ A maximum below the minimum (say `QUEUE_PROXY_TLS_MAX_VERSION=1.2`
//! with the default minimum 1.3) is reported too: upstream starts with it and fails every
//! handshake.

/// The four keys of one reader, in the order reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    pub min_version: &'static str,
    pub max_version: &'static str,
    pub cipher_suites: &'static str,
    pub curve_preferences: &'static str,
}

/// The queue-proxy's environment (`DefaultConfigFromEnv("QUEUE_PROXY_")`).
pub const QUEUE_PROXY: Keys = Keys {
    min_version: "QUEUE_PROXY_TLS_MIN_VERSION",
    max_version: "QUEUE_PROXY_TLS_MAX_VERSION",
    cipher_suites: "QUEUE_PROXY_TLS_CIPHER_SUITES",
    curve_preferences: "QUEUE_PROXY_TLS_CURVE_PREFERENCES",
};

/// The activator's environment (`DefaultConfigFromEnv("ACTIVATOR_")`).
pub const ACTIVATOR: Keys = Keys {
    min_version: "ACTIVATOR_TLS_MIN_VERSION",
    max_version: "ACTIVATOR_TLS_MAX_VERSION",
    cipher_suites: "ACTIVATOR_TLS_CIPHER_SUITES",
    curve_preferences: "ACTIVATOR_TLS_CURVE_PREFERENCES",
};

/// KEDA's HTTP add-on's interceptor (0.16's `KEDA_HTTP_TLS_*` names; `keda::env` reads the
/// 0.15 names `KEDA_HTTP_PROXY_TLS_*` in their place when set, as the add-on does).
pub const KEDA_HTTP: Keys = Keys {
    min_version: "KEDA_HTTP_TLS_MIN_VERSION",
    max_version: "KEDA_HTTP_TLS_MAX_VERSION",
    cipher_suites: "KEDA_HTTP_TLS_CIPHER_SUITES",
    curve_preferences: "KEDA_HTTP_TLS_CURVE_PREFERENCES",
};

/// The file's `[listen.tls]` (lists there are arrays, joined with commas before reading).
pub const FILE: Keys = Keys {
    min_version: "listen.tls.min_version",
    max_version: "listen.tls.max_version",
    cipher_suites: "listen.tls.cipher_suites",
    curve_preferences: "listen.tls.curve_preferences",
};

/// Go's `tls.CipherSuites()` as of Go 1.24+ (serving 1.23 builds with Go 1.25, `go.mod:3`):
/// the TLS 1.3 suites, then the ECDHE ones. The RSA key-exchange, 3DES, RC4 and CBC-SHA256
/// suites are in `InsecureCipherSuites()` and refused by upstream's lookup.
pub const CIPHER_SUITES: [&str; 13] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

/// Upstream's curve names, each with the curve it means (`config.go` `curvesByName`): Go's
/// constant names and the standard ones.
pub const CURVES: [(&str, Curve); 8] = [
    ("CurveP256", Curve::P256),
    ("CurveP384", Curve::P384),
    ("CurveP521", Curve::P521),
    ("X25519", Curve::X25519),
    ("X25519MLKEM768", Curve::X25519Mlkem768),
    ("P-256", Curve::P256),
    ("P-384", Curve::P384),
    ("P-521", Curve::P521),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    fn label(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "1.2",
            TlsVersion::Tls13 => "1.3",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Curve {
    P256,
    P384,
    P521,
    X25519,
    X25519Mlkem768,
}

impl Curve {
    /// Its name in Go's standard spelling, for messages.
    pub fn go_name(self) -> &'static str {
        match self {
            Curve::P256 => "P-256",
            Curve::P384 => "P-384",
            Curve::P521 => "P-521",
            Curve::X25519 => "X25519",
            Curve::X25519Mlkem768 => "X25519MLKEM768",
        }
    }
}

/// The four settings as read; each `None` or empty list is upstream's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// Default (`None`): TLS 1.3.
    pub min_version: Option<TlsVersion>,
    /// Default (`None`): no maximum.
    pub max_version: Option<TlsVersion>,
    /// Names of [`CIPHER_SUITES`], in the order given; empty: Go's default.
    pub cipher_suites: Vec<&'static str>,
    /// In the order given; empty: Go's default.
    pub curve_preferences: Vec<Curve>,
    /// `(key, problem)` for each value upstream would refuse, and a maximum below the minimum.
    pub problems: Vec<(&'static str, String)>,
}

impl TlsSettings {
    /// Whether any of the four keys says something other than the default.
    pub fn is_default(&self) -> bool {
        self.min_version.is_none()
            && self.max_version.is_none()
            && self.cipher_suites.is_empty()
            && self.curve_preferences.is_empty()
    }
}

/// Reads the four keys through `lookup`; absent and empty are the default.
pub fn read(keys: Keys, lookup: impl Fn(&str) -> Option<String>) -> TlsSettings {
    let mut settings = TlsSettings::default();
    let present = |key| lookup(key).filter(|value: &String| !value.is_empty());
    for (key, slot) in [
        (keys.min_version, &mut settings.min_version),
        (keys.max_version, &mut settings.max_version),
    ] {
        if let Some(value) = present(key) {
            match value.as_str() {
                "1.2" => *slot = Some(TlsVersion::Tls12),
                "1.3" => *slot = Some(TlsVersion::Tls13),
                _ => settings
                    .problems
                    .push((key, format!("{value:?} is not a TLS version: 1.2 or 1.3"))),
            }
        }
    }
    if let Some(value) = present(keys.cipher_suites) {
        for name in list(&value) {
            match CIPHER_SUITES.iter().find(|suite| **suite == name) {
                Some(suite) => settings.cipher_suites.push(suite),
                None => settings.problems.push((
                    keys.cipher_suites,
                    format!(
                        "unknown cipher suite {name:?} (one of Go's secure suites: {})",
                        CIPHER_SUITES.join(", ")
                    ),
                )),
            }
        }
    }
    if let Some(value) = present(keys.curve_preferences) {
        for name in list(&value) {
            match CURVES.iter().find(|(curve, _)| *curve == name) {
                Some((_, curve)) => settings.curve_preferences.push(*curve),
                None => settings.problems.push((
                    keys.curve_preferences,
                    format!(
                        "unknown curve {name:?} (one of {})",
                        CURVES.map(|(name, _)| name).join(", ")
                    ),
                )),
            }
        }
    }
    let min = settings.min_version.unwrap_or(TlsVersion::Tls13);
    if let Some(max) = settings.max_version.filter(|max| *max < min) {
        settings.problems.push((
            keys.max_version,
            format!(
                "{} is below the minimum {}{}: no TLS version is left",
                max.label(),
                min.label(),
                if settings.min_version.is_none() {
                    " (the default)"
                } else {
                    ""
                }
            ),
        ));
    }
    settings
}

/// Upstream's list grammar: split at commas, trim each item, skip the empty ones.
fn list(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const MIN_VERSION: &str = QUEUE_PROXY.min_version;
    const MAX_VERSION: &str = QUEUE_PROXY.max_version;
    const CIPHER_SUITES_KEY: &str = QUEUE_PROXY.cipher_suites;
    const CURVE_PREFERENCES: &str = QUEUE_PROXY.curve_preferences;

    fn read_map(pairs: &[(&str, &str)]) -> TlsSettings {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        read(QUEUE_PROXY, |key| env.get(key).cloned())
    }

    #[test]
    fn empty_values_as_the_reconciler_sets_them_are_the_default() {
        let settings = read_map(&[
            (MIN_VERSION, ""),
            (MAX_VERSION, ""),
            (CIPHER_SUITES_KEY, ""),
            (CURVE_PREFERENCES, ""),
        ]);
        assert_eq!(settings, TlsSettings::default());
        assert!(settings.is_default());
        assert_eq!(read_map(&[]), TlsSettings::default());
    }

    #[test]
    fn values_in_upstreams_grammar_are_read() {
        let settings = read_map(&[
            (MIN_VERSION, "1.2"),
            (MAX_VERSION, "1.3"),
            (
                CIPHER_SUITES_KEY,
                " TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,,TLS_AES_128_GCM_SHA256 ,",
            ),
            (CURVE_PREFERENCES, "X25519, P-256,CurveP384,X25519MLKEM768"),
        ]);
        assert!(settings.problems.is_empty(), "{:?}", settings.problems);
        assert_eq!(settings.min_version, Some(TlsVersion::Tls12));
        assert_eq!(settings.max_version, Some(TlsVersion::Tls13));
        assert_eq!(
            settings.cipher_suites,
            [
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_AES_128_GCM_SHA256"
            ]
        );
        assert_eq!(
            settings.curve_preferences,
            [
                Curve::X25519,
                Curve::P256,
                Curve::P384,
                Curve::X25519Mlkem768
            ]
        );
        assert!(!settings.is_default());
        // Only separators: upstream's list is empty, which is the default here.
        assert!(read_map(&[(CIPHER_SUITES_KEY, " , ,")]).is_default());
    }

    #[test]
    fn values_upstream_refuses_are_named() {
        let table: &[(&str, &str, &str)] = &[
            (MIN_VERSION, "1.1", "\"1.1\" is not a TLS version"),
            (MIN_VERSION, "TLS1.3", "is not a TLS version"),
            (MIN_VERSION, " 1.3", "is not a TLS version"),
            (MAX_VERSION, "1.4", "is not a TLS version"),
            (
                CIPHER_SUITES_KEY,
                "TLS_RSA_WITH_AES_128_GCM_SHA256",
                "unknown cipher suite \"TLS_RSA_WITH_AES_128_GCM_SHA256\"",
            ),
            (
                CIPHER_SUITES_KEY,
                "tls_aes_128_gcm_sha256",
                "unknown cipher suite",
            ),
            (
                CURVE_PREFERENCES,
                "secp256r1",
                "unknown curve \"secp256r1\"",
            ),
            (CURVE_PREFERENCES, "x25519", "unknown curve"),
        ];
        for (key, value, problem) in table {
            let settings = read_map(&[(key, value)]);
            assert_eq!(settings.problems.len(), 1, "{key}={value:?}");
            let (named, said) = &settings.problems[0];
            assert_eq!(named, key);
            assert!(said.contains(problem), "{key}={value:?}: {said}");
        }
    }

    #[test]
    fn a_maximum_below_the_minimum_is_reported() {
        let settings = read_map(&[(MAX_VERSION, "1.2")]);
        assert_eq!(settings.problems.len(), 1);
        assert_eq!(settings.problems[0].0, MAX_VERSION);
        assert!(settings.problems[0].1.contains("1.3 (the default)"));
        assert!(read_map(&[(MIN_VERSION, "1.2"), (MAX_VERSION, "1.2")])
            .problems
            .is_empty());
    }
}
