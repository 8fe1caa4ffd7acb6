//! The packages the VM tests install, each built once into `target/` and shared: the
//! amd64 one as `cargo deb` builds it (the release build the container test shares), the
//! Arm ones as CI builds them (`scripts/build-deb.sh`, glibc 2.31, which `.ci/run` runs
//! again afterwards and finds up to date), and the package of an earlier commit that the
//! container's upgrade test builds (outbox schema 3).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{repo, target_dir, Arch};

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The amd64 package, as `cargo deb` builds it, copied to `out`; or the one
/// `TAPEGATE_VM_DEB` names (another commit's).
pub fn amd64(out: &Path) {
    if let Some(deb) = std::env::var_os("TAPEGATE_VM_DEB") {
        std::fs::copy(&deb, out).expect("TAPEGATE_VM_DEB names a readable .deb");
        return;
    }
    // The tests beside each other share the build (and its man pages).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let docs = Command::new(repo().join("scripts/package-docs.sh"))
        .status()
        .expect("scripts/package-docs.sh runs");
    assert!(docs.success(), "scripts/package-docs.sh failed");
    let status = Command::new(cargo())
        .args(["deb", "--output"])
        .arg(out)
        .current_dir(repo())
        .status()
        .expect("cargo deb runs");
    assert!(status.success(), "cargo deb failed");
}

/// `scripts/build-deb.sh`'s name for `arch`, and the Rust target it builds.
fn triple(arch: &Arch) -> (&'static str, &'static str) {
    match arch.deb_arch {
        "arm64" => ("aarch64", "aarch64-unknown-linux-gnu"),
        "armhf" => ("armv7", "armv7-unknown-linux-gnueabihf"),
        _ => ("x86_64", "x86_64-unknown-linux-gnu"),
    }
}

/// The package of `arch` as CI builds it (`scripts/build-deb.sh`: up to date in a
/// few seconds when built before), copied to `out`; or the one
/// `TAPEGATE_VM_DEB_<DEB_ARCH>` names (`TAPEGATE_VM_DEB_ARM64=other.deb`).
pub fn built_by_ci(arch: &Arch, out: &Path) {
    let var = format!("TAPEGATE_VM_DEB_{}", arch.deb_arch.to_uppercase());
    if let Some(deb) = std::env::var_os(&var) {
        std::fs::copy(&deb, out).unwrap_or_else(|e| panic!("{var}: {e}"));
        return;
    }
    let (name, triple) = triple(arch);
    let status = as_from_a_shell(&mut Command::new(repo().join("scripts/build-deb.sh")))
        .arg(name)
        .current_dir(repo())
        .status()
        .expect("scripts/build-deb.sh runs");
    assert!(status.success(), "scripts/build-deb.sh {name} failed");
    let dir = target_dir().join(triple).join("debian");
    let deb = std::fs::read_dir(&dir)
        .expect("build-deb.sh wrote its package")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no .deb in {}", dir.display()));
    std::fs::copy(&deb, out).unwrap();
}

/// `cmd` without what `cargo test` adds to a test's environment (the package's
/// `CARGO_PKG_*` and `CARGO_MANIFEST_*`, `OUT_DIR`, build.rs's `TAPEGATE_COMMIT`, the
/// library path), so that a build it starts is the one `.ci/run` starts from its shell:
/// ring's build script reads `CARGO_PKG_NAME` and build.rs `TAPEGATE_COMMIT`, and with
/// them set every Arm package was built twice in a CI run (6 min 30 s).
fn as_from_a_shell(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let added_by_cargo_test = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || name.starts_with("CARGO_BIN_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
                "TAPEGATE_COMMIT",
                "TAPEGATE_VERSION_LINE",
                "LD_LIBRARY_PATH",
            ]
            .contains(&name.as_ref());
        if added_by_cargo_test {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd
}

/// The package of the earlier commit the container's upgrade test installs as
/// version N (`tests/systemd_container/upgrade.rs` builds it before this runs; its
/// outbox schema is 3), if it is there.
pub fn previous() -> Option<PathBuf> {
    let dir = target_dir().join("systemd-container");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("tapegate-") && n.ends_with(".deb"))
        })
}
