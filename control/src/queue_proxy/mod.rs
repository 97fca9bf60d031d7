//! The queue-proxy role (`kactivator queue-proxy`): what differs from the activator role when
//! the same request path runs as Knative's queue-proxy sidecar, in front of one user container.
//!
//! * [`env`]: the environment Knative's reconciler sets, read with upstream's rules.
//! * [`readiness`]: the readiness of the user container, kept current by a background prober.

pub mod env;
pub mod readiness;
