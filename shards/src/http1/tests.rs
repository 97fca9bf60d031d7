//! The HTTP/1 front over a stream that is not plain TCP: one that, as an encrypting stream
//! will, takes no raw writes, so every byte an answer or a relayed response carries goes
//! through the reactor.

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use monoio::io::Splitable;

use super::client::ClientWriter;
use super::connection::{serve_connection, Served};
use super::upgrade::splice_upgraded;
use crate::metrics::ShardStats;
use crate::runtime::buffer::InBuf;
use crate::runtime::control_link::ControlLink;
use crate::runtime::stream::testing::{loopback_pair, reactor, Sealed};
use crate::runtime::stream::ByteStream;
use crate::shard::{Shard, ShardSettings};

/// A client on its own thread: sends `request`, reads to the end, gives back what it read.
fn client(
    mut socket: std::net::TcpStream,
    request: &'static [u8],
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        socket.write_all(request).unwrap();
        let mut received = Vec::new();
        socket.read_to_end(&mut received).unwrap();
        received
    })
}

#[test]
fn the_front_answers_over_a_stream_that_takes_no_raw_writes() {
    reactor().block_on(async {
        let (_control, _from_shards) = ControlLink::channel();
        let stats = Arc::from(vec![crossbeam_utils::CachePadded::new(ShardStats::new(0))]);
        let shard = Rc::new(Shard::new(
            0,
            Arc::new(ShardSettings::default()),
            stats,
            Vec::new(),
            _control,
        ));
        let (ours, theirs) = loopback_pair().await;
        let peer = theirs.local_addr().unwrap();
        let written = Rc::new(Cell::new(0));
        // Two requests on one connection, the second its last: both answered by the activator
        // itself (no revision named).
        let reading = client(
            theirs,
            b"GET /a HTTP/1.1\r\nHost: example\r\n\r\nGET /b HTTP/1.1\r\nHost: example\r\nConnection: close\r\n\r\n",
        );
        let served = serve_connection(shard, Sealed::new(ours, written.clone()), peer).await;
        assert!(matches!(served, Served::Closed));
        let received = reading.join().unwrap();
        let text = String::from_utf8_lossy(&received);
        assert_eq!(
            text.matches("HTTP/1.1 404 Not Found\r\n").count(),
            2,
            "both requests answered: {text}"
        );
        assert!(text.contains("revision.serving.knative.dev"), "{text}");
        assert_eq!(
            written.get(),
            received.len(),
            "every byte went through the stream's own writes"
        );
    });
}

#[test]
fn an_upgraded_connection_is_copied_both_ways_over_any_stream() {
    reactor().block_on(async {
        let (client_ours, mut client) = loopback_pair().await;
        let (pod_ours, mut pod) = loopback_pair().await;
        let to_client = Rc::new(Cell::new(0));
        let to_pod = Rc::new(Cell::new(0));
        let client_stream = Sealed::new(client_ours, to_client.clone());
        let client_socket = client_stream.socket();
        let (mut client_reader, client_writer) = client_stream.into_split();
        let mut client_writer = ClientWriter::new(client_writer, client_socket);
        let (mut pod_reader, mut pod_writer) = Sealed::new(pod_ours, to_pod.clone()).into_split();
        // Bytes already read past the 101 on each side go first.
        let mut client_inbuf = InBuf::default();
        let mut pod_inbuf = InBuf::default();
        client_inbuf.extend_for_test(b"early ");
        pod_inbuf.extend_for_test(b"first ");

        let peers = std::thread::spawn(move || {
            client
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            pod.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            client.write_all(b"ping").unwrap();
            client.shutdown(Shutdown::Write).unwrap();
            let mut at_pod = Vec::new();
            pod.read_to_end(&mut at_pod).unwrap();
            pod.write_all(b"pong").unwrap();
            pod.shutdown(Shutdown::Write).unwrap();
            let mut at_client = Vec::new();
            client.read_to_end(&mut at_client).unwrap();
            (at_pod, at_client)
        });
        splice_upgraded(
            &mut client_reader,
            &mut client_inbuf,
            &mut client_writer,
            &mut pod_reader,
            &mut pod_inbuf,
            &mut pod_writer,
        )
        .await;
        let (at_pod, at_client) = peers.join().unwrap();
        assert_eq!(
            at_pod, b"early ping",
            "the client's half-close reached the pod"
        );
        assert_eq!(
            at_client, b"first pong",
            "the pod's half-close reached the client"
        );
        assert_eq!((to_pod.get(), to_client.get()), (10, 10));
    });
}
