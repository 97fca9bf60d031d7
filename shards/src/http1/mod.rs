//! The HTTP/1.1 front: the connection loop (`connection`), and HTTP/1's leaves of the request
//! path (`front`): reading a request's fields in place, the activator's answers, the rewrite for
//! a pod, and the exchange with it (`exchange`, `upgrade`). The request path itself is
//! `crate::lifecycle`; the framing is the sans-IO codec `kactivator-h1`; [`rewrite`]
//! and [`reframe`] are the pure pieces of relaying.

mod client;
mod connection;
pub mod date;
mod exchange;
mod front;
mod io;
pub mod reframe;
pub mod rewrite;
mod to_h2;
mod upgrade;

#[cfg(test)]
mod tests;

pub(crate) use connection::{serve_connection, Served};
