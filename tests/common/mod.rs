//! Helpers shared by the end-to-end tests: a temp state dir with a config, the real
//! binary, and the real SQLite file read back.
#![allow(dead_code)]

#[cfg(debug_assertions)]
pub mod day;
pub mod eventually;
pub mod fixture;
pub mod tls;

#[allow(unused_imports)]
pub use eventually::{eventually, eventually_async, eventually_every, wait_for};
#[allow(unused_imports)]
pub use fixture::{other_advert, tape_advert, tape_mac, tape_packet};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tapegate::outbox::{StateReader, Stats};
use tapegate::record::Advertisement;

/// Why a test that needs the BlueZ stand-in is ignored where build.rs did not find it
/// (`cfg(no_bluez_stand_in)`, never set under CI, so there these tests always run):
/// `#[cfg_attr(no_bluez_stand_in, ignore = needs_bluez_stand_in!())]`. A macro, as
/// `ignore` takes a literal and a `const` is not one.
#[allow(unused_macros)]
macro_rules! needs_bluez_stand_in {
    () => {
        "needs the BlueZ stand-in: dbus-daemon and /usr/bin/python3 with dbusmock (apt-get install dbus python3-dbusmock), missing when tapegate was built (build.rs; touch it after installing them)"
    };
}
#[allow(unused_imports)]
pub(crate) use needs_bluez_stand_in;

pub const BIN: &str = env!("CARGO_BIN_EXE_tapegate");

/// A capture time to build traces on (2025-11-21 10:00 UTC): replay refuses times
/// before 2015 as no radio's.
pub const T0_MS: i64 = 1_763_719_200_000;

/// A clock that reads one moment and never moves: synchronised, boot time 0, no time
/// service. For a test that must read a time, not the machine's.
#[derive(Debug)]
pub struct StillClock(pub i64);

impl tapegate::clock::Clock for StillClock {
    fn wall_ms(&self) -> i64 {
        self.0
    }
    fn boot_ms(&self) -> i64 {
        0
    }
    fn kernel_synced(&self) -> bool {
        true
    }
    fn boot_id(&self) -> Option<String> {
        Some("still".into())
    }
    fn time_service(&self) -> Option<String> {
        None
    }
}

/// A temp dir holding `config.toml` and `state/`.
pub struct Gateway {
    pub dir: tempfile::TempDir,
}

