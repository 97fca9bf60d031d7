//! Pods on real addresses in a network namespace of their own: a PodNet's pods take backends
//! and connections from the host, bind nothing on the host's addresses, a gone pod's address
//! fails fast, and each PodNet owns its link, namespace and route until dropped, also when the
//! test fails.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::podnet::PodNet;

/// A GET over hyper's client on a fresh connection: status and body.
fn hyper_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header("host", addr.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.expect("response");
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
}

fn link_exists(link: &str) -> bool {
    ip_succeeds(&["link", "show", "dev", link])
}

fn namespace_exists(namespace: &str) -> bool {
    ip_succeeds(&["netns", "exec", namespace, "true"])
}

fn route_exists(subnet: &str) -> bool {
    let output = Command::new("ip")
        .args(["route", "show", "type", "unreachable", subnet])
        .output()
        .unwrap();
    !output.stdout.is_empty()
}

fn ip_succeeds(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn backend_on_a_podnet_address_answers_over_tcp() {
    let net = PodNet::new();
    let pod = net.add_address();
    assert!(!pod.is_loopback());
    let backend = net
        .inside(|| backend::spawn_on(SocketAddr::new(pod, 0), BackendConfig::named("pod-a")))
        .expect("bind a backend to the pod address");
    assert_eq!(backend.addr().ip(), pod);

    let (status, body) = hyper_get(backend.addr(), "/");
    assert_eq!((status, body.as_str()), (200, "hello from pod-a\n"));
}

#[test]
fn pods_of_a_revision_share_a_port_on_their_own_addresses() {
    let net = PodNet::new();
    let pods = [net.add_address(), net.add_address()];
    assert_ne!(pods[0], pods[1]);
    let backends = net
        .inside(|| {
            backend::spawn_on_shared_port(
                pods.iter()
                    .zip(["pod-a", "pod-b"])
                    .map(|(&ip, name)| (ip, BackendConfig::named(name))),
            )
        })
        .unwrap();
    assert_eq!(backends[0].addr().port(), backends[1].addr().port());
    for (backend, name) in backends.iter().zip(["pod-a", "pod-b"]) {
        assert_eq!(
            hyper_get(backend.addr(), "/").1,
            format!("hello from {name}\n")
        );
    }
}

/// A connect to `ip` fails at once with "No route to host", rather than waiting out a SYN
/// sent through the default route.
fn assert_unreachable_at_once(ip: IpAddr) {
    let started = Instant::now();
    let error = TcpStream::connect_timeout(&SocketAddr::new(ip, 8012), Duration::from_secs(5))
        .expect_err("nothing holds this address");
    assert_eq!(
        error.kind(),
        io::ErrorKind::HostUnreachable,
        "{ip}: {error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_gone_pod_is_unreachable_at_once() {
    let net = PodNet::new();
    assert_unreachable_at_once(net.unassigned_address());

    let pod = net.add_address();
    let backend = net
        .inside(|| backend::spawn_on(SocketAddr::new(pod, 0), BackendConfig::named("pod-a")))
        .unwrap();
    assert_eq!(
        hyper_get(backend.addr(), "/healthz"),
        (200, "ok".to_owned())
    );
    net.remove_address(pod);
    assert_unreachable_at_once(pod);
    // Its number is free again.
    assert_eq!(net.add_address(), pod);
}

#[test]
fn each_podnet_owns_a_link_and_a_subnet_until_dropped() {
    let first = PodNet::new();
    let second = PodNet::new();
    assert_ne!(first.link(), second.link());
    assert_ne!(first.subnet(), second.subnet());
    let (IpAddr::V4(a), IpAddr::V4(b)) = (first.add_address(), second.add_address()) else {
        panic!("PodNet addresses are IPv4");
    };
    assert_eq!(a.octets()[..2], [10, 213]);
    assert_ne!(a.octets()[2], b.octets()[2]);

    let link = first.link().to_owned();
    let subnet = first.subnet();
    assert!(link_exists(&link));
    assert!(namespace_exists(first.namespace()));
    assert!(route_exists(&subnet));
    drop(first);
    assert!(!link_exists(&link), "{link} outlived its PodNet");
    assert!(
        !namespace_exists(&link),
        "namespace {link} outlived its PodNet"
    );
    assert!(
        !route_exists(&subnet),
        "{subnet}'s route outlived its PodNet"
    );
}

#[test]
fn a_pod_on_port_8012_binds_nothing_on_the_hosts_addresses() {
    // Something on the machine listens on every host address at the pod port (as a
    // kactivator on 0.0.0.0:8012 would); if it cannot take the port here, another test has it,
    // and a port of our own shows the same.
    let host = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 8012))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .expect("a host listener");
    let port = host.local_addr().unwrap().port();
    let net = PodNet::new();
    let pod = net.add_address();
    let backend = net
        .inside(|| backend::spawn_on(SocketAddr::new(pod, port), BackendConfig::named("pod-a")))
        .expect("the pod's port is its own namespace's");
    assert_eq!(hyper_get(backend.addr(), "/").1, "hello from pod-a\n");
    // Nothing of the pod is in the host's namespace: its address is not local there.
    assert_eq!(
        TcpListener::bind(SocketAddr::new(pod, 0))
            .expect_err("not a host address")
            .kind(),
        io::ErrorKind::AddrNotAvailable
    );
    // A host-side address is, for processes that run in the host's namespace.
    let host_side = net.add_host_address();
    let listener = TcpListener::bind(SocketAddr::new(host_side, 0)).expect("a host address");
    drop(listener);
}

#[test]
fn a_failing_test_leaves_no_link_namespace_or_route_behind() {
    let (link, subnet) = std::thread::spawn(|| {
        let net = PodNet::new();
        let pod = net.add_address();
        let _backend = net
            .inside(|| backend::spawn_on(SocketAddr::new(pod, 0), BackendConfig::named("pod-a")))
            .unwrap();
        let link = net.link().to_owned();
        let subnet = net.subnet();
        std::panic::panic_any((link, subnet));
    })
    .join()
    .expect_err("the test panicked")
    .downcast::<(String, String)>()
    .map(|boxed| *boxed)
    .expect("the panic carried the names");
    assert!(!link_exists(&link), "{link} outlived a panic");
    assert!(
        !namespace_exists(&link),
        "namespace {link} outlived a panic"
    );
    assert!(!route_exists(&subnet), "{subnet}'s route outlived a panic");
}

#[test]
fn a_process_runs_inside_the_namespace() {
    let net = PodNet::new();
    let pod = net.add_address();
    let output = net
        .command("ip")
        .args(["-4", "-o", "address", "show"])
        .output()
        .expect("ip netns exec");
    let addresses = String::from_utf8_lossy(&output.stdout);
    assert!(addresses.contains(&pod.to_string()), "{addresses}");
}
