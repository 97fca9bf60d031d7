//! Talking to pods: the per-shard pool of keep-alive connections and the errors of an exchange
//! with a pod, classified so that an operator can act on them.

pub mod error;
pub mod pool;
