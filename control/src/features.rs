//! Feature gates in the `config-features` style: `queueproxy.pod-authority` and
//! `activator.pod-quarantine`, each `enabled` or `disabled` (any case). The standalone file's
//! `[features]` table and the `config-features` ConfigMap both go through [`resolve`].
//!
//! In Kubernetes mode the ConfigMap may also carry cluster-wide tunables under `activator.*`
//! keys ([`Tunables`], read by [`resolve_tunables`]); a key that is absent means the value the
//! flags and file give.

use std::collections::BTreeMap;
use std::time::Duration;

use kactivator_shards::routing::LbPolicy;

use crate::pod_state::Gates;

/// The queue-proxy authority gate.
pub const POD_AUTHORITY: &str = "queueproxy.pod-authority";
/// The quarantine gate.
pub const POD_QUARANTINE: &str = "activator.pod-quarantine";
/// Every gate; the keys the standalone file's `[features]` accepts.
pub const GATES: [&str; 2] = [POD_AUTHORITY, POD_QUARANTINE];

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
                    "feature {key}: {} is neither \"enabled\" nor \"disabled\"; keeping {}",
                    quoted(value),
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

/// `activator.queue-depth`: most requests waiting per revision (a whole number ≥ 1).
pub const QUEUE_DEPTH: &str = "activator.queue-depth";
/// `activator.load-balancing-policy`: the policy of revisions that choose none
/// (`random-choice-2`, `first-available`, `round-robin`, `least-connections`; empty for
/// upstream's rule by containerConcurrency).
pub const LOAD_BALANCING_POLICY: &str = "activator.load-balancing-policy";
/// Shortest backend probe timeout or interval accepted (`activator.probe-timeout`,
/// `activator.probe-interval`, `PROBE_TIMEOUT`, `PROBE_FREQUENCY`): 1 ms. Shorter ones are
/// refused rather than spinning the control thread.
pub const MIN_PROBE_DURATION: Duration = Duration::from_millis(1);
/// Longest backend probe timeout or interval accepted: one hour. Longer ones are refused, so
/// that every timer computed from one stays far inside what an `Instant` holds (a duration
/// can say `9223372036854775807s`, and adding that to now panics).
pub const MAX_PROBE_DURATION: Duration = Duration::from_secs(3600);

/// `activator.probe-timeout`: how long one backend probe may take (a Go duration, `300ms`).
pub const PROBE_TIMEOUT: &str = "activator.probe-timeout";
/// `activator.probe-interval`: time between probes of a pod not yet confirmed (`200ms`).
pub const PROBE_INTERVAL: &str = "activator.probe-interval";
/// `activator.max-queued-requests`: most requests waiting over all revisions (≥ 1).
pub const MAX_QUEUED_REQUESTS: &str = "activator.max-queued-requests";

/// The tunables `config-features` may set cluster-wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tunables {
    /// Per-revision queue bound.
    pub queue_depth: u32,
    /// The default load-balancing policy; `None` is upstream's rule by containerConcurrency.
    pub lb_policy: Option<LbPolicy>,
    /// One backend probe's timeout (each probe has its own, never one per round).
    pub probe_timeout: Duration,
    /// Time between probes of a pod not yet confirmed.
    pub probe_interval: Duration,
    /// The process-wide cap on waiting requests, as asked: the state worker lowers it to what
    /// the memory limit holds (`state::Limits::queue_ceiling`).
    pub max_queued_requests: u32,
}

