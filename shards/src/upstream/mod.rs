//! Talking to pods: the per-shard pool of HTTP/1 keep-alive connections (`pool`), the per-shard
//! h2c connections (`h2c`), and the errors of an exchange with a pod, classified so that an
//! operator can act on them (`error`).

pub mod error;
pub mod h2c;
pub mod pool;
