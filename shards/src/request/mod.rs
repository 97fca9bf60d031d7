//! The request path every front shares, whatever the protocol: which revision a request is for,
//! the answers the activator gives itself, admission and the wait for a pod slot, deadlines,
//! and how an exchange ends.

pub mod identity;
pub mod probes;
