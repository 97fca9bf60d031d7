//! Faults a test can trigger, to show that a panic stays contained (`runtime::contain`) and that
//! a shard that dies turns health red (`runtime::readiness`). They exist only in debug builds
//! (what `cargo test` runs) and only when the process was started with
//! `KACTIVATOR_TEST_FAULTS=1`; the release binary holds none of this.
//!
//! A request carrying [`FAULT_HEADER`] asks for one:
//! * `panic`: the request panics before anything of its answer is written;
//! * `panic-shard`: a task of the shard's own panics (outside any request), ending the shard.

use super::headers::RequestHeaders;

/// The request header that asks for a fault.
pub const FAULT_HEADER: &str = "k-test-fault";

/// The environment variable that arms the faults in a debug build.
pub const FAULTS_ENV: &str = "KACTIVATOR_TEST_FAULTS";

/// Triggers the fault `request` asks for, when faults are armed; else nothing.
#[inline]
pub fn inject(request: &impl RequestHeaders) {
    #[cfg(debug_assertions)]
    armed::inject(request);
    #[cfg(not(debug_assertions))]
    let _ = request;
}

#[cfg(debug_assertions)]
mod armed {
    use std::sync::OnceLock;

    use super::*;

    fn armed() -> bool {
        static ARMED: OnceLock<bool> = OnceLock::new();
        *ARMED.get_or_init(|| std::env::var(FAULTS_ENV).is_ok_and(|value| value == "1"))
    }

    pub(super) fn inject(request: &impl RequestHeaders) {
        let Some(fault) = request.get(FAULT_HEADER) else {
            return;
        };
        if !armed() {
            return;
        }
        match fault {
            b"panic" => panic!("test fault: a panic while serving a request"),
            b"panic-shard" => {
                monoio::spawn(async { panic!("test fault: a panic in a shard's own task") });
            }
            _ => {}
        }
    }
}
