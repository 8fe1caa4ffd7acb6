//! The instruction guard: what the release binary spends per capture, counted by
//! valgrind (`cachegrind`, instructions executed in user space, the daemon's every
//! thread), to ingest a fixed replay into the outbox and to drain that outbox to the mock
//! service on loopback. It fails when either figure grows more than [`TOLERANCE`] over
//! the budget checked in beside it (`tests/instructions.budget`). Instructions, not
//! seconds: the same binary and input give the same count however busy the machine is,
//! so a slide in cost shows as a red CI run, not as noise.
//!
//! Each figure is per capture with the fixed cost taken out: the daemon runs once on
//! [`CAPTURES`] captures and once on none, and the difference is divided by
//! [`CAPTURES`]. The binary is the release build the package ships (`cargo build
//! --release --no-default-features`, shared with the systemd container test's `cargo
//! deb`); the mock runs in this test's process, so its work is not counted.
//!
//! `TAPEGATE_GUARD_BIN=/path/to/tapegate cargo test --test instructions -- --nocapture`
//! measures another build (another commit's, side by side) and compares nothing.
//!
//! Re-measure (after a change meant to cost more, or to record a saving):
//! `TAPEGATE_UPDATE_BUDGET=1 cargo test --test instructions -- --nocapture`, then commit
//! `tests/instructions.budget` with the figures in the message.
//!
//! It needs `valgrind`. Without it, it says so loudly and passes, except under CI (`CI`
//! set), where it fails: `.ci/run` installs it.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tapegate_mock::{self as mock, MockConfig};

/// Captures in the replay (a tape's packet changes every capture, so dedup keeps all).
const CAPTURES: u64 = 30_000;
/// Tapes they come from: ten captures each, so a drain settles each tape ten times.
const MACS: u64 = 3_000;
/// How much over its budget a figure may grow before the guard fails.
const TOLERANCE: f64 = 0.10;
/// Below this share of its budget, the guard says the budget is loose (a later slide
/// would hide under it) and should be re-measured.
const LOOSE: f64 = 0.80;

const BUDGET_FILE: &str = "tests/instructions.budget";

