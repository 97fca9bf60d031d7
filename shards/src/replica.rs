//! A shard's replica of the routing table, updated from the control thread's snapshots.
//!
//! Everything here is shard-local (`Rc`, `Cell`): a request clones `Rc`s, never `Arc`s, so the
//! request path touches no cache line another shard writes. The only shared state reached from
//! here is each pod's in-flight counter.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::metrics::{RevisionCounters, ShardStats};
use crate::routing::{PodTracker, RevisionRoute, RoutingUpdate};
use crate::signal::LocalNotify;

/// One pod as seen by one shard.
#[derive(Debug)]
pub struct LocalPod {
    pub tracker: Arc<PodTracker>,
    /// `Host: <ip:port>\r\n`, formatted once here rather than for every request.
    pub host_line: Box<[u8]>,
}

impl LocalPod {
    pub fn new(tracker: Arc<PodTracker>) -> LocalPod {
        let host_line = crate::rewrite::host_line(tracker.addr);
        LocalPod { tracker, host_line }
    }
}

/// One revision as seen by one shard. Survives route updates: waiters and counters stay.
#[derive(Debug)]
pub struct LocalRevision {
    route: RefCell<Arc<RevisionRoute>>,
    pods: RefCell<Vec<Rc<LocalPod>>>,
    cursor: Cell<usize>,
    removed: Cell<bool>,
    /// Fires on every update of this revision (new pods, removal).
    pub changed: LocalNotify,
    pub counters: Arc<RevisionCounters>,
}

impl LocalRevision {
    pub fn route(&self) -> Arc<RevisionRoute> {
        self.route.borrow().clone()
    }

    /// The revision's timers, read without cloning the shared route (an `Arc` clone would be an
    /// atomic write to a cache line every shard reads).
    pub fn timeouts(&self) -> crate::routing::Timeouts {
        self.route.borrow().timeouts
    }

    pub fn is_removed(&self) -> bool {
        self.removed.get()
    }

    /// Picks a routable pod, round robin over the shard's view.
    pub fn pick(&self) -> Option<Rc<LocalPod>> {
        let pods = self.pods.borrow();
        if pods.is_empty() {
            return None;
        }
        let at = self.cursor.get() % pods.len();
        self.cursor.set(at + 1);
        Some(pods[at].clone())
    }

    fn apply(&self, route: Arc<RevisionRoute>) {
        *self.pods.borrow_mut() = route
            .pods
            .iter()
            .map(|tracker| Rc::new(LocalPod::new(tracker.clone())))
            .collect();
        *self.route.borrow_mut() = route;
        self.removed.set(false);
        self.changed.notify_all();
    }
}

/// The shard's routing table.
#[derive(Debug, Default)]
pub struct Replica {
    revisions: RefCell<FxHashMap<Arc<str>, Rc<LocalRevision>>>,
    /// Metric blocks outlive a revision's removal so counters never go backwards.
    counters: RefCell<FxHashMap<Arc<str>, Arc<RevisionCounters>>>,
    version: Cell<u64>,
}

impl Replica {
    /// Looks a revision up by `namespace/name`.
    pub fn get(&self, key: &str) -> Option<Rc<LocalRevision>> {
        self.revisions.borrow().get(key).cloned()
    }

    /// The snapshot version this shard serves.
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    pub fn revision_count(&self) -> usize {
        self.revisions.borrow().len()
    }

    /// Applies one update from the control thread.
    pub fn apply(&self, update: RoutingUpdate, stats: &ShardStats) {
        let version = update.version();
        match update {
            RoutingUpdate::Upsert { route, .. } => {
                let existing = self.revisions.borrow().get(&route.key).cloned();
                match existing {
                    Some(revision) => revision.apply(route),
                    None => {
                        let counters = self
                            .counters
                            .borrow_mut()
                            .entry(route.key.clone())
                            .or_insert_with(|| stats.register_revision(route.labels.clone()))
                            .clone();
                        let revision = Rc::new(LocalRevision {
                            route: RefCell::new(route.clone()),
                            pods: RefCell::new(Vec::new()),
                            cursor: Cell::new(0),
                            removed: Cell::new(false),
                            changed: LocalNotify::default(),
                            counters,
                        });
                        revision.apply(route.clone());
                        self.revisions
                            .borrow_mut()
                            .insert(route.key.clone(), revision);
                    }
                }
            }
            RoutingUpdate::Remove { key, .. } => {
                if let Some(revision) = self.revisions.borrow_mut().remove(&key) {
                    revision.pods.borrow_mut().clear();
                    revision.removed.set(true);
                    revision.changed.notify_all();
                }
            }
        }
        // Versions only move forward; an update may arrive for a revision already removed.
        if version > self.version.get() {
            self.version.set(version);
            stats.routing_version.set(version);
        }
    }
}
