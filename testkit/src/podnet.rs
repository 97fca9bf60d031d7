//! Pods with real addresses, in a network namespace of their own: core/v1 Endpoints refuse
//! loopback addresses (127.0.0.0/8), so a test that feeds pods to kactivator through the API
//! server needs addresses a cluster could have. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for
//! `setns`) and `ip` from iproute2.
//!
//! A [`PodNet`] is one network namespace, `ktpod<N>`, joined to the test's own (root) namespace
//! by a veth pair: `ktpod<N>` on the host side, `ktpod<N>p` inside. Its addresses come from
//! `10.213.<N>.0/24`:
//! - `.1` is the host end's: what kactivator's connections to pods come from;
//! - pods ([`PodNet::add_address`]) live inside the namespace, so a backend started there
//!   ([`PodNet::inside`]) binds nothing on the host's addresses: a test pod on `:8012` does not
//!   collide with anything on the machine listening on `:8012`. The host reaches each pod by a
//!   `/32` route through the veth;
//! - [`PodNet::add_host_address`] puts an address on the host end, for a process that must run
//!   in the host's namespace at a pod-like address (a kactivator that `activator-service`
//!   lists);
//! - `.254` is never handed out: the rest of the /24 is an `unreachable` route, so dialing a
//!   pod that is gone fails at once with "No route to host".
//!
//! Service ClusterIPs ([`PodNet::add_service_address`], `10.96.<N>.<k>`) live inside the
//! namespace too, each with its `/32` route.
//!
//! The machine is left as it was found:
//! - [`PodNet::new`] refuses to start (panics, saying which route or address) when the machine
//!   already routes any part of 10.213.0.0/16 or 10.96.0.0/16 by a route or an address that no
//!   PodNet made: its routes would shadow that network. Every route a PodNet adds carries the
//!   protocol number 213 (`proto 213`), and every address it puts in the host's namespace is on
//!   its own `ktpod<N>` link: marks that hold at any moment of another PodNet's setup or
//!   teardown, so a parallel test's PodNet never looks foreign.
//! - `N` is claimed by creating the host link: the kernel refuses a second `ktpod<N>`,
//!   whichever process asks. The link carries its owner's pid as its interface group, and the
//!   links (with their namespace and route) of owners that are dead are removed by the next
//!   [`PodNet::new`] in any process.
//! - Dropping the [`PodNet`], also while a failing test unwinds, deletes the one route it added
//!   (the `unreachable` /24, only if it added it), its namespace and its link; every address and
//!   `/32` route goes with the link. No other route is ever replaced or deleted.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Where this process looks for a free network next: just past the last one it claimed, so
/// a network given back is not handed out again until the other 255 have been tried. A test that
/// checks its network is gone after a drop therefore does not find a parallel test's new one
/// under the same name. Processes start at different points (by pid) for the same reason.
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The `step`-th index to try, wrapping through all 256 from this process's next one.
fn next_index(step: usize) -> u8 {
    let mut start = NEXT_INDEX.load(Ordering::Relaxed);
    if start == usize::MAX {
        start = std::process::id() as usize * 37;
    }
    // Truncation is the wrap: 256 networks.
    (start.wrapping_add(step) % 256) as u8
}

/// Links and namespaces are named `ktpod<N>` (the namespace's end of the veth `ktpod<N>p`).
const LINK_PREFIX: &str = "ktpod";

/// The protocol number every route a PodNet adds in the host's namespace carries
/// (`ip route add … proto 213`), which is how [`foreign_routes`] knows a PodNet's route from the
/// route alone. The name of a route's link is no such mark: when the link is deleted between
/// the kernel's answer and `ip` looking up its name, `ip` prints `dev if<index>`, and a PodNet
/// being torn down deletes its link.
/// iproute2's `rt_protos` gives 213 no name, so `ip -j` prints it as this number.
const ROUTE_PROTOCOL: &str = "213";

