//! Micro-benchmarks live in `benches/`; this crate has no library code of its own.

#![forbid(unsafe_code)]
