//! Free local TCP ports for tests that need to know an address before something binds it.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// Lowest port handed out; below it live well-known services.
const FLOOR: u16 = 10_000;

/// Returns a port that was free on 127.0.0.1 a moment ago.
///
/// The port is checked by binding it and dropping the listener, so another process can grab
/// it before the caller binds it; prefer binding port 0 directly where the API allows. To keep
/// that window harmless, ports come from below the kernel's ephemeral range
/// (`ip_local_port_range`): the kernel never gives those to outgoing connections, which is how
/// a port taken from the ephemeral range used to vanish under a test that opens many
/// connections ("Address already in use"). Each process walks that range from its own
/// starting point, so parallel test binaries do not pick the same ports either.
///
/// # Panics
///
/// Panics when the loopback interface cannot be bound at all, since no test can run then.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let ceiling = ephemeral_low().unwrap_or(32_768);
    if ceiling > FLOOR + 1_000 {
        let span = u32::from(ceiling - FLOOR);
        // A start that differs between processes; then a stride coprime with most spans.
        let _ = NEXT.compare_exchange(
            u32::MAX,
            std::process::id().wrapping_mul(7_919) % span,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        for _ in 0..span.min(4_096) {
            let offset = NEXT.fetch_add(1_009, Ordering::SeqCst) % span;
            let port = FLOOR + offset as u16;
            if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return port;
            }
        }
    }
    // No room below the ephemeral range: let the kernel choose.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("binding 127.0.0.1:0 to find a free port");
    listener
        .local_addr()
        .expect("reading the address of a freshly bound listener")
        .port()
}

/// The first port of the kernel's ephemeral range, when the system says.
fn ephemeral_low() -> Option<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A loopback address that refuses connections for as long as this value lives: a TCP socket
/// bound to it that never listens. The port stays taken, so no other test can bind it and
/// answer a connection meant to be refused (binding port 0 and dropping the listener leaves
/// the port free for anyone, which made such a test see a 200 now and then).
#[derive(Debug)]
pub struct RefusingAddress {
    _socket: socket2::Socket,
    addr: std::net::SocketAddr,
}

impl RefusingAddress {
    /// # Panics
    ///
    /// When loopback cannot be bound at all.
    pub fn new() -> RefusingAddress {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a TCP socket");
        let any_port = std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        socket.bind(&any_port.into()).expect("bind loopback");
        let addr = socket
            .local_addr()
            .ok()
            .and_then(|addr| addr.as_socket())
            .expect("the bound address");
        RefusingAddress {
            _socket: socket,
            addr,
        }
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Default for RefusingAddress {
    fn default() -> RefusingAddress {
        RefusingAddress::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_outside_the_ephemeral_range() {
        let low = ephemeral_low().unwrap_or(32_768);
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        for &port in &ports {
            assert!(
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok(),
                "{port} not free"
            );
            if low > FLOOR + 1_000 {
                assert!(
                    (FLOOR..low).contains(&port),
                    "{port} in the ephemeral range"
                );
            }
        }
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
    }

    #[test]
    fn a_refusing_address_refuses_and_keeps_its_port() {
        let refusing = RefusingAddress::new();
        let error = std::net::TcpStream::connect(refusing.addr()).expect_err("refused");
        assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(
            TcpListener::bind(refusing.addr()).is_err(),
            "nobody else can take the port meanwhile"
        );
    }
}
