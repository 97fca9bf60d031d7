//! What the request path knows of a request, whatever the protocol, as rules below the shard
//! that runs them (`lifecycle`): which revision a request is for ([`identity`], over the
//! [`headers`] abstraction), the answers the activator gives itself ([`probes`], [`answer`]),
//! what is done to its fields on the way ([`policy`]), deadlines ([`deadlines`]), whether a
//! failed attempt may go to another pod ([`retry`]), how a request ends ([`outcome`]), why it
//! failed, with whose fault it was ([`error`]), the client's address ([`peer`]), and Knative's
//! request log ([`log`]).
//!
//! All but `log::sink` (a thread) and `faults` (test panics) are pure.

pub mod answer;
pub mod deadlines;
pub mod error;
pub mod faults;
pub mod headers;
pub mod identity;
pub mod log;
pub mod outcome;
pub mod peer;
pub mod policy;
pub mod probes;
pub mod retry;
pub mod trace;
