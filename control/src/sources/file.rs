//! The standalone source: the configuration file as the informer's view of the revisions and
//! their pods, the feature gates and the activators.
//!
//! The file's whole view goes to the state worker as one [`Op::Batch`] (so shards never see half
//! of a reload): the gates, the activators, each revision's spec and listed pods, and the
//! removal of revisions the previous view declared and this one does not. A changed
//! `[tracing]` goes to its own channel, read by the exporters. The file is polled
//! (a `stat` per poll; content compared when that changed, so an editor's rename-over and a
//! ConfigMap's symlink swap both work); a
//! file that does not parse keeps the last good view and the log says where it is broken.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kactivator_api::RevisionKey;
use kactivator_shards::routing::RevisionLabels;

use super::ControlMetrics;
use crate::config::trace::{self, TracingConfig};
use crate::config::{Config, RevisionConfig};
use crate::features;
use crate::pod_state::Gates;
use crate::state::{Activators, OmissionScope, Op, RevisionSpec};
use crate::worker::WorkerHandle;

/// The activator set the configuration describes; `pod_ip` (`POD_IP`) is this activator's
/// address unless `cluster.self_ip` says otherwise.
pub fn activators_of(config: &Config, pod_ip: Option<IpAddr>) -> Activators {
    if config.cluster.activators.is_empty() {
        return Activators::default();
    }
    Activators {
        me: config.cluster.self_ip.or(pod_ip),
        all: config.cluster.activators.clone(),
    }
}

/// How a revision of the file routes. `None` for names no revision can have, which
/// validation refuses before a file gets here.
pub fn revision_spec(revision: &RevisionConfig) -> Option<RevisionSpec> {
    let key = RevisionKey::new(&revision.namespace, &revision.name).ok()?;
    let tls = match &revision.tls {
        None => None,
        // Built by `Config::load`; a configuration that did not come through it has none, and
        // its TLS revisions are refused (by `view`), never dialled in plain.
        Some(tls) => Some(Box::new(tls.loaded.clone()?)),
    };
    Some(RevisionSpec {
        labels: RevisionLabels {
            namespace: revision.namespace.clone(),
            revision: revision.name.clone(),
            service: revision.service.clone(),
            configuration: revision.configuration.clone(),
        },
        key,
        container_concurrency: revision.container_concurrency,
        protocol: revision.protocol(),
        timeouts: revision.timeouts(),
        lb_policy: revision.lb_policy(),
        queue_depth: revision.queue_depth,
        priority: revision.priority_policy().map(Box::new),
        serving_port: revision.serving_port(),
        cluster_ip: revision.cluster_ip,
        tls,
        rules: None,
        cold_start: Default::default(),
    })
}

/// The file's view as one batch, and the revisions it declares. Revisions in
/// `declared_before` (the last view's) that this one does not declare are removed.
pub fn view(
    config: &Config,
    gates: Gates,
    activators: Activators,
    declared_before: &BTreeSet<RevisionKey>,
) -> (Op, BTreeSet<RevisionKey>) {
    let mut ops = vec![Op::SetGates(gates), Op::SetActivators(activators)];
    let mut declared = BTreeSet::new();
    for revision in &config.revisions {
        let Some(spec) = revision_spec(revision) else {
            tracing::error!(
                namespace = revision.namespace,
                name = revision.name,
                "a revision with an invalid name, or TLS to its pods that does not load, was not applied"
            );
            continue;
        };
        let key = spec.key.clone();
        ops.push(Op::UpsertRevision(spec));
        ops.push(Op::SetEndpoints {
            revision: key.clone(),
            ready: revision.pods.clone(),
            scope: OmissionScope::ListedPods,
        });
        declared.insert(key);
    }
    for gone in declared_before.difference(&declared) {
        ops.push(Op::RemoveRevision {
            revision: gone.clone(),
        });
    }
    (Op::Batch(ops), declared)
}

/// The file source between reloads: polls the file (it is not watched by inotify).
pub struct FilePoller {
    pub path: PathBuf,
    /// The configuration running: revisions, gates and activators as last applied; the
    /// sections that need a restart as they were at start-up.
    pub current: Config,
    pub gates: Gates,
    /// Revisions the last applied view declared.
    pub declared: BTreeSet<RevisionKey>,
    /// `POD_IP`, the default for `cluster.self_ip`.
    pub pod_ip: Option<IpAddr>,
    /// Where `[tracing]` goes when a reload changes it.
    pub tracing: tokio::sync::watch::Sender<TracingConfig>,
}

/// How long a changed file must keep the same content before it is applied (see
/// [`FilePoller::run`]). Short against the poll interval, long against a write.
pub const SETTLE: Duration = Duration::from_millis(50);

