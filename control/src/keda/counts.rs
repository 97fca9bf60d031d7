//! A route's counts over the whole fleet, as KEDA's HTTP add-on's scaler sums them
//! (`scaler/queue_pinger.go` at v0.15.0): each replica's requests in the route now (held or at
//! a pod) summed; its request rate from each replica's monotonic request count, whose
//! increases since the last look go into the route's buckets (`keda::rate`). A count seen for
//! the first time adds nothing; one that went down is a restarted replica, whose whole count is
//! new. Pure: the time and every replica's counts are passed in.

use std::collections::BTreeMap;
use std::time::Duration;

use rustc_hash::FxHashMap;

use super::object::{RateWindow, DEFAULT_RATE_GRANULARITY, DEFAULT_RATE_WINDOW};
use super::rate::RequestBuckets;
use super::scaler::RouteCount;

#[cfg(test)]
mod tests;

/// One route's counts as the add-on's interceptor answers `GET /queue`
/// (`pkg/queue/queue_counts.go`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueCount {
    #[serde(rename = "Concurrency")]
    pub concurrency: i64,
    #[serde(rename = "RequestCount")]
    pub request_count: u64,
}

/// A replica's counts as the `/queue` JSON: `{"<namespace>/<name>": {"Concurrency": n,
/// "RequestCount": m}}`.
pub fn queue_json(counts: &BTreeMap<RouteId, ReplicaCount>) -> String {
    let wire: BTreeMap<String, QueueCount> = counts
        .iter()
        .map(|((namespace, name), count)| {
            (
                format!("{namespace}/{name}"),
                QueueCount {
                    concurrency: count.concurrency,
                    request_count: count.requests,
                },
            )
        })
        .collect();
    serde_json::to_string(&wire).unwrap_or_else(|_| "{}".into())
}

/// A replica's `/queue` answer read back; keys that are not `<namespace>/<name>` are skipped.
pub fn parse_queue(body: &[u8]) -> Result<BTreeMap<RouteId, ReplicaCount>, String> {
    let wire: BTreeMap<String, QueueCount> =
        serde_json::from_slice(body).map_err(|error| format!("not the /queue JSON: {error}"))?;
    Ok(wire
        .into_iter()
        .filter_map(|(key, count)| {
            let (namespace, name) = key.split_once('/')?;
            Some((
                (namespace.to_owned(), name.to_owned()),
                ReplicaCount {
                    concurrency: count.concurrency,
                    requests: count.request_count,
                },
            ))
        })
        .collect())
}

/// A route, by namespace and name.
pub type RouteId = (String, String);

/// One replica's counts of one route: requests in it now, and requests since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaCount {
    pub concurrency: i64,
    pub requests: u64,
}

/// Every replica's last request counts, and every route's buckets. Hashed by route, not
/// ordered: a tick looks up every route of every replica, and thousands of routes in ordered
/// maps cost more in name comparisons than the counting itself.
#[derive(Debug, Default)]
pub struct FleetTally {
    /// By replica, then route: the request count last seen.
    seen: BTreeMap<String, FxHashMap<RouteId, u64>>,
    buckets: FxHashMap<RouteId, RequestBuckets>,
}

/// The entries of `counts` whose route is among `windows`' (both ordered by route): one walk
/// over the two, no lookup.
fn among<'a, V, W>(
    counts: &'a BTreeMap<RouteId, V>,
    windows: &'a BTreeMap<RouteId, W>,
) -> impl Iterator<Item = (&'a RouteId, &'a V)> {
    let mut routes = windows.keys().peekable();
    counts.iter().filter(move |(route, _)| {
        while routes.next_if(|window| window < route).is_some() {}
        routes.peek() == Some(route)
    })
}

impl FleetTally {
    /// Takes in what every replica answered at `now` (time since the Unix epoch), by replica;
    /// `windows`: each route's rate window (`None`: the add-on's default); a replica's counts
    /// of a route not among them are passed over. Returns each route's fleet-wide count. A
    /// replica that did not answer is left out of `replicas`, and its last counts are kept for
    /// when it answers again.
    pub fn observe<'a, R: AsRef<str>>(
        &mut self,
        now: Duration,
        replicas: impl IntoIterator<Item = (R, &'a BTreeMap<RouteId, ReplicaCount>)>,
        windows: &BTreeMap<RouteId, Option<RateWindow>>,
    ) -> BTreeMap<RouteId, RouteCount> {
        // Keyed by the replicas' own route names: a tick allocates no name but its answer's.
        let mut concurrency: FxHashMap<&RouteId, i64> = FxHashMap::default();
        let mut increase: FxHashMap<&RouteId, i64> = FxHashMap::default();
        for (replica, counts) in replicas {
            let replica = replica.as_ref();
            let known = self.seen.contains_key(replica);
            let seen = match self.seen.get_mut(replica) {
                Some(seen) => seen,
                None => self.seen.entry(replica.to_owned()).or_default(),
            };
            let mut routes = 0;
            for (route, count) in among(counts, windows) {
                routes += 1;
                *concurrency.entry(route).or_default() += count.concurrency;
                let before = match seen.get_mut(route) {
                    Some(last) => Some(std::mem::replace(last, count.requests)),
                    None => seen.insert(route.clone(), count.requests),
                };
                let added = match before {
                    // A route new to a replica already heard from: its count began at zero with
                    // the route, so all of it is new (requests in the route's first tick count).
                    None if known => count.requests,
                    // A replica's first answer: its counts since it started are the baseline.
                    None => 0,
                    Some(before) if count.requests >= before => count.requests - before,
                    Some(_) => count.requests,
                };
                if added != 0 {
                    *increase.entry(route).or_default() += i64::try_from(added).unwrap_or(i64::MAX);
                }
            }
            // What it no longer counts (or is no longer routed) is forgotten.
            if seen.len() != routes {
                seen.retain(|route, _| counts.contains_key(route) && windows.contains_key(route));
            }
        }
        let mut out = Vec::with_capacity(windows.len());
        let mut with_buckets = 0;
        for (route, window) in windows {
            let window = window.unwrap_or(RateWindow {
                window: DEFAULT_RATE_WINDOW,
                granularity: DEFAULT_RATE_GRANULARITY,
            });
            let fits = |kept: &RequestBuckets| {
                kept.window() == window.window && kept.granularity() == window.granularity
            };
            if !self.buckets.get(route).is_some_and(fits) {
                let Ok(fresh) = RequestBuckets::new(window.window, window.granularity) else {
                    // The object's window was refused where it was read.
                    continue;
                };
                self.buckets.insert(route.clone(), fresh);
            }
            let buckets = self.buckets.get_mut(route).expect("kept or just made");
            with_buckets += 1;
            buckets.record(now, increase.get(route).copied().unwrap_or(0));
            out.push((
                route.clone(),
                RouteCount {
                    concurrency: concurrency.get(route).copied().unwrap_or(0),
                    rate: buckets.window_average(now),
                },
            ));
        }
        // A route no longer routed keeps no buckets (it has some while it is, but a refused
        // window's).
        if self.buckets.len() > with_buckets {
            self.buckets.retain(|route, _| windows.contains_key(route));
        }
        // In route order already: built in one pass, with no search.
        out.into_iter().collect()
    }
}