/// The tunables `data` asks for: an absent key takes `defaults`' value; a bad value keeps
/// `previous`' and yields a warning naming the key.
pub fn resolve_tunables(
    data: &BTreeMap<String, String>,
    defaults: &Tunables,
    previous: &Tunables,
) -> (Tunables, Vec<String>) {
    let mut warnings = Vec::new();
    let tunables = Tunables {
        queue_depth: setting(
            data,
            QUEUE_DEPTH,
            count,
            defaults.queue_depth,
            previous.queue_depth,
            &mut warnings,
        ),
        lb_policy: setting(
            data,
            LOAD_BALANCING_POLICY,
            policy,
            defaults.lb_policy,
            previous.lb_policy,
            &mut warnings,
        ),
        probe_timeout: setting(
            data,
            PROBE_TIMEOUT,
            probe_duration,
            defaults.probe_timeout,
            previous.probe_timeout,
            &mut warnings,
        ),
        probe_interval: setting(
            data,
            PROBE_INTERVAL,
            probe_duration,
            defaults.probe_interval,
            previous.probe_interval,
            &mut warnings,
        ),
        max_queued_requests: setting(
            data,
            MAX_QUEUED_REQUESTS,
            count,
            defaults.max_queued_requests,
            previous.max_queued_requests,
            &mut warnings,
        ),
    };
    (tunables, warnings)
}

/// One key: absent → `default`; readable → its value; unreadable → `previous`, with a warning.
fn setting<T: Copy>(
    data: &BTreeMap<String, String>,
    key: &str,
    parse: fn(&str) -> Result<T, &'static str>,
    default: T,
    previous: T,
    warnings: &mut Vec<String>,
) -> T {
    let Some(value) = data.get(key) else {
        return default;
    };
    parse(value.trim()).unwrap_or_else(|why| {
        warnings.push(format!(
            "feature {key}: {} {why}; keeping the previous value",
            quoted(value)
        ));
        previous
    })
}

/// Most characters of a value quoted in a warning: a ConfigMap value can hold a megabyte.
const QUOTED_MAX_CHARS: usize = 64;

/// `value` as a warning quotes it, cut to [`QUOTED_MAX_CHARS`] characters.
fn quoted(value: &str) -> String {
    match value.char_indices().nth(QUOTED_MAX_CHARS) {
        Some((cut, _)) => format!("{:?}… ({} bytes)", &value[..cut], value.len()),
        None => format!("{value:?}"),
    }
}

fn count(text: &str) -> Result<u32, &'static str> {
    text.parse::<u32>()
        .ok()
        .filter(|&count| count >= 1)
        .ok_or("is not a whole number of at least 1")
}

/// A Go duration from [`MIN_PROBE_DURATION`] to [`MAX_PROBE_DURATION`], for a backend probe's
/// timeout or interval; the error completes a sentence starting with the value.
pub fn probe_duration(text: &str) -> Result<Duration, &'static str> {
    let duration = parse_duration(text)
        .filter(|duration| !duration.is_zero())
        .ok_or("is not a positive duration such as \"300ms\" or \"1.5s\"")?;
    if duration < MIN_PROBE_DURATION {
        return Err("is shorter than the shortest probe duration, 1ms");
    }
    if duration > MAX_PROBE_DURATION {
        return Err("is longer than the longest probe duration, 1h");
    }
    Ok(duration)
}

fn policy(text: &str) -> Result<Option<LbPolicy>, &'static str> {
    if text.is_empty() {
        return Ok(None);
    }
    LbPolicy::parse(text)
        .map(Some)
        .ok_or("is not one of random-choice-2, first-available, round-robin, least-connections")
}