/// A file modified this recently is read at every poll even when its `stat` looks the same.
pub const RECENT: Duration = Duration::from_secs(2);

/// What a poll compares: size, modification time and identity (a rename-over or a ConfigMap's
/// symlink swap gives another inode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStat {
    len: u64,
    modified: Option<std::time::SystemTime>,
    device: u64,
    inode: u64,
}

fn stat(path: &std::path::Path) -> Option<FileStat> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).ok()?;
    Some(FileStat {
        len: metadata.len(),
        modified: metadata.modified().ok(),
        device: metadata.dev(),
        inode: metadata.ino(),
    })
}

fn modified_recently(stat: &Option<FileStat>) -> bool {
    let Some(modified) = stat.and_then(|stat| stat.modified) else {
        return true;
    };
    std::time::SystemTime::now()
        .duration_since(modified)
        .map_or(true, |age| age < RECENT)
}

/// Reads the file on the blocking pool: a large file must not hold up the control thread.
async fn read(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::read(path))
        .await
        .map_err(std::io::Error::other)?
}

impl FilePoller {
    /// Polls the file every `control.watch_interval_ms` and applies each changed, valid view.
    /// A poll is one `stat`; the file is read (off the control thread) only when the stat
    /// changed, or when it was modified in the last [`RECENT`] (a filesystem's timestamps may be
    /// too coarse to show two writes in a row).
    ///
    /// The first poll reads the file whatever its stat: it may have changed between start-up's
    /// load and this task's first look (a file rewritten the moment the activator was ready was
    /// otherwise taken as the one running, and its change never applied). What parses to the
    /// configuration running is not applied again.
    pub async fn run(mut self, worker: WorkerHandle, metrics: Arc<ControlMetrics>) {
        let mut last_text: Option<Vec<u8>> = None;
        let mut last_stat = None;
        let mut first = true;
        let interval = Duration::from_millis(self.current.control.watch_interval_ms);
        loop {
            tokio::time::sleep(interval).await;
            let now_stat = stat(&self.path);
            if now_stat.is_some() && now_stat == last_stat && !modified_recently(&now_stat) {
                continue;
            }
            last_stat = now_stat;
            let text = match read(&self.path).await {
                Ok(text) => text,
                Err(error) => {
                    if last_text.is_some() {
                        tracing::warn!(path = %self.path.display(), "cannot read the configuration; keeping the last good one: {error}");
                        metrics.reloads.with_label_values(&["error"]).inc();
                        last_text = None;
                    }
                    continue;
                }
            };
            if last_text.as_deref() == Some(&text[..]) {
                continue;
            }
            // Applied only if it reads the same a moment later: a writer that truncates and
            // then writes (`cat >`, many editors, `std::fs::write`) may have been caught half
            // way, and a prefix that happens to parse (an empty file, or one that ends between
            // two revisions) would remove everything after it.
            // The file's stat (modification time, size, inode) must not have moved either: on
            // a loaded machine this thread can oversleep into the writer's next rewrite, whose
            // prefix reads the same as the last one's.
            tokio::time::sleep(SETTLE).await;
            if read(&self.path).await.ok().as_deref() != Some(&text[..])
                || now_stat.is_none()
                || stat(&self.path) != now_stat
            {
                // Still being written: the next poll looks again.
                continue;
            }
            last_text = Some(text.clone());
            let parsed = Config::from_file(&text);
            match parsed {
                Ok(config)
                    if std::mem::take(&mut first)
                        && self.running_sections(config.clone()) == self.current => {}
                Ok(config) => self.reload(config, &worker, &metrics).await,
                Err(mut error) => {
                    error.source = Some(self.path.display().to_string());
                    tracing::warn!("configuration not applied, keeping the last good one: {error}");
                    metrics.reloads.with_label_values(&["error"]).inc();
                }
            }
        }
    }

    /// `config` with the sections that need a restart as they run (start-up may have set them
    /// from flags or lowered them to fit the memory budget): what a reload of it would leave
    /// in [`FilePoller::current`].
    fn running_sections(&self, mut config: Config) -> Config {
        config.listen = self.current.listen.clone();
        config.proxy = self.current.proxy.clone();
        config.health = self.current.health.clone();
        config.control = self.current.control.clone();
        config.cluster.peers = self.current.cluster.peers.clone();
        config
    }

