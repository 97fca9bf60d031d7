//! The Kubernetes test harness against itself: a real kube-apiserver (built by
//! `scripts/kube-apiserver.sh`) serves the Knative CRD, accepts every manifest in deploy/,
//! enforces deploy/rbac.yaml on the activator's service account, keeps its objects across an
//! apiserver restart, and takes pod addresses from a PodNet.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Instant;

use kactivator_testkit::apiserver::ApiServer;
use kactivator_testkit::podnet::PodNet;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives inside the workspace")
        .to_owned()
}

fn start() -> ApiServer {
    let started = Instant::now();
    let server = ApiServer::start();
    eprintln!(
        "apiserver ready at {} in {:?}",
        server.url(),
        started.elapsed()
    );
    server
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).expect("kubectl printed JSON")
}

const REVISION: &str = r#"
apiVersion: serving.knative.dev/v1
kind: Revision
metadata:
  name: hello-00001
  namespace: default
  labels:
    serving.knative.dev/configuration: hello
spec:
  containerConcurrency: 10
  timeoutSeconds: 300
  containers:
    - image: example.com/hello
      ports:
        - name: http1
          containerPort: 8080
  somethingNewer: kept
status:
  observedGeneration: 99
"#;

#[test]
fn revisions_round_trip_with_status_written_through_its_subresource() {
    let server = start();
    server.install_knative_crds();
    server.apply_yaml(REVISION);

    let revision =
        json(&server.kubectl(["get", "rev", "hello-00001", "-n", "default", "-o", "json"]));
    assert_eq!(revision["spec"]["containerConcurrency"], 10);
    assert_eq!(revision["spec"]["timeoutSeconds"], 300);
    assert_eq!(
        revision["spec"]["containers"][0]["ports"][0]["containerPort"],
        8080
    );
    assert_eq!(
        revision["spec"]["somethingNewer"], "kept",
        "spec keeps unknown fields"
    );
    assert!(
        revision["status"]["observedGeneration"].is_null(),
        "status is not written by a create when the status subresource is on: {revision}"
    );

    // What a reconciler's UpdateStatus does: the whole object, PUT to /status.
    let mut updated = revision.clone();
    updated["status"] = serde_json::json!({
        "observedGeneration": 1,
        "conditions": [{ "type": "Ready", "status": "True", "reason": "Serving" }],
    });
    server.kubectl_with_input(
        [
            "replace",
            "--raw",
            "/apis/serving.knative.dev/v1/namespaces/default/revisions/hello-00001/status",
            "-f",
            "-",
        ],
        &updated.to_string(),
    );
    let listed = stdout(&server.kubectl(["get", "revisions", "-A"]));
    assert!(
        listed.contains("hello-00001") && listed.contains("True") && listed.contains("Serving"),
        "the printer columns show the Ready condition:\n{listed}"
    );
    let revision =
        json(&server.kubectl(["get", "rev", "hello-00001", "-n", "default", "-o", "json"]));
    assert_eq!(revision["status"]["conditions"][0]["reason"], "Serving");
    assert_eq!(revision["spec"]["somethingNewer"], "kept");
}

/// API versions in deploy/ that the 1.20 test server predates, each with the version it serves
/// the same type under: the same fields and the same validation (the API server converts both
/// to one internal type), so the dry run still checks every field of the manifest.
const NEWER_THAN_THE_TEST_SERVER: &[(&str, &str)] = &[
    // HorizontalPodAutoscaler: autoscaling/v2 is GA since Kubernetes 1.23.
    ("autoscaling/v2", "autoscaling/v2beta2"),
    // PodDisruptionBudget: policy/v1 is GA since Kubernetes 1.21.
    ("policy/v1", "policy/v1beta1"),
];

/// `manifest` with the API versions of [`NEWER_THAN_THE_TEST_SERVER`] replaced.
fn for_the_test_server(manifest: &str) -> String {
    manifest
        .lines()
        .map(|line| {
            let version = line.strip_prefix("apiVersion:").map(str::trim);
            match NEWER_THAN_THE_TEST_SERVER
                .iter()
                .find(|(newer, _)| version == Some(newer))
            {
                Some((_, older)) => format!("apiVersion: {older}\n"),
                None => format!("{line}\n"),
            }
        })
        .collect()
}

/// How many objects a multi-document manifest holds: documents with a top-level `kind`.
fn object_count(manifest: &str) -> usize {
    manifest
        .split("\n---")
        .filter(|document| document.lines().any(|line| line.starts_with("kind:")))
        .count()
}

