//! The standalone source: the configuration file as the informer's view of revisions and pods.

use kactivator_shards::routing::RevisionLabels;

use crate::config::Config;
use crate::state::{RevisionSpec, SourceRevision};

/// Every revision the file declares, with the pods it lists.
pub fn revisions(config: &Config) -> Vec<SourceRevision> {
    config
        .revisions
        .iter()
        .map(|revision| SourceRevision {
            spec: RevisionSpec {
                labels: RevisionLabels {
                    namespace: revision.namespace.clone(),
                    revision: revision.name.clone(),
                    service: revision.service.clone(),
                    configuration: revision.configuration.clone(),
                },
                container_concurrency: revision.container_concurrency,
                protocol: revision.protocol(),
                timeouts: revision.timeouts(),
                lb_policy: revision.lb_policy(),
                queue_depth: revision.queue_depth,
                serving_port: revision.serving_port(),
            },
            listed: revision.pods.clone(),
        })
        .collect()
}
