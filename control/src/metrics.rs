//! Prometheus text for `/metrics`: shard counters summed at scrape time, plus the control
//! plane's own registry; and the same sums as OTLP metrics for the queue-proxy's push
//! ([`queue_proxy_otlp`]).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use kactivator_api::RevisionKey;
use kactivator_shards::metrics::{
    AllShardStats, Counter, Histogram, RouteTag, ShardStats, LATENCY_BUCKETS_MS, PRIORITY_BANDS,
};
use kactivator_shards::routing::RevisionLabels;

use kactivator_api::trace::span::Attribute;
use kactivator_telemetry::metrics as otlp;
use prometheus::{Encoder, TextEncoder};

use crate::config::MetricsComponent;

/// A revision's priority counters summed over shards.
#[derive(Default)]
struct PriorityTotals {
    bands: [(u64, u64, u64); PRIORITY_BANDS],
    /// Per (shard, tenant): each shard ranks its own tenants, so a series is one shard's (a sum
    /// over shards would go down when one shard gives a tenant's series to another).
    tenants: BTreeMap<(usize, Box<str>), u64>,
    other_tenants: u64,
}

/// A histogram's sums over shards: a revision's latencies of one response code, or its waits.
#[derive(Default)]
struct HistogramTotals {
    count: u64,
    sum_us: u64,
    buckets: [u64; LATENCY_BUCKETS_MS.len() + 1],
}

impl HistogramTotals {
    fn add(&mut self, histogram: &Histogram) {
        self.add_counts(&histogram.count, &histogram.sum_us, &histogram.buckets);
    }

    /// Adds another sum (a route's codes over its revisions).
    fn add_totals(&mut self, other: &HistogramTotals) {
        self.count += other.count;
        self.sum_us += other.sum_us;
        for (sum, bucket) in self.buckets.iter_mut().zip(&other.buckets) {
            *sum += bucket;
        }
    }

    /// Adds one shard's histogram, given as its parts (a response code's slot keeps them
    /// beside its code).
    fn add_counts(&mut self, count: &Counter, sum_us: &Counter, buckets: &[Counter]) {
        self.count += count.get();
        self.sum_us += sum_us.get();
        for (sum, bucket) in self.buckets.iter_mut().zip(buckets) {
            *sum += bucket.get();
        }
    }
}

/// `kn.route.tag`'s values for a request without a named tag (disabled, default, undefined,
/// other).
const OTEL_RESERVED_TAGS: [&str; 4] = ["kn:disabled", "kn:default", "kn:undefined", "kn:other"];

/// A request's route tag as a label, its name resolved (each shard numbers its own names).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum TagLabel {
    /// No label: the activator role, and the queue-proxy's app-side series.
    #[default]
    None,
    Disabled,
    Default,
    Undefined,
    Other,
    Named(Box<str>),
}

impl TagLabel {
    fn of(tag: RouteTag, name: impl FnOnce(u8) -> Option<Box<str>>) -> TagLabel {
        match tag {
            RouteTag::None => TagLabel::None,
            RouteTag::Disabled => TagLabel::Disabled,
            RouteTag::Default => TagLabel::Default,
            RouteTag::Undefined => TagLabel::Undefined,
            RouteTag::Other => TagLabel::Other,
            RouteTag::Named(index) => name(index).map_or(TagLabel::Other, TagLabel::Named),
        }
    }

    /// Knative 1.18's `route_tag` label (`pkg/queue/request_metric.go`), or nothing.
    fn opencensus(&self) -> String {
        self.label("route_tag", ["DISABLED", "DEFAULT", "UNDEFINED", "OTHER"])
    }

    /// Knative 1.19+'s `kn.route.tag` attribute (`pkg/queue/routetag_handler.go`) in
    /// Prometheus form, or nothing.
    fn opentelemetry(&self) -> String {
        self.label("kn_route_tag", OTEL_RESERVED_TAGS)
    }

    /// The `kn.route.tag` attribute's value, or `None` without a tag.
    fn opentelemetry_value(&self) -> Option<&str> {
        self.value(OTEL_RESERVED_TAGS)
    }

    /// `,name="value"`, the value of a tag without a name taken from `reserved` (disabled,
    /// default, undefined, other); nothing without a tag.
    fn label(&self, name: &str, reserved: [&str; 4]) -> String {
        match self.value(reserved) {
            Some(value) => format!(",{name}=\"{}\"", escape(value)),
            None => String::new(),
        }
    }

    fn value<'a>(&'a self, reserved: [&'a str; 4]) -> Option<&'a str> {
        Some(match self {
            TagLabel::None => return None,
            TagLabel::Disabled => reserved[0],
            TagLabel::Default => reserved[1],
            TagLabel::Undefined => reserved[2],
            TagLabel::Other => reserved[3],
            TagLabel::Named(tag) => tag,
        })
    }
}

/// A revision's requests by response code and route tag.
type CodeTotals = BTreeMap<(u16, TagLabel), HistogramTotals>;

#[derive(Default)]
struct RevisionTotals {
    labels: RevisionLabels,
    /// By code, and in the queue-proxy role by route tag too.
    codes: CodeTotals,
    /// In the queue-proxy role: the requests that reached the user container, by code.
    app_codes: CodeTotals,
    /// Waits for a slot, and those that were cold starts (★ issue 27).
    slot_waits: HistogramTotals,
    cold_start_waits: HistogramTotals,
    /// Under a priority policy (★ issue 27): per band, (requests, queued, shed); per tenant
    /// with a series, requests; the rest's requests. `None` while no shard classified any.
    priority: Option<PriorityTotals>,
    /// Requests in flight in the activator now (queued included).
    in_flight: u64,
    queued: u64,
    /// Requests a full queue turned away.
    rejected: u64,
}

/// The control plane's registry of its own metrics, rendered after the shards' on `/metrics`;
/// named here so that the binary can hand it to a role's tasks without depending on the
/// `prometheus` crate itself.
pub type Registry = prometheus::Registry;

/// The autoscaler reporter's last concurrency of each revision (what upstream records in its
/// concurrency gauge at every report): written once a second by the reporter, read by scrapes.
pub type ReportedConcurrency = Arc<Mutex<BTreeMap<RevisionKey, f64>>>;

/// What the request metrics are rendered from besides the shard counters.
#[derive(Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    pub names: crate::config::MetricNames,
    /// Whose request metrics: the activator's or a queue-proxy's names.
    pub component: crate::config::MetricsComponent,
    /// `Some` when a reporter runs: the concurrency gauges show its per-second averages, as
    /// upstream's do. `None`: they show the requests in flight at the scrape.
    pub reported_concurrency: Option<&'a ReportedConcurrency>,
}

/// Adds `metric` to the control plane's registry and hands it back. A name registered twice
/// only happens in tests that share a registry; the second registration is ignored there.
pub(crate) fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &prometheus::Registry,
    metric: C,
) -> C {
    let _ = registry.register(Box::new(metric.clone()));
    metric
}

