//! A revision's priority policy (issue 27): which headers put a request in which band and flow.
//! How waiters of each band and flow are served is `throttle::discipline`; this only classifies.
//!
//! Who may set a band (issue 36): the headers come from whoever sends the request, so by default
//! a client can lower its own band but not raise it above the default: a request that names a
//! higher band is served in the default one. A band above the default comes from configuration
//! (a fairness key mapped to a band, `tenant_bands`) or from a priority header the operator
//! declares trusted (`trusted`: a hop in front, such as the ingress, sets it and strips what
//! clients send). The fairness key is the client's word either way: an untrusted one costs a
//! flow per key it invents, and a mapped band is only as good as the hop that sets the key.
//!
//! Pure: a request's headers in, a [`Class`] out.

use std::hash::Hasher;

use rustc_hash::FxHasher;

use crate::fields::RequestHeaders;
pub use crate::throttle::discipline::{Class, MAX_BANDS};

// Every band has its counters (`metrics::PriorityCounters`).
const _: () = assert!(MAX_BANDS as usize <= crate::metrics::PRIORITY_BANDS);

/// Default name of the header carrying a request's band: an integer in `0..bands`, higher
/// served first.
pub const DEFAULT_PRIORITY_HEADER: &str = "K-Priority";

/// Default name of the header carrying a request's fairness key (its tenant).
pub const DEFAULT_TENANT_HEADER: &str = "K-Tenant";

/// Default number of bands when a policy is on and does not say: 3 (low, normal, high).
pub const DEFAULT_BANDS: u8 = 3;

/// The band of a request without a usable priority header, unless the policy names one: the
/// middle band, so that clients can both lower and raise their requests.
pub fn default_band_of(bands: u8) -> u8 {
    bands.clamp(1, MAX_BANDS).saturating_sub(1) / 2
}

/// A revision's policy, as its source set it; validated there (`bands` in `1..=MAX_BANDS`,
/// `default_band < bands`, header names that are HTTP tokens).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityPolicy {
    /// Number of bands, `1..=`[`MAX_BANDS`]. Default [`DEFAULT_BANDS`].
    pub bands: u8,
    /// Band of a request without a valid priority header. Default [`default_band_of`]`(bands)`.
    pub default_band: u8,
    /// Header carrying the band. Default [`DEFAULT_PRIORITY_HEADER`].
    pub priority_header: String,
    /// Header carrying the fairness key; requests without it share one flow. Default
    /// [`DEFAULT_TENANT_HEADER`].
    pub tenant_header: String,
    /// The priority header is set by a trusted hop: its band is taken as it is. Default false:
    /// it may lower a request's band, never raise it above the default (or the key's band).
    pub trusted: bool,
    /// Fairness keys with a band of their own (at most [`MAX_TENANT_BANDS`]): a request with
    /// one of these keys is served in that band, unless its priority header lowers it (or, when
    /// trusted, sets it).
    pub tenant_bands: Vec<(String, u8)>,
}

/// Most fairness keys a policy maps to bands.
pub const MAX_TENANT_BANDS: usize = 256;

impl Default for PriorityPolicy {
    fn default() -> PriorityPolicy {
        PriorityPolicy {
            bands: DEFAULT_BANDS,
            default_band: default_band_of(DEFAULT_BANDS),
            priority_header: DEFAULT_PRIORITY_HEADER.to_string(),
            tenant_header: DEFAULT_TENANT_HEADER.to_string(),
            trusted: false,
            tenant_bands: Vec::new(),
        }
    }
}

/// How a request was classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Classified {
    pub class: Class,
    /// The priority header was there but not an integer in `0..bands`: the request went to the
    /// default band (and is counted).
    pub invalid: bool,
}

/// A policy value that cannot be: the field (as the file and the annotation spell it) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    pub field: &'static str,
    pub reason: String,
}

