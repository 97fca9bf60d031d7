//! The data plane: one monoio reactor per CPU, each proxying HTTP from its own replica of routing.
//!
//! Layout: pure logic (`identity`, `probes`, `rewrite`, `topology`, `routing`) has no I/O and is
//! tested directly; `proxy`, `pool`, `shard` and `reactor` are the thin I/O shell around it.

pub mod alarm;
pub mod blocks;
pub mod buffer;
pub mod control_link;
pub mod date;
pub mod error;
pub mod identity;
pub mod metrics;
pub mod pool;
pub mod probes;
mod proxy;
mod race;
pub mod reactor;
pub mod reframe;
pub mod replica;
pub mod rewrite;
pub mod routing;
pub mod shard;
pub mod signal;
pub mod throttle;
pub mod topology;

pub use proxy::{CLIENT_CLOSED, HEAD_TIMEOUT};