/// Renders every metric. `pod_name` is this activator's pod (a Knative label).
pub fn render(
    stats: &AllShardStats,
    pod_name: &str,
    registry: &prometheus::Registry,
    options: RenderOptions<'_>,
) -> String {
    let mut out = String::with_capacity(8 * 1024);
    let revisions = revision_totals(stats);
    let reported = options.reported_concurrency.map(|reported| {
        reported
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    });
    let concurrency = |totals: &RevisionTotals| -> f64 {
        match &reported {
            Some(reported) => RevisionKey::new(&totals.labels.namespace, &totals.labels.revision)
                .ok()
                .and_then(|key| reported.get(&key).copied())
                .unwrap_or(0.0),
            None => totals.in_flight as f64,
        }
    };
    match options.component {
        MetricsComponent::Activator => {
            if options.names.opencensus() {
                render_requests(&mut out, &revisions, pod_name, &concurrency);
                render_waits(
                    &mut out,
                    &revisions,
                    &|totals| base_labels(&totals.labels, pod_name),
                    WAIT_NAMES_OPENCENSUS,
                );
            }
            if options.names.opentelemetry() {
                render_requests_otel(&mut out, &revisions, &concurrency);
                render_waits(
                    &mut out,
                    &revisions,
                    &|totals| otel_revision_labels(&totals.labels),
                    WAIT_NAMES_OPENTELEMETRY,
                );
            }
        }
        MetricsComponent::QueueProxy { queue_depth } => {
            if options.names.opencensus() {
                render_queue_proxy(&mut out, &revisions, pod_name, queue_depth);
            }
            if options.names.opentelemetry() {
                render_queue_proxy_otel(&mut out, &revisions, queue_depth);
            }
        }
        MetricsComponent::Interceptor => render_interceptor(&mut out, &revisions),
    }
    render_queued(&mut out, &revisions, pod_name);
    render_priority(&mut out, &revisions, pod_name);
    render_shards(&mut out, stats);
    let mut buffer = Vec::new();
    if TextEncoder::new()
        .encode(&registry.gather(), &mut buffer)
        .is_ok()
    {
        out.push_str(&String::from_utf8_lossy(&buffer));
    }
    out
}

/// Every revision's counters summed over the shards.
fn revision_totals(stats: &AllShardStats) -> BTreeMap<(String, String), RevisionTotals> {
    let mut revisions: BTreeMap<(String, String), RevisionTotals> = BTreeMap::new();
    for shard in stats.iter() {
        for block in shard.revisions() {
            let key = (
                block.labels.namespace.clone(),
                block.labels.revision.clone(),
            );
            let totals = revisions.entry(key).or_default();
            totals.labels = block.labels.clone();
            totals.in_flight += block.load.in_flight();
            totals.queued += block.queued.get();
            totals.rejected += block.rejected.get();
            if let Some(waits) = block.waits() {
                totals.slot_waits.add(&waits.slot);
                totals.cold_start_waits.add(&waits.cold_start);
            }
            if let Some(priority) = block.priority() {
                let sums = totals.priority.get_or_insert_default();
                for (sum, band) in sums.bands.iter_mut().zip(&priority.bands) {
                    sum.0 += band.requests.get();
                    sum.1 += band.queued.get();
                    sum.2 += band.shed.get();
                }
                for (tenant, requests) in priority.tenants() {
                    *sums.tenants.entry((shard.index, tenant)).or_default() += requests;
                }
                sums.other_tenants += priority.other_tenants.get();
            }
            for (table, sums) in [
                (&block.requests, &mut totals.codes),
                (&block.app, &mut totals.app_codes),
            ] {
                for slot in table.slots() {
                    let code = slot.code();
                    if code == 0 {
                        continue;
                    }
                    let tag = TagLabel::of(slot.route_tag(), |index| block.route_tags.name(index));
                    sums.entry((code, tag)).or_default().add_counts(
                        &slot.count,
                        &slot.latency_sum_us,
                        &slot.buckets,
                    );
                }
            }
        }
    }
    revisions
}

fn render_queued(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    pod_name: &str,
) {
    out.push_str(
        "# HELP kactivator_revision_queued Requests waiting in the activator for a pod slot.\n",
    );
    out.push_str("# TYPE kactivator_revision_queued gauge\n");
    for totals in revisions.values() {
        let labels = base_labels(&totals.labels, pod_name);
        let _ = writeln!(
            out,
            "kactivator_revision_queued{{{labels}}} {}",
            totals.queued
        );
    }
}

/// KEDA's HTTP add-on's interceptor's request metrics (`interceptor/metrics/instruments.go` at
/// v0.15.0, as its Prometheus exporter names them): per route (a failover's requests under the
/// route's name, as the add-on counts them), the requests by response code, their durations, and
/// the requests held or in flight now. Differences: no `method` label (kactivator counts by code,
/// not by method), the durations in kactivator's buckets (Knative's, in seconds) rather than
/// OpenTelemetry's, and requests no route matched are not in them (`kactivator_shard_*` counts
/// them).
fn render_interceptor(out: &mut String, revisions: &BTreeMap<(String, String), RevisionTotals>) {
    use crate::keda::model::FAILOVER_SUFFIX;
    #[derive(Default)]
    struct Route {
        in_flight: u64,
        rejected: u64,
        codes: BTreeMap<u16, HistogramTotals>,
    }
    let mut routes: BTreeMap<(&str, &str), Route> = BTreeMap::new();
    for totals in revisions.values() {
        let revision = totals.labels.revision.as_str();
        let name = revision.strip_suffix(FAILOVER_SUFFIX).unwrap_or(revision);
        let route = routes
            .entry((totals.labels.namespace.as_str(), name))
            .or_default();
        route.in_flight += totals.in_flight;
        route.rejected += totals.rejected;
        for ((code, _), code_totals) in &totals.codes {
            route
                .codes
                .entry(*code)
                .or_default()
                .add_totals(code_totals);
        }
    }
    let labels = |(namespace, name): &(&str, &str)| {
        format!(
            "route_name=\"{}\",route_namespace=\"{}\"",
            escape(name),
            escape(namespace)
        )
    };
    out.push_str("# HELP interceptor_request_concurrency Concurrent requests at the interceptor proxy\n# TYPE interceptor_request_concurrency gauge\n");
    for (route, totals) in &routes {
        let _ = writeln!(
            out,
            "interceptor_request_concurrency{{{}}} {}",
            labels(route),
            totals.in_flight
        );
    }
    out.push_str("# HELP interceptor_request_count_total Total requests processed by the interceptor proxy\n# TYPE interceptor_request_count_total counter\n");
    for (route, totals) in &routes {
        for (code, histogram) in &totals.codes {
            let _ = writeln!(
                out,
                "interceptor_request_count_total{{code=\"{code}\",{}}} {}",
                labels(route),
                histogram.count
            );
        }
    }
    // 0.16's: a request beyond the route's cold-start cap (ours: turned away by its full queue).
    out.push_str("# HELP interceptor_cold_start_rejections_total Requests rejected because the route's pending request limit was reached\n# TYPE interceptor_cold_start_rejections_total counter\n");
    for (route, totals) in &routes {
        let _ = writeln!(
            out,
            "interceptor_cold_start_rejections_total{{{}}} {}",
            labels(route),
            totals.rejected
        );
    }
    out.push_str("# HELP interceptor_request_duration_seconds Time from request received to response written\n# TYPE interceptor_request_duration_seconds histogram\n");
    for (route, totals) in &routes {
        for (code, histogram) in &totals.codes {
            let labels = format!("code=\"{code}\",{}", labels(route));
            write_histogram(
                out,
                "interceptor_request_duration_seconds",
                &labels,
                histogram,
                true,
            );
        }
    }
}

