// Shared build-script body (included with `include!` by the build.rs of
// pstack-agent, pstack-store and pstack-helper): names the commit a binary
// was built from.
//
// Emits two compile-time variables:
//   PSTACK_SOURCE_COMMIT  the full commit id, `-dirty` appended when tracked
//                         files differ from it; `unrecorded` outside a git
//                         checkout without an override;
//   PSTACK_VERSION        `<crate version> (commit <PSTACK_SOURCE_COMMIT>)`,
//                         what every binary's `--version` prints.
//
// A build from a source tarball (no .git) sets PSTACK_SOURCE_COMMIT in the
// environment; it wins over git. `packaging/build` always sets it, so a
// package never carries a stale `-dirty` marker. A development build re-runs
// this when HEAD, the branch it points to, or the index changes: an edit that
// is not yet staged shows up as `-dirty` only at the next of those.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}

fn commit_from_git(dir: &Path) -> Option<String> {
    let head = git(dir, &["rev-parse", "HEAD"])?;
    // Paths of HEAD, the ref it names and the index: a commit, checkout or
    // `git add` changes one of them.
    for name in ["HEAD", "index"] {
        if let Some(p) = git(dir, &["rev-parse", "--git-path", name]) {
            println!("cargo:rerun-if-changed={}", dir.join(p).display());
        }
    }
    if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(dir, &["rev-parse", "--git-path", &r])
    {
        println!("cargo:rerun-if-changed={}", dir.join(p).display());
    }
    if let Some(p) = git(dir, &["rev-parse", "--git-path", "packed-refs"]) {
        println!("cargo:rerun-if-changed={}", dir.join(p).display());
    }
    let dirty = match Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["diff-index", "--quiet", "HEAD", "--"])
        .status()
    {
        Ok(s) => s.code() == Some(1),
        Err(_) => false,
    };
    Some(if dirty { format!("{head}-dirty") } else { head })
}

fn valid_override(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
}

fn main() {
    println!("cargo:rerun-if-env-changed=PSTACK_SOURCE_COMMIT");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = match std::env::var("PSTACK_SOURCE_COMMIT") {
        Ok(s) if valid_override(&s) => s,
        Ok(s) => panic!(
            "PSTACK_SOURCE_COMMIT={s:?}: expected a commit id (letters, digits, - . _; at most 64)"
        ),
        Err(_) => commit_from_git(&manifest_dir).unwrap_or_else(|| "unrecorded".to_string()),
    };
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=PSTACK_SOURCE_COMMIT={commit}");
    println!("cargo:rustc-env=PSTACK_VERSION={version} (commit {commit})");
}
