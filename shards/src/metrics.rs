//! Single-writer counters: each shard writes its own, the scrape sums them.
//!
//! A shard is the only writer of its counters, so an increment is a relaxed load, add and store:
//! no `lock` prefix, no contention, no cache line shared with another writer. The control thread
//! reads them at scrape time. Blocks are cache-padded so two shards never share a line.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use crate::routing::RevisionLabels;

/// Upper bounds (ms) of `activator_request_latencies`, as upstream Knative.
pub const LATENCY_BUCKETS_MS: [u64; 26] = [
    5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, 400, 450, 500, 600, 700, 800, 900, 1000,
    2000, 5000, 10000, 20000, 50000, 100000,
];

/// Distinct response codes tracked per revision and shard; more are counted as overflow.
pub const CODE_SLOTS: usize = 12;

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

/// Request count and latency histogram for one response code.
#[derive(Debug, Default)]
pub struct CodeSlot {
    /// HTTP status, 0 while the slot is free. Written once, before any count.
    code: AtomicU32,
    pub count: Counter,
    /// Sum of latencies in microseconds.
    pub latency_sum_us: Counter,
    /// Non-cumulative bucket counts; the last one is +Inf.
    pub buckets: [Counter; LATENCY_BUCKETS_MS.len() + 1],
}

impl CodeSlot {
    pub fn code(&self) -> u16 {
        self.code.load(Ordering::Acquire) as u16
    }
}

/// Per-revision request metrics written by one shard.
#[derive(Debug)]
pub struct RevisionCounters {
    pub labels: RevisionLabels,
    pub slots: [CodeSlot; CODE_SLOTS],
    /// Requests whose code found no free slot.
    pub overflow: Counter,
    /// Requests of this revision currently in this shard (queued or proxied).
    pub concurrency: Gauge,
    /// Requests of this revision waiting in this shard's queue for a pod slot.
    pub queued: Gauge,
}

impl RevisionCounters {
    pub fn new(labels: RevisionLabels) -> RevisionCounters {
        RevisionCounters {
            labels,
            slots: Default::default(),
            overflow: Counter::default(),
            concurrency: Gauge::default(),
            queued: Gauge::default(),
        }
    }

    /// Records one finished request. Only the owning shard calls this.
    pub fn record(&self, status: u16, latency_us: u64) {
        let Some(slot) = self.slot_for(status) else {
            self.overflow.increment();
            return;
        };
        slot.count.increment();
        slot.latency_sum_us.add(latency_us);
        let latency_ms = latency_us / 1000;
        let bucket = LATENCY_BUCKETS_MS
            .iter()
            .position(|&bound| latency_ms <= bound)
            .unwrap_or(LATENCY_BUCKETS_MS.len());
        slot.buckets[bucket].increment();
    }

    fn slot_for(&self, status: u16) -> Option<&CodeSlot> {
        for slot in &self.slots {
            match slot.code() {
                code if code == status => return Some(slot),
                0 => {
                    // Publish the code before any count so a reader never sees counts under 0.
                    slot.code.store(u32::from(status), Ordering::Release);
                    return Some(slot);
                }
                _ => {}
            }
        }
        None
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
    pub requests: Counter,
    pub local_responses: Counter,
    pub upstream_connects: Counter,
    pub upstream_connect_errors: Counter,
    pub upstream_reuses: Counter,
    pub upstream_stale_discards: Counter,
    pub bad_requests: Counter,
    pub client_aborts: Counter,
    /// Requests that left the queue after waiting at least 4 s / 60 s / 180 s (the fork's
    /// warning, error and critical thresholds); each request counts once per threshold.
    pub queue_time_warning: Counter,
    pub queue_time_error: Counter,
    pub queue_time_critical: Counter,
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
            upstream_reuses: Counter::default(),
            upstream_stale_discards: Counter::default(),
            bad_requests: Counter::default(),
            client_aborts: Counter::default(),
            queue_time_warning: Counter::default(),
            queue_time_error: Counter::default(),
            queue_time_critical: Counter::default(),
            revisions: Mutex::new(Vec::new()),
        }
    }

    pub fn driver(&self) -> &'static str {
        *self
            .driver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a new per-revision block for the scraper.
    pub fn register_revision(&self, labels: RevisionLabels) -> Arc<RevisionCounters> {
        let block = Arc::new(RevisionCounters::new(labels));
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
    fn latencies_land_in_upstream_buckets() {
        let counters = RevisionCounters::new(RevisionLabels::default());
        counters.record(200, 4_000); // 4 ms → le=5
        counters.record(200, 5_999); // 5 ms → le=5
        counters.record(200, 150_000); // 150 ms → le=150
        counters.record(200, 200_000_000); // 200 s → +Inf
        let slot = &counters.slots[0];
        assert_eq!(slot.code(), 200);
        assert_eq!(slot.count.get(), 4);
        assert_eq!(slot.buckets[0].get(), 2);
        assert_eq!(slot.buckets[7].get(), 1);
        assert_eq!(slot.buckets[LATENCY_BUCKETS_MS.len()].get(), 1);
    }

    #[test]
    fn codes_get_their_own_slots_until_full() {
        let counters = RevisionCounters::new(RevisionLabels::default());
        for code in 200..200 + CODE_SLOTS as u16 {
            counters.record(code, 1);
        }
        counters.record(200, 1);
        counters.record(599, 1);
        assert_eq!(counters.slots[0].count.get(), 2);
        assert_eq!(counters.overflow.get(), 1);
    }
}
