//! The throttling core, sans-IO: per-pod slots shared across shards, and (as they land) load
//! balancing, capacity maths and subsetting. Nothing here awaits or reads a clock.

pub mod capacity;
pub mod gate;
pub mod lb;
pub mod slots;
pub mod subsetting;
