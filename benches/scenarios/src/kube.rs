//! What the scenarios against a real kube-apiserver share (`kube-scale` for the activator role,
//! `keda-scale`, `keda-load` and `queued-memory --keda` for the KEDA role): a panic of testkit's
//! [`ApiServer`] turned into an error, a `kubectl proxy` for cheap patches, objects created in
//! chunks by `kubectl create -f -` workers, pod addresses that nothing listens on, a window of
//! single-object changes under background churn, and kactivator's histogram
//! `kactivator_kubernetes_event_apply_seconds` read from `/metrics`; for the KEDA role, one
//! route's objects and the cluster its ServiceAccount watches.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kactivator_testkit::apiserver::ApiServer;
use kactivator_testkit::keda;

use crate::activator::{self, Activator};
use crate::fmt_us;

/// The histogram kactivator keeps of watch event → applied and sent to every shard.
pub const APPLY_HISTOGRAM: &str = "kactivator_kubernetes_event_apply_seconds";
/// The first pod address is 10.200.0.0; addresses count up from there.
const FIRST_POD_OCTET: u8 = 200;
/// How long the histogram may take to count every change made, once they are all made (in
/// keda-scale: to count one more); a control thread that takes longer per event than the
/// changes' pace works through a backlog.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `f`, turning a panic (the testkit panics with an explanation) into an error.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(no message)".into());
        format!("{what}: {message}")
    })
}

// === kubectl proxy ===

/// `kubectl proxy` as the admin: plain HTTP on loopback to the API server, so a patch costs one
/// request instead of starting a kubectl (~0.1 s of CPU each, too much at 20 patches a second
/// on two cores).
pub struct KubectlProxy {
    child: Child,
    addr: SocketAddr,
    /// Kept open: kubectl writes nothing more there, but a closed pipe would kill it if it did.
    _stdout: BufReader<ChildStdout>,
}

impl KubectlProxy {
    pub fn start(api: &ApiServer) -> Result<KubectlProxy, String> {
        let mut command = api.kubectl_command(api.admin_kubeconfig());
        command
            .args(["proxy", "--address=127.0.0.1", "--port=0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        die_with_parent(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| format!("starting kubectl proxy: {e}"))?;
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout was piped above"));
        // "Starting to serve on 127.0.0.1:40123"
        let mut line = String::new();
        let _ = stdout.read_line(&mut line);
        let addr = line
            .trim()
            .rsplit(' ')
            .next()
            .and_then(|addr| addr.parse::<SocketAddr>().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "kubectl proxy did not say where it serves: {line:?}"
            ));
        };
        Ok(KubectlProxy {
            child,
            addr,
            _stdout: stdout,
        })
    }

    /// One request with `Connection: close`: (status, body as text, chunked or not).
    fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &str,
    ) -> Result<(u16, String), String> {
        activator::request(
            self.addr,
            method,
            path,
            content_type,
            body,
            (Duration::from_secs(5), Duration::from_secs(30)),
        )
        .map_err(|e| format!("{method} {path} through kubectl proxy: {e}"))
    }

    /// Applies JSON patch `patch` to the object at API path `path`; an error unless 200.
    pub fn json_patch(&self, path: &str, patch: &str) -> Result<(), String> {
        match self.request("PATCH", path, "application/json-patch+json", patch)? {
            (200, _) => Ok(()),
            (status, body) => Err(format!("PATCH {path} answered {status}: {body:.300}")),
        }
    }
}

impl Drop for KubectlProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child gets SIGKILL when this process dies, so an interrupted run leaves no kubectl.
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which is
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

// === the objects ===

/// The `n`-th pod address: 10.200.0.0, 10.200.0.1, … (nothing listens there).
pub fn pod_ip(n: u64) -> Ipv4Addr {
    // Past 10.255.255.255 the second octet would wrap; 3.6 million addresses are far more
    // than a run makes (items × pods + changes + churn).
    assert!(
        n >> 16 <= u64::from(255 - FIRST_POD_OCTET),
        "pod address {n} out of range"
    );
    Ipv4Addr::new(
        10,
        FIRST_POD_OCTET + (n >> 16) as u8,
        (n >> 8) as u8,
        n as u8,
    )
}

