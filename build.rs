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
    hot_code_first();
}

/// A release link puts the functions start-up and serving run at the front of the code
/// (`src/hot-code.ld`, written by `scripts/hot-code.sh`): an idle process then maps a third as
/// much of the binary (BENCHMARKS.md, "Idle RSS and the code layout"). Debug builds, which the
/// tests run, link as they always did.
fn hot_code_first() {
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        return;
    };
    let script = Path::new(&dir).join("src/hot-code.ld");
    // Named even when missing (a checkout without it): cargo then reruns this script on every
    // build, and the link picks the file up as soon as it is written.
    println!("cargo:rerun-if-changed={}", script.display());
    if script.exists() && std::env::var("PROFILE").is_ok_and(|profile| profile == "release") {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", script.display());
        // Packed relative relocations (DT_RELR): the loader reads 9 KB of them instead of
        // 456 KB. Only glibc 2.36 and later load such a binary, so only when the glibc linked
        // against is one of those (the image carries the build machine's glibc).
        if glibc_version().is_some_and(|version| version >= (2, 36)) {
            println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        }
    }
}

/// The build machine's glibc, from `getconf GNU_LIBC_VERSION` ("glibc 2.36"); `None` when it
/// cannot tell (another libc, no `getconf`).
fn glibc_version() -> Option<(u32, u32)> {
    let output = Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    let (major, minor) = text.trim().strip_prefix("glibc ")?.split_once('.')?;
    let minor = minor.split('.').next()?;
    Some((major.parse().ok()?, minor.parse().ok()?))
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