/// Knative 1.18's OpenCensus request metrics.
fn render_requests(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    pod_name: &str,
    concurrency: &dyn Fn(&RevisionTotals) -> f64,
) {
    out.push_str(
        "# HELP activator_request_concurrency Concurrent requests that are routed to Activator\n",
    );
    out.push_str("# TYPE activator_request_concurrency gauge\n");
    for totals in revisions.values() {
        let _ = writeln!(
            out,
            "activator_request_concurrency{{{}}} {}",
            base_labels(&totals.labels, pod_name),
            concurrency(totals)
        );
    }
    out.push_str(
        "# HELP activator_request_count The number of requests that are routed to Activator\n",
    );
    out.push_str("# TYPE activator_request_count counter\n");
    for totals in revisions.values() {
        for ((code, _), code_totals) in &totals.codes {
            let _ = writeln!(
                out,
                "activator_request_count{{{}}} {}",
                code_labels(&totals.labels, pod_name, *code),
                code_totals.count
            );
        }
    }
    out.push_str("# HELP activator_request_latencies The response time in millisecond\n");
    out.push_str("# TYPE activator_request_latencies histogram\n");
    for totals in revisions.values() {
        for ((code, _), code_totals) in &totals.codes {
            let labels = code_labels(&totals.labels, pod_name, *code);
            write_histogram(
                out,
                "activator_request_latencies",
                &labels,
                code_totals,
                false,
            );
        }
    }
}

