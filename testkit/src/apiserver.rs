//! A real Kubernetes API server for the Kubernetes end-to-end tests: kube-apiserver v1.20.2
//! with a private etcd, one pair per [`ApiServer`], driven through the `kubectl` CLI.
//!
//! `scripts/kube-apiserver.sh` builds the apiserver into `target/kube/bin/kube-apiserver` and
//! installs etcd and kubectl; [`ApiServer::start`] panics with that advice when a piece is
//! missing, so a Kubernetes test never passes by skipping itself.
//!
//! What the server is, and is not:
//! - the secure port only, on 127.0.0.1, with a serving certificate from a private CA
//!   ([`ApiServer::ca_cert`]);
//! - RBAC authorization; the admin is a static token whose user is in `system:masters`;
//! - service-account tokens through TokenRequest ([`ApiServer::service_account_token`]), signed
//!   with a key pair made for this server;
//! - no controllers: nothing reconciles Deployments into pods, nothing creates service-account
//!   tokens, and a deleted namespace stays `Terminating` (there is no namespace controller). The
//!   `ServiceAccount` admission plugin, which needs the token controller, is off; the others
//!   are the 1.20 defaults, so `NamespaceLifecycle` still refuses objects in a namespace that
//!   does not exist. The `kubernetes` Service gets no endpoints (a loopback address would not
//!   validate).
//!
//! Each server lives in its own directory under `$TMPDIR/kactivator-kube/`, which holds the
//! keys, the kubeconfigs, etcd's data and the two logs (`etcd.log`, `apiserver.log`). Dropping
//! the [`ApiServer`] kills both processes and removes the directory, except while a test is
//! panicking: then the directory (logs included) is kept and its path printed. A test process
//! killed before it could drop its servers leaves processes behind; the next
//! [`ApiServer::start`] in any process kills them and removes their directory.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use crate::ports::free_port;
use crate::raw_http1;

/// Environment variable naming the kube-apiserver binary, instead of the one the script builds.
pub const APISERVER_BINARY_ENV: &str = "KACTIVATOR_KUBE_APISERVER";