#[test]
fn ingest_and_drain_cost_no_more_instructions_per_capture_than_their_budget() {
    if let Err(why) = prerequisites() {
        if std::env::var_os("CI").is_some() {
            panic!("the instruction guard cannot run here: {why}");
        }
        eprintln!(
            "\n*** SKIPPED the instruction guard: {why} ***\n*** (it runs under CI, `CI` set, where this is a failure) ***\n"
        );
        return;
    }
    let bin = release_binary();
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("captures.jsonl");
    let empty = dir.path().join("empty.jsonl");
    write_replay(&full, CAPTURES);
    write_replay(&empty, 0);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let service = rt.block_on(mock::start(MockConfig::demo())).unwrap();
    let service_toml = decode_only_service(&service);

    // Ingest: the replay into a fresh outbox, no service configured.
    let ingest_full = count(&bin, &dir.path().join("a"), &full, None);
    let ingest_none = count(&bin, &dir.path().join("b"), &empty, None);
    // Drain: what ingest left in `a`, to the mock; and an empty outbox to the mock.
    let drain_full = count(&bin, &dir.path().join("a"), &empty, Some(&service_toml));
    let drain_none = count(&bin, &dir.path().join("b"), &empty, Some(&service_toml));
    let delivered = service.decoded_items();
    assert_eq!(
        delivered, CAPTURES,
        "the drain delivered {delivered} of {CAPTURES} captures to the mock: the count is not of a drain"
    );

    let per_capture = |full: u64, none: u64| full.saturating_sub(none) / CAPTURES;
    let measured = Budget {
        ingest: per_capture(ingest_full, ingest_none),
        drain: per_capture(drain_full, drain_none),
    };
    eprintln!(
        "instructions per capture: ingest {} (fixed cost {}), drain {} (fixed cost {})",
        measured.ingest, ingest_none, measured.drain, drain_none
    );

    if std::env::var_os("TAPEGATE_GUARD_BIN").is_some_and(|b| !b.is_empty()) {
        return;
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(BUDGET_FILE);
    if std::env::var_os("TAPEGATE_UPDATE_BUDGET").is_some() {
        std::fs::write(&path, measured.to_text()).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the budget {}: {e}", path.display()));
    let budget = Budget::parse(&text).unwrap_or_else(|e| panic!("{BUDGET_FILE}: {e}"));
    let mut over = Vec::new();
    for (what, got, allowed) in [
        ("ingest", measured.ingest, budget.ingest),
        ("drain", measured.drain, budget.drain),
    ] {
        let ratio = got as f64 / allowed as f64;
        eprintln!(
            "{what}: {got} instructions per capture, {:.1} % of the budget {allowed}",
            ratio * 100.0
        );
        if ratio > 1.0 + TOLERANCE {
            over.push(format!(
                "{what} costs {got} instructions per capture, {:.1} % over its budget of {allowed} (at most {:.0} % is allowed)",
                (ratio - 1.0) * 100.0,
                TOLERANCE * 100.0
            ));
        } else if ratio < LOOSE {
            eprintln!(
                "note: {what}'s budget is loose ({got} < {:.0} % of {allowed}): re-measure it so that a later slide shows",
                LOOSE * 100.0
            );
        }
    }
    assert!(
        over.is_empty(),
        "{}\n(if the cost is meant, re-measure: TAPEGATE_UPDATE_BUDGET=1 cargo test --test instructions -- --nocapture)",
        over.join("\n")
    );
}

/// Instructions per capture.
#[derive(Debug, PartialEq)]
struct Budget {
    ingest: u64,
    drain: u64,
}

impl Budget {
    fn parse(text: &str) -> Result<Budget, String> {
        let mut ingest = None;
        let mut drain = None;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected key = value", n + 1))?;
            let value: u64 = value
                .trim()
                .parse()
                .map_err(|_| format!("line {}: {:?} is not a whole number", n + 1, value.trim()))?;
            match key.trim() {
                "ingest" => ingest = Some(value),
                "drain" => drain = Some(value),
                other => return Err(format!("line {}: unknown key {other:?}", n + 1)),
            }
        }
        Ok(Budget {
            ingest: ingest.ok_or("no ingest figure")?,
            drain: drain.ok_or("no drain figure")?,
        })
    }

    fn to_text(&self) -> String {
        format!(
            "# Instructions per capture of the release binary, counted by valgrind (cachegrind)\n\
             # in tests/instructions.rs: {CAPTURES} captures from {MACS} tapes ingested from a replay, then\n\
             # drained to the mock service on loopback. CI fails when a figure grows more than\n\
             # {:.0} % over it. Re-measure: TAPEGATE_UPDATE_BUDGET=1 cargo test --test instructions -- --nocapture\n\
             ingest = {}\ndrain = {}\n",
            TOLERANCE * 100.0,
            self.ingest,
            self.drain
        )
    }
}

/// The `[service]` section of the decode path alone (the keys every version since the
/// first reads, so that an older commit's build can be measured with the same input).
fn decode_only_service(service: &mock::MockHandle) -> String {
    let e = common::environment_settings(service, "ppe").unwrap();
    format!(
        "[service]\nenvironment = \"ppe\"\n[service.environments.ppe]\nbase_url = \"{}\"\nauth_url = \"{}\"\nclient_id = \"{}\"\naudience = \"{}\"\nusername = \"{}\"\npassword = \"{}\"\ncustomer_id = \"{}\"\nauthorized_groups = \"{}\"\n",
        e.base_url,
        e.auth_url,
        e.client_id,
        e.audience,
        e.username,
        e.password.expose(),
        e.customer_id,
        e.authorized_groups
    )
}

fn prerequisites() -> Result<(), String> {
    let ok = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err("no valgrind (apt-get install valgrind)".into())
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// The package's release binary (incremental: the systemd container test's `cargo deb`
/// builds the same one), or the one `TAPEGATE_GUARD_BIN` names (to measure another
/// commit's build side by side; nothing is compared with the budget then).
fn release_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("TAPEGATE_GUARD_BIN").filter(|b| !b.is_empty()) {
        return PathBuf::from(bin);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "-p", "tapegate", "--bin", "tapegate"])
        // As the package ships it (no mock service), so the build is cargo deb's.
        .arg("--no-default-features")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo build --release");
    assert!(
        out.status.success(),
        "cargo build --release failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target_dir().join("release").join("tapegate")
}

/// A replay of `n` captures over [`MACS`] tapes, each capture's packet new for its tape.
fn write_replay(path: &Path, n: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..n {
        let adv = common::fixture::trace_advert(i, MACS, 1_763_719_200_000 + i as i64 * 10);
        writeln!(f, "{}", adv.to_record()).unwrap();
    }
    f.flush().unwrap();
}

/// The window as a near service leaves it (8). Under valgrind every answer takes 50 ms
/// or more to be read, which the flusher took for a slow uplink before it told a queue
/// of batches from the link (`flush/plan/window.rs`) and widened its window for; with
/// 3,000 tapes a window past 12 batches of 250 leaves no tape free, and the fetches then
/// walk the whole backlog (a cost of wide windows over few tapes that the guard would
/// otherwise measure in place of the drain's own). The cap keeps the figure the drain's
/// own whatever the window's rule.
const WINDOW: &str = "[flush]\nmax_in_flight = 8\n";

/// Instructions `tapegate run --until-drained` executes with state in `dir`, replaying
/// `replay`, delivering to `service` when given.
fn count(bin: &Path, dir: &Path, replay: &Path, service: Option<&str>) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"guard\"\nstate_dir = \"{}\"\n{}\n[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n{WINDOW}",
            dir.join("state").display(),
            service.unwrap_or(""),
            replay.display()
        ),
    )
    .unwrap();
    let out = Command::new("valgrind")
        .args([
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
        ])
        .arg(bin)
        .args(["run", "--until-drained", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("valgrind");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the daemon under valgrind failed ({}):\n{stderr}",
        out.status
    );
    instructions(&stderr)
        .unwrap_or_else(|| panic!("no instruction count in valgrind's output:\n{stderr}"))
}

/// The `I refs:` total of cachegrind's summary.
fn instructions(valgrind_stderr: &str) -> Option<u64> {
    valgrind_stderr.lines().find_map(|l| {
        let (head, rest) = l.split_once("refs:")?;
        if !head.trim_end().ends_with(" I") {
            return None;
        }
        rest.trim().replace(',', "").parse().ok()
    })
}

#[test]
fn the_budget_file_reads_back_what_it_writes() {
    let b = Budget {
        ingest: 1234,
        drain: 5678,
    };
    assert_eq!(Budget::parse(&b.to_text()), Ok(b));
    assert!(Budget::parse("ingest = 1\n").is_err());
    assert!(Budget::parse("ingest = x\ndrain = 2\n").is_err());
    assert_eq!(
        instructions("==1== \n==1== D   refs:      7\n==1== I   refs:      1,234,567\n"),
        Some(1_234_567)
    );
}
