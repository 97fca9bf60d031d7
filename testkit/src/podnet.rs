//! Pods with real addresses: core/v1 Endpoints refuse loopback addresses (127.0.0.0/8), so a
//! test that feeds pods to kactivator through the API server needs addresses a cluster could
//! have. Needs root (CAP_NET_ADMIN) and `ip` from iproute2.
//!
//! A [`PodNet`] is one network interface in the test's own (root) network namespace, named
//! `ktpod<N>`, that holds the pods' addresses: `10.213.<N>.<k>/32`, `k` = 2, 3, … Addresses on
//! any interface of a namespace are local addresses of the whole namespace, so a backend binds
//! one ([`crate::backend::spawn_on`]) and anything on the machine dials it, with no routing,
//! no veth pairs and no `ip netns exec`. A pod's traffic goes through the loopback device
//! like 127.0.0.1's; only the addresses are real.
//!
//! The interface is a bridge with no ports, used as nothing more than an always-up link to
//! hang addresses on. (A `dummy` link is the usual choice, but the kernels these tests run on
//! lack the dummy driver: `ip link add … type dummy` says "Unknown device type".)
//!
//! Many test processes share the namespace, so:
//! - `N` is claimed by creating the link: the kernel refuses a second `ktpod<N>`, whichever
//!   process asks, and the next free `N` is taken instead. At most 256 PodNets exist at once.
//! - The link is created with its owner's pid as its interface group (set in the same netlink
//!   request as the name), and a link whose owner is dead is deleted by the next
//!   [`PodNet::new`]: nothing leaks when a test process is killed.
//! - Every address of `10.213.<N>.0/24` that no pod holds is unreachable (an `unreachable`
//!   route), so dialing a pod that is gone fails at once with "No route to host" instead of
//!   leaving the machine through the default route.
//!
//! Dropping the [`PodNet`] deletes its route and its link, and with it every address.

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, Once};

/// Every PodNet's /24 lies in 10.213.0.0/16, which neither Service ClusterIPs
/// (`apiserver`'s 10.96.0.0/16) nor common host networks use.
pub const POD_NETWORK_OCTETS: [u8; 2] = [10, 213];

/// The apiserver's Service ClusterIP range is 10.96.0.0/16 (`apiserver`'s
/// `SERVICE_CLUSTER_IP_RANGE`); [`PodNet::add_service_address`] hands out `10.96.<N>.<k>`.
pub const SERVICE_NETWORK_OCTETS: [u8; 2] = [10, 96];

/// Host numbers of Service addresses start here (`.1` of network 0 is the `kubernetes`
/// Service's).
const FIRST_SERVICE_HOST: u8 = 10;

/// Links are named `ktpod<N>`.
const LINK_PREFIX: &str = "ktpod";

/// Host numbers handed out by [`PodNet::add_address`]; `.1` is kept as
/// [`PodNet::unassigned_address`].
const FIRST_HOST: u8 = 2;
const LAST_HOST: u8 = 254;

/// One test's pod network: a link holding addresses of `10.213.<N>.0/24`. See the module docs.
#[derive(Debug)]
pub struct PodNet {
    index: u8,
    link: String,
    /// Host numbers given out and not removed.
    hosts: Mutex<Vec<u8>>,
    /// Service addresses given out so far.
    services: Mutex<u8>,
}

// === impl PodNet ===

impl PodNet {
    /// Claims a free `ktpod<N>` and its `10.213.<N>.0/24`.
    ///
    /// # Panics
    ///
    /// When `ip` is missing or refuses (not root), or all 256 networks are taken.
    pub fn new() -> PodNet {
        reclaim_orphans_once();
        let owner = std::process::id().to_string();
        for index in 0..=u8::MAX {
            let link = format!("{LINK_PREFIX}{index}");
            let created = ip(&[
                "link", "add", "name", &link, "group", &owner, "type", "bridge",
            ]);
            if !created.status.success() {
                let stderr = String::from_utf8_lossy(&created.stderr);
                if stderr.contains("File exists") {
                    continue;
                }
                panic!(
                    "`ip link add {link} type bridge` failed: {} (PodNet needs root, or \
                     CAP_NET_ADMIN)",
                    stderr.trim()
                );
            }
            // From here on the link is ours, and Drop removes whatever was set up.
            let net = PodNet {
                index,
                link,
                hosts: Mutex::new(Vec::new()),
                services: Mutex::new(0),
            };
            let alias = format!(
                "kactivator testkit PodNet of pid {owner} ({})",
                std::env::args().next().unwrap_or_default()
            );
            ip_expect(&["link", "set", "dev", &net.link, "alias", &alias]);
            ip_expect(&["link", "set", "dev", &net.link, "up"]);
            ip_expect(&["route", "replace", "unreachable", &net.subnet()]);
            return net;
        }
        panic!("all 256 pod networks ({LINK_PREFIX}0 to {LINK_PREFIX}255) are taken");
    }

    /// The link's name, `ktpod<N>`.
    pub fn link(&self) -> &str {
        &self.link
    }

    /// `10.213.<N>.0/24`.
    pub fn subnet(&self) -> String {
        format!("{}/24", self.host(0))
    }

