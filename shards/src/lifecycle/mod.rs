//! The request path, written once for every front: a request is refused or answered locally
//! (CONNECT, probes, the queue-proxy registration endpoint, an unknown revision), counted in
//! its revision's tally, admitted (a slot on a pod now, or a wait in the queue), sent to the pod
//! in as many attempts as may reach no pod, concluded, and answered by the activator when the
//! pod's answer did not reach the client.
//!
//! What differs between HTTP/1 and HTTP/2 sits behind [`Front`], at the leaves: how the
//! request's fields are read, how an answer of the activator's own is written, how a waiting
//! client is watched, how the request is rewritten for a pod, and the exchange with the pod
//! (its connection, the bytes each way). Upstream's handler chain sets the order of the steps:
//! probes first, then the revision (404), then the wait for a pod, then the proxy
//! (`reference/knative-activator.md` §1).
//!
//! The path is the shell over the request's rules (`request`) and the role's hooks (`role`):
//! it awaits, reads the clock and uses the shard. [`admission`] is the wait for a pod slot,
//! [`tally`] the request's entry in its revision's counters.

pub mod admission;
pub(crate) mod tally;

use std::rc::Rc;

use kactivator_api::{headers, registration};
use monoio::time::Instant;

use self::admission::{acquire, ClientWatch, Held};
use self::tally::Tally;
use crate::request::answer::Answer;
use crate::request::deadlines::{self, Deadlines};
use crate::request::error::RequestError;
use crate::request::faults;
use crate::request::headers::RequestHeaders;
use crate::request::log::{Captured, RequestLog};
use crate::request::outcome::{
    conclude, keeps_connection_after_answer, Concluded, Ended, Next, RequestShape,
};
use crate::request::policy::{Edits, WaitNote};
use crate::request::retry::may_retry;
use crate::request::trace::{Decider, Described, Timeline};
use crate::role::{Marks, Role};
use crate::routing::placeholder::{Placeholder, PlaceholderError, PLACEHOLDER_FAILED};
use crate::routing::replica::{LocalPod, LocalRevision};
use crate::runtime::control_link::EvidenceKind;
use crate::shard::Shard;
use crate::throttle::gate::Class;
use crate::upstream::error::UpstreamError;

/// What the request path needs to know of a request from its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// A CONNECT: refused, the activator is not a forward proxy.
    pub connect: bool,
    /// A POST to the queue-proxy registration path.
    pub registration: bool,
    /// A HEAD: the activator's own answers carry no body.
    pub head_only: bool,
    /// What the conclusion needs: keep-alive, bodiless, upgrade.
    pub request: RequestShape,
}

/// One attempt to have a pod serve the request.
pub(crate) enum Attempt {
    /// As far as the request path is concerned, the request met its pod: relayed, upgraded,
    /// cut, or failed. `fresh`: on a connection made for it (a failure there says more about the
    /// pod than one on a pooled connection that raced its idle timeout).
    Ended { ended: Ended, fresh: bool },
    /// The connection to the pod could not be made: nothing was sent anywhere.
    Unreached(UpstreamError),
    /// The pod took none of it (a refused stream, an answer in another revision's name) and
    /// nothing reached the client. `replayable`: it can be sent again unchanged.
    NotTaken {
        error: UpstreamError,
        replayable: bool,
    },
}

