//! The demo's pods: small HTTP/1.1 servers on loopback, each answering as a Knative pod behind
//! its queue-proxy would, enough for what `kactivator demo` prints to try. Built from what the
//! binary links anyway (tokio's sockets, hyper's HTTP/1 server, as the admin server), so the
//! release binary carries no test backend.
//!
//! | request | answer |
//! |---|---|
//! | `K-Network-Probe: queue`, any path | 200 `queue`: a queue-proxy's readiness answer; the activator's prober asks for it and quarantines a pod that fails it |
//! | `/headers` | the request line and headers as the pod received them, one per line: what the activator changed |
//! | any other | 200 `hello from <pod>`: which pod answered |
//!
//! Every answer carries `X-Knative-Revision-Name` and `X-Knative-Revision-Namespace`, as a
//! queue-proxy's do; the activator checks them to notice a pod address handed to another revision.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::poll_fn;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::body::{Body as _, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use kactivator_api::headers::{NETWORK_PROBE, SERVING_REVISION_NAME, SERVING_REVISION_NAMESPACE};
use kactivator_api::probe;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Pause after a failed accept (typically out of file descriptors), so that the loop does not
/// spin while the condition lasts.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// One demo pod: its name and what its queue-proxy stamps on every answer.
#[derive(Debug)]
struct Pod {
    name: String,
    revision_name: HeaderValue,
    revision_namespace: HeaderValue,
}

/// The running pods. Dropping it stops them: every connection closes and the thread is joined.
#[derive(Debug)]
pub struct Pods {
    addrs: Vec<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Pods {
    /// Where the pods listen, in the order of their names (`<revision>-pod-0`, `-1`, …).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The thread may have ended already (its runtime failed); nothing then waits.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // A panic there has been logged by the panic hook already.
            let _ = thread.join();
        }
    }
}

/// Starts `count` pods of revision `namespace/revision`, named `<revision>-pod-<index>`, each on
/// its own port of 127.0.0.1, all served by one thread with its own runtime (the pods stand for
/// other machines and share nothing with the activator). The ports are bound before this
/// returns, so the pods accept as soon as the activator is told about them.
///
/// # Errors
///
/// A port that cannot be bound, a runtime or thread that cannot start, or a name that cannot
/// be sent as a header value.
pub fn spawn(namespace: &str, revision: &str, count: u16) -> io::Result<Pods> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut pods = Vec::with_capacity(usize::from(count));
    let mut addrs = Vec::with_capacity(usize::from(count));
    for index in 0..count {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let listener = {
            // Registering with the runtime's reactor needs its context.
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        addrs.push(listener.local_addr()?);
        let pod = Pod {
            name: format!("{revision}-pod-{index}"),
            revision_name: header_value(revision)?,
            revision_namespace: header_value(namespace)?,
        };
        pods.push((listener, Arc::new(pod)));
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("demo-pods".into())
        .spawn(move || {
            runtime.block_on(async move {
                for (listener, pod) in pods {
                    tokio::spawn(accept(listener, pod));
                }
                // A dropped sender stops the pods too.
                let _ = stopped.await;
            });
            // Dropping the runtime cancels every connection task, closing its socket.
            drop(runtime);
        })?;
    Ok(Pods {
        addrs,
        stop: Some(stop),
        thread: Some(thread),
    })
}

fn header_value(value: &str) -> io::Result<HeaderValue> {
    HeaderValue::from_str(value).map_err(|error| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{value:?} cannot be sent as a header value: {error}"),
        )
    })
}

async fn accept(listener: TcpListener, pod: Arc<Pod>) {
    loop {
        match listener.accept().await {
            Ok((stream, _peer)) => {
                tokio::spawn(serve_connection(stream, Arc::clone(&pod)));
            }
            Err(error) => {
                tracing::warn!(pod = %pod.name, "demo pod failed to accept: {error}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
            }
        }
    }
}

async fn serve_connection(stream: TcpStream, pod: Arc<Pod>) {
    // Small answers leave at once, as from Go's queue-proxy, which disables Nagle's algorithm.
    let _ = stream.set_nodelay(true);
    let serving = Arc::clone(&pod);
    let service = hyper::service::service_fn(move |request| {
        let pod = Arc::clone(&serving);
        async move { Ok::<_, Infallible>(answer(request, &pod).await) }
    });
    if let Err(error) = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(pod = %pod.name, "demo pod connection ended: {error}");
    }
}

async fn answer(request: Request<Incoming>, pod: &Pod) -> Response<String> {
    let is_queue_probe = request
        .headers()
        .get(NETWORK_PROBE)
        .is_some_and(|value| value == probe::QUEUE);
    let text = if is_queue_probe {
        // The queue-proxy answers its probe itself, on any path, without the user container.
        probe::QUEUE.to_owned()
    } else if request.uri().path() == "/headers" {
        describe(&request, &pod.name)
    } else {
        format!("hello from {}\n", pod.name)
    };
    // The body is read to its end before the answer, so that the connection stays reusable
    // whatever the client uploads.
    drain(request.into_body()).await;
    let mut response = Response::new(text);
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(SERVING_REVISION_NAME, pod.revision_name.clone());
    headers.insert(SERVING_REVISION_NAMESPACE, pod.revision_namespace.clone());
    response
}

/// `GET /headers HTTP/1.1 (received by hello-pod-1)` and then `name: value` per header, as hyper
/// holds them (names in lower case, repeated names together).
fn describe(request: &Request<Incoming>, pod: &str) -> String {
    let mut text = format!(
        "{} {} {:?} (received by {pod})\n",
        request.method(),
        request.uri(),
        request.version()
    );
    for (name, value) in request.headers() {
        // Writing to a String cannot fail.
        let _ = writeln!(
            text,
            "{name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        );
    }
    text
}

/// Reads a request body to its end without keeping it. A body that fails (the client left) ends
/// the reading: the answer then goes nowhere anyway.
async fn drain(mut body: Incoming) {
    while let Some(Ok(_frame)) = poll_fn(|context| Pin::new(&mut body).poll_frame(context)).await {}
}