/// The host end's own address, `.1`.
const HOST_END: u8 = 1;
/// Host numbers handed out by [`PodNet::add_address`] and [`PodNet::add_host_address`].
const FIRST_HOST: u8 = 2;
const LAST_HOST: u8 = 253;
/// Never handed out: [`PodNet::unassigned_address`].
const UNASSIGNED_HOST: u8 = 254;

/// Where an address handed out lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Inside the namespace (a pod), with a `/32` route from the host.
    Pod,
    /// On the host end of the veth, in the test's own namespace.
    Host,
}

/// One test's pod network: a namespace holding addresses of `10.213.<N>.0/24`. See the
/// module docs.
#[derive(Debug)]
pub struct PodNet {
    index: u8,
    /// The host link's and the namespace's name, `ktpod<N>`.
    name: String,
    /// The namespace's end of the veth, `ktpod<N>p`.
    inner: String,
    /// The `unreachable` route of the /24 was added by this PodNet (and so is deleted by it).
    route_added: bool,
    /// Host numbers given out and not removed.
    hosts: Mutex<Vec<(u8, Side)>>,
    /// Service addresses given out so far.
    services: Mutex<u8>,
}

// === impl PodNet ===

impl PodNet {
    /// Claims a free `ktpod<N>`: its namespace, veth pair and `10.213.<N>.0/24`.
    ///
    /// # Panics
    ///
    /// When `ip` is missing or refuses (not root), when the machine already routes part of
    /// 10.213.0.0/16 or 10.96.0.0/16 (the message names the route), or when all 256 networks
    /// are taken.
    pub fn new() -> PodNet {
        reclaim_orphans_once();
        refuse_ranges_in_use();
        let owner = std::process::id().to_string();
        for step in 0..=usize::from(u8::MAX) {
            let index = next_index(step);
            let name = format!("{LINK_PREFIX}{index}");
            let inner = format!("{name}p");
            let created = ip(&[
                "link", "add", "name", &name, "group", &owner, "type", "veth", "peer", "name",
                &inner,
            ]);
            if !created.status.success() {
                let stderr = String::from_utf8_lossy(&created.stderr);
                if stderr.contains("File exists") {
                    continue;
                }
                panic!(
                    "`ip link add {name} type veth` failed: {} (PodNet needs root, or \
                     CAP_NET_ADMIN)",
                    stderr.trim()
                );
            }
            // From here on the link is ours, and Drop removes whatever was set up.
            let mut net = PodNet {
                index,
                name,
                inner,
                route_added: false,
                hosts: Mutex::new(Vec::new()),
                services: Mutex::new(0),
            };
            if !ip(&["netns", "add", &net.name]).status.success() {
                // A namespace of that name that no PodNet made: leave it alone, give the link
                // back, and let Drop remove nothing.
                let _ = ip(&["link", "del", "dev", &net.name]);
                net.name.clear();
                continue;
            }
            net.set_up(&owner);
            NEXT_INDEX.store(usize::from(index) + 1, Ordering::Relaxed);
            return net;
        }
        panic!("all 256 pod networks ({LINK_PREFIX}0 to {LINK_PREFIX}255) are taken");
    }

    fn set_up(&mut self, owner: &str) {
        let alias = format!(
            "kactivator testkit PodNet of pid {owner} ({})",
            std::env::args().next().unwrap_or_default()
        );
        let (name, inner) = (self.name.clone(), self.inner.clone());
        let host_end = format!("{}", self.host(HOST_END));
        ip_expect(&["link", "set", "dev", &name, "alias", &alias]);
        ip_expect(&["link", "set", "dev", &inner, "netns", &name]);
        ip_expect(&["address", "add", &format!("{host_end}/32"), "dev", &name]);
        ip_expect(&["link", "set", "dev", &name, "up"]);
        ip_expect(&[
            "route",
            "add",
            "unreachable",
            &self.subnet(),
            "proto",
            ROUTE_PROTOCOL,
        ]);
        self.route_added = true;
        for args in [
            &["link", "set", "dev", "lo", "up"][..],
            &["link", "set", "dev", &inner, "up"][..],
            &["route", "add", &host_end, "dev", &inner, "scope", "link"][..],
            &["route", "add", "default", "via", &host_end, "dev", &inner][..],
        ] {
            let mut inside = vec!["-n", name.as_str()];
            inside.extend_from_slice(args);
            ip_expect(&inside);
        }
    }

