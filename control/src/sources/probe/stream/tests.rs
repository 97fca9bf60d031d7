//! Probes over TLS against real TLS pods on loopback: rustls' server with the configuration a
//! TLS data port serves (`crate::tls::server_config`, ALPN `h2` and `http/1.1` offered), the
//! prober's client the one `crate::tls::PodTls` builds for the data plane.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kactivator_api::RevisionKey;
use kactivator_shards::routing::Protocol;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::super::tests::{NAMESPACE, REVISION};
use super::super::{probe_on, Connection, ProbeResult};
use super::*;
use crate::tls::tests::{ca, Ca};
use crate::tls::{ClientAuth, Identity, PodTls, PodTrust, TlsSettings, SERVER_ALPN};

const TIMEOUT: Duration = Duration::from_secs(5);
const SERVER_NAME: &str = "data-plane.knative.dev";
const REQUIRED: &str = "kn-user-default";
const KEEP_ALIVE_QUEUE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nqueue";

fn key() -> RevisionKey {
    RevisionKey::new(NAMESPACE, REVISION).unwrap()
}

/// A revision's TLS to its pods as `[revisions.tls]` loads it: trusting `ca`, verifying
/// [`SERVER_NAME`] and requiring [`REQUIRED`].
fn pod_tls(ca: &Ca) -> PodTls {
    PodTls::new(
        "ca.pem",
        ca.cert.pem().as_bytes(),
        SERVER_NAME,
        Some(REQUIRED),
    )
    .unwrap()
}

/// What a TLS test pod saw of a handshake it completed.
#[derive(Debug)]
struct Handshake {
    server_name: Option<String>,
    alpn: Option<Vec<u8>>,
    version: Option<rustls::ProtocolVersion>,
}

/// A pod serving TLS with a certificate `issuer` issues for `names`, answering every probe
/// 200 `queue` in `protocol` (HTTP/1.1 keep-alive, or HTTP/2 by prior knowledge inside TLS);
/// each handshake it completes is reported, and the TCP connections it accepted counted.
async fn tls_pod(
    issuer: &Ca,
    names: &[&str],
    protocol: Protocol,
) -> (
    SocketAddr,
    Arc<AtomicUsize>,
    mpsc::UnboundedReceiver<Handshake>,
) {
    let (chain, key) = issuer.issue(names);
    let identity = Identity::from_pem("pod", chain.as_bytes(), key.as_bytes()).unwrap();
    let alpn: Vec<String> = SERVER_ALPN.map(str::to_string).to_vec();
    let config = crate::tls::server_config(
        &[identity],
        &ClientAuth::None,
        &alpn,
        &TlsSettings::default(),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let (handshakes, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
            let (acceptor, handshakes) = (acceptor.clone(), handshakes.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends it here, with its alert.
                let Ok(mut stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let (_, session) = stream.get_ref();
                let _ = handshakes.send(Handshake {
                    server_name: session.server_name().map(str::to_string),
                    alpn: session.alpn_protocol().map(<[u8]>::to_vec),
                    version: session.protocol_version(),
                });
                match protocol {
                    Protocol::Http1 => answer_http1(&mut stream).await,
                    Protocol::H2c => answer_h2(stream).await,
                }
            });
        }
    });
    (addr, accepted, seen)
}

/// 200 `queue` to every request head, on one keep-alive connection.
async fn answer_http1(stream: &mut tokio_rustls::server::TlsStream<tokio::net::TcpStream>) {
    let mut pending = Vec::new();
    let mut buffer = [0u8; 1024];
    loop {
        while let Some(end) = pending.windows(4).position(|window| window == b"\r\n\r\n") {
            pending.drain(..end + 4);
            if stream.write_all(KEEP_ALIVE_QUEUE).await.is_err() || stream.flush().await.is_err() {
                return;
            }
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => pending.extend_from_slice(&buffer[..read]),
        }
    }
}

/// 200 `queue` (a queue-proxy's probe answer) to every HTTP/2 request.
async fn answer_h2(stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>) {
    let Ok(mut connection) = h2::server::handshake(stream).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = connection.accept().await {
        let mut body = request.into_body();
        while let Some(Ok(data)) = body.data().await {
            let _ = body.flow_control().release_capacity(data.len());
        }
        let response = http::Response::builder().status(200).body(()).unwrap();
        if let Ok(mut stream) = respond.send_response(response, false) {
            let _ = stream.send_data(Bytes::from_static(b"queue"), true);
        }
    }
}

/// Three probes in a row with keep-alive over `tls`; each result and whether a connection
/// came back.
async fn three_probes(
    addr: SocketAddr,
    protocol: Protocol,
    tls: &PodTls,
) -> Vec<(ProbeResult, bool)> {
    let upstream = tls.upstream(false);
    let mut kept: Option<Connection> = None;
    let mut results = Vec::new();
    for _ in 0..3 {
        let (result, connection) =
            probe_on(kept, addr, &key(), protocol, Some(&upstream), TIMEOUT, true).await;
        results.push((result, connection.is_some()));
        kept = connection;
    }
    results
}