/// Knative 1.18's queue-proxy request metrics (`pkg/queue/request_metric.go`, component
/// `revision`): the requests the queue-proxy received and those that reached the user container
/// (`app_`), by response code, and the requests in it (waiting or at the app) when it has a
/// breaker.
fn render_queue_proxy(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    pod_name: &str,
    queue_depth: bool,
) {
    type Codes = fn(&RevisionTotals) -> &CodeTotals;
    let sets: [(&str, &str, &str, Codes); 2] = [
        (
            "revision_request_count",
            "revision_request_latencies",
            "The number of requests that are routed to queue-proxy",
            |totals| &totals.codes,
        ),
        (
            "revision_app_request_count",
            "revision_app_request_latencies",
            "The number of requests that are routed to user-container",
            |totals| &totals.app_codes,
        ),
    ];
    for (count, latencies, help, codes) in sets {
        let _ = writeln!(out, "# HELP {count} {help}\n# TYPE {count} counter");
        for totals in revisions.values() {
            for ((code, tag), code_totals) in codes(totals) {
                let _ = writeln!(
                    out,
                    "{count}{{{}{}}} {}",
                    queue_proxy_code_labels(&totals.labels, pod_name, *code),
                    tag.opencensus(),
                    code_totals.count
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP {latencies} The response time in millisecond\n# TYPE {latencies} histogram"
        );
        for totals in revisions.values() {
            for ((code, tag), code_totals) in codes(totals) {
                let labels =
                    queue_proxy_code_labels(&totals.labels, pod_name, *code) + &tag.opencensus();
                write_histogram(out, latencies, &labels, code_totals, false);
            }
        }
    }
    if queue_depth {
        out.push_str("# HELP revision_queue_depth The number of items queued at this queue proxy.\n# TYPE revision_queue_depth gauge\n");
        for totals in revisions.values() {
            let _ = writeln!(
                out,
                "revision_queue_depth{{{}}} {}",
                queue_proxy_labels(&totals.labels, pod_name),
                totals.in_flight
            );
        }
    }
}

// === Knative 1.19+'s OpenTelemetry instruments: one description, two renderings ===

/// An OpenTelemetry duration histogram upstream records per response code, and which of a
/// revision's code tables it reads. Both `/metrics` ([`render_otel_code_histograms`]) and the
/// OTLP push ([`queue_proxy_otlp`]) read these, from the same totals.
struct OtelHistogram {
    /// The instrument's name (OTLP).
    name: &'static str,
    /// The name upstream's Prometheus exporter gives it: dots to underscores, `_seconds`.
    prometheus: &'static str,
    description: &'static str,
    codes: fn(&RevisionTotals) -> &CodeTotals,
}

/// otelhttp's server duration: every request the queue-proxy (or activator) answered
/// (`http.server.request.duration`, unit `s`).
const SERVER_DURATION: OtelHistogram = OtelHistogram {
    name: "http.server.request.duration",
    prometheus: "http_server_request_duration_seconds",
    description: "Duration of HTTP server requests.",
    codes: |totals| &totals.codes,
};

/// The queue-proxy's requests that reached the user container (`pkg/queue/request_metric.go`,
/// unit `s`).
const INVOCATION_DURATION: OtelHistogram = OtelHistogram {
    name: "kn.serving.invocation.duration",
    prometheus: "kn_serving_invocation_duration_seconds",
    description: "The duration of task execution",
    codes: |totals| &totals.app_codes,
};

/// The queue-proxy's requests in it, waiting or at the app, with a breaker
/// (`pkg/queue/request_metric.go`, an `Int64Gauge`).
const QUEUE_DEPTH: (&str, &str, &str, &str) = (
    "kn.serving.queue.depth",
    "kn_serving_queue_depth",
    "Number of current requests in the queue",
    "{request}",
);

/// [`LATENCY_BUCKETS_MS`] in seconds: the bounds of every OpenTelemetry duration histogram,
/// the same numbers `/metrics` writes in its `le` labels.
const LATENCY_BOUNDS_SECONDS: [f64; LATENCY_BUCKETS_MS.len()] = {
    let mut bounds = [0.0; LATENCY_BUCKETS_MS.len()];
    let mut i = 0;
    while i < bounds.len() {
        bounds[i] = LATENCY_BUCKETS_MS[i] as f64 / 1000.0;
        i += 1;
    }
    bounds
};

/// Knative 1.19+'s queue-proxy metrics as its Prometheus exporter names them: the server
/// duration of the `queue` handler and, with a breaker, the queue depth.
fn render_queue_proxy_otel(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    queue_depth: bool,
) {
    if queue_depth {
        let (_, name, help, _) = QUEUE_DEPTH;
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for totals in revisions.values() {
            let _ = writeln!(
                out,
                "{name}{{{}}} {}",
                otel_labels(&totals.labels),
                totals.in_flight
            );
        }
    }
    render_otel_code_histograms(out, revisions, &SERVER_DURATION);
    render_otel_code_histograms(out, revisions, &INVOCATION_DURATION);
}

/// The same metrics as [`render_queue_proxy_otel`], for the OTLP push: read from the shards'
/// counters now, summed per revision as a scrape sums them. The revision's names are the
/// push's resource (one revision per queue-proxy), so a point carries only what upstream's
/// instruments add: the response code and, on the server duration, the route tag. A histogram
/// nothing was recorded in yet is left out, as OpenTelemetry's SDK leaves it out.
pub fn queue_proxy_otlp(stats: &AllShardStats, queue_depth: bool) -> Vec<otlp::Metric> {
    let revisions = revision_totals(stats);
    let mut metrics = Vec::with_capacity(3);
    if queue_depth {
        let (name, _, description, unit) = QUEUE_DEPTH;
        metrics.push(otlp::Metric {
            name,
            description,
            unit,
            data: otlp::MetricData::Gauge(
                revisions
                    .values()
                    .map(|totals| otlp::GaugePoint {
                        attributes: Vec::new(),
                        value: i64::try_from(totals.in_flight).unwrap_or(i64::MAX),
                    })
                    .collect(),
            ),
        });
    }
    for histogram in [&SERVER_DURATION, &INVOCATION_DURATION] {
        let points: Vec<_> = revisions
            .values()
            .flat_map(|totals| (histogram.codes)(totals))
            .map(|((code, tag), totals)| {
                let mut attributes = vec![Attribute::int(
                    "http.response.status_code",
                    i64::from(*code),
                )];
                if let Some(tag) = tag.opentelemetry_value() {
                    attributes.push(Attribute::str("kn.route.tag", tag.to_owned()));
                }
                otlp::HistogramPoint {
                    attributes,
                    sum: totals.sum_us as f64 / 1_000_000.0,
                    bounds: &LATENCY_BOUNDS_SECONDS,
                    bucket_counts: totals.buckets.to_vec(),
                }
            })
            .collect();
        if !points.is_empty() {
            metrics.push(otlp::Metric {
                name: histogram.name,
                description: histogram.description,
                unit: "s",
                data: otlp::MetricData::Histogram(points),
            });
        }
    }
    metrics
}

/// Knative 1.19+'s OpenTelemetry request metrics, named as its Prometheus exporter names them:
/// dots become underscores, a unit in braces is dropped, seconds add `_seconds`.
fn render_requests_otel(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    concurrency: &dyn Fn(&RevisionTotals) -> f64,
) {
    out.push_str("# HELP kn_revision_request_concurrency Concurrent requests that are routed to Activator\n# TYPE kn_revision_request_concurrency gauge\n");
    for totals in revisions.values() {
        let _ = writeln!(
            out,
            "kn_revision_request_concurrency{{{}}} {}",
            otel_labels(&totals.labels),
            concurrency(totals)
        );
    }
    out.push_str("# HELP kn_revision_request_queued Number of requests currently queued in the activator waiting for capacity\n# TYPE kn_revision_request_queued gauge\n");
    for totals in revisions.values() {
        let _ = writeln!(
            out,
            "kn_revision_request_queued{{{}}} {}",
            otel_revision_labels(&totals.labels),
            totals.queued
        );
    }
    out.push_str("# HELP kn_revision_request_active Number of requests currently being proxied by the activator\n# TYPE kn_revision_request_active gauge\n");
    for totals in revisions.values() {
        let _ = writeln!(
            out,
            "kn_revision_request_active{{{}}} {}",
            otel_revision_labels(&totals.labels),
            totals.in_flight.saturating_sub(totals.queued)
        );
    }
    render_otel_code_histograms(out, revisions, &SERVER_DURATION);
}

/// An OpenTelemetry duration histogram (seconds) per revision and response code, as upstream's
/// Prometheus exporter names it.
fn render_otel_code_histograms(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    histogram: &OtelHistogram,
) {
    let (name, help) = (histogram.prometheus, histogram.description);
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for totals in revisions.values() {
        for ((code, tag), code_totals) in (histogram.codes)(totals) {
            let labels = format!(
                "{},http_response_status_code=\"{code}\"{}",
                otel_labels(&totals.labels),
                tag.opentelemetry()
            );
            write_histogram(out, name, &labels, code_totals, true);
        }
    }
}

/// The wait histograms' names in one metric name set, and their unit.
struct WaitNames {
    slot: &'static str,
    cold_start: &'static str,
    /// Seconds (OpenTelemetry's convention) rather than milliseconds (1.18's).
    seconds: bool,
}

/// ★ Ours (upstream has no wait metric), in the style of 1.18's names.
const WAIT_NAMES_OPENCENSUS: WaitNames = WaitNames {
    slot: "activator_request_wait_latencies",
    cold_start: "activator_cold_start_wait_latencies",
    seconds: false,
};
/// ★ Ours, in the style of 1.19+'s OpenTelemetry names as its Prometheus exporter writes them.
const WAIT_NAMES_OPENTELEMETRY: WaitNames = WaitNames {
    slot: "kn_revision_request_wait_duration_seconds",
    cold_start: "kn_revision_cold_start_wait_duration_seconds",
    seconds: true,
};

/// ★ Per band and per tenant, for revisions with a priority policy (issue 27). Bands show once
/// they saw a request; tenants are the heaviest `metrics::TENANT_SERIES` of each shard
/// (`kactivator_shards::metrics::tenants`), with a `shard` label.
fn render_priority(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    pod_name: &str,
) {
    let with_policy: Vec<(String, &PriorityTotals)> = revisions
        .values()
        .filter_map(|totals| {
            let priority = totals.priority.as_ref()?;
            Some((base_labels(&totals.labels, pod_name), priority))
        })
        .collect();
    if with_policy.is_empty() {
        return;
    }
    type BandOf = fn(&(u64, u64, u64)) -> u64;
    let per_band: [(&str, &str, &str, BandOf); 3] = [
        (
            "kactivator_priority_requests_total",
            "counter",
            "Requests per priority band.",
            |band| band.0,
        ),
        (
            "kactivator_priority_queued",
            "gauge",
            "Requests per priority band waiting for a pod slot.",
            |band| band.1,
        ),
        (
            "kactivator_priority_shed_total",
            "counter",
            "Waiters per priority band that lost their place to a higher band (answered 503).",
            |band| band.2,
        ),
    ];
    for (name, kind, help, value) in per_band {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, priority) in &with_policy {
            for (band, sums) in priority.bands.iter().enumerate() {
                if sums.0 == 0 {
                    continue;
                }
                let _ = writeln!(out, "{name}{{{labels},band=\"{band}\"}} {}", value(sums));
            }
        }
    }
    out.push_str("# HELP kactivator_priority_tenant_requests_total Requests per fairness key (tenant; empty: no key) on one shard, for the heaviest keys of each shard, counted since the key took its series.\n# TYPE kactivator_priority_tenant_requests_total counter\n");
    for (labels, priority) in &with_policy {
        for ((shard, tenant), requests) in &priority.tenants {
            let _ = writeln!(
                out,
                "kactivator_priority_tenant_requests_total{{{labels},tenant=\"{}\",shard=\"{shard}\"}} {requests}",
                escape(tenant)
            );
        }
    }
    out.push_str("# HELP kactivator_priority_other_tenants_requests_total Requests of fairness keys without a series of their own.\n# TYPE kactivator_priority_other_tenants_requests_total counter\n");
    for (labels, priority) in &with_policy {
        let _ = writeln!(
            out,
            "kactivator_priority_other_tenants_requests_total{{{labels}}} {}",
            priority.other_tenants
        );
    }
}

/// Which of a revision's histograms a metric shows.
type HistogramOf = fn(&RevisionTotals) -> &HistogramTotals;

/// ★ How long requests waited in the activator for a slot, and for a cold start (a wait that
/// began with no routable pod), per revision. Only revisions that saw a wait have a series.
fn render_waits(
    out: &mut String,
    revisions: &BTreeMap<(String, String), RevisionTotals>,
    labels: &dyn Fn(&RevisionTotals) -> String,
    names: WaitNames,
) {
    let unit = if names.seconds {
        "seconds"
    } else {
        "milliseconds"
    };
    let metrics: [(&str, &str, HistogramOf); 2] = [
        (names.slot, "Time requests waited in the activator for a pod slot", |t| {
            &t.slot_waits
        }),
        (
            names.cold_start,
            "Time requests waited in the activator for a revision with no routable pod (cold starts)",
            |t| &t.cold_start_waits,
        ),
    ];
    for (name, help, histogram_of) in metrics {
        let _ = writeln!(
            out,
            "# HELP {name} {help}, in {unit}.\n# TYPE {name} histogram"
        );
        for totals in revisions.values() {
            let histogram = histogram_of(totals);
            if histogram.count == 0 {
                continue;
            }
            write_histogram(out, name, &labels(totals), histogram, names.seconds);
        }
    }
}

/// One series of a histogram on [`LATENCY_BUCKETS_MS`] (upstream's buckets): cumulative
/// buckets, sum and count, in seconds or milliseconds. Every histogram `/metrics` shows.
fn write_histogram(
    out: &mut String,
    name: &str,
    labels: &str,
    histogram: &HistogramTotals,
    seconds: bool,
) {
    let mut cumulative = 0;
    for (index, count) in histogram.buckets[..LATENCY_BUCKETS_MS.len()]
        .iter()
        .enumerate()
    {
        cumulative += count;
        let bound = match seconds {
            true => LATENCY_BOUNDS_SECONDS[index],
            false => LATENCY_BUCKETS_MS[index] as f64,
        };
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
    }
    cumulative += histogram.buckets[LATENCY_BUCKETS_MS.len()];
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
    let sum_scale = if seconds { 1_000_000.0 } else { 1000.0 };
    let _ = writeln!(
        out,
        "{name}_sum{{{labels}}} {}",
        histogram.sum_us as f64 / sum_scale
    );
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", histogram.count);
}

/// A per-shard metric: name, help text, and how to read it.
type ShardMetric = (&'static str, &'static str, fn(&ShardStats) -> u64);

fn render_shards(out: &mut String, stats: &AllShardStats) {
    out.push_str("# HELP kactivator_shard_info The I/O driver each shard runs on.\n# TYPE kactivator_shard_info gauge\n");
    for shard in stats.iter() {
        let _ = writeln!(
            out,
            "kactivator_shard_info{{shard=\"{}\",driver=\"{}\"}} 1",
            shard.index,
            shard.driver()
        );
    }
    let gauges: [ShardMetric; 2] = [
        (
            "kactivator_shard_routing_version",
            "Routing snapshot version the shard serves.",
            |s| s.routing_version.get(),
        ),
        (
            "kactivator_shard_connections_open",
            "Client connections open on the shard.",
            |s| s.connections_open.get(),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for shard in stats.iter() {
            let _ = writeln!(out, "{name}{{shard=\"{}\"}} {}", shard.index, value(shard));
        }
    }
    let counters: [ShardMetric; 20] = [
        (
            "kactivator_shard_connections_accepted_total",
            "Client connections accepted.",
            |s| s.connections_accepted.get(),
        ),
        (
            "kactivator_shard_tls_handshakes_total",
            "TLS handshakes completed on the TLS data port.",
            |s| s.tls_handshakes.get(),
        ),
        (
            "kactivator_shard_tls_handshake_failures_total",
            "TLS handshakes that failed: refused by either side, cut, not done within the head timeout, or no certificate to offer.",
            |s| s.tls_handshake_failures.get(),
        ),
        (
            "kactivator_shard_h2_connections_total",
            "Client connections that spoke HTTP/2 (h2c with prior knowledge).",
            |s| s.h2_connections.get(),
        ),
        (
            "kactivator_shard_requests_total",
            "Requests read (HTTP/1 requests and HTTP/2 streams), including probes and errors.",
            |s| s.requests.get(),
        ),
        (
            "kactivator_shard_local_responses_total",
            "Requests answered by the activator itself (probes).",
            |s| s.local_responses.get(),
        ),
        (
            "kactivator_shard_bad_requests_total",
            "Malformed requests refused with 400 or 431, and HTTP/2 connections closed for a protocol error.",
            |s| s.bad_requests.get(),
        ),
        (
            "kactivator_shard_accept_pauses_total",
            "Times accepting paused at proxy.max_connections_per_shard or max_pending_heads_per_shard.",
            |s| s.accept_pauses.get(),
        ),
        (
            "kactivator_shard_idle_evictions_total",
            "Idle keep-alive connections closed to admit a new client at proxy.max_connections_per_shard.",
            |s| s.idle_evictions.get(),
        ),
        (
            "kactivator_shard_head_timeouts_total",
            "Connections closed because a request head was not whole within proxy.head_timeout_seconds.",
            |s| s.head_timeouts.get(),
        ),
        (
            "kactivator_shard_request_log_dropped_total",
            "Request log lines dropped because stdout did not keep up (the writer's queue was full).",
            |s| s.request_log_dropped.get(),
        ),
        (
            "kactivator_shard_panics_total",
            "Requests, streams and connections ended by a panic that was kept to them (the shard served on).",
            |s| s.panics.get(),
        ),
        (
            "kactivator_shard_client_aborts_total",
            "Requests whose client went away before the end.",
            |s| s.client_aborts.get(),
        ),
        (
            "kactivator_shard_upstream_connects_total",
            "Connections dialed to pods.",
            |s| s.upstream_connects.get(),
        ),
        (
            "kactivator_shard_upstream_connect_errors_total",
            "Dials to pods that failed.",
            |s| s.upstream_connect_errors.get(),
        ),
        (
            "kactivator_shard_shed_total",
            "Waiting requests answered 503 because a request of a higher priority band took their place in a full queue.",
            |s| s.shed.get(),
        ),
        (
            "kactivator_shard_priority_header_invalid_total",
            "Requests whose priority header was not a band of their revision's policy (served in its default band).",
            |s| s.priority_invalid.get(),
        ),
        (
            "kactivator_shard_dial_retries_total",
            "Requests sent back to admission because their pod could not be reached (nothing had been sent).",
            |s| s.dial_retries.get(),
        ),
        (
            "kactivator_shard_upstream_reuses_total",
            "Requests sent on a pooled keep-alive connection.",
            |s| s.upstream_reuses.get(),
        ),
        (
            "kactivator_shard_upstream_stale_discards_total",
            "Pooled connections found closed or expired.",
            |s| s.upstream_stale_discards.get(),
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for shard in stats.iter() {
            let _ = writeln!(out, "{name}{{shard=\"{}\"}} {}", shard.index, value(shard));
        }
    }
    // Process totals under the fork's names.
    let totals: [ShardMetric; 3] = [
        (
            "activator_proxy_queue_time_warning_total",
            "Requests that waited at least 4 s for a pod.",
            |s| s.queue_time_warning.get(),
        ),
        (
            "activator_proxy_queue_time_error_total",
            "Requests that waited at least 60 s for a pod.",
            |s| s.queue_time_error.get(),
        ),
        (
            "activator_proxy_queue_time_critical_total",
            "Requests that waited at least 180 s for a pod.",
            |s| s.queue_time_critical.get(),
        ),
    ];
    for (name, help, value) in totals {
        let total: u64 = stats.iter().map(|shard| value(shard)).sum();
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {total}"
        );
    }
}

fn base_labels(labels: &RevisionLabels, pod_name: &str) -> String {
    format!(
        "configuration_name=\"{}\",container_name=\"activator\",namespace_name=\"{}\",pod_name=\"{}\",revision_name=\"{}\",service_name=\"{}\"",
        escape(&labels.configuration),
        escape(&labels.namespace),
        escape(pod_name),
        escape(&labels.revision),
        escape(&labels.service)
    )
}

/// The constant labels of a queue-proxy's 1.18 metrics (`PodRevisionContext`, container
/// `queue-proxy`; an empty service is `unknown`, as upstream's `valueOrUnknown`).
fn queue_proxy_labels(labels: &RevisionLabels, pod_name: &str) -> String {
    let service = if labels.service.is_empty() {
        "unknown"
    } else {
        &labels.service
    };
    format!(
        "configuration_name=\"{}\",container_name=\"queue-proxy\",namespace_name=\"{}\",pod_name=\"{}\",revision_name=\"{}\",service_name=\"{}\"",
        escape(&labels.configuration),
        escape(&labels.namespace),
        escape(pod_name),
        escape(&labels.revision),
        escape(service)
    )
}

fn queue_proxy_code_labels(labels: &RevisionLabels, pod_name: &str, code: u16) -> String {
    format!(
        "{},response_code=\"{code}\",response_code_class=\"{}xx\"",
        queue_proxy_labels(labels, pod_name),
        code / 100
    )
}

/// The attributes upstream's OpenTelemetry request metrics carry, in Prometheus form.
fn otel_labels(labels: &RevisionLabels) -> String {
    format!(
        "k8s_namespace_name=\"{}\",kn_configuration_name=\"{}\",kn_revision_name=\"{}\",kn_service_name=\"{}\"",
        escape(&labels.namespace),
        escape(&labels.configuration),
        escape(&labels.revision),
        escape(&labels.service)
    )
}

/// The attributes of upstream's queued and active gauges (namespace and revision only).
fn otel_revision_labels(labels: &RevisionLabels) -> String {
    format!(
        "k8s_namespace_name=\"{}\",kn_revision_name=\"{}\"",
        escape(&labels.namespace),
        escape(&labels.revision)
    )
}

fn code_labels(labels: &RevisionLabels, pod_name: &str, code: u16) -> String {
    format!(
        "{},response_code=\"{code}\",response_code_class=\"{}xx\"",
        base_labels(labels, pod_name),
        code / 100
    )
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_utils::CachePadded;
    use std::sync::Arc;

    #[test]
    fn shard_counters_are_summed_per_revision_and_code() {
        let stats: AllShardStats = Arc::from(vec![
            CachePadded::new(ShardStats::new(0)),
            CachePadded::new(ShardStats::new(1)),
        ]);
        let labels = RevisionLabels {
            namespace: "ns".into(),
            revision: "rev-1".into(),
            service: "svc".into(),
            configuration: "cfg".into(),
        };
        stats[0]
            .register_revision(labels.clone(), false)
            .record(200, 3_000);
        let second = stats[1].register_revision(labels, false);
        second.record(200, 70_000);
        second.record(502, 1_000);
        let text = render(
            &stats,
            "activator-0",
            &prometheus::Registry::new(),
            RenderOptions::default(),
        );
        let base = "configuration_name=\"cfg\",container_name=\"activator\",namespace_name=\"ns\",pod_name=\"activator-0\",revision_name=\"rev-1\",service_name=\"svc\"";
        assert!(text.contains(&format!("activator_request_count{{{base},response_code=\"200\",response_code_class=\"2xx\"}} 2\n")), "{text}");
        assert!(text.contains(&format!("activator_request_count{{{base},response_code=\"502\",response_code_class=\"5xx\"}} 1\n")), "{text}");
        assert!(text.contains(&format!("activator_request_latencies_bucket{{{base},response_code=\"200\",response_code_class=\"2xx\",le=\"5\"}} 1\n")), "{text}");
        assert!(text.contains(&format!("activator_request_latencies_bucket{{{base},response_code=\"200\",response_code_class=\"2xx\",le=\"80\"}} 2\n")), "{text}");
        assert!(text.contains(&format!("activator_request_latencies_sum{{{base},response_code=\"200\",response_code_class=\"2xx\"}} 73\n")), "{text}");
        assert!(
            text.contains("kactivator_shard_info{shard=\"1\",driver=\"unknown\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn the_opentelemetry_names_carry_the_same_counts_and_either_set_can_be_left_out() {
        use crate::config::MetricNames;
        let stats: AllShardStats = Arc::from(vec![CachePadded::new(ShardStats::new(0))]);
        let labels = RevisionLabels {
            namespace: "ns".into(),
            revision: "rev-1".into(),
            service: "svc".into(),
            configuration: "cfg".into(),
        };
        let block = stats[0].register_revision(labels, false);
        block.record(200, 3_000);
        block.load.arrive(0);
        block.load.arrive(0);
        block.queued.set(1);
        let render_with = |names, reported| {
            render(
                &stats,
                "activator-0",
                &prometheus::Registry::new(),
                RenderOptions {
                    names,
                    reported_concurrency: reported,
                    ..RenderOptions::default()
                },
            )
        };
        let otel = render_with(MetricNames::Opentelemetry, None);
        let attributes = "k8s_namespace_name=\"ns\",kn_configuration_name=\"cfg\",kn_revision_name=\"rev-1\",kn_service_name=\"svc\"";
        for line in [
            format!("kn_revision_request_concurrency{{{attributes}}} 2\n"),
            "kn_revision_request_queued{k8s_namespace_name=\"ns\",kn_revision_name=\"rev-1\"} 1\n".to_string(),
            "kn_revision_request_active{k8s_namespace_name=\"ns\",kn_revision_name=\"rev-1\"} 1\n".to_string(),
            format!("http_server_request_duration_seconds_bucket{{{attributes},http_response_status_code=\"200\",le=\"0.005\"}} 1\n"),
            format!("http_server_request_duration_seconds_sum{{{attributes},http_response_status_code=\"200\"}} 0.003\n"),
            format!("http_server_request_duration_seconds_count{{{attributes},http_response_status_code=\"200\"}} 1\n"),
        ] {
            assert!(otel.contains(&line), "{line} in\n{otel}");
        }
        assert!(!otel.contains("activator_request_count"), "{otel}");
        let opencensus = render_with(MetricNames::Opencensus, None);
        assert!(opencensus.contains("activator_request_count{"));
        assert!(!opencensus.contains("kn_revision_request"));
        let both = render_with(MetricNames::Both, None);
        assert!(
            both.contains("activator_request_count{")
                && both.contains("kn_revision_request_queued{")
        );
        // With a reporter, the concurrency gauges show its last per-second average.
        let reported: ReportedConcurrency = Arc::default();
        reported
            .lock()
            .unwrap()
            .insert(RevisionKey::new("ns", "rev-1").unwrap(), 1.5);
        let text = render_with(MetricNames::Both, Some(&reported));
        assert!(
            text.contains(&format!(
                "kn_revision_request_concurrency{{{attributes}}} 1.5\n"
            )),
            "{text}"
        );
        assert!(
            text.contains("activator_request_concurrency{") && text.contains("} 1.5\n"),
            "{text}"
        );
    }

    #[test]
    fn a_queue_proxy_exports_upstreams_queue_proxy_names_and_not_the_activators() {
        use crate::config::MetricNames;
        let stats: AllShardStats = Arc::from(vec![CachePadded::new(ShardStats::new(0))]);
        let labels = RevisionLabels {
            namespace: "ns".into(),
            revision: "rev-1".into(),
            service: String::new(),
            configuration: "cfg".into(),
        };
        let block = stats[0].register_revision(labels, false);
        block.record(200, 3_000);
        block.record(503, 70_000);
        // Only the 200 reached the app (the 503 was the breaker's), in 2 of its 3 ms.
        block.app.record(200, 2_000);
        block.load.arrive(0);
        block.load.arrive(0);
        let render_with = |names, queue_depth| {
            render(
                &stats,
                "pod-1",
                &prometheus::Registry::new(),
                RenderOptions {
                    names,
                    component: MetricsComponent::QueueProxy { queue_depth },
                    reported_concurrency: None,
                },
            )
        };
        let text = render_with(MetricNames::Both, true);
        let base = "configuration_name=\"cfg\",container_name=\"queue-proxy\",namespace_name=\"ns\",pod_name=\"pod-1\",revision_name=\"rev-1\",service_name=\"unknown\"";
        let attributes = "k8s_namespace_name=\"ns\",kn_configuration_name=\"cfg\",kn_revision_name=\"rev-1\",kn_service_name=\"\"";
        for line in [
            format!("revision_request_count{{{base},response_code=\"200\",response_code_class=\"2xx\"}} 1\n"),
            format!("revision_request_count{{{base},response_code=\"503\",response_code_class=\"5xx\"}} 1\n"),
            format!("revision_request_latencies_bucket{{{base},response_code=\"503\",response_code_class=\"5xx\",le=\"60\"}} 0\n"),
            format!("revision_request_latencies_bucket{{{base},response_code=\"503\",response_code_class=\"5xx\",le=\"80\"}} 1\n"),
            format!("revision_request_latencies_sum{{{base},response_code=\"503\",response_code_class=\"5xx\"}} 70\n"),
            format!("revision_queue_depth{{{base}}} 2\n"),
            format!("kn_serving_queue_depth{{{attributes}}} 2\n"),
            format!("http_server_request_duration_seconds_count{{{attributes},http_response_status_code=\"200\"}} 1\n"),
            format!("revision_app_request_count{{{base},response_code=\"200\",response_code_class=\"2xx\"}} 1\n"),
            format!("revision_app_request_latencies_sum{{{base},response_code=\"200\",response_code_class=\"2xx\"}} 2\n"),
            format!("kn_serving_invocation_duration_seconds_bucket{{{attributes},http_response_status_code=\"200\",le=\"0.005\"}} 1\n"),
            format!("kn_serving_invocation_duration_seconds_count{{{attributes},http_response_status_code=\"200\"}} 1\n"),
        ] {
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        assert!(!text.contains("activator_request"), "{text}");
        assert!(!text.contains("kn_revision_request"), "{text}");
        assert_eq!(
            text.matches("revision_app_request_count{").count(),
            1,
            "the breaker's 503 never reached the app: {text}"
        );
        assert!(
            text.contains("kactivator_shard_requests_total"),
            "ours stay"
        );
        let unlimited = render_with(MetricNames::Both, false);
        assert!(
            !unlimited.contains("queue_depth"),
            "no breaker, no depth (upstream records it only with one)"
        );
        let opencensus = render_with(MetricNames::Opencensus, true);
        assert!(
            opencensus.contains("revision_request_count{") && !opencensus.contains("kn_serving")
        );
        let otel = render_with(MetricNames::Opentelemetry, true);
        assert!(
            !otel.contains("revision_request_count") && otel.contains("kn_serving_queue_depth{")
        );
    }

    #[test]
    fn the_otlp_push_carries_what_the_scrape_shows_summed_over_shards() {
        use kactivator_api::trace::span::AttributeValue;
        let stats: AllShardStats = Arc::from(vec![
            CachePadded::new(ShardStats::new(0)),
            CachePadded::new(ShardStats::new(1)),
        ]);
        let labels = RevisionLabels {
            namespace: "ns".into(),
            revision: "rev-1".into(),
            service: "svc".into(),
            configuration: "cfg".into(),
        };
        let blocks = [
            stats[0].register_revision(labels.clone(), false),
            stats[1].register_revision(labels, false),
        ];
        blocks[0].record(200, 3_000);
        blocks[1].record(200, 30_000);
        blocks[1].record(503, 70_000);
        blocks[0].app.record(200, 2_000);
        blocks[1].app.record(200, 25_000);
        blocks[0].load.arrive(0);
        let metrics = queue_proxy_otlp(&stats, true);
        let names: Vec<_> = metrics.iter().map(|metric| metric.name).collect();
        assert_eq!(
            names,
            [
                "kn.serving.queue.depth",
                "http.server.request.duration",
                "kn.serving.invocation.duration"
            ]
        );
        let otlp::MetricData::Gauge(depth) = &metrics[0].data else {
            panic!("{:?}", metrics[0])
        };
        assert_eq!(depth[0].value, 1);
        assert_eq!(metrics[0].unit, "{request}");
        let points = |index: usize| match &metrics[index].data {
            otlp::MetricData::Histogram(points) => points.clone(),
            other => panic!("{other:?}"),
        };
        let code = |point: &otlp::HistogramPoint| match &point.attributes[0] {
            Attribute {
                key: "http.response.status_code",
                value: AttributeValue::Int(code),
            } => *code,
            other => panic!("{other:?}"),
        };
        let server = points(1);
        assert_eq!(server.iter().map(code).collect::<Vec<_>>(), [200, 503]);
        assert_eq!(server[0].count(), 2, "both shards' 200s");
        assert_eq!(server[0].sum, 0.033);
        assert_eq!(server[0].bounds, LATENCY_BOUNDS_SECONDS);
        assert_eq!(server[0].bucket_counts.len(), LATENCY_BUCKETS_MS.len() + 1);
        assert_eq!(server[0].bucket_counts[0], 1, "3 ms: at most 5 ms");
        assert_eq!(server[1].count(), 1);
        let invocation = points(2);
        assert_eq!(invocation.len(), 1, "the 503 never reached the app");
        assert_eq!(invocation[0].count(), 2);
        assert_eq!(invocation[0].sum, 0.027);
        // The same totals as the scrape shows under upstream's Prometheus names.
        let text = render(
            &stats,
            "pod-1",
            &prometheus::Registry::new(),
            RenderOptions {
                names: crate::config::MetricNames::Opentelemetry,
                component: MetricsComponent::QueueProxy { queue_depth: true },
                reported_concurrency: None,
            },
        );
        let attributes = "k8s_namespace_name=\"ns\",kn_configuration_name=\"cfg\",kn_revision_name=\"rev-1\",kn_service_name=\"svc\"";
        for line in [
            format!("http_server_request_duration_seconds_count{{{attributes},http_response_status_code=\"200\"}} 2\n"),
            format!("http_server_request_duration_seconds_sum{{{attributes},http_response_status_code=\"200\"}} 0.033\n"),
            format!("kn_serving_invocation_duration_seconds_sum{{{attributes},http_response_status_code=\"200\"}} 0.027\n"),
            format!("http_server_request_duration_seconds_bucket{{{attributes},http_response_status_code=\"200\",le=\"{}\"}} 1\n", server[0].bounds[0]),
        ] {
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        // No breaker, no depth; nothing recorded, no histogram.
        let idle: AllShardStats = Arc::from(vec![CachePadded::new(ShardStats::new(0))]);
        assert!(queue_proxy_otlp(&idle, false).is_empty());
    }

    #[test]
    fn waits_and_cold_starts_are_histograms_in_both_name_sets_summed_over_shards() {
        use crate::config::MetricNames;
        let stats: AllShardStats = Arc::from(vec![
            CachePadded::new(ShardStats::new(0)),
            CachePadded::new(ShardStats::new(1)),
        ]);
        let labels = |revision: &str| RevisionLabels {
            namespace: "ns".into(),
            revision: revision.into(),
            service: "svc".into(),
            configuration: "cfg".into(),
        };
        // rev-1: a 3 ms wait for a busy pod on shard 0, a 1.5 s cold start on shard 1.
        stats[0]
            .register_revision(labels("rev-1"), false)
            .record_wait(3_000, false);
        stats[1]
            .register_revision(labels("rev-1"), false)
            .record_wait(1_500_000, true);
        // rev-2 never waited: no series of its own.
        stats[0]
            .register_revision(labels("rev-2"), false)
            .record(200, 1_000);
        let text = render(
            &stats,
            "activator-0",
            &prometheus::Registry::new(),
            RenderOptions {
                names: MetricNames::Both,
                reported_concurrency: None,
                ..RenderOptions::default()
            },
        );
        let base = "configuration_name=\"cfg\",container_name=\"activator\",namespace_name=\"ns\",pod_name=\"activator-0\",revision_name=\"rev-1\",service_name=\"svc\"";
        let otel = "k8s_namespace_name=\"ns\",kn_revision_name=\"rev-1\"";
        for line in [
            format!("activator_request_wait_latencies_bucket{{{base},le=\"5\"}} 1\n"),
            format!("activator_request_wait_latencies_bucket{{{base},le=\"2000\"}} 2\n"),
            format!("activator_request_wait_latencies_sum{{{base}}} 1503\n"),
            format!("activator_request_wait_latencies_count{{{base}}} 2\n"),
            format!("activator_cold_start_wait_latencies_bucket{{{base},le=\"1000\"}} 0\n"),
            format!("activator_cold_start_wait_latencies_bucket{{{base},le=\"+Inf\"}} 1\n"),
            format!("activator_cold_start_wait_latencies_count{{{base}}} 1\n"),
            format!("kn_revision_request_wait_duration_seconds_bucket{{{otel},le=\"0.005\"}} 1\n"),
            format!("kn_revision_request_wait_duration_seconds_sum{{{otel}}} 1.503\n"),
            format!("kn_revision_cold_start_wait_duration_seconds_bucket{{{otel},le=\"2\"}} 1\n"),
            format!("kn_revision_cold_start_wait_duration_seconds_count{{{otel}}} 1\n"),
            "# TYPE kn_revision_cold_start_wait_duration_seconds histogram\n".to_string(),
        ] {
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        assert!(!text.contains("rev-2\",le="), "rev-2 never waited:\n{text}");
        let opencensus = render(
            &stats,
            "activator-0",
            &prometheus::Registry::new(),
            RenderOptions {
                names: MetricNames::Opencensus,
                reported_concurrency: None,
                ..RenderOptions::default()
            },
        );
        assert!(
            opencensus.contains("activator_request_wait_latencies_count{")
                && !opencensus.contains("kn_revision_request_wait"),
            "{opencensus}"
        );
    }

    #[test]
    fn priority_counters_show_per_band_and_for_the_heaviest_tenants_of_each_shard() {
        use kactivator_shards::metrics::TENANT_SERIES;
        let stats: AllShardStats = Arc::from(vec![
            CachePadded::new(ShardStats::new(0)),
            CachePadded::new(ShardStats::new(1)),
        ]);
        let labels = RevisionLabels {
            namespace: "ns".into(),
            revision: "rev-1".into(),
            service: "svc".into(),
            configuration: "cfg".into(),
        };
        let zero = stats[0].register_revision(labels.clone(), false);
        let one = stats[1].register_revision(labels, false);
        for (shard, band, flow, name) in [
            (&zero, 2, 7, "acme\"corp"),
            (&zero, 2, 7, "acme\"corp"),
            (&one, 0, 7, "acme\"corp"),
            (&one, 1, 0, ""),
        ] {
            let counters = shard.priority_counters();
            counters.bands[band].requests.increment();
            counters.count_tenant(flow, || Some(name.as_bytes()));
        }
        zero.priority_counters().bands[0].shed.increment();
        one.priority_counters().bands[2].queued.increment();
        // More keys than series on shard 0: the rest are folded.
        for flow in 100..100 + TENANT_SERIES as u64 {
            zero.priority_counters()
                .count_tenant(flow, || Some(b"another"));
        }
        // Another revision without a policy: no priority series at all.
        stats[0]
            .register_revision(
                RevisionLabels {
                    revision: "plain".into(),
                    ..Default::default()
                },
                false,
            )
            .record(200, 1);
        let text = render(
            &stats,
            "a-0",
            &prometheus::Registry::new(),
            RenderOptions::default(),
        );
        let base = "configuration_name=\"cfg\",container_name=\"activator\",namespace_name=\"ns\",pod_name=\"a-0\",revision_name=\"rev-1\",service_name=\"svc\"";
        for line in [
            format!("kactivator_priority_requests_total{{{base},band=\"2\"}} 2\n"),
            format!("kactivator_priority_requests_total{{{base},band=\"0\"}} 1\n"),
            format!("kactivator_priority_queued{{{base},band=\"2\"}} 1\n"),
            format!("kactivator_priority_shed_total{{{base},band=\"0\"}} 1\n"),
            format!(
                "kactivator_priority_tenant_requests_total{{{base},tenant=\"acme\\\"corp\",shard=\"0\"}} 2\n"
            ),
            format!(
                "kactivator_priority_tenant_requests_total{{{base},tenant=\"acme\\\"corp\",shard=\"1\"}} 1\n"
            ),
            format!("kactivator_priority_tenant_requests_total{{{base},tenant=\"\",shard=\"1\"}} 1\n"),
            // Fifteen keys named alike, each with a slot of shard 0, show as one series.
            format!(
                "kactivator_priority_tenant_requests_total{{{base},tenant=\"another\",shard=\"0\"}} 15\n"
            ),
            format!("kactivator_priority_other_tenants_requests_total{{{base}}} 1\n"),
        ] {
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        assert_eq!(
            text.matches("kactivator_priority_tenant_requests_total{")
                .count(),
            4,
            "acme on each shard, no key, another: {text}"
        );
        assert!(
            !text.contains("band=\"3\""),
            "bands without requests: {text}"
        );
        assert!(
            !text.contains("revision_name=\"plain\",service_name=\"\",band"),
            "{text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
