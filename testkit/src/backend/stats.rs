//! Request and connection counters shared between a backend's thread and its handle.
//!
//! The counters are plain atomics so that tests read them without an HTTP round trip,
//! which would itself show up in the numbers being measured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A snapshot of a backend's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Requests whose handler started, of any route (including upgrades and 404s).
    pub requests: u64,
    /// Requests whose handler started and whose response body is not yet fully produced
    /// or dropped. A proxy that limits concurrency per pod is checked against this. An
    /// upgrade (`/ws`, `/ws-half-close`) counts only until its 101 response is written.
    pub in_flight: u64,
    /// High-water mark of `in_flight`.
    pub max_in_flight: u64,
    /// Queue-proxy probes answered (`K-Network-Probe: queue`, any path). They are answered
    /// by the backend's "queue-proxy" and never counted in `requests` or `in_flight`, as
    /// they never reach a real pod's user container.
    pub probes: u64,
    /// TCP connections accepted (including those that only carried probes).
    pub connections_accepted: u64,
    /// TCP connections (or connections upgraded away from HTTP) not yet closed.
    pub connections_open: u64,
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    requests: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    probes: AtomicU64,
    connections_accepted: AtomicU64,
    connections_open: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            requests: self.requests.load(Ordering::SeqCst),
            in_flight: self.in_flight.load(Ordering::SeqCst),
            max_in_flight: self.max_in_flight.load(Ordering::SeqCst),
            probes: self.probes.load(Ordering::SeqCst),
            connections_accepted: self.connections_accepted.load(Ordering::SeqCst),
            connections_open: self.connections_open.load(Ordering::SeqCst),
        }
    }

    /// Zeroes the cumulative counters. The gauges (`in_flight`, `connections_open`) are
    /// left alone because live guards will still decrement them, and the high-water mark
    /// restarts from the current level rather than from zero so it never undercounts.
    pub(crate) fn reset(&self) {
        self.requests.store(0, Ordering::SeqCst);
        self.probes.store(0, Ordering::SeqCst);
        self.connections_accepted.store(0, Ordering::SeqCst);
        self.max_in_flight
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    /// Counts a request as started and in flight until the returned guard drops.
    pub(crate) fn request_started(self: &Arc<Self>) -> InFlightGuard {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let now_in_flight = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight
            .fetch_max(now_in_flight, Ordering::SeqCst);
        InFlightGuard {
            counters: Arc::clone(self),
        }
    }

    /// Counts a probe answered.
    pub(crate) fn probe_answered(&self) {
        self.probes.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a connection as accepted and open until the returned guard drops.
    pub(crate) fn connection_opened(self: &Arc<Self>) -> ConnectionGuard {
        self.connections_accepted.fetch_add(1, Ordering::SeqCst);
        self.connections_open.fetch_add(1, Ordering::SeqCst);
        ConnectionGuard {
            counters: Arc::clone(self),
        }
    }
}

/// Keeps one request counted in `in_flight`.
#[derive(Debug)]
pub(crate) struct InFlightGuard {
    counters: Arc<Counters>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.counters.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Keeps one connection counted in `connections_open`.
#[derive(Debug)]
pub(crate) struct ConnectionGuard {
    counters: Arc<Counters>,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.counters
            .connections_open
            .fetch_sub(1, Ordering::SeqCst);
    }
}