impl Gateway {
    /// A gateway whose config is `extra` appended to a minimal `[gateway]` section.
    pub fn new(extra: &str) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let g = Gateway { dir };
        g.write_config(extra);
        g
    }

    pub fn write_config(&self, extra: &str) {
        let text = format!(
            "[gateway]\nid = \"test-gw\"\nstate_dir = \"{}\"\nshutdown_grace_secs = 5\n\n{extra}\n",
            self.state_dir().display()
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The test clock file every command of this gateway reads, once a test has
    /// written it (`day::Day::set_on`).
    pub fn clock_path(&self) -> PathBuf {
        self.dir.path().join("clock.toml")
    }

    /// `tapegate <args> --config <this config>`, with `TAPEGATE_*` overrides cleared
    /// (but the test clock, once one is written: [`Gateway::clock_path`]).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args).arg("--config").arg(self.config_path());
        for (k, _) in std::env::vars() {
            if k.starts_with("TAPEGATE_") {
                c.env_remove(k);
            }
        }
        if self.clock_path().exists() {
            c.env(tapegate::clock::FAKE_CLOCK_ENV, self.clock_path());
        }
        c.env("RUST_LOG", "info");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    /// The outbox read back from the real file.
    pub fn store(&self) -> StateReader {
        StateReader::open(&self.state_dir())
            .unwrap()
            .expect("outbox exists")
    }

    pub fn stats(&self) -> Stats {
        self.store().stats().unwrap()
    }

    /// The stats, or `None` while the daemon has not yet created the database.
    pub fn try_stats(&self) -> Option<Stats> {
        StateReader::open(&self.state_dir()).ok()??.stats().ok()
    }

    pub fn status_json(&self) -> serde_json::Value {
        let out = self.run(&["status", "--json"]);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn write_records(path: &Path, adverts: &[Advertisement]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for a in adverts {
        writeln!(f, "{}", a.to_record()).unwrap();
    }
}

/// Config of a daemon that replays adverts from its stdin with dedup off, so every tape
/// advert written to it becomes one capture.
pub fn stdin_replay_config(commit_interval_ms: u64) -> String {
    format!(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"-\"\n\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\n[outbox]\ncommit_interval_ms = {commit_interval_ms}\n"
    )
}

/// The mock on a runtime of its own, so that a test thread can block on a child process
/// (or on an in-process daemon's runtime) while the mock answers.
#[cfg(feature = "mock")]
pub fn mock_with(
    config: tapegate_mock::MockConfig,
) -> (tokio::runtime::Runtime, tapegate_mock::MockHandle) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mock = rt
        .block_on(tapegate_mock::start(config))
        .expect("mock starts");
    (rt, mock)
}

/// The settings a client needs for environment `env` of `mock` (its URLs and
/// credentials), or `None` if the mock does not serve `env`.
#[cfg(feature = "mock")]
pub fn environment_settings(
    mock: &tapegate_mock::MockHandle,
    env: &str,
) -> Option<tapegate::config::EnvironmentSettings> {
    let e = mock.environment(env)?;
    Some(tapegate::config::EnvironmentSettings {
        base_url: mock.base_url(env),
        auth_url: mock.auth_url(env),
        client_id: e.client_id,
        audience: e.audience,
        username: e.username,
        password: tapegate::util::secret::Secret::new(e.password),
        customer_id: e.customer_id,
        authorized_groups: e.authorized_groups,
    })
}

/// Service settings for environment `env` of `mock` (plain MACs on the wire).
#[cfg(feature = "mock")]
pub fn service_settings(
    mock: &tapegate_mock::MockHandle,
    env: &str,
    request_timeout: Duration,
) -> Option<tapegate::config::ServiceSettings> {
    Some(tapegate::config::ServiceSettings {
        environment: env.to_string(),
        mac_format: tapegate::config::MacFormat::Plain,
        request_timeout,
        ca_file: None,
        endpoint: environment_settings(mock, env)?,
    })
}

/// The `[service]` section (with its `[service.environments.<env>]` table) of a gateway
/// config that delivers to environment `env` of `mock`, with the keys the operator
/// commands need: the demo's own (`tapegate demo` writes the same section).
#[cfg(feature = "mock")]
pub fn service_toml(
    mock: &tapegate_mock::MockHandle,
    env: &str,
    request_timeout_secs: u64,
) -> Option<String> {
    tapegate::cmd::demo::service_toml(mock, env, request_timeout_secs)
}

/// A `[service]` section for the mock's "ppe" environment with its demo credentials
/// (password inline), short timeouts and quick backoff.
#[cfg(feature = "mock")]
pub fn mock_service_section(mock: &tapegate_mock::MockHandle) -> String {
    let service = service_toml(mock, "ppe", 5).expect("the mock serves ppe");
    format!("{service}\n[flush]\nmax_delay_secs = 0.05\nbackoff_initial_ms = 50\nbackoff_max_secs = 1\n")
}

/// `tapegate run` as a child process fed through its stdin, its stderr collected as it
/// comes. Killed on drop if the test did not stop it.
pub struct Daemon {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    pub fn start(g: &Gateway) -> Daemon {
        Daemon::start_with(g, |_| {})
    }

    /// Like [`Daemon::start`], with `adjust` applied to the command first.
    pub fn start_with(g: &Gateway, adjust: impl FnOnce(&mut Command)) -> Daemon {
        let mut command = g.command(&["run"]);
        adjust(&mut command);
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let (stderr, reader) = collect_stderr(&mut child);
        Daemon {
            child,
            stdin,
            stderr,
            reader: Some(reader),
        }
    }

    /// Writes one record line per advert to the daemon's stdin.
    pub fn send(&mut self, adverts: &[Advertisement]) {
        let mut buf = String::new();
        for a in adverts {
            buf.push_str(&a.to_record());
            buf.push('\n');
        }
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(buf.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// What the daemon has logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends SIGHUP (reload the config).
    pub fn hang_up(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends SIGTERM and waits (at most `limit`) for the exit; returns the status and
    /// everything logged.
    pub fn terminate(mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = eventually(limit, || self.child.try_wait().unwrap())
            .unwrap_or_else(|| panic!("no exit within {limit:?} of SIGTERM:\n{}", self.stderr()));
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.stderr())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Bytes written to a pipe that its reader has not read yet (`FIONREAD`).
pub fn unread_bytes(pipe: &impl std::os::fd::AsRawFd) -> usize {
    let mut n: libc::c_int = 0;
    assert_eq!(
        unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut n) },
        0
    );
    n as usize
}

/// `PRAGMA integrity_check` of the database file, through a connection of its own.
pub fn integrity_check(db: &Path) -> String {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

/// Collects a child's stderr in the background (so a chatty child never blocks on a
/// full pipe); the text so far is in the returned buffer.
pub fn collect_stderr(
    child: &mut std::process::Child,
) -> (
    std::sync::Arc<std::sync::Mutex<String>>,
    std::thread::JoinHandle<()>,
) {
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = stderr.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut pipe, &mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (stderr, reader)
}