/// What [`create`] is to make: `count` items (revisions, routes), each `objects_per_item`
/// objects in the YAML `yaml(index)` gives.
pub struct Batches<'a> {
    /// The progress lines' prefix, e.g. `kube-scale`.
    pub tag: &'a str,
    /// What an item is, plural: `revisions`, `routes`.
    pub noun: &'a str,
    pub count: usize,
    /// Items per `kubectl create -f -`.
    pub chunk: usize,
    /// `kubectl create` processes at once.
    pub workers: usize,
    pub objects_per_item: usize,
    pub yaml: &'a (dyn Fn(usize) -> String + Sync),
}

/// What [`create`] made.
pub struct Creation {
    /// Indices of the items whose objects all exist, sorted.
    pub items: Vec<usize>,
    pub objects: usize,
    pub elapsed: Duration,
    /// Set when creation stopped early: why, and that the run measures fewer items.
    pub fallback: Option<String>,
}

/// Creates every item's objects, `chunk` items per `kubectl create -f -`, with `workers` of
/// them at once, each chunk with a progress line (objects/s). A chunk that fails is tried again
/// with `kubectl apply` (idempotent, so objects already created are fine); when that fails too,
/// creation stops and the run goes on with the chunks that made it.
pub fn create(api: &ApiServer, batches: &Batches<'_>) -> Result<Creation, String> {
    let Batches {
        tag,
        noun,
        count,
        chunk,
        workers,
        objects_per_item,
        yaml,
    } = *batches;
    let chunks: Vec<(usize, usize)> = (0..count)
        .step_by(chunk.max(1))
        .map(|start| (start, (start + chunk.max(1)).min(count)))
        .collect();
    let total_objects = count * objects_per_item;
    let next = AtomicUsize::new(0);
    let objects_done = AtomicUsize::new(0);
    let done: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let started = Instant::now();
    let create_chunk = |(start, end): (usize, usize)| -> Result<(), String> {
        let text: String = (start..end).map(yaml).collect();
        let mut last = String::new();
        for verb in ["create", "apply"] {
            let output = api.try_kubectl_as(
                api.admin_kubeconfig(),
                [verb, "--validate=false", "-o", "name", "-f", "-"],
                Some(&text),
            );
            if output.status.success() {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&output.stderr);
            last = format!(
                "kubectl {verb} of {noun} {start}..{end} failed ({}): {}",
                output.status,
                stderr.lines().take(5).collect::<Vec<_>>().join(" | ")
            );
            eprintln!("[{tag}] {last}");
        }
        Err(last)
    };
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            scope.spawn(|| loop {
                if failure.lock().unwrap().is_some() {
                    return;
                }
                let Some(&(start, end)) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let chunk_started = Instant::now();
                match create_chunk((start, end)) {
                    Ok(()) => {
                        done.lock().unwrap().extend(start..end);
                        let objects = (end - start) * objects_per_item;
                        let so_far = objects_done.fetch_add(objects, Ordering::Relaxed) + objects;
                        let elapsed = started.elapsed().as_secs_f64();
                        eprintln!(
                            "[{tag}] created {so_far}/{total_objects} objects in {elapsed:.1} s: \
                             {:.0} objects/s overall, {:.0} objects/s for {noun} {start}..{end}",
                            so_far as f64 / elapsed,
                            objects as f64 / chunk_started.elapsed().as_secs_f64()
                        );
                    }
                    Err(error) => {
                        failure.lock().unwrap().get_or_insert(error);
                    }
                }
            });
        }
    });
    let elapsed = started.elapsed();
    let mut items = done.into_inner().unwrap();
    items.sort_unstable();
    let fallback = failure.into_inner().unwrap().map(|error| {
        format!(
            "the API server took {} of {count} {noun} before creation failed ({error}); the run \
             measures those",
            items.len(),
        )
    });
    if items.is_empty() {
        return Err(fallback.unwrap_or_else(|| format!("no {noun} to create")));
    }
    Ok(Creation {
        objects: items.len() * objects_per_item,
        items,
        elapsed,
        fallback,
    })
}

// === changes under churn ===

/// A small deterministic generator (xorshift64*): which object and which address to change.
pub struct Random(pub u64);

impl Random {
    pub fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % bound.max(1)
    }
}

/// A change to one item: `change(index, random)` changes item `index` (one watch event), and
/// may draw from `random` (which address).
pub type Change<'a> = &'a (dyn Fn(usize, &mut Random) -> Result<(), String> + Sync);