    /// The host link's name, `ktpod<N>`.
    pub fn link(&self) -> &str {
        &self.name
    }

    /// The network namespace's name, `ktpod<N>` (`ip netns exec <this> …`).
    pub fn namespace(&self) -> &str {
        &self.name
    }

    /// `10.213.<N>.0/24`.
    pub fn subnet(&self) -> String {
        format!("{}/24", self.host(0))
    }

    /// Adds the next free address inside the namespace, `10.213.<N>.<k>`, routes it from the
    /// host, and returns it: a pod's. Bind it from [`PodNet::inside`] (or a
    /// [`PodNet::command`]); anything on the machine dials it.
    ///
    /// # Panics
    ///
    /// When all addresses are in use, or `ip` fails.
    pub fn add_address(&self) -> IpAddr {
        self.add(Side::Pod)
    }

    /// Adds the next free address on the host end of the veth, in the test's own namespace:
    /// for a process that runs there at a pod-like address (a kactivator listening where
    /// `activator-service`'s endpoints say it is). Pods reach it too.
    ///
    /// # Panics
    ///
    /// When all addresses are in use, or `ip` fails.
    pub fn add_host_address(&self) -> IpAddr {
        self.add(Side::Host)
    }

    fn add(&self, side: Side) -> IpAddr {
        let mut hosts = self.hosts.lock().expect("no code panics while holding it");
        let host = (FIRST_HOST..=LAST_HOST)
            .find(|host| !hosts.iter().any(|(taken, _)| taken == host))
            .unwrap_or_else(|| panic!("{}: all addresses of {} in use", self.name, self.subnet()));
        let address = self.host(host);
        self.place("add", address, side);
        hosts.push((host, side));
        IpAddr::V4(address)
    }

    /// Removes an address [`PodNet::add_address`] or [`PodNet::add_host_address`] gave out:
    /// listeners bound to it stop receiving connections, and dialing it fails at once, as for
    /// a pod that is gone. Its host number is given out again later.
    ///
    /// # Panics
    ///
    /// When `address` is not one of this PodNet's, or `ip` fails.
    pub fn remove_address(&self, address: IpAddr) {
        let mut hosts = self.hosts.lock().expect("no code panics while holding it");
        let position = hosts
            .iter()
            .position(|&(host, _)| IpAddr::V4(self.host(host)) == address)
            .unwrap_or_else(|| panic!("{address} is not an address of {}", self.name));
        let IpAddr::V4(address) = address else {
            unreachable!("every address of a PodNet is IPv4")
        };
        self.place("del", address, hosts[position].1);
        hosts.swap_remove(position);
    }

