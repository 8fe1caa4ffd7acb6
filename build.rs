//! Build script: the git commit the binary is built from, for `tapegate --version`-like
//! reports (`status --json`'s inventory, `tapegate_inventory_info`). `TAPEGATE_COMMIT`
//! set in the build's environment wins (a build from a source tarball); otherwise
//! `git rev-parse`; otherwise none ("unknown" at run time).

use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=TAPEGATE_COMMIT");
    let from_env = std::env::var("TAPEGATE_COMMIT")
        .ok()
        .filter(|s| !s.is_empty());
    let commit = from_env.or_else(|| {
        // Rebuild when HEAD moves: HEAD itself, the branch it names, packed refs.
        if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
            watch(PathBuf::from(&dir).join("HEAD"));
        }
        if let (Some(common), Some(head_ref)) = (
            git(&["rev-parse", "--git-common-dir"]),
            git(&["rev-parse", "--symbolic-full-name", "HEAD"]),
        ) {
            watch(PathBuf::from(&common).join(head_ref));
            watch(PathBuf::from(&common).join("packed-refs"));
        }
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    if let Some(c) = commit {
        println!("cargo:rustc-env=TAPEGATE_COMMIT={c}");
    }
}

/// Re-runs this script when `path` changes (only for a file that exists: a missing
/// one would re-run it on every build).
fn watch(path: PathBuf) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
