//! Hostile and broken HTTP/2 clients against the real binary: malformed frames, a bad preface,
//! PING and SETTINGS floods, more streams than allowed, rapid reset, a client that never reads
//! and one that hangs up while queued.
//!
//! Each client writes raw frames on a `TcpStream`. What must hold every time: the offender gets
//! a clear answer (GOAWAY with an error code, or a stream reset, or plain backpressure), the
//! activator keeps its memory bounded, stays alive, logs no panic, and still serves a
//! well-formed h2c request and an HTTP/1.1 request from a real pod afterwards.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use http::Method;
use kactivator_testkit::backend::BackendConfig;
use kactivator_testkit::grpc::{self, pb::EchoRequest, spawn_grpc, GrpcHandle};
use support::{eventually, exchange, get, revision, Activator};

const AUTHORITY: &str = "hello-00001.default.svc.cluster.local";
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types and flags (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

// Error codes (RFC 9113 §7).
const NO_ERROR: u32 = 0x0;
const PROTOCOL_ERROR: u32 = 0x1;
const FRAME_SIZE_ERROR: u32 = 0x6;
const STREAM_CLOSED: u32 = 0x5;
const REFUSED_STREAM: u32 = 0x7;
const CANCEL: u32 = 0x8;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// How much the activator's resident memory may grow under one attack.
const RSS_BUDGET_KIB: u64 = 16 * 1024;

// === the pod and the activator ===

fn pod() -> GrpcHandle {
    spawn_grpc(BackendConfig::named("pod").with_revision("hello-00001", "default")).unwrap()
}

fn start(pod: &GrpcHandle, extra: &str, proxy: &str) -> Activator {
    start_args(pod, extra, proxy, &["--shards", "2"])
}

/// As [`start`], with these command-line arguments.
fn start_args(pod: &GrpcHandle, extra: &str, proxy: &str, args: &[&str]) -> Activator {
    Activator::start_with(
        &revision("default", "hello-00001", &[pod.addr()], extra),
        proxy,
        args,
        &[],
    )
}

/// Runs a future to its end on a fresh current-thread runtime.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// Whether the process still runs (not exited, not a zombie waiting to be reaped).
fn alive(activator: &Activator) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", activator.pid()));
    stat.is_ok_and(|stat| {
        // The state follows the parenthesised command name.
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

/// The activator survived: alive, no panic logged, and both a well-formed h2c request (on both
/// data ports) and an HTTP/1.1 request still reach the pod and come back 200.
fn assert_still_serves(activator: &Activator) {
    assert!(alive(activator), "kactivator died: {}", activator.stderr());
    for port in [activator.http2, activator.http] {
        let response = block_on(grpc::h2c_request(port, AUTHORITY, Method::GET, "/", &[]))
            .unwrap_or_else(|error| panic!("a good h2c request on {port} failed: {error}"));
        assert_eq!(response.status().as_u16(), 200, "h2c on {port}");
        assert_eq!(&response.body()[..], b"hello from pod\n");
    }
    let response = exchange(activator.http, get("hello-00001", "/").as_bytes());
    assert_eq!(response.status, 200, "HTTP/1.1: {}", response.text());
    assert_eq!(response.text(), "hello from pod\n");
    let stderr = activator.stderr();
    assert!(!stderr.contains("panicked"), "a panic was logged: {stderr}");
}

// === writing frames ===

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&length.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK header block of literal fields without indexing, new names (RFC 7541 §6.2.2):
/// nothing to track on either side, every decoder takes it.
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        assert!(name.len() < 127 && value.len() < 127);
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// `GET /` for the revision with END_STREAM, as the brief's static-table form: `:method GET`,
/// `:scheme http`, `:path /` indexed, `:authority` literal with an indexed name.
fn get_headers(stream: u32) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x84, 0x01, AUTHORITY.len() as u8];
    block.extend_from_slice(AUTHORITY.as_bytes());
    frame(HEADERS, END_HEADERS | END_STREAM, stream, &block)
}

/// HEADERS and DATA of a gRPC call to `method` of the Echo service with one message.
fn grpc_call(stream: u32, method: &str, message: &[u8]) -> Vec<u8> {
    let path = format!("/kactivator.test.v1.Echo/{method}");
    let block = header_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", &path),
        (":authority", AUTHORITY),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]);
    let mut out = frame(HEADERS, END_HEADERS, stream, &block);
    let mut body = vec![0];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    out.extend(frame(DATA, END_STREAM, stream, &body));
    out
}

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Protobuf of `StreamRequest { count, interval_ms: 0, reply_bytes }`, written by hand (three
/// varint fields) so the test needs no codec.
fn stream_request(count: u32, reply_bytes: u32) -> Vec<u8> {
    let mut out = vec![0x08];
    varint(count.into(), &mut out);
    out.push(0x18);
    varint(reply_bytes.into(), &mut out);
    out
}

/// Protobuf of `EchoRequest { payload: empty, delay_ms, reply_bytes: 0 }`.
fn echo_request(delay_ms: u32) -> Vec<u8> {
    let mut out = vec![0x10];
    varint(delay_ms.into(), &mut out);
    out
}

/// A connection that sent the client preface and an empty SETTINGS.
fn h2_connect(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect to kactivator");
    stream.set_nodelay(true).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    stream.write_all(PREFACE).unwrap();
    stream.write_all(&frame(SETTINGS, 0, 0, &[])).unwrap();
    stream
}

// === reading frames ===

#[derive(Debug, Clone)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Frame {
    /// The error code of a GOAWAY or RST_STREAM.
    fn code(&self) -> u32 {
        let at = if self.kind == GOAWAY { 4 } else { 0 };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().unwrap())
    }
}