impl PriorityPolicy {
    /// Refuses a policy that cannot be served as written, naming the field.
    pub fn check(&self) -> Result<(), PolicyError> {
        let refuse = |field, reason: String| Err(PolicyError { field, reason });
        if !(1..=MAX_BANDS).contains(&self.bands) {
            return refuse(
                "bands",
                format!("is {}, must be 1 to {MAX_BANDS}", self.bands),
            );
        }
        if self.default_band >= self.bands {
            return refuse(
                "default_band",
                format!(
                    "is {}, must be a band: 0 to {}",
                    self.default_band,
                    self.bands - 1
                ),
            );
        }
        for (field, name) in [
            ("priority_header", &self.priority_header),
            ("tenant_header", &self.tenant_header),
        ] {
            if !is_token(name) {
                return refuse(field, format!("{name:?} is not a header name"));
            }
        }
        if self.tenant_bands.len() > MAX_TENANT_BANDS {
            return refuse(
                "tenant_bands",
                format!(
                    "has {} keys, at most {MAX_TENANT_BANDS}",
                    self.tenant_bands.len()
                ),
            );
        }
        for (key, band) in &self.tenant_bands {
            if key.is_empty() {
                return refuse("tenant_bands", "has an empty key".into());
            }
            if *band >= self.bands {
                return refuse(
                    "tenant_bands",
                    format!(
                        "gives {key:?} band {band}, must be a band: 0 to {}",
                        self.bands - 1
                    ),
                );
            }
        }
        if self
            .priority_header
            .eq_ignore_ascii_case(&self.tenant_header)
        {
            return refuse(
                "tenant_header",
                format!("{:?} is the priority header too", self.tenant_header),
            );
        }
        Ok(())
    }

    /// A request's band and flow from its headers.
    pub fn classify<H: RequestHeaders + ?Sized>(&self, headers: &H) -> Classified {
        let key = headers.get(&self.tenant_header);
        // The band a request has without a header: its key's, or the default.
        let own = key
            .filter(|_| !self.tenant_bands.is_empty())
            .and_then(|key| {
                self.tenant_bands
                    .iter()
                    .find(|(mapped, _)| mapped.as_bytes() == key)
                    .map(|(_, band)| *band)
            })
            .unwrap_or(self.default_band);
        let (band, invalid) = match headers.get(&self.priority_header) {
            None => (own, false),
            Some(value) => match parse_band(value, self.bands) {
                Some(band) if self.trusted => (band, false),
                // A client's word may lower its band, not raise it.
                Some(band) => (band.min(own), false),
                None => (own, true),
            },
        };
        let flow = key.map_or(0, flow_of);
        Classified {
            class: Class { band, flow },
            invalid,
        }
    }
}

/// An HTTP field name (RFC 9110 §5.1: a token), at most 64 bytes.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A decimal integer in `0..bands` (surrounding blanks allowed, as in any field value).
fn parse_band(value: &[u8], bands: u8) -> Option<u8> {
    let digits = value.trim_ascii();
    // At most three digits: anything longer is out of range anyway, and cannot overflow.
    if digits.is_empty() || digits.len() > 3 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let band = digits
        .iter()
        .fold(0u16, |acc, digit| acc * 10 + u16::from(digit - b'0'));
    (band < u16::from(bands)).then_some(band as u8)
}

