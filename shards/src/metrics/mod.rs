//! Single-writer counters: each shard writes its own, the scrape sums them.
//!
//! A shard is the only writer of its counters, so an increment is a relaxed load, add and store:
//! no `lock` prefix, no contention, no cache line shared with another writer. The control thread
//! reads them at scrape time. Blocks are cache-padded so two shards never share a line.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_utils::CachePadded;

pub mod tenants;

use self::tenants::{Tally, TenantRanking};

/// Labels Knative puts on per-revision metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevisionLabels {
    pub namespace: String,
    pub revision: String,
    pub service: String,
    pub configuration: String,
}

/// Upper bounds (ms) of `activator_request_latencies`, as upstream Knative.
pub const LATENCY_BUCKETS_MS: [u64; 26] = [
    5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, 400, 450, 500, 600, 700, 800, 900, 1000,
    2000, 5000, 10000, 20000, 50000, 100000,
];

/// Distinct response codes (with route tags, in the queue-proxy role) tracked per revision and
/// shard; more are counted as overflow.
pub const CODE_SLOTS: usize = 12;

/// Named route tags of one revision with series of their own, per shard; requests under other
/// names are counted as [`RouteTag::Other`] (★: upstream keeps a series per value it is sent).
pub const ROUTE_TAG_SERIES: usize = 8;
/// Longest route tag kept as a name, in bytes: a Knative tag is a DNS label (63 bytes); a longer
/// value is counted as [`RouteTag::Other`].
pub const ROUTE_TAG_NAME_MAX: usize = 63;

/// The traffic tag a request reached the queue-proxy under, as upstream's
/// `GetRouteTagNameFromRequest` (`pkg/queue/request_metric.go`, 1.18;
/// `pkg/queue/routetag_handler.go`, 1.19+) reads it from the ingress's headers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouteTag {
    /// Not counted by tag: the activator role.
    #[default]
    None,
    /// Neither header: tag-header routing is off (`DISABLED`, `kn:disabled`).
    Disabled,
    /// No tag, routed by the default route (`DEFAULT`, `kn:default`).
    Default,
    /// A tag, yet routed by the default route: the tag names no target (`UNDEFINED`,
    /// `kn:undefined`).
    Undefined,
    /// ★ A tag beyond [`ROUTE_TAG_SERIES`] names, or longer than [`ROUTE_TAG_NAME_MAX`]
    /// (`OTHER`, `kn:other`: neither can be a tag's name).
    Other,
    /// A tag by name: the revision counters' [`RouteTags::name`] of this index.
    Named(u8),
}

impl RouteTag {
    /// The tag's number in a code slot's key (0 for [`RouteTag::None`]).
    fn number(self) -> u32 {
        match self {
            RouteTag::None => 0,
            RouteTag::Disabled => 1,
            RouteTag::Default => 2,
            RouteTag::Undefined => 3,
            RouteTag::Other => 4,
            RouteTag::Named(index) => 5 + u32::from(index),
        }
    }

    fn from_number(number: u32) -> RouteTag {
        match number {
            0 => RouteTag::None,
            1 => RouteTag::Disabled,
            2 => RouteTag::Default,
            3 => RouteTag::Undefined,
            4 => RouteTag::Other,
            named => RouteTag::Named((named - 5) as u8),
        }
    }
}

/// What a request's tag headers say, before a name has a number: upstream's rule. Go's
/// `Header.Get` reads an empty value as an absent one; so does this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagHeaders<'a> {
    Disabled,
    Default,
    Undefined,
    Named(&'a [u8]),
}

