//! kactivator-loadgen: sends exactly `--requests N` HTTP/1.1 keep-alive GET requests (or as
//! many as fit in `--duration-secs S`) over `--connections C` connections and checks that every
//! response is a 200. With `--h2` it speaks h2c instead (see `h2c`): `--streams M` requests in
//! flight per connection, a GET or (`--grpc`) a gRPC unary call.
//!
//! A fixed request count (not a duration) is what instruction-count benchmarks need: run a
//! proxy under callgrind twice with different counts and the difference divided by the extra
//! requests is the marginal cost of one proxied request. HTTP/1 is plain std, one thread per
//! connection, one request in flight per connection.
//!
//! `--latency` records the round-trip time of every request (write of the request to the last
//! byte of the response) in an HDR histogram (`hdrhistogram`, three significant digits: a
//! percentile is within 0.1 % of the sample's value, in memory that does not grow with the
//! run) and prints percentiles of those samples. Unlike wrk 4.1, which
//! "corrects" for coordinated omission by adding synthetic samples for every stall, this is the
//! plain closed-loop figure the same-CPU ping-pong benchmark wants: one 4 ms preemption is one
//! slow request, not a hundred.

#![forbid(unsafe_code)]

mod h2c;
mod response;

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use h2c::H2Options;
use response::ResponseReader;

/// Default for `--connections`.
const DEFAULT_CONNECTIONS: usize = 10;
/// Default for `--timeout-secs`: connect, read and write timeout per operation.
const DEFAULT_TIMEOUT_SECS: u64 = 30;
/// How many error messages are printed to stderr before the rest are only counted.
const MAX_REPORTED_ERRORS: usize = 5;
/// The percentiles `--latency` prints, in per mille (integers keep the ranks exact), with the
/// key they are printed under.
const PERCENTILES: [(u64, &str); 4] = [
    (500, "p50_us"),
    (900, "p90_us"),
    (990, "p99_us"),
    (999, "p999_us"),
];

/// Default for `--streams` (h2c): one request in flight per connection, as in HTTP/1.
const DEFAULT_STREAMS: usize = 1;

const USAGE: &str = "\
usage: kactivator-loadgen --url http://HOST:PORT/PATH (--requests N | --duration-secs S)
                          [--connections C] [--header 'Name: value']... [--timeout-secs S]
                          [--latency] [--h2 [--streams M] [--grpc] [--data FILE]]

Sends exactly N GET requests over C HTTP/1.1 keep-alive connections (request i goes to
connection i mod C; one request in flight per connection), or, with --duration-secs, sends
requests on every connection until S seconds have passed, and checks every response is 200.
Prints `requests=N ok=N errors=E elapsed_ms=T rps=R` and exits 1 if any request failed.

  --url URL            http:// URL to request (no https)
  --requests N         total number of requests (0 is allowed: connects nothing)
  --duration-secs S    instead of --requests: keep sending for S seconds
  --connections C      number of connections, default 10
  --header, -H H       extra request header, repeatable; a Host header replaces the default
  --timeout-secs S     connect/read/write timeout, default 30
  --latency            also print p50_us, p90_us, p99_us, p999_us and max_us: percentiles of
                       the round-trip time of every successful request (from writing the
                       request to reading the last byte of the response), in microseconds

h2c (HTTP/2 over cleartext TCP, prior knowledge), on one thread:
  --h2                 speak h2c; a Host header becomes the :authority
  --streams M          requests in flight at once on each connection, default 1
  --grpc               a gRPC unary call: POST with content-type application/grpc and
                       te: trailers; a success needs status 200 and grpc-status 0
  --data FILE          the request body, sent as is with a POST (with --grpc: the framed
                       message; without --data, --grpc sends the empty message)
";

#[derive(Debug)]
struct Args {
    target: Target,
    budget: Budget,
    connections: usize,
    headers: Vec<String>,
    timeout: Duration,
    latency: bool,
    /// `--h2`: h2c instead of HTTP/1.1.
    h2: Option<H2Args>,
}

/// The h2c arguments as given; `--data` is read in `main`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct H2Args {
    streams: usize,
    data: Option<String>,
    grpc: bool,
}

