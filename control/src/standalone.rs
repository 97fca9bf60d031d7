//! The standalone source: turns the configuration file into desired revisions.

use kactivator_shards::routing::RevisionLabels;

use crate::config::Config;
use crate::table::DesiredRevision;

/// Every revision the file declares, as the routing table wants them.
pub fn desired_revisions(config: &Config) -> Vec<DesiredRevision> {
    config
        .revisions
        .iter()
        .map(|revision| DesiredRevision {
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
            pods: revision.pods.clone(),
        })
        .collect()
}
