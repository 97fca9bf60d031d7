//! Real HTTP/1.1 backends for end-to-end tests, benchmarks and `kactivator demo`.
//!
//! Nothing here uses kactivator code: the backends are plain tokio + hyper servers, so a
//! bug in the proxy cannot hide behind the same bug in the thing it is tested against.
//! [`backend`] starts servers, [`pattern`] describes the checkable byte pattern served by
//! `/bytes` and verified by `/sink`, [`ports`] hands out free local ports, and
//! [`queue_proxy`] sends pod registrations the way the fork's queue-proxy does,
//! [`autoscaler`] is a stand-in for the autoscaler's stat server, and [`raw_http1`] is the one
//! raw HTTP/1 client the tests and benchmarks read responses with. For the Kubernetes tests,
//! [`apiserver`] runs a real kube-apiserver with its etcd, [`knative`] writes the objects
//! Knative's reconcilers would, and [`podnet`] gives pods real
//! (non-loopback) addresses. [`grpc`] is a gRPC backend speaking HTTP/1.1 and h2c on one
//! port, with an h2c gRPC client for the tests that drive it; [`grpcio`] is a gRPC pod that
//! speaks only HTTP/2 (Python's grpcio server), as users run one standalone.

// One `unsafe` call, `setns(2)` in `podnet`, carries its SAFETY comment; nothing else may.
#![deny(unsafe_code)]

pub mod apiserver;
pub mod autoscaler;
pub mod backend;
pub mod certs;
pub mod collector;
pub mod grpc;
pub mod grpcio;
pub mod keda;
pub mod knative;
pub mod pattern;
pub mod podnet;
pub mod ports;
pub mod queue_proxy;
pub mod raw_http1;

pub use pattern::{pattern_byte, pattern_checksum};
