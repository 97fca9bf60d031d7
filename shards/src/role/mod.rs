//! The roles kactivator plays on the one request path, as hooks the path calls: Knative's
//! activator ([`Activator`]), its queue-proxy sidecar ([`QueueProxy`]), and KEDA's HTTP
//! add-on's interceptor ([`Interceptor`]). The path
//! (`lifecycle`) never asks which role it serves; a role decides what the path leaves
//! to it. (The shape is pingora's `ProxyHttp`, a trait of hooks a proxy's lifecycle calls at
//! fixed points; the hooks are ours.)
//!
//! The hooks are decisions, not I/O: each gets what it reads (the request's fields, the shard's
//! routing replica, its health) and returns what the path does with it.
//!
//! A shard holds its role as [`Roles`], which implements [`Role`] by handing each hook to the
//! role it holds: a new role is a new type, one variant and one arm of `each_role!`. Dispatch
//! is static: the hooks read the request's fields through each front's own view, inlined;
//! behind a trait object the same hooks cost about 230 more instructions per proxied HTTP/1
//! request (callgrind, BENCHMARKS.md), most of it the fields read out of line.

use std::borrow::Cow;
use std::rc::Rc;

use crate::fields::RequestHeaders;
use crate::metrics::{RevisionCounters, RouteTag};
use crate::request::error::RequestError;
use crate::request::policy::{Edits, WaitNote};
use crate::request::probes::{Health, LocalAnswer};
use crate::routing::replica::{LocalRevision, Replica};
use crate::upstream::error::UpstreamError;

mod activator;
mod interceptor;
mod queue_proxy;

pub use activator::Activator;
pub use interceptor::Interceptor;
pub use queue_proxy::{QueueProxy, UserContainer};

/// What a role decides on the request path, in the order the path asks.
pub trait Role: Send + Sync + std::fmt::Debug {
    /// The answer to a probe (a health check, a network probe), or `None` for a request to go
    /// on. `health`: the shard's (draining, or not ready and why).
    fn probe<H: RequestHeaders + ?Sized>(&self, fields: &H, health: Health) -> Option<LocalAnswer>;

    /// Whether a `POST` to the queue-proxy registration path is a registration for this role
    /// to take (else it is proxied as any request).
    fn takes_registrations(&self) -> bool;

    /// The revision the request is for, or the body of the 404 that says it is not served.
    /// `cluster_domain`: for a cluster-local authority (`<rev>.<ns>.svc.<domain>`).
    fn revision<H: RequestHeaders + ?Sized>(
        &self,
        fields: &H,
        replica: &Replica,
        cluster_domain: &str,
    ) -> Result<Rc<LocalRevision>, String>;

    /// What the request's fields add to its count in `counters` (read before the front lets go
    /// of them).
    fn marks<H: RequestHeaders + ?Sized>(&self, fields: &H, counters: &RevisionCounters) -> Marks;

    /// The header edits the request goes out under.
    fn edits(&self) -> Edits;

    /// What the client is told of the request's waits for a slot (`policy::WaitNote`), given
    /// what the path noted (`None`: it never queued); `None`: nothing.
    fn tell(&self, noted: Option<WaitNote>) -> Option<WaitNote>;

    /// Whether the request is also timed from its admission to its end, as the requests that
    /// reached the app behind a breaker (`RevisionCounters::app`).
    fn times_admitted(&self) -> bool;

    /// The body of the answer the role gives when the request ends in `error`.
    fn error_body<'e>(&self, error: &'e RequestError) -> Cow<'e, [u8]> {
        error.body()
    }

    /// The pod could not be reached for the request (before the path reports it and tries
    /// again or fails): what the role learns from that.
    fn unreached(&self, _error: &UpstreamError) {}

    /// Whether an HTTP/1 client's request to a pod whose revision speaks h2c goes to it in
    /// HTTP/2 (false: every request keeps its client's protocol, as Knative's transports do).
    fn http1_in_h2c(&self) -> bool {
        false
    }
}

/// The role a shard plays: one of the roles this binary has.
#[derive(Clone, Debug)]
pub enum Roles {
    Activator(Activator),
    QueueProxy(QueueProxy),
    Interceptor(Interceptor),
}

impl Default for Roles {
    fn default() -> Roles {
        Roles::Activator(Activator)
    }
}

/// Hands a hook to the role `roles` holds, as `role`.
macro_rules! each_role {
    ($roles:expr, $role:ident => $call:expr) => {
        match $roles {
            Roles::Activator($role) => $call,
            Roles::QueueProxy($role) => $call,
            Roles::Interceptor($role) => $call,
        }
    };
}

impl Role for Roles {
    #[inline]
    fn probe<H: RequestHeaders + ?Sized>(&self, fields: &H, health: Health) -> Option<LocalAnswer> {
        each_role!(self, role => role.probe(fields, health))
    }

    #[inline]
    fn takes_registrations(&self) -> bool {
        each_role!(self, role => role.takes_registrations())
    }

