//! A request's entry in its revision's counters, from arrival to end, the same for every front:
//! the load the autoscaler reporter reads (and the poke that wakes a revision at zero) and the
//! status and latency the scrape shows.

use std::sync::Arc;

use monoio::time::Instant;

use crate::metrics::{micros_since_start, RevisionCounters};
use crate::routing::replica::LocalRevision;
use crate::shard::Shard;

/// A request counted as arrived; [`Tally::end`] counts it out.
pub(crate) struct Tally {
    counters: Arc<RevisionCounters>,
    arrived_us: u64,
}

impl Tally {
    /// Counts a request for `revision` that arrived at `arrival`. The revision's first request
    /// since the reporter last had it pokes the autoscaler now rather than at the next tick: a
    /// revision at zero waits for that to scale up.
    #[inline]
    pub(crate) fn arrive(shard: &Shard, revision: &LocalRevision, arrival: Instant) -> Tally {
        let counters = revision.counters.clone();
        let arrived_us = micros_since_start(arrival.into_std());
        if let Some(before) = counters.arrive(arrived_us) {
            shard
                .control
                .poke(revision.key(), &counters, before, arrived_us);
        }
        Tally {
            counters,
            arrived_us,
        }
    }

    /// Counts the request out with the status it ended with.
    #[inline]
    pub(crate) fn end(self, arrival: Instant, status: u16) {
        let latency_us = arrival.elapsed().as_micros() as u64;
        self.counters.load.depart(self.arrived_us + latency_us);
        self.counters.record(status, latency_us);
    }
}
