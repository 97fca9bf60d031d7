//! Real HTTP backends for tests, benchmarks and the demo.
