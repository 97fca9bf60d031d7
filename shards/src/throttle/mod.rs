//! The throttling core, sans-IO (no awaits, no clock, no sockets), shared across shards:
//!
//! * [`slots`] — a pod's in-flight count against this activator's share of its
//!   containerConcurrency;
//! * [`gate`] — a revision's admission across shards: the fair queue and the slot hand-off;
//! * [`discipline`] — the order of one shard's waiters: FIFO, or priority bands and fairness
//!   across flows;
//! * [`lb`] — the load-balancing policies, each a pick and an acquire in one step.
//!
//! The shell that drives it is `routing::replica` on the shards and `state` on the control
//! thread. Which pods this activator sends to and how many slots each gives it (subsetting, the
//! capacity rule) the control plane decides, in its own crate; here a capacity is only a number
//! to admit against.

pub mod discipline;
pub mod gate;
pub mod lb;
pub mod slots;
