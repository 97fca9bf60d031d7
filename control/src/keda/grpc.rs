//! The external scaler KEDA calls (issue 40): `externalscaler.ExternalScaler` (KEDA's
//! `externalscaler.proto`) and the standard gRPC health service under the names the add-on's
//! chart probes (`liveness`, `readiness`), on one plaintext HTTP/2 port (the add-on's
//! `keda-add-ons-http-external-scaler:9090`).
//!
//! Every [`COUNT_EVERY`] the counting task reads this replica's requests per route from the
//! shards' counters, sums them with the other replicas' (`FleetTally`), and keeps the result;
//! the calls answer from it in the add-on's terms (`keda::scaler`). `StreamIsActive` sends the
//! route's activity on every tick of [`STREAM_EVERY`], changed or not, as the add-on does: a
//! request arriving at a route with no pod is seen within one tick.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::stream::{self, Stream};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kactivator_api::grpc_health::{HealthCheckRequest, HealthCheckResponse, ServingStatus};
use kactivator_shards::metrics::{micros_since_start, AllShardStats};
use kactivator_shards::runtime::readiness::Readiness;
use rustc_hash::FxHashMap;
use tokio::sync::watch;
use tonic::codegen::Service;
use tonic::{Request, Response, Status};

use super::counts::{parse_queue, FleetTally, ReplicaCount, RouteId};
use super::object::ObjectKind;
use super::scaler::{self, MetricValue, RouteCount, Subject, Target};
use super::source::ScaledRoutes;
use crate::http_client::KeptConnection;

/// The generated messages and server of `externalscaler.proto`.
#[allow(clippy::all, missing_docs)]
pub mod externalscaler {
    include!(concat!(env!("OUT_DIR"), "/externalscaler.rs"));
}

/// The generated server of `health.proto` (its messages are the api crate's).
#[allow(clippy::all, missing_docs)]
mod health {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

use externalscaler::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use externalscaler::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, ScaledObjectRef,
};
use health::health_server::{Health, HealthServer};

/// How often the counts are taken (the add-on's scaler asks its interceptors every 500 ms;
/// more often here, so that a stream's tick sees an arrival within its own 200 ms).
pub const COUNT_EVERY: Duration = Duration::from_millis(100);
/// How often `StreamIsActive` sends when `KEDA_HTTP_SCALER_STREAM_INTERVAL_MS` is unset (the
/// add-on's default); also how often a health watch looks.
pub const STREAM_EVERY: Duration = Duration::from_millis(200);
/// The counts are stale, and health says so, after this long without a tick (the add-on's
/// scaler: two ticks without a good poll).
const STALE_AFTER: Duration = Duration::from_secs(1);
/// This replica, among the replicas whose counts are summed.
const SELF: &str = "self";

/// The fleet's counts as last taken, and when.
#[derive(Clone, Debug)]
pub struct Counts {
    pub by_route: Arc<BTreeMap<RouteId, RouteCount>>,
    pub taken: Instant,
}

/// This replica's requests per route, summed over the shards: those in it now (held or at a
/// pod) and those since start (the add-on interceptor's `/queue` answer).
pub fn local_counts(stats: &AllShardStats) -> BTreeMap<RouteId, ReplicaCount> {
    let now_us = micros_since_start(Instant::now());
    let revisions: Vec<_> = stats.iter().map(|shard| shard.revisions()).collect();
    // Summed by the revisions' own names, hashed: one name allocated per route, not per shard.
    let mut counts: FxHashMap<(&str, &str), ReplicaCount> = FxHashMap::default();
    for revision in revisions.iter().flatten() {
        let load = revision.load.read(now_us);
        let labels = &revision.labels;
        let count = counts
            .entry((labels.namespace.as_str(), labels.revision.as_str()))
            .or_default();
        count.concurrency += i64::try_from(load.in_flight).unwrap_or(i64::MAX);
        count.requests = count.requests.wrapping_add(load.arrivals);
    }
    counts
        .into_iter()
        .map(|((namespace, name), count)| ((namespace.to_owned(), name.to_owned()), count))
        .collect()
}