    /// Adds a Service ClusterIP inside the namespace, `10.96.<N>.<k>` with `k` from 10 up, for
    /// a test that writes a Service with that `clusterIP` and listens on it itself (from
    /// [`PodNet::inside`]), as kube-proxy would forward it. (The apiserver picks ClusterIPs at
    /// random in 10.96.0.0/16 for Services that name none; a test sets its explicit ones before
    /// creating those.) It goes away with the PodNet.
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
            .unwrap_or_else(|| panic!("{}: no Service address left", self.name));
        let [a, b] = SERVICE_NETWORK_OCTETS;
        let address = Ipv4Addr::new(a, b, self.index, host);
        self.place("add", address, Side::Pod);
        *given += 1;
        IpAddr::V4(address)
    }

    /// `10.213.<N>.254`, which is never given out: dialing it fails at once ("No route to
    /// host").
    pub fn unassigned_address(&self) -> IpAddr {
        IpAddr::V4(self.host(UNASSIGNED_HOST))
    }

    /// Runs `f` on a thread of its own inside the namespace and returns what it returns.
    /// Sockets made there stay in the namespace, and so do threads spawned from there, so a
    /// backend started inside serves on pod addresses for as long as it runs:
    /// `net.inside(|| backend::spawn_on(SocketAddr::new(pod, 8012), config))`.
    ///
    /// # Panics
    ///
    /// When the namespace cannot be entered; a panic in `f` is passed on.
    pub fn inside<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|scope| {
            let entered = scope.spawn(|| {
                let namespace =
                    File::open(&path).unwrap_or_else(|error| panic!("opening {path}: {error}"));
                enter_network_namespace(&namespace)
                    .unwrap_or_else(|error| panic!("entering {path}: {error}"));
                f()
            });
            entered
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// `program` run inside the namespace (`ip netns exec ktpod<N> program`): for a pod that is
    /// a process of its own. Add its arguments and spawn it.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    /// Adds or deletes (`action`) `address`: inside the namespace with its route from the host,
    /// or on the host end.
    fn place(&self, action: &str, address: Ipv4Addr, side: Side) {
        let address = format!("{address}/32");
        match side {
            Side::Pod => {
                ip_expect(&[
                    "-n",
                    &self.name,
                    "address",
                    action,
                    &address,
                    "dev",
                    &self.inner,
                ]);
                let source = self.host(HOST_END).to_string();
                if action == "add" {
                    ip_expect(&[
                        "route",
                        "add",
                        &address,
                        "dev",
                        &self.name,
                        "src",
                        &source,
                        "proto",
                        ROUTE_PROTOCOL,
                    ]);
                } else {
                    ip_expect(&[
                        "route",
                        "del",
                        &address,
                        "dev",
                        &self.name,
                        "proto",
                        ROUTE_PROTOCOL,
                    ]);
                }
            }
            Side::Host => {
                ip_expect(&["address", action, &address, "dev", &self.name]);
            }
        }
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
        if !self.name.is_empty() {
            remove(self.index, &self.name, self.route_added);
        }
    }
}

/// `setns(2)` into the network namespace `namespace` (a `/run/netns/…` file) for the calling
/// thread only.
#[allow(unsafe_code)]
fn enter_network_namespace(namespace: &File) -> io::Result<()> {
    // SAFETY: `setns` takes a file descriptor, valid for the call since `namespace` is
    // borrowed, and a flag; it changes only the calling thread's network namespace and touches
    // no memory of ours.
    let result = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Deletes network `index`'s `unreachable` route (when `route` says it is ours), its namespace
/// and then its link, named `name` (the order in which a crash in between leaves the link,
/// which a later [`reclaim_orphans_once`] finds). Errors are reported, not raised: this runs
/// from Drop, also while a test unwinds.
fn remove(index: u8, name: &str, route: bool) {
    let [a, b] = POD_NETWORK_OCTETS;
    let subnet = format!("{a}.{b}.{index}.0/24");
    let mut steps: Vec<Vec<&str>> = Vec::new();
    if route {
        steps.push(vec![
            "route",
            "del",
            "unreachable",
            &subnet,
            "proto",
            ROUTE_PROTOCOL,
        ]);
    }
    steps.push(vec!["netns", "del", name]);
    steps.push(vec!["link", "del", "dev", name]);
    for args in steps {
        let output = ip(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Deleting the namespace takes the veth pair with it when nothing else holds it.
        let gone = stderr.contains("Cannot find device") || stderr.contains("No such file");
        if !output.status.success() && !gone {
            eprintln!("`ip {}` failed: {}", args.join(" "), stderr.trim());
        }
    }
}

/// Once per process: removes the PodNets (links, namespaces, routes) of processes that are
/// gone, and the bridges earlier versions of this module made.
fn reclaim_orphans_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let listed = ip_expect(&["-j", "link", "show"]);
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
            // Its route, if it is still there, is the dead owner's: only a PodNet's carries
            // the protocol, and no other PodNet has this /24 while the link is there.
            remove(index, name, route_exists(index));
        }
    });
}

