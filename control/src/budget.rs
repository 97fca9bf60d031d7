//! What the caps on open connections, unfinished request heads and queued requests cost at
//! worst, held against the memory the process may use (its cgroup's limit). Pure.
//!
//! Each cap bounds one way a stranger can make the activator hold memory: connections that
//! stay open, heads that never finish, requests that wait. Their worst cases are summed with
//! the measured cost of each unit. With a memory limit, a cap the file does not set is derived
//! from its share of the limit (never above its built-in default); a cap the file sets is kept,
//! and a configuration whose worst case does not fit is refused, naming the keys. Without a
//! limit the configured caps stand.
//!
//! The queue cap may also come later from `config-features` (`activator.max-queued-requests`):
//! [`Budget::queue_ceiling`] is the most it may be raised to.
//!
//! Each role says what it needs ([`Needs`]): what it keeps out of the caps' budget, and the
//! least each cap may be. The activator keeps 64 MiB back, KEDA's HTTP add-on role 24 MiB; the queue-proxy, a sidecar with a
//! footprint of 3 MiB, keeps 8 MiB back, and its breaker (containerConcurrency in flight and
//! ten times that waiting) must always be admitted: derived caps never go below that, and a
//! limit that cannot hold it is refused at start, naming what asked for it.

use std::fmt;

use crate::config::ProxySettings;

/// What one open client connection costs at worst between requests, whatever it speaks: an
/// HTTP/2 connection whose streams come less than a second apart, the costlier (measured
/// 25 366 B; 14 017 B once idle for a second, when it gives its buffers back; an HTTP/1 one
/// 4 676 B; BENCHMARKS.md, "Memory per open connection"), rounded up. A client can keep a
/// connection from going idle, so the budget counts the busy figure.
pub const CONNECTION_BYTES: u64 = 26 * 1024;
/// What one unfinished request head may hold: a head buffer up to the 64 KiB head limit, and
/// its connection.
pub const PENDING_HEAD_BYTES: u64 = kactivator_h1::MAX_HEAD_BYTES as u64 + CONNECTION_BYTES;
/// What one queued request costs (measured 1.8 KiB with its connection; BENCHMARKS.md,
/// "Memory per queued request"), rounded up.
pub const QUEUED_REQUEST_BYTES: u64 = 2 * 1024;
/// The activator keeps this out of the caps' budget: the binary, the runtimes, the control
/// plane's state and caches, request bodies in flight.
pub const RESERVED_BYTES: u64 = 64 << 20;
/// KEDA's HTTP add-on role keeps this out of the caps' budget: its idle footprint is 15 MiB
/// (BENCHMARKS.md, "Memory idle and with 10 000 held requests"), and its view of the cluster
/// grows with the routes it serves, about 32 KiB per route of 10 pods (BENCHMARKS.md, "KEDA
/// role's control plane at scale": 53 MiB at 1 000 routes): the reserve covers a few hundred
/// routes. Under the add-on's own chart limit for its interceptor, 64 MiB, that leaves room
/// for thousands of held requests; a cluster with more routes needs a larger limit.
pub const KEDA_HTTP_RESERVED_BYTES: u64 = 24 << 20;
/// The queue-proxy keeps this out of the caps' budget: its idle footprint is 2.6 to 2.9 MiB
/// (BENCHMARKS.md, "The queue-proxy's footprint"), plus request bodies in flight.
pub const QUEUE_PROXY_RESERVED_BYTES: u64 = 8 << 20;

/// What a role needs of the budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Needs {
    /// Kept out of the caps' budget.
    pub reserved: u64,
    /// The least each cap may be, whatever the limit: what the role promises to admit.
    pub floor: Caps,
    /// What asked for the floor, for the error when the limit cannot hold it.
    pub floor_from: &'static str,
}

impl Needs {
    /// The activator's: 64 MiB reserved, no floor.
    pub fn activator() -> Needs {
        Needs::reserving(RESERVED_BYTES)
    }

    /// KEDA's HTTP add-on role's: [`KEDA_HTTP_RESERVED_BYTES`] reserved, no floor.
    pub fn keda_http() -> Needs {
        Needs::reserving(KEDA_HTTP_RESERVED_BYTES)
    }

