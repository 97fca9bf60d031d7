//! What the fuzz targets in `fuzz/` reach that is not public: only with the `fuzzing` feature,
//! which the release binary never enables. Kept to the one entry point the HTTP/2 target needs.

use std::rc::Rc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::request::peer::Peer;
use crate::shard::Shard;

/// Serves one HTTP/2 connection over `io` (its bytes start with the client preface) on
/// `shard`, as `http2::server::take_over` does for a socket, until the connection closes.
pub async fn serve_h2<T>(shard: Rc<Shard>, io: T)
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let peer = Rc::new(Peer::of(([192, 0, 2, 1], 40_000).into()));
    crate::http2::server::serve_connection(shard, io, peer).await
}
