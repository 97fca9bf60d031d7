//! The HTTP/1.1 front: reads requests from a client connection, answers locally or takes them
//! through the protocol-neutral request path (`crate::request`), and relays the exchange with
//! the pod. The framing itself is the sans-IO codec `kactivator-h1`; [`rewrite`] and
//! [`reframe`] are the pure pieces of relaying.

mod client;
mod connection;
pub mod date;
mod exchange;
mod io;
pub mod reframe;
mod registration;
pub mod rewrite;
mod upgrade;

pub(crate) use connection::serve_connection;
