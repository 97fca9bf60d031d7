//! The data plane: one monoio reactor per CPU, each serving clients from its own replica of the
//! routing table.
//!
//! Folders are the layers, from the wire inwards:
//!
//! * [`http1`] — the HTTP/1.1 front: one task per client connection, the exchange with a pod,
//!   upgrades, the queue-proxy registration endpoint. The only place that knows HTTP/1 framing
//!   (beside the sans-IO codec in `kactivator-h1`).
//! * [`http2`] — the HTTP/2 front (h2c): one task per client connection and one per stream, the
//!   per-shard h2c connections to pods. Framing is the `h2` crate's.
//! * [`request`] — the protocol-neutral request path every front goes through: which revision,
//!   local answers, admission and the wait for a pod slot, deadlines, how an exchange ends.
//! * [`upstream`] — connections to pods: the per-shard pool and the errors of talking to a pod.
//! * [`routing`] — the snapshot types the control thread publishes and each shard's replica.
//! * [`throttle`] — pure admission logic shared across shards: slots, the gate, LB policies,
//!   capacity, subsetting.
//! * [`runtime`] — the reactor threads, the shard and its timers, signals and channels.
//! * [`metrics`] — single-writer counters read by the scrape.
//!
//! Pure modules (no I/O, no clock of their own) are `request::{identity, probes, deadlines,
//! outcome}`, `throttle`, `routing` (types), `http1::{rewrite, reframe}`, `runtime::topology`'s
//! parsers and `upstream::error`; the rest is the shell around them.

// Unsafe code is allowed in three places only, each saying why at its `allow`: the
// non-blocking socket calls of the HTTP/1 front (`http1::io`) and of the pool (`upstream::pool`),
// and the recycled exchange blocks (`runtime::blocks`).
#![deny(unsafe_code)]

pub mod http1;
pub mod http2;
pub mod hub;
pub mod metrics;
pub mod preface;
pub mod request;
pub mod routing;
pub mod runtime;
pub mod shard;
pub mod throttle;
pub mod upstream;

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
