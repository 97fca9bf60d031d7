//! Knative's activator: a request names its revision (the Knative headers or the cluster-local
//! authority) and goes to one of that revision's pods; the activator answers its own probes
//! from the shard's health and takes queue-proxies' registrations.

use std::rc::Rc;

use kactivator_api::messages;

use super::{Marks, Role};
use crate::fields::RequestHeaders;
use crate::metrics::RevisionCounters;
use crate::request::identity;
use crate::request::policy::{Edits, WaitNote};
use crate::request::probes::{self, Health, LocalAnswer};
use crate::routing::replica::{LocalRevision, Replica};

/// The activator role.
#[derive(Clone, Copy, Debug, Default)]
pub struct Activator;

impl Role for Activator {
    #[inline]
    fn probe<H: RequestHeaders + ?Sized>(&self, fields: &H, health: Health) -> Option<LocalAnswer> {
        probes::answer(fields, health)
    }

    fn takes_registrations(&self) -> bool {
        true
    }

    #[inline]
    fn revision<H: RequestHeaders + ?Sized>(
        &self,
        fields: &H,
        replica: &Replica,
        cluster_domain: &str,
    ) -> Result<Rc<LocalRevision>, String> {
        match identity::revision_of(fields, cluster_domain) {
            Some(id) => replica
                .find(id.namespace, id.name)
                .ok_or_else(|| messages::revision_not_found(id.name)),
            None => Err(messages::revision_not_found("")),
        }
    }

    /// The activator reads nothing: its requests are counted by code only.
    #[inline]
    fn marks<H: RequestHeaders + ?Sized>(
        &self,
        _fields: &H,
        _counters: &RevisionCounters,
    ) -> Marks {
        Marks::default()
    }

    fn edits(&self) -> Edits {
        Edits::Activator
    }

    fn tell(&self, noted: Option<WaitNote>) -> Option<WaitNote> {
        noted
    }

    fn times_admitted(&self) -> bool {
        false
    }
}