#[tokio::test]
async fn a_tls_pod_is_probed_in_either_protocol_with_the_revisions_client_on_one_kept_connection() {
    let issuer = ca("pods");
    let tls = pod_tls(&issuer);
    for protocol in [Protocol::Http1, Protocol::H2c] {
        let (addr, accepted, mut handshakes) =
            tls_pod(&issuer, &[REQUIRED, SERVER_NAME], protocol).await;
        assert_eq!(
            three_probes(addr, protocol, &tls).await,
            vec![(ProbeResult::Healthy, true); 3],
            "{protocol:?}"
        );
        // One connection, one handshake, kept over TLS for the next probes.
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "{protocol:?}");
        let handshake = handshakes.recv().await.unwrap();
        assert!(handshakes.try_recv().is_err());
        // As the data plane dials the pods: the name sent, TLS 1.3, no ALPN (HTTP/2 by prior
        // knowledge inside TLS, though the pod offers h2).
        assert_eq!(handshake.server_name.as_deref(), Some(SERVER_NAME));
        assert_eq!(handshake.version, Some(rustls::ProtocolVersion::TLSv1_3));
        assert_eq!(handshake.alpn, None, "{protocol:?}");
    }
}

#[tokio::test]
async fn a_handshake_refused_is_an_unhealthy_probe_saying_tls_and_why() {
    let issuer = ca("pods");
    let stranger = ca("someone else");
    let tls = pod_tls(&issuer);
    let untrusted = PodTls::trusting(
        &PodTrust::from_roots(&[], "no CA in the trust bundle yet").unwrap(),
        SERVER_NAME,
        None,
    )
    .unwrap();
    let cases: [(&Ca, &[&str], &PodTls, &str); 4] = [
        (
            &issuer,
            &[REQUIRED, "models.example"],
            &tls,
            "TLS handshake: invalid peer certificate: certificate not valid for name \"data-plane.knative.dev\"",
        ),
        (
            &issuer,
            &[SERVER_NAME],
            &tls,
            "TLS handshake: san \"kn-user-default\" does not have a matching name in [\"data-plane.knative.dev\"]",
        ),
        (
            &stranger,
            &[REQUIRED, SERVER_NAME],
            &tls,
            "TLS handshake: invalid peer certificate: UnknownIssuer",
        ),
        (
            &issuer,
            &[REQUIRED, SERVER_NAME],
            &untrusted,
            "TLS handshake: no CA in the trust bundle yet",
        ),
    ];
    for (pod_issuer, names, tls, said) in cases {
        for protocol in [Protocol::Http1, Protocol::H2c] {
            let (addr, _, mut handshakes) = tls_pod(pod_issuer, names, protocol).await;
            let upstream = tls.upstream(false);
            let (result, kept) =
                probe_on(None, addr, &key(), protocol, Some(&upstream), TIMEOUT, true).await;
            let ProbeResult::Unhealthy(reason) = &result else {
                panic!("{names:?} over {protocol:?}: {result:?}");
            };
            assert!(reason.starts_with(said), "{names:?}: {reason}");
            assert_eq!(result.label(), "unhealthy");
            assert!(kept.is_none());
            // Nothing reached the pod's HTTP: no handshake finished on its side.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(handshakes.try_recv().is_err(), "{names:?}");
        }
    }
}

#[tokio::test]
async fn a_pod_that_speaks_no_tls_fails_a_tls_probe_and_a_kept_plain_connection_is_not_used() {
    // A plain keep-alive pod answering `queue` to every request head, and 400 and the close
    // to what is not HTTP (a ClientHello), as HTTP servers do.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                while let Ok(read) = stream.read(&mut buffer).await {
                    if read == 0 {
                        return;
                    }
                    if !buffer.starts_with(b"GET ") {
                        let _ = stream
                            .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                            .await;
                        return;
                    }
                    if stream.write_all(KEEP_ALIVE_QUEUE).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let (result, kept) = probe_on(None, addr, &key(), Protocol::Http1, None, TIMEOUT, true).await;
    assert_eq!(result, ProbeResult::Healthy);
    assert!(kept.is_some());
    // The revision is dialled over TLS now: the plain connection is not the pod's TLS one.
    let tls = pod_tls(&ca("pods")).upstream(false);
    let (result, kept) = probe_on(
        kept,
        addr,
        &key(),
        Protocol::Http1,
        Some(&tls),
        TIMEOUT,
        true,
    )
    .await;
    let ProbeResult::Unhealthy(reason) = &result else {
        panic!("{result:?}");
    };
    assert!(reason.starts_with("TLS handshake: "), "{reason}");
    assert!(kept.is_none());
}
