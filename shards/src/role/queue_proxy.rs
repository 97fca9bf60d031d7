//! Knative's queue-proxy sidecar (`kactivator queue-proxy`): every request is for the one
//! revision the pod belongs to and goes to the one pod, the user container; health checks are
//! answered from the user container's readiness, with the revision's identity; requests are
//! counted as upstream's queue-proxy counts them (proxied by an activator, by route tag, and at
//! the app behind the breaker).

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kactivator_api::{headers, messages, RevisionKey};

use super::{Marks, Role};
use crate::fields::RequestHeaders;
use crate::metrics::{RevisionCounters, TagHeaders};
use crate::request::error::RequestError;
use crate::request::policy::{Edits, WaitNote};
use crate::request::probes::{self, Health, LocalAnswer};
use crate::routing::replica::{LocalRevision, Replica};
use crate::upstream::error::UpstreamError;

/// The queue-proxy role.
#[derive(Clone, Debug)]
pub struct QueueProxy {
    /// The pod's revision: every request's, and the identity its health-check answers carry.
    pub revision: RevisionKey,
    /// The user container's readiness, kept by the control thread's prober.
    pub user: Arc<dyn UserContainer>,
    /// Set while the user container's preStop hook (`/wait-for-drain`) has started a drain
    /// that no SIGTERM has confirmed yet: health checks fail as in a drain. Written by the
    /// admin port only.
    pub pre_stop: Arc<AtomicBool>,
}

/// The queue-proxy's view of its user container, as the request path needs it.
pub trait UserContainer: Send + Sync + std::fmt::Debug {
    /// Whether health checks pass: the readiness probe passed and nothing refused since.
    fn is_ready(&self) -> bool;
    /// A connection to the user container was refused: not ready from now on, until the
    /// prober sees it pass again.
    fn refused(&self);
}

impl Role for QueueProxy {
    #[inline]
    fn probe<H: RequestHeaders + ?Sized>(&self, fields: &H, health: Health) -> Option<LocalAnswer> {
        let draining = matches!(health, Health::Draining) || self.pre_stop.load(Ordering::Acquire);
        probes::queue_proxy_answer(fields, &self.revision, || self.user.is_ready(), draining)
    }

    /// A queue-proxy passes the registration path on to its app, as any other path.
    fn takes_registrations(&self) -> bool {
        false
    }

    /// The pod's own revision, whatever the request names.
    #[inline]
    fn revision<H: RequestHeaders + ?Sized>(
        &self,
        _fields: &H,
        replica: &Replica,
        _cluster_domain: &str,
    ) -> Result<Rc<LocalRevision>, String> {
        replica
            .find(self.revision.namespace(), self.revision.name())
            .ok_or_else(|| messages::revision_not_found(self.revision.name()))
    }

    /// A request is proxied by an activator when `K-Proxy-Request` says `activator`
    /// (upstream's `ProxyHandler`); its route tag is upstream's reading of the ingress's tag
    /// headers (`GetRouteTagNameFromRequest`), named in `counters`.
    #[inline]
    fn marks<H: RequestHeaders + ?Sized>(&self, fields: &H, counters: &RevisionCounters) -> Marks {
        Marks {
            proxied: fields.get(headers::PROXY_REQUEST)
                == Some(headers::PROXY_REQUEST_VALUE.as_bytes()),
            route_tag: counters.route_tags.tag(TagHeaders::read(
                fields.get(headers::ROUTE_TAG),
                fields.get(headers::DEFAULT_ROUTE),
            )),
            uncounted: false,
        }
    }

    fn edits(&self) -> Edits {
        Edits::QueueProxy
    }

    /// The queue-proxy role tells nothing of its waits.
    fn tell(&self, _noted: Option<WaitNote>) -> Option<WaitNote> {
        None
    }

    /// Upstream's app-side metrics start behind the breaker.
    fn times_admitted(&self) -> bool {
        true
    }

    /// A timeout in upstream's queue-proxy's words.
    fn error_body<'e>(&self, error: &'e RequestError) -> Cow<'e, [u8]> {
        match error {
            RequestError::TimedOut => Cow::Borrowed(messages::QUEUE_PROXY_TIMEOUT.as_bytes()),
            _ => error.body(),
        }
    }

    /// The app stopped listening: health checks fail now, not at the next probe.
    fn unreached(&self, error: &UpstreamError) {
        if error.is_refusal() {
            self.user.refused();
        }
    }
}
