//! The Go peer of `tests/go/tls_peer.go`: Go's crypto/tls and net/http as a client or a pod.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// Builds the Go peer into `dir` (Go's standard library only).
pub fn go_peer(dir: &Path) -> PathBuf {
    let binary = dir.join("tls_peer");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go/tls_peer.go");
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(source)
        .output()
        .expect("go is installed (scripts/test.sh installs it)");
    assert!(
        output.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// A child killed on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
