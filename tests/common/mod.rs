//! Helpers shared by the end-to-end tests: a temp state dir with a config, the real
//! binary, and the real SQLite file read back.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tapegate::outbox::{Stats, Store};
use tapegate::record::{hex_upper, Advertisement, Mac};

pub const BIN: &str = env!("CARGO_BIN_EXE_tapegate");

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

    /// `tapegate <args> --config <this config>`, with `TAPEGATE_*` overrides cleared.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args).arg("--config").arg(self.config_path());
        for (k, _) in std::env::vars() {
            if k.starts_with("TAPEGATE_") {
                c.env_remove(k);
            }
        }
        c.env("RUST_LOG", "info");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    /// The outbox read back from the real file.
    pub fn store(&self) -> Store {
        Store::open_existing(&self.state_dir())
            .unwrap()
            .expect("outbox exists")
    }

    pub fn stats(&self) -> Stats {
        self.store().stats().unwrap()
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

/// A tape advert: company 0x0EF7, an 11-byte payload carrying `counter`.
pub fn tape_advert(mac: Mac, ts_ms: i64, counter: u16) -> Advertisement {
    let mut payload = vec![0x49, 0x56];
    payload.extend_from_slice(&counter.to_le_bytes());
    payload.extend_from_slice(&[0x10, 0x01, 90, 0, 0x01, 0x02, 0x03]);
    Advertisement {
        ts_ms,
        mac,
        rssi: Some(-60),
        name: Some("TT".into()),
        manufacturer_data: vec![(0x0EF7, payload)],
        service_data: vec![],
    }
}

/// An advert of something that is not a tape.
pub fn other_advert(mac: Mac, ts_ms: i64) -> Advertisement {
    Advertisement {
        ts_ms,
        mac,
        rssi: Some(-70),
        name: None,
        manufacturer_data: vec![(0x004C, vec![0x02, 0x15, 0x01])],
        service_data: vec![],
    }
}

pub fn tape_mac(i: u32) -> Mac {
    let b = i.to_be_bytes();
    Mac::new([0xC0, 0xFF, 0xEE, b[1], b[2], b[3]])
}

/// The packet the default tape product sends for `tape_advert(_, _, counter)`.
pub fn tape_packet(counter: u16) -> String {
    let a = tape_advert(tape_mac(0), 0, counter);
    let mut bytes = vec![0xF7, 0x0E];
    bytes.extend_from_slice(&a.manufacturer_data[0].1);
    hex_upper(&bytes)
}

pub fn write_records(path: &Path, adverts: &[Advertisement]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for a in adverts {
        writeln!(f, "{}", a.to_record()).unwrap();
    }
}