/// A duration as Go writes one (`300ms`, `1.5s`, `1m30s`; units `ns`, `us`/`µs`, `ms`, `s`,
/// `m`, `h`), as upstream's `PROBE_TIMEOUT` and `PROBE_FREQUENCY` take them. `None` when it is
/// not one.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += number * seconds_per_unit;
    }
    Duration::try_from_secs_f64(total).ok()
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

    fn tunables() -> Tunables {
        Tunables {
            queue_depth: 100,
            lb_policy: None,
            probe_timeout: Duration::from_millis(300),
            probe_interval: Duration::from_millis(200),
            max_queued_requests: 1000,
        }
    }

    #[test]
    fn tunables_read_their_keys_and_an_absent_key_is_the_default() {
        let defaults = tunables();
        let previous = Tunables {
            queue_depth: 7,
            ..defaults
        };
        let (read, warnings) = resolve_tunables(
            &features(&[
                (QUEUE_DEPTH, "50"),
                (LOAD_BALANCING_POLICY, "least-connections"),
                (PROBE_TIMEOUT, "1.5s"),
                (PROBE_INTERVAL, " 50ms "),
                (MAX_QUEUED_REQUESTS, "20"),
            ]),
            &defaults,
            &previous,
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            read,
            Tunables {
                queue_depth: 50,
                lb_policy: Some(LbPolicy::LeastConnections),
                probe_timeout: Duration::from_millis(1500),
                probe_interval: Duration::from_millis(50),
                max_queued_requests: 20,
            }
        );
        let (read, _) = resolve_tunables(&features(&[]), &defaults, &previous);
        assert_eq!(read, defaults, "a removed key goes back to the default");
    }

    #[test]
    fn a_bad_tunable_keeps_the_previous_value_and_says_which_key() {
        let defaults = tunables();
        let previous = Tunables {
            queue_depth: 7,
            probe_timeout: Duration::from_secs(2),
            ..defaults
        };
        let (read, warnings) = resolve_tunables(
            &features(&[
                (QUEUE_DEPTH, "0"),
                (PROBE_TIMEOUT, "fast"),
                (LOAD_BALANCING_POLICY, "random"),
            ]),
            &defaults,
            &previous,
        );
        assert_eq!(read, previous);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].contains(QUEUE_DEPTH), "{warnings:?}");
    }

    /// Values at the edge of their type: what each key takes and what it refuses.
    #[test]
    fn tunables_at_the_edges_of_their_types() {
        let defaults = tunables();
        let huge = "9".repeat(1 << 20);
        for (key, value, accepted) in [
            (QUEUE_DEPTH, "4294967295", true),
            (QUEUE_DEPTH, "4294967296", false),
            (QUEUE_DEPTH, "18446744073709551615", false),
            (QUEUE_DEPTH, "-1", false),
            (QUEUE_DEPTH, "0", false),
            (QUEUE_DEPTH, huge.as_str(), false),
            (MAX_QUEUED_REQUESTS, "4294967295", true),
            (MAX_QUEUED_REQUESTS, "-9223372036854775808", false),
            (MAX_QUEUED_REQUESTS, "0", false),
            (PROBE_TIMEOUT, "1h", true),
            (PROBE_TIMEOUT, "1h0m0.001s", false),
            (PROBE_TIMEOUT, "2562047h", false),
            (PROBE_INTERVAL, "9223372036854775807s", false),
            (PROBE_TIMEOUT, "18446744073709551615s", false),
            (PROBE_TIMEOUT, huge.as_str(), false),
            (PROBE_TIMEOUT, "1ms", true),
            (PROBE_TIMEOUT, "999us", false),
            (PROBE_TIMEOUT, "1ns", false),
            (PROBE_TIMEOUT, "0s", false),
            (PROBE_INTERVAL, "3600s", true),
            (PROBE_INTERVAL, "100000000000h", false),
            (PROBE_INTERVAL, "0.5ns", false),
        ] {
            let (read, warnings) =
                resolve_tunables(&features(&[(key, value)]), &defaults, &defaults);
            let shown = &value[..value.len().min(24)];
            if accepted {
                assert!(warnings.is_empty(), "{key} = {shown}: {warnings:?}");
                assert_ne!(read, defaults, "{key} = {shown} applied");
            } else {
                assert_eq!(read, defaults, "{key} = {shown} refused");
                assert_eq!(warnings.len(), 1, "{key} = {shown}");
                assert!(warnings[0].contains(key), "{warnings:?}");
                assert!(
                    warnings[0].len() < 300,
                    "the value is cut: {}",
                    warnings[0].len()
                );
            }
        }
    }

    #[test]
    fn go_durations_parse() {
        for (text, millis) in [
            ("300ms", 300),
            ("1s", 1000),
            ("1.5s", 1500),
            ("1m30s", 90_000),
            ("250000us", 250),
            ("2h", 7_200_000),
        ] {
            assert_eq!(
                parse_duration(text),
                Some(Duration::from_millis(millis)),
                "{text}"
            );
        }
        for bad in ["", "300", "ms", "1x", "-1s", "1..5s"] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }
}
