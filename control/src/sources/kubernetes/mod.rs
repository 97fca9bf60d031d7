//! The Kubernetes source: the cluster watched as the upstream activator watches it.

pub mod backends;
pub mod backoff;
pub mod informers;
pub mod internal_tls;
pub mod model;
pub mod objects;
pub mod trace_config;
