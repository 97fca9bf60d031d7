//! Whether this activator should take traffic, as `/readyz` on the admin port and kubelet
//! probes on the data port both report it: every condition that applies must hold. Written by
//! the control thread, read by any thread (a probe reads two flags).

use std::sync::atomic::{AtomicBool, Ordering};

/// Said while the autoscaler link is down (upstream's `statSink.Status()` error).
pub const AUTOSCALER_NOT_CONNECTED: &str = kactivator_api::messages::AUTOSCALER_NOT_CONNECTED;
/// Said while a Kubernetes informer has not applied its first list.
pub const INFORMERS_SYNCING: &str = "informers have not synced yet";

/// The conditions of readiness besides draining.
#[derive(Debug, Default)]
pub struct Readiness {
    /// An autoscaler is configured: its link must be up.
    autoscaler_required: bool,
    autoscaler_up: AtomicBool,
    /// The Kubernetes source runs: every informer must have applied its first list.
    informers_required: bool,
    informers_synced: AtomicBool,
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

    /// Why this activator is not ready, or `None` when it is.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.informers_required && !self.informers_synced.load(Ordering::Acquire) {
            return Some(INFORMERS_SYNCING);
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
    }
}
