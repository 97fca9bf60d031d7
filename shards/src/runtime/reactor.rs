//! Builds a shard's monoio reactor, choosing the I/O driver, and binds the listeners.
//!
//! io_uring is tried first unless epoll is forced; when the kernel refuses it (EPERM under a
//! default container seccomp profile, ENOSYS on old kernels, `io_uring_disabled`) the shard falls
//! back to epoll and says so. Both drivers run the same code: monoio dispatches each operation on
//! the driver of the current thread.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::str::FromStr;

use monoio::{IoUringDriver, LegacyDriver, Runtime, RuntimeBuilder};
use socket2::{Domain, Protocol, Socket, Type};

/// Submission queue entries per io_uring instance.
const URING_ENTRIES: u32 = 1024;
/// Listen backlog of each shard's listener.
const BACKLOG: i32 = 4096;

/// Which I/O driver the operator asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DriverChoice {
    /// io_uring when the kernel allows it, else epoll.
    #[default]
    Auto,
    IoUring,
    Epoll,
}

impl FromStr for DriverChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "auto" => Ok(DriverChoice::Auto),
            "io-uring" | "io_uring" | "iouring" | "uring" => Ok(DriverChoice::IoUring),
            "epoll" | "legacy" => Ok(DriverChoice::Epoll),
            other => Err(format!(
                "unknown driver {other:?} (expected auto, io-uring or epoll)"
            )),
        }
    }
}

/// The driver a shard actually runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverKind {
    IoUring,
    Epoll,
}

impl DriverKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DriverKind::IoUring => "io-uring",
            DriverKind::Epoll => "epoll",
        }
    }
}

impl fmt::Display for DriverKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every address of both families on `port`, the default of every listener of both roles:
/// `[::]`, bound with `IPV6_V6ONLY` off so that IPv4 clients arrive as mapped addresses.
/// Upstream listens on `":port"`, which Go binds the same way; IPv6-only and dual-stack
/// clusters dial pods and activators at their IPv6 addresses.
pub const fn any_address(port: u16) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0))
}

/// Binds one SO_REUSEPORT listener per shard on `addr`. Binding happens on the calling thread so
/// a bad address fails start-up with a clear error; port 0 is resolved by the first bind and
/// reused by the rest. `[::]` takes both families ([`any_address`]), or IPv4 alone on a kernel
/// without IPv6.
pub fn bind_listeners(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let mut listeners = Vec::with_capacity(count);
    let mut bound = addr;
    for _ in 0..count {
        let listener = bind(bound, true)?;
        bound = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Binds the one listener of a port that is not served by the shards (the admin ports), as
/// [`bind_listeners`] binds: both families on `[::]`, non-blocking; without SO_REUSEPORT, so a
/// second process on the port fails to start instead of sharing it.
pub fn bind_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    bind(addr, false)
}

fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    match open(addr, reuse_port) {
        Err(error) if lacks_ipv6(addr, &error) => {
            let ipv4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port());
            tracing::warn!(%addr, listening = %ipv4, "this kernel has no IPv6 ({error}): IPv4 only");
            open(ipv4, reuse_port)
        }
        result => result,
    }
}

