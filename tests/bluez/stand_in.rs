//! The BlueZ stand-in for tests and benchmarks: a private D-Bus bus (`dbus-daemon`),
//! python-dbusmock's `bluez5` template on it, and `tests/bluez/driver.py` driving it,
//! each a child process stopped (by PID) on drop; and the real `tapegate` binary run
//! against it. Included by `tests/ble.rs` and `benches/ble.rs` (`#[path]`), beside
//! `tests/common`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use tapegate::record::{hex_lower, Mac};

pub const PYTHON: &str = "/usr/bin/python3";
pub const HCI: &str = "hci0";
pub const TAPE_CID: u16 = 0x0EF7;

// ---------------------------------------------------------------------------------------
// The stand-in: a private bus, the mock BlueZ and the driver, each a child process
// stopped (by PID) on drop.

pub struct StandIn {
    pub dir: tempfile::TempDir,
    pub address: String,
    pub bus: Child,
    pub mock: Option<Child>,
    pub driver: Driver,
}

pub struct Driver {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
}

impl Driver {
    pub fn start(address: &str) -> Driver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bluez/driver.py");
        let mut child = Command::new(PYTHON)
            .arg(script)
            .env("DBUS_SYSTEM_BUS_ADDRESS", address)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the stand-in driver");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Driver {
            child,
            stdin,
            stdout,
        }
    }

    /// Sends one command; returns what follows "ok", panics on "err".
    pub fn call(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let line = line.trim_end();
        match line.strip_prefix("ok") {
            Some(rest) => rest.trim().to_string(),
            None => panic!("stand-in: {command}: {line:?}"),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the stand-in can run here (build.rs asks the same when tapegate is built, so
/// that the tests that need it are ignored with the reason where it is missing).
pub fn stand_in_available() -> bool {
    let bus = Command::new("dbus-daemon")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mock = Command::new(PYTHON)
        .args(["-c", "import dbus, dbusmock"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    bus && mock
}

/// Panics, saying what is missing, unless the stand-in can run (a test that was not
/// ignored at build time, or run with `--include-ignored`, fails rather than passes
/// without testing anything).
pub fn need_stand_in() {
    assert!(
        stand_in_available(),
        "the BlueZ stand-in needs dbus-daemon and /usr/bin/python3 with dbusmock \
         (apt-get install dbus python3-dbusmock)"
    );
}

/// A bus config listening on `socket`; with `deny_bluez`, nobody may call BlueZ (as on
/// a system bus for a user outside the `bluetooth` group).
pub fn write_bus_config(conf: &Path, socket: &Path, deny_bluez: bool) {
    let deny = if deny_bluez {
        r#"<deny send_destination="org.bluez"/>"#
    } else {
        ""
    };
    std::fs::write(
        conf,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
    {deny}
  </policy>
</busconfig>
"#,
            socket.display()
        ),
    )
    .unwrap();
}

impl StandIn {
    /// From now on nobody may call BlueZ: the bus reloads a config that denies it.
    pub fn deny_bluez(&mut self) {
        let socket = self.dir.path().join("system_bus_socket");
        write_bus_config(&self.dir.path().join("bus.conf"), &socket, true);
        unsafe { libc::kill(self.bus.id() as i32, libc::SIGHUP) };
        let denied = eventually(Duration::from_secs(10), || {
            writeln!(self.driver.stdin, "devices {HCI}").unwrap();
            self.driver.stdin.flush().unwrap();
            let mut line = String::new();
            self.driver.stdout.read_line(&mut line).unwrap();
            line.contains("AccessDenied").then_some(())
        });
        assert!(denied.is_some(), "the bus did not reload its config");
    }

    /// A private bus; with `bluez`, the mock BlueZ on it; with `adapter`, its hci0.
    pub fn start(bluez: bool, adapter: bool) -> StandIn {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("system_bus_socket");
        let conf = dir.path().join("bus.conf");
        write_bus_config(&conf, &socket, false);
        let bus = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .arg("--nofork")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dbus-daemon");
        assert!(
            eventually(Duration::from_secs(10), || socket.exists().then_some(())).is_some(),
            "the private bus did not come up"
        );
        let address = format!("unix:path={}", socket.display());
        let driver = Driver::start(&address);
        let mut s = StandIn {
            dir,
            address,
            bus,
            mock: None,
            driver,
        };
        if bluez {
            s.start_bluez(adapter);
        }
        s
    }

    /// Starts the mock BlueZ (a bluetoothd that starts, with `adapter` its hci0).
    pub fn start_bluez(&mut self, adapter: bool) {
        let log = std::fs::File::create(self.dir.path().join("mock.log")).unwrap();
        let mock = Command::new(PYTHON)
            .args(["-m", "dbusmock", "--system", "--template", "bluez5"])
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the mock BlueZ");
        self.mock = Some(mock);
        self.call("wait-bluez 10");
        if adapter {
            self.call(&format!("adapter {HCI}"));
        }
    }

    /// Kills the mock BlueZ (a bluetoothd that dies: its bus name goes away).
    pub fn kill_bluez(&mut self) {
        if let Some(mut m) = self.mock.take() {
            let _ = m.kill();
            let _ = m.wait();
        }
    }

    pub fn call(&mut self, command: &str) -> String {
        self.driver.call(command)
    }

    /// `tapegate <args>` for gateway `g` against this bus, stderr collected as it comes.
    pub fn tapegate(&self, g: &Gateway, args: &[&str]) -> Tapegate {
        Tapegate::spawn(
            g.command(args)
                .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
                .env("RUST_LOG", "info"),
        )
    }

    /// `tapegate <args>` as [`tapegate`](Self::tapegate), reading management frames
    /// from the fake kernel at `mgmt` (`TAPEGATE_MGMT_SOCKET`).
    pub fn tapegate_mgmt(&self, g: &Gateway, args: &[&str], mgmt: &Path) -> Tapegate {
        Tapegate::spawn(
            g.command(args)
                .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
                .env("TAPEGATE_MGMT_SOCKET", mgmt)
                .env("RUST_LOG", "info"),
        )
    }

    pub fn wait_scanning(&mut self) {
        self.call(&format!("wait-discovering {HCI} 1 10"));
    }

    pub fn add_tape(&mut self, mac: Mac, counter: u16) {
        let a = tape_advert(mac, 0, counter);
        self.call(&format!(
            "add {HCI} {mac} TT -60 {TAPE_CID} {}",
            hex_lower(&a.manufacturer_data[0].1)
        ));
    }

    pub fn tape_counter(&mut self, mac: Mac, counter: u16) {
        let a = tape_advert(mac, 0, counter);
        self.call(&format!(
            "mfg {HCI} {mac} {TAPE_CID} {}",
            hex_lower(&a.manufacturer_data[0].1)
        ));
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.kill_bluez();
        let _ = self.bus.kill();
        let _ = self.bus.wait();
    }
}

/// A running `tapegate` child, its stderr collected.
pub struct Tapegate {
    pub child: Child,
    pub stdout: Option<ChildStdout>,
    pub stderr: Arc<Mutex<String>>,
    pub reader: Option<std::thread::JoinHandle<()>>,
}

impl Tapegate {
    pub fn spawn(cmd: &mut Command) -> Tapegate {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (stderr, reader) = collect_stderr(&mut child);
        Tapegate {
            stdout: child.stdout.take(),
            child,
            stderr,
            reader: Some(reader),
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the log contains `what` (panics with the log after `limit`).
    pub fn wait_log(&self, what: &str, limit: Duration) {
        if eventually(limit, || self.stderr().contains(what).then_some(())).is_none() {
            panic!(
                "no {what:?} in the log within {limit:?}:\n{}",
                self.stderr()
            );
        }
    }

    /// Waits for the exit (panics after `limit`); returns the status and the log.
    pub fn wait(mut self, limit: Duration) -> (ExitStatus, String) {
        let status = eventually(limit, || self.child.try_wait().unwrap())
            .unwrap_or_else(|| panic!("no exit within {limit:?}:\n{}", self.stderr()));
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.stderr())
    }

    pub fn terminate(self, limit: Duration) -> (ExitStatus, String) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.wait(limit)
    }

    pub fn stdout(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut o) = self.stdout.take() {
            std::io::Read::read_to_string(&mut o, &mut s).unwrap();
        }
        s
    }
}

impl Drop for Tapegate {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A daemon config scanning BLE with dedup off, so every tape advert is one capture.
/// Adverts come over D-Bus unless `extra_scanner` sets `adverts`: on a machine with
/// Bluetooth (and CAP_NET_ADMIN) `auto` would read the kernel's reports, not the
/// stand-in's.
pub fn ble_config(extra_scanner: &str) -> String {
    let adverts = if extra_scanner.contains("adverts") {
        ""
    } else {
        "adverts = \"dbus\"\n"
    };
    format!(
        "[scanner]\nsource = \"ble\"\n{adverts}{extra_scanner}\n\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\n[outbox]\ncommit_interval_ms = 50\n"
    )
}

pub fn admitted(g: &Gateway) -> u64 {
    g.try_stats().map_or(0, |s| s.admitted)
}

/// Waits until the outbox has admitted `n` captures.
pub fn wait_admitted(g: &Gateway, n: u64, d: &Tapegate) {
    // An upper bound for a loaded machine (the stand-in is Python); passing runs take
    // a few seconds.
    if eventually(Duration::from_secs(30), || (admitted(g) >= n).then_some(())).is_none() {
        panic!(
            "{} of {n} captures admitted within 30 s:\n{}",
            admitted(g),
            d.stderr()
        );
    }
}
