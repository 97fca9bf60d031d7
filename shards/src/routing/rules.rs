//! Routing by host, path prefix and headers, in the precedence of KEDA's HTTP add-on
//! (`pkg/routing/`, v0.15.0; `reference/keda-http-add-on.md` §4.1): the table a shard asks for
//! the route of a request when routes are declared as rules rather than named by a header.
//!
//! Precedence, as the add-on's radix tree gives it:
//! * hosts: the exact host name first, then its wildcards from the most specific (`*.b.c` before
//!   `*.c`), then the catch-all (`*`, an empty host, or a rule with no hosts);
//! * within a host: only the longest stored path prefix, matched on whole segments (`/api`
//!   covers `/api/v1`, not `/apiv2`); when no route there matches the headers the search goes on
//!   to the next host form, never to a shorter prefix (the add-on's quirk, kept);
//! * at one host and prefix: more header matches first, then more of them with a value, then
//!   the older route, then namespace and name, both descending.
//!
//! Host names are compared as written (not lower-cased) without their port; the path is the
//! request target's path, percent-decoded, without its query. Pure: no clock, no I/O.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::fields::RequestHeaders;

#[cfg(test)]
mod tests;

/// A header a rule requires: present (`value: None`), or with one of its values equal to
/// `value`, byte for byte. The name is compared without regard to case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderMatch {
    pub name: Box<str>,
    pub value: Option<Box<str>>,
}

/// One routing rule of a route: the request's host must be one of `hosts` (none: any host), its
/// path must start with one of `paths` (none: any path), and every header of `headers` must
/// match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub hosts: Vec<String>,
    pub paths: Vec<String>,
    pub headers: Vec<HeaderMatch>,
}

impl Rule {
    /// Whether a request addressed to `authority` with target `target` and these fields
    /// matches the rule on its own, as the add-on's `MatchRoutingRule` decides for a static
    /// route (`pkg/routing/match.go` on its `main`, 0.16): an empty field matches anything; a
    /// host is `*` or empty (any host), `*.<suffix>` (any name under it, at any depth, not the
    /// suffix itself) or the host name exactly, without the request's port; a path is a prefix
    /// of the request's path on whole segments, slashes around either ignored (empty or `/`:
    /// any path); every header matches.
    pub fn matches<H: RequestHeaders + ?Sized>(
        &self,
        authority: &[u8],
        target: &[u8],
        headers: &H,
    ) -> bool {
        let host = host_name(authority);
        let host_matches = self.hosts.is_empty()
            || self.hosts.iter().any(|rule| match rule.as_str() {
                "" | "*" => true,
                rule => match rule.strip_prefix('*') {
                    Some(suffix) if suffix.starts_with('.') => host.ends_with(suffix.as_bytes()),
                    _ => host == rule.as_bytes(),
                },
            });
        if !host_matches {
            return false;
        }
        if !self.paths.is_empty() {
            let path = request_path(target);
            let path = trim_slashes(&path);
            let path_matches = self.paths.iter().any(|prefix| {
                let prefix = trim_slashes(prefix.as_bytes());
                prefix.is_empty()
                    || path == prefix
                    || (path.starts_with(prefix) && path.get(prefix.len()) == Some(&b'/'))
            });
            if !path_matches {
                return false;
            }
        }
        self.headers
            .iter()
            .all(|header| headers.has(&header.name, header.value.as_deref().map(str::as_bytes)))
    }
}

/// What orders two routes whose rules match the same host, prefix and number of headers: the
/// older first (`created`, seconds since the epoch as the API server stamps it), then
/// namespace and name, descending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteOrder {
    pub created: i64,
    pub namespace: String,
    pub name: String,
}

/// The routes of one host form, by trimmed path prefix (`api/v1` for `/api/v1/`; empty for
/// the root).
struct Prefixes<T> {
    by_prefix: HashMap<Box<[u8]>, Vec<Entry<T>>>,
}

impl<T> Default for Prefixes<T> {
    fn default() -> Self {
        Prefixes {
            by_prefix: HashMap::new(),
        }
    }
}

struct Entry<T> {
    target: T,
    headers: Box<[HeaderMatch]>,
    order: std::rc::Rc<RouteOrder>,
}