    fn reserving(reserved: u64) -> Needs {
        Needs {
            reserved,
            floor: Caps {
                max_connections_per_shard: 0,
                max_pending_heads_per_shard: 0,
                max_queued_requests: 0,
            },
            floor_from: "",
        }
    }
}
/// The caps may take at most this share of what is left after the reserve, in percent.
pub const CAPS_PERCENT: u64 = 75;

/// The three caps, per shard where they are per shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub max_connections_per_shard: usize,
    pub max_pending_heads_per_shard: usize,
    pub max_queued_requests: u32,
}

/// The caps in force and what they cost at worst.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The memory limit the caps were fitted to, if any.
    pub limit: Option<u64>,
    pub caps: Caps,
    /// Which caps were derived from the limit (the rest are the file's or the defaults).
    pub derived: [bool; 3],
    /// Their worst case, in bytes, over all shards.
    pub worst: u64,
    /// With a limit: the most queued requests it holds beside the connections and heads at
    /// their worst, the ceiling of a queue cap set later (`config-features`). At least
    /// `caps.max_queued_requests`. `None` without a limit.
    pub queue_ceiling: Option<u32>,
}

impl Caps {
    /// The worst case of these caps on `shards` shards, in bytes (saturating).
    pub fn worst(&self, shards: usize) -> u64 {
        let shards = shards as u64;
        let connections = (self.max_connections_per_shard as u64)
            .saturating_mul(CONNECTION_BYTES)
            .saturating_mul(shards);
        let heads = (self.max_pending_heads_per_shard as u64)
            .saturating_mul(PENDING_HEAD_BYTES)
            .saturating_mul(shards);
        let queue = u64::from(self.max_queued_requests).saturating_mul(QUEUED_REQUEST_BYTES);
        connections.saturating_add(heads).saturating_add(queue)
    }
}

/// The keys, in the order of [`Budget::derived`].
const KEYS: [&str; 3] = [
    "proxy.max_connections_per_shard",
    "proxy.max_pending_heads_per_shard",
    "proxy.max_queued_requests",
];

/// Fits the caps of `proxy` to `limit` on `shards` shards, for a role that `needs` what it says:
/// see the module's doc. The error names the keys set in the file (or what asked for the
/// role's floor) whose worst case does not fit.
pub fn fit(
    proxy: &ProxySettings,
    shards: usize,
    limit: Option<u64>,
    needs: &Needs,
) -> Result<Budget, String> {
    let floor = needs.floor;
    let configured = Caps {
        max_connections_per_shard: proxy
            .max_connections_per_shard
            .max(floor.max_connections_per_shard),
        max_pending_heads_per_shard: proxy
            .max_pending_heads_per_shard
            .max(floor.max_pending_heads_per_shard),
        max_queued_requests: proxy.max_queued_requests.max(floor.max_queued_requests),
    };
    let shards = shards.max(1);
    let Some(limit) = limit else {
        return Ok(Budget {
            limit: None,
            caps: configured,
            derived: [false; 3],
            worst: configured.worst(shards),
            queue_ceiling: None,
        });
    };
    let room = limit.saturating_sub(needs.reserved) / 100 * CAPS_PERCENT;
    let explicit = proxy.explicit_caps;
    // The floor first; what the room holds beyond it is shared: half for connections, a quarter
    // each for heads and the queue.
    let spare = room.saturating_sub(floor.worst(shards));
    let per_shard = |share: u64, unit: u64| share / unit / shards as u64;
    let mut caps = configured;
    let mut derived = [false; 3];
    if !explicit.max_connections_per_shard {
        let fits =
            floor.max_connections_per_shard + per_shard(spare / 2, CONNECTION_BYTES) as usize;
        caps.max_connections_per_shard = configured.max_connections_per_shard.min(fits);
        derived[0] = caps.max_connections_per_shard < configured.max_connections_per_shard;
    }
    if !explicit.max_pending_heads_per_shard {
        let fits =
            floor.max_pending_heads_per_shard + per_shard(spare / 4, PENDING_HEAD_BYTES) as usize;
        caps.max_pending_heads_per_shard = configured.max_pending_heads_per_shard.min(fits);
        derived[1] = caps.max_pending_heads_per_shard < configured.max_pending_heads_per_shard;
    }
    if !explicit.max_queued_requests {
        let fits = u32::try_from(spare / 4 / QUEUED_REQUEST_BYTES)
            .unwrap_or(u32::MAX)
            .saturating_add(floor.max_queued_requests);
        caps.max_queued_requests = configured.max_queued_requests.min(fits);
        derived[2] = caps.max_queued_requests < configured.max_queued_requests;
    }
    let worst = caps.worst(shards);
    let empty = caps.max_connections_per_shard == 0
        || caps.max_pending_heads_per_shard == 0
        || caps.max_queued_requests == 0;
    if worst > room || empty {
        let mut set: Vec<&str> = KEYS
            .iter()
            .zip([
                explicit.max_connections_per_shard,
                explicit.max_pending_heads_per_shard,
                explicit.max_queued_requests,
            ])
            .filter(|(_, set)| *set)
            .map(|(key, _)| *key)
            .collect();
        if !needs.floor_from.is_empty() {
            set.push(needs.floor_from);
        }
        let culprits = if set.is_empty() {
            "even the smallest caps".to_string()
        } else {
            set.join(", ")
        };
        return Err(format!(
            "the memory limit ({}) cannot hold the worst case of {culprits}: {} on {shards} \
             shard(s) ({} of connections at {CONNECTION_BYTES} B, heads at \
             {PENDING_HEAD_BYTES} B, queued requests at {QUEUED_REQUEST_BYTES} B), where \
             {CAPS_PERCENT} % of the limit above {} is available; lower them, or give the \
             process more memory",
            Mib(limit),
            Mib(worst),
            caps.max_connections_per_shard,
            Mib(needs.reserved),
        ));
    }
    // What the connections and heads leave of the room, in queued requests: the queue cap
    // could grow to it and the worst case still fit, as a cap the file sets may.
    let others = Caps {
        max_queued_requests: 0,
        ..caps
    }
    .worst(shards);
    let queue_ceiling =
        u32::try_from(room.saturating_sub(others) / QUEUED_REQUEST_BYTES).unwrap_or(u32::MAX);
    Ok(Budget {
        limit: Some(limit),
        caps,
        derived,
        worst,
        queue_ceiling: Some(queue_ceiling),
    })
}

