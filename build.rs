//! Build-time facts:
//! - for the tests, nothing for the gateway: whether the BlueZ stand-in (`dbus-daemon`,
//!   and `/usr/bin/python3` with the `dbus` and `dbusmock` modules) can run on this
//!   machine. Where it cannot, `cfg(no_bluez_stand_in)` is set and the tests that need it
//!   (tests/ble.rs) are ignored with the reason, so that `cargo test` on a fresh machine
//!   passes and says what it did not run. Under CI (`CI` set) it is never set: there
//!   those tests run, and fail if the stand-in is missing. Looked at when the package is
//!   built (again when `CI` changes, HEAD moves or this file is touched): after
//!   installing the stand-in, `touch build.rs`.
//! - for the gateway: the git commit it is built from (`TAPEGATE_COMMIT`), for the
//!   inventory (`status --json`, `tapegate_inventory_info`) and `--version`
//!   (`TAPEGATE_VERSION_LINE`). `TAPEGATE_COMMIT` set in
//!   the build's environment wins (a build from a source tarball); otherwise `git
//!   rev-parse`; otherwise none ("unknown" at run time).

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    commit();
    bluez_stand_in();
}

fn bluez_stand_in() {
    println!("cargo:rustc-check-cfg=cfg(no_bluez_stand_in)");
    println!("cargo:rerun-if-env-changed=CI");
    if std::env::var_os("CI").is_some() {
        return;
    }
    let runs = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let stand_in = runs("dbus-daemon", &["--version"])
        && runs("/usr/bin/python3", &["-c", "import dbus, dbusmock"]);
    if !stand_in {
        println!("cargo:rustc-cfg=no_bluez_stand_in");
    }
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn commit() {
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
    if let Some(c) = &commit {
        println!("cargo:rustc-env=TAPEGATE_COMMIT={c}");
    }
    // What `tapegate --version` says after the name: the version and the commit.
    println!(
        "cargo:rustc-env=TAPEGATE_VERSION_LINE={} (commit {})",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
        commit.as_deref().unwrap_or("unknown")
    );
}

/// Re-runs this script when `path` changes (only for a file that exists: a missing
/// one would re-run it on every build).
fn watch(path: PathBuf) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