/// The routes of every rule, ready for lookups. Built once per change of the routes
/// ([`RuleTable::build`]); a lookup allocates only to percent-decode a path that has escapes.
pub struct RuleTable<T> {
    exact: HashMap<Box<[u8]>, Prefixes<T>>,
    /// `*.example.com`, by `example.com`.
    wildcard: HashMap<Box<[u8]>, Prefixes<T>>,
    catch_all: Prefixes<T>,
}

impl<T> std::fmt::Debug for RuleTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleTable")
            .field("exact_hosts", &self.exact.len())
            .field("wildcard_hosts", &self.wildcard.len())
            .field("catch_all_prefixes", &self.catch_all.by_prefix.len())
            .finish()
    }
}

impl<T> Default for RuleTable<T> {
    fn default() -> Self {
        RuleTable {
            exact: HashMap::new(),
            wildcard: HashMap::new(),
            catch_all: Prefixes::default(),
        }
    }
}

impl<T: Clone> RuleTable<T> {
    /// The table of `routes`, each a target, what orders it, and its rules.
    pub fn build<'r>(routes: impl IntoIterator<Item = (T, RouteOrder, &'r [Rule])>) -> Self {
        let mut table = RuleTable::default();
        for (target, order, rules) in routes {
            let order = std::rc::Rc::new(order);
            for rule in rules {
                let any_host = [String::new()];
                let hosts = if rule.hosts.is_empty() {
                    &any_host[..]
                } else {
                    &rule.hosts[..]
                };
                let root = [String::new()];
                let paths = if rule.paths.is_empty() {
                    &root[..]
                } else {
                    &rule.paths[..]
                };
                for host in hosts {
                    let prefixes = table.prefixes_mut(strip_port(host));
                    for path in paths {
                        let prefix = trim_slashes(path.as_bytes());
                        prefixes
                            .by_prefix
                            .entry(prefix.into())
                            .or_default()
                            .push(Entry {
                                target: target.clone(),
                                headers: rule.headers.clone().into(),
                                order: order.clone(),
                            });
                    }
                }
            }
        }
        for prefixes in table
            .exact
            .values_mut()
            .chain(table.wildcard.values_mut())
            .chain(std::iter::once(&mut table.catch_all))
        {
            for entries in prefixes.by_prefix.values_mut() {
                entries.sort_by(|a, b| {
                    b.headers
                        .len()
                        .cmp(&a.headers.len())
                        .then_with(|| valued(&b.headers).cmp(&valued(&a.headers)))
                        .then_with(|| a.order.created.cmp(&b.order.created))
                        .then_with(|| b.order.namespace.cmp(&a.order.namespace))
                        .then_with(|| b.order.name.cmp(&a.order.name))
                });
            }
        }
        table
    }

    fn prefixes_mut(&mut self, host: &str) -> &mut Prefixes<T> {
        if host.is_empty() || host == "*" {
            &mut self.catch_all
        } else if let Some(suffix) = host.strip_prefix("*.") {
            self.wildcard.entry(suffix.as_bytes().into()).or_default()
        } else {
            self.exact.entry(host.as_bytes().into()).or_default()
        }
    }
}

impl<T> RuleTable<T> {
    /// Whether the table has no route at all.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.catch_all.by_prefix.is_empty()
    }

    /// The route of a request addressed to `authority` (`Host`, `:authority`; a port is
    /// ignored) with request target `target` (origin or absolute form), or `None`: nothing
    /// matches (the add-on's 404).
    pub fn route<H: RequestHeaders + ?Sized>(
        &self,
        authority: &[u8],
        target: &[u8],
        headers: &H,
    ) -> Option<&T> {
        let host = host_name(authority);
        let path = request_path(target);
        let path = trim_slashes(&path);
        if let Some(found) = self
            .exact
            .get(host)
            .and_then(|prefixes| prefixes.route(path, headers))
        {
            return Some(found);
        }
        let mut rest = host;
        while let Some(dot) = rest.iter().position(|&b| b == b'.') {
            rest = &rest[dot + 1..];
            if let Some(found) = self
                .wildcard
                .get(rest)
                .and_then(|prefixes| prefixes.route(path, headers))
            {
                return Some(found);
            }
        }
        self.catch_all.route(path, headers)
    }
}