/// Reads frames as they come, remembering how the connection ended.
struct FrameReader {
    stream: TcpStream,
    buffered: Vec<u8>,
    eof: bool,
}

impl FrameReader {
    fn new(stream: TcpStream) -> FrameReader {
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        FrameReader {
            stream,
            buffered: Vec::new(),
            eof: false,
        }
    }

    fn take_frame(&mut self) -> Option<Frame> {
        if self.buffered.len() < 9 {
            return None;
        }
        let length =
            u32::from_be_bytes([0, self.buffered[0], self.buffered[1], self.buffered[2]]) as usize;
        if self.buffered.len() < 9 + length {
            return None;
        }
        let head: Vec<u8> = self.buffered.drain(..9 + length).collect();
        Some(Frame {
            kind: head[3],
            flags: head[4],
            stream: u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff,
            payload: head[9..].to_vec(),
        })
    }

    /// The next frame, or None at EOF (a reset counts as EOF) or when `deadline` passes.
    fn next(&mut self, deadline: Instant) -> Option<Frame> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            if let Some(frame) = self.take_frame() {
                return Some(frame);
            }
            if self.eof || Instant::now() >= deadline {
                return None;
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buffered.extend_from_slice(&chunk[..n]),
                Err(error)
                    if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => self.eof = true,
            }
        }
    }

    /// Every frame until EOF; panics if the connection is still open at the deadline.
    fn until_eof(&mut self, limit: Duration) -> Vec<Frame> {
        let deadline = Instant::now() + limit;
        let mut frames = Vec::new();
        while let Some(frame) = self.next(deadline) {
            frames.push(frame);
        }
        assert!(
            self.eof,
            "the connection was still open after {limit:?}; frames: {frames:?}"
        );
        frames
    }

    /// Reads the server's SETTINGS and acknowledges it.
    fn ack_settings(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Some(frame) = self.next(deadline) {
            if frame.kind == SETTINGS && frame.flags & ACK == 0 {
                self.stream.write_all(&frame_ack()).unwrap();
                return;
            }
        }
        panic!("no SETTINGS from the server");
    }
}

fn frame_ack() -> Vec<u8> {
    frame(SETTINGS, ACK, 0, &[])
}

fn goaway(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|frame| frame.kind == GOAWAY)
}

// === 1. malformed frames ===

/// Sends `bad` after a valid preface and SETTINGS; returns the GOAWAY's error code, after
/// checking the connection is then closed.
fn goaway_code_after(activator: &Activator, bad: &[u8]) -> u32 {
    let mut stream = h2_connect(activator.http2);
    stream.write_all(bad).unwrap();
    let mut reader = FrameReader::new(stream);
    let frames = reader.until_eof(Duration::from_secs(5));
    let goaway = goaway(&frames).unwrap_or_else(|| panic!("no GOAWAY: {frames:?}"));
    goaway.code()
}

