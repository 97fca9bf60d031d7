//! Builds a shard's monoio reactor, choosing the I/O driver, and binds the listeners.
//!
//! io_uring is tried first unless epoll is forced; when the kernel refuses it (EPERM under a
//! default container seccomp profile, ENOSYS on old kernels, `io_uring_disabled`) the shard falls
//! back to epoll and says so. Both drivers run the same code: monoio dispatches each operation on
//! the driver of the current thread.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
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

/// Binds one SO_REUSEPORT listener per shard on `addr`. Binding happens on the calling thread so
/// a bad address fails start-up with a clear error; port 0 is resolved by the first bind and
/// reused by the rest.
pub fn bind_listeners(
    addr: SocketAddr,
    count: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut listeners = Vec::with_capacity(count);
    let mut bound = addr;
    for _ in 0..count {
        let socket = Socket::new(
            Domain::for_address(bound),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&bound.into())?;
        socket.listen(BACKLOG)?;
        let listener: std::net::TcpListener = socket.into();
        bound = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
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
