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
    // Paths of HEAD, the ref it names, packed-refs and the index: a commit,
    // checkout, `git add` or `git pack-refs` changes one of them. Only paths
    // that exist are registered: cargo treats a missing rerun-if-changed path
    // as changed on every build, so a checkout whose refs are all loose (no
    // packed-refs yet) would rebuild these crates each time. A file that
    // appears later is caught through another one that changes with it
    // (pack-refs deletes the loose ref it packs).
    let mut watched = vec![
        git(dir, &["rev-parse", "--git-path", "HEAD"]),
        git(dir, &["rev-parse", "--git-path", "index"]),
        git(dir, &["rev-parse", "--git-path", "packed-refs"]),
        // The reflog gains a line on every commit and checkout, also when the
        // branch's ref is packed and no loose file changes.
        git(dir, &["rev-parse", "--git-path", "logs/HEAD"]),
    ];
    if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(dir, &["rev-parse", "--git-path", &r]));
    }
    for p in watched.into_iter().flatten() {
        let path = dir.join(p);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
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
