//! KEDA's HTTP add-on's interceptor (`kactivator keda-http`, issue 40): a request's route is
//! the first whose rules match its host, path and headers, in the add-on's precedence
//! (`routing::rules`); it goes to one of the route's ready endpoints, or waits for one. The
//! add-on's probes live on the admin port, so every request on a data port is routed; errors
//! are answered as the add-on answers them (Go's `http.Error` with the status text), and a
//! response from a pod says whether the request waited for a cold start
//! (`X-KEDA-HTTP-Cold-Start`).

use std::borrow::Cow;
use std::rc::Rc;

use super::{Marks, Role};
use crate::fields::RequestHeaders;
use crate::metrics::RevisionCounters;
use crate::request::error::RequestError;
use crate::request::policy::{Edits, WaitNote};
use crate::request::probes::{Health, LocalAnswer};
use crate::routing::replica::{LocalRevision, Replica};

/// The body of the add-on's 404 when no route matches (`http.Error` with the status text).
pub const NOT_FOUND: &str = "Not Found\n";

/// The body of the add-on 0.16's 503 for a request beyond its route's cold-start cap (ours: for
/// one the route's full queue turns away).
pub const TOO_MANY_PENDING: &str = "too many pending requests\n";

/// The interceptor role.
#[derive(Clone, Copy, Debug)]
pub struct Interceptor {
    /// Responses from pods carry `X-KEDA-HTTP-Cold-Start` (the add-on's
    /// `KEDA_HTTP_ENABLE_COLD_START_HEADER`, on by default).
    pub cold_start_field: bool,
}

impl Default for Interceptor {
    fn default() -> Self {
        Interceptor {
            cold_start_field: true,
        }
    }
}

impl Role for Interceptor {
    /// The add-on answers no probe on its proxy port: `/livez` and `/readyz` are the admin
    /// port's.
    #[inline]
    fn probe<H: RequestHeaders + ?Sized>(
        &self,
        _fields: &H,
        _health: Health,
    ) -> Option<LocalAnswer> {
        None
    }

    fn takes_registrations(&self) -> bool {
        false
    }

    #[inline]
    fn revision<H: RequestHeaders + ?Sized>(
        &self,
        fields: &H,
        replica: &Replica,
        _cluster_domain: &str,
    ) -> Result<Rc<LocalRevision>, String> {
        replica
            .route_by_rules(fields)
            .ok_or_else(|| NOT_FOUND.to_owned())
    }

    /// Requests are counted by route only, as the add-on counts them.
    #[inline]
    fn marks<H: RequestHeaders + ?Sized>(
        &self,
        _fields: &H,
        _counters: &RevisionCounters,
    ) -> Marks {
        Marks::default()
    }

    /// The add-on's own (`Edits::Interceptor`): the client's `Host` goes on to the pod,
    /// `X-Forwarded-*` are set as its `Rewrite` sets them, hop-by-hop fields go.
    fn edits(&self) -> Edits {
        Edits::Interceptor
    }

    /// Every response from a pod says whether it waited for a cold start, in the add-on's
    /// field when that is on; a wait for a slot is told in `Server-Timing` as the activator
    /// tells it.
    fn tell(&self, noted: Option<WaitNote>) -> Option<WaitNote> {
        let note = WaitNote {
            keda_field: self.cold_start_field,
            ..noted.unwrap_or_default()
        };
        Some(note).filter(|note| note.queued || note.keda_field)
    }

    fn times_admitted(&self) -> bool {
        false
    }

    /// The add-on's errors are Go's `http.Error` with the status text; a full queue is its
    /// 0.16 cold-start cap's 503 (`reference/keda-http-add-on.md` §4.10).
    fn error_body<'e>(&self, error: &'e RequestError) -> Cow<'e, [u8]> {
        match error {
            RequestError::QueueFull => Cow::Borrowed(TOO_MANY_PENDING.as_bytes()),
            RequestError::TimedOut => Cow::Borrowed(b"Gateway Timeout\n"),
            RequestError::Upstream(_) => Cow::Borrowed(b"Bad Gateway\n"),
            RequestError::RevisionGone => Cow::Borrowed(b"Service Unavailable\n"),
            _ => error.body(),
        }
    }

    /// The add-on sends every request to an `appProtocol: kubernetes.io/h2c` port in h2c,
    /// whatever its client spoke (`reference/keda-http-add-on.md` §4.6): a pod behind one may
    /// speak nothing else.
    fn http1_in_h2c(&self) -> bool {
        true
    }
}
