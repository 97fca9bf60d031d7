//! The client at the other end of a connection, as the request path uses it: its IP as text
//! (the `X-Forwarded-For` a pod is sent) and its port (with the IP, a request log's
//! `RemoteAddr`), and whether it came over TLS (the scheme KEDA's interceptor edits tell the
//! pod). Formatted once per connection.

use std::io::Write as _;
use std::net::SocketAddr;

/// A connection's client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The IP as text, without brackets (`10.0.0.1`, `::1`).
    pub ip: Box<[u8]>,
    pub port: u16,
    /// The connection is TLS: the request's scheme is `https`.
    pub tls: bool,
}

impl Peer {
    /// An IPv4 client of a dual-stack listener (`[::]`) arrives as a mapped IPv6 address
    /// (`::ffff:10.0.0.1`): it is written as the IPv4 address it is, as Go's `net` does.
    pub fn of(addr: SocketAddr) -> Peer {
        Peer {
            ip: addr
                .ip()
                .to_canonical()
                .to_string()
                .into_bytes()
                .into_boxed_slice(),
            port: addr.port(),
            tls: false,
        }
    }

    /// The same client, over TLS when `tls`.
    pub fn over_tls(self, tls: bool) -> Peer {
        Peer { tls, ..self }
    }

    /// `ip:port`, an IPv6 address in brackets: Go's `RemoteAddr`.
    pub fn write_addr(&self, out: &mut Vec<u8>) {
        let v6 = self.ip.contains(&b':');
        if v6 {
            out.push(b'[');
        }
        out.extend_from_slice(&self.ip);
        if v6 {
            out.push(b']');
        }
        out.push(b':');
        // Writing to a Vec cannot fail, and formats without allocating.
        let _ = write!(out, "{}", self.port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_written_as_go_writes_remote_addr() {
        for (addr, expected) in [
            ("10.1.2.3:40000", "10.1.2.3:40000"),
            ("[::1]:8012", "[::1]:8012"),
            ("[fe80::1]:1", "[fe80::1]:1"),
            ("[::ffff:10.1.2.3]:40000", "10.1.2.3:40000"),
        ] {
            let peer = Peer::of(addr.parse().unwrap());
            let mut out = Vec::new();
            peer.write_addr(&mut out);
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
        assert_eq!(&*Peer::of("[::1]:9".parse().unwrap()).ip, b"::1");
    }
}
