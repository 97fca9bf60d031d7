//! Queue-proxy registrations and the request path's evidence, as the shards hand them over.
//!
//! A registration is parsed and validated here (with the fork's messages), applied through the
//! state worker, answered once applied, and — unless a peer relayed it — relayed once to every
//! peer activator (`cluster.peers`, or in Kubernetes mode the other ready endpoints of
//! `activator-service`, as they are when the registration arrives), so that every replica
//! learns every event (★ the fork only
//! told the replica the Service happened to pick). Evidence (a pod that refused a connection or
//! answered as another revision) becomes an [`Op::Evidence`] naming the tracker it is about.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use kactivator_api::{headers, registration, RevisionKey};
use kactivator_shards::runtime::control_link::{EvidenceKind, PodEvidence, Reply};

use super::{ControlMetrics, RegistrationInputs};
use crate::http_client::{self, Call};
use crate::pod_state::Event;
use crate::state::{Op, OpError, PodTarget, Source};
use crate::worker::{WorkerError, WorkerHandle};

/// Longest time a relay to a peer may take.
const RELAY_TIMEOUT: Duration = Duration::from_secs(2);
/// Most of a peer's answer read (its status is what counts).
const RELAY_ANSWER_LIMIT: usize = 1024;

/// Serves the shards' registrations and evidence until the shards are gone.
pub async fn serve(inputs: RegistrationInputs, worker: WorkerHandle, metrics: Arc<ControlMetrics>) {
    let RegistrationInputs {
        registrations,
        evidence,
        peers,
    } = inputs;
    let evidence_worker = worker.clone();
    let evidence_metrics = metrics.clone();
    tokio::spawn(async move {
        while let Ok(evidence) = evidence.recv_async().await {
            let op = evidence_op(evidence, &evidence_metrics);
            if evidence_worker.enqueue(op).await.is_err() {
                return;
            }
        }
    });
    while let Ok(request) = registrations.recv_async().await {
        // Each registration waits for the worker on its own, so many can be in the worker's
        // channel at once.
        let worker = worker.clone();
        let metrics = metrics.clone();
        let peers = peers.borrow().clone();
        tokio::spawn(async move {
            let answer = register(&request.body, request.relayed, &worker, &metrics, &peers).await;
            let _ = request.reply.send(answer);
        });
    }
}

/// The op that applies a piece of evidence.
fn evidence_op(evidence: PodEvidence, metrics: &ControlMetrics) -> Op {
    let label = match evidence.kind {
        EvidenceKind::TransportFailure => {
            // Taken: the next failure of this pod is reported again.
            evidence.tracker.failure_report_taken();
            "transport_failure"
        }
    };
    metrics.signals.with_label_values(&[label]).inc();
    Op::Evidence {
        revision: evidence.revision,
        addr: evidence.tracker.addr,
        tracker: evidence.tracker.id,
        kind: evidence.kind,
    }
}

/// Parses, applies and (unless it was itself relayed) relays one registration.
async fn register(
    body: &[u8],
    relayed: bool,
    worker: &WorkerHandle,
    metrics: &ControlMetrics,
    peers: &[SocketAddr],
) -> Reply {
    let registration = match registration::parse(body) {
        Ok(registration) => registration,
        Err(error) => {
            metrics
                .registrations
                .with_label_values(&["invalid", ""])
                .inc();
            return Reply {
                status: error.status(),
                body: error.body().into_bytes(),
                json: false,
            };
        }
    };
    let event = registration.event.wire_name();
    // `parse` refuses empty names and a '/', so these always make a key.
    let Ok(revision) = RevisionKey::new(&registration.namespace, &registration.revision) else {
        metrics
            .registrations
            .with_label_values(&["invalid", ""])
            .inc();
        let error = registration::RegistrationError::InvalidBody;
        return Reply {
            status: error.status(),
            body: error.body().into_bytes(),
            json: false,
        };
    };
    let op = Op::MutatePod {
        revision,
        target: PodTarget::Ip(registration.pod_ip),
        event: Event::QueueProxy(registration.event),
        source: Source::QueueProxy,
    };
    let result = worker.apply(op).await;
    if !relayed && !peers.is_empty() {
        let encoded = Bytes::from(registration::encode(&registration));
        for peer in peers.iter().copied() {
            let encoded = encoded.clone();
            let relays = metrics.relays.clone();
            tokio::spawn(async move {
                let result = relay(peer, encoded).await;
                let label = match &result {
                    Ok(200) => "accepted",
                    Ok(_) => "refused",
                    Err(_) => "failed",
                };
                relays.with_label_values(&[label]).inc();
                match result {
                    Ok(200) => {}
                    Ok(status) => {
                        tracing::warn!(%peer, status, "peer refused a relayed registration")
                    }
                    Err(error) => tracing::warn!(%peer, "relaying a registration failed: {error}"),
                }
            });
        }
    }
    let (label, reply) = match result {
        Ok(()) => (
            "accepted",
            Reply {
                status: 200,
                body: registration::ACCEPTED_BODY.as_bytes().to_vec(),
                json: true,
            },
        ),
        Err(WorkerError::Op(
            error @ (OpError::TrackerLimit(..) | OpError::TooManyUndeclared(..)),
        )) => (
            "refused",
            Reply {
                status: 503,
                body: format!("{error}\n").into_bytes(),
                json: false,
            },
        ),
        Err(error) => (
            "failed",
            Reply {
                status: 500,
                body: format!("{error}\n").into_bytes(),
                json: false,
            },
        ),
    };
    metrics
        .registrations
        .with_label_values(&[label, event])
        .inc();
    reply
}

/// Sends a registration to a peer activator's data port, marked as relayed so it stops there.
/// Returns the peer's status.
async fn relay(peer: SocketAddr, body: Bytes) -> Result<u16, String> {
    let call = Call {
        method: Method::POST,
        path: registration::PATH,
        authority: None,
        headers: &[
            (headers::USER_AGENT, registration::USER_AGENT),
            (headers::RELAYED, "1"),
            ("Content-Type", registration::ACCEPTED_CONTENT_TYPE),
        ],
        body,
    };
    // The status is what matters; a little of the body makes a refusal's log line useful.
    http_client::send(peer, call, RELAY_ANSWER_LIMIT, RELAY_TIMEOUT)
        .await
        .map(|answer| answer.status)
}
