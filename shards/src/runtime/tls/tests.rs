//! The TLS stream against rustls' own blocking stream (`rustls::StreamOwned` on a thread of its
//! own): a peer whose record handling is not ours.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream as StdTcpStream};
use std::sync::Arc;
use std::thread;

use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, IntoPollIo, Splitable};
use monoio::net::TcpStream;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{accept, connect, READ_SMALL};
use crate::runtime::stream::testing::reactor;

/// A CA and a server certificate it signed for `name`.
struct Pki {
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn pki(name: &str) -> Pki {
    static CAS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    // A name of its own: a client looks its issuer up by name.
    let serial = CAS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("test CA {serial}"));
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    Pki {
        ca: ca.der().clone(),
        chain: vec![leaf.der().clone()],
        key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    }
}

fn server_config(pki: &Pki, alpn: &[&[u8]]) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(pki.chain.clone(), pki.key.clone_key())
    .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

fn client_config(ca: &CertificateDer<'static>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    Arc::new(
        ClientConfig::builder_with_provider(
            Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        )
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// rustls' blocking client on its own thread, connected to `addr`; `talk` runs on its stream.
fn blocking_client<T: Send + 'static>(
    addr: std::net::SocketAddr,
    config: Arc<ClientConfig>,
    name: &'static str,
    talk: impl FnOnce(&mut rustls::StreamOwned<rustls::ClientConnection, StdTcpStream>) -> T
        + Send
        + 'static,
) -> thread::JoinHandle<T> {
    thread::spawn(move || {
        let socket = StdTcpStream::connect(addr).unwrap();
        let session =
            rustls::ClientConnection::new(config, ServerName::try_from(name).unwrap()).unwrap();
        let mut stream = rustls::StreamOwned::new(session, socket);
        talk(&mut stream)
    })
}

async fn accepted(listener: &TcpListener) -> TcpStream {
    let (socket, _) = listener.accept().unwrap();
    socket.set_nonblocking(true).unwrap();
    TcpStream::from_std(socket).unwrap()
}

#[test]
fn requests_and_answers_cross_both_ways_with_the_halves_apart_and_bodies_across_records() {
    let pki = pki("pod.test");
    let server = server_config(&pki, &[]);
    let client = client_config(&pki.ca);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // 1 MiB and change: many records, reads that fill the small buffer and grow it.
    let body: Vec<u8> = (0..(1 << 20) + 12_345).map(|i| (i % 251) as u8).collect();
    let sent = body.clone();
    let peer = blocking_client(addr, client, "pod.test", move |stream| {
        stream.write_all(b"ping").unwrap();
        stream.write_all(&sent).unwrap();
        stream.flush().unwrap();
        let mut echoed = vec![0u8; sent.len()];
        stream.read_exact(&mut echoed).unwrap();
        assert!(echoed == sent, "the echo came back changed");
        stream.conn.send_close_notify();
        stream.flush().unwrap();
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).unwrap();
        rest
    });
    reactor().block_on(async move {
        let tls = accept(server, accepted(&listener).await).await.unwrap();
        let (mut reader, mut writer) = tls.into_split();
        let mut head = vec![0u8; 4];
        let mut got = 0;
        while got < 4 {
            let (n, buf) = reader.read(head.split_off(got)).await;
            let n = n.unwrap();
            assert!(n > 0);
            head.truncate(got);
            head.extend_from_slice(&buf[..n]);
            got += n;
        }
        assert_eq!(&head, b"ping");
        // Echo with the halves apart: the write half sends what the read half took, while the
        // read half waits for more.
        let mut total = 0;
        let mut biggest = 0;
        loop {
            let (n, buf) = reader.read(Vec::with_capacity(64 * 1024)).await;
            let n = n.unwrap();
            if n == 0 {
                break;
            }
            biggest = biggest.max(n);
            total += n;
            let (written, _) = writer.write_all(buf).await;
            written.unwrap();
        }
        assert_eq!(total, body.len(), "every byte arrived, then close_notify");
        assert!(
            biggest > READ_SMALL,
            "a streaming body is read in full records ({biggest} at most)"
        );
        writer.shutdown().await.unwrap();
    });
    assert!(
        peer.join().unwrap().is_empty(),
        "close_notify answered, nothing after it"
    );
}

/// Both sides of a handshake on loopback, ours each: the client trusting `ca` and naming `name`.
fn handshake_both(
    server: Arc<ServerConfig>,
    ca: &CertificateDer<'static>,
    name: &'static str,
) -> (
    std::io::Result<super::ClientTls>,
    std::io::Result<super::ServerTls>,
) {
    let client = client_config(ca);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    reactor().block_on(async move {
        let dialed = TcpStream::connect_addr(addr).await.unwrap();
        let socket = accepted(&listener).await;
        futures_util::future::join(
            connect(client, ServerName::try_from(name).unwrap(), dialed),
            accept(server, socket),
        )
        .await
    })
}