/// Whether the `unreachable` route a PodNet adds for network `index` exists.
fn route_exists(index: u8) -> bool {
    let [a, b] = POD_NETWORK_OCTETS;
    let listed = ip(&[
        "-j",
        "route",
        "show",
        "type",
        "unreachable",
        "proto",
        ROUTE_PROTOCOL,
        &format!("{a}.{b}.{index}.0/24"),
    ]);
    let routes: Vec<serde_json::Value> = serde_json::from_slice(&listed.stdout).unwrap_or_default();
    !routes.is_empty()
}

/// Panics, naming the route or address, when the machine routes part of 10.213.0.0/16 or
/// 10.96.0.0/16 by something no PodNet made.
fn refuse_ranges_in_use() {
    // The two listings are taken at different instants, and other tests' PodNets come and go
    // in between; that does no harm, since each route and each address is judged by its own
    // mark, never by what the other listing holds.
    let routes = ip_expect(&["-j", "-4", "route", "show", "table", "all"]);
    let links = ip_expect(&["-j", "-4", "address", "show"]);
    let routes: Vec<serde_json::Value> = serde_json::from_slice(&routes.stdout).unwrap_or_default();
    let links: Vec<serde_json::Value> = serde_json::from_slice(&links.stdout).unwrap_or_default();
    if let Some(found) = foreign_routes(&routes, &links).first() {
        panic!(
            "this machine has {found}, which overlaps the test pod networks \
             ({}.{}.0.0/16 and {}.{}.0.0/16): PodNet refuses to start rather than shadow it",
            POD_NETWORK_OCTETS[0],
            POD_NETWORK_OCTETS[1],
            SERVICE_NETWORK_OCTETS[0],
            SERVICE_NETWORK_OCTETS[1]
        );
    }
}

/// What overlaps the PodNet ranges and no PodNet made, described: the routes of `routes`
/// (`ip -j -4 route show table all`) that do not carry [`ROUTE_PROTOCOL`], then the addresses
/// of `links` (`ip -j -4 address show`) on a link that is not a `ktpod<N>`. The kernel's own
/// routes (protocol `kernel`) are there because of an address, and the address is judged
/// instead: `ip` lists an address under the name its link had in the same listing, or not at
/// all once the link is gone, where a route's link may be shown as `if<index>`. Pure, for the
/// tests.
pub fn foreign_routes(routes: &[serde_json::Value], links: &[serde_json::Value]) -> Vec<String> {
    let mut foreign = Vec::new();
    for route in routes {
        let Some(dst) = route["dst"].as_str() else {
            continue;
        };
        if !prefix(dst).is_some_and(in_ranges) {
            continue;
        }
        let protocol = route["protocol"].as_str();
        if protocol == Some(ROUTE_PROTOCOL) || protocol == Some("kernel") {
            continue;
        }
        let mut described = dst.to_string();
        if let Some(kind) = route["type"].as_str() {
            described = format!("{kind} {described}");
        }
        if let Some(dev) = route["dev"].as_str() {
            described.push_str(&format!(" dev {dev}"));
        }
        foreign.push(format!("route {described}"));
    }
    for link in links {
        let name = link["ifname"].as_str().unwrap_or_default();
        if is_podnet_link(name) {
            continue;
        }
        let addresses = link["addr_info"].as_array().map(Vec::as_slice);
        for address in addresses.unwrap_or_default() {
            let (Some(local), Some(length)) =
                (address["local"].as_str(), address["prefixlen"].as_u64())
            else {
                continue;
            };
            if prefix(&format!("{local}/{length}")).is_some_and(in_ranges) {
                foreign.push(format!("address {local}/{length} on {name}"));
            }
        }
    }
    foreign
}

/// Whether `name` is a PodNet's link: `ktpod<N>`, or `ktpod<N>p` before it moves into the
/// namespace.
fn is_podnet_link(name: &str) -> bool {
    name.strip_prefix(LINK_PREFIX)
        .is_some_and(|rest| rest.trim_end_matches('p').parse::<u8>().is_ok())
}