/// `changes` measured changes to random items of `measured`, one at a time, `gap` apart, while
/// a background thread makes `churn_per_second` changes to random items of `churned` (a pool
/// apart, so the two never change the same object).
pub struct ChangeWindow<'a> {
    /// The progress lines' prefix, e.g. `kube-scale io-uring`.
    pub tag: &'a str,
    pub changes: usize,
    pub gap: Duration,
    pub churn_per_second: f64,
    pub measured: &'a [usize],
    pub churned: &'a [usize],
    pub change: Change<'a>,
}

/// What a [`ChangeWindow`] did.
pub struct Changed {
    /// API round trips of the measured changes, µs, sorted.
    pub round_trips_us: Vec<u32>,
    /// Churn changes sent, failed, and the first failure.
    pub churned: u64,
    pub churn_failed: u64,
    pub churn_error: Option<String>,
    /// From the churn's start to its end (the whole window).
    pub seconds: f64,
}

impl Changed {
    /// Changes that went through: one watch event each.
    pub fn made(&self) -> u64 {
        self.round_trips_us.len() as u64 + self.churned - self.churn_failed
    }

    /// What the report says went short: fewer events counted (`counted`, the histogram's)
    /// than changes made, and churn patches that failed.
    pub fn shortfalls(&self, counted: f64) -> Vec<String> {
        let made = self.made();
        let mut notes = Vec::new();
        if counted != made as f64 {
            notes.push(format!(
                "the histogram counted {counted} events for {made} patches"
            ));
        }
        if self.churn_failed > 0 {
            notes.push(format!(
                "{} churn patches failed; the first: {}",
                self.churn_failed,
                self.churn_error.clone().unwrap_or_default()
            ));
        }
        notes
    }
}