/// The flow of a fairness key: a hash of its bytes. Every request without a key is flow 0; a
/// key that hashes to 0 shares that flow (one in 2^64).
fn flow_of(key: &[u8]) -> u64 {
    let mut hasher = FxHasher::default();
    hasher.write(key);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trusted_priority_header_gives_the_band_and_a_bad_one_the_default() {
        let policy = PriorityPolicy {
            trusted: true,
            ..PriorityPolicy::default()
        };
        assert_eq!((policy.bands, policy.default_band), (3, 1));
        // (header value, band, counted as invalid)
        let table: &[(Option<&str>, u8, bool)] = &[
            (None, 1, false),
            (Some("0"), 0, false),
            (Some("2"), 2, false),
            (Some(" 2 "), 2, false),
            (Some("002"), 2, false),
            (Some("3"), 1, true),
            (Some("255"), 1, true),
            (Some("99999999999999999999"), 1, true),
            (Some("-1"), 1, true),
            (Some("+1"), 1, true),
            (Some("1.0"), 1, true),
            (Some("high"), 1, true),
            (Some(""), 1, true),
        ];
        for &(value, band, invalid) in table {
            let headers: Vec<(&str, &str)> = value
                .map(|value| ("k-priority", value))
                .into_iter()
                .collect();
            let got = policy.classify(&headers[..]);
            assert_eq!((got.class.band, got.invalid), (band, invalid), "{value:?}");
        }
    }

    /// Review finding: with a policy on, any client that sent the top band jumped every queue
    /// and shed other clients' waiters. By default a client may lower its band, not raise it;
    /// a band above the default comes from configuration (the key's) or a trusted header.
    #[test]
    fn an_untrusted_client_cannot_raise_its_band_but_its_mapped_key_can_have_one() {
        let policy = PriorityPolicy {
            bands: 4,
            default_band: 1,
            tenant_bands: vec![("premium".into(), 3), ("batch".into(), 0)],
            ..PriorityPolicy::default()
        };
        assert_eq!(policy.check(), Ok(()));
        // (priority header, tenant key, band)
        let table: &[(Option<&str>, Option<&str>, u8)] = &[
            (None, None, 1),
            (Some("3"), None, 1),
            (Some("2"), None, 1),
            (Some("0"), None, 0),
            (None, Some("premium"), 3),
            (Some("0"), Some("premium"), 0),
            (Some("2"), Some("premium"), 2),
            (None, Some("batch"), 0),
            (Some("3"), Some("batch"), 0),
            (Some("3"), Some("someone"), 1),
            (None, Some("Premium"), 1),
        ];
        for &(priority, tenant, band) in table {
            let mut headers = Vec::new();
            headers.extend(priority.map(|value| ("k-priority", value)));
            headers.extend(tenant.map(|value| ("k-tenant", value)));
            assert_eq!(
                policy.classify(&headers[..]).class.band,
                band,
                "{priority:?} {tenant:?}"
            );
        }
        let trusted = PriorityPolicy {
            trusted: true,
            ..policy.clone()
        };
        let headers = [("k-priority", "3"), ("k-tenant", "batch")];
        assert_eq!(trusted.classify(&headers[..]).class.band, 3, "trusted");
        assert_eq!(
            trusted.classify(&[("k-tenant", "premium")][..]).class.band,
            3
        );
    }

    #[test]
    fn the_tenant_header_gives_the_flow() {
        let policy = PriorityPolicy {
            tenant_header: "X-Team".to_string(),
            ..PriorityPolicy::default()
        };
        let flow = |headers: &[(&str, &str)]| policy.classify(headers).class.flow;
        assert_eq!(flow(&[]), 0, "no key: the shared flow");
        assert_eq!(
            flow(&[("K-Tenant", "a")]),
            0,
            "another header is not the key"
        );
        assert_eq!(flow(&[("x-team", "a")]), flow(&[("X-Team", "a")]));
        assert_ne!(flow(&[("x-team", "a")]), flow(&[("x-team", "b")]));
        assert_ne!(flow(&[("x-team", "a")]), 0);
    }

    #[test]
    fn a_policy_that_cannot_be_is_refused_naming_its_field() {
        assert_eq!(PriorityPolicy::default().check(), Ok(()));
        let with = |change: fn(&mut PriorityPolicy)| {
            let mut policy = PriorityPolicy::default();
            change(&mut policy);
            policy.check().map_err(|error| error.field)
        };
        // (the change, the field refused)
        type Row = (fn(&mut PriorityPolicy), Result<(), &'static str>);
        let table: [Row; 13] = [
            (|p| p.tenant_bands = vec![("a".into(), 2)], Ok(())),
            (
                |p| {
                    p.tenant_bands = (0..=MAX_TENANT_BANDS)
                        .map(|key| (key.to_string(), 0))
                        .collect()
                },
                Err("tenant_bands"),
            ),
            (
                |p| p.tenant_bands = vec![("a".into(), 3)],
                Err("tenant_bands"),
            ),
            (
                |p| p.tenant_bands = vec![(String::new(), 0)],
                Err("tenant_bands"),
            ),
            (|p| p.bands = 0, Err("bands")),
            (|p| p.bands = MAX_BANDS + 1, Err("bands")),
            (
                |p| (p.bands, p.default_band) = (MAX_BANDS, MAX_BANDS - 1),
                Ok(()),
            ),
            (|p| p.default_band = 3, Err("default_band")),
            (
                |p| p.priority_header = String::new(),
                Err("priority_header"),
            ),
            (
                |p| p.priority_header = "K Priority".into(),
                Err("priority_header"),
            ),
            (
                |p| p.tenant_header = "X-Tenant:".into(),
                Err("tenant_header"),
            ),
            (
                |p| p.tenant_header = "k-priority".into(),
                Err("tenant_header"),
            ),
            (|p| p.tenant_header = "X-Org_Id".into(), Ok(())),
        ];
        for (at, (change, refused)) in table.into_iter().enumerate() {
            assert_eq!(with(change), refused, "row {at}");
        }
    }

    #[test]
    fn the_default_band_is_the_middle_one() {
        let table = [
            (1, 0),
            (2, 0),
            (3, 1),
            (4, 1),
            (5, 2),
            (16, 7),
            (0, 0),
            (200, 7),
        ];
        for (bands, default) in table {
            assert_eq!(default_band_of(bands), default, "{bands} bands");
        }
    }
}
