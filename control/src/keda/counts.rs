//! A route's counts over the whole fleet, as KEDA's HTTP add-on's scaler sums them
//! (`scaler/queue_pinger.go` at v0.15.0): each replica's requests in the route now (held or at
//! a pod) summed; its request rate from each replica's monotonic request count, whose
//! increases since the last look go into the route's buckets (`keda::rate`). A count seen for
//! the first time adds nothing; one that went down is a restarted replica, whose whole count is
//! new. Pure: the time and every replica's counts are passed in.

use std::collections::BTreeMap;
use std::time::Duration;

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

/// Every replica's last request counts, and every route's buckets.
#[derive(Debug, Default)]
pub struct FleetTally {
    /// By replica, then route: the request count last seen.
    seen: BTreeMap<String, BTreeMap<RouteId, u64>>,
    buckets: BTreeMap<RouteId, RequestBuckets>,
}

impl FleetTally {
    /// Takes in what every replica answered at `now` (time since the Unix epoch), by replica;
    /// `windows`: each route's rate window (`None`: the add-on's default). Returns each route's
    /// fleet-wide count. A replica that did not answer is left out of `replicas`, and its last
    /// counts are kept for when it answers again.
    pub fn observe(
        &mut self,
        now: Duration,
        replicas: &BTreeMap<String, BTreeMap<RouteId, ReplicaCount>>,
        windows: &BTreeMap<RouteId, Option<RateWindow>>,
    ) -> BTreeMap<RouteId, RouteCount> {
        let mut concurrency: BTreeMap<RouteId, i64> = BTreeMap::new();
        let mut increase: BTreeMap<RouteId, i64> = BTreeMap::new();
        for (replica, counts) in replicas {
            let known = self.seen.contains_key(replica);
            let seen = self.seen.entry(replica.clone()).or_default();
            for (route, count) in counts {
                *concurrency.entry(route.clone()).or_default() += count.concurrency;
                let added = match seen.insert(route.clone(), count.requests) {
                    // A route new to a replica already heard from: its count began at zero with
                    // the route, so all of it is new (requests in the route's first tick count).
                    None if known => count.requests,
                    // A replica's first answer: its counts since it started are the baseline.
                    None => 0,
                    Some(before) if count.requests >= before => count.requests - before,
                    Some(_) => count.requests,
                };
                *increase.entry(route.clone()).or_default() +=
                    i64::try_from(added).unwrap_or(i64::MAX);
            }
            seen.retain(|route, _| counts.contains_key(route));
        }
        self.buckets.retain(|route, _| windows.contains_key(route));
        let mut out = BTreeMap::new();
        for (route, window) in windows {
            let window = window.unwrap_or(RateWindow {
                window: DEFAULT_RATE_WINDOW,
                granularity: DEFAULT_RATE_GRANULARITY,
            });
            let buckets = self.buckets.entry(route.clone());
            let buckets = match buckets {
                std::collections::btree_map::Entry::Occupied(entry)
                    if entry.get().window() == window.window
                        && entry.get().granularity() == window.granularity =>
                {
                    entry.into_mut()
                }
                entry => {
                    let Ok(fresh) = RequestBuckets::new(window.window, window.granularity) else {
                        // The object's window was refused where it was read.
                        continue;
                    };
                    match entry {
                        std::collections::btree_map::Entry::Occupied(mut entry) => {
                            entry.insert(fresh);
                            entry.into_mut()
                        }
                        std::collections::btree_map::Entry::Vacant(entry) => entry.insert(fresh),
                    }
                }
            };
            buckets.record(now, increase.get(route).copied().unwrap_or(0));
            out.insert(
                route.clone(),
                RouteCount {
                    concurrency: concurrency.get(route).copied().unwrap_or(0),
                    rate: buckets.window_average(now),
                },
            );
        }
        out
    }
}
