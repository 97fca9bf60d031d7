//! `Upgrade` through the proxy: a real websocket client and server, and a raw upgraded stream
//! whose half-close must travel in both directions. Upgraded connections outlive the revision
//! timeout (★ upstream cuts them at `timeoutSeconds`).

mod support;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kactivator_testkit::backend::{self, BackendConfig, EOF_MARKER};
use support::{revision, Activator};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

#[test]
fn websocket_echo_through_the_activator() {
    let backend = backend::spawn(BackendConfig::named("ws")).unwrap();
    // Quarantine off: no prober keeps a connection to the pod, so the count below is the
    // websocket's alone.
    let activator = Activator::start(&format!(
        "{}{}",
        support::NO_QUARANTINE,
        revision("default", "ws", &[backend.addr()], "")
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut request = format!("ws://{}/ws", activator.http)
            .into_client_request()
            .unwrap();
        request
            .headers_mut()
            .insert("Host", "ws.default.svc.cluster.local".parse().unwrap());
        let (mut socket, response) = tokio_tungstenite::connect_async(request)
            .await
            .expect("websocket handshake through the proxy");
        assert_eq!(response.status(), 101);
        for i in 0..50 {
            let text = format!("message {i}");
            socket
                .send(Message::Text(text.clone().into()))
                .await
                .unwrap();
            let echoed = socket.next().await.unwrap().unwrap();
            assert_eq!(echoed, Message::Text(text.into()));
        }
        let big = vec![7u8; 300_000];
        socket
            .send(Message::Binary(big.clone().into()))
            .await
            .unwrap();
        assert_eq!(
            socket.next().await.unwrap().unwrap(),
            Message::Binary(big.into())
        );
        socket.close(None).await.unwrap();
        // The server answers the close; the stream then ends.
        while let Some(message) = socket.next().await {
            if message.is_err() {
                break;
            }
        }
    });
    assert!(support::eventually(Duration::from_secs(5), || backend
        .stats()
        .connections_open
        == 0));
}

#[test]
fn upgraded_streams_propagate_half_close_both_ways() {
    let backend = backend::spawn(BackendConfig::named("raw")).unwrap();
    let activator = Activator::start(&revision("default", "raw", &[backend.addr()], ""));
    let (mut stream, head) = support::open_upgrade(&activator, "raw");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    stream.write_all(b"abc").unwrap();
    // Our FIN must reach the pod, which answers with a marker and its own FIN.
    stream.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).unwrap();
    let mut expected = b"abc".to_vec();
    expected.extend_from_slice(EOF_MARKER);
    assert_eq!(rest, expected);
}

#[test]
fn upgraded_connections_are_not_cut_by_the_request_timeout() {
    let backend = backend::spawn(BackendConfig::named("long")).unwrap();
    let activator = Activator::start(&revision(
        "default",
        "long",
        &[backend.addr()],
        "timeout_seconds = 1",
    ));
    let (mut stream, head) = support::open_upgrade(&activator, "long");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // Outlive the 1 s revision timeout, then use the stream.
    std::thread::sleep(Duration::from_millis(1500));
    stream.write_all(b"still here").unwrap();
    let mut echoed = [0u8; 10];
    stream.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"still here");
}