impl ChangeWindow<'_> {
    /// Makes the changes; an error when a measured one fails.
    pub fn run(&self) -> Result<Changed, String> {
        let churn = Churn {
            pool: self.churned,
            per_second: self.churn_per_second,
            change: self.change,
            stop: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            first_error: Mutex::new(None),
        };
        let started = Instant::now();
        let round_trips = std::thread::scope(|scope| {
            let churner = scope.spawn(|| churn.run());
            let mut random = Random(0x9E37_79B9_7F4A_7C15);
            let mut round_trips = Vec::with_capacity(self.changes);
            let outcome = (|| -> Result<(), String> {
                for change in 0..self.changes {
                    let index = self.measured[random.below(self.measured.len())];
                    let sent = Instant::now();
                    (self.change)(index, &mut random)?;
                    round_trips.push(sent.elapsed().as_micros() as u32);
                    if (change + 1) % 50 == 0 {
                        eprintln!(
                            "[{}]: {} of {} changes made",
                            self.tag,
                            change + 1,
                            self.changes
                        );
                    }
                    std::thread::sleep(self.gap);
                }
                Ok(())
            })();
            churn.stop.store(true, Ordering::Relaxed);
            churner.join().expect("the churn thread does not panic");
            outcome.map(|()| round_trips)
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let mut round_trips_us = round_trips;
        round_trips_us.sort_unstable();
        Ok(Changed {
            round_trips_us,
            churned: churn.sent.into_inner(),
            churn_failed: churn.failed.into_inner(),
            churn_error: churn.first_error.into_inner().unwrap(),
            seconds,
        })
    }
}

/// Background changes: `per_second` of them to random items of `pool`.
struct Churn<'a> {
    pool: &'a [usize],
    per_second: f64,
    change: Change<'a>,
    stop: AtomicBool,
    sent: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Churn<'_> {
    /// Changes until [`Churn::stop`] is set.
    fn run(&self) {
        if self.pool.is_empty() || self.per_second <= 0.0 {
            return;
        }
        let interval = Duration::from_secs_f64(1.0 / self.per_second);
        let mut random = Random(0x2545_F491_4F6C_DD1D);
        let mut next = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if next > now {
                std::thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            // Behind (a slow patch): go on from now rather than catch up in a burst.
            next = next.max(now - interval) + interval;
            let index = self.pool[random.below(self.pool.len())];
            if let Err(error) = (self.change)(index, &mut random) {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.first_error.lock().unwrap().get_or_insert(error);
            }
            self.sent.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The apply histogram's observations since `before`, once they number `made` or
/// [`SETTLE_TIMEOUT`] has passed: every change is one watch event and one observation.
pub fn wait_counted(activator: &Activator, before: &Buckets, made: u64) -> Result<Buckets, String> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let applied = Buckets::parse(&activator.metrics()?, APPLY_HISTOGRAM)?.since(before)?;
        if applied.count() >= made as f64 || Instant::now() > deadline {
            return Ok(applied);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

// === the histogram ===

/// A Prometheus histogram's buckets: upper bounds (the last +Inf) and cumulative counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    bounds: Vec<f64>,
    pub cumulative: Vec<f64>,
    pub sum: f64,
}

impl Buckets {
    /// `name`'s buckets in a `/metrics` text (one series, no labels besides `le`).
    pub fn parse(metrics: &str, name: &str) -> Result<Buckets, String> {
        let bucket_prefix = format!("{name}_bucket{{le=\"");
        let mut pairs: Vec<(f64, f64)> = Vec::new();
        let mut sum = None;
        for line in metrics.lines() {
            if let Some(rest) = line.strip_prefix(&bucket_prefix) {
                let (le, count) = rest
                    .split_once("\"} ")
                    .ok_or_else(|| format!("unreadable bucket line {line:?}"))?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse()
                        .map_err(|_| format!("unreadable bound in {line:?}"))?
                };
                let count = count
                    .trim()
                    .parse()
                    .map_err(|_| format!("unreadable count in {line:?}"))?;
                pairs.push((le, count));
            } else if let Some(value) = line.strip_prefix(&format!("{name}_sum ")) {
                sum = value.trim().parse().ok();
            }
        }
        if pairs.last().is_none_or(|(le, _)| le.is_finite()) {
            return Err(format!("/metrics has no {name} histogram"));
        }
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Buckets {
            bounds: pairs.iter().map(|(le, _)| *le).collect(),
            cumulative: pairs.iter().map(|(_, count)| *count).collect(),
            sum: sum.unwrap_or(0.0),
        })
    }

    /// What was observed between `earlier` and `self`.
    pub fn since(&self, earlier: &Buckets) -> Result<Buckets, String> {
        if self.bounds != earlier.bounds {
            return Err("the histogram's buckets changed between two scrapes".into());
        }
        Ok(Buckets {
            bounds: self.bounds.clone(),
            cumulative: self
                .cumulative
                .iter()
                .zip(&earlier.cumulative)
                .map(|(now, before)| now - before)
                .collect(),
            sum: self.sum - earlier.sum,
        })
    }

    pub fn count(&self) -> f64 {
        self.cumulative.last().copied().unwrap_or(0.0)
    }

    /// The mean observation, `–` when there is none.
    pub fn describe_mean(&self) -> String {
        if self.count() > 0.0 {
            fmt_us((self.sum / self.count() * 1e6).round() as u64)
        } else {
            "–".into()
        }
    }

    /// Share of the observations at or below `bound`, which must be a bucket bound: exact.
    pub fn share_within(&self, bound: f64) -> Option<f64> {
        let index = self.bounds.iter().position(|le| *le == bound)?;
        (self.count() > 0.0).then(|| self.cumulative[index] / self.count())
    }

    /// The bucket that holds the `q` quantile's rank, and the rank; `None` when empty.
    fn rank(&self, q: f64) -> Option<(usize, f64)> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let index = self
            .cumulative
            .iter()
            .position(|count| *count >= rank)
            .unwrap_or(self.cumulative.len() - 1);
        Some((index, rank))
    }

    /// The `q` quantile (0..1) as Prometheus' `histogram_quantile` estimates it: linear
    /// interpolation inside the bucket that holds the rank, from the bucket below's bound (0
    /// for the first). In the +Inf bucket the answer is only "above the last finite bound".
    pub fn quantile(&self, q: f64) -> Quantile {
        let Some((index, rank)) = self.rank(q) else {
            return Quantile::Empty;
        };
        let upper = self.bounds[index];
        let (lower, below) = match index {
            0 => (0.0, 0.0),
            _ => (self.bounds[index - 1], self.cumulative[index - 1]),
        };
        if upper.is_infinite() {
            return Quantile::Above(lower);
        }
        let within = self.cumulative[index] - below;
        let fraction = if within > 0.0 {
            (rank - below) / within
        } else {
            1.0
        };
        Quantile::Seconds(lower + (upper - lower) * fraction)
    }

    /// The bucket that holds the `q` quantile's rank: (the bound below, its own bound), the
    /// bounds themselves rather than an interpolation inside them; `None` when empty.
    pub fn quantile_bucket(&self, q: f64) -> Option<(f64, f64)> {
        let (index, _) = self.rank(q)?;
        let lower = if index == 0 {
            0.0
        } else {
            self.bounds[index - 1]
        };
        Some((lower, self.bounds[index]))
    }
}