/// Bytes as MiB, for messages.
pub struct Mib(pub u64);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} MiB", self.0 >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ExplicitCaps, ProxySettings};

    const MIB: u64 = 1 << 20;

    /// The activator's fit of `proxy` on `shards` shards under `limit` MiB (none: no limit).
    fn fit_activator(
        proxy: &ProxySettings,
        shards: usize,
        limit: Option<u64>,
    ) -> Result<Budget, String> {
        fit(
            proxy,
            shards,
            limit.map(|mib| mib * MIB),
            &Needs::activator(),
        )
    }

    fn proxy(explicit: ExplicitCaps, caps: Option<Caps>) -> ProxySettings {
        let mut proxy = ProxySettings {
            explicit_caps: explicit,
            ..ProxySettings::default()
        };
        if let Some(caps) = caps {
            proxy.max_connections_per_shard = caps.max_connections_per_shard;
            proxy.max_pending_heads_per_shard = caps.max_pending_heads_per_shard;
            proxy.max_queued_requests = caps.max_queued_requests;
        }
        proxy
    }

    #[test]
    fn without_a_limit_the_configured_caps_stand() {
        let budget = fit_activator(&ProxySettings::default(), 2, None).unwrap();
        assert_eq!(budget.caps.max_connections_per_shard, 16_384);
        assert_eq!(budget.derived, [false; 3]);
        assert_eq!(budget.worst, budget.caps.worst(2));
    }

    #[test]
    fn caps_the_file_does_not_set_are_derived_from_the_limit_and_fit_it() {
        // Rows: (limit MiB, shards, connections, heads, queued) expected.
        let rows: [(u64, usize, usize, usize, u32); 4] = [
            // deploy/'s limit on 2 shards
            (600, 2, 3_958, 571, 51_455),
            (256, 1, 2_835, 409, 18_431),
            // roomy: the defaults fit, nothing changes
            (16_384, 2, 16_384, 1_024, 100_000),
            (600, 4, 1_979, 285, 51_455),
        ];
        for (limit, shards, connections, heads, queued) in rows {
            let budget = fit_activator(&ProxySettings::default(), shards, Some(limit)).unwrap();
            assert_eq!(
                budget.caps,
                Caps {
                    max_connections_per_shard: connections,
                    max_pending_heads_per_shard: heads,
                    max_queued_requests: queued
                },
                "{limit} MiB on {shards}"
            );
            let room = (limit * MIB - RESERVED_BYTES) / 100 * CAPS_PERCENT;
            assert!(budget.worst <= room, "{limit} MiB on {shards}");
        }
    }

    /// Review finding: the KEDA role kept the activator's 64 MiB back, so under the add-on's
    /// own chart limit for its interceptor (64 MiB) nothing was left and it refused to start.
    /// With its own reserve every cap has room, down to 32 MiB on 2 shards.
    #[test]
    fn the_keda_role_fits_under_the_add_ons_chart_limit_and_half_of_it() {
        for (limit, shards) in [(64, 2), (64, 4), (32, 2)] {
            let budget = fit(
                &ProxySettings::default(),
                shards,
                Some(limit * MIB),
                &Needs::keda_http(),
            )
            .unwrap_or_else(|error| panic!("{limit} MiB on {shards}: {error}"));
            let caps = budget.caps;
            assert!(
                caps.max_connections_per_shard * shards >= 100
                    && caps.max_pending_heads_per_shard >= 4
                    && caps.max_queued_requests >= 500,
                "{limit} MiB on {shards}: {caps:?}"
            );
            let room = (limit * MIB - KEDA_HTTP_RESERVED_BYTES) / 100 * CAPS_PERCENT;
            assert!(budget.worst <= room, "{limit} MiB on {shards}");
        }
        assert!(
            fit(
                &ProxySettings::default(),
                2,
                Some(64 * MIB),
                &Needs::activator()
            )
            .is_err(),
            "the activator's reserve takes all of 64 MiB"
        );
    }

    #[test]
    fn a_cap_set_in_the_file_is_kept_and_refused_when_it_cannot_fit() {
        let explicit = ExplicitCaps {
            max_connections_per_shard: true,
            ..ExplicitCaps::default()
        };
        let caps = Caps {
            max_connections_per_shard: 1_000,
            max_pending_heads_per_shard: 1_024,
            max_queued_requests: 100_000,
        };
        let kept = fit_activator(&proxy(explicit, Some(caps)), 2, Some(600)).unwrap();
        assert_eq!(kept.caps.max_connections_per_shard, 1_000);
        assert_eq!(kept.derived, [false, true, true]);

        let huge = Caps {
            max_connections_per_shard: 1 << 20,
            ..caps
        };
        let error = fit_activator(&proxy(explicit, Some(huge)), 2, Some(600)).unwrap_err();
        assert!(error.contains("proxy.max_connections_per_shard"), "{error}");
        assert!(!error.contains("max_queued_requests"), "{error}");
    }

    #[test]
    fn the_queue_ceiling_is_every_queued_request_the_room_holds_beside_the_other_caps() {
        assert_eq!(
            fit_activator(&ProxySettings::default(), 2, None)
                .unwrap()
                .queue_ceiling,
            None
        );
        for (limit, shards) in [(600, 2), (256, 1), (16_384, 2), (600, 4)] {
            let budget = fit_activator(&ProxySettings::default(), shards, Some(limit)).unwrap();
            let ceiling = budget.queue_ceiling.unwrap();
            assert!(ceiling >= budget.caps.max_queued_requests, "{limit} MiB");
            let room = (limit * MIB - RESERVED_BYTES) / 100 * CAPS_PERCENT;
            let at = |queued: u32| {
                Caps {
                    max_queued_requests: queued,
                    ..budget.caps
                }
                .worst(shards)
            };
            assert!(
                at(ceiling) <= room,
                "{limit} MiB on {shards}: the ceiling fits"
            );
            assert!(
                at(ceiling + 1) > room,
                "{limit} MiB on {shards}: one more does not"
            );
        }
    }

    #[test]
    fn a_limit_below_the_reserve_is_refused() {
        let error = fit_activator(&ProxySettings::default(), 1, Some(32)).unwrap_err();
        assert!(error.contains("even the smallest caps"), "{error}");
    }
}
