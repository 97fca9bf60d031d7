//! Per-shard pool of idle keep-alive connections to pods: each pod's kept with the shard's view
//! of the pod ([`IdleConns`] in `routing::replica::LocalPod`), dialled and trimmed by rules kept
//! here ([`Pool`]).
//!
//! Checkout takes the most recently used connection (warmest, least likely to have been closed
//! by the pod) and checks with a non-blocking `MSG_PEEK` that the pod has not closed it while it
//! sat idle, so a stale connection is dropped before a request is written to it. The pool dials
//! through a [`Connector`] (plain TCP today) and holds whatever stream it gives.
//!
//! A connection whose exchange ended cleanly always goes back: the pool holds what its peak
//! needs, and only time trims it. A sweep closes connections idle past the idle timeout, and of
//! a pod's connections beyond `max_idle_per_pod` those idle past [`SURPLUS_IDLE_TIMEOUT`]. ★
//! Upstream's transport (and nginx's `keepalive`) closes a connection returned while the pod
//! already has that many idle, so a load whose concurrency swings around the cap redials all
//! the time (issue 37: 10–14 k connects in 5 s at 1 024 client connections over 8 shards).

use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use monoio::io::{OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;

use crate::metrics::ShardStats;
use crate::runtime::buffer::InBuf;
use crate::runtime::stream::{ByteStream, Connector, PlainTcp, Socket};
use crate::upstream::error::{TransportCause, UpstreamError};

/// Default longest time an idle upstream connection is kept: 90 s, the `IdleConnTimeout` of
/// Knative's proxy transport.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Default most idle connections kept per pod (and shard): 100, the `MaxIdleConnsPerHost` of
/// Knative's proxy transport (env `MAX_IDLE_PROXY_CONNS_PER_HOST`).
pub const DEFAULT_MAX_IDLE_PER_POD: usize = 100;
/// How long a pod's connections beyond `max_idle_per_pod` may sit idle before a sweep closes
/// them: a peak that came back within this found them still open. Ours.
pub const SURPLUS_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default longest time one dial to a pod may take: 5 s. Ours: upstream retries timed-out dials
/// with a growing timeout instead; 5 s is the fork's `podReadyCheckTimeout` for its dial.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to one pod, split so the request and the response can flow at the same time.
pub struct UpstreamConn<S: ByteStream = TcpStream> {
    pub addr: SocketAddr,
    pub reader: OwnedReadHalf<S>,
    pub writer: OwnedWriteHalf<S>,
    /// Bytes read from the pod and not yet consumed.
    pub inbuf: InBuf,
    /// Whether this connection served a request before.
    pub reused: bool,
    socket: Socket,
    idle_since: Instant,
}

impl<S: ByteStream> UpstreamConn<S> {
    fn new(addr: SocketAddr, stream: S) -> UpstreamConn<S> {
        let socket = stream.socket();
        let (reader, writer) = stream.into_split();
        UpstreamConn {
            addr,
            reader,
            writer,
            inbuf: InBuf::with_capacity(16 * 1024),
            reused: false,
            socket,
            idle_since: Instant::now(),
        }
    }

    /// The socket beneath, for the calls made outside the reactor (`ByteStream::send_now`,
    /// `Socket::shut_write`).
    pub fn socket(&self) -> Socket {
        self.socket
    }

    /// Whether the pod closed (or wrote unsolicited bytes on) this idle connection.
    fn is_stale(&self) -> bool {
        self.socket.peer_closed_or_spoke()
    }
}

/// Pool settings.
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    /// Idle connections older than this are closed. Default: [`DEFAULT_IDLE_TIMEOUT`] (90 s).
    pub idle_timeout: Duration,
    /// Idle connections per pod kept for the whole idle timeout; more are kept while a peak
    /// needs them ([`SURPLUS_IDLE_TIMEOUT`]). Default: [`DEFAULT_MAX_IDLE_PER_POD`] (100).
    pub max_idle_per_pod: usize,
    /// Longest time a dial may take. Default: [`DEFAULT_CONNECT_TIMEOUT`] (5 s).
    pub connect_timeout: Duration,
    /// Idle HTTP/1 connections (plain and TLS, every pod together) the shard keeps for the
    /// whole idle timeout; beyond it, the oldest go once idle past [`SURPLUS_IDLE_TIMEOUT`]
    /// ([`over_cap`]). `None` (the default): no cap beyond each pod's.
    pub max_idle_per_shard: Option<usize>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_idle_per_pod: DEFAULT_MAX_IDLE_PER_POD,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_idle_per_shard: None,
        }
    }
}