impl<'a> TagHeaders<'a> {
    pub fn read(tag: Option<&'a [u8]>, default_route: Option<&[u8]>) -> TagHeaders<'a> {
        let tag = tag.filter(|tag| !tag.is_empty());
        let default_route = default_route.filter(|value| !value.is_empty());
        match (tag, default_route) {
            (None, None) => TagHeaders::Disabled,
            (None, Some(_)) => TagHeaders::Default,
            (Some(_), Some(b"true")) => TagHeaders::Undefined,
            (Some(name), _) => TagHeaders::Named(name),
        }
    }
}

/// The route tag names of one revision seen by one shard: written by that shard when a name is
/// first seen, read by scrapes.
#[derive(Debug, Default)]
pub struct RouteTags {
    names: Mutex<Vec<Box<str>>>,
}

impl RouteTags {
    /// The tag of a request with these headers; a new name takes the next number while there
    /// are fewer than [`ROUTE_TAG_SERIES`]. Only the owning shard calls this.
    pub fn tag(&self, headers: TagHeaders<'_>) -> RouteTag {
        let name = match headers {
            TagHeaders::Disabled => return RouteTag::Disabled,
            TagHeaders::Default => return RouteTag::Default,
            TagHeaders::Undefined => return RouteTag::Undefined,
            TagHeaders::Named(name) => name,
        };
        let Ok(name) = std::str::from_utf8(name) else {
            return RouteTag::Other;
        };
        if name.len() > ROUTE_TAG_NAME_MAX {
            return RouteTag::Other;
        }
        let mut names = self
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(index) = names.iter().position(|known| &**known == name) {
            return RouteTag::Named(index as u8);
        }
        if names.len() == ROUTE_TAG_SERIES {
            return RouteTag::Other;
        }
        names.push(name.into());
        RouteTag::Named((names.len() - 1) as u8)
    }

    /// The name of tag `index`, once it has one.
    pub fn name(&self, index: u8) -> Option<Box<str>> {
        self.names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(usize::from(index))
            .cloned()
    }
}

/// A counter with exactly one writing thread.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        // Single writer: a plain read-modify-write is exact and cheaper than fetch_add.
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    #[inline]
    pub fn increment(&self) {
        self.add(1);
    }

    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A gauge with exactly one writing thread.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    #[inline]
    pub fn set(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }

    #[inline]
    pub fn increment(&self) {
        self.set(self.get().wrapping_add(1));
    }

    #[inline]
    pub fn decrement(&self) {
        self.set(self.get().saturating_sub(1));
    }

    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The clock the shards' load and the control thread's reporter share: microseconds since the
/// first time anyone asked, on the monotonic clock.
pub fn micros_since_start(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let since = at.saturating_duration_since(epoch);
    // Whole seconds and microseconds, without `as_micros`' 128-bit arithmetic: this runs for
    // every request.
    since
        .as_secs()
        .wrapping_mul(1_000_000)
        .wrapping_add(u64::from(since.subsec_micros()))
}

/// One revision's load on one shard, for the autoscaler: the requests in flight here (queued
/// ones included), the arrivals, and the time integral of the requests in flight, all
/// cumulative. The shard writes it at each arrival and departure; the control thread reads a
/// consistent snapshot at any time (a sequence lock: the shard never waits, a reader that
/// raced a write reads again) and extends the integral to the time it asks about.
#[derive(Debug, Default)]
pub struct Load {
    /// Odd while the shard writes.
    sequence: AtomicU64,
    arrivals: AtomicU64,
    in_flight: AtomicU64,
    /// When `in_flight` last changed, in [`micros_since_start`].
    last_change_us: AtomicU64,
    /// ∑ in_flight × Δt up to `last_change_us`, in request-microseconds.
    integral: AtomicU64,
}

/// What [`Load::read`] returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadSnapshot {
    pub arrivals: u64,
    pub in_flight: u64,
    /// ∑ in_flight × Δt up to the time asked about, in request-microseconds.
    pub integral: u64,
}

impl Load {
    /// A request arrived at `now_us`. Only the owning shard calls this.
    #[inline]
    pub fn arrive(&self, now_us: u64) {
        self.change(now_us, |in_flight| in_flight + 1, 1);
    }

    /// A request left at `now_us`. Only the owning shard calls this.
    #[inline]
    pub fn depart(&self, now_us: u64) {
        self.change(now_us, |in_flight| in_flight.saturating_sub(1), 0);
    }