/// How many requests to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    /// Exactly this many, spread over the connections.
    Requests(u64),
    /// As many as each connection gets through in this time.
    Duration(Duration),
}

#[derive(Debug)]
struct Target {
    addr: SocketAddr,
    /// `host:port` as written in the URL, for the default Host header.
    authority: String,
    path: String,
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("kactivator-loadgen: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Built before the clock starts; a bad header or body file ends the run here.
    let h2 = match &args.h2 {
        Some(h2) => match h2_exchange(&args, h2) {
            Ok(exchange) => Some((exchange, h2.streams)),
            Err(message) => {
                eprintln!("kactivator-loadgen: {message}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };

    let started = Instant::now();
    let limits: Vec<Limit> = match args.budget {
        Budget::Requests(requests) => (0..args.connections)
            .map(|index| requests_for_connection(requests, args.connections, index))
            .filter(|&count| count > 0)
            .map(Limit::Count)
            .collect(),
        Budget::Duration(duration) => vec![Limit::Until(started + duration); args.connections],
    };
    let total = match h2 {
        Some((exchange, streams)) => h2c::run(
            args.target.addr,
            exchange,
            limits,
            streams,
            args.timeout,
            args.latency,
        ),
        None => run_http1(&args, limits),
    };
    let elapsed = started.elapsed();

    for message in &total.messages {
        eprintln!("kactivator-loadgen: error: {message}");
    }
    if total.errors > total.messages.len() as u64 {
        eprintln!(
            "kactivator-loadgen: ... and {} more errors",
            total.errors - total.messages.len() as u64
        );
    }
    let secs = elapsed.as_secs_f64();
    let rps = if secs > 0.0 {
        total.ok as f64 / secs
    } else {
        0.0
    };
    let requests = match args.budget {
        Budget::Requests(requests) => requests,
        Budget::Duration(_) => total.ok + total.errors,
    };
    let mut line = format!(
        "requests={} ok={} errors={} elapsed_ms={} rps={:.0}",
        requests,
        total.ok,
        total.errors,
        elapsed.as_millis(),
        rps
    );
    if args.latency {
        for (percentile, key) in PERCENTILES {
            let _ = write!(
                line,
                " {key}={}",
                micros(total.latencies.percentile(percentile))
            );
        }
        let _ = write!(line, " max_us={}", micros(total.latencies.max()));
    }
    println!("{line}");
    if total.errors == 0 && total.ok == requests {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The h2c request of `--h2`, with the body file read.
fn h2_exchange(args: &Args, h2: &H2Args) -> Result<h2c::Exchange, String> {
    let body = match &h2.data {
        Some(path) => Some(std::fs::read(path).map_err(|e| format!("--data {path}: {e}"))?),
        None => None,
    };
    let options = H2Options {
        streams: h2.streams,
        body,
        grpc: h2.grpc,
    };
    h2c::Exchange::new(&args.target, &args.headers, &options)
}

/// The HTTP/1.1 mode: one thread per connection, each running `run_connection`.
fn run_http1(args: &Args, limits: Vec<Limit>) -> Tally {
    let request: Arc<[u8]> = build_request(&args.target, &args.headers).into();
    let workers: Vec<_> = limits
        .into_iter()
        .enumerate()
        .map(|(index, limit)| {
            let request = Arc::clone(&request);
            let addr = args.target.addr;
            let timeout = args.timeout;
            let latency = args.latency;
            std::thread::Builder::new()
                .name(format!("conn-{index}"))
                .stack_size(256 * 1024)
                .spawn(move || run_connection(addr, &request, limit, timeout, latency))
                .expect("spawning a connection thread")
        })
        .collect();

    let mut total = Tally::default();
    for worker in workers {
        match worker.join() {
            Ok(tally) => total.merge(tally),
            Err(_) => total.record_error("connection thread panicked".to_string()),
        }
    }
    total
}

/// Round-trip times in nanoseconds, in an HDR histogram of three significant digits.
struct Latencies(hdrhistogram::Histogram<u64>);

impl Default for Latencies {
    fn default() -> Latencies {
        // Three significant digits, any range (it grows as samples need).
        Latencies(hdrhistogram::Histogram::new(3).expect("3 significant digits are valid"))
    }
}

impl Latencies {
    fn record(&mut self, nanos: u128) {
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX).max(1);
        // An auto-resizing histogram takes any value.
        let _ = self.0.record(nanos);
    }

    fn merge(&mut self, other: &Latencies) {
        // Both auto-resize: adding cannot fail for want of range.
        let _ = self.0.add(&other.0);
    }

    #[cfg(test)]
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The smallest recorded value with at least `per_mille` ‰ of the samples at or below it
    /// (to the histogram's precision); `None` without samples.
    fn percentile(&self, per_mille: u64) -> Option<u64> {
        (!self.is_empty()).then(|| self.0.value_at_quantile(per_mille as f64 / 1000.0))
    }

    fn max(&self) -> Option<u64> {
        (!self.is_empty()).then(|| self.0.max())
    }
}

/// Nanoseconds as microseconds with one decimal, `-` for no sample.
fn micros(nanos: Option<u64>) -> String {
    match nanos {
        Some(nanos) => format!("{:.1}", nanos as f64 / 1000.0),
        None => "-".to_string(),
    }
}

/// Request `i` goes to connection `i % connections`, so the first `requests % connections`
/// connections carry one extra request.
fn requests_for_connection(requests: u64, connections: usize, index: usize) -> u64 {
    let connections = connections as u64;
    let index = index as u64;
    requests / connections + u64::from(index < requests % connections)
}

#[derive(Default)]
struct Tally {
    ok: u64,
    errors: u64,
    /// The first few error messages, for stderr.
    messages: Vec<String>,
    /// Round-trip time of every successful request (with `--latency` only).
    latencies: Latencies,
}

impl Tally {
    fn record_error(&mut self, message: String) {
        self.errors += 1;
        if self.messages.len() < MAX_REPORTED_ERRORS {
            self.messages.push(message);
        }
    }

    fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.latencies.merge(&other.latencies);
        for message in other.messages {
            if self.messages.len() < MAX_REPORTED_ERRORS {
                self.messages.push(message);
            }
        }
    }
}

/// When one connection stops sending.
#[derive(Debug, Clone, Copy)]
enum Limit {
    /// After this many requests.
    Count(u64),
    /// Once this moment has passed.
    Until(Instant),
}

/// Sends requests one after another on one keep-alive connection until `limit`, reconnecting
/// (and counting an error) whenever the connection fails or the server closes it. With
/// `latency`, records the round-trip time of every successful request.
fn run_connection(
    addr: SocketAddr,
    request: &[u8],
    limit: Limit,
    timeout: Duration,
    latency: bool,
) -> Tally {
    let mut tally = Tally::default();
    let mut connection: Option<(TcpStream, ResponseReader<TcpStream>)> = None;
    let mut sent = 0u64;
    loop {
        let more = match limit {
            Limit::Count(count) => sent < count,
            Limit::Until(deadline) => Instant::now() < deadline,
        };
        if !more {
            break;
        }
        sent += 1;
        if connection.is_none() {
            match connect(addr, timeout) {
                Ok(pair) => connection = Some(pair),
                Err(e) => {
                    tally.record_error(format!("connect {addr}: {e}"));
                    continue;
                }
            }
        }
        // Just filled in above.
        let (writer, reader) = connection.as_mut().expect("connection is open");
        let started = Instant::now();
        if let Err(e) = writer.write_all(request) {
            tally.record_error(format!("write to {addr}: {e}"));
            connection = None;
            continue;
        }
        match reader.read_response() {
            Ok(response) => {
                if response.status == 200 {
                    tally.ok += 1;
                    if latency {
                        tally.latencies.record(started.elapsed().as_nanos());
                    }
                } else {
                    tally.record_error(format!("{addr} answered status {}", response.status));
                }
                if response.close {
                    connection = None;
                }
            }
            Err(e) => {
                tally.record_error(format!("{addr}: {e}"));
                connection = None;
            }
        }
    }
    tally
}

fn connect(
    addr: SocketAddr,
    timeout: Duration,
) -> std::io::Result<(TcpStream, ResponseReader<TcpStream>)> {
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let reader = ResponseReader::new(stream.try_clone()?);
    Ok((stream, reader))
}

fn build_request(target: &Target, headers: &[String]) -> Vec<u8> {
    let mut request = format!("GET {} HTTP/1.1\r\n", target.path);
    let has_host = headers.iter().any(|header| {
        header
            .split_once(':')
            .is_some_and(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
    });
    if !has_host {
        // Writing to a String cannot fail.
        let _ = write!(request, "Host: {}\r\n", target.authority);
    }
    for header in headers {
        let _ = write!(request, "{header}\r\n");
    }
    request.push_str("\r\n");
    request.into_bytes()
}

// === argument parsing ===

fn parse_args(mut raw: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut url = None;
    let mut requests = None;
    let mut duration_secs: Option<u64> = None;
    let mut connections = DEFAULT_CONNECTIONS;
    let mut headers = Vec::new();
    let mut timeout_secs = DEFAULT_TIMEOUT_SECS;
    let mut latency = false;
    let mut h2 = false;
    let mut grpc = false;
    let mut streams = None;
    let mut data = None;

    while let Some(arg) = raw.next() {
        let (flag, inline_value) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(value.to_string()))
            }
            _ => (arg.clone(), None),
        };
        if flag == "--help" || flag == "-h" {
            print!("{USAGE}");
            std::process::exit(0);
        }
        if inline_value.is_none() {
            match flag.as_str() {
                "--latency" => latency = true,
                "--h2" => h2 = true,
                "--grpc" => grpc = true,
                _ => {}
            }
            if matches!(flag.as_str(), "--latency" | "--h2" | "--grpc") {
                continue;
            }
        }
        let mut value = || {
            inline_value
                .clone()
                .or_else(|| raw.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--url" => url = Some(value()?),
            "--requests" | "-n" => requests = Some(parse_number(&flag, &value()?)?),
            "--duration-secs" => duration_secs = Some(parse_number(&flag, &value()?)?),
            "--connections" | "-c" => connections = parse_number(&flag, &value()?)?,
            "--header" | "-H" => {
                let header = value()?;
                if !header.contains(':') || header.contains(['\r', '\n']) {
                    return Err(format!("--header {header:?}: expected 'Name: value'"));
                }
                headers.push(header);
            }
            "--timeout-secs" => timeout_secs = parse_number(&flag, &value()?)?,
            "--streams" | "-m" => streams = Some(parse_number(&flag, &value()?)?),
            "--data" | "-d" => data = Some(value()?),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }

    let url = url.ok_or("--url is required")?;
    let budget = match (requests, duration_secs) {
        (Some(requests), None) => Budget::Requests(requests),
        (None, Some(0)) => return Err("--duration-secs must be at least 1".to_string()),
        (None, Some(secs)) => Budget::Duration(Duration::from_secs(secs)),
        (None, None) => return Err("--requests or --duration-secs is required".to_string()),
        (Some(_), Some(_)) => {
            return Err("--requests and --duration-secs exclude each other".to_string())
        }
    };
    if connections == 0 {
        return Err("--connections must be at least 1".to_string());
    }
    if timeout_secs == 0 {
        return Err("--timeout-secs must be at least 1".to_string());
    }
    let h2 = if h2 {
        let streams = streams.unwrap_or(DEFAULT_STREAMS);
        if streams == 0 {
            return Err("--streams must be at least 1".to_string());
        }
        Some(H2Args {
            streams,
            data,
            grpc,
        })
    } else {
        // The HTTP/1 mode sends GETs one at a time; refuse what it would ignore.
        for (given, flag) in [
            (streams.is_some(), "--streams"),
            (data.is_some(), "--data"),
            (grpc, "--grpc"),
        ] {
            if given {
                return Err(format!("{flag} needs --h2"));
            }
        }
        None
    };
    Ok(Args {
        target: parse_url(&url)?,
        budget,
        connections,
        headers,
        timeout: Duration::from_secs(timeout_secs),
        latency,
        h2,
    })
}

fn parse_number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} {value:?}: not a non-negative integer"))
}

fn parse_url(url: &str) -> Result<Target, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--url {url:?}: only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(slash) => (&rest[..slash], &rest[slash..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("--url {url:?}: expected http://HOST[:PORT]/PATH"));
    }
    // `[v6]:port` or `host:port`; without a port, HTTP's default.
    let has_port = match authority.rfind(']') {
        Some(bracket) => authority[bracket..].starts_with("]:"),
        None => authority.contains(':'),
    };
    let with_port = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("--url {url:?}: resolving {with_port}: {e}"))?
        .next()
        .ok_or_else(|| format!("--url {url:?}: {with_port} resolves to no address"))?;
    Ok(Target {
        addr,
        authority: authority.to_string(),
        path: path.split('#').next().unwrap_or("/").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn requests_are_spread_over_connections_and_sum_to_the_total() {
        for (requests, connections) in [(0, 3), (1, 3), (10, 3), (20_000, 10), (7, 1)] {
            let per: Vec<u64> = (0..connections)
                .map(|i| requests_for_connection(requests, connections, i))
                .collect();
            assert_eq!(per.iter().sum::<u64>(), requests);
            assert!(per.iter().max().unwrap() - per.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn request_carries_host_path_and_extra_headers() {
        let parsed = args(&[
            "--url",
            "http://127.0.0.1:18400/a/b?q=1",
            "--requests=5",
            "-H",
            "Knative-Serving-Namespace: default",
            "--header",
            "Knative-Serving-Revision: bench",
        ])
        .unwrap();
        assert_eq!(parsed.budget, Budget::Requests(5));
        assert_eq!(parsed.connections, DEFAULT_CONNECTIONS);
        assert!(!parsed.latency);
        assert_eq!(parsed.target.addr, "127.0.0.1:18400".parse().unwrap());
        let request = String::from_utf8(build_request(&parsed.target, &parsed.headers)).unwrap();
        assert_eq!(
            request,
            "GET /a/b?q=1 HTTP/1.1\r\nHost: 127.0.0.1:18400\r\n\
             Knative-Serving-Namespace: default\r\nKnative-Serving-Revision: bench\r\n\r\n"
        );
    }

    #[test]
    fn explicit_host_header_replaces_the_default() {
        let parsed = args(&[
            "--url",
            "http://127.0.0.1:18400",
            "--requests",
            "1",
            "-H",
            "host: bench.default.svc.cluster.local",
        ])
        .unwrap();
        let request = String::from_utf8(build_request(&parsed.target, &parsed.headers)).unwrap();
        assert_eq!(
            request,
            "GET / HTTP/1.1\r\nhost: bench.default.svc.cluster.local\r\n\r\n"
        );
    }

    #[test]
    fn urls_default_the_port_and_accept_ipv6_literals() {
        assert_eq!(
            parse_url("http://127.0.0.1/x").unwrap().addr,
            "127.0.0.1:80".parse().unwrap()
        );
        assert_eq!(
            parse_url("http://[::1]:8080/").unwrap().addr,
            "[::1]:8080".parse().unwrap()
        );
        assert_eq!(
            parse_url("http://[::1]").unwrap().addr,
            "[::1]:80".parse().unwrap()
        );
    }

    #[test]
    fn bad_arguments_are_rejected_with_a_reason() {
        assert!(args(&["--requests", "1"]).unwrap_err().contains("--url"));
        assert!(args(&["--url", "http://127.0.0.1:1/"])
            .unwrap_err()
            .contains("--requests"));
        assert!(args(&[
            "--url",
            "http://127.0.0.1:1/",
            "--requests",
            "1",
            "--duration-secs",
            "1"
        ])
        .unwrap_err()
        .contains("exclude"));
        assert!(args(&["--url", "http://127.0.0.1:1/", "--duration-secs", "0"]).is_err());
        assert!(args(&["--url", "https://x/", "--requests", "1"]).is_err());
        assert!(args(&["--url", "http://127.0.0.1:1/", "--requests", "-1"]).is_err());
        assert!(args(&["--url", "http://127.0.0.1:1/", "--requests", "1", "-c", "0"]).is_err());
        assert!(args(&[
            "--url",
            "http://127.0.0.1:1/",
            "--requests",
            "1",
            "-H",
            "nocolon"
        ])
        .is_err());
        assert!(args(&["--url", "http://127.0.0.1:1/", "--requests", "1", "--bogus"]).is_err());
    }

    #[test]
    fn duration_and_latency_are_parsed() {
        let parsed = args(&[
            "--url",
            "http://127.0.0.1:1/",
            "--duration-secs=3",
            "--latency",
            "-c",
            "1",
        ])
        .unwrap();
        assert_eq!(parsed.budget, Budget::Duration(Duration::from_secs(3)));
        assert_eq!(parsed.connections, 1);
        assert!(parsed.latency);
    }

    #[test]
    fn h2_options_are_parsed_and_refused_without_h2() {
        let parsed = args(&[
            "--url",
            "http://127.0.0.1:1/x",
            "--duration-secs",
            "2",
            "--h2",
            "--streams=16",
            "--grpc",
            "--data",
            "/tmp/frame.bin",
        ])
        .unwrap();
        assert_eq!(
            parsed.h2,
            Some(H2Args {
                streams: 16,
                data: Some("/tmp/frame.bin".to_string()),
                grpc: true,
            })
        );
        let plain = args(&["--url", "http://127.0.0.1:1/", "-n", "1", "--h2"]).unwrap();
        assert_eq!(
            plain.h2,
            Some(H2Args {
                streams: DEFAULT_STREAMS,
                data: None,
                grpc: false,
            })
        );
        assert_eq!(
            args(&["--url", "http://127.0.0.1:1/", "-n", "1"])
                .unwrap()
                .h2,
            None
        );
        for extra in [&["--streams", "2"][..], &["--grpc"], &["--data", "f"]] {
            let mut list = vec!["--url", "http://127.0.0.1:1/", "-n", "1"];
            list.extend_from_slice(extra);
            assert!(args(&list).unwrap_err().contains("needs --h2"), "{extra:?}");
        }
        assert!(args(&[
            "--url",
            "http://127.0.0.1:1/",
            "-n",
            "1",
            "--h2",
            "--streams",
            "0"
        ])
        .unwrap_err()
        .contains("--streams"));
    }

    #[test]
    fn percentiles_are_nearest_rank_to_the_histograms_precision() {
        let of = |samples: &[u64]| {
            let mut latencies = Latencies::default();
            for &sample in samples {
                latencies.record(u128::from(sample));
            }
            latencies
        };
        let thousand = of(&(1..=1000).collect::<Vec<u64>>());
        assert_eq!(thousand.percentile(500), Some(500));
        assert_eq!(thousand.percentile(990), Some(990));
        assert_eq!(thousand.percentile(999), Some(999));
        assert_eq!(thousand.percentile(1000), Some(1000));
        assert_eq!(thousand.max(), Some(1000));
        assert_eq!(
            of(&(1..=10).collect::<Vec<u64>>()).percentile(990),
            Some(10)
        );
        assert_eq!(of(&[7]).percentile(500), Some(7));
        assert_eq!(of(&[7]).percentile(0), Some(7));
        assert_eq!(of(&[]).percentile(500), None);
        // Large values keep three significant digits.
        let slow = of(&[123_456_789]).percentile(500).unwrap();
        assert!(slow.abs_diff(123_456_789) <= 123_456_789 / 1000, "{slow}");
        let mut merged = of(&[1, 2]);
        merged.merge(&of(&[3]));
        assert_eq!((merged.len(), merged.max()), (3, Some(3)));
        assert_eq!(micros(Some(19_449)), "19.4");
        assert_eq!(micros(None), "-");
    }

    /// A ping-pong against a tiny keep-alive server on this machine: every request is timed.
    #[test]
    fn a_duration_run_times_every_successful_request() {
        use std::io::{BufRead, BufReader};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n"
                    && writer
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .is_err()
                {
                    return;
                }
            }
        });
        let target = parse_url(&format!("http://{addr}/")).unwrap();
        let request = build_request(&target, &[]);
        let deadline = Instant::now() + Duration::from_millis(200);
        let tally = run_connection(
            addr,
            &request,
            Limit::Until(deadline),
            Duration::from_secs(5),
            true,
        );
        assert_eq!(tally.errors, 0, "{:?}", tally.messages);
        assert!(tally.ok > 0);
        assert_eq!(tally.latencies.len(), tally.ok);
    }
}
