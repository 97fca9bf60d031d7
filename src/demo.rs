//! `kactivator demo`: a few pods on loopback ([`pods`]) and a kactivator in front of them, nothing
//! to install. Prints what to try, then serves until Ctrl-C.

mod pods;

use std::net::{Ipv4Addr, SocketAddr};

use kactivator_control::config::{
    Config, RevisionConfig, DEFAULT_ADMIN, DEFAULT_HTTP, DEFAULT_HTTP2,
};

use crate::cli::{Cli, DemoArgs};
use crate::start::{self, StartError};

/// The demo's revision, `default/hello`.
const NAMESPACE: &str = "default";
const REVISION: &str = "hello";

pub fn run(cli: &Cli, args: &DemoArgs) -> Result<(), StartError> {
    let pods = pods::spawn(NAMESPACE, REVISION, args.pods)?;
    let mut config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => demo_defaults(),
    };
    config.revisions.push(RevisionConfig {
        service: REVISION.into(),
        configuration: REVISION.into(),
        pods: pods.addrs().to_vec(),
        ..RevisionConfig::new(NAMESPACE, REVISION)
    });
    let http = cli.http.unwrap_or(config.listen.http);
    let admin = cli.admin.unwrap_or(config.listen.admin);
    let pod_list: Vec<String> = pods.addrs().iter().map(ToString::to_string).collect();
    start::run_with(cli, Some(config), || {
        println!(
            "\nkactivator demo: revision default/hello with {} pods ({})\n\n\
             Try:\n  \
             curl -i http://{http}/ -H 'Knative-Serving-Namespace: default' -H 'Knative-Serving-Revision: hello'\n  \
             curl -i http://{http}/ -H 'Host: hello.default.svc.cluster.local'\n  \
             curl -i http://{http}/headers -H 'Host: hello.default.svc.cluster.local'\n  \
             curl -i http://{http}/ -H 'Host: nope.default.svc.cluster.local'      # unknown revision: 404\n  \
             curl -i http://{http}/ -H 'K-Network-Probe: activator'                  # answered by the activator\n  \
             curl -s http://{admin}/metrics | grep activator_request_count\n\n\
             Ctrl-C drains and exits.\n",
            pod_list.len(),
            pod_list.join(", ")
        );
    })?;
    drop(pods);
    Ok(())
}

fn demo_defaults() -> Config {
    let mut config = Config::default();
    // The default ports, on loopback only.
    config.listen.http = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DEFAULT_HTTP.port());
    config.listen.http2 = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DEFAULT_HTTP2.port());
    config.listen.admin = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), DEFAULT_ADMIN.port());
    // A demo should stop promptly on Ctrl-C.
    config.proxy.drain_grace_seconds = 0;
    config
}