    #[inline]
    fn change(&self, now_us: u64, next: impl Fn(u64) -> u64, arrivals: u64) {
        let relaxed = Ordering::Relaxed;
        let in_flight = self.in_flight.load(relaxed);
        let last = self.last_change_us.load(relaxed);
        // A clock read on another core may be a little behind: never integrate backwards.
        let elapsed = now_us.saturating_sub(last);
        let sequence = self.sequence.load(relaxed);
        self.sequence.store(sequence.wrapping_add(1), relaxed);
        fence(Ordering::Release);
        self.integral.store(
            self.integral
                .load(relaxed)
                .wrapping_add(in_flight.wrapping_mul(elapsed)),
            relaxed,
        );
        self.last_change_us.store(last.max(now_us), relaxed);
        self.in_flight.store(next(in_flight), relaxed);
        self.arrivals
            .store(self.arrivals.load(relaxed).wrapping_add(arrivals), relaxed);
        self.sequence
            .store(sequence.wrapping_add(2), Ordering::Release);
    }

    /// Requests in flight now (a plain read, for gauges).
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A consistent snapshot, its integral extended to `now_us`.
    pub fn read(&self, now_us: u64) -> LoadSnapshot {
        loop {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let arrivals = self.arrivals.load(Ordering::Relaxed);
            let in_flight = self.in_flight.load(Ordering::Relaxed);
            let last = self.last_change_us.load(Ordering::Relaxed);
            let integral = self.integral.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.sequence.load(Ordering::Relaxed) != before {
                continue;
            }
            return LoadSnapshot {
                arrivals,
                in_flight,
                integral: integral
                    .wrapping_add(in_flight.wrapping_mul(now_us.saturating_sub(last))),
            };
        }
    }
}

/// Request count and latency histogram for one response code (and route tag).
#[derive(Debug, Default)]
pub struct CodeSlot {
    /// HTTP status in the low 16 bits, the [`RouteTag`]'s number above; 0 while the slot is
    /// free. Written once, before any count.
    key: AtomicU32,
    pub count: Counter,
    /// Sum of latencies in microseconds.
    pub latency_sum_us: Counter,
    /// Non-cumulative bucket counts; the last one is +Inf.
    pub buckets: [Counter; LATENCY_BUCKETS_MS.len() + 1],
}

impl CodeSlot {
    pub fn code(&self) -> u16 {
        self.key.load(Ordering::Acquire) as u16
    }

    /// The route tag of the slot's requests ([`RouteTag::None`] in the activator role).
    pub fn route_tag(&self) -> RouteTag {
        RouteTag::from_number(self.key.load(Ordering::Acquire) >> 16)
    }
}

/// The bucket of [`LATENCY_BUCKETS_MS`] a time in microseconds falls in; the last is +Inf.
#[inline]
fn bucket_of(latency_us: u64) -> usize {
    let latency_ms = latency_us / 1000;
    LATENCY_BUCKETS_MS
        .iter()
        .position(|&bound| latency_ms <= bound)
        .unwrap_or(LATENCY_BUCKETS_MS.len())
}

/// A histogram of times on [`LATENCY_BUCKETS_MS`], written by one shard.
#[derive(Debug, Default)]
pub struct Histogram {
    pub count: Counter,
    /// Sum of the times in microseconds.
    pub sum_us: Counter,
    /// Non-cumulative bucket counts; the last one is +Inf.
    pub buckets: [Counter; LATENCY_BUCKETS_MS.len() + 1],
}

impl Histogram {
    pub fn record(&self, us: u64) {
        self.count.increment();
        self.sum_us.add(us);
        self.buckets[bucket_of(us)].increment();
    }
}

/// ★ How long a revision's requests waited in the activator for a slot (issue 27).
#[derive(Debug, Default)]
pub struct WaitHistograms {
    /// Every wait in the queue, whatever it found.
    pub slot: Histogram,
    /// The waits that began with no routable pod: cold starts.
    pub cold_start: Histogram,
}

/// Bands a revision's priority counters have room for: every band a policy may have
/// (`throttle::discipline::MAX_BANDS`, checked where the policy classifies).
pub const PRIORITY_BANDS: usize = 16;
/// Fairness keys (tenants) of one revision with series of their own, per shard: the heaviest
/// this many a shard sees ([`tenants`]); requests of the rest are counted together
/// (`kactivator_priority_other_tenants_requests_total`), so a client that makes up a new key per
/// request cannot grow the scrape.
pub const TENANT_SERIES: usize = 16;
/// Longest tenant name kept for a label, in bytes; longer ones are cut.
pub const TENANT_NAME_MAX: usize = 64;