/// Every `*.yaml` under `dir`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).expect("reading deploy/") {
        let path = entry.expect("reading deploy/").path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if path
            .extension()
            .is_some_and(|extension| extension == "yaml")
        {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn every_deploy_manifest_passes_server_side_dry_run() {
    let server = start();
    // The manifests live in knative-serving, which NamespaceLifecycle wants to exist, and the
    // KEDA HTTP add-on role's in the add-on's namespace, `keda`.
    server.install_knative_crds();
    server.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: keda\n");
    let deploy = workspace().join("deploy");

    // Each file on its own, and each kustomization as `kubectl apply -k` renders it.
    let mut manifests: Vec<(String, String)> = Vec::new();
    for file in yaml_files(&deploy) {
        let name = file
            .strip_prefix(workspace())
            .unwrap()
            .display()
            .to_string();
        if file
            .file_name()
            .is_some_and(|name| name == "kustomization.yaml")
        {
            let dir = file.parent().unwrap();
            let rendered = server.kubectl(["kustomize", dir.to_str().unwrap()]);
            manifests.push((format!("kustomize {name}"), stdout(&rendered)));
        } else {
            manifests.push((name, fs::read_to_string(&file).unwrap()));
        }
    }
    assert!(manifests.len() >= 7, "found only {manifests:?}");

    let mut rejected = Vec::new();
    for (name, manifest) in &manifests {
        let expected = object_count(manifest);
        assert!(expected > 0, "{name} holds no object");
        let output = server.try_kubectl_as(
            server.admin_kubeconfig(),
            ["apply", "--dry-run=server", "-f", "-"],
            Some(&for_the_test_server(manifest)),
        );
        let accepted = stdout(&output).matches("(server dry run)").count();
        if !output.status.success() || accepted != expected {
            rejected.push(format!(
                "{name}: {accepted} of {expected} objects accepted\n{}{}",
                stdout(&output),
                stderr(&output)
            ));
        }
    }
    assert!(rejected.is_empty(), "rejected:\n{}", rejected.join("\n"));
}

#[test]
fn activator_service_account_reads_what_rbac_grants_and_nothing_else() {
    let server = start();
    server.install_knative_crds();
    server.apply_yaml(&fs::read_to_string(workspace().join("deploy/rbac.yaml")).unwrap());
    server.apply_yaml(REVISION);
    server.apply_yaml(
        r#"
apiVersion: v1
kind: Endpoints
metadata:
  name: hello-00001-private
  namespace: default
subsets: []
"#,
    );

    let token = server.service_account_token("knative-serving", "activator");
    let activator = server.kubeconfig_with_token(&token);
    let as_activator = |args: &[&str]| server.try_kubectl_as(&activator, args, None);

    for (args, expected) in [
        (&["get", "endpoints", "-A"][..], "hello-00001-private"),
        (
            &["get", "revisions.serving.knative.dev", "-A"][..],
            "hello-00001",
        ),
        (&["get", "services", "-A"][..], "kubernetes"),
        (&["get", "endpointslices.discovery.k8s.io", "-A"][..], ""),
        // ConfigMaps of knative-serving, as the source reads them: `config-features` by name,
        // and (with system-internal-tls) those labelled as trust bundles.
        (
            &[
                "get",
                "configmaps",
                "-n",
                "knative-serving",
                "--field-selector",
                "metadata.name=config-features",
            ][..],
            "",
        ),
        (
            &[
                "get",
                "configmaps",
                "-n",
                "knative-serving",
                "-l",
                "networking.knative.dev/trust-bundle",
            ][..],
            "",
        ),
        // One Secret, by name (rbac.yaml's resourceNames), listed as the watch lists it.
        (
            &[
                "get",
                "secrets",
                "-n",
                "knative-serving",
                "--field-selector",
                "metadata.name=routing-serving-certs",
            ][..],
            "",
        ),
    ] {
        let output = as_activator(args);
        assert!(
            output.status.success(),
            "activator may `{}`: {}",
            args.join(" "),
            stderr(&output)
        );
        assert!(stdout(&output).contains(expected), "{}", stdout(&output));
    }

    for args in [
        &[
            "create",
            "secret",
            "generic",
            "stolen",
            "-n",
            "knative-serving",
            "--from-literal=a=b",
        ][..],
        &["get", "secrets", "-n", "knative-serving"][..],
        &["get", "secret", "webhook-certs", "-n", "knative-serving"][..],
        &["get", "secrets", "-n", "default"][..],
        &["get", "configmaps", "-n", "default"][..],
        &["get", "pods", "-A"][..],
        &[
            "delete",
            "endpoints",
            "hello-00001-private",
            "-n",
            "default",
        ][..],
        &[
            "annotate",
            "rev",
            "hello-00001",
            "-n",
            "default",
            "touched=yes",
        ][..],
    ] {
        let output = as_activator(args);
        assert!(
            !output.status.success()
                && stderr(&output).contains("forbidden")
                && stderr(&output).contains("system:serviceaccount:knative-serving:activator"),
            "activator must not `{}`: {}{}",
            args.join(" "),
            stdout(&output),
            stderr(&output)
        );
    }
}

#[test]
fn objects_survive_an_apiserver_restart() {
    let mut server = start();
    server.apply_yaml(
        r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: survivor
  namespace: default
data:
  written: before-the-crash
"#,
    );

    server.kill_apiserver();
    let down = server.try_kubectl(["get", "configmap", "survivor"]);
    assert!(!down.status.success(), "a killed apiserver answered");

    let restarted = Instant::now();
    server.restart_apiserver();
    eprintln!("apiserver restarted in {:?}", restarted.elapsed());
    let survivor = json(&server.kubectl(["get", "configmap", "survivor", "-o", "json"]));
    assert_eq!(survivor["data"]["written"], "before-the-crash");
}

#[test]
fn endpoints_take_podnet_addresses_but_refuse_loopback() {
    let server = start();
    let net = PodNet::new();
    let pod = net.add_address();
    let endpoints = |name: &str, ip: &str| {
        format!(
            r#"
apiVersion: v1
kind: Endpoints
metadata:
  name: {name}
  namespace: default
subsets:
  - addresses:
      - ip: "{ip}"
    ports:
      - name: http
        port: 8012
        protocol: TCP
"#
        )
    };

    server.apply_yaml(&endpoints("hello-00001-private", &pod.to_string()));
    let stored = json(&server.kubectl(["get", "endpoints", "hello-00001-private", "-o", "json"]));
    assert_eq!(stored["subsets"][0]["addresses"][0]["ip"], pod.to_string());

    let loopback = server.try_kubectl_as(
        server.admin_kubeconfig(),
        ["apply", "-f", "-"],
        Some(&endpoints("on-loopback", &Ipv4Addr::LOCALHOST.to_string())),
    );
    assert!(
        !loopback.status.success() && stderr(&loopback).contains("loopback"),
        "Endpoints with 127.0.0.1 should be refused: {}",
        stderr(&loopback)
    );
}

/// The `images:` entry of deploy/kustomization.yaml (`newName`, `newTag`): what a user sets once.
fn kustomization_image() -> String {
    let kustomization = fs::read_to_string(workspace().join("deploy/kustomization.yaml")).unwrap();
    let field = |key: &str| {
        kustomization
            .lines()
            .find_map(|line| line.trim().strip_prefix(key))
            .unwrap_or_else(|| panic!("deploy/kustomization.yaml sets no {key}"))
            .trim()
            .to_owned()
    };
    format!("{}:{}", field("newName:"), field("newTag:"))
}

/// `kubectl apply -k deploy/` runs the image the kustomization's `images:` entry names, and no
/// placeholder is left in what it renders.
#[test]
fn the_kustomization_points_the_activator_at_its_images_entry() {
    let server = start();
    let rendered =
        stdout(&server.kubectl(["kustomize", workspace().join("deploy").to_str().unwrap()]));
    let images: Vec<&str> = rendered
        .lines()
        .filter_map(|line| line.trim().strip_prefix("image: "))
        .collect();
    assert_eq!(images, [kustomization_image()], "{rendered}");
}

/// deploy/queue-proxy's patch, applied as its header says to a `config-deployment` as Knative
/// ships it, points the sidecar at the queue-proxy image with our resources and keeps every
/// other key.
#[test]
fn the_queue_proxy_patch_sets_the_sidecar_and_keeps_knatives_keys() {
    let server = start();
    server.install_knative_crds();
    server.apply_yaml(
        r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: config-deployment
  namespace: knative-serving
data:
  queue-sidecar-image: gcr.io/knative-releases/knative.dev/serving/cmd/queue@sha256:0000000000000000000000000000000000000000000000000000000000000000
  progress-deadline: "600s"
  _example: |
    # queue-sidecar-cpu-request: "25m"
"#,
    );
    let patch = workspace().join("deploy/queue-proxy/config-deployment-patch.yaml");
    server.kubectl([
        "-n",
        "knative-serving",
        "patch",
        "configmap",
        "config-deployment",
        "--type",
        "merge",
        "--patch-file",
        patch.to_str().unwrap(),
    ]);
    let data = json(&server.kubectl([
        "-n",
        "knative-serving",
        "get",
        "configmap",
        "config-deployment",
        "-o",
        "json",
    ]))["data"]
        .clone();
    let image = data["queue-sidecar-image"].as_str().unwrap();
    // The queue-proxy image is the activator's name with `-queue-proxy`, at the same tag.
    let activator = kustomization_image();
    let (name, tag) = activator.rsplit_once(':').unwrap();
    assert_eq!(image, format!("{name}-queue-proxy:{tag}"));
    assert_eq!(data["queue-sidecar-cpu-request"], "25m");
    assert_eq!(data["queue-sidecar-memory-request"], "32Mi");
    assert_eq!(data["queue-sidecar-memory-limit"], "128Mi");
    assert_eq!(data["progress-deadline"], "600s");
    assert!(data["_example"].as_str().unwrap().contains("queue-sidecar"));
}