    #[inline]
    fn revision<H: RequestHeaders + ?Sized>(
        &self,
        fields: &H,
        replica: &Replica,
        cluster_domain: &str,
    ) -> Result<Rc<LocalRevision>, String> {
        each_role!(self, role => role.revision(fields, replica, cluster_domain))
    }

    #[inline]
    fn marks<H: RequestHeaders + ?Sized>(&self, fields: &H, counters: &RevisionCounters) -> Marks {
        each_role!(self, role => role.marks(fields, counters))
    }

    #[inline]
    fn edits(&self) -> Edits {
        each_role!(self, role => role.edits())
    }

    #[inline]
    fn tell(&self, noted: Option<WaitNote>) -> Option<WaitNote> {
        each_role!(self, role => role.tell(noted))
    }

    #[inline]
    fn times_admitted(&self) -> bool {
        each_role!(self, role => role.times_admitted())
    }

    fn error_body<'e>(&self, error: &'e RequestError) -> Cow<'e, [u8]> {
        each_role!(self, role => role.error_body(error))
    }

    fn unreached(&self, error: &UpstreamError) {
        each_role!(self, role => role.unreached(error))
    }

    #[inline]
    fn http1_in_h2c(&self) -> bool {
        each_role!(self, role => role.http1_in_h2c())
    }
}

/// What a request's fields add to its count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Counted in the revision's proxied load too.
    pub proxied: bool,
    /// Counted under this route tag.
    pub route_tag: RouteTag,
    /// Not counted at all: a static route's request (KEDA's add-on 0.16), which never scales
    /// its route and is in no request metric.
    pub uncounted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Ready;

    impl UserContainer for Ready {
        fn is_ready(&self) -> bool {
            true
        }
        fn refused(&self) {}
    }

    fn queue_proxy() -> QueueProxy {
        QueueProxy {
            revision: kactivator_api::RevisionKey::new("ns", "rev").unwrap(),
            pre_stop: Default::default(),
            user: std::sync::Arc::new(Ready),
        }
    }

    fn marks(role: &impl Role, fields: &[(&str, &str)]) -> Marks {
        let counters = RevisionCounters::new(Default::default(), false);
        role.marks(fields, &counters)
    }

    #[test]
    fn only_a_queue_proxy_counts_requests_an_activator_marked() {
        let marked: &[(&str, &str)] = &[("k-proxy-request", "activator")];
        let other: &[(&str, &str)] = &[("K-Proxy-Request", "ingress")];
        let none: &[(&str, &str)] = &[("Host", "a")];
        assert!(marks(&queue_proxy(), marked).proxied);
        assert!(
            !marks(&queue_proxy(), other).proxied,
            "upstream compares the value"
        );
        assert!(!marks(&queue_proxy(), none).proxied);
        assert!(
            !marks(&Activator, marked).proxied,
            "the activator reads nothing"
        );
    }

    #[test]
    fn only_a_queue_proxy_counts_requests_by_route_tag() {
        let counters = RevisionCounters::new(Default::default(), false);
        let tagged: &[(&str, &str)] = &[("knative-serving-tag", "blue")];
        let default: &[(&str, &str)] = &[("Knative-Serving-Default-Route", "true")];
        let queue_proxy = Roles::QueueProxy(queue_proxy());
        let activator = Roles::Activator(Activator);
        let tag = |role: &Roles, fields: &[(&str, &str)]| role.marks(fields, &counters).route_tag;
        assert_eq!(tag(&queue_proxy, tagged), RouteTag::Named(0));
        assert_eq!(tag(&queue_proxy, default), RouteTag::Default);
        assert_eq!(tag(&queue_proxy, &[]), RouteTag::Disabled);
        assert_eq!(tag(&activator, tagged), RouteTag::None);
        assert_eq!(counters.route_tags.name(0).as_deref(), Some("blue"));
    }

    #[test]
    fn each_role_times_out_in_its_upstreams_words() {
        let timed_out = RequestError::TimedOut;
        assert_eq!(
            queue_proxy().error_body(&timed_out).as_ref(),
            kactivator_api::messages::QUEUE_PROXY_TIMEOUT.as_bytes()
        );
        assert_eq!(
            Activator.error_body(&timed_out).as_ref(),
            kactivator_api::messages::TIMEOUT.as_bytes()
        );
        let full = RequestError::QueueFull;
        assert_eq!(queue_proxy().error_body(&full), full.body());
    }

    #[test]
    fn a_queue_proxy_fails_health_checks_from_its_pre_stop_hook_on() {
        let role = queue_proxy();
        let health_check: &[(&str, &str)] = &[
            ("User-Agent", "kube-probe/1.30"),
            ("K-Network-Probe", "queue"),
        ];
        let status = |role: &QueueProxy| role.probe(health_check, Health::Healthy).unwrap().status;
        assert_eq!(status(&role), 200);
        role.pre_stop
            .store(true, std::sync::atomic::Ordering::Release);
        assert_eq!(status(&role), 503);
        assert_eq!(
            queue_proxy()
                .probe(health_check, Health::Draining)
                .unwrap()
                .status,
            503
        );
    }
}
