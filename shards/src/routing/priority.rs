//! A revision's priority policy (issue 27): which headers put a request in which band and flow.
//! How waiters of each band and flow are served is `throttle::discipline`; this only classifies.
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
}

impl Default for PriorityPolicy {
    fn default() -> PriorityPolicy {
        PriorityPolicy {
            bands: DEFAULT_BANDS,
            default_band: default_band_of(DEFAULT_BANDS),
            priority_header: DEFAULT_PRIORITY_HEADER.to_string(),
            tenant_header: DEFAULT_TENANT_HEADER.to_string(),
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
        let (band, invalid) = match headers.get(&self.priority_header) {
            None => (self.default_band, false),
            Some(value) => match parse_band(value, self.bands) {
                Some(band) => (band, false),
                None => (self.default_band, true),
            },
        };
        let flow = headers.get(&self.tenant_header).map_or(0, flow_of);
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
    fn the_priority_header_gives_the_band_and_a_bad_one_the_default() {
        let policy = PriorityPolicy::default();
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
        let table: [Row; 9] = [
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