/// A client that sends a broken frame sees its connection end with GOAWAY and an error code
/// that names the fault, rather than a silent close or a hang; everyone else is still served.
#[test]
fn malformed_frames_get_goaway_with_an_error_code_and_the_connection_closes() {
    let pod = pod();
    let activator = start(&pod, "", "");
    let driver = activator.metric_sum(
        "kactivator_shard_info",
        &[&format!(
            "driver=\"{}\"",
            std::env::var("KACTIVATOR_DRIVER").unwrap_or_default()
        )],
    );
    eprintln!("shards on the driver asked for: {driver}");
    let oversized = frame(DATA, 0, 1, &vec![0u8; 16 * 1024 + 1]);
    let cases: [(&str, Vec<u8>, &[u32]); 5] = [
        (
            "frame longer than max frame size",
            oversized,
            &[FRAME_SIZE_ERROR],
        ),
        // RFC 9113 §6.5 asks for FRAME_SIZE_ERROR; the `h2` crate answers PROTOCOL_ERROR,
        // which is as clear to the client and is accepted here.
        (
            "SETTINGS of 7 bytes",
            frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 1, 0]),
            &[FRAME_SIZE_ERROR, PROTOCOL_ERROR],
        ),
        (
            "HEADERS on stream 0",
            {
                let mut headers = get_headers(1);
                headers[5..9].copy_from_slice(&[0, 0, 0, 0]);
                headers
            },
            &[PROTOCOL_ERROR],
        ),
        (
            "DATA on an idle stream",
            frame(DATA, END_STREAM, 1, b"hello"),
            &[PROTOCOL_ERROR],
        ),
        // FRAME_SIZE_ERROR in RFC 9113 §6.7; PROTOCOL_ERROR from `h2`, as for SETTINGS.
        (
            "PING of 7 bytes",
            frame(PING, 0, 0, &[0; 7]),
            &[FRAME_SIZE_ERROR, PROTOCOL_ERROR],
        ),
    ];
    let mut wrong = Vec::new();
    for (name, bad, expected) in cases {
        let code = goaway_code_after(&activator, &bad);
        eprintln!("{name}: GOAWAY {code:#x}");
        if !expected.contains(&code) {
            wrong.push(format!(
                "{name}: GOAWAY code {code:#x}, expected one of {expected:x?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_still_serves(&activator);
}

// === 2. a wrong preface ===

/// A connection that starts like the HTTP/2 preface but goes wrong after `PRI * HTTP/2.0` is
/// not HTTP/2 and not a valid HTTP/1 request either: the client gets `505 HTTP Version Not
/// Supported` with `Connection: close`, and the connection is closed.
#[test]
fn a_preface_wrong_after_its_first_bytes_is_refused_and_closed() {
    let pod = pod();
    let activator = start(&pod, "", "");
    for port in [activator.http, activator.http2] {
        let mut stream = TcpStream::connect(port).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
            .unwrap();
        // read_to_end returns once the activator closes; a timeout here would be a hang.
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(
            read.is_ok(),
            "on {port}: not closed ({read:?}), got {text:?}"
        );
        // `PRI * HTTP/2.0` reads as an HTTP/1 request line of version 2.0.
        assert!(
            text.starts_with("HTTP/1.1 505 ") && text.contains("Connection: close\r\n"),
            "on {port}: {text:?}"
        );
    }
    assert_still_serves(&activator);
}

// === floods ===

/// Writes `unit` over and over on `stream` from a thread, until `count` are written, the
/// connection fails, or `limit` passes (a writer blocked by a full socket buffer gives up
/// there). Samples the activator's RSS meanwhile; returns (units written, peak RSS KiB).
fn flood(
    activator: &Activator,
    stream: &TcpStream,
    unit: Vec<u8>,
    count: usize,
    limit: Duration,
) -> (usize, u64) {
    let mut writer = stream.try_clone().unwrap();
    writer
        .set_write_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + limit;
    let thread = {
        let done = done.clone();
        let written = written.clone();
        thread::spawn(move || {
            // Many units per write, so the flood is not limited by syscalls.
            let batch: Vec<u8> = unit.iter().copied().cycle().take(unit.len() * 64).collect();
            let mut sent_bytes = 0usize;
            let mut pending = &batch[..0];
            while sent_bytes < count * unit.len() && Instant::now() < deadline {
                if pending.is_empty() {
                    let left = count * unit.len() - sent_bytes;
                    pending = &batch[..batch.len().min(left)];
                }
                match writer.write(pending) {
                    Ok(0) => break,
                    Ok(n) => {
                        pending = &pending[n..];
                        sent_bytes += n;
                        written.store((sent_bytes / unit.len()) as u64, Ordering::Relaxed);
                    }
                    Err(error)
                        if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => break,
                }
            }
            done.store(true, Ordering::Relaxed);
        })
    };
    let mut peak = 0;
    while !done.load(Ordering::Relaxed) {
        peak = peak.max(activator.rss_kib());
        thread::sleep(Duration::from_millis(50));
    }
    thread.join().unwrap();
    peak = peak.max(activator.rss_kib());
    (written.load(Ordering::Relaxed) as usize, peak)
}

/// After a flood: the RSS peak within budget, and what the server sent is sane (a GOAWAY, if
/// any, carries an error code).
fn after_flood(baseline: u64, peak: u64, stream: TcpStream, what: &str) {
    assert!(
        peak < baseline + RSS_BUDGET_KIB,
        "{what}: RSS went from {baseline} KiB to {peak} KiB"
    );
    // Read what the server sent meanwhile (briefly: it may well keep the connection open).
    let mut reader = FrameReader::new(stream);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut frames = 0;
    while let Some(frame) = reader.next(deadline) {
        frames += 1;
        if frame.kind == GOAWAY {
            eprintln!("{what}: GOAWAY {:#x} after {frames} frames", frame.code());
            break;
        }
    }
    eprintln!(
        "{what}: RSS {baseline} -> peak {peak} KiB, {frames} frames read, eof {}",
        reader.eof
    );
}

/// A client that floods PINGs and never reads the PONGs cannot make the activator buffer
/// them: the activator stops reading once its answers back up, memory stays flat, and
/// everyone else is still served. (On loopback the socket buffers take all 1.7 MB of PINGs
/// and PONGs, so the writer may well finish; the memory bound is what is checked.)
#[test]
fn a_ping_flood_without_reading_is_held_back_and_memory_stays_bounded() {
    let pod = pod();
    let activator = start(&pod, "", "");
    assert_still_serves(&activator);
    let baseline = activator.rss_kib();
    let stream = h2_connect(activator.http2);
    let (written, peak) = flood(
        &activator,
        &stream,
        frame(PING, 0, 0, b"floodme!"),
        100_000,
        Duration::from_secs(4),
    );
    eprintln!("PING flood: {written} of 100000 written");
    after_flood(baseline, peak, stream, "PING flood");
    assert_still_serves(&activator);
}

/// Same with SETTINGS frames whose acknowledgements are never read.
#[test]
fn a_settings_flood_without_reading_is_held_back_and_memory_stays_bounded() {
    let pod = pod();
    let activator = start(&pod, "", "");
    assert_still_serves(&activator);
    let baseline = activator.rss_kib();
    let stream = h2_connect(activator.http2);
    // INITIAL_WINDOW_SIZE = 65 535, the default, again and again.
    let (written, peak) = flood(
        &activator,
        &stream,
        frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]),
        50_000,
        Duration::from_secs(4),
    );
    eprintln!("SETTINGS flood: {written} of 50000 written");
    after_flood(baseline, peak, stream, "SETTINGS flood");
    assert_still_serves(&activator);
}

// === 5. more streams than allowed ===

/// A client opening 100 streams at once where 8 are allowed gets the excess refused
/// (RST_STREAM REFUSED_STREAM, safe to retry) while the 8 it may have are served in turn;
/// the pod never sees more than its container concurrency of 1.
#[test]
fn streams_beyond_max_concurrent_streams_are_refused() {
    let pod = pod();
    let activator = start(
        &pod,
        "container_concurrency = 1",
        "h2_max_concurrent_streams = 8",
    );
    let stream = h2_connect(activator.http2);
    let mut reader = FrameReader::new(stream.try_clone().unwrap());
    reader.ack_settings();
    // Each call holds the pod 100 ms, so the 8 admitted streams are still open while the
    // other 92 arrive.
    let mut burst = Vec::new();
    for i in 0..100u32 {
        burst.extend(grpc_call(2 * i + 1, "Unary", &echo_request(100)));
    }
    (&stream).write_all(&burst).unwrap();

    // The first end each stream sees: its trailers (a HEADERS with END_STREAM, how every gRPC
    // response ends) or a reset. `h2` answers the DATA that followed a refused HEADERS with
    // RST_STREAM STREAM_CLOSED (it keeps no state for a stream it refused): allowed, after the
    // refusal only.
    let mut ends: std::collections::BTreeMap<u32, u32> = Default::default();
    let mut other = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(8);
    while ends.len() < 100 {
        let Some(frame) = reader.next(deadline) else {
            break;
        };
        match frame.kind {
            HEADERS if frame.flags & END_STREAM != 0 => {
                ends.entry(frame.stream).or_insert(NO_ERROR);
            }
            RST_STREAM => {
                let code = frame.code();
                let first = *ends.entry(frame.stream).or_insert(code);
                if !(code == REFUSED_STREAM || (code == STREAM_CLOSED && first == REFUSED_STREAM)) {
                    other.push((frame.kind, frame.stream, code));
                }
            }
            GOAWAY => other.push((frame.kind, frame.stream, frame.code())),
            _ => {}
        }
    }
    assert!(other.is_empty(), "unexpected resets or GOAWAY: {other:?}");
    let served = ends.values().filter(|code| **code == NO_ERROR).count();
    let refused = ends
        .values()
        .filter(|code| **code == REFUSED_STREAM)
        .count();
    assert_eq!(served + refused, 100, "served {served}, refused {refused}");
    assert!(refused >= 80, "served {served}, refused {refused}");
    assert!(served >= 8, "served {served}, refused {refused}");
    let stats = pod.stats();
    assert_eq!(stats.max_in_flight, 1, "{stats:?}");
    assert_eq!(stats.requests, served as u64, "{stats:?}");
    drop(reader);
    drop(stream);
    assert_still_serves(&activator);
}

// === 6. rapid reset ===

/// Rapid reset (CVE-2023-44487): a client opening and cancelling streams as fast as it can is
/// cut off with GOAWAY ENHANCE_YOUR_CALM or absorbed; either way memory stays bounded, nothing
/// stays in flight at the pod, and everyone else is still served.
#[test]
fn rapid_reset_is_cut_off_or_absorbed_without_leaking_slots() {
    let pod = pod();
    let activator = start(&pod, "container_concurrency = 1", "");
    assert_still_serves(&activator);
    let baseline = activator.rss_kib();
    let stream = h2_connect(activator.http2);

    // A reader thread drains what the server sends, so our writes are never held back by it.
    let reader_stream = stream.try_clone().unwrap();
    let reader = thread::spawn(move || {
        let mut reader = FrameReader::new(reader_stream);
        let deadline = Instant::now() + Duration::from_secs(6);
        let mut goaway = None;
        let mut frames = 0;
        while let Some(frame) = reader.next(deadline) {
            frames += 1;
            if frame.kind == GOAWAY {
                goaway = Some(frame.code());
            }
        }
        (goaway, frames, reader.eof)
    });

    let mut writer = stream.try_clone().unwrap();
    writer
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut cycles = 0;
    let deadline = Instant::now() + Duration::from_secs(4);
    'flood: for batch in 0..100u32 {
        let mut bytes = Vec::new();
        for i in 0..100u32 {
            let id = 2 * (batch * 100 + i) + 1;
            bytes.extend(get_headers(id));
            bytes.extend(frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
        }
        if writer.write_all(&bytes).is_err() || Instant::now() > deadline {
            break 'flood;
        }
        cycles += 100;
    }
    let peak = activator.rss_kib();
    stream.shutdown(std::net::Shutdown::Write).ok();
    let (goaway, frames, eof) = reader.join().unwrap();
    eprintln!(
        "rapid reset: {cycles} cycles written, {frames} frames back, GOAWAY {goaway:x?}, eof {eof}"
    );
    if let Some(code) = goaway {
        assert!(
            code == ENHANCE_YOUR_CALM || code == NO_ERROR || code == PROTOCOL_ERROR,
            "GOAWAY code {code:#x}"
        );
    }
    assert!(
        peak.max(activator.rss_kib()) < baseline + RSS_BUDGET_KIB,
        "RSS {baseline} -> {peak} KiB"
    );
    assert!(
        eventually(Duration::from_secs(3), || pod.stats().in_flight == 0),
        "requests stuck in flight at the pod: {:?}",
        pod.stats()
    );
    let stats = pod.stats();
    assert!(stats.max_in_flight <= 1, "{stats:?}");
    assert!(
        eventually(Duration::from_secs(3), || activator
            .metric_sum("activator_request_concurrency", &[])
            == 0.0
            && activator.metric_sum("kactivator_revision_queued", &[]) == 0.0),
        "the activator still counts requests in flight or queued:\n{}",
        activator.metrics()
    );
    assert_still_serves(&activator);
}

// === 7. a client that never reads ===

/// A client that asks for a large streamed response and never opens its flow-control window
/// holds the activator to what the windows allow: memory stays flat, the pod's stream stalls
/// (backpressure reaches it), and closing the connection releases the pod's stream.
#[test]
fn a_slow_reader_stalls_the_pod_and_memory_stays_bounded() {
    let pod = pod();
    let activator = start(&pod, "", "");
    assert_still_serves(&activator);
    let baseline = activator.rss_kib();
    pod.reset_stats();
    let stream = h2_connect(activator.http2);
    let mut reader = FrameReader::new(stream.try_clone().unwrap());
    reader.ack_settings();
    // 2000 replies of 64 KiB: 125 MiB the pod would send if nothing held it back (to a client
    // that reads, it sends them all in about 0.2 s here, so a stream still open seconds later
    // is a stalled one).
    (&stream)
        .write_all(&grpc_call(1, "ServerStream", &stream_request(2000, 65_536)))
        .unwrap();

    assert!(
        eventually(Duration::from_secs(5), || pod.stats().requests == 1),
        "the call never reached the pod: {:?}",
        pod.stats()
    );
    // Read what the activator sends for a while, never sending WINDOW_UPDATE, sampling RSS.
    let mut data = 0usize;
    let mut peak = 0;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Some(frame) = reader.next(Instant::now() + Duration::from_millis(100)) {
            if frame.kind == DATA {
                data += frame.payload.len();
            }
            assert!(
                frame.kind != RST_STREAM && frame.kind != GOAWAY,
                "{frame:?}"
            );
        }
        peak = peak.max(activator.rss_kib());
    }
    let stats = pod.stats();
    eprintln!(
        "slow reader: {data} bytes of DATA received, RSS {baseline} -> {peak} KiB, pod {stats:?}"
    );
    assert!(data <= 65_535, "more DATA than the window allows: {data}");
    assert_eq!(
        stats.in_flight, 1,
        "the pod finished or dropped its stream: {stats:?}"
    );
    assert!(
        peak < baseline + RSS_BUDGET_KIB,
        "RSS went from {baseline} KiB to {peak} KiB"
    );
    // Hanging up releases the pod's stream.
    drop(reader);
    drop(stream);
    assert!(
        eventually(Duration::from_secs(3), || pod.stats().in_flight == 0),
        "the pod's stream was not reset after the client left: {:?}",
        pod.stats()
    );
    assert_eq!(pod.stats().cancelled, 1, "{:?}", pod.stats());
    assert_still_serves(&activator);
}

