//! The queue-proxy role (`kactivator queue-proxy`): what differs from the activator role when
//! the same request path runs as Knative's queue-proxy sidecar, in front of one user container.
//!
//! * [`env`]: the environment Knative's reconciler sets, read with upstream's rules;
//!   [`observability`]: its 1.19+ `OBSERVABILITY_CONFIG`; its `QUEUE_PROXY_TLS_*` are
//!   [`crate::tls::settings`]'s.
//! * [`certs`]: whether Knative mounted the pod's TLS certificate (TLS is refused: not built).
//! * [`readiness`]: the user container's readiness (`SERVING_READINESS_PROBE`), kept current
//!   off the request path.
//! * [`admin`]: the admin port's `/wait-for-drain`.
//! * [`push`]: the Cerebrium fork's push of this pod's events to the activator.
//! * [`stats`]: the autoscaler's `Stat` of the pod's load, window by window (sans-IO), and
//!   [`stat_server`]: the ticker that makes it and the `:9090/metrics` that serves it.
//! * [`request_metrics`]: upstream's request metrics pushed over OTLP, when
//!   `requestMetrics.protocol` is `grpc` or `http/protobuf`.

pub mod admin;
pub mod certs;
pub mod env;
pub mod observability;
pub mod push;
pub mod readiness;
pub mod request_metrics;
pub mod stat_server;
pub mod stats;