/// How long a replica has to answer `/queue` before this tick goes on without it.
const PEER_TIMEOUT: Duration = Duration::from_millis(500);
/// Largest `/queue` answer read from a replica.
const QUEUE_BODY_LIMIT: usize = 4 << 20;

/// Takes the counts every [`COUNT_EVERY`] until the process ends: this replica's from the
/// shards, the others' (`peers`) from their `/queue`. A replica that does not answer adds what
/// it answered last while it is still listed, as the add-on's scaler does (its #1667).
pub async fn count(
    stats: AllShardStats,
    routes: watch::Receiver<ScaledRoutes>,
    peers: watch::Receiver<Vec<SocketAddr>>,
    counts: watch::Sender<Counts>,
) {
    let mut tally = FleetTally::default();
    let mut last: BTreeMap<SocketAddr, BTreeMap<RouteId, ReplicaCount>> = BTreeMap::new();
    // One connection kept to each replica listed, not one made per tick.
    let mut connections: BTreeMap<SocketAddr, KeptConnection> = BTreeMap::new();
    let mut ticks = tokio::time::interval(COUNT_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let view = routes.borrow().clone();
        let listed = peers.borrow().clone();
        connections.retain(|peer, _| listed.contains(peer));
        for &peer in &listed {
            connections
                .entry(peer)
                .or_insert_with(|| KeptConnection::new(peer));
        }
        let answers = futures_util::future::join_all(
            connections
                .iter_mut()
                .map(|(&peer, connection)| async move { (peer, ask_queue(connection).await) }),
        )
        .await;
        last.retain(|peer, _| listed.contains(peer));
        for (peer, answer) in answers {
            match answer {
                Ok(counts) => {
                    last.insert(peer, counts);
                }
                Err(error) => tracing::debug!(%peer, "keda-http: /queue: {error}"),
            }
        }
        let own = local_counts(&stats);
        let replicas = last
            .iter()
            .map(|(peer, counts)| (peer.to_string(), counts))
            .chain(std::iter::once((SELF.to_owned(), &own)));
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let by_route = tally.observe(now, replicas, &view.windows);
        counts.send_replace(Counts {
            by_route: Arc::new(by_route),
            taken: Instant::now(),
        });
    }
}

/// One replica's `/queue`, on the connection kept to it.
async fn ask_queue(
    connection: &mut KeptConnection,
) -> Result<BTreeMap<RouteId, ReplicaCount>, String> {
    let call = crate::http_client::Call {
        method: hyper::Method::GET,
        path: "/queue",
        authority: None,
        headers: &[],
        body: bytes::Bytes::new(),
    };
    let answer = connection
        .send(call, QUEUE_BODY_LIMIT, PEER_TIMEOUT)
        .await?;
    if answer.status != 200 || answer.body_truncated {
        return Err(format!(
            "answered {} ({} bytes)",
            answer.status,
            answer.body.len()
        ));
    }
    parse_queue(&answer.body)
}

/// What the calls answer from.
#[derive(Clone)]
pub struct Scaler {
    routes: watch::Receiver<ScaledRoutes>,
    counts: watch::Receiver<Counts>,
    readiness: Arc<Readiness>,
    /// How often `StreamIsActive` sends.
    stream_every: Duration,
}

impl Scaler {
    pub fn new(
        routes: watch::Receiver<ScaledRoutes>,
        counts: watch::Receiver<Counts>,
        readiness: Arc<Readiness>,
    ) -> Scaler {
        Scaler {
            routes,
            counts,
            readiness,
            stream_every: STREAM_EVERY,
        }
    }