// === 8. a queued client that hangs up ===

/// A client that hangs up while its request waits for the revision's only slot gives its queue
/// place up at once: the request never reaches the pod, and the next caller is served as soon
/// as the slot frees.
#[test]
fn a_client_that_disconnects_while_queued_gives_its_place_up() {
    let pod = pod();
    let activator = start(&pod, "container_concurrency = 1", "");
    let http2 = activator.http2;
    // Held at the pod until the test lets it go, whatever the steps below take.
    let slow = thread::spawn(move || {
        block_on(async move {
            let mut client = grpc::connect(http2, AUTHORITY).await.unwrap();
            let request = EchoRequest {
                delay_ms: grpc::HOLD,
                ..Default::default()
            };
            client.unary(request).await.map(|reply| reply.into_inner())
        })
    });
    assert!(
        eventually(Duration::from_secs(5), || pod.stats().in_flight == 1),
        "the slow call never reached the pod: {:?}",
        pod.stats()
    );

    let mut stream = h2_connect(activator.http2);
    stream.write_all(&get_headers(1)).unwrap();
    // Generous bounds: `eventually` returns as soon as the condition holds, and the call at
    // the pod is held, so a slow machine cannot turn them into a race.
    assert!(
        eventually(Duration::from_secs(10), || activator
            .metric_sum("kactivator_revision_queued", &[])
            == 1.0),
        "the second request was not queued:\n{}",
        activator.metrics()
    );
    let aborts = activator.metric_sum("kactivator_shard_client_aborts_total", &[]);
    drop(stream);
    assert!(
        eventually(Duration::from_secs(10), || activator
            .metric_sum("kactivator_revision_queued", &[])
            == 0.0),
        "the queue place was kept after the client left:\n{}",
        activator.metrics()
    );
    assert_eq!(
        pod.stats().in_flight,
        1,
        "the slow call should still be running"
    );
    assert!(
        activator.metric_sum("kactivator_shard_client_aborts_total", &[]) > aborts,
        "the hang-up was not counted as a client abort"
    );

    pod.release_held();
    let reply = slow.join().unwrap().expect("the slow call succeeds");
    assert_eq!(reply.backend, "pod");
    let started = Instant::now();
    let reply = block_on(async {
        let mut client = grpc::connect(activator.http2, AUTHORITY).await.unwrap();
        client.unary(EchoRequest::default()).await
    })
    .expect("the third call succeeds")
    .into_inner();
    assert_eq!(reply.backend, "pod");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the third call waited {:?}",
        started.elapsed()
    );
    let stats = pod.stats();
    assert_eq!(
        stats.requests, 2,
        "the abandoned request reached the pod: {stats:?}"
    );
    assert_eq!(stats.max_in_flight, 1, "{stats:?}");
    assert_still_serves(&activator);
}