/// A bucket `(lower, upper]` as `250–500 µs`, `> 1.00 s`.
pub fn describe_bucket(bucket: Option<(f64, f64)>) -> String {
    let us = |seconds: f64| fmt_us((seconds * 1e6).round() as u64);
    match bucket {
        None => "–".into(),
        Some((lower, upper)) if upper.is_infinite() => format!("> {}", us(lower)),
        Some((lower, upper)) if lower <= 0.0 => format!("≤ {}", us(upper)),
        Some((lower, upper)) => {
            // One unit for both ends: `250–500 µs`, `2.50–5.00 ms`.
            let (lower, upper) = (us(lower), us(upper));
            match (lower.split_once(' '), upper.split_once(' ')) {
                (Some((low, unit_low)), Some((high, unit_high))) if unit_low == unit_high => {
                    format!("{low}–{high} {unit_high}")
                }
                _ => format!("{lower}–{upper}"),
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Quantile {
    Empty,
    Seconds(f64),
    /// In the +Inf bucket: above this many seconds.
    Above(f64),
}

impl Quantile {
    pub fn describe(self) -> String {
        match self {
            Quantile::Empty => "–".into(),
            Quantile::Seconds(seconds) => fmt_us((seconds * 1e6).round() as u64),
            Quantile::Above(seconds) => format!("> {}", fmt_us((seconds * 1e6) as u64)),
        }
    }
}

// === the KEDA role's cluster ===

/// The namespace `deploy/keda-http/` installs the role in.
pub const KEDA_NAMESPACE: &str = "keda";
/// The role's ServiceAccount, Role and bindings: what `kactivator keda-http` runs as.
const KEDA_RBAC_YAML: &str = include_str!("../../../deploy/keda-http/rbac.yaml");

/// Route `name` in `default`, as a user and the endpoint controller write it: Service `name`
/// (port 80 → `pod_port`), its EndpointSlice (`v1beta1`, the 1.20 server's) listing `ready`
/// ready at `pod_port`, and HTTPScaledObject `name` routing `host` to the Service, with
/// `annotations` (lines under `metadata.annotations`, indented four spaces). Three objects.
pub fn keda_route_yaml(
    name: &str,
    host: &str,
    ready: &[IpAddr],
    pod_port: u16,
    annotations: &str,
) -> String {
    [
        keda::service("default", name, 80, pod_port, None),
        keda::endpoint_slice("v1beta1", "default", name, ready, &[], pod_port),
        keda::HttpScaledObject {
            name,
            hosts: &[host],
            paths: &[],
            service: name,
            port: 80,
            annotations,
            extra: "",
        }
        .yaml(),
    ]
    .concat()
}

/// The API path of route `name`'s EndpointSlice (as [`keda_route_yaml`] names it).
pub fn keda_slice_path(name: &str) -> String {
    format!("/apis/discovery.k8s.io/v1beta1/namespaces/default/endpointslices/{name}-slice")
}

/// A kube-apiserver with the add-on's CRDs, namespace [`KEDA_NAMESPACE`] with
/// `deploy/keda-http/rbac.yaml` in it (what kustomize's `namespace: keda` does), as
/// `tests/keda_http.rs`'s cluster.
pub fn keda_api_server() -> Result<ApiServer, String> {
    guarded("a kube-apiserver with the KEDA HTTP add-on's CRDs", || {
        let api = ApiServer::start();
        api.install_keda_http_crds();
        api.apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {KEDA_NAMESPACE}\n"
        ));
        api.kubectl_with_input(["apply", "-n", KEDA_NAMESPACE, "-f", "-"], KEDA_RBAC_YAML);
        api
    })
}

/// A fresh token of the role's ServiceAccount (valid an hour) in a kubeconfig.
pub fn keda_role_kubeconfig(api: &ApiServer) -> Result<PathBuf, String> {
    guarded("a token for keda/keda-add-ons-http-interceptor", || {
        let token = api.service_account_token(KEDA_NAMESPACE, "keda-add-ons-http-interceptor");
        api.kubeconfig_with_token(&token)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# TYPE x histogram
kactivator_kubernetes_event_apply_seconds_bucket{le=\"0.0001\"} 50
kactivator_kubernetes_event_apply_seconds_bucket{le=\"0.001\"} 98
kactivator_kubernetes_event_apply_seconds_bucket{le=\"0.01\"} 100
kactivator_kubernetes_event_apply_seconds_bucket{le=\"+Inf\"} 100
kactivator_kubernetes_event_apply_seconds_sum 0.02
kactivator_kubernetes_event_apply_seconds_count 100
";

    #[test]
    fn quantiles_interpolate_inside_the_bucket_that_holds_the_rank() {
        let buckets = Buckets::parse(METRICS, APPLY_HISTOGRAM).unwrap();
        assert_eq!(buckets.count(), 100.0);
        // Rank 50 is the top of the first bucket: its bound.
        assert_eq!(buckets.quantile(0.5), Quantile::Seconds(0.0001));
        // Rank 25: halfway from 0 to 100 µs.
        assert_eq!(buckets.quantile(0.25), Quantile::Seconds(0.00005));
        // Rank 99: the first of the two in (1 ms, 10 ms], halfway.
        match buckets.quantile(0.99) {
            Quantile::Seconds(s) => assert!((s - 0.0055).abs() < 1e-9, "{s}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(buckets.share_within(0.001), Some(0.98));
        assert_eq!(buckets.describe_mean(), "200 µs");
    }

    #[test]
    fn the_bucket_that_holds_a_quantile() {
        let buckets = Buckets::parse(METRICS, APPLY_HISTOGRAM).unwrap();
        assert_eq!(buckets.quantile_bucket(0.5), Some((0.0, 0.0001)));
        assert_eq!(buckets.quantile_bucket(0.51), Some((0.0001, 0.001)));
        assert_eq!(buckets.quantile_bucket(0.99), Some((0.001, 0.01)));
        assert_eq!(describe_bucket(buckets.quantile_bucket(0.5)), "≤ 100 µs");
        assert_eq!(
            describe_bucket(buckets.quantile_bucket(0.51)),
            "100 µs–1.00 ms"
        );
        assert_eq!(describe_bucket(Some((0.0025, 0.005))), "2.50–5.00 ms");
        assert_eq!(describe_bucket(Some((0.00025, 0.0005))), "250–500 µs");
        assert_eq!(describe_bucket(Some((1.0, f64::INFINITY))), "> 1000.00 ms");
        let empty = buckets.since(&buckets).unwrap();
        assert_eq!(empty.quantile_bucket(0.5), None);
        assert_eq!(describe_bucket(None), "–");
    }

    #[test]
    fn differences_of_two_scrapes_and_the_infinite_bucket() {
        let before = Buckets::parse(METRICS, APPLY_HISTOGRAM).unwrap();
        let after = Buckets::parse(
            &METRICS
                .replace("} 100\n", "} 104\n")
                .replace("\"+Inf\"} 104", "\"+Inf\"} 110"),
            APPLY_HISTOGRAM,
        )
        .unwrap();
        let window = after.since(&before).unwrap();
        assert_eq!(window.cumulative, vec![0.0, 0.0, 4.0, 10.0]);
        assert_eq!(window.quantile(0.99), Quantile::Above(0.01));
        assert!(Buckets::parse("", APPLY_HISTOGRAM).is_err());
    }

    #[test]
    fn pod_addresses_count_up_from_10_200() {
        assert_eq!(pod_ip(0), Ipv4Addr::new(10, 200, 0, 0));
        assert_eq!(pod_ip(257), Ipv4Addr::new(10, 200, 1, 1));
        assert_eq!(pod_ip(100_000), Ipv4Addr::new(10, 201, 134, 160));
    }

    #[test]
    fn a_route_is_three_objects_and_its_slice_path() {
        let yaml = keda_route_yaml("r7", "r7.example.com", &[IpAddr::V4(pod_ip(1))], 8080, "");
        assert_eq!(yaml.matches("\n---\n").count(), 3, "{yaml}");
        assert!(yaml.contains("name: r7-slice"), "{yaml}");
        assert!(yaml.contains("hosts: [\"r7.example.com\"]"), "{yaml}");
        assert!(yaml.contains("10.200.0.1"), "{yaml}");
        assert_eq!(
            keda_slice_path("r7"),
            "/apis/discovery.k8s.io/v1beta1/namespaces/default/endpointslices/r7-slice"
        );
    }
}
