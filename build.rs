//! Records the git commit the binary is built from, for `kactivator --version` and the start-up
//! log: `KACTIVATOR_GIT_COMMIT`, the full hash, or `unknown` outside a git checkout (a source
//! tarball, a vendored copy) or without `git` on the PATH. A build must never fail for want of it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=KACTIVATOR_GIT_COMMIT={commit}");
    // Rerun when HEAD moves: a checkout changes HEAD, a commit changes the branch's ref (loose, or
    // packed after `git gc`). In a worktree HEAD lives in its own git dir and the refs in the
    // common one. Only files that exist are named: cargo reruns the script on every build for a
    // missing one.
    if let (Some(git_dir), Some(common_dir)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) {
        let (git_dir, common_dir) = (PathBuf::from(git_dir), PathBuf::from(common_dir));
        let mut watched = vec![git_dir.join("HEAD"), common_dir.join("packed-refs")];
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(common_dir.join(&reference));
            watched.push(git_dir.join(&reference));
        }
        for path in watched.iter().filter(|path| path.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// `git <args>` in the package's directory, its trimmed output if it succeeded.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let output = Command::new("git")
        .args(args)
        .current_dir(Path::new(&dir))
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (output.status.success() && !text.is_empty()).then(|| text.to_owned())
}
