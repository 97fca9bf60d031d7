//! Whether this activator should take traffic, as `/readyz` on the admin port and kubelet
//! probes on the data port both report it: every condition that applies must hold. Written by
//! the control thread (and by a shard thread that dies), read by any thread (a probe reads a
//! few flags).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Said while the autoscaler link is down (upstream's `statSink.Status()` error).
pub const AUTOSCALER_NOT_CONNECTED: &str = kactivator_api::messages::AUTOSCALER_NOT_CONNECTED;
/// Said while a Kubernetes informer has not applied its first list.
pub const INFORMERS_SYNCING: &str = "informers have not synced yet";
/// Said while the TLS data port has no certificate to serve (Knative's `system-internal-tls`
/// without a usable `routing-serving-certs`).
pub const NO_CERTIFICATE: &str = "the TLS data port has no certificate to serve yet (see the log)";
/// Said, by readiness and liveness alike, once a shard thread has died.
pub const SHARD_DIED: &str = "a shard thread died (see the log); this process must be restarted";

/// Health as the kubelet should see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// SIGTERM received: fail so the endpoint is removed before we stop.
    Draining,
    /// Not ready yet, with the reason sent in the body.
    NotReady(&'static str),
}

/// The conditions of readiness besides draining.
#[derive(Debug, Default)]
pub struct Readiness {
    /// An autoscaler is configured: its link must be up.
    autoscaler_required: bool,
    autoscaler_up: AtomicBool,
    /// The Kubernetes source runs: every informer must have applied its first list.
    informers_required: bool,
    informers_synced: AtomicBool,
    /// The TLS data port's certificate comes from a source that may not have one yet: one
    /// must be served.
    certificate_required: AtomicBool,
    certificate_served: AtomicBool,
    /// Shard threads that ended while they should have been serving (a panic outside the work
    /// `runtime::contain` keeps it to). Their listeners are gone and their connections with
    /// them; the process is not what it claims to be, so liveness fails too.
    dead_shards: AtomicUsize,
    /// The index of the first shard that died, plus one (0: none has).
    first_dead: AtomicUsize,
    /// The drain began (SIGTERM, `POST /quitquitquit`): written once, by the control thread,
    /// before it tells the shards; a shard reads it on the request path, so a request that
    /// arrives after readiness failed is told to close even when the shard has not yet taken
    /// the command.
    draining: AtomicBool,
}

impl Readiness {
    pub fn new(autoscaler_required: bool, informers_required: bool) -> Readiness {
        Readiness {
            autoscaler_required,
            informers_required,
            ..Readiness::default()
        }
    }

    pub fn autoscaler_required(&self) -> bool {
        self.autoscaler_required
    }

    pub fn set_autoscaler_up(&self, up: bool) {
        self.autoscaler_up.store(up, Ordering::Release);
    }

    pub fn set_informers_synced(&self) {
        self.informers_synced.store(true, Ordering::Release);
    }

    /// From now on, ready needs a served certificate.
    pub fn require_certificate(&self) {
        self.certificate_required.store(true, Ordering::Release);
    }

    /// A certificate is served (from now on: a later bad one keeps this one).
    pub fn set_certificate_served(&self) {
        self.certificate_served.store(true, Ordering::Release);
    }

    pub fn certificate_served(&self) -> bool {
        self.certificate_served.load(Ordering::Acquire)
    }

    /// The drain begins: readiness fails from now on.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the drain began.
    #[inline]
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Shard `index`'s thread ended by a panic.
    pub fn shard_died(&self, index: usize) {
        self.dead_shards.fetch_add(1, Ordering::AcqRel);
        let _ = self
            .first_dead
            .compare_exchange(0, index + 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The first shard whose thread died, if any has.
    pub fn dead_shard(&self) -> Option<usize> {
        self.first_dead.load(Ordering::Acquire).checked_sub(1)
    }

    /// Shard threads that died.
    pub fn dead_shards(&self) -> usize {
        self.dead_shards.load(Ordering::Acquire)
    }

    /// Why this activator is not ready, or `None` when it is.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.dead_shard().is_some() {
            return Some(SHARD_DIED);
        }
        if self.informers_required && !self.informers_synced.load(Ordering::Acquire) {
            return Some(INFORMERS_SYNCING);
        }
        if self.certificate_required.load(Ordering::Acquire) && !self.certificate_served() {
            return Some(NO_CERTIFICATE);
        }
        if self.autoscaler_required && !self.autoscaler_up.load(Ordering::Acquire) {
            return Some(AUTOSCALER_NOT_CONNECTED);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_condition_that_applies_must_hold() {
        assert_eq!(Readiness::new(false, false).not_ready(), None);
        let both = Readiness::new(true, true);
        assert_eq!(both.not_ready(), Some(INFORMERS_SYNCING));
        both.set_informers_synced();
        assert_eq!(both.not_ready(), Some(AUTOSCALER_NOT_CONNECTED));
        both.set_autoscaler_up(true);
        assert_eq!(both.not_ready(), None);
        both.set_autoscaler_up(false);
        assert_eq!(both.not_ready(), Some(AUTOSCALER_NOT_CONNECTED));
        both.set_autoscaler_up(true);
        both.require_certificate();
        assert_eq!(both.not_ready(), Some(NO_CERTIFICATE));
        both.set_certificate_served();
        assert_eq!(both.not_ready(), None);
    }

    #[test]
    fn a_dead_shard_outweighs_every_other_condition_and_names_the_first() {
        let readiness = Readiness::new(false, false);
        assert_eq!(readiness.dead_shard(), None);
        readiness.shard_died(1);
        readiness.shard_died(0);
        assert_eq!(readiness.not_ready(), Some(SHARD_DIED));
        assert_eq!(readiness.dead_shard(), Some(1));
        assert_eq!(readiness.dead_shards(), 2);
    }
}