/// Opens a connection to a pod through `connector` within `timeout`, counted in the shard's
/// figures. Both kinds of pod connection (HTTP/1 here, h2c in `upstream::h2c`) are made by it.
pub(crate) async fn connect<C: Connector>(
    connector: &C,
    addr: SocketAddr,
    target: &C::Target,
    timeout: Duration,
    stats: &ShardStats,
) -> Result<C::Stream, UpstreamError> {
    stats.upstream_connects.increment();
    let stream = match monoio::time::timeout(timeout, connector.connect(addr, target)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            stats.upstream_connect_errors.increment();
            // A dial that connected and then failed on its data is a TLS handshake refused by
            // either side: its class says too little, so the cause goes to the log.
            let cause = if error.kind() == std::io::ErrorKind::InvalidData {
                let dialled = connector.dial_addr(addr, target);
                tracing::warn!(pod = %addr, %dialled, "TLS to the pod failed: {error}");
                TransportCause::TlsHandshake
            } else {
                TransportCause::of(&error)
            };
            return Err(UpstreamError::Connect { addr, cause });
        }
        Err(_elapsed) => {
            stats.upstream_connect_errors.increment();
            return Err(UpstreamError::ConnectTimeout {
                addr,
                after_ms: timeout.as_millis() as u64,
            });
        }
    };
    Ok(stream)
}

/// One pod's idle connections of one kind on one shard, the most recently used last. Kept
/// with the shard's own view of the pod (`routing::replica::LocalPod`), so a request finds
/// them without looking its pod's address up, and they go when the shard stops routing to the
/// pod.
pub struct IdleConns<S: ByteStream> {
    conns: RefCell<Vec<UpstreamConn<S>>>,
}

impl<S: ByteStream> Default for IdleConns<S> {
    fn default() -> Self {
        IdleConns {
            conns: RefCell::new(Vec::new()),
        }
    }
}

impl<S: ByteStream> std::fmt::Debug for IdleConns<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = self.conns.try_borrow().map(|conns| conns.len()).ok();
        f.debug_struct("IdleConns").field("len", &len).finish()
    }
}

impl<S: ByteStream> IdleConns<S> {
    /// Closes them all (the drain).
    pub fn clear(&self) {
        self.conns.borrow_mut().clear();
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.borrow().is_empty()
    }

    /// How long each has been idle at `now`, oldest first.
    pub fn ages(&self, now: Instant) -> Vec<Duration> {
        self.conns
            .borrow()
            .iter()
            .map(|conn| now.duration_since(conn.idle_since))
            .collect()
    }

    /// Closes the `count` that have been idle longest.
    pub fn close_oldest(&self, count: usize) {
        let mut conns = self.conns.borrow_mut();
        let count = count.min(conns.len());
        conns.drain(..count);
    }
}

/// How many of each list's idle connections a shard-wide cap of `cap` closes (`lists`: each
/// pod's and kind's idle ages, oldest first): while more than `cap` remain over all lists, the
/// oldest of all, if idle past [`SURPLUS_IDLE_TIMEOUT`]. Go's transport closes the least
/// recently used connection as soon as one beyond `MaxIdleConns` comes back; ★ as for each
/// pod's cap, a peak that comes back within the surplus timeout finds its connections open.
pub fn over_cap(lists: &[&[Duration]], cap: usize) -> Vec<usize> {
    let mut closing = vec![0; lists.len()];
    let held: usize = lists.iter().map(|ages| ages.len()).sum();
    let surplus = held.saturating_sub(cap);
    if surplus == 0 {
        return closing;
    }
    // The oldest of all, wherever they are: each list is oldest first, so the ones taken from
    // a list are always its first ones (and among equal ages, which ones does not matter).
    let mut all: Vec<(Duration, usize)> = lists
        .iter()
        .enumerate()
        .flat_map(|(list, ages)| ages.iter().map(move |age| (*age, list)))
        .filter(|(age, _)| *age >= SURPLUS_IDLE_TIMEOUT)
        .collect();
    all.sort_unstable_by_key(|&(age, _)| std::cmp::Reverse(age));
    for (_, list) in all.into_iter().take(surplus) {
        closing[list] += 1;
    }
    closing
}

/// What dials a shard's pod connections of one kind, and the rules their idle ones are kept by.
pub struct Pool<D: Connector = PlainTcp> {
    config: PoolConfig,
    connector: D,
}