// === idle connections: memory given back, and closed at the end of a drain ===

/// How long after its last stream an idle connection's memory is back with the system: the
/// connection gives its buffers back after 1 s (`RELEASE_IDLE_AFTER`), and the shard's sweep
/// (every 5 s) returns the freed pages.
const IDLE_MEMORY_BACK: Duration = Duration::from_secs(7);

/// Reads frames until the response of `stream` has ended; panics after 5 s.
fn until_stream_end(reader: &mut FrameReader, stream: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Some(frame) = reader.next(deadline) {
        if frame.stream == stream && frame.flags & END_STREAM != 0 {
            return;
        }
    }
    panic!("stream {stream} did not end");
}

/// An h2c connection that answered one stream and now sits idle.
fn idle_h2c(activator: &Activator) -> FrameReader {
    let mut reader = FrameReader::new(h2_connect(activator.http));
    reader.ack_settings();
    reader.stream.write_all(&get_headers(1)).unwrap();
    until_stream_end(&mut reader, 1);
    reader
}

/// An idle HTTP/2 connection gives its frame buffers (16 KiB out, 8 KiB in, 4 KiB of HPACK
/// scratch) and its stream tables back once idle, and the shard returns the pages: 300 idle
/// connections cost at most 18 KiB each after a few seconds (25 KiB each before the buffers
/// were given back), and at least 6 KiB each came back. Each then still answers a PING and serves another stream on the same
/// connection, and a real client's connection serves a 1 MiB call with new headers after its
/// idle time.
#[test]
fn an_idle_h2c_connection_gives_its_buffers_back_and_serves_on() {
    let pod = pod();
    let activator = start_args(&pod, "", "", &["--shards", "1"]);
    // A real client: one call, then idle on the same connection (one runtime for its life: the
    // connection's task lives on it).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut client = runtime
        .block_on(grpc::connect(activator.http2, AUTHORITY))
        .expect("connect");
    let first = runtime
        .block_on(client.unary(EchoRequest {
            payload: bytes::Bytes::from_static(b"before"),
            delay_ms: 0,
            reply_bytes: 0,
        }))
        .expect("the first call");
    assert_eq!(&first.get_ref().payload[..], b"before");
    drop(idle_h2c(&activator));
    thread::sleep(Duration::from_millis(300));
    let baseline = activator.rss_kib();
    let count = 300;
    let mut idle: Vec<FrameReader> = (0..count).map(|_| idle_h2c(&activator)).collect();
    let busy = activator.rss_kib();
    thread::sleep(IDLE_MEMORY_BACK);
    let settled = activator.rss_kib();
    let per_connection = (settled.saturating_sub(baseline)) * 1024 / count;
    eprintln!(
        "{count} idle h2c connections: RSS {baseline} KiB, {busy} KiB when opened, {settled} KiB \
         after {IDLE_MEMORY_BACK:?} ({per_connection} B each)"
    );
    // Measured: 25 KB each when opened; 14 KB (release build) and 15 KB (debug) once idle.
    assert!(
        per_connection <= 18 * 1024,
        "an idle h2c connection still holds {per_connection} B ({baseline} -> {busy} -> {settled} KiB)"
    );
    let given_back = busy.saturating_sub(settled) * 1024 / count;
    assert!(
        given_back >= 6 * 1024,
        "idle h2c connections gave back only {given_back} B each ({baseline} -> {busy} -> {settled} KiB)"
    );
    // Each answers a PING and serves a stream again, its buffers allocated anew.
    for (n, reader) in idle.iter_mut().enumerate() {
        reader
            .stream
            .write_all(&frame(PING, 0, 0, b"wake up!"))
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let frame = reader
                .next(deadline)
                .unwrap_or_else(|| panic!("connection {n}: no PING answer"));
            if frame.kind == PING {
                assert_eq!(frame.flags & ACK, ACK);
                assert_eq!(frame.payload, b"wake up!");
                break;
            }
        }
        reader.stream.write_all(&get_headers(3)).unwrap();
        until_stream_end(reader, 3);
    }
    // The real client's connection, idle as long: a call with a header new to the HPACK table
    // (Huffman-coded by the client) and a 1 MiB payload each way.
    let payload = bytes::Bytes::from(vec![7u8; 1 << 20]);
    let mut request = tonic::Request::new(EchoRequest {
        payload: payload.clone(),
        delay_ms: 0,
        reply_bytes: 0,
    });
    request
        .metadata_mut()
        .insert("x-after-idle", "buffers-given-back".parse().unwrap());
    let reply = runtime
        .block_on(client.unary(request))
        .expect("a call after the idle time");
    assert_eq!(reply.get_ref().payload, payload);
    assert_still_serves(&activator);
}

