//! The queue-proxy registration client against a hand-written activator that records what
//! arrived on the wire.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kactivator_testkit::queue_proxy::QueueProxyClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// One request as received: the head's lines and the body.
#[derive(Debug)]
struct Received {
    head: Vec<String>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.iter().skip(1).find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// An activator that answers every request with `response` (`None`: never answers) and
/// reports each request; also counts connections.
async fn activator(
    response: Option<&'static str>,
) -> (
    SocketAddr,
    mpsc::UnboundedReceiver<Received>,
    Arc<AtomicUsize>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (sender, receiver) = mpsc::unbounded_channel();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            let sender = sender.clone();
            tokio::spawn(async move {
                let received = read_request(&mut stream).await;
                let _ = sender.send(received);
                match response {
                    Some(response) => {
                        let _ = stream.write_all(response.as_bytes()).await;
                        let _ = stream.shutdown().await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(60)).await,
                }
            });
        }
    });
    (addr, receiver, connections)
}

async fn read_request(stream: &mut TcpStream) -> Received {
    let mut raw = Vec::new();
    let mut buffer = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = raw.windows(4).position(|window| window == b"\r\n\r\n") {
            break at;
        }
        let read = stream.read(&mut buffer).await.unwrap();
        assert_ne!(
            read, 0,
            "the client closed before finishing its request head"
        );
        raw.extend_from_slice(&buffer[..read]);
    };
    let head: Vec<String> = String::from_utf8(raw[..head_end].to_vec())
        .unwrap()
        .split("\r\n")
        .map(str::to_owned)
        .collect();
    let mut received = Received {
        head,
        body: raw[head_end + 4..].to_vec(),
    };
    let length: usize = received
        .header("content-length")
        .expect("the body has a length")
        .parse()
        .unwrap();
    while received.body.len() < length {
        let read = stream.read(&mut buffer).await.unwrap();
        assert_ne!(read, 0, "the client closed before finishing its body");
        received.body.extend_from_slice(&buffer[..read]);
    }
    received
}

const ACCEPTED: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 22\r\n\r\n{\"status\":\"accepted\"}\n";

fn client(activator: SocketAddr) -> QueueProxyClient {
    QueueProxyClient::new(
        activator,
        "default",
        "hello-00001",
        "hello-pod-1",
        "127.0.0.2",
    )
}

#[tokio::test]
async fn send_posts_what_a_queue_proxy_posts() {
    let (addr, mut received, _) = activator(Some(ACCEPTED)).await;
    let answer = client(addr).send("not-ready").await;
    assert_eq!(answer, (200, "{\"status\":\"accepted\"}\n".to_owned()));

    let request = received.recv().await.unwrap();
    assert_eq!(request.head[0], "POST /api/v1/pod-registration HTTP/1.1");
    assert_eq!(request.header("user-agent"), Some("knative-queue-proxy"));
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("connection"), Some("close"));
    assert_eq!(request.header("host"), Some(addr.to_string().as_str()));
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["pod_name"], "hello-pod-1");
    assert_eq!(body["pod_ip"], "127.0.0.2");
    assert_eq!(body["namespace"], "default");
    assert_eq!(body["revision"], "hello-00001");
    assert_eq!(body["event_type"], "not-ready");
    assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test]
async fn send_raw_sends_exactly_what_it_is_given() {
    let (addr, mut received, _) = activator(Some(
        "HTTP/1.1 401 Unauthorized\r\nContent-Length: 40\r\n\r\nInvalid User-Agent for pod registration\n",
    ))
    .await;
    let answer = client(addr).send_raw(None, &b"{oops"[..]).await.unwrap();
    assert_eq!(answer.0, 401);
    assert!(answer.1.starts_with("Invalid User-Agent"), "{answer:?}");
    let request = received.recv().await.unwrap();
    assert_eq!(request.header("user-agent"), None);
    assert_eq!(request.body, b"{oops");

    client(addr)
        .send_raw(Some("curl/8.0"), Vec::new())
        .await
        .unwrap();
    let request = received.recv().await.unwrap();
    assert_eq!(request.header("user-agent"), Some("curl/8.0"));
    assert_eq!(request.header("content-length"), Some("0"));
}

#[tokio::test]
async fn a_failed_registration_is_not_retried() {
    let (addr, mut received, connections) = activator(Some(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
    ))
    .await;
    assert_eq!(client(addr).send("ready").await, (503, String::new()));
    received.recv().await.unwrap();
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_silent_activator_times_out() {
    let (addr, _received, _) = activator(None).await;
    let client = client(addr).with_timeout(Duration::from_millis(200));
    let error = client
        .send_raw(Some("knative-queue-proxy"), client.body("ready"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
}

#[test]
fn send_blocking_needs_no_runtime_of_the_caller() {
    let (addr_sender, addr_receiver) = std::sync::mpsc::channel();
    let activator_thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let (addr, mut received, _) = activator(Some(ACCEPTED)).await;
                addr_sender.send(addr).unwrap();
                received.recv().await.unwrap()
            })
    });
    let addr = addr_receiver.recv().unwrap();
    assert_eq!(client(addr).send_blocking("draining").0, 200);
    let request = activator_thread.join().unwrap();
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["event_type"], "draining");
}
