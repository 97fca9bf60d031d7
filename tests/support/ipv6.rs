//! An IPv6-only network: a network namespace whose only link to the test's is a veth pair with
//! `fd00:6b61:…` addresses (no IPv4 on it). The test's end is an address of this namespace
//! (a pod listening there is reachable from here over IPv6 only). Removed on drop.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A network namespace reached from the test's namespace over one IPv6-only veth pair.
pub struct Ipv6Net {
    name: String,
    host_link: String,
    /// The test's end, and the namespace's.
    pub host: IpAddr,
    pub inside: IpAddr,
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("run ip");
    assert!(status.success(), "ip {args:?} failed");
}

impl Ipv6Net {
    pub fn new() -> Ipv6Net {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{:x}{n}", std::process::id() % 0xffff);
        let name = format!("ka6-{tag}");
        let (host_link, inside_link) = (format!("ka6h{tag}"), format!("ka6p{tag}"));
        let prefix = format!("fd00:6b61:{:x}:{n:x}", std::process::id() % 0xffff);
        let net = Ipv6Net {
            name: name.clone(),
            host_link: host_link.clone(),
            host: format!("{prefix}::1").parse().unwrap(),
            inside: format!("{prefix}::2").parse().unwrap(),
        };
        ip(&["netns", "add", &name]);
        ip(&[
            "link",
            "add",
            &host_link,
            "type",
            "veth",
            "peer",
            "name",
            &inside_link,
        ]);
        ip(&["link", "set", &inside_link, "netns", &name]);
        ip(&[
            "addr",
            "add",
            &format!("{}/64", net.host),
            "dev",
            &host_link,
            "nodad",
        ]);
        ip(&["link", "set", &host_link, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", name.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["link", "set", "lo", "up"]);
        inside(&[
            "addr",
            "add",
            &format!("{}/64", net.inside),
            "dev",
            &inside_link,
            "nodad",
        ]);
        inside(&["link", "set", &inside_link, "up"]);
        net
    }

    /// `program args…` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    pub fn inside(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.inside, port)
    }
}

impl Drop for Ipv6Net {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
