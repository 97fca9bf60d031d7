//! The HTTP/2 front: h2c with prior knowledge, on every data port (the preface is recognised
//! where an HTTP/1 request head would start, as upstream's `h2c.NewHandler` does), and h2c to
//! pods for the requests that arrived over HTTP/2.
//!
//! Every stream is one request on the shared path (`request::`): identity and probes through
//! [`stream::H2Headers`], admission with one slot per stream, the same deadlines, outcome,
//! errors and counters as HTTP/1. What is HTTP/2's own is here: the connection ([`server`]),
//! one stream's leaves of the request path and its exchange with the pod ([`stream`]), and the
//! adapter that runs the `h2` crate on monoio ([`io`]); the per-shard h2c connections to pods
//! are `upstream::h2c`.
//!
//! Framing, HPACK, stream states and flow control are the `h2` crate's (hyper's HTTP/2, used by
//! tonic and most Rust gRPC): a maintained, fuzzed implementation of RFC 9113 with the
//! mitigations for rapid reset and CONTINUATION floods built in. It is written against tokio's
//! I/O traits only, which monoio provides for its sockets (`poll-io`) under both drivers.

pub(crate) mod io;
pub(crate) mod server;
pub(crate) mod stream;

pub use crate::upstream::h2c::{
    H2Settings, DEFAULT_CONNECTION_WINDOW, DEFAULT_MAX_CONCURRENT_STREAMS, DEFAULT_MAX_FRAME,
    DEFAULT_MAX_HEADER_LIST, DEFAULT_STREAM_WINDOW,
};

pub use crate::preface::{preface, Preface, PREFACE};