/// How long etcd may take to answer `/health`.
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the apiserver may take to answer `/readyz` (about 3.5 s on two idle cores, several
/// times that with a test suite running next to it).
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a CRD may take to be served after it is created.
const CRD_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between two readiness checks.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Each kubectl request gives up after this long (`--request-timeout`), so a test against a
/// killed server fails instead of hanging.
const KUBECTL_REQUEST_TIMEOUT: &str = "30s";

/// Lines of a log quoted in a failure message.
const LOG_TAIL_LINES: usize = 40;

/// Attempts at starting etcd and the apiserver when a port turned out to be taken: ports come
/// from [`free_port`], which can only say that a port was free a moment ago.
const START_ATTEMPTS: usize = 3;

/// The service-account issuer, as in a cluster with the default domain.
const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Service ClusterIPs come from here; it overlaps neither loopback nor [`crate::podnet`].
const SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/16";

/// The admin's bearer token, accepted by `--token-auth-file`.
const ADMIN_TOKEN: &str = "kactivator-testkit-admin";

/// The project's own minimal Knative Serving objects: namespace `knative-serving` and the
/// Revision CRD.
const KNATIVE_SERVING_YAML: &str = include_str!("../k8s/knative-serving.yaml");

/// A running kube-apiserver and its etcd. Dropping it stops both (see the module docs).
#[derive(Debug)]
pub struct ApiServer {
    /// The private directory: keys, kubeconfigs, etcd's data, logs.
    dir: PathBuf,
    binary: PathBuf,
    /// The apiserver's arguments, kept so that a restart runs exactly the same server.
    args: Vec<String>,
    port: u16,
    ca_cert: PathBuf,
    admin_kubeconfig: PathBuf,
    etcd: Child,
    /// `None` between [`ApiServer::kill_apiserver`] and [`ApiServer::restart_apiserver`].
    apiserver: Option<Child>,
    /// Numbers the kubeconfigs written by [`ApiServer::kubeconfig_with_token`].
    kubeconfigs: AtomicUsize,
}

/// Why one attempt at starting did not produce a ready server.
struct StartError {
    /// A process exited because its port was taken: worth another try on other ports.
    port_taken: bool,
    message: String,
}

// === impl ApiServer ===

impl ApiServer {
    /// Starts etcd and kube-apiserver on free loopback ports and waits until `/readyz` answers
    /// `ok` and the `default` namespace exists. Takes about 4 s on two idle cores: etcd half a
    /// second, then the apiserver, which spends most of its time building its OpenAPI spec
    /// and its bootstrap objects.
    ///
    /// # Panics
    ///
    /// When the apiserver binary, etcd, kubectl or openssl is missing (the message says to run
    /// `scripts/kube-apiserver.sh`), and when a process does not become ready in time (the
    /// message quotes the end of its log).
    pub fn start() -> ApiServer {
        reclaim_orphans_once();
        let binary = apiserver_binary();
        if !binary.is_file() {
            panic!(
                "no kube-apiserver at {}: run `bash scripts/kube-apiserver.sh` (it builds \
                 kube-apiserver v1.20.2 there and installs etcd and kubectl), or point {} at \
                 a kube-apiserver binary",
                binary.display(),
                APISERVER_BINARY_ENV
            );
        }
        let dir = create_run_dir();
        let keys = Keys::generate(&dir);
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            match ApiServer::try_start(&dir, &binary, &keys) {
                Ok(server) => return server,
                Err(error) if error.port_taken => last_error = error.message,
                Err(error) => {
                    let _ = fs::remove_dir_all(dir.join("etcd"));
                    panic!("{}", error.message)
                }
            }
            let _ = fs::remove_dir_all(dir.join("etcd"));
        }
        panic!("{last_error} (a port was taken {START_ATTEMPTS} times in a row)")
    }

    fn try_start(dir: &Path, binary: &Path, keys: &Keys) -> Result<ApiServer, StartError> {
        let etcd_client_port = free_port();
        let etcd_peer_port = free_port();
        let port = free_port();
        let mut etcd = start_etcd(dir, etcd_client_port, etcd_peer_port)?;
        if let Err(error) = wait_for_etcd(&mut etcd, dir, etcd_client_port) {
            stop(&mut etcd);
            return Err(error);
        }
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(&admin_kubeconfig, port, &keys.ca_cert, ADMIN_TOKEN);
        let args = apiserver_args(etcd_client_port, port, keys);
        let apiserver = spawn_apiserver(binary, &args, dir).and_then(|mut apiserver| {
            match wait_ready(&mut apiserver, dir, port) {
                Ok(()) => Ok(apiserver),
                Err(error) => {
                    stop(&mut apiserver);
                    Err(error)
                }
            }
        });
        match apiserver {
            Ok(apiserver) => Ok(ApiServer {
                dir: dir.to_owned(),
                binary: binary.to_owned(),
                args,
                port,
                ca_cert: keys.ca_cert.clone(),
                admin_kubeconfig,
                etcd,
                apiserver: Some(apiserver),
                kubeconfigs: AtomicUsize::new(0),
            }),
            Err(error) => {
                stop(&mut etcd);
                Err(error)
            }
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The secure port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA certificate (PEM) that signed the serving certificate.
    pub fn ca_cert(&self) -> &Path {
        &self.ca_cert
    }

    /// The admin's bearer token (user `admin`, group `system:masters`).
    pub fn admin_token(&self) -> &str {
        ADMIN_TOKEN
    }

    /// A kubeconfig with the server, its CA and the admin token: for kube-rs clients
    /// (`KUBECONFIG=<this>`) and for kubectl.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// This server's private directory, where `etcd.log` and `apiserver.log` are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The apiserver's log (stdout and stderr).
    pub fn apiserver_log(&self) -> PathBuf {
        self.dir.join("apiserver.log")
    }

    /// etcd's log (stdout and stderr).
    pub fn etcd_log(&self) -> PathBuf {
        self.dir.join("etcd.log")
    }

    /// A `kubectl` command set up for this server as `kubeconfig`'s user, with a discovery
    /// cache of this server's own and a request timeout; add the arguments and run it.
    pub fn kubectl_command(&self, kubeconfig: &Path) -> Command {
        kubectl_command(&self.dir, kubeconfig)
    }

    /// Runs kubectl as the admin.
    ///
    /// # Panics
    ///
    /// When kubectl fails; the message has the arguments, the exit status and stderr.
    pub fn kubectl<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = self.kubectl_command(&self.admin_kubeconfig);
        command.args(args);
        run_expect(&mut command, None)
    }

    /// Runs kubectl as the admin and returns whatever happened.
    pub fn try_kubectl<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.try_kubectl_as(&self.admin_kubeconfig, args, None)
    }

    /// Runs kubectl as the admin with `input` on its stdin (for `-f -`).
    ///
    /// # Panics
    ///
    /// When kubectl fails, like [`ApiServer::kubectl`].
    pub fn kubectl_with_input<I, S>(&self, args: I, input: &str) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = self.kubectl_command(&self.admin_kubeconfig);
        command.args(args);
        run_expect(&mut command, Some(input))
    }

    /// Runs kubectl as `kubeconfig`'s user (see [`ApiServer::kubeconfig_with_token`]), with
    /// `input` on its stdin when given, and returns whatever happened.
    pub fn try_kubectl_as<I, S>(&self, kubeconfig: &Path, args: I, input: Option<&str>) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = self.kubectl_command(kubeconfig);
        command.args(args);
        run(&mut command, input)
    }

    /// `kubectl apply -f -` of `yaml`, as the admin.
    ///
    /// # Panics
    ///
    /// When the server rejects any object.
    pub fn apply_yaml(&self, yaml: &str) {
        self.kubectl_with_input(["apply", "-f", "-"], yaml);
    }

    /// `kubectl delete -f -` of `yaml`, as the admin; objects that do not exist are fine.
    /// Does not wait for finalizers, which nothing here would run (a namespace stays
    /// `Terminating`).
    ///
    /// # Panics
    ///
    /// When the server refuses a deletion.
    pub fn delete_yaml(&self, yaml: &str) {
        self.kubectl_with_input(
            ["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
            yaml,
        );
    }

    /// Creates namespace `knative-serving` and the project's own minimal CRD for
    /// `revisions.serving.knative.dev/v1` (testkit/k8s/knative-serving.yaml: namespaced,
    /// `spec` and `status` keep unknown fields, status subresource), and returns once
    /// Revisions can be listed. Safe to call again.
    ///
    /// # Panics
    ///
    /// When the server rejects the objects or does not serve Revisions in time.
    pub fn install_knative_crds(&self) {
        self.apply_yaml(KNATIVE_SERVING_YAML);
        self.install_crd(
            "revisions.serving.knative.dev",
            "revisions.serving.knative.dev",
        );
    }

    /// Installs KEDA's HTTP add-on's own CRDs (`crate::keda`), HTTPScaledObjects and
    /// InterceptorRoutes, as its 0.15 has them, and returns once both can be listed. Safe to
    /// call again.
    ///
    /// # Panics
    ///
    /// When the server rejects a CRD or does not serve its objects in time.
    pub fn install_keda_http_crds(&self) {
        self.install_http_scaled_object_crd();
        self.kubectl_with_input(
            ["apply", "--validate=false", "-f", "-"],
            crate::keda::INTERCEPTOR_ROUTE_CRD,
        );
        self.install_crd(
            "interceptorroutes.http.keda.sh",
            "interceptorroutes.http.keda.sh",
        );
    }

    /// The add-on's CRDs, the InterceptorRoute one as 0.16 declares it
    /// ([`crate::keda::interceptor_route_crd_0_16`]).
    pub fn install_keda_http_crds_0_16(&self) {
        self.install_http_scaled_object_crd();
        self.kubectl_with_input(
            ["apply", "--validate=false", "-f", "-"],
            &crate::keda::interceptor_route_crd_0_16(),
        );
        self.install_crd(
            "interceptorroutes.http.keda.sh",
            "interceptorroutes.http.keda.sh",
        );
    }

    /// Installs only the HTTPScaledObject CRD, as the add-on before 0.14 had.
    pub fn install_http_scaled_object_crd(&self) {
        // The CRD carries CEL rules (`x-kubernetes-validations`: exactly one of `port` and
        // `portName`), which came with Kubernetes 1.25: kubectl's own schema check of this
        // 1.20 server refuses the field, and the server drops it. So the check is skipped;
        // kactivator refuses what those rules refuse when it reads an object (keda::object).
        self.kubectl_with_input(
            ["apply", "--validate=false", "-f", "-"],
            crate::keda::HTTP_SCALED_OBJECT_CRD,
        );
        self.install_crd(
            "httpscaledobjects.http.keda.sh",
            "httpscaledobjects.http.keda.sh",
        );
    }

    /// Waits for CRD `crd` to be established, then for `resource` to list.
    fn install_crd(&self, crd: &str, resource: &str) {
        // `Established` comes first; kubectl's discovery can lag a moment behind it, so the
        // proof is a list going through.
        self.kubectl([
            "wait",
            "--for=condition=Established",
            &format!("--timeout={}s", CRD_READY_TIMEOUT.as_secs()),
            &format!("customresourcedefinition/{crd}"),
        ]);
        let deadline = Instant::now() + CRD_READY_TIMEOUT;
        loop {
            let listed = self.try_kubectl(["get", resource, "-A"]);
            if listed.status.success() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{resource} not served {:?} after the CRD was established: {}",
                    CRD_READY_TIMEOUT,
                    String::from_utf8_lossy(&listed.stderr).trim()
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// A token for service account `namespace/name` from the TokenRequest API (what a pod's
    /// projected token is), valid for an hour. The service account must exist.
    ///
    /// # Panics
    ///
    /// When the request fails (no such service account, for instance).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        // `kubectl create --raw` rather than `kubectl create token`, which kubectl 1.20 (the
        // fallback the script installs) does not have.
        let request = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": { "expirationSeconds": 3600 },
        });
        let output = self.kubectl_with_input(
            [
                "create",
                "--raw",
                &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
                "-f",
                "-",
            ],
            &request.to_string(),
        );
        let response: serde_json::Value =
            serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
                panic!(
                    "TokenRequest for {namespace}/{name} answered with no JSON ({error}): {}",
                    String::from_utf8_lossy(&output.stdout)
                )
            });
        match response["status"]["token"].as_str() {
            Some(token) if !token.is_empty() => token.to_owned(),
            _ => panic!("TokenRequest for {namespace}/{name} returned no token: {response}"),
        }
    }

    /// Writes a kubeconfig for this server (with its CA) that authenticates with `token`, and
    /// returns its path, inside [`ApiServer::dir`].
    pub fn kubeconfig_with_token(&self, token: &str) -> PathBuf {
        let number = self.kubeconfigs.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("token-{number}.kubeconfig"));
        write_kubeconfig(&path, self.port, &self.ca_cert, token);
        path
    }

    /// Kills the apiserver (SIGKILL, as a crash), leaving etcd and its data alone. Does
    /// nothing when it is not running.
    pub fn kill_apiserver(&mut self) {
        if let Some(mut apiserver) = self.apiserver.take() {
            stop(&mut apiserver);
        }
    }

    /// Starts the apiserver again, with the same port and arguments, on the same etcd, and
    /// waits until it is ready; kills it first if it is running.
    ///
    /// # Panics
    ///
    /// When it does not become ready (the message quotes the end of its log).
    pub fn restart_apiserver(&mut self) {
        self.kill_apiserver();
        let mut apiserver = spawn_apiserver(&self.binary, &self.args, &self.dir)
            .unwrap_or_else(|error| panic!("restarting the apiserver: {}", error.message));
        if let Err(error) = wait_ready(&mut apiserver, &self.dir, self.port) {
            stop(&mut apiserver);
            panic!("restarting the apiserver: {}", error.message);
        }
        self.apiserver = Some(apiserver);
    }

    /// A second apiserver on the same etcd, on another port, as the admin: for changes made
    /// while the first is down (what a client of the first then has to catch up on). Stopped
    /// when dropped.
    ///
    /// # Panics
    ///
    /// When it does not become ready (the message quotes the end of the shared log).
    pub fn spare_apiserver(&self) -> SpareApiServer {
        let port = free_port();
        let args: Vec<String> = self
            .args
            .iter()
            .map(|arg| {
                if arg.starts_with("--secure-port=") {
                    format!("--secure-port={port}")
                } else {
                    arg.clone()
                }
            })
            .collect();
        let kubeconfig = self.dir.join(format!("spare-{port}.kubeconfig"));
        write_kubeconfig(&kubeconfig, port, &self.ca_cert, ADMIN_TOKEN);
        let mut child = spawn_apiserver(&self.binary, &args, &self.dir)
            .unwrap_or_else(|error| panic!("starting a spare apiserver: {}", error.message));
        if let Err(error) = wait_ready_as(&mut child, &self.dir, port, &kubeconfig) {
            stop(&mut child);
            panic!("starting a spare apiserver: {}", error.message);
        }
        SpareApiServer {
            dir: self.dir.clone(),
            kubeconfig,
            child,
        }
    }

    fn stop_processes(&mut self) {
        self.kill_apiserver();
        stop(&mut self.etcd);
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.stop_processes();
        if std::thread::panicking() {
            // The logs are what explains the failure; etcd's data is only bulk.
            let _ = fs::remove_dir_all(self.dir.join("etcd"));
            eprintln!(
                "kept {} (etcd.log, apiserver.log) after a failure",
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A second apiserver of an [`ApiServer`] (see [`ApiServer::spare_apiserver`]).
#[derive(Debug)]
pub struct SpareApiServer {
    dir: PathBuf,
    kubeconfig: PathBuf,
    child: Child,
}

impl SpareApiServer {
    /// `kubectl apply -f -` of `yaml` through this server, as the admin.
    ///
    /// # Panics
    ///
    /// When the server rejects any object.
    pub fn apply_yaml(&self, yaml: &str) {
        run_expect(
            kubectl_command(&self.dir, &self.kubeconfig).args(["apply", "-f", "-"]),
            Some(yaml),
        );
    }
}

impl Drop for SpareApiServer {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

// === starting the processes ===

/// Where the apiserver binary is: $KACTIVATOR_KUBE_APISERVER, else
/// `<target>/kube/bin/kube-apiserver`, where `<target>` is $CARGO_TARGET_DIR (relative to the
/// workspace, as the script takes it) or the workspace's `target`.
fn apiserver_binary() -> PathBuf {
    if let Some(binary) = std::env::var_os(APISERVER_BINARY_ENV) {
        return PathBuf::from(binary);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives inside the workspace");
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(target) => workspace.join(target),
        None => workspace.join("target"),
    };
    target.join("kube/bin/kube-apiserver")
}

/// The parent of every server's directory.
fn runs_root() -> PathBuf {
    std::env::temp_dir().join("kactivator-kube")
}

/// A fresh directory `<runs_root>/<pid>-<n>`; the pid says whose it is (see
/// [`reclaim_orphans_once`]).
fn create_run_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let root = runs_root();
    fs::create_dir_all(&root)
        .unwrap_or_else(|error| panic!("creating {}: {error}", root.display()));
    loop {
        let dir = root.join(format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match fs::create_dir(&dir) {
            Ok(()) => return dir,
            // Left by an earlier process with the same pid.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => panic!("creating {}: {error}", dir.display()),
        }
    }
}

/// The server's key material, made with openssl.
#[derive(Debug)]
struct Keys {
    ca_cert: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    service_account_key: PathBuf,
    service_account_public_key: PathBuf,
    token_file: PathBuf,
}

impl Keys {
    /// A CA, a serving certificate for 127.0.0.1 and localhost signed by it, the
    /// service-account signing key pair, and the static token file. P-256 keys: generating
    /// them takes milliseconds, RSA ones up to a second.
    fn generate(dir: &Path) -> Keys {
        let p256 = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1";
        openssl(
            dir,
            &format!(
                "req -x509 -nodes -days 3650 {p256} -subj /CN=kactivator-testkit-ca \
                 -addext keyUsage=critical,keyCertSign,cRLSign -keyout ca.key -out ca.crt"
            ),
        );
        openssl(
            dir,
            &format!(
                "req -x509 -nodes -days 3650 {p256} -subj /CN=kube-apiserver \
                 -CA ca.crt -CAkey ca.key \
                 -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
                 -addext basicConstraints=critical,CA:FALSE \
                 -addext keyUsage=critical,digitalSignature \
                 -addext extendedKeyUsage=serverAuth \
                 -keyout serving.key -out serving.crt"
            ),
        );
        openssl(
            dir,
            "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 \
             -out service-account.key",
        );
        openssl(
            dir,
            "pkey -pubout -in service-account.key -out service-account.pub",
        );
        // token,user,uid,"groups"
        let token_file = dir.join("tokens.csv");
        let tokens = format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n");
        fs::write(&token_file, tokens)
            .unwrap_or_else(|error| panic!("writing {}: {error}", token_file.display()));
        Keys {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("serving.crt"),
            serving_key: dir.join("serving.key"),
            service_account_key: dir.join("service-account.key"),
            service_account_public_key: dir.join("service-account.pub"),
            token_file,
        }
    }
}

/// Runs openssl in `dir` with `args`, words separated by whitespace (none has a space).
fn openssl(dir: &Path, args: &str) {
    let mut command = Command::new("openssl");
    command.current_dir(dir).args(args.split_whitespace());
    run_expect(&mut command, None);
}

fn apiserver_args(etcd_client_port: u16, port: u16, keys: &Keys) -> Vec<String> {
    let path = |path: &Path| path.display().to_string();
    vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_client_port}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", path(&keys.serving_cert)),
        format!("--tls-private-key-file={}", path(&keys.serving_key)),
        format!("--token-auth-file={}", path(&keys.token_file)),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
        format!(
            "--service-account-signing-key-file={}",
            path(&keys.service_account_key)
        ),
        format!(
            "--service-account-key-file={}",
            path(&keys.service_account_public_key)
        ),
        format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
        // Needs the token controller, which does not run here.
        "--disable-admission-plugins=ServiceAccount".into(),
        // The `kubernetes` Service's endpoints would be 127.0.0.1, which Endpoints
        // validation rejects: the reconciler would only fill the log with errors.
        "--endpoint-reconciler-type=none".into(),
        "--profiling=false".into(),
    ]
}

fn spawn_apiserver(binary: &Path, args: &[String], dir: &Path) -> Result<Child, StartError> {
    spawn_logged(Command::new(binary).args(args), &dir.join("apiserver.log")).map_err(|error| {
        StartError {
            port_taken: false,
            message: format!("starting {}: {error}", binary.display()),
        }
    })
}

/// Waits for `/readyz` and then for the namespace `default`, which the apiserver creates
/// itself right after it starts serving.
fn wait_ready(apiserver: &mut Child, dir: &Path, port: u16) -> Result<(), StartError> {
    wait_ready_as(apiserver, dir, port, &dir.join("admin.kubeconfig"))
}

/// [`wait_ready`] through `kubeconfig` (a spare server's, on its own port).
fn wait_ready_as(
    apiserver: &mut Child,
    dir: &Path,
    port: u16,
    kubeconfig: &Path,
) -> Result<(), StartError> {
    let deadline = Instant::now() + APISERVER_READY_TIMEOUT;
    let log = dir.join("apiserver.log");
    let mut last_answer = String::from("no answer yet");
    for check in [["get", "--raw", "/readyz"], ["get", "namespace", "default"]] {
        loop {
            if let Some(status) = apiserver.try_wait().ok().flatten() {
                return Err(exited("kube-apiserver", status, &log));
            }
            // kubectl only once the port listens: a refused connection is cheaper to see.
            let listening = TcpStream::connect_timeout(
                &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                POLL_INTERVAL,
            )
            .is_ok();
            if listening {
                let answer = run(kubectl_command(dir, kubeconfig).args(check), None);
                if answer.status.success() {
                    break;
                }
                last_answer = String::from_utf8_lossy(&answer.stderr).trim().to_owned();
            }
            if Instant::now() >= deadline {
                return Err(StartError {
                    port_taken: false,
                    message: format!(
                        "kube-apiserver on port {port} not ready after \
                         {APISERVER_READY_TIMEOUT:?} (`kubectl {}`: {last_answer}); last lines \
                         of {}:\n{}",
                        check.join(" "),
                        log.display(),
                        log_tail(&log)
                    ),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
    Ok(())
}

/// kubectl for the server in `dir` as `kubeconfig`'s user: see [`ApiServer::kubectl_command`].
fn kubectl_command(dir: &Path, kubeconfig: &Path) -> Command {
    let mut command = Command::new("kubectl");
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--cache-dir={}",
            dir.join("kubectl-cache").display()
        ))
        .arg(format!("--request-timeout={KUBECTL_REQUEST_TIMEOUT}"))
        .env_remove("KUBECONFIG");
    command
}

fn start_etcd(dir: &Path, client_port: u16, peer_port: u16) -> Result<Child, StartError> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut command = Command::new(etcd_binary());
    command
        .arg("--name=testkit")
        .arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls={client}"))
        .arg(format!("--advertise-client-urls={client}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=testkit={peer}"))
        .arg("--initial-cluster-state=new")
        .arg("--logger=zap");
    spawn_logged(&mut command, &dir.join("etcd.log")).map_err(|error| StartError {
        port_taken: false,
        message: format!(
            "starting etcd: {error}; run `bash scripts/kube-apiserver.sh`, which installs it"
        ),
    })
}

/// `etcd` on PATH, else Debian's `/usr/bin/etcd` (PATH in a test may be minimal).
fn etcd_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("etcd"))
            .find(|candidate| candidate.is_file())
    });
    on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

fn wait_for_etcd(etcd: &mut Child, dir: &Path, client_port: u16) -> Result<(), StartError> {
    let deadline = Instant::now() + ETCD_READY_TIMEOUT;
    let log = dir.join("etcd.log");
    loop {
        if let Some(status) = etcd.try_wait().ok().flatten() {
            return Err(exited("etcd", status, &log));
        }
        if etcd_healthy(client_port) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(StartError {
                port_taken: false,
                message: format!(
                    "etcd on port {client_port} not healthy after {ETCD_READY_TIMEOUT:?}; \
                     last lines of {}:\n{}",
                    log.display(),
                    log_tail(&log)
                ),
            });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Whether etcd's `/health` says `"health":"true"`; a plain HTTP/1.0 GET is all it takes.
fn etcd_healthy(client_port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, client_port));
    let Ok(mut connection) = raw_http1::Connection::connect_with_timeout(addr, POLL_INTERVAL)
    else {
        return false;
    };
    let _ = connection.set_idle_timeout(Duration::from_secs(1));
    connection
        .send(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_ok()
        && connection
            .read_response()
            .is_ok_and(|response| response.text().contains("\"health\":\"true\""))
}

/// Starts `command` with stdout and stderr appended to `log`.
fn spawn_logged(command: &mut Command, log: &Path) -> io::Result<Child> {
    let file = fs::OpenOptions::new().create(true).append(true).open(log)?;
    command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
}

/// The error for a process that exited while it should have been starting.
fn exited(what: &str, status: ExitStatus, log: &Path) -> StartError {
    let tail = log_tail(log);
    StartError {
        port_taken: tail.contains("address already in use"),
        message: format!(
            "{what} exited during startup ({status}); last lines of {}:\n{tail}",
            log.display()
        ),
    }
}

/// SIGKILLs `child` and reaps it; one that already exited is only reaped.
fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn write_kubeconfig(path: &Path, port: u16, ca_cert: &Path, token: &str) {
    // JSON is YAML, so kubectl, client-go and kube-rs all read it.
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": "testkit",
            "cluster": {
                "server": format!("https://127.0.0.1:{port}"),
                "certificate-authority": ca_cert,
            },
        }],
        "users": [{ "name": "testkit", "user": { "token": token } }],
        "contexts": [{
            "name": "testkit",
            "context": { "cluster": "testkit", "user": "testkit", "namespace": "default" },
        }],
        "current-context": "testkit",
    });
    fs::write(path, kubeconfig.to_string())
        .unwrap_or_else(|error| panic!("writing {}: {error}", path.display()));
}