fn open(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // Both families whatever `net.ipv6.bindv6only` says.
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// Whether binding `addr` failed only because the kernel has no IPv6 (booted with
/// `ipv6.disable=1`, or built without it): the unspecified IPv6 address then falls back to the
/// IPv4 one. An explicit IPv6 address is an error as asked.
fn lacks_ipv6(addr: SocketAddr, error: &io::Error) -> bool {
    addr.is_ipv6()
        && addr.ip().is_unspecified()
        && matches!(
            error.raw_os_error(),
            Some(libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT | libc::EADDRNOTAVAIL)
        )
}

/// A shard's reactor, on the driver it got.
pub enum Reactor {
    IoUring(Runtime<monoio::time::TimeDriver<IoUringDriver>>),
    Epoll(Runtime<monoio::time::TimeDriver<LegacyDriver>>),
}

impl Reactor {
    /// The driver it runs on.
    pub fn kind(&self) -> DriverKind {
        match self {
            Reactor::IoUring(_) => DriverKind::IoUring,
            Reactor::Epoll(_) => DriverKind::Epoll,
        }
    }

    /// Runs `future` to its end on this reactor.
    pub fn block_on<F: Future>(&mut self, future: F) -> F::Output {
        match self {
            Reactor::IoUring(runtime) => runtime.block_on(future),
            Reactor::Epoll(runtime) => runtime.block_on(future),
        }
    }
}

/// io_uring setup flags used unless `KACTIVATOR_URING_SETUP` says otherwise.
///
/// Measured here (BENCHMARKS.md, layout L2): without flags the io_uring driver ran at 0.86× the
/// epoll driver, because every completion interrupts the running shard to run kernel task work.
/// `COOP_TASKRUN` defers that work to our next kernel entry, `SINGLE_ISSUER` lets the kernel
/// skip submission locking (one shard thread owns its ring), `DEFER_TASKRUN` batches completion
/// work into `io_uring_enter(GETEVENTS)`. With all three io_uring ran at 1.12× epoll.
/// Kernels older than 6.1 refuse some of them; the shard then retries without flags.
pub const DEFAULT_URING_SETUP: &str = "coop,single,defer";

/// Parses a comma list of `coop`, `single`, `defer`, `taskrun` (or `none`) into a builder.
fn uring_builder(flags: &str) -> io_uring::Builder {
    let mut builder = io_uring::IoUring::builder();
    for flag in flags
        .split(',')
        .map(str::trim)
        .filter(|flag| !flag.is_empty() && *flag != "none")
    {
        match flag {
            "coop" => builder.setup_coop_taskrun(),
            "single" => builder.setup_single_issuer(),
            "defer" => builder.setup_defer_taskrun(),
            "taskrun" => builder.setup_taskrun_flag(),
            other => {
                tracing::warn!("ignoring unknown io_uring setup flag {other:?}");
                continue;
            }
        };
    }
    builder
}

/// Builds a reactor on the driver `choice` asks for (see the module's doc).
pub fn build(choice: DriverChoice) -> Result<Reactor, String> {
    let uring = || {
        let flags = std::env::var("KACTIVATOR_URING_SETUP")
            .unwrap_or_else(|_| DEFAULT_URING_SETUP.to_string());
        let build = |flags: &str| {
            RuntimeBuilder::<IoUringDriver>::new()
                .with_entries(URING_ENTRIES)
                .uring_builder(uring_builder(flags))
                .enable_timer()
                .build()
        };
        build(&flags).or_else(|error| {
            if flags.is_empty() || flags == "none" {
                return Err(error);
            }
            tracing::warn!(
                "io_uring setup flags {flags:?} refused ({error}); retrying without them"
            );
            build("none")
        })
    };
    let epoll = || {
        RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()
            .map_err(|error| format!("cannot build the epoll reactor: {error}"))
    };
    match choice {
        DriverChoice::Epoll => epoll().map(Reactor::Epoll),
        DriverChoice::IoUring => uring()
            .map(Reactor::IoUring)
            .map_err(|error| format!("io_uring was forced but the kernel refused it: {error}")),
        DriverChoice::Auto => match uring() {
            Ok(runtime) => Ok(Reactor::IoUring(runtime)),
            Err(error) => {
                tracing::warn!("io_uring unavailable ({error}); falling back to epoll");
                epoll().map(Reactor::Epoll)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    /// Review finding: every listener bound `0.0.0.0`, so nothing answered over IPv6.
    #[test]
    fn the_default_address_takes_ipv4_and_ipv6_clients_on_every_shard_listener() {
        let listeners = bind_listeners(any_address(0), 2).unwrap();
        let port = listeners[0].local_addr().unwrap().port();
        assert_eq!(listeners[1].local_addr().unwrap().port(), port);
        for client in ["127.0.0.1", "::1"] {
            let ip: std::net::IpAddr = client.parse().unwrap();
            TcpStream::connect((ip, port)).unwrap_or_else(|error| panic!("{client}: {error}"));
        }
        let admin = bind_listener(any_address(0)).unwrap();
        let port = admin.local_addr().unwrap().port();
        for client in ["127.0.0.1", "::1"] {
            let ip: std::net::IpAddr = client.parse().unwrap();
            TcpStream::connect((ip, port)).unwrap_or_else(|error| panic!("{client}: {error}"));
        }
        assert!(
            bind_listener(any_address(port)).is_err(),
            "an admin port is not shared with another process"
        );
    }

    #[test]
    fn explicit_addresses_of_either_family_bind_only_that_family() {
        let v6 = bind_listener("[::1]:0".parse().unwrap()).unwrap();
        let port = v6.local_addr().unwrap().port();
        assert!(TcpStream::connect(("::1", port)).is_ok());
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
        let v4 = bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = v4.local_addr().unwrap().port();
        assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
        assert!(TcpStream::connect(("::1", port)).is_err());
    }

    #[test]
    fn only_the_unspecified_ipv6_address_falls_back_and_only_when_the_kernel_lacks_ipv6() {
        let no_family = io::Error::from_raw_os_error(libc::EAFNOSUPPORT);
        let no_address = io::Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        let in_use = io::Error::from_raw_os_error(libc::EADDRINUSE);
        let any6 = any_address(8012);
        let loopback6: SocketAddr = "[::1]:8012".parse().unwrap();
        let any4: SocketAddr = "0.0.0.0:8012".parse().unwrap();
        assert!(lacks_ipv6(any6, &no_family));
        assert!(lacks_ipv6(any6, &no_address));
        assert!(!lacks_ipv6(any6, &in_use), "a port in use is an error");
        assert!(!lacks_ipv6(loopback6, &no_family), "an explicit address is");
        assert!(!lacks_ipv6(any4, &no_family));
    }
}