/// Whether a prefix shares an address with 10.213.0.0/16 or 10.96.0.0/16.
fn in_ranges(network: (u32, u32)) -> bool {
    [POD_NETWORK_OCTETS, SERVICE_NETWORK_OCTETS]
        .into_iter()
        .any(|[a, b]| overlaps(network, (u32::from(Ipv4Addr::new(a, b, 0, 0)), 16)))
}

/// `a.b.c.d` or `a.b.c.d/n` as (network, length).
fn prefix(text: &str) -> Option<(u32, u32)> {
    let (address, length) = match text.split_once('/') {
        Some((address, length)) => (address, length.parse().ok()?),
        None => (text, 32),
    };
    let address: Ipv4Addr = address.parse().ok()?;
    (length <= 32).then_some((u32::from(address), length))
}

/// Whether two prefixes share an address.
fn overlaps((a, a_length): (u32, u32), (b, b_length): (u32, u32)) -> bool {
    let length = a_length.min(b_length);
    let mask = u32::MAX.checked_shl(32 - length).unwrap_or(0);
    a & mask == b & mask
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_routes_and_addresses_of_other_owners_in_the_ranges_are_foreign() {
        let routes = [
            json!({"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"}),
            json!({"dst": "192.0.2.0/24", "dev": "eth0", "protocol": "kernel"}),
            // A PodNet's routes, and the kernel's for the address on its link.
            json!({"type": "unreachable", "dst": "10.213.3.0/24", "protocol": "213"}),
            json!({"dst": "10.213.3.7", "dev": "ktpod3", "protocol": "213"}),
            json!({"dst": "10.96.3.10", "dev": "ktpod3", "protocol": "213"}),
            json!({"type": "local", "dst": "10.213.3.1", "dev": "ktpod3", "table": "local",
                   "protocol": "kernel"}),
            // A PodNet being torn down: its link was deleted while `ip` printed these, and its
            // address is gone from the address listing.
            json!({"type": "unreachable", "dst": "10.213.76.0/24", "protocol": "213"}),
            json!({"dst": "10.213.76.7", "dev": "if42", "protocol": "213"}),
            json!({"type": "local", "dst": "10.213.76.1", "dev": "if42", "table": "local",
                   "protocol": "kernel"}),
            // Other people's: added without the protocol, also through a link named like a
            // PodNet's, or the kernel's for an address on their link.
            json!({"type": "unreachable", "dst": "10.213.9.0/24"}),
            json!({"dst": "10.213.4.0/24", "dev": "ktpod4", "protocol": "static"}),
            json!({"dst": "10.0.0.0/8", "dev": "tun0"}),
            json!({"dst": "10.96.0.0/12", "dev": "kube-bridge", "protocol": "bird"}),
            json!({"type": "local", "dst": "10.213.0.5", "dev": "eth1", "table": "local",
                   "protocol": "kernel"}),
            json!({"dst": "10.212.0.0/16", "dev": "eth1"}),
            json!({"dst": "10.214.0.0/15", "dev": "eth1"}),
        ];
        let address = |local: &str, length: u32| json!({"local": local, "prefixlen": length});
        let links = [
            json!({"ifname": "lo", "addr_info": [address("127.0.0.1", 8)]}),
            json!({"ifname": "eth0", "addr_info": [address("192.0.2.2", 24)]}),
            json!({"ifname": "ktpod3",
                   "addr_info": [address("10.213.3.1", 32), address("10.213.3.2", 32)]}),
            json!({"ifname": "eth1",
                   "addr_info": [address("10.213.0.5", 24), address("10.212.0.5", 16)]}),
            json!({"ifname": "wg0", "addr_info": [address("10.0.0.1", 8)]}),
        ];
        assert_eq!(
            foreign_routes(&routes, &links),
            [
                "route unreachable 10.213.9.0/24",
                "route 10.213.4.0/24 dev ktpod4",
                "route 10.0.0.0/8 dev tun0",
                "route 10.96.0.0/12 dev kube-bridge",
                "address 10.213.0.5/24 on eth1",
                "address 10.0.0.1/8 on wg0",
            ]
        );
    }
}
