//! What kactivator says on the wire, in one place below the data plane, the control plane and
//! the test kit: header names, paths, user agents and the messages of answers the activator
//! writes itself, the queue-proxy registration body, the autoscaler's stat messages, the gRPC
//! health check sent to h2c pods, and the key that names a revision.
//!
//! Nothing here does I/O. The values are Knative's (or the Cerebrium fork's) unless a comment
//! says otherwise; `../shared/reference/knative-activator.md` has the upstream file and line.

#![forbid(unsafe_code)]

pub mod autoscaler;
pub mod grpc_health;
pub mod headers;
pub mod messages;
pub mod probe;
pub mod registration;
mod revision;
/// Trace context (W3C `traceparent`/`tracestate`, B3), ids, sampling: what goes to the pod.
pub mod trace;

pub use revision::{RevisionKey, RevisionKeyError, DEFAULT_CLUSTER_DOMAIN};