/// ★ One priority band of one revision, in one shard (issue 27).
#[derive(Debug, Default)]
pub struct BandCounters {
    /// Requests classified in the band.
    pub requests: Counter,
    /// Requests of the band waiting now.
    pub queued: Gauge,
    /// Waiters of the band that lost their place to a higher band.
    pub shed: Counter,
}

/// A series of one tenant: its name and its requests since it took the series.
#[derive(Debug, Default)]
struct TenantSlot {
    /// Set once the slot first has a tenant.
    taken: AtomicBool,
    /// Locked by the owning shard only when the slot changes tenant (name set, count zeroed)
    /// and by a scrape to read both, so that no scrape pairs one tenant's name with another's
    /// count.
    name: Mutex<Box<str>>,
    /// Written only by the owning shard.
    requests: AtomicU64,
}

/// ★ A revision's requests per priority band and per tenant, in one shard: allocated by the
/// first request a priority policy classifies.
#[derive(Debug)]
pub struct PriorityCounters {
    pub bands: [BandCounters; PRIORITY_BANDS],
    tenants: [TenantSlot; TENANT_SERIES],
    /// Which tenants have the series; locked only by the owning shard (never contended).
    ranking: Mutex<TenantRanking>,
    /// Requests of tenants without a series of their own.
    pub other_tenants: Counter,
}

impl Default for PriorityCounters {
    fn default() -> PriorityCounters {
        PriorityCounters {
            bands: Default::default(),
            tenants: Default::default(),
            ranking: Mutex::new(TenantRanking::new(TENANT_SERIES)),
            other_tenants: Counter::default(),
        }
    }
}

impl PriorityCounters {
    /// Counts a request of flow `flow` (the tenant key's hash; 0 without a key) whose key is
    /// `name()` (read only when the tenant takes a series). Only the owning shard calls this.
    pub fn count_tenant<'n>(&self, flow: u64, name: impl FnOnce() -> Option<&'n [u8]>) {
        let tally = self
            .ranking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count(flow);
        match tally {
            Tally::Series(slot) => {
                let requests = &self.tenants[slot].requests;
                requests.store(requests.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            }
            Tally::Takes(slot) => {
                let slot = &self.tenants[slot];
                let name = name().unwrap_or_default();
                let name = &name[..name.len().min(TENANT_NAME_MAX)];
                let mut held = slot
                    .name
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *held = String::from_utf8_lossy(name).into_owned().into_boxed_str();
                slot.requests.store(1, Ordering::Relaxed);
                slot.taken.store(true, Ordering::Release);
            }
            Tally::Other => self.other_tenants.increment(),
        }
    }

    /// The tenants with series of their own now: (name, requests since it took the series);
    /// the empty name is requests without a key.
    pub fn tenants(&self) -> Vec<(Box<str>, u64)> {
        self.tenants
            .iter()
            .take_while(|slot| slot.taken.load(Ordering::Acquire))
            .map(|slot| {
                let name = slot
                    .name
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                (name.clone(), slot.requests.load(Ordering::Relaxed))
            })
            .collect()
    }
}

/// Requests by response code: a count and a latency histogram per code, written by one shard.
#[derive(Debug, Default)]
pub struct CodeTable {
    /// Allocated by the first request recorded: they are ~2.9 KiB, and most of a large
    /// cluster's revisions never see a request in a given shard (10 000 revisions × 2 shards
    /// would hold 58 MiB of zeros).
    slots: OnceLock<Box<[CodeSlot; CODE_SLOTS]>>,
    /// Requests whose code found no free slot.
    pub overflow: Counter,
}

impl CodeTable {
    /// Records one request. Only the owning shard calls this. Inlined always: the request
    /// table's call is on every request's path, and the app table's is kept apart
    /// (`RevisionCounters::record_app`).
    #[inline(always)]
    pub fn record(&self, status: u16, latency_us: u64) {
        self.record_key(u32::from(status), latency_us);
    }