    async fn reload(&mut self, config: Config, worker: &WorkerHandle, metrics: &ControlMetrics) {
        let current = &self.current;
        for (section, changed) in [
            ("listen", config.listen != current.listen),
            ("proxy", config.proxy != current.proxy),
            ("health", config.health != current.health),
            ("control", config.control != current.control),
            (
                "cluster.peers",
                config.cluster.peers != current.cluster.peers,
            ),
        ] {
            if changed {
                tracing::warn!(
                    section,
                    "this part of the configuration changed; it takes effect at the next restart"
                );
            }
        }
        let (gates, warnings) = features::resolve(&config.features, self.gates);
        for warning in warnings {
            tracing::warn!("{warning}");
        }
        if gates != self.gates {
            tracing::info!(
                from = self.gates.mode_label(),
                to = gates.mode_label(),
                "feature gates changed"
            );
        }
        // Tracing is not the state worker's: the exporters read it from its channel.
        let asked = config.tracing_config();
        if self.tracing.send_if_modified(|current| {
            let changed = *current != asked;
            if changed {
                *current = asked.clone();
            }
            changed
        }) {
            tracing::info!("tracing: {} ([tracing] reloaded)", trace::describe(&asked));
        }
        let activators = activators_of(&config, self.pod_ip);
        let (batch, declared) = view(&config, gates, activators, &self.declared);
        match worker.apply(batch).await {
            Ok(()) => {
                metrics.reloads.with_label_values(&["applied"]).inc();
                tracing::info!(
                    path = %self.path.display(),
                    revisions = declared.len(),
                    gates = gates.mode_label(),
                    "configuration reloaded"
                );
                self.gates = gates;
                self.declared = declared;
                // Keep the sections that need a restart as they run, so the warning repeats
                // only when they change again.
                self.current = self.running_sections(config);
            }
            Err(error) => {
                metrics.reloads.with_label_values(&["error"]).inc();
                tracing::error!("configuration reload failed: {error}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RevisionKey {
        RevisionKey::new("default", name).unwrap()
    }

    fn config(text: &str) -> Config {
        Config::parse(text).unwrap()
    }

    fn ops_of(batch: Op) -> Vec<Op> {
        match batch {
            Op::Batch(ops) => ops,
            other => panic!("expected a batch, got {other:?}"),
        }
    }

    #[test]
    fn a_view_declares_each_revision_with_its_listed_pods_after_the_gates_and_activators() {
        let config = config(
            "[[revisions]]\nnamespace = \"default\"\nname = \"a\"\ncontainer_concurrency = 2\npods = [\"10.0.0.1:8012\"]\n",
        );
        let (batch, declared) = view(
            &config,
            Gates::HYBRID,
            Activators::default(),
            &BTreeSet::new(),
        );
        let ops = ops_of(batch);
        assert_eq!(ops[0], Op::SetGates(Gates::HYBRID));
        assert_eq!(ops[1], Op::SetActivators(Activators::default()));
        let Op::UpsertRevision(spec) = &ops[2] else {
            panic!("{:?}", ops[2]);
        };
        assert_eq!(spec.key, key("a"));
        assert_eq!(spec.container_concurrency, 2);
        assert_eq!(
            ops[3],
            Op::SetEndpoints {
                revision: key("a"),
                ready: vec!["10.0.0.1:8012".parse().unwrap()],
                scope: OmissionScope::ListedPods,
            }
        );
        assert_eq!(ops.len(), 4);
        assert_eq!(declared, BTreeSet::from([key("a")]));
    }

    #[test]
    fn a_revision_dropped_from_the_file_is_removed() {
        let before = BTreeSet::from([key("a"), key("b")]);
        let config = config("[[revisions]]\nnamespace = \"default\"\nname = \"b\"\n");
        let (batch, declared) = view(&config, Gates::HYBRID, Activators::default(), &before);
        let ops = ops_of(batch);
        assert_eq!(ops.last(), Some(&Op::RemoveRevision { revision: key("a") }));
        assert_eq!(declared, BTreeSet::from([key("b")]));
    }

    #[test]
    fn the_activators_include_this_one_by_pod_ip_unless_self_ip_is_set() {
        let listed = config("[cluster]\nactivators = [\"10.1.0.1\", \"10.1.0.2\"]\n");
        let pod_ip: IpAddr = "10.1.0.2".parse().unwrap();
        assert_eq!(activators_of(&listed, Some(pod_ip)).me, Some(pod_ip));
        let pinned = config(
            "[cluster]\nself_ip = \"10.1.0.1\"\nactivators = [\"10.1.0.1\", \"10.1.0.2\"]\n",
        );
        assert_eq!(
            activators_of(&pinned, Some(pod_ip)).me,
            Some("10.1.0.1".parse().unwrap())
        );
        assert_eq!(
            activators_of(&config(""), Some(pod_ip)),
            Activators::default()
        );
    }
}