/// At the end of a drain, an HTTP/2 connection with no stream open is closed even if its
/// client never answers the PING of the graceful GOAWAY (a client that does not read): the
/// final GOAWAY (NO_ERROR) and the end of the connection, and the process exits. Before, it
/// waited for that answer forever and the process never exited.
#[test]
fn the_end_of_a_drain_closes_an_idle_h2c_connection_whose_client_never_answers() {
    let pod = pod();
    let mut activator = start_args(
        &pod,
        "",
        "",
        &["--shards", "2", "--drain-grace-seconds", "1"],
    );
    let mut silent = idle_h2c(&activator);
    let started = Instant::now();
    activator.send_signal("TERM");
    let status = activator.wait_exit(Duration::from_secs(15));
    assert_eq!(
        status,
        Some(0),
        "the process did not exit {:?} after SIGTERM with an idle h2c client connected: {}",
        started.elapsed(),
        activator.stderr()
    );
    let frames = silent.until_eof(Duration::from_secs(5));
    let goaways: Vec<&Frame> = frames.iter().filter(|frame| frame.kind == GOAWAY).collect();
    assert!(!goaways.is_empty(), "no GOAWAY: {frames:?}");
    assert!(
        goaways.iter().all(|goaway| goaway.code() == NO_ERROR),
        "{goaways:?}"
    );
}