    /// Records one request with its route tag (the queue-proxy role).
    pub fn record_tagged(&self, status: u16, tag: RouteTag, latency_us: u64) {
        self.record_key(u32::from(status) | tag.number() << 16, latency_us);
    }

    #[inline(always)]
    fn record_key(&self, key: u32, latency_us: u64) {
        let Some(slot) = self.slot_for(key) else {
            self.overflow.increment();
            return;
        };
        slot.count.increment();
        slot.latency_sum_us.add(latency_us);
        slot.buckets[bucket_of(latency_us)].increment();
    }

    /// The codes seen so far with their counts; empty before the first request.
    pub fn slots(&self) -> &[CodeSlot] {
        self.slots.get().map_or(&[], |slots| &slots[..])
    }

    #[inline(always)]
    fn slot_for(&self, key: u32) -> Option<&CodeSlot> {
        // Only the owning shard initialises (and writes) them; a scrape only reads.
        let slots = self.slots.get_or_init(Default::default);
        for slot in slots.iter() {
            match slot.key.load(Ordering::Acquire) {
                taken if taken == key => return Some(slot),
                0 => {
                    // Publish the key before any count so a reader never sees counts under 0.
                    slot.key.store(key, Ordering::Release);
                    return Some(slot);
                }
                _ => {}
            }
        }
        None
    }
}

/// Per-revision request metrics written by one shard.
#[derive(Debug)]
pub struct RevisionCounters {
    pub labels: RevisionLabels,
    /// Requests by code (and, in the queue-proxy role, route tag), from arrival to the end of
    /// the response.
    pub requests: CodeTable,
    /// The route tag names the queue-proxy role saw; empty in the activator role.
    pub route_tags: RouteTags,
    /// In the queue-proxy role, the requests that reached the user container, from the moment
    /// they were let through the breaker (upstream's `app_request_*` and
    /// `kn.serving.invocation.duration`). Empty in the activator role.
    pub app: CodeTable,
    /// Requests of this revision in this shard (queued or proxied), their arrivals and the
    /// time integral, for the autoscaler and the concurrency gauge.
    pub load: Load,
    /// The part of [`RevisionCounters::load`] that came through an activator (`K-Proxy-Request:
    /// activator`), counted only by the queue-proxy role: what Knative's autoscaler subtracts,
    /// since the activator reports those requests itself.
    pub proxied: Load,
    /// Requests of this revision waiting in this shard's queue for a pod slot.
    pub queued: Gauge,
    /// Requests the revision's full queue turned away (shed by a higher band included): KEDA's
    /// add-on 0.16 counts its own (`interceptor_cold_start_rejections_total`).
    pub rejected: Counter,
    /// Allocated by the shard's first wait for the revision, as `slots` are: most revisions
    /// never queue on most shards.
    waits: OnceLock<Box<WaitHistograms>>,
    /// Allocated by the first request a priority policy classifies.
    priority: OnceLock<Box<PriorityCounters>>,
    /// The autoscaler reporter has an entry for this revision (or reports nothing at all):
    /// while it is false, this shard's next arrival tells the control thread at once (the
    /// cold-start poke). Set by the shard that pokes, and by the control thread when it creates
    /// the entry; cleared by the control thread when it deletes the entry.
    pub reported: AtomicBool,
}

impl RevisionCounters {
    /// A block for `labels`. `reporting`: whether an autoscaler reporter will want pokes.
    pub fn new(labels: RevisionLabels, reporting: bool) -> RevisionCounters {
        RevisionCounters {
            labels,
            requests: CodeTable::default(),
            route_tags: RouteTags::default(),
            app: CodeTable::default(),
            load: Load::default(),
            proxied: Load::default(),
            queued: Gauge::default(),
            rejected: Counter::default(),
            waits: OnceLock::new(),
            priority: OnceLock::new(),
            reported: AtomicBool::new(!reporting),
        }
    }

    /// A request arrived at `now_us`: counts it. When this shard must poke the autoscaler
    /// reporter (it has no entry for the revision), returns the load as it was just before
    /// this arrival: the reporter's first window starts there. The usual cost is one read of
    /// a flag that changes rarely; the swap happens only when it is clear.
    #[inline]
    pub fn arrive(&self, now_us: u64) -> Option<LoadSnapshot> {
        let poke =
            !self.reported.load(Ordering::Relaxed) && !self.reported.swap(true, Ordering::AcqRel);
        let before = poke.then(|| self.load.read(now_us));
        self.load.arrive(now_us);
        before
    }