impl<T> Prefixes<T> {
    /// The first route, in precedence order, at the longest stored prefix of `path` (trimmed)
    /// whose headers all match.
    fn route<H: RequestHeaders + ?Sized>(&self, path: &[u8], headers: &H) -> Option<&T> {
        let entries = self.longest(path)?;
        entries
            .iter()
            .find(|entry| {
                entry.headers.iter().all(|header| {
                    headers.has(&header.name, header.value.as_deref().map(str::as_bytes))
                })
            })
            .map(|entry| &entry.target)
    }

    /// The entries at the longest stored prefix of `path` that ends at a segment's end.
    fn longest(&self, path: &[u8]) -> Option<&Vec<Entry<T>>> {
        if let Some(entries) = self.by_prefix.get(path) {
            return Some(entries);
        }
        let mut end = path.len();
        while let Some(slash) = path[..end].iter().rposition(|&b| b == b'/') {
            if let Some(entries) = self.by_prefix.get(&path[..slash]) {
                return Some(entries);
            }
            end = slash;
        }
        if path.is_empty() {
            None
        } else {
            self.by_prefix.get(&b""[..])
        }
    }
}

fn valued(headers: &[HeaderMatch]) -> usize {
    headers
        .iter()
        .filter(|header| header.value.is_some())
        .count()
}

/// `path` without its leading and trailing slashes, as Go's `strings.Trim(path, "/")`.
fn trim_slashes(path: &[u8]) -> &[u8] {
    let start = path.iter().position(|&b| b != b'/').unwrap_or(path.len());
    let end = path
        .iter()
        .rposition(|&b| b != b'/')
        .map_or(start, |i| i + 1);
    &path[start..end]
}

/// A rule's host without its port, as the add-on's `stripPort` (`net.SplitHostPort`, which
/// also takes an IPv6 literal out of its brackets); a host without a port as written.
fn strip_port(host: &str) -> &str {
    match host.as_bytes().first() {
        Some(b'[') => match host.find("]:") {
            Some(close) if host[close + 2..].bytes().all(|b| b.is_ascii_digit()) => &host[1..close],
            _ => host,
        },
        _ => match host.rfind(':') {
            Some(colon) if !host[..colon].contains(':') => &host[..colon],
            _ => host,
        },
    }
}

/// The host name of a request's authority, as Go's `URL.Hostname`: a port made of digits is
/// cut off, an IPv6 literal is taken out of its brackets.
pub fn host_name(authority: &[u8]) -> &[u8] {
    let host = match authority.iter().rposition(|&b| b == b':') {
        Some(colon) if authority[colon + 1..].iter().all(u8::is_ascii_digit) => &authority[..colon],
        _ => authority,
    };
    match host {
        [b'[', inner @ .., b']'] => inner,
        _ => host,
    }
}

/// The path of a request target, as Go's `URL.Path`: the absolute form's scheme and authority
/// and the query left out, percent escapes decoded (a malformed escape is kept as written).
pub fn request_path(target: &[u8]) -> Cow<'_, [u8]> {
    let mut path = target;
    for scheme in [&b"http://"[..], b"https://"] {
        if path.len() >= scheme.len() && path[..scheme.len()].eq_ignore_ascii_case(scheme) {
            let rest = &path[scheme.len()..];
            path = rest
                .iter()
                .position(|&b| b == b'/' || b == b'?' || b == b'#')
                .map_or(&b""[..], |start| &rest[start..]);
            break;
        }
    }
    if let Some(end) = path.iter().position(|&b| b == b'?' || b == b'#') {
        path = &path[..end];
    }
    if !path.contains(&b'%') {
        return Cow::Borrowed(path);
    }
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] == b'%' && i + 2 < path.len() {
            if let (Some(high), Some(low)) = (hex(path[i + 1]), hex(path[i + 2])) {
                decoded.push(high << 4 | low);
                i += 3;
                continue;
            }
        }
        decoded.push(path[i]);
        i += 1;
    }
    Cow::Owned(decoded)
}

fn hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}
