//! `kactivator demo`: real backends on loopback and a kactivator in front of them, nothing to
//! install. Prints what to try, then serves until Ctrl-C.

use std::net::{Ipv4Addr, SocketAddr};

use kactivator_control::config::{
    Config, RevisionConfig, DEFAULT_ADMIN, DEFAULT_HTTP, DEFAULT_HTTP2,
};
use kactivator_testkit::backend::{self, BackendConfig};

use crate::cli::{Cli, DemoArgs};
use crate::start::{self, StartError};

pub fn run(cli: &Cli, args: &DemoArgs) -> Result<(), StartError> {
    let mut handles = Vec::with_capacity(usize::from(args.pods));
    for index in 0..args.pods {
        let handle = backend::spawn(BackendConfig {
            name: format!("hello-pod-{index}"),
            revision_name: Some("hello".into()),
            revision_namespace: Some("default".into()),
        })?;
        handles.push(handle);
    }
    let mut config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => demo_defaults(),
    };
    config.revisions.push(RevisionConfig {
        service: "hello".into(),
        configuration: "hello".into(),
        pods: handles.iter().map(|handle| handle.addr()).collect(),
        ..RevisionConfig::new("default", "hello")
    });
    let http = cli.http.unwrap_or(config.listen.http);
    let admin = cli.admin.unwrap_or(config.listen.admin);
    let pods: Vec<String> = handles
        .iter()
        .map(|handle| handle.addr().to_string())
        .collect();
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
            pods.len(),
            pods.join(", ")
        );
    })?;
    drop(handles);
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
