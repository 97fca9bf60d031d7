//! A request's entry in its revision's counters, from arrival to end, the same for every front:
//! the load the autoscaler reporter reads (and the poke that wakes a revision at zero) and the
//! status and latency the scrape shows. In the queue-proxy role a request an activator sent
//! (`K-Proxy-Request: activator`) is also counted in the revision's proxied load, which the
//! queue-proxy's autoscaler stat reports apart, and every request is counted under its route
//! tag, as upstream's queue-proxy labels its request metrics.

use std::sync::Arc;

use kactivator_api::headers;
use monoio::time::Instant;

use crate::fields::RequestHeaders;
use crate::metrics::{micros_since_start, RevisionCounters, RouteTag, TagHeaders};
use crate::routing::replica::LocalRevision;
use crate::shard::{Role, Shard};

/// A request counted as arrived; [`Tally::end`] counts it out.
pub(crate) struct Tally {
    counters: Arc<RevisionCounters>,
    arrived_us: u64,
    marks: Marks,
}

/// What a request's headers add to its count; read before the front lets go of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Marks {
    /// Counted in the revision's proxied load too.
    pub(crate) proxied: bool,
    /// Counted under this route tag.
    pub(crate) route_tag: RouteTag,
}

impl Marks {
    /// What `role` reads from a request's headers: only a queue-proxy reads anything. A request
    /// is proxied by an activator when `K-Proxy-Request` says `activator` (upstream's
    /// `ProxyHandler`); its route tag is upstream's reading of the ingress's tag headers, named
    /// in `counters`.
    #[inline]
    pub(crate) fn read<H: RequestHeaders + ?Sized>(
        role: &Role,
        fields: &H,
        counters: &RevisionCounters,
    ) -> Marks {
        match role {
            Role::Activator => Marks::default(),
            Role::QueueProxy(_) => Marks {
                proxied: fields.get(headers::PROXY_REQUEST)
                    == Some(headers::PROXY_REQUEST_VALUE.as_bytes()),
                route_tag: counters.route_tags.tag(TagHeaders::read(
                    fields.get(headers::ROUTE_TAG),
                    fields.get(headers::DEFAULT_ROUTE),
                )),
            },
        }
    }
}

impl Tally {
    /// Counts a request for `revision` that arrived at `arrival`, with its [`Marks`].
    /// The revision's first request since the reporter last had it pokes the autoscaler now
    /// rather than at the next tick: a revision at zero waits for that to scale up.
    #[inline]
    pub(crate) fn arrive(
        shard: &Shard,
        revision: &LocalRevision,
        arrival: Instant,
        marks: Marks,
    ) -> Tally {
        let counters = revision.counters.clone();
        let arrived_us = micros_since_start(arrival.into_std());
        if let Some(before) = counters.arrive(arrived_us) {
            shard
                .control
                .poke(revision.key(), &counters, before, arrived_us);
        }
        if marks.proxied {
            counters.proxied.arrive(arrived_us);
        }
        Tally {
            counters,
            arrived_us,
            marks,
        }
    }

    /// Counts the request out with the status it ended with. `reached_app`: in the queue-proxy
    /// role, when the request was let through to the user container (its last attempt's
    /// admission), for the app-side metrics; `None` in the activator role and for a request
    /// that never got that far.
    #[inline]
    pub(crate) fn end(self, arrival: Instant, status: u16, reached_app: Option<Instant>) {
        let latency_us = arrival.elapsed().as_micros() as u64;
        let departed_us = self.arrived_us + latency_us;
        self.counters.load.depart(departed_us);
        if self.marks.proxied {
            self.counters.proxied.depart(departed_us);
        }
        match self.marks.route_tag {
            RouteTag::None => self.counters.record(status, latency_us),
            tag => self.counters.record_tagged(status, tag, latency_us),
        }
        if let Some(admitted) = reached_app {
            let app_us = admitted.elapsed().as_micros() as u64;
            self.counters.record_app(status, app_us);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Ready;

    impl crate::shard::UserContainer for Ready {
        fn is_ready(&self) -> bool {
            true
        }
        fn refused(&self) {}
    }

    fn proxied(role: &Role, fields: &[(&str, &str)]) -> bool {
        let counters = RevisionCounters::new(Default::default(), false);
        Marks::read(role, fields, &counters).proxied
    }

    #[test]
    fn only_a_queue_proxy_counts_requests_an_activator_marked() {
        let queue_proxy = Role::QueueProxy(crate::shard::QueueProxyRole {
            revision: kactivator_api::RevisionKey::new("ns", "rev").unwrap(),
            pre_stop: Arc::default(),
            user: Arc::new(Ready),
        });
        let marked: &[(&str, &str)] = &[("k-proxy-request", "activator")];
        let other: &[(&str, &str)] = &[("K-Proxy-Request", "ingress")];
        let none: &[(&str, &str)] = &[("Host", "a")];
        assert!(proxied(&queue_proxy, marked));
        assert!(!proxied(&queue_proxy, other), "upstream compares the value");
        assert!(!proxied(&queue_proxy, none));
        assert!(
            !proxied(&Role::Activator, marked),
            "the activator reads nothing"
        );
    }

    #[test]
    fn only_a_queue_proxy_counts_requests_by_route_tag() {
        let queue_proxy = Role::QueueProxy(crate::shard::QueueProxyRole {
            revision: kactivator_api::RevisionKey::new("ns", "rev").unwrap(),
            pre_stop: Arc::default(),
            user: Arc::new(Ready),
        });
        let counters = RevisionCounters::new(Default::default(), false);
        let tagged: &[(&str, &str)] = &[("knative-serving-tag", "blue")];
        let default: &[(&str, &str)] = &[("Knative-Serving-Default-Route", "true")];
        let tag =
            |role: &Role, fields: &[(&str, &str)]| Marks::read(role, fields, &counters).route_tag;
        assert_eq!(tag(&queue_proxy, tagged), RouteTag::Named(0));
        assert_eq!(tag(&queue_proxy, default), RouteTag::Default);
        assert_eq!(tag(&queue_proxy, &[]), RouteTag::Disabled);
        assert_eq!(tag(&Role::Activator, tagged), RouteTag::None);
        assert_eq!(counters.route_tags.name(0).as_deref(), Some("blue"));
    }
}
