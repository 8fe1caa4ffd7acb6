//! Build-time facts for the tests, nothing for the gateway: whether the BlueZ stand-in
//! (`dbus-daemon`, and `/usr/bin/python3` with the `dbus` and `dbusmock` modules) can
//! run on this machine. Where it cannot, `cfg(no_bluez_stand_in)` is set and the tests
//! that need it (tests/ble.rs) are ignored with the reason, so that `cargo test` on a
//! fresh machine passes and says what it did not run. Under CI (`CI` set) it is never
//! set: there those tests run, and fail if the stand-in is missing.
//!
//! Looked at when the package is built (again when `CI` changes or this file is
//! touched): after installing the stand-in, `touch build.rs`.

use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rustc-check-cfg=cfg(no_bluez_stand_in)");
    println!("cargo:rerun-if-changed=build.rs");
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
