//! kactivator-scenarios: benchmark scenarios that drive the real kactivator binary and print a
//! markdown report. One subcommand per scenario; `benches/scenarios/run.sh` builds everything,
//! runs one or all of them and keeps the output. See `benches/scenarios/README.md`.
//!
//! Adding a scenario: a module with `Options` and `run(binary, &options) -> Result<(report,
//! passed), String>`, using [`activator`] (config file, start, metrics, memory, stop),
//! [`backends`] (pods with their own counters) and [`client`]; then a subcommand below.

mod activator;
mod backends;
mod chaos;
mod client;
mod cold_poke;
mod first_forward;
mod keda_load;
mod keda_scale;
mod kube;
mod kube_scale;
mod pod_scale;
mod priority;
mod queued_memory;
mod scarcity;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "kactivator-scenarios")]
struct Cli {
    /// The kactivator binary to measure.
    #[arg(long, env = "KACTIVATOR_BIN")]
    kactivator: PathBuf,
    /// Drivers to measure, each in its own kactivator process.
    #[arg(long, value_delimiter = ',', default_value = "io-uring,epoll")]
    drivers: Vec<String>,
    /// kactivator's `--shards`; default: kactivator's own (the CPUs it may use).
    #[arg(long)]
    shards: Option<usize>,
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// Soak: mixed load (keep-alive, connection per request, chunked bodies, websockets, a
    /// revision scaling to zero and back) while pods are killed and restarted, queue-proxy
    /// events flip them, and the config file and gates change. Prints requests sent, succeeded,
    /// failed by class, VmRSS through the run; passes when every failure was in flight on a pod
    /// that was killed and VmRSS stayed within ±10 % of its value after the warm-up.
    Chaos {
        /// Seconds of chaos (the load starts 5 s before it).
        #[arg(long, default_value_t = 600)]
        duration_seconds: u64,
        /// Seconds of chaos before the RSS baseline is taken; RSS must then stay within ±10 %.
        #[arg(long, default_value_t = 60)]
        warm_up_seconds: u64,
        /// Pods of the main revision (each a `kactivator-testbackend` process).
        #[arg(long, default_value_t = 4)]
        pods: usize,
        /// The `kactivator-testbackend` binary.
        #[arg(long, env = "KACTIVATOR_TESTBACKEND")]
        testbackend: PathBuf,
    },
    /// P pods × containerConcurrency, C clients through kactivator: throughput against P×CC ÷
    /// delay and against the backends alone, latency, and each pod's own max in flight.
    Scarcity {
        #[arg(long, default_value_t = 8)]
        pods: usize,
        #[arg(long, default_value_t = 1)]
        container_concurrency: u32,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Handler time of every request, in milliseconds.
        #[arg(long, default_value_t = 5)]
        delay_ms: u64,
        /// Seconds measured per row and round.
        #[arg(long, default_value_t = 10)]
        duration: u64,
        /// Seconds of load before each measured window.
        #[arg(long, default_value_t = 1)]
        warmup: u64,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// `exact` (thread per connection, nanosleep to the deadline: the handler takes the
        /// delay) or `testkit` (kactivator-testkit's `/delay`, tokio's 1 ms timer: ~6.2 ms).
        #[arg(long, default_value = "exact")]
        backend: backends::Kind,
    },
    /// Priority and fairness (issue 27): tenant B's wait behind tenant A's backlog, high-band
    /// requests against a low-band backlog (the order at the pod), and the CC=1 scarcity
    /// layout's throughput with the policy on ÷ off.
    Priority {
        /// Handler time of the fairness and priority pods, in milliseconds.
        #[arg(long, default_value_t = 20)]
        service_ms: u64,
        /// Requests waiting: tenant A's, the low band's.
        #[arg(long, default_value_t = 500)]
        backlog: usize,
        /// Requests arriving behind them: tenant B's (one at a time), the high band's (at once).
        #[arg(long, default_value_t = 10)]
        arrivals: usize,
        /// Milliseconds a first request holds the pod while the backlog connects.
        #[arg(long, default_value_t = 2000)]
        hold_ms: u64,
        /// The policy's `bands`.
        #[arg(long, default_value_t = 3)]
        bands: u32,
        /// Throughput rows: pods (each containerConcurrency 1).
        #[arg(long, default_value_t = 8)]
        pods: usize,
        /// Throughput rows: clients, one keep-alive connection each.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Throughput rows: handler time, in milliseconds.
        #[arg(long, default_value_t = 5)]
        delay_ms: u64,
        /// Throughput rows: `K-Tenant` keys the clients spread over.
        #[arg(long, default_value_t = 8)]
        tenants: usize,
        /// Throughput rows: seconds measured per row and round.
        #[arg(long, default_value_t = 10)]
        duration: u64,
        /// Throughput rows: seconds of load before each measured window.
        #[arg(long, default_value_t = 1)]
        warmup: u64,
        /// Throughput rounds (policy off and on in each, alternating which goes first); 0 skips
        /// the throughput figure.
        #[arg(long, default_value_t = 4)]
        rounds: usize,
    },
    /// A revision without pods, COUNT requests queued on their own connections: kactivator's
    /// VmRSS before and with all of them queued.
    QueuedMemory {
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        /// Memory is sampled after each of this many equal steps.
        #[arg(long, default_value_t = 4)]
        stages: u64,
        /// Connections per loopback source address (127.0.0.2, .3, ...).
        #[arg(long, default_value_t = 10_000)]
        per_source: u64,
        /// Extra `[proxy]` lines for the config, e.g. `--proxy 'max_queued_requests = 200000'`.
        #[arg(long, default_value = "")]
        proxy: String,
        /// The revision's queue_depth (default: COUNT + 1000).
        #[arg(long)]
        queue_depth: Option<u64>,
        /// Seconds allowed for the queue metric to reach each stage's count.
        #[arg(long, default_value_t = 120)]
        stage_timeout: u64,
        /// Run `kactivator keda-http` against a real kube-apiserver (KACTIVATOR_KUBE_APISERVER
        /// or the one scripts/kube-apiserver.sh builds) holding an HTTPScaledObject with no
        /// ready endpoint, instead of the activator with a revision from the file; COUNT is at
        /// most the route's queue (10 000).
        #[arg(long)]
        keda: bool,
    },
    /// KEDA's HTTP add-on role under load: requests per second and kactivator's CPU per request
    /// at each client count, against the activator role and the backend alone, one pod on a pod
    /// network behind a real kube-apiserver (KACTIVATOR_KUBE_APISERVER). Needs root (network
    /// namespaces).
    KedaLoad {
        /// Client counts, comma-separated; each client one keep-alive connection.
        #[arg(long, value_delimiter = ',', default_value = "1,64")]
        clients: Vec<usize>,
        /// Seconds measured per row and round.
        #[arg(long, default_value_t = 5)]
        duration: u64,
        /// Seconds of load before each measured window.
        #[arg(long, default_value_t = 1)]
        warmup: u64,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// A revision without a routable pod, one request queued, then the pod's queue-proxy
    /// registers `ready`: time from the registration's first byte to the pod reading the queued
    /// request, REPETITIONS times.
    RoutableFirstForward {
        #[arg(long, default_value_t = 1000)]
        repetitions: usize,
    },
    /// REVISIONS revisions without pods reporting to a test autoscaler: time from each one's
    /// first request to the autoscaler reading its poke.
    ColdPoke {
        #[arg(long, default_value_t = 1000)]
        revisions: usize,
    },
    /// A real kube-apiserver with REVISIONS revisions × PODS pods, kactivator watching it:
    /// object creation, initial sync time, RSS, and watch event → applied latency of CHANGES
    /// single-endpoint changes under background churn.
    KubeScale {
        #[arg(long, default_value_t = 10_000)]
        revisions: usize,
        /// Ready addresses in each revision's private Endpoints.
        #[arg(long, default_value_t = 10)]
        pods: usize,
        /// Single-endpoint changes measured, one at a time.
        #[arg(long, default_value_t = 200)]
        changes: usize,
        /// Patches per second to other revisions' Endpoints while the changes are made.
        #[arg(long, default_value_t = 20.0)]
        churn_per_second: f64,
        /// Revisions per `kubectl create -f -` (three objects each).
        #[arg(long, default_value_t = 250)]
        chunk: usize,
        /// `kubectl create` processes at once.
        #[arg(long, default_value_t = 2)]
        create_workers: usize,
        /// Milliseconds between two measured changes.
        #[arg(long, default_value_t = 50)]
        gap_ms: u64,
        /// Seconds kactivator may take from start to `/readyz` 200.
        #[arg(long, default_value_t = 600)]
        sync_timeout: u64,
    },
    /// KEDA's HTTP add-on role's control plane at scale: a real kube-apiserver
    /// (KACTIVATOR_KUBE_APISERVER) with ROUTES routes (Service, EndpointSlice with PODS ready
    /// endpoints, HTTPScaledObject) and `kactivator keda-http` watching it as its
    /// ServiceAccount: object creation, initial sync, RSS, watch event → applied latency of
    /// CHANGES single-endpoint changes under background churn, and kactivator's CPU per event.
    KedaScale {
        #[arg(long, default_value_t = 1000)]
        routes: usize,
        /// Ready endpoints in each route's EndpointSlice.
        #[arg(long, default_value_t = 10)]
        pods: usize,
        /// Single-endpoint changes measured, one at a time.
        #[arg(long, default_value_t = 200)]
        changes: usize,
        /// Patches per second to other routes' EndpointSlices while the changes are made.
        #[arg(long, default_value_t = 20.0)]
        churn_per_second: f64,
        /// Routes per `kubectl create -f -` (three objects each).
        #[arg(long, default_value_t = 250)]
        chunk: usize,
        /// `kubectl create` processes at once.
        #[arg(long, default_value_t = 2)]
        create_workers: usize,
        /// Milliseconds between two measured changes.
        #[arg(long, default_value_t = 50)]
        gap_ms: u64,
        /// Seconds kactivator may take from start to `/readyz` 200.
        #[arg(long, default_value_t = 600)]
        sync_timeout: u64,
        /// Seconds of idle CPU measured before the changes (set against their CPU).
        #[arg(long, default_value_t = 5)]
        idle: u64,
        /// Seconds the shards may stay busy after `/readyz` before the idle window and the
        /// changes start anyway.
        #[arg(long, default_value_t = 600)]
        quiet_timeout: u64,
    },
    /// REVISIONS × PODS pods from the file, each at its own loopback address, one listener
    /// answering their probes: load time, RSS, idle CPU and probes with quarantine on and off,
    /// registration → forwarded p50/p99, new pod → first probe.
    PodScale {
        /// Sizes to measure, in revisions.
        #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
        revisions: Vec<usize>,
        #[arg(long, default_value_t = 10)]
        pods: usize,
        #[arg(long, default_value_t = 200)]
        repetitions: usize,
        /// Seconds of the idle CPU window.
        #[arg(long, default_value_t = 20)]
        idle: u64,
        /// Seconds from `/readyz` to the idle window with quarantine on.
        #[arg(long, default_value_t = 35)]
        settle: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !cli.kactivator.is_file() {
        eprintln!(
            "kactivator-scenarios: --kactivator {} is not a file",
            cli.kactivator.display()
        );
        return ExitCode::from(2);
    }
    let outcome = match cli.scenario {
        Scenario::Chaos {
            duration_seconds,
            warm_up_seconds,
            pods,
            testbackend,
        } => chaos::run(
            &cli.kactivator,
            &chaos::Options {
                duration: Duration::from_secs(duration_seconds),
                warm_up: Duration::from_secs(warm_up_seconds),
                shards: cli.shards,
                driver: cli
                    .drivers
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "io-uring".into()),
                testbackend,
                pods,
            },
        ),
        Scenario::Scarcity {
            pods,
            container_concurrency,
            clients,
            delay_ms,
            duration,
            warmup,
            rounds,
            backend,
        } => scarcity::run(
            &cli.kactivator,
            &scarcity::Options {
                pods,
                container_concurrency,
                clients,
                delay_ms,
                warmup: Duration::from_secs(warmup),
                duration: Duration::from_secs(duration),
                rounds,
                backend,
                drivers: cli.drivers,
                shards: cli.shards,
            },
        ),
        Scenario::Priority {
            service_ms,
            backlog,
            arrivals,
            hold_ms,
            bands,
            pods,
            clients,
            delay_ms,
            tenants,
            duration,
            warmup,
            rounds,
        } => priority::run(
            &cli.kactivator,
            &priority::Options {
                service_ms,
                backlog,
                arrivals: arrivals.max(1),
                hold_ms,
                bands: bands.max(1),
                tenants: tenants.max(1),
                throughput: scarcity::Options {
                    pods: pods.max(1),
                    container_concurrency: 1,
                    clients: clients.max(1),
                    delay_ms,
                    warmup: Duration::from_secs(warmup),
                    duration: Duration::from_secs(duration.max(1)),
                    rounds,
                    backend: backends::Kind::Exact,
                    drivers: cli.drivers,
                    shards: cli.shards,
                },
            },
        ),
        Scenario::KedaLoad {
            clients,
            duration,
            warmup,
            rounds,
        } => keda_load::run(
            &cli.kactivator,
            &keda_load::Options {
                clients,
                warmup: Duration::from_secs(warmup),
                duration: Duration::from_secs(duration.max(1)),
                rounds: rounds.max(1),
                driver: cli
                    .drivers
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "io-uring".into()),
                shards: cli.shards,
            },
        ),
        Scenario::QueuedMemory {
            count,
            stages,
            per_source,
            proxy,
            queue_depth,
            stage_timeout,
            keda,
        } => queued_memory::run(
            &cli.kactivator,
            &queued_memory::Options {
                count,
                stages: stages.max(1),
                per_source,
                drivers: cli.drivers,
                shards: cli.shards,
                proxy,
                queue_depth,
                stage_timeout: Duration::from_secs(stage_timeout),
                settle: Duration::from_secs(1),
                keda,
            },
        ),
        Scenario::ColdPoke { revisions } => cold_poke::run(
            &cli.kactivator,
            &cold_poke::Options {
                revisions: revisions.max(1),
                drivers: cli.drivers,
                shards: cli.shards,
            },
        ),
        Scenario::KubeScale {
            revisions,
            pods,
            changes,
            churn_per_second,
            chunk,
            create_workers,
            gap_ms,
            sync_timeout,
        } => kube_scale::run(
            &cli.kactivator,
            &kube_scale::Options {
                revisions: revisions.max(1),
                pods: pods.max(1),
                changes,
                churn_per_second,
                chunk: chunk.max(1),
                create_workers: create_workers.max(1),
                gap: Duration::from_millis(gap_ms),
                sync_timeout: Duration::from_secs(sync_timeout),
                drivers: cli.drivers,
                shards: cli.shards,
            },
        ),
        Scenario::KedaScale {
            routes,
            pods,
            changes,
            churn_per_second,
            chunk,
            create_workers,
            gap_ms,
            sync_timeout,
            idle,
            quiet_timeout,
        } => keda_scale::run(
            &cli.kactivator,
            &keda_scale::Options {
                routes: routes.max(1),
                pods: pods.max(1),
                changes,
                churn_per_second,
                chunk: chunk.max(1),
                create_workers: create_workers.max(1),
                gap: Duration::from_millis(gap_ms),
                sync_timeout: Duration::from_secs(sync_timeout),
                idle: Duration::from_secs(idle.max(1)),
                quiet_timeout: Duration::from_secs(quiet_timeout),
                driver: cli
                    .drivers
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "io-uring".into()),
                // The deployment's two shards unless SCENARIO_ARGS say otherwise.
                shards: cli.shards.unwrap_or(2),
            },
        ),
        Scenario::PodScale {
            revisions,
            pods,
            repetitions,
            idle,
            settle,
        } => pod_scale::run(
            &cli.kactivator,
            &pod_scale::Options {
                revisions,
                pods: pods.max(1),
                repetitions: repetitions.max(1),
                idle: Duration::from_secs(idle.max(1)),
                settle: Duration::from_secs(settle),
                drivers: cli.drivers,
                shards: cli.shards,
            },
        ),
        Scenario::RoutableFirstForward { repetitions } => first_forward::run(
            &cli.kactivator,
            &first_forward::Options {
                repetitions: repetitions.max(1),
                drivers: cli.drivers,
                shards: cli.shards,
            },
        ),
    };
    match outcome {
        Ok((report, passed)) => {
            println!("{report}");
            if passed {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "kactivator-scenarios: the scenario's invariant did not hold (see the report)"
                );
                ExitCode::FAILURE
            }
        }
        Err(message) => {
            eprintln!("kactivator-scenarios: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A temporary directory for config files and logs, removed on drop.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(name: &str) -> Result<ScratchDir, String> {
        let dir =
            std::env::temp_dir().join(format!("kactivator-scenario-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(ScratchDir(dir))
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `p`-th percentile of the values (nearest rank, through `hdrhistogram`); 0 when empty.
pub fn percentile(sorted: &[u32], p: f64) -> u64 {
    // Three significant digits, as the load generator's: exact below 2 048, within 0.1 % above.
    let Ok(mut histogram) = hdrhistogram::Histogram::<u64>::new(3) else {
        return 0;
    };
    for &value in sorted {
        // `record`, not `saturating_record`: a fresh histogram tracks up to 2 047 and only
        // `record` resizes it; `saturating_record` clamps a larger value to the current top (2).
        // A u32 is always within what it can grow to.
        let _ = histogram.record(u64::from(value));
    }
    if histogram.is_empty() {
        return 0;
    }
    histogram.value_at_quantile(p / 100.0)
}

/// Median of the values; NaN when empty.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// KiB as `12.3 MiB`.
pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Microseconds as `850 µs` or `12.34 ms`.
pub fn fmt_us(us: u64) -> String {
    if us < 1000 {
        format!("{us} µs")
    } else {
        format!("{:.2} ms", us as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&values, 50.0), 50);
        assert_eq!(percentile(&values, 99.0), 99);
        assert_eq!(percentile(&values, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
        // Above 2 047 (the fresh histogram's range): within 0.1 %, not clamped.
        let large = [1500, 1800, 2100, 2500, 3000, 41_000, 4_000_000];
        let within = |got: u64, want: u64| got.abs_diff(want) * 1000 <= want;
        assert!(
            within(percentile(&large, 50.0), 2500),
            "{}",
            percentile(&large, 50.0)
        );
        assert!(
            within(percentile(&large, 80.0), 41_000),
            "{}",
            percentile(&large, 80.0)
        );
        assert!(
            within(percentile(&large, 100.0), 4_000_000),
            "{}",
            percentile(&large, 100.0)
        );
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![]).is_nan());
    }
}