/// At the connection cap, an idle h2c connection (no stream open) is an idle connection like an
/// HTTP/1 keep-alive one: when a new client fills the shard to its cap, the longest idle gives
/// way at once, with GOAWAY (NO_ERROR) and the end of the connection, and the others stay open
/// and serve.
#[test]
fn at_the_connection_cap_the_longest_idle_h2c_connection_gives_way_with_goaway() {
    let pod = pod();
    let activator = start_args(
        &pod,
        "",
        "max_connections_per_shard = 4\n",
        &["--shards", "1"],
    );
    // The h2c connection is the longest idle, then an HTTP/1 one, then another h2c one.
    let mut oldest = idle_h2c(&activator);
    thread::sleep(Duration::from_millis(50));
    let request = get("hello-00001", "/");
    let mut http1 = activator.connect();
    http1
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buffered = Vec::new();
    http1.write_all(request.as_bytes()).unwrap();
    let first = support::read_response(&mut http1, &mut buffered).expect("a response");
    assert_eq!(first.status, 200);
    thread::sleep(Duration::from_millis(50));
    let mut younger = idle_h2c(&activator);
    thread::sleep(Duration::from_millis(50));
    // A new client fills the cap: it is served at once, and the longest idle connection gives
    // way to the next.
    let started = Instant::now();
    let response = exchange(activator.http, request.as_bytes());
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a new client waited {:?} behind idle connections",
        started.elapsed()
    );
    let frames = oldest.until_eof(Duration::from_secs(5));
    let goaway = goaway(&frames).unwrap_or_else(|| panic!("no GOAWAY: {frames:?}"));
    assert_eq!(goaway.code(), NO_ERROR);
    assert!(activator.metric_sum("kactivator_shard_idle_evictions_total", &[]) >= 1.0);
    // The HTTP/1 connection and the younger h2c one still serve.
    http1.write_all(request.as_bytes()).unwrap();
    let again = support::read_response(&mut http1, &mut buffered).expect("the HTTP/1 connection");
    assert_eq!(again.status, 200);
    younger.stream.write_all(&get_headers(3)).unwrap();
    until_stream_end(&mut younger, 3);
}
