//! The request path every front shares, whatever the protocol: which revision a request is for
//! ([`identity`], over the [`headers`] abstraction), the answers the activator gives itself
//! ([`probes`]), admission and the wait for a pod slot ([`admission`]), deadlines
//! ([`deadlines`]), whether a failed attempt may go to another pod ([`retry`]), how a request
//! ends ([`outcome`]), why it failed, with whose fault it was ([`error`]), and its entry in the
//! revision's counters ([`tally`]).
//!
//! `identity`, `probes`, `deadlines`, `retry`, `outcome` and `error` are pure; `admission` is
//! the shell that waits on the shard's queue and timers.

pub mod admission;
pub mod answer;
pub mod deadlines;
pub mod error;
pub mod faults;
pub mod headers;
pub mod identity;
pub(crate) mod lifecycle;
pub mod log;
pub mod outcome;
pub mod peer;
pub mod policy;
pub mod probes;
pub mod retry;
pub(crate) mod tally;
