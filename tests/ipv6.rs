//! IPv6-only networks (issue 36): Knative supports IPv6-only and dual-stack clusters, whose
//! kubelet, ingress and activators dial pods and activators at IPv6 addresses. Each role runs
//! here in a network namespace of its own whose only link to the test is IPv6 (a veth pair
//! with `fd00:6b61:…` addresses and no IPv4 on it), on its default listening addresses, and is
//! reached only over IPv6. Everything made here is removed on drop.

mod support;

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::Duration;

use kactivator_testkit::backend::{self, BackendConfig};
use support::ipv6::Ipv6Net;
use support::queue_proxy::knative_env;
use support::{admin_get, eventually, exchange, get, scratch_dir};

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn stderr_of(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
}

/// The activator on its defaults (`[::]:8012`, `[::]:8013`, `[::]:9090`) inside an IPv6-only
/// network, proxying to a pod at an IPv6 address: both data ports and the admin port answer
/// over IPv6, and the pod is reached over IPv6.
#[test]
fn the_activator_serves_an_ipv6_only_network_on_its_default_addresses() {
    let net = Ipv6Net::new();
    let pod = backend::spawn_on(SocketAddr::new(net.host, 0), BackendConfig::named("pod-6"))
        .expect("a pod on the IPv6 link");
    let dir = scratch_dir();
    let config = dir.join("kactivator.toml");
    std::fs::write(
        &config,
        support::revision("default", "hello", &[pod.addr()], ""),
    )
    .unwrap();
    let _activator = Killed(
        net.command(env!("CARGO_BIN_EXE_kactivator"))
            .args(["--config", config.to_str().unwrap()])
            .env_remove("KACTIVATOR_HTTP")
            .env_remove("KACTIVATOR_HTTP2")
            .env_remove("KACTIVATOR_ADMIN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .expect("start kactivator in the namespace"),
    );
    assert!(
        eventually(Duration::from_secs(15), || {
            admin_get(net.inside(9090), "/readyz").is_some_and(|(status, _)| status == 200)
        }),
        "not ready over IPv6: {}",
        stderr_of(&dir)
    );
    for port in [8012, 8013] {
        let response = exchange(net.inside(port), get("hello", "/").as_bytes());
        assert_eq!(response.status, 200, "port {port}: {}", stderr_of(&dir));
        assert_eq!(response.text(), "hello from pod-6\n");
    }
    assert_eq!(pod.stats().requests, 2);
}

/// The queue-proxy on its defaults (serving port from `QUEUE_SERVING_PORT`, `:8022`, `:9090`,
/// `:9091`, all `[::]`) in an IPv6-only pod network, as an IPv6 cluster's kubelet, activator
/// and autoscaler reach it. Its user container listens on the pod's loopback, as upstream's.
#[test]
fn the_queue_proxy_serves_an_ipv6_only_pod_network_on_its_default_addresses() {
    let net = Ipv6Net::new();
    let dir = scratch_dir();
    let _user = Killed(
        net.command("python3")
            .args(["-m", "http.server", "8080", "--bind", "127.0.0.1"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the user container"),
    );
    let mut env = knative_env(8080, 8012, 0);
    env.insert("SERVING_POD_IP".into(), net.inside.to_string());
    let _proxy = Killed(
        net.command(env!("CARGO_BIN_EXE_kactivator"))
            .arg("queue-proxy")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
            .spawn()
            .expect("start the queue-proxy in the namespace"),
    );
    let health = "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.30\r\nK-Network-Probe: queue\r\nConnection: close\r\n\r\n";
    assert!(
        eventually(Duration::from_secs(15), || {
            std::net::TcpStream::connect_timeout(&net.inside(8012), Duration::from_millis(200))
                .is_ok()
                && exchange(net.inside(8012), health.as_bytes()).status == 200
        }),
        "health checks never passed over IPv6: {}",
        stderr_of(&dir)
    );
    let response = exchange(
        net.inside(8012),
        b"GET / HTTP/1.1\r\nHost: hello.default\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(response.status, 200, "{}", stderr_of(&dir));
    for (port, path) in [(9090, "/metrics"), (9091, "/metrics"), (9091, "/readyz")] {
        let answer = admin_get(net.inside(port), path);
        assert_eq!(
            answer.as_ref().map(|(status, _)| *status),
            Some(200),
            ":{port}{path}: {}",
            stderr_of(&dir)
        );
    }
    let other = admin_get(net.inside(8022), "/other");
    assert_eq!(other.map(|(status, _)| status), Some(404), ":8022 answers");
}