    /// Adds the next free address, `10.213.<N>.<k>` with `k` from 2 up, and returns it. It is
    /// usable (bindable, dialable) at once.
    ///
    /// # Panics
    ///
    /// When all 253 addresses are in use, or `ip` fails.
    pub fn add_address(&self) -> IpAddr {
        let mut hosts = self.hosts.lock().expect("no code panics while holding it");
        let host = (FIRST_HOST..=LAST_HOST)
            .find(|host| !hosts.contains(host))
            .unwrap_or_else(|| panic!("{}: all addresses of {} in use", self.link, self.subnet()));
        let address = self.host(host);
        self.address("add", address);
        hosts.push(host);
        IpAddr::V4(address)
    }

    /// Removes an address [`PodNet::add_address`] gave out: listeners bound to it stop
    /// receiving connections, and dialing it fails at once, as for a pod that is gone. Its
    /// host number is given out again later.
    ///
    /// # Panics
    ///
    /// When `address` is not one of this PodNet's, or `ip` fails.
    pub fn remove_address(&self, address: IpAddr) {
        let mut hosts = self.hosts.lock().expect("no code panics while holding it");
        let position = hosts
            .iter()
            .position(|&host| IpAddr::V4(self.host(host)) == address)
            .unwrap_or_else(|| panic!("{address} is not an address of {}", self.link));
        let IpAddr::V4(address) = address else {
            unreachable!("every address of a PodNet is IPv4")
        };
        self.address("del", address);
        hosts.swap_remove(position);
    }

    /// Adds a Service ClusterIP, `10.96.<N>.<k>` with `k` from 10 up, for a test that writes a
    /// Service with that `clusterIP` and listens on it itself, as kube-proxy would forward it.
    /// (The apiserver picks ClusterIPs at random in 10.96.0.0/16 for Services that name none;
    /// a test sets its explicit ones before creating those.) It goes away with the link.
    ///
    /// # Panics
    ///
    /// When all of them are in use, or `ip` fails.
    pub fn add_service_address(&self) -> IpAddr {
        let mut given = self
            .services
            .lock()
            .expect("no code panics while holding it");
        let host = FIRST_SERVICE_HOST
            .checked_add(*given)
            .unwrap_or_else(|| panic!("{}: no Service address left", self.link));
        let [a, b] = SERVICE_NETWORK_OCTETS;
        let address = Ipv4Addr::new(a, b, self.index, host);
        self.address("add", address);
        *given += 1;
        IpAddr::V4(address)
    }

    /// `10.213.<N>.1`, which is never a pod's: dialing it fails at once ("No route to host").
    pub fn unassigned_address(&self) -> IpAddr {
        IpAddr::V4(self.host(1))
    }

    /// `ip address <action> <address>/32 dev <link>`.
    fn address(&self, action: &str, address: Ipv4Addr) {
        ip_expect(&[
            "address",
            action,
            &format!("{address}/32"),
            "dev",
            &self.link,
        ]);
    }

    fn host(&self, host: u8) -> Ipv4Addr {
        let [a, b] = POD_NETWORK_OCTETS;
        Ipv4Addr::new(a, b, self.index, host)
    }
}

impl Default for PodNet {
    /// [`PodNet::new`].
    fn default() -> Self {
        PodNet::new()
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        remove(self.index, &self.link);
    }
}

/// Deletes the route of network `index` and then its link (the order in which a crash in
/// between leaves the link, which a later [`reclaim_orphans_once`] finds).
fn remove(index: u8, link: &str) {
    let [a, b] = POD_NETWORK_OCTETS;
    let subnet = format!("{a}.{b}.{index}.0/24");
    for args in [
        &["route", "del", "unreachable", &subnet][..],
        &["link", "del", "dev", link][..],
    ] {
        let output = ip(args);
        if !output.status.success() {
            eprintln!(
                "`ip {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
    }
}

/// Once per process: deletes the `ktpod<N>` links (and routes) of processes that are gone.
fn reclaim_orphans_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let listed = ip_expect(&["-j", "link", "show", "type", "bridge"]);
        let links: Vec<serde_json::Value> =
            serde_json::from_slice(&listed.stdout).unwrap_or_default();
        for link in links {
            let Some(name) = link["ifname"].as_str() else {
                continue;
            };
            let Some(index) = name
                .strip_prefix(LINK_PREFIX)
                .and_then(|index| index.parse::<u8>().ok())
            else {
                continue;
            };
            // The owner's pid; "default" (group 0) would be a link someone else made.
            let Some(owner) = link["group"]
                .as_str()
                .and_then(|group| group.parse::<u32>().ok())
            else {
                continue;
            };
            // A live owner (or a new process that reuses its pid) keeps its link.
            if owner == 0 || std::path::Path::new(&format!("/proc/{owner}")).exists() {
                continue;
            }
            remove(index, name);
        }
    });
}

/// Runs `ip <args>` and returns what happened.
///
/// # Panics
///
/// When `ip` cannot be started.
fn ip(args: &[&str]) -> Output {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| {
            panic!("cannot run `ip` ({error}): PodNet needs iproute2 (apt-get install iproute2)")
        })
}

/// Runs `ip <args>`, panicking with its stderr when it fails.
fn ip_expect(args: &[&str]) -> Output {
    let output = ip(args);
    if !output.status.success() {
        panic!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    output
}
