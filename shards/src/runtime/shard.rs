//! One shard: a reactor thread's accept loop, its routing replica, pool and counters.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::net::TcpListener;

use crate::http1;
use crate::metrics::{AllShardStats, ShardStats};
use crate::request::identity::DEFAULT_CLUSTER_DOMAIN;
use crate::routing::replica::Replica;
use crate::routing::{Grant, ShardCommand};
use crate::runtime::alarm::{self, Alarms};
use crate::runtime::blocks::Blocks;
use crate::runtime::control_link::ControlLink;
use crate::runtime::race::{race, Either};
use crate::runtime::readiness::Readiness;
use crate::runtime::signal::{BackOfQueue, LocalEvent, LocalNotify};
use crate::upstream::pool::{Pool, PoolConfig};

/// How often idle upstream connections are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Settings every shard shares, fixed at start-up.
#[derive(Clone, Debug)]
pub struct ShardSettings {
    /// Domain for the Host fallback `<rev>.<ns>.svc.<domain>`. Default:
    /// [`DEFAULT_CLUSTER_DOMAIN`] (`cluster.local`).
    pub cluster_domain: String,
    /// Upstream connection pool settings.
    pub pool: PoolConfig,
    /// An autoscaler reporter runs: a revision's first request pokes it. Default false.
    pub report_load: bool,
    /// What kubelet probes report besides draining (the autoscaler link, the informers).
    pub readiness: Arc<Readiness>,
}

impl Default for ShardSettings {
    fn default() -> Self {
        ShardSettings {
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            pool: PoolConfig::default(),
            report_load: false,
            readiness: Arc::default(),
        }
    }
}

/// Shard-local state, shared by the shard's tasks through `Rc`.
pub struct Shard {
    pub index: usize,
    pub settings: Arc<ShardSettings>,
    all_stats: AllShardStats,
    pub replica: Replica,
    pub pool: Pool,
    /// Set on `BeginDrain`: probes fail, requests are still served.
    pub draining: LocalEvent,
    /// Set on `StopAccepting`: no new connections, idle ones close.
    pub stopping: LocalEvent,
    /// Fires whenever a client connection closes (drain waits on it).
    pub connection_closed: LocalNotify,
    /// Every shard's grant mailbox, this one's included, by shard index.
    peers: Vec<flume::Sender<Grant>>,
    /// Registrations and pod signals to the control thread.
    pub control: ControlLink,
    /// Deadlines of waiting requests (queued for a slot, slow heads), one timer for all.
    pub alarms: Alarms,
    /// Spare blocks for exchanges with pods, which run outside the connections' futures.
    pub exchanges: Blocks,
    /// Where a task that handed its pod slot on lets the woken waiter go first.
    pub back_of_queue: BackOfQueue,
}

/// Spare exchange blocks a shard keeps (each a few KiB) once its concurrency drops.
const SPARE_EXCHANGES: usize = 256;

impl Shard {
    pub fn new(
        index: usize,
        settings: Arc<ShardSettings>,
        all_stats: AllShardStats,
        peers: Vec<flume::Sender<Grant>>,
        control: ControlLink,
    ) -> Shard {
        let pool = Pool::new(settings.pool);
        Shard {
            index,
            settings,
            all_stats,
            replica: Replica::default(),
            pool,
            draining: LocalEvent::default(),
            stopping: LocalEvent::default(),
            connection_closed: LocalNotify::default(),
            peers,
            control,
            alarms: Alarms::default(),
            exchanges: Blocks::new(SPARE_EXCHANGES),
            back_of_queue: BackOfQueue::default(),
        }
    }

    /// Sends a slot to another shard's oldest waiter. False if that shard is gone (the caller
    /// then releases the slot).
    pub fn send_grant(&self, shard: usize, grant: Grant) -> bool {
        self.peers
            .get(shard)
            .is_some_and(|peer| peer.send(grant).is_ok())
    }

    #[inline]
    pub fn stats(&self) -> &ShardStats {
        &self.all_stats[self.index]
    }

    fn apply(&self, command: ShardCommand) {
        match command {
            ShardCommand::Routing(update) => self.replica.apply(update, self),
            ShardCommand::BeginDrain => self.draining.set(),
            ShardCommand::StopAccepting => {
                self.draining.set();
                self.stopping.set();
                self.pool.clear();
            }
        }
    }
}

/// Runs a shard until it has stopped accepting and its last connection closed.
pub async fn run(
    shard: Rc<Shard>,
    listener: TcpListener,
    commands: flume::Receiver<ShardCommand>,
    grants: flume::Receiver<Grant>,
) {
    // Apply whatever the control thread queued before we started, so the first request already
    // sees the initial routing table.
    while let Ok(command) = commands.try_recv() {
        shard.apply(command);
    }
    let command_shard = shard.clone();
    monoio::spawn(async move {
        while let Ok(command) = commands.recv_async().await {
            command_shard.apply(command);
        }
        // The control thread is gone: nothing will ever update routing again; stop cleanly.
        command_shard.apply(ShardCommand::StopAccepting);
    });
    let grant_shard = shard.clone();
    monoio::spawn(async move {
        while let Ok(grant) = grants.recv_async().await {
            match grant_shard.replica.get(grant.key.as_str()) {
                Some(revision) => revision.receive_grant(grant.pod, &grant_shard),
                // The revision is gone here: nobody to serve, give the slot back.
                None => {
                    grant.pod.slots.release();
                }
            }
        }
    });
    let relay_shard = shard.clone();
    monoio::spawn(async move { relay_shard.back_of_queue.run_relay().await });
    let timer_shard = shard.clone();
    monoio::spawn(async move { alarm::run_timer(&timer_shard.alarms).await });
    let sweep_shard = shard.clone();
    monoio::spawn(async move {
        while !sweep_shard.stopping.is_set() {
            monoio::time::sleep(SWEEP_INTERVAL).await;
            sweep_shard.pool.sweep();
        }
    });

    loop {
        let accepted = {
            let accept = listener.accept();
            let stop = shard.stopping.wait();
            race(accept, stop).await
        };
        match accepted {
            Either::Left(Ok((stream, peer))) => {
                monoio::spawn(http1::serve_connection(shard.clone(), stream, peer));
            }
            Either::Left(Err(error)) => {
                // EMFILE and friends: back off briefly rather than spin.
                tracing::warn!(shard = shard.index, "accept failed: {error}");
                monoio::time::sleep(Duration::from_millis(10)).await;
            }
            Either::Right(()) => break,
        }
    }
    drop(listener);
    while shard.stats().connections_open.get() > 0 {
        shard.connection_closed.notified().await;
    }
}