impl<D: Connector> Pool<D> {
    pub fn new(config: PoolConfig, connector: D) -> Pool<D> {
        Pool { config, connector }
    }

    /// An idle connection to `addr` if a live one exists, else a new one. The idle one is taken
    /// when this is called, not when it is awaited: the common case is then plain code that
    /// inlines into the caller, whose future only carries the rare dial.
    ///
    /// `C`: the client's stream, only a name: each kind of client connection gets its own
    /// copy, so the plain path's keeps one caller and stays inlined (`http1::rewrite::H1Headers`).
    #[inline(always)]
    pub fn checkout<'a, C>(
        &'a self,
        idle: &IdleConns<D::Stream>,
        addr: SocketAddr,
        target: &'a D::Target,
        stats: &'a ShardStats,
    ) -> impl Future<Output = Result<UpstreamConn<D::Stream>, UpstreamError>> + 'a {
        let idle = self.take_idle::<C>(idle, stats);
        if idle.is_some() {
            stats.upstream_reuses.increment();
        }
        async move {
            match idle {
                Some(conn) => Ok(conn),
                // A dial (and its timer) is far larger than the rest of a checkout; boxed, it
                // does not widen every connection's future, and it costs a syscall and a
                // handshake anyway.
                None => Box::pin(self.dial(addr, target, stats)).await,
            }
        }
    }

    async fn dial(
        &self,
        addr: SocketAddr,
        target: &D::Target,
        stats: &ShardStats,
    ) -> Result<UpstreamConn<D::Stream>, UpstreamError> {
        let stream = connect(
            &self.connector,
            addr,
            target,
            self.config.connect_timeout,
            stats,
        )
        .await?;
        Ok(UpstreamConn::new(addr, stream))
    }

    #[allow(clippy::extra_unused_type_parameters)] // a name per kind of client connection
    fn take_idle<C>(
        &self,
        idle: &IdleConns<D::Stream>,
        stats: &ShardStats,
    ) -> Option<UpstreamConn<D::Stream>> {
        let mut conns = idle.conns.borrow_mut();
        let now = Instant::now();
        while let Some(mut conn) = conns.pop() {
            if now.duration_since(conn.idle_since) >= self.config.idle_timeout || conn.is_stale() {
                stats.upstream_stale_discards.increment();
                continue;
            }
            conn.reused = true;
            return Some(conn);
        }
        None
    }

    /// Returns a connection whose exchange finished cleanly. It is kept whatever the number
    /// idle: a request that comes while the others are busy finds it rather than dialing.
    /// `C`: the client's stream, only a name (see [`Pool::checkout`]).
    #[allow(clippy::extra_unused_type_parameters)] // a name per kind of client connection
    pub fn checkin<C>(&self, idle: &IdleConns<D::Stream>, mut conn: UpstreamConn<D::Stream>) {
        if !conn.inbuf.is_empty() {
            // Unconsumed bytes mean we lost track of framing: never reuse.
            return;
        }
        conn.idle_since = Instant::now();
        idle.conns.borrow_mut().push(conn);
    }

    /// Closes the pod's connections time has trimmed ([`expired`]). Run periodically.
    pub fn sweep(&self, idle: &IdleConns<D::Stream>, now: Instant) {
        let mut conns = idle.conns.borrow_mut();
        // Oldest first: each checkin pushes on top, so the stack is in idle order.
        let ages = conns.iter().map(|conn| now.duration_since(conn.idle_since));
        let closing = expired(ages, &self.config);
        conns.drain(..closing);
        if conns.is_empty() && conns.capacity() > 0 {
            // A pod with nothing idle holds no allocation for it.
            *conns = Vec::new();
        }
    }
}