#[test]
fn a_client_that_does_not_trust_the_certificate_fails_the_handshake_on_both_sides() {
    let pki_ = pki("pod.test");
    let other = pki("pod.test");
    let (client, server) = handshake_both(server_config(&pki_, &[]), &other.ca, "pod.test");
    let client = client.err().expect("an untrusted certificate is refused");
    assert!(
        client.to_string().contains("UnknownIssuer"),
        "the client names why: {client}"
    );
    let server = server.err().expect("the server sees the client's alert");
    assert!(
        server.to_string().contains("UnknownCA") || server.to_string().contains("alert"),
        "{server}"
    );
}

#[test]
fn a_certificate_for_another_name_is_refused() {
    let pki = pki("pod.test");
    let (client, _) = handshake_both(server_config(&pki, &[]), &pki.ca, "other.test");
    let error = client.err().expect("the name is checked");
    assert!(error.to_string().contains("not valid for name"), "{error}");
}

#[test]
fn garbage_instead_of_a_client_hello_is_an_error_not_a_hang() {
    let pki = pki("pod.test");
    let server = server_config(&pki, &[]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = thread::spawn(move || {
        let mut socket = StdTcpStream::connect(addr).unwrap();
        socket
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        let _ = socket.read_to_end(&mut answer);
        answer
    });
    reactor().block_on(async move {
        let error = accept(server, accepted(&listener).await)
            .await
            .err()
            .expect("plain HTTP is not a handshake");
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData, "{error}");
    });
    let answer = peer.join().unwrap();
    assert_eq!(
        answer.first(),
        Some(&0x15),
        "the client is sent an alert record before the close"
    );
}

#[test]
fn a_handshake_cut_halfway_ends_with_the_connection() {
    let pki = pki("pod.test");
    let server = server_config(&pki, &[]);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = thread::spawn(move || {
        // The start of a ClientHello record, then the close.
        let mut socket = StdTcpStream::connect(addr).unwrap();
        socket
            .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .unwrap();
    });
    reactor().block_on(async move {
        let error = accept(server, accepted(&listener).await)
            .await
            .err()
            .expect("half a handshake is not one");
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof, "{error}");
    });
    peer.join().unwrap();
}

#[test]
fn a_peer_that_closes_without_close_notify_ends_the_stream() {
    let pki = pki("pod.test");
    let server = server_config(&pki, &[]);
    let client = client_config(&pki.ca);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = blocking_client(addr, client, "pod.test", |stream| {
        stream.write_all(b"last words").unwrap();
        stream.flush().unwrap();
        stream.sock.shutdown(std::net::Shutdown::Both).unwrap();
    });
    reactor().block_on(async move {
        let mut tls = accept(server, accepted(&listener).await).await.unwrap();
        let mut seen = Vec::new();
        loop {
            let (n, buf) = tls.read(Vec::with_capacity(1024)).await;
            let n = n.unwrap();
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
        }
        assert_eq!(seen, b"last words");
    });
    peer.join().unwrap();
}

#[test]
fn the_poll_style_stream_keeps_what_was_read_before_the_change() {
    let pki = pki("pod.test");
    let server = server_config(&pki, &[b"h2", b"http/1.1"]);
    let mut client = (*client_config(&pki.ca)).clone();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = blocking_client(addr, Arc::new(client), "pod.test", |stream| {
        // Two records in one flight: the first is read before the change, the second after.
        stream.write_all(b"first|").unwrap();
        stream.write_all(b"second").unwrap();
        stream.flush().unwrap();
        let mut answer = Vec::new();
        // To the close_notify: the server's shutdown finds the connection still open.
        stream.read_to_end(&mut answer).unwrap();
        answer
    });
    reactor().block_on(async move {
        let mut tls = accept(server, accepted(&listener).await).await.unwrap();
        assert_eq!(tls.session().alpn_protocol(), Some(&b"h2"[..]));
        let (n, buf) = tls.read(Vec::with_capacity(6)).await;
        assert_eq!(&buf[..n.unwrap()], b"first|");
        let mut polled = tls.into_poll_io().unwrap();
        let mut rest = [0u8; 6];
        polled.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"second");
        polled.write_all(b"done!").await.unwrap();
        polled.flush().await.unwrap();
        polled.shutdown().await.unwrap();
    });
    assert_eq!(peer.join().unwrap(), b"done!");
}