    /// Records one finished request. Only the owning shard calls this.
    #[inline]
    pub fn record(&self, status: u16, latency_us: u64) {
        self.requests.record(status, latency_us);
    }

    /// Records one finished request with its route tag (the queue-proxy role). Kept out of
    /// line, as [`RevisionCounters::record_app`] is.
    #[inline(never)]
    pub fn record_tagged(&self, status: u16, tag: RouteTag, latency_us: u64) {
        self.requests.record_tagged(status, tag, latency_us);
    }

    /// Records one request that reached the user container (the queue-proxy role). Kept out
    /// of line so that the activator's path carries only the call.
    #[inline(never)]
    pub fn record_app(&self, status: u16, latency_us: u64) {
        self.app.record(status, latency_us);
    }

    /// Records one wait in the queue; `cold_start`: it began with no routable pod. Only the
    /// owning shard calls this.
    pub fn record_wait(&self, waited_us: u64, cold_start: bool) {
        let waits = self.waits.get_or_init(Default::default);
        waits.slot.record(waited_us);
        if cold_start {
            waits.cold_start.record(waited_us);
        }
    }

    /// The priority counters, allocated on first use. Only the owning shard calls this.
    pub fn priority_counters(&self) -> &PriorityCounters {
        self.priority.get_or_init(Default::default)
    }

    /// The priority counters, once a policy classified a request of the revision here.
    pub fn priority(&self) -> Option<&PriorityCounters> {
        self.priority.get().map(|counters| &**counters)
    }

    /// The wait histograms, once the shard saw a wait for the revision.
    pub fn waits(&self) -> Option<&WaitHistograms> {
        self.waits.get().map(|waits| &**waits)
    }

    /// The codes seen so far with their counts; empty before the first finished request.
    pub fn code_slots(&self) -> &[CodeSlot] {
        self.requests.slots()
    }
}

/// Per-shard figures: connections, requests, the routing version served, the driver.
#[derive(Debug)]
pub struct ShardStats {
    pub index: usize,
    /// `io-uring` or `epoll`, known once the reactor is built.
    pub driver: Mutex<&'static str>,
    pub routing_version: Gauge,
    pub connections_accepted: Counter,
    pub connections_open: Gauge,
    /// Client connections that spoke HTTP/2 (prior knowledge, on any data port).
    pub h2_connections: Counter,
    /// TLS handshakes completed on the TLS data port, and those that failed (refused, cut,
    /// not done within the head timeout, or no certificate to offer).
    pub tls_handshakes: Counter,
    pub tls_handshake_failures: Counter,
    /// Requests: HTTP/1 requests and HTTP/2 streams.
    pub requests: Counter,
    pub local_responses: Counter,
    pub upstream_connects: Counter,
    pub upstream_connect_errors: Counter,
    /// Requests sent back to admission because the pod they were given could not be reached.
    pub dial_retries: Counter,
    pub upstream_reuses: Counter,
    pub upstream_stale_discards: Counter,
    pub bad_requests: Counter,
    pub client_aborts: Counter,
    /// Times the accept loop paused at the connection or pending-head limit.
    pub accept_pauses: Counter,
    /// Idle keep-alive connections closed to admit a new one at the connection limit.
    pub idle_evictions: Counter,
    /// Connections closed because a request head did not arrive within the head timeout.
    pub head_timeouts: Counter,
    /// Request log lines dropped because the writer's queue was full (stdout did not keep up).
    pub request_log_dropped: Counter,
    /// Requests, streams and connections ended by a panic that was contained to them.
    pub panics: Counter,
    /// Requests that left the queue after waiting at least 4 s / 60 s / 180 s (the fork's
    /// warning, error and critical thresholds); each request counts once per threshold.
    pub queue_time_warning: Counter,
    pub queue_time_error: Counter,
    pub queue_time_critical: Counter,
    /// Waiting requests answered 503 because a request of a higher band took their place in a
    /// full queue (a revision's priority policy).
    pub shed: Counter,
    /// Requests whose priority header was not a band of their revision's policy (they went to
    /// its default band).
    pub priority_invalid: Counter,
    /// Every revision this shard has recorded metrics for. Locked only when a revision is first
    /// seen on this shard and at scrape time, never per request.
    revisions: Mutex<Vec<Arc<RevisionCounters>>>,
}

