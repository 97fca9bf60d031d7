//! The data plane: one monoio reactor per CPU, each serving clients from its own replica of the
//! routing table.
//!
//! Folders are the layers, from the wire inwards:
//!
//! * [`hub`] — a shard's thread, its accept loop and stop barrier: the only module that knows
//!   both fronts.
//! * [`http1`] — the HTTP/1.1 front: the connection loop, its leaves of the request path
//!   (`front`), the exchange with a pod, upgrades. The only place that knows HTTP/1 framing
//!   (beside the sans-IO codec in `kactivator-h1`).
//! * [`http2`] — the HTTP/2 front (h2c): one task per client connection and one per stream.
//!   Framing is the `h2` crate's.
//! * [`lifecycle`] — the request path every front goes through, written once: local answers,
//!   which revision, admission and the wait for a pod slot, attempts, the answer.
//! * [`request`] — what the path knows of a request, as pure rules: which revision, probes,
//!   deadlines, how an exchange ends, the header policy and its one writer, the request log.
//! * [`shard`] — the protocol-neutral shard context and settings, the role among them.
//! * [`role`] — the roles (activator, queue-proxy) as hooks the request path calls.
//! * [`upstream`] — connections to pods: the per-shard pool, the h2c connections, the errors.
//! * [`runtime`] — the reactor, the byte stream the fronts and pools are generic over, timers,
//!   signals, idle connections, readiness, channels.
//! * [`routing`] — the snapshot types the control thread publishes and each shard's replica.
//! * [`throttle`] — pure admission logic shared across shards: slots, the gate, the queue's
//!   discipline, LB policies.
//! * [`metrics`], [`fields`], [`preface`] — single-writer counters; the view of a request's
//!   fields; the HTTP/2 preface check.
//!
//! Pure modules (no I/O, no clock of their own) are `request::{identity, probes, deadlines,
//! outcome, policy, answer}`, `role`, `throttle`, `routing` (types, `priority`), `fields`, `preface`,
//! `http1::{rewrite, reframe}`, `runtime::topology`'s parsers and `upstream::error`; the rest
//! is the shell around them.

// Unsafe code is allowed in five places only, each saying why at its `allow`: the socket
// shortcuts beneath a byte stream (`runtime::stream`: the non-blocking send, the half-close, the
// peek at an idle connection, the readiness wait), the shutdown of an idle connection
// (`runtime::idle`), the recycled exchange blocks (`runtime::blocks`), the open-file limit
// (`runtime::limits`) and the memory calls (`runtime::memory`).
#![deny(unsafe_code)]

pub mod fields;
pub mod http1;
pub mod http2;
pub mod hub;
pub mod lifecycle;
pub mod metrics;
pub mod preface;
pub mod request;
pub mod role;
pub mod routing;
pub mod runtime;
pub mod shard;
pub mod throttle;
pub mod tracer;
pub mod upstream;

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
