//! The throttling core, sans-IO (no awaits, no clock, no sockets), shared across shards:
//!
//! * [`slots`] — a pod's in-flight count against this activator's share of its
//!   containerConcurrency;
//! * [`gate`] — a revision's admission across shards: the fair queue and the slot hand-off;
//! * [`discipline`] — the order of one shard's waiters: FIFO, or priority bands and fairness
//!   across flows;
//! * [`lb`] — the load-balancing policies, each a pick and an acquire in one step;
//! * [`capacity`] — the one rule for a revision's capacity here (pod and cluster-IP mode),
//!   called by the control thread's publish path;
//! * [`subsetting`] — which pods, and which share of each, belong to this activator.
//!
//! The shell that drives it is `routing::replica` on the shards and `state` on the control
//! thread.

pub mod capacity;
pub mod discipline;
pub mod gate;
pub mod lb;
pub mod slots;
pub mod subsetting;