impl ShardStats {
    pub fn new(index: usize) -> ShardStats {
        ShardStats {
            index,
            driver: Mutex::new("unknown"),
            routing_version: Gauge::default(),
            connections_accepted: Counter::default(),
            connections_open: Gauge::default(),
            requests: Counter::default(),
            local_responses: Counter::default(),
            upstream_connects: Counter::default(),
            upstream_connect_errors: Counter::default(),
            dial_retries: Counter::default(),
            upstream_reuses: Counter::default(),
            upstream_stale_discards: Counter::default(),
            bad_requests: Counter::default(),
            client_aborts: Counter::default(),
            h2_connections: Counter::default(),
            tls_handshakes: Counter::default(),
            tls_handshake_failures: Counter::default(),
            accept_pauses: Counter::default(),
            idle_evictions: Counter::default(),
            head_timeouts: Counter::default(),
            request_log_dropped: Counter::default(),
            panics: Counter::default(),
            queue_time_warning: Counter::default(),
            queue_time_error: Counter::default(),
            queue_time_critical: Counter::default(),
            shed: Counter::default(),
            priority_invalid: Counter::default(),
            revisions: Mutex::new(Vec::new()),
        }
    }

    pub fn driver(&self) -> &'static str {
        *self
            .driver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a new per-revision block for the scraper and the reporter. `reporting`: an
    /// autoscaler reporter runs and wants cold-start pokes.
    pub fn register_revision(
        &self,
        labels: RevisionLabels,
        reporting: bool,
    ) -> Arc<RevisionCounters> {
        let block = Arc::new(RevisionCounters::new(labels, reporting));
        self.revisions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(block.clone());
        block
    }

