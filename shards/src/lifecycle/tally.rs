//! A request's entry in its revision's counters, from arrival to end, the same for every front:
//! the load the autoscaler reporter reads (and the poke that wakes a revision at zero) and the
//! status and latency the scrape shows; and what the role read of the request (`role::Marks`):
//! a request an activator sent counted in the revision's proxied load too, which the
//! queue-proxy's autoscaler stat reports apart, and a route tag.

use std::sync::Arc;

use monoio::time::Instant;

use crate::metrics::{micros_since_start, RevisionCounters, RouteTag};
use crate::role::Marks;
use crate::routing::replica::LocalRevision;
use crate::shard::Shard;

/// A request counted as arrived; [`Tally::end`] counts it out. One its role marked
/// `uncounted` is in no counter from arrival to end.
pub(crate) struct Tally {
    counters: Arc<RevisionCounters>,
    arrived_us: u64,
    marks: Marks,
}

impl Tally {
    /// Counts a request for `revision` that arrived at `arrival`, with what its role read of it
    /// ([`Marks`]).
    /// The revision's first request since the reporter last had it pokes the autoscaler now
    /// rather than at the next tick: a revision at zero waits for that to scale up.
    #[inline]
    pub(crate) fn arrive(
        shard: &Shard,
        revision: &LocalRevision,
        arrival: Instant,
        marks: Marks,
    ) -> Tally {
        let counters = revision.counters.clone();
        let arrived_us = micros_since_start(arrival.into_std());
        if marks.uncounted {
            return Tally {
                counters,
                arrived_us,
                marks,
            };
        }
        if let Some(before) = counters.arrive(arrived_us) {
            shard
                .control
                .poke(revision.key(), &counters, before, arrived_us);
        }
        if marks.proxied {
            counters.proxied.arrive(arrived_us);
        }
        Tally {
            counters,
            arrived_us,
            marks,
        }
    }

    /// Counts the request out with the status it ended with. `reached_app`: in the queue-proxy
    /// role, when the request was let through to the user container (its last attempt's
    /// admission), for the app-side metrics; `None` in the activator role and for a request
    /// that never got that far.
    #[inline]
    pub(crate) fn end(self, arrival: Instant, status: u16, reached_app: Option<Instant>) {
        if self.marks.uncounted {
            return;
        }
        let latency_us = arrival.elapsed().as_micros() as u64;
        let departed_us = self.arrived_us + latency_us;
        self.counters.load.depart(departed_us);
        if self.marks.proxied {
            self.counters.proxied.depart(departed_us);
        }
        match self.marks.route_tag {
            RouteTag::None => self.counters.record(status, latency_us),
            tag => self.counters.record_tagged(status, tag, latency_us),
        }
        if let Some(admitted) = reached_app {
            let app_us = admitted.elapsed().as_micros() as u64;
            self.counters.record_app(status, app_us);
        }
    }
}
