//! The HTTP/2 front: h2c with prior knowledge, on every data port (the preface is recognised
//! where an HTTP/1 request head would start, as upstream's `h2c.NewHandler` does), and h2c to
//! pods for the requests that arrived over HTTP/2.
//!
//! Every stream is one request on the shared path (`request::`): identity and probes through
//! [`stream::H2Headers`], admission with one slot per stream, the same deadlines, outcome,
//! errors and counters as HTTP/1. What is HTTP/2's own is here: the connection ([`server`]),
//! one stream's exchange with the pod ([`stream`]), the per-shard connections to pods
//! ([`pods`]) and the adapter that runs the `h2` crate on monoio ([`io`]).
//!
//! Framing, HPACK, stream states and flow control are the `h2` crate's (hyper's HTTP/2, used by
//! tonic and most Rust gRPC): a maintained, fuzzed implementation of RFC 9113 with the
//! mitigations for rapid reset and CONTINUATION floods built in. It is written against tokio's
//! I/O traits only, which monoio provides for its sockets (`poll-io`) under both drivers.

pub(crate) mod io;
pub(crate) mod pods;
pub(crate) mod server;
pub(crate) mod stream;

/// What an HTTP/2 client sends first (RFC 9113 §3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Default of `proxy.h2_max_concurrent_streams`: 250 streams per client connection, as Go's
/// `x/net/http2` server (upstream's) advertises.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 250;
/// Default of `proxy.h2_stream_window_bytes`: 1 MiB, Go's per-stream upload buffer.
pub const DEFAULT_STREAM_WINDOW: u32 = 1 << 20;
/// Default of `proxy.h2_connection_window_bytes`: 2 MiB. What one connection can have buffered
/// in the activator from its client (and from a pod) at most.
pub const DEFAULT_CONNECTION_WINDOW: u32 = 2 << 20;
/// Default of `proxy.h2_max_frame_bytes`: 16 KiB, the protocol's initial value.
pub const DEFAULT_MAX_FRAME: u32 = 16 << 10;
/// Default of `proxy.h2_max_header_list_bytes`: 64 KiB, as an HTTP/1 request head.
pub const DEFAULT_MAX_HEADER_LIST: u32 = 64 << 10;

/// HTTP/2 settings, for client connections and for connections to pods alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct H2Settings {
    /// Streams a client may have open on one connection.
    pub max_concurrent_streams: u32,
    /// Initial flow-control window of each stream, both directions.
    pub stream_window: u32,
    /// Flow-control window of a whole connection, both directions.
    pub connection_window: u32,
    /// Largest frame payload we accept.
    pub max_frame: u32,
    /// Largest header block we accept (decoded size).
    pub max_header_list: u32,
}

impl Default for H2Settings {
    fn default() -> Self {
        H2Settings {
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            stream_window: DEFAULT_STREAM_WINDOW,
            connection_window: DEFAULT_CONNECTION_WINDOW,
            max_frame: DEFAULT_MAX_FRAME,
            max_header_list: DEFAULT_MAX_HEADER_LIST,
        }
    }
}

/// Whether bytes at the start of a connection are the HTTP/2 preface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preface {
    /// The whole preface is there.
    Yes,
    /// What arrived is the preface's beginning: read on.
    Partial,
    /// Not HTTP/2.
    No,
}

/// Looks for the preface at the start of `bytes`.
pub fn preface(bytes: &[u8]) -> Preface {
    let n = bytes.len().min(PREFACE.len());
    if bytes[..n] != PREFACE[..n] {
        Preface::No
    } else if n == PREFACE.len() {
        Preface::Yes
    } else {
        Preface::Partial
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preface_is_recognised_whole_in_pieces_and_not_in_http1() {
        assert_eq!(preface(PREFACE), Preface::Yes);
        let mut with_settings = PREFACE.to_vec();
        with_settings.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert_eq!(preface(&with_settings), Preface::Yes);
        assert_eq!(preface(b"PRI * HTTP/2"), Preface::Partial);
        assert_eq!(preface(b"P"), Preface::Partial);
        assert_eq!(preface(b"POST / HTTP/1.1\r\n"), Preface::No);
        assert_eq!(preface(b"PRI * HTTP/1.1\r\n"), Preface::No);
        assert_eq!(preface(b"GET / HTTP/1.1\r\n\r\n"), Preface::No);
    }
}