    /// All per-revision blocks, for the scraper.
    pub fn revisions(&self) -> Vec<Arc<RevisionCounters>> {
        self.revisions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

/// Cache-padded stats of every shard, shared with the control thread.
pub type AllShardStats = Arc<[CachePadded<ShardStats>]>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_without_requests_holds_no_code_slots() {
        let counters = RevisionCounters::new(RevisionLabels::default(), false);
        assert!(counters.code_slots().is_empty());
        counters.record(503, 10);
        assert_eq!(counters.code_slots().len(), CODE_SLOTS);
        assert_eq!(counters.code_slots()[0].code(), 503);
    }

    #[test]
    fn latencies_land_in_upstream_buckets() {
        let counters = RevisionCounters::new(RevisionLabels::default(), false);
        counters.record(200, 4_000); // 4 ms → le=5
        counters.record(200, 5_999); // 5 ms → le=5
        counters.record(200, 150_000); // 150 ms → le=150
        counters.record(200, 200_000_000); // 200 s → +Inf
        let slot = &counters.code_slots()[0];
        assert_eq!(slot.code(), 200);
        assert_eq!(slot.count.get(), 4);
        assert_eq!(slot.buckets[0].get(), 2);
        assert_eq!(slot.buckets[7].get(), 1);
        assert_eq!(slot.buckets[LATENCY_BUCKETS_MS.len()].get(), 1);
    }

    #[test]
    fn the_load_integrates_requests_in_flight_over_time() {
        let load = Load::default();
        load.arrive(1_000);
        load.arrive(1_500);
        assert_eq!(
            load.read(2_000),
            LoadSnapshot {
                arrivals: 2,
                in_flight: 2,
                integral: 500 + 2 * 500,
            }
        );
        load.depart(3_000);
        load.depart(4_000);
        let quiet = load.read(10_000);
        assert_eq!(quiet.in_flight, 0);
        assert_eq!(quiet.arrivals, 2);
        // 1 over [1000, 1500), 2 over [1500, 3000), 1 over [3000, 4000).
        assert_eq!(quiet.integral, 500 + 3_000 + 1_000);
        // A late clock reading never subtracts.
        load.arrive(3_900);
        assert_eq!(load.read(4_000).integral, 4_500);
    }

    #[test]
    fn only_the_first_arrival_without_an_entry_pokes() {
        let counters = RevisionCounters::new(RevisionLabels::default(), true);
        assert_eq!(
            counters.arrive(0),
            Some(LoadSnapshot::default()),
            "no entry: poke, with the load before this request"
        );
        assert_eq!(counters.arrive(1), None, "already poked");
        counters.load.depart(2);
        counters.load.depart(3);
        // The reporter deleted its entry: the next arrival pokes again.
        counters.reported.store(false, Ordering::Release);
        assert_eq!(
            counters.arrive(4),
            Some(LoadSnapshot {
                arrivals: 2,
                in_flight: 0,
                integral: 1 + 2 + 1,
            })
        );
        let silent = RevisionCounters::new(RevisionLabels::default(), false);
        assert_eq!(silent.arrive(0), None, "no reporter: never pokes");
    }

    #[test]
    fn codes_get_their_own_slots_until_full() {
        let counters = RevisionCounters::new(RevisionLabels::default(), false);
        for code in 200..200 + CODE_SLOTS as u16 {
            counters.record(code, 1);
        }
        counters.record(200, 1);
        counters.record(599, 1);
        assert_eq!(counters.code_slots()[0].count.get(), 2);
        assert_eq!(counters.requests.overflow.get(), 1);
    }

    #[test]
    fn the_route_tag_is_read_as_upstream_reads_it() {
        let read = |tag: Option<&'static str>, default: Option<&'static str>| {
            TagHeaders::read(tag.map(str::as_bytes), default.map(str::as_bytes))
        };
        assert_eq!(read(None, None), TagHeaders::Disabled);
        assert_eq!(
            read(Some(""), Some("")),
            TagHeaders::Disabled,
            "empty is absent"
        );
        assert_eq!(read(None, Some("true")), TagHeaders::Default);
        assert_eq!(read(None, Some("false")), TagHeaders::Default);
        assert_eq!(read(Some("blue"), Some("true")), TagHeaders::Undefined);
        assert_eq!(read(Some("blue"), None), TagHeaders::Named(b"blue"));
        assert_eq!(
            read(Some("blue"), Some("false")),
            TagHeaders::Named(b"blue"),
            "only `true` marks the default route"
        );
    }

    #[test]
    fn route_tags_get_numbers_until_full_and_share_a_slot_per_code_and_tag() {
        let counters = RevisionCounters::new(RevisionLabels::default(), false);
        let tags = &counters.route_tags;
        let blue = tags.tag(TagHeaders::Named(b"blue"));
        assert_eq!(blue, RouteTag::Named(0));
        assert_eq!(tags.tag(TagHeaders::Named(b"blue")), blue);
        for index in 1..ROUTE_TAG_SERIES {
            let name = format!("tag-{index}");
            assert_eq!(
                tags.tag(TagHeaders::Named(name.as_bytes())),
                RouteTag::Named(index as u8)
            );
        }
        assert_eq!(
            tags.tag(TagHeaders::Named(b"one-too-many")),
            RouteTag::Other
        );
        assert_eq!(tags.tag(TagHeaders::Named(&[b'a'; 64])), RouteTag::Other);
        assert_eq!(tags.tag(TagHeaders::Named(b"\xff")), RouteTag::Other);
        assert_eq!(tags.name(0).as_deref(), Some("blue"));

        counters.record_tagged(200, blue, 1);
        counters.record_tagged(200, blue, 1);
        counters.record_tagged(200, RouteTag::Disabled, 1);
        let slots = counters.code_slots();
        assert_eq!((slots[0].code(), slots[0].route_tag()), (200, blue));
        assert_eq!(slots[0].count.get(), 2);
        assert_eq!(
            (slots[1].code(), slots[1].route_tag()),
            (200, RouteTag::Disabled)
        );
        let last = RouteTag::Named(ROUTE_TAG_SERIES as u8 - 1);
        counters.record_tagged(599, last, 1);
        assert_eq!(slots[2].route_tag(), last, "every tag number fits the key");
    }
}