/// How many of a pod's idle connections a sweep closes, given how long each has been idle,
/// oldest first: those idle past the idle timeout and, while more than `max_idle_per_pod`
/// remain, those idle past [`SURPLUS_IDLE_TIMEOUT`]. The oldest go first, so the ones kept
/// are the most recently used.
fn expired(idle_for: impl ExactSizeIterator<Item = Duration>, config: &PoolConfig) -> usize {
    let held = idle_for.len();
    let mut closing = 0;
    for age in idle_for {
        let surplus = held - closing > config.max_idle_per_pod;
        if age >= config.idle_timeout || (surplus && age >= SURPLUS_IDLE_TIMEOUT) {
            closing += 1;
        } else {
            break;
        }
    }
    closing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_idle_per_pod: usize) -> PoolConfig {
        PoolConfig {
            max_idle_per_shard: None,
            max_idle_per_pod,
            ..PoolConfig::default()
        }
    }

    fn secs(ages: &[u64]) -> impl ExactSizeIterator<Item = Duration> + '_ {
        ages.iter().map(|&age| Duration::from_secs(age))
    }

    #[test]
    fn a_shard_wide_cap_closes_the_oldest_of_all_once_past_the_surplus_timeout() {
        let pod_a = [
            Duration::from_secs(60),
            Duration::from_secs(30),
            Duration::ZERO,
        ];
        let pod_b = [Duration::from_secs(45), Duration::from_secs(11)];
        let pod_c = [Duration::from_secs(5)];
        let lists: [&[Duration]; 3] = [&pod_a, &pod_b, &pod_c];
        assert_eq!(over_cap(&lists, 6), [0, 0, 0], "within the cap");
        assert_eq!(
            over_cap(&lists, 4),
            [1, 1, 0],
            "the two oldest of all: 60 s and 45 s"
        );
        assert_eq!(
            over_cap(&lists, 1),
            [2, 2, 0],
            "never one idle under the surplus timeout (0 s, 5 s), whatever the cap"
        );
        assert_eq!(over_cap(&lists, 0), [2, 2, 0]);
        assert_eq!(over_cap(&[], 0), Vec::<usize>::new());
        // Equal ages: any of them, as many as the surplus.
        let tied = [Duration::from_secs(20); 2];
        let one = [Duration::from_secs(20)];
        let closing = over_cap(&[&tied, &one], 1);
        assert_eq!(closing.iter().sum::<usize>(), 2);
        assert!(closing[0] <= 2 && closing[1] <= 1);
    }

    #[test]
    fn connections_within_the_cap_stay_for_the_idle_timeout() {
        assert_eq!(expired(secs(&[89, 50, 0]), &config(3)), 0);
        assert_eq!(expired(secs(&[91, 90, 30]), &config(3)), 2);
        assert_eq!(expired(secs(&[]), &config(0)), 0);
    }

    #[test]
    fn a_peaks_surplus_stays_while_it_is_used_and_goes_once_idle() {
        // Six idle, a cap of two: the four oldest are surplus.
        assert_eq!(
            expired(secs(&[9, 9, 8, 5, 1, 0]), &config(2)),
            0,
            "a peak that came back within the surplus timeout keeps them all"
        );
        assert_eq!(
            expired(secs(&[20, 15, 12, 11, 3, 0]), &config(2)),
            4,
            "down to the cap, the oldest first"
        );
        assert_eq!(
            expired(secs(&[20, 15, 9, 8, 3, 0]), &config(2)),
            2,
            "only those idle past the surplus timeout"
        );
        assert_eq!(
            expired(secs(&[95, 40, 30]), &config(0)),
            3,
            "a cap of 0 keeps connections only for the surplus timeout"
        );
    }

    /// The pool works over whatever stream its connector gives (here one that, like an
    /// encrypting stream, takes no raw writes): a connection checked in is the one checked out
    /// next, and one the pod closed while it sat idle is dropped for a new dial.
    #[test]
    fn any_connectors_streams_are_kept_reused_and_dropped_once_the_pod_closes_them() {
        use crate::runtime::stream::testing::{reactor, SealedConnector};
        reactor().block_on(async {
            let pod = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = pod.local_addr().unwrap();
            let stats = ShardStats::new(0);
            let pool = Pool::new(PoolConfig::default(), SealedConnector::default());
            let idle = IdleConns::default();

            let first = pool.checkout::<()>(&idle, addr, &(), &stats).await.unwrap();
            assert!(!first.reused);
            let (pods_end, _) = pod.accept().unwrap();
            let socket = first.socket();
            pool.checkin::<()>(&idle, first);
            let again = pool.checkout::<()>(&idle, addr, &(), &stats).await.unwrap();
            assert!(again.reused, "the idle connection is taken again");
            assert_eq!(pool.connector.dials.get(), 1);
            pool.checkin::<()>(&idle, again);

            drop(pods_end);
            let until = Instant::now() + Duration::from_secs(1);
            while !socket.peer_closed_or_spoke() {
                assert!(Instant::now() < until, "the pod's close never arrived");
                std::thread::yield_now();
            }
            let fresh = pool.checkout::<()>(&idle, addr, &(), &stats).await.unwrap();
            assert!(
                !fresh.reused,
                "a connection the pod closed is not handed out"
            );
            assert_eq!(pool.connector.dials.get(), 2);
            assert_eq!(stats.upstream_stale_discards.get(), 1);
        });
    }
}