    /// `StreamIsActive` sends every `every` (`KEDA_HTTP_SCALER_STREAM_INTERVAL_MS`).
    pub fn streaming_every(self, every: Duration) -> Scaler {
        Scaler {
            stream_every: every,
            ..self
        }
    }

    /// The values a trigger's subject has now, for `GetMetrics` (the metric `asked` for, with
    /// KEDA's `sN-` taken off) and `IsActive` (`asked` empty). An HTTPScaledObject has one
    /// value whatever metric name is asked for; an InterceptorRoute one per metric it sets
    /// that is asked for, as the add-on's.
    fn values(&self, reference: &ScaledObjectRef, asked: &str) -> Result<Vec<MetricValue>, Status> {
        let counts = self.counts.borrow().by_route.clone();
        match subject(reference)? {
            Subject::HttpScaledObject { name } => {
                let route = (reference.namespace.clone(), name);
                let scaling = self.scaling(ObjectKind::HttpScaledObject, &route)?;
                let count = counts.get(&route).copied().unwrap_or_default();
                Ok(vec![scaler::http_scaled_object_value(
                    &route.0, &route.1, &scaling, count,
                )])
            }
            Subject::InterceptorRoute { name } => {
                let route = (reference.namespace.clone(), name);
                let scaling = self.scaling(ObjectKind::InterceptorRoute, &route)?;
                let count = counts.get(&route).copied().unwrap_or_default();
                Ok(scaler::interceptor_route_values(
                    &route.1, &scaling, asked, count,
                ))
            }
            Subject::Fleet { .. } => {
                let total: i64 = counts.values().map(|count| count.concurrency).sum();
                Ok(vec![MetricValue {
                    name: scaler::http_scaled_object_metric_name(
                        &reference.namespace,
                        &reference.name,
                    ),
                    value: Target::Integer(total),
                }])
            }
        }
    }

    /// What object `kind` `route` scales on; not found as the add-on's cache answers.
    fn scaling(&self, kind: ObjectKind, route: &RouteId) -> Result<scaler::Scaling, Status> {
        self.routes
            .borrow()
            .objects
            .get(&(kind, route.0.clone(), route.1.clone()))
            .copied()
            .ok_or_else(|| {
                Status::not_found(format!(
                    "{} {}/{} not found",
                    kind.describe(),
                    route.0,
                    route.1
                ))
            })
    }

    fn is_active(&self, reference: &ScaledObjectRef) -> Result<bool, Status> {
        let values = self.values(reference, "")?;
        scaler::is_active(&values).map_err(Status::internal)
    }

    /// Whether the counts are fresh, and, for `readiness`, whether the routes have synced.
    fn status(&self, service: &str) -> Option<ServingStatus> {
        let fresh = self.counts.borrow().taken.elapsed() < STALE_AFTER;
        let serving = match service {
            "" | "liveness" => fresh,
            "readiness" => fresh && self.readiness.not_ready().is_none(),
            _ => return None,
        };
        Some(if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        })
    }
}

/// The add-on's dispatch on the trigger's metadata.
fn subject(reference: &ScaledObjectRef) -> Result<Subject, Status> {
    let metadata: BTreeMap<String, String> = reference
        .scaler_metadata
        .iter()
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    Subject::of(&metadata).map_err(|error| Status::invalid_argument(error.to_string()))
}

fn wire_value(value: MetricValue) -> externalscaler::MetricValue {
    let (integer, float) = value.value.fields();
    externalscaler::MetricValue {
        metric_name: value.name,
        metric_value: integer,
        metric_value_float: float,
    }
}

type ActivityStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;
type HealthStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let result = Scaler::is_active(self, request.get_ref())?;
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = ActivityStream;

    /// The route's activity on every tick, until an answer is an error (sent, then the end).
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<ActivityStream>, Status> {
        let reference = request.into_inner();
        // An unknown subject fails the call itself.
        Scaler::is_active(self, &reference)?;
        let scaler = self.clone();
        let mut ticks = tokio::time::interval(self.stream_every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let activity = stream::unfold(
            (scaler, reference, ticks, false),
            |(scaler, reference, mut ticks, ended)| async move {
                if ended {
                    return None;
                }
                ticks.tick().await;
                let answer = Scaler::is_active(&scaler, &reference)
                    .map(|result| IsActiveResponse { result });
                let ended = answer.is_err();
                Some((answer, (scaler, reference, ticks, ended)))
            },
        );
        Ok(Response::new(Box::pin(activity)))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let reference = request.get_ref();
        let spec: Vec<scaler::MetricSpec> = match subject(reference)? {
            Subject::HttpScaledObject { name } => {
                let route = (reference.namespace.clone(), name);
                let scaling = self.scaling(ObjectKind::HttpScaledObject, &route)?;
                vec![scaler::http_scaled_object_spec(
                    &reference.namespace,
                    &route.1,
                    &scaling,
                )]
            }
            Subject::InterceptorRoute { name } => {
                let route = (reference.namespace.clone(), name);
                let scaling = self.scaling(ObjectKind::InterceptorRoute, &route)?;
                scaler::interceptor_route_specs(&route.1, &scaling)
            }
            Subject::Fleet { target } => vec![scaler::MetricSpec {
                name: scaler::http_scaled_object_metric_name(&reference.namespace, &reference.name),
                target: Target::Integer(target),
            }],
        };
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: spec
                .into_iter()
                .map(|spec| {
                    let (integer, float) = spec.target.fields();
                    externalscaler::MetricSpec {
                        metric_name: spec.name,
                        target_size: integer,
                        target_size_float: float,
                    }
                })
                .collect(),
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let request = request.into_inner();
        let reference = request
            .scaled_object_ref
            .ok_or_else(|| Status::invalid_argument("no scaledObjectRef"))?;
        let values = self.values(&reference, &request.metric_name)?;
        Ok(Response::new(GetMetricsResponse {
            metric_values: values.into_iter().map(wire_value).collect(),
        }))
    }
}

#[tonic::async_trait]
impl Health for Scaler {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        let status = self
            .status(service)
            .ok_or_else(|| Status::not_found(format!("unknown service {service:?}")))?;
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }

    type WatchStream = HealthStream;

    /// The status now, then each change, checked every [`STREAM_EVERY`].
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let service = request.into_inner().service;
        let scaler = self.clone();
        let ticks = tokio::time::interval(STREAM_EVERY);
        let changes = stream::unfold(
            (scaler, service, ticks, None::<ServingStatus>),
            |(scaler, service, mut ticks, last)| async move {
                loop {
                    ticks.tick().await;
                    let status = scaler
                        .status(&service)
                        .unwrap_or(ServingStatus::ServiceUnknown);
                    if Some(status) != last {
                        let answer = Ok(HealthCheckResponse {
                            status: status as i32,
                        });
                        return Some((answer, (scaler, service, ticks, Some(status))));
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(changes)))
    }
}

/// Serves both services on `listener` until the process ends: HTTP/2 with prior knowledge
/// (gRPC's plaintext form, as KEDA dials it).
pub async fn serve(listener: tokio::net::TcpListener, scaler: Scaler) {
    let external = ExternalScalerServer::new(scaler.clone());
    let health = HealthServer::new(scaler);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!("keda-http: the scaler port could not accept: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (external, health) = (external.clone(), health.clone());
        let service = service_fn(move |request: hyper::Request<Incoming>| {
            let (mut external, mut health) = (external.clone(), health.clone());
            async move {
                let response = if request.uri().path().starts_with("/grpc.health.v1.Health/") {
                    let Ok(response) = health.call(request).await;
                    response
                } else {
                    let Ok(response) = external.call(request).await;
                    response
                };
                Ok::<_, Infallible>(response)
            }
        });
        tokio::spawn(async move {
            let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!("keda-http: a scaler connection ended: {error}");
            }
        });
    }
}