// === running commands ===

/// Runs `command` to completion with `input` on its stdin (or none) and captures its output.
///
/// # Panics
///
/// When the program cannot be started: every program run here is one the script installs.
fn run(command: &mut Command, input: Option<&str>) -> Output {
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|error| {
        panic!(
            "cannot run {:?} ({error}); run `bash scripts/kube-apiserver.sh`, which installs \
             kubectl, etcd and openssl",
            command.get_program()
        )
    });
    // Written from another thread, so a child that answers before reading all of its input
    // cannot deadlock against us.
    let writer = input.map(|input| {
        let mut stdin = child.stdin.take().expect("stdin was piped above");
        let input = input.to_owned();
        std::thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        })
    });
    let output = child
        .wait_with_output()
        .unwrap_or_else(|error| panic!("waiting for {:?}: {error}", command.get_program()));
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    output
}

/// [`run`], panicking with the command, its exit status and its stderr when it fails.
fn run_expect(command: &mut Command, input: Option<&str>) -> Output {
    let output = run(command, input);
    if !output.status.success() {
        let args: Vec<_> = command.get_args().map(OsStr::to_string_lossy).collect();
        panic!(
            "`{} {}` failed ({}):\n{}{}",
            command.get_program().to_string_lossy(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
    }
    output
}

/// The last [`LOG_TAIL_LINES`] lines of `log`.
fn log_tail(log: &Path) -> String {
    let Ok(bytes) = fs::read(log) else {
        return format!("({} unreadable)", log.display());
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

// === orphans ===

/// Once per process: kills the etcd and apiserver processes of servers whose test process is
/// gone (killed before it could drop them) and removes their directories.
fn reclaim_orphans_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = fs::read_dir(runs_root()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(owner) = name
                .to_str()
                .and_then(|name| name.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            // A live owner (or a new process that reuses its pid) keeps its directory.
            if owner == std::process::id() || Path::new(&format!("/proc/{owner}")).exists() {
                continue;
            }
            let dir = entry.path();
            kill_processes_mentioning(&dir);
            let _ = fs::remove_dir_all(&dir);
        }
    });
}

/// SIGKILLs every process whose command line contains `dir`: the etcd (`--data-dir=<dir>/…`)
/// and apiserver (`--tls-cert-file=<dir>/…`) of one server, and nothing else, since `dir` is
/// private to that server.
fn kill_processes_mentioning(dir: &Path) {
    let needle = dir.as_os_str().as_encoded_bytes();
    let Ok(processes) = fs::read_dir("/proc") else {
        return;
    };
    for process in processes.flatten() {
        let Some(pid) = process
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = fs::read(process.path().join("cmdline")) else {
            continue;
        };
        if cmdline.windows(needle.len()).any(|window| window == needle) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}
