//! Feature gates in the `config-features` style: `queueproxy.pod-authority` and
//! `activator.pod-quarantine`, each `enabled` or `disabled` (any case). The standalone file's
//! `[features]` table and, later, the `config-features` ConfigMap both go through [`resolve`].

use std::collections::BTreeMap;

use crate::pod_state::Gates;

/// The queue-proxy authority gate.
pub const POD_AUTHORITY: &str = "queueproxy.pod-authority";
/// The quarantine gate.
pub const POD_QUARANTINE: &str = "activator.pod-quarantine";

/// The gates `features` asks for. A missing key means the default (`enabled`); a value other
/// than `enabled`/`disabled` keeps `previous`'s setting and yields a warning. Keys that are not
/// ours are left to their owners (the ConfigMap holds every Knative feature).
pub fn resolve(features: &BTreeMap<String, String>, previous: Gates) -> (Gates, Vec<String>) {
    let mut warnings = Vec::new();
    let mut read = |key: &str, previous: bool| match features.get(key) {
        None => true,
        Some(value) => match value.trim().to_ascii_lowercase().as_str() {
            "enabled" => true,
            "disabled" => false,
            _ => {
                warnings.push(format!(
                    "feature {key}: {value:?} is neither \"enabled\" nor \"disabled\"; keeping {}",
                    if previous { "enabled" } else { "disabled" }
                ));
                previous
            }
        },
    };
    let gates = Gates {
        pod_authority: read(POD_AUTHORITY, previous.pod_authority),
        pod_quarantine: read(POD_QUARANTINE, previous.pod_quarantine),
    };
    (gates, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn both_gates_default_to_enabled() {
        assert_eq!(
            resolve(&features(&[]), Gates::MINIMAL),
            (Gates::HYBRID, vec![])
        );
    }

    #[test]
    fn values_are_case_insensitive_and_all_four_modes_are_reachable() {
        for (authority, quarantine, expected) in [
            ("Enabled", "ENABLED", Gates::HYBRID),
            ("enabled", "Disabled", Gates::QUEUE_PROXY_ONLY),
            ("DISABLED", "enabled", Gates::QUARANTINE_ONLY),
            ("disabled", " disabled ", Gates::MINIMAL),
        ] {
            let (gates, warnings) = resolve(
                &features(&[(POD_AUTHORITY, authority), (POD_QUARANTINE, quarantine)]),
                Gates::HYBRID,
            );
            assert_eq!(gates, expected);
            assert!(warnings.is_empty());
        }
    }

    #[test]
    fn a_bad_value_keeps_the_previous_setting_with_a_warning() {
        let (gates, warnings) = resolve(
            &features(&[(POD_AUTHORITY, "yes"), (POD_QUARANTINE, "disabled")]),
            Gates::QUARANTINE_ONLY,
        );
        assert_eq!(
            gates,
            Gates::MINIMAL,
            "authority stays off, quarantine turns off"
        );
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("queueproxy.pod-authority"),
            "{warnings:?}"
        );
    }

    #[test]
    fn other_features_are_ignored() {
        let (gates, warnings) = resolve(
            &features(&[("kubernetes.podspec-affinity", "enabled")]),
            Gates::HYBRID,
        );
        assert_eq!(gates, Gates::HYBRID);
        assert!(warnings.is_empty());
    }
}
