//! A gigabyte in each direction through the proxy, with memory staying flat: bodies stream with
//! backpressure and are never buffered whole.

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kactivator_testkit::backend::{self, BackendConfig};
use kactivator_testkit::pattern::{find_pattern_mismatch, pattern_checksum, pattern_frame};
use kactivator_testkit::raw_http1;
use support::{revision, Activator};

const GIB: u64 = 1 << 30;
/// Growth of the proxy's resident memory we tolerate while a gigabyte passes through.
const RSS_GROWTH_LIMIT_KIB: u64 = 16 * 1024;

/// Samples the activator's RSS until stopped; returns the peak.
fn watch_rss(activator: &Activator) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let pid = activator.pid();
    let flag = stop.clone();
    let handle = std::thread::spawn(move || {
        let peak = AtomicU64::new(0);
        while !flag.load(Ordering::Relaxed) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let rss: u64 = status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0);
            peak.fetch_max(rss, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        }
        peak.load(Ordering::Relaxed)
    });
    (stop, handle)
}

#[test]
fn a_gigabyte_upload_streams_with_flat_memory() {
    let backend = backend::spawn(BackendConfig::named("sink")).unwrap();
    let activator = Activator::start(&revision("default", "big", &[backend.addr()], ""));
    let baseline = activator.rss_kib();
    let (stop, watcher) = watch_rss(&activator);

    let mut stream = activator.connect();
    let head = format!("POST /sink HTTP/1.1\r\nHost: big.default.svc.cluster.local\r\nContent-Length: {GIB}\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut offset = 0u64;
    while offset < GIB {
        let frame = pattern_frame(offset, (GIB - offset).min(64 * 1024) as usize);
        stream.write_all(&frame).unwrap();
        offset += frame.len() as u64;
    }
    let mut buffered = Vec::new();
    let response = support::read_response(&mut stream, &mut buffered).unwrap();
    stop.store(true, Ordering::Relaxed);
    let peak = watcher.join().unwrap();

    assert_eq!(response.status, 200, "{}", response.text());
    let sink: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(sink["bytes"].as_u64(), Some(GIB));
    assert_eq!(
        sink["checksum"].as_u64(),
        Some(pattern_checksum(GIB)),
        "the body arrived intact and in order"
    );
    eprintln!("kactivator RSS: {baseline} KiB before, {peak} KiB peak");
    assert!(
        peak < baseline + RSS_GROWTH_LIMIT_KIB,
        "RSS grew from {baseline} KiB to {peak} KiB"
    );
}

#[test]
fn a_gigabyte_download_streams_with_flat_memory() {
    let backend = backend::spawn(BackendConfig::named("source")).unwrap();
    let activator = Activator::start(&revision("default", "big", &[backend.addr()], ""));
    let baseline = activator.rss_kib();
    let (stop, watcher) = watch_rss(&activator);

    let mut stream = activator.connect();
    // Chunked from the pod, re-chunked to us: the decoder and encoder both run for a GiB.
    let request = format!("GET /chunked/{GIB} HTTP/1.1\r\nHost: big.default.svc.cluster.local\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut connection = raw_http1::Connection::new(stream).expect("a read timeout");
    let head = connection
        .read_head()
        .unwrap_or_else(|error| panic!("the response head: {error}"));
    let head = String::from_utf8_lossy(&head.raw).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{}", head);
    assert!(head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked"));
    // Decode chunks as they come and check every byte against the pattern.
    let mut offset = 0u64;
    while let Some(chunk) = connection
        .read_chunk()
        .unwrap_or_else(|error| panic!("the chunk at offset {offset}: {error}"))
    {
        assert_eq!(
            find_pattern_mismatch(offset, &chunk),
            None,
            "corrupt byte near offset {offset}"
        );
        offset += chunk.len() as u64;
    }
    stop.store(true, Ordering::Relaxed);
    let peak = watcher.join().unwrap();
    assert_eq!(offset, GIB);
    eprintln!("kactivator RSS: {baseline} KiB before, {peak} KiB peak");
    assert!(
        peak < baseline + RSS_GROWTH_LIMIT_KIB,
        "RSS grew from {baseline} KiB to {peak} KiB"
    );
}