/// Longest wait for the rest of a small body (a registration's).
const SMALL_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a small body (a registration's) could not be read.
pub(crate) enum SmallBody {
    TooLarge,
    Invalid,
    /// The client went away (or stalled past the body timeout).
    Gone,
}

/// A front: the leaves of the request path for one protocol.
pub(crate) trait Front {
    /// The request's fields, as the rules read them; valid until [`Front::prepare`].
    type Headers<'h>: RequestHeaders
    where
        Self: 'h;
    /// The client while the request waits for a slot.
    type Watch<'w>: ClientWatch
    where
        Self: 'w;

    fn headers(&self) -> Self::Headers<'_>;
    fn shape(&self) -> Shape;
    /// What `log` needs of the request for its line, copied before [`Front::prepare`]; `None`
    /// for a request it leaves out.
    fn capture_for_log(&self, log: &RequestLog) -> Option<Captured>;
    /// Writes an answer of the activator's own; `keep_alive`: the connection may carry another
    /// request after it.
    async fn answer(&mut self, shard: &Shard, answer: &Answer<'_>, keep_alive: bool) -> Next;
    /// Reads the whole body, at most `limit` bytes, by `deadline`.
    async fn read_small_body(
        &mut self,
        shard: &Shard,
        limit: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, SmallBody>;
    /// The request is going to a pod: rewrite it for one (the header policy,
    /// `request::policy`, under the role's `edits`; the pod's address comes with each attempt)
    /// and let go of what only the local answers read. With a `trace` (tracing on), the trace
    /// context it decides replaces the request's propagation headers (`request::trace`).
    fn prepare(&mut self, edits: Edits, trace: Option<&mut Decider<'_>>);
    /// The request's id for log lines (`X-Run-Id`, else `X-Request-Id`), once prepared.
    fn request_id(&self) -> &str;
    /// The request's method and path (no query), once prepared: what its spans are named by.
    fn method_and_path(&self) -> (&str, &str);
    fn watch(&mut self) -> Self::Watch<'_>;
    /// One attempt on `pod`, whose slot `held` is: its connection and the exchange. The slot
    /// may be given back before the end (the response is complete while its tail is relayed).
    /// `note`: the fields the pod's response gets from the activator (`WaitNote`), if any.
    async fn attempt(
        &mut self,
        shard: &Rc<Shard>,
        pod: &Rc<LocalPod>,
        deadlines: &Deadlines,
        held: &mut Option<Held<'_>>,
        note: Option<&WaitNote>,
    ) -> Attempt;
}

/// How a request went, for its log line and the connection.
struct Served {
    next: Next,
    status: u16,
    /// The response body's bytes the client got.
    body_bytes: u64,
}

/// Takes one request through the path, and writes its request log line when there is a log;
/// what the connection does next.
pub(crate) async fn serve<F: Front>(shard: &Rc<Shard>, front: &mut F, arrival: Instant) -> Next {
    let Some(log) = shard.settings.request_log.as_deref() else {
        return respond(shard, front, arrival).await.next;
    };
    let captured = front.capture_for_log(log);
    let served = respond(shard, front, arrival).await;
    if let Some(captured) = captured {
        log.write(
            &shard.stats().request_log_dropped,
            &captured,
            served.status,
            served.body_bytes,
            arrival.elapsed(),
        );
    }
    served.next
}

/// Writes an answer of the activator's own, and says how the request went.
async fn answered<F: Front>(
    shard: &Shard,
    front: &mut F,
    answer: &Answer<'_>,
    keep_alive: bool,
) -> Served {
    let next = front.answer(shard, answer, keep_alive).await;
    Served {
        next,
        status: answer.status,
        body_bytes: if front.shape().head_only {
            0
        } else {
            answer.body.len() as u64
        },
    }
}

/// A route's placeholder answers a request while the route has no routable pod
/// (`routing::placeholder`); one it cannot make is the add-on's 500.
async fn answer_placeholder<F: Front>(
    shard: &Shard,
    front: &mut F,
    placeholder: &Placeholder,
    keep_alive: bool,
) -> Served {
    shard.stats().local_responses.increment();
    let (_, path) = front.method_and_path();
    match placeholder.respond(path.as_bytes()) {
        Ok(response) => {
            let answer = Answer {
                status: response.status,
                body: response.body,
                extra_header: None,
                fields: &response.fields,
                error_style: false,
                identity: None,
                wait: None,
            };
            answered(shard, front, &answer, keep_alive).await
        }
        Err(PlaceholderError(why)) => {
            tracing::warn!(request_id = %front.request_id(), "placeholder: {why}");
            let answer = Answer::error(500, PLACEHOLDER_FAILED.as_bytes());
            answered(shard, front, &answer, keep_alive).await
        }
    }
}

/// Answers a request that ended in `error` with an answer of the activator's own (the role's
/// body, and the note of its waits), or, when a full queue turned it away while its route holds
/// requests before its placeholder, with the placeholder instead of the 503. Also what a span
/// says of the failure, when `traced`.
async fn answer_failure<F: Front>(
    shard: &Shard,
    front: &mut F,
    revision: &LocalRevision,
    error: RequestError,
    note: Option<WaitNote>,
    keep_alive: bool,
    traced: bool,
) -> (Served, Option<String>) {
    if let RequestError::QueueFull = error {
        if let Some(placeholder) = revision.placeholder_on_overflow() {
            let served = answer_placeholder(shard, front, &placeholder, keep_alive).await;
            return (served, None);
        }
    }
    tracing::debug!(
        request_id = %front.request_id(),
        status = error.status(),
        fault = error.fault().label(),
        "answered by the activator: {error}"
    );
    let failure = traced.then(|| error.to_string());
    let body = shard.settings.role.error_body(&error);
    let note = note.and_then(WaitNote::for_error);
    let answer = Answer {
        wait: note.as_ref(),
        ..Answer::of_error(&error, &body)
    };
    (answered(shard, front, &answer, keep_alive).await, failure)
}

/// The request path proper.
async fn respond<F: Front>(shard: &Rc<Shard>, front: &mut F, arrival: Instant) -> Served {
    let shape = front.shape();
    if shape.connect {
        // Before probes, registration and routing; whatever the client sends next is meant for a
        // tunnel, so the connection closes.
        shard.stats().local_responses.increment();
        return answered(shard, front, &Answer::connect_refused(), false).await;
    }
    let draining = || shard.is_draining();
    // A probe's body is never read: closing keeps the stream in sync without reading it.
    let local_keep_alive = shape.request.keep_alive && shape.request.bodiless && !draining();
    let role = &shard.settings.role;
    let probe = role.probe(&front.headers(), shard.health());
    if let Some(answer) = probe {
        shard.stats().local_responses.increment();
        return answered(shard, front, &answer.as_answer(), local_keep_alive).await;
    }
    faults::inject(&front.headers());
    if shape.registration && role.takes_registrations() {
        // Boxed: registrations are rare next to proxied requests, and inline their state would
        // widen every connection's future.
        return Box::pin(register(shard, front, shape)).await;
    }
    let found = role.revision(
        &front.headers(),
        &shard.replica,
        &shard.settings.cluster_domain,
    );
    let revision = match found {
        Ok(revision) => revision,
        Err(body) => {
            return answered(
                shard,
                front,
                &Answer::error(404, body.as_bytes()),
                local_keep_alive,
            )
            .await;
        }
    };
    // Read before `prepare`, which lets go of the fields; the default class without a policy.
    let class = revision.classify(&front.headers(), &shard.stats().priority_invalid);
    let marks = role.marks(&front.headers(), &revision.counters);
    let static_route = revision.static_route(&front.headers());
    // A sampled request keeps its decision and timeline in a box of its own: one pointer in
    // every request's state, one branch per step while none is sampled.
    let mut traced = shard
        .tracer
        .decide(|trace| front.prepare(role.edits(), trace))
        .filter(|decided| decided.context.sampled)
        .map(|decided| Box::new((decided, Timeline::default())));
    // What answers the request at once, if anything: its route's placeholder while the route
    // has no routable pod (the request still counted, so the route scales up), or a static
    // route's response. A static route's request is neither counted (it never scales the
    // route) nor held; when it is not answered here it goes straight on.
    let at_once = match &static_route {
        None => revision.placeholder_now(),
        Some(matched) if matched.always || !revision.has_routable_pod() => {
            Some(matched.response.clone())
        }
        Some(_) => None,
    };
    let marks = Marks {
        uncounted: static_route.is_some(),
        ..marks
    };
    let tally = Tally::arrive(shard, &revision, arrival, marks);
    if let Some(placeholder) = at_once {
        // Boxed, as a registration: rare next to proxied requests, its state inline would
        // widen every request's future.
        let served = Box::pin(answer_placeholder(
            shard,
            front,
            &placeholder,
            local_keep_alive,
        ))
        .await;
        tally.end(arrival, served.status, None);
        return served;
    }
    let mut noted = Noted {
        note: None,
        reached_app: None,
        timeline: traced.as_deref_mut().map(|(_, timeline)| timeline),
    };
    let ended = proxy(shard, front, &revision, class, arrival, &mut noted).await;
    let Noted {
        note, reached_app, ..
    } = noted;
    if let (Some((_, timeline)), Some(note)) = (traced.as_deref_mut(), &note) {
        timeline.waited_us = Some(note.waited_us);
        timeline.cold_start = note.cold_start;
    }
    // What the client is told of its waits, if the role tells it.
    let note = role.tell(note);
    // An answer of the activator's own is written here, once the request's own state is gone:
    // this keeps the error path's write out of the (long-lived) waiting state.
    let mut failure = None;
    let served = match conclude(shape.request, ended) {
        Concluded::Done {
            status,
            body_bytes,
            next,
        } => Served {
            next,
            status,
            body_bytes,
        },
        // Out of line and boxed: rare next to a relayed response, and inline it would widen
        // every request's path.
        Concluded::Answer { error, keep_alive } => {
            let (served, why) = Box::pin(answer_failure(
                shard,
                front,
                &revision,
                error,
                note,
                keep_alive && !draining(),
                traced.is_some(),
            ))
            .await;
            failure = why;
            served
        }
    };
    tally.end(arrival, served.status, reached_app);
    if let Some(traced) = traced {
        let (decided, timeline) = *traced;
        let (method, path) = front.method_and_path();
        let described = Described {
            method,
            path,
            namespace: revision.key().namespace(),
            revision: revision.key().name(),
            status: served.status,
            error: failure,
            shard: shard.index,
        };
        shard
            .tracer
            .record(&decided, &timeline, &described, arrival.elapsed());
    }
    served
}

/// What the request path notes while a request is proxied ([`proxy`]), for its answer, its
/// metrics and its spans.
struct Noted<'t> {
    /// Its waits for a slot (`policy::WaitNote`), once it queued.
    note: Option<WaitNote>,
    /// When its last attempt was let through to the app (the queue-proxy role).
    reached_app: Option<Instant>,
    /// A sampled request's admissions and attempts (`request::trace`).
    timeline: Option<&'t mut Timeline>,
}

/// Waits for a pod and has it serve the request, and says how that ended.
///
/// A request that reached no pod goes back to admission, within its deadline and a bounded
/// number of times (`request::retry`): when the connection to the pod could not be made (the
/// pod is reported and this shard passes it over for a moment, see `admission::dial_failed`),
/// and when a pod took none of it (its h2c connection refused the stream) and the request can
/// be sent again.
/// Otherwise a failure is a 502 naming the problem.
///
/// Its waits in the queue are added to `noted.note` (`Some` once the request queued); the pod's
/// response carries them in the activator role (`policy::WaitNote`). In the queue-proxy role,
/// `noted.reached_app` is when the last attempt was let through to the user container (the
/// app-side metrics' start, as upstream's app handler sits behind its breaker).
async fn proxy<F: Front>(
    shard: &Rc<Shard>,
    front: &mut F,
    revision: &Rc<LocalRevision>,
    class: Class,
    arrival: Instant,
    noted: &mut Noted<'_>,
) -> Ended {
    let Noted {
        note,
        reached_app,
        timeline,
    } = noted;
    let role = &shard.settings.role;
    let times_admitted = role.times_admitted();
    let deadlines = Deadlines::new(&revision.timeouts(), arrival);
    let mut attempt = 0;
    // The route the request is at: its own, or once, its failover (`RevisionRoute::cold_start`).
    let mut revision = revision.clone();
    let mut failed_over = false;
    // The last pod that could not be reached: if no other pod serves the request before its
    // deadline, the client hears why, not only that time ran out.
    let mut unreached: Option<UpstreamError> = None;
    loop {
        attempt += 1;
        let admitted = acquire(
            shard,
            &revision,
            class,
            deadlines.first_byte,
            &mut front.watch(),
            note,
        )
        .await;
        let pod = match admitted {
            Ok(pod) => pod,
            Err(RequestError::TimedOut)
                if !failed_over
                    && note.is_some_and(|note| note.cold_start)
                    && Instant::now() < deadlines.first_byte =>
            {
                // The wait for a first pod ran out before the request's own deadline: on to
                // the failover route, else a 504.
                let failover = revision
                    .failover()
                    .and_then(|key| shard.replica.get(key.as_str()));
                let Some(failover) = failover else {
                    return Ended::Failed {
                        error: admission::not_admitted(RequestError::TimedOut, unreached),
                        request_complete: false,
                    };
                };
                revision = failover;
                failed_over = true;
                if let Some(note) = note.as_mut() {
                    note.failed_over = true;
                }
                continue;
            }
            Err(error) => {
                return Ended::Failed {
                    error: admission::not_admitted(error, unreached),
                    request_complete: false,
                };
            }
        };
        if times_admitted {
            *reached_app = Some(Instant::now());
        }
        if let Some(timeline) = timeline.as_deref_mut() {
            let now = arrival.elapsed();
            timeline.admitted = Some(now);
            timeline.first_attempt.get_or_insert(now);
            timeline.attempts += 1;
            timeline.pod = Some(pod.tracker.addr);
        }
        let mut held = Some(Held::new(&pod, &revision, shard));
        let told = role.tell(*note);
        let outcome = front
            .attempt(shard, &pod, &deadlines, &mut held, told.as_ref())
            .await;
        let addr = pod.tracker.addr;
        match outcome {
            Attempt::Ended { ended, fresh } => {
                if let Ended::Failed {
                    error: RequestError::Upstream(failure),
                    ..
                } = &ended
                {
                    tracing::warn!(request_id = %front.request_id(), pod = %addr, class = failure.class(), "{failure}");
                    if failure.is_pod_failure() && fresh {
                        admission::report(shard, &revision, &pod, EvidenceKind::TransportFailure);
                    }
                }
                return ended;
            }
            Attempt::Unreached(error) => {
                tracing::warn!(request_id = %front.request_id(), pod = %addr, class = error.class(), "{error}");
                role.unreached(&error);
                admission::dial_failed(shard, &revision, &pod);
                drop(held);
                if !may_retry(attempt, &error, true) {
                    return Ended::Failed {
                        error: error.into(),
                        request_complete: false,
                    };
                }
                shard.stats().dial_retries.increment();
                unreached = Some(error);
            }
            Attempt::NotTaken { error, replayable } => {
                drop(held);
                if !may_retry(attempt, &error, replayable) {
                    return Ended::Failed {
                        error: error.into(),
                        request_complete: false,
                    };
                }
            }
        }
    }
}

/// `POST /api/v1/pod-registration` from a queue-proxy: check the caller, read the body (at most
/// 64 KiB), hand it to the control thread and answer with what it says once the state worker
/// has applied it. Other methods on the path are proxied like any request, as upstream does.
async fn register<F: Front>(shard: &Rc<Shard>, front: &mut F, shape: Shape) -> Served {
    shard.stats().local_responses.increment();
    let (user_agent, relayed) = {
        let fields = front.headers();
        (
            registration::check_user_agent(fields.get(headers::USER_AGENT)),
            fields.get(headers::RELAYED).is_some(),
        )
    };
    let refused = match user_agent {
        Err(error) => error,
        Ok(()) => match front
            .read_small_body(
                shard,
                registration::MAX_BODY,
                deadlines::later(Instant::now(), SMALL_BODY_TIMEOUT),
            )
            .await
        {
            Ok(body) => {
                let reply = shard.control.register(body, relayed).await;
                let keep_alive = shape.request.keep_alive && !shard.is_draining();
                let answer = Answer {
                    status: reply.status,
                    body: &reply.body,
                    extra_header: reply.json.then_some((
                        "Content-Type",
                        registration::ACCEPTED_CONTENT_TYPE.as_bytes(),
                    )),
                    error_style: !reply.json,
                    identity: None,
                    fields: &[],
                    wait: None,
                };
                return answered(shard, front, &answer, keep_alive).await;
            }
            Err(SmallBody::TooLarge) => registration::RegistrationError::BodyTooLarge,
            Err(SmallBody::Invalid) => registration::RegistrationError::InvalidBody,
            Err(SmallBody::Gone) => {
                return Served {
                    next: Next::Close,
                    status: RequestError::ClientGone.status(),
                    body_bytes: 0,
                }
            }
        },
    };
    // A refusal leaves the body unread: the connection closes unless there was none.
    let keep_alive = keeps_connection_after_answer(shape.request, false);
    let body = refused.body();
    answered(
        shard,
        front,
        &Answer::error(refused.status(), body.as_bytes()),
        keep_alive,
    )
    .await
}
