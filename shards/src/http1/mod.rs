//! The HTTP/1.1 front: reads requests from a client connection, answers locally or hands them
//! to the protocol-neutral request path, and relays the exchange with the pod.

mod connection;
pub mod date;
pub mod reframe;
pub mod rewrite;

pub(crate) use connection::serve_connection;
pub use connection::HEAD_TIMEOUT;
