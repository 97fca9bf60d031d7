//! The reactors and what each shard runs on: threads and listeners, the shard's accept and
//! command loops, its timers, signals and recycled blocks, and the channel to the control thread.

pub mod alarm;
pub mod blocks;
pub mod buffer;
pub mod contain;
pub mod control_link;
pub mod idle;
pub mod late;
pub mod limits;
pub mod memory;
pub(crate) mod race;
pub mod reactor;
pub mod readiness;

pub mod signal;
pub mod stream;
pub mod tls;
pub mod topology;
#[cfg(test)]
pub(crate) mod wakes;
