//! Upgrades that keep every capture, in the same booted container (issue 24): version N
//! installed from a signed local apt repository (`scripts/apt-repo.sh`, a throwaway key),
//! captures piling up while the service is down, an `apt-get upgrade` to N+1 with the
//! running unit restarted, the edited conffile kept, the outbox migrated, every capture
//! of the backlog delivered once the service is back; then a downgrade refused, by the
//! daemon (exit 65, no restart, the database untouched) and by the package (preinst).
//!
//! N is the package of [`PREVIOUS`], an earlier commit of this repository (outbox schema
//! 3), built by `cargo deb` from `git archive` of it into the same target directory, so
//! that only the tapegate crate itself is compiled again; N+1 is this tree (schema 5:
//! the rate window's and retention's steps on top).
//! An honest N costs a release build, about as long as N+1's: cheaper stand-ins (this
//! tree with an older schema switched on) would test a package nobody ships.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tapegate_mock::{Fault, MockHandle, Storm};

use super::{cargo, config, run, target_dir, wait_until, Container};

/// The commit whose package plays version N: main before issues 21 and 24, outbox
/// schema 3.
/// Move it to the last released commit when one is tagged.
pub const PREVIOUS: &str = "75ba28bd3532350f4e905134dca56158ca7a11d2";
/// Its package version: below this tree's `0.1.0-1`.
const PREVIOUS_VERSION: &str = "0.1.0-0+75ba28b";

/// Makes [`PREVIOUS`] readable in a shallow clone (a CI that clones with `--depth`):
/// deepens the history from the clone's origin when the commit is not there.
fn ensure_commit(repo: &Path) {
    let has = |repo: &Path| {
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["cat-file", "-e", &format!("{PREVIOUS}^{{commit}}")])
            .status()
            .is_ok_and(|s| s.success())
    };
    if has(repo) {
        return;
    }
    for args in [
        &["fetch", "--quiet", "--unshallow"][..],
        &["fetch", "--quiet", "origin", PREVIOUS][..],
    ] {
        let _ = Command::new("git").arg("-C").arg(repo).args(args).status();
        if has(repo) {
            return;
        }
    }
}

/// The package of [`PREVIOUS`] (cached under `work` by commit).
pub fn build_previous_deb(work: &Path) -> PathBuf {
    let deb = work.join(format!("tapegate-{}.deb", &PREVIOUS[..12]));
    if deb.exists() {
        return deb;
    }
    let src = work.join(format!("src-{}", &PREVIOUS[..12]));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).unwrap();
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    ensure_commit(manifest);
    let archive = Command::new("git")
        .arg("-C")
        .arg(manifest)
        .args(["archive", "--format=tar", PREVIOUS])
        .output()
        .expect("git runs");
    assert!(
        archive.status.success(),
        "cannot read commit {PREVIOUS} (version N) from git: {}",
        String::from_utf8_lossy(&archive.stderr)
    );
    let mut untar = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&src)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(untar.stdin.as_mut().unwrap(), &archive.stdout).unwrap();
    drop(untar.stdin.take());
    assert!(untar.wait().unwrap().success());
    // Its own workspace: under this tree's target/ it would otherwise be taken for an
    // unlisted member of this tree's workspace (the mock's crate made it one).
    let manifest_n = src.join("Cargo.toml");
    let mut text = std::fs::read_to_string(&manifest_n).unwrap();
    if !text.contains("[workspace]") {
        text.push_str("\n[workspace]\n");
        std::fs::write(&manifest_n, text).unwrap();
    }
    eprintln!("building version N ({PREVIOUS}) with cargo deb");
    let partial = work.join("tapegate-previous.deb.partial");
    run(Command::new(cargo())
        .args(["deb", "--deb-version", PREVIOUS_VERSION, "--output"])
        .arg(&partial)
        .env("CARGO_TARGET_DIR", target_dir())
        // This tree's release profile (fat LTO, one codegen unit; N's Cargo.toml has
        // thin and 4), so that the dependencies compiled for N are N+1's: the profile
        // changes the machine code, not what N does.
        .env("CARGO_PROFILE_RELEASE_LTO", "fat")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .current_dir(&src));
    std::fs::rename(&partial, &deb).unwrap();
    let _ = std::fs::remove_dir_all(&src);
    deb
}

/// The whole story, on a container that has run the other checks.
pub fn run_all(c: &Container, work: &Path, service: &MockHandle, previous: &Path, deb: &Path) {
    let backlog =
        version_n_from_the_signed_repository_piles_up_captures(c, work, service, previous);
    an_upgrade_keeps_the_conffile_migrates_and_restarts(c, work, deb, backlog.len());
    every_capture_of_the_backlog_is_delivered(c, service, &backlog);
    a_support_bundle_from_the_real_journal_holds_no_password(c, service);
    a_downgrade_is_refused_by_the_daemon_and_by_the_package(c);
}

/// The signed repository in the container, holding `debs`; apt's lists refreshed from it
/// alone (the container has no other source to reach).
fn publish(c: &Container, work: &Path, debs: &[&Path], fresh_key: bool) {
    let repo = work.join("apt-repo");
    let _ = std::fs::remove_dir_all(&repo);
    if fresh_key {
        let _ = std::fs::remove_dir_all(work.join("apt-repo.gnupg"));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/apt-repo.sh");
    run(Command::new(script)
        .arg(&repo)
        .args(debs)
        .env_remove("GNUPGHOME"));
    let inside = c.file("/srv/tapegate-repo");
    let _ = std::fs::remove_dir_all(&inside);
    run(Command::new("cp").arg("-r").arg(&repo).arg(&inside));
    std::fs::copy(
        repo.join("key.gpg"),
        c.file("/usr/share/keyrings/tapegate-test.gpg"),
    )
    .unwrap();
    c.write(
        "/etc/apt/sources.list.d/tapegate.list",
        "deb [signed-by=/usr/share/keyrings/tapegate-test.gpg] file:/srv/tapegate-repo ./\n",
    );
    let update = c.ok(
        "apt-get update -o Dir::Etc::sourcelist=/etc/apt/sources.list.d/tapegate.list \
         -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 2>&1",
    );
    assert!(
        !update.contains("not signed")
            && !update.contains("NO_PUBKEY")
            && !update.contains("insecure"),
        "the repository must be signed and trusted:\n{update}"
    );
}

/// The outbox schema this tree's tapegate reads, as its package's preinst says (a unit
/// test holds that equal to the binary's).
fn schema() -> i64 {
    let preinst = include_str!("../../debian/preinst");
    preinst
        .lines()
        .find_map(|l| l.strip_prefix("SCHEMA="))
        .and_then(|v| v.parse().ok())
        .expect("SCHEMA= in debian/preinst")
}

fn installed_version(c: &Container) -> String {
    c.ok("dpkg-query -W -f '${Version}' tapegate")
}

/// The host's view of the state database (the unit stopped).
fn db(c: &Container) -> rusqlite::Connection {
    rusqlite::Connection::open(c.file("/var/lib/tapegate/outbox.db")).unwrap()
}

fn user_version(c: &Container) -> i64 {
    db(c)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// A backlog capture as the service receives it: `mac_id` (plain) and `scan_time`.
type Sent = (String, String);

/// Version N installed from the signed repository; the tracking service down (503), the
/// simulated fleet's captures pile up; the unit stopped with them pending. Returns the
/// backlog as it must reach the service.
fn version_n_from_the_signed_repository_piles_up_captures(
    c: &Container,
    work: &Path,
    service: &MockHandle,
    previous: &Path,
) -> Vec<Sent> {
    // A clean slate: the package the other checks used, its state and config gone.
    c.ok("systemctl stop tapegate; systemctl reset-failed tapegate || true");
    super::packaging::remove_keeps_and_purge_removes_what_the_package_made(c);
    publish(c, work, &[previous], true);
    c.ok("DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends tapegate");
    assert_eq!(installed_version(c), PREVIOUS_VERSION);
    assert_eq!(c.prop("ActiveState"), "inactive", "installed, not started");

    // The simulated fleet, as fast as it can, 20 s of synthetic adverts, dedup off:
    // a fixed set of captures, all piling up while the service answers 503.
    let text = format!(
        "{}sim_realtime = false\nsim_duration_secs = 20\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n",
        config(service)
    );
    c.write("/etc/tapegate/config.toml", &text);
    let password = super::common::environment_settings(service, "ppe")
        .unwrap()
        .password;
    c.ok(&format!(
        "umask 077; printf '%s\\n' '{}' > /etc/tapegate/password",
        password.expose()
    ));
    service.set_storm(Some(Storm {
        probability: 1.0,
        seed: 7,
        mix: vec![Fault::Status {
            status: 503,
            retry_after: None,
        }],
    }));
    c.ok("systemctl start tapegate");
    c.wait_logged(
        Duration::from_secs(60),
        "the simulated fleet to end",
        || {
            c.ok("journalctl -u tapegate -o cat --no-pager")
                .contains("simulated fleet ended")
                .then_some(())
        },
    );
    // A clean stop commits what is held: the backlog is final.
    c.ok("systemctl stop tapegate");
    assert_eq!(user_version(c), 3, "version N's schema");
    let conn = db(c);
    let mut stmt = conn
        .prepare("SELECT mac, captured_at FROM pending ORDER BY id")
        .unwrap();
    let backlog: Vec<Sent> = stmt
        .query_map([], |r| {
            let mac: i64 = r.get(0)?;
            let at: i64 = r.get(1)?;
            Ok((format!("{mac:012X}"), (at / 1000).to_string()))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let delivered: i64 = conn
        .query_row(
            "SELECT value FROM counters WHERE name = 'delivered'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(delivered, 0, "the service was down: nothing delivered");
    assert!(
        backlog.len() >= 300,
        "a backlog of {} captures",
        backlog.len()
    );
    eprintln!(
        "version N: {} captures pending with the service down",
        backlog.len()
    );
    backlog
}

/// The installer edits the conffile; N runs again (still no service); `apt-get upgrade`
/// to N+1 keeps the edit, restarts the running unit on the new binary, which migrates
/// the outbox (schema 3 to 4) keeping every pending capture.
fn an_upgrade_keeps_the_conffile_migrates_and_restarts(
    c: &Container,
    work: &Path,
    deb: &Path,
    backlog: usize,
) {
    // New captures from now on are a day later, so they cannot pass for the backlog.
    let text = std::fs::read_to_string(c.file("/etc/tapegate/config.toml")).unwrap();
    let edited = format!(
        "# edited on site before the upgrade\n{}",
        text.replace(
            "sim_duration_secs = 20",
            "sim_duration_secs = 2\nsim_start = 1763805600"
        )
    );
    c.write("/etc/tapegate/config.toml", &edited);
    c.ok("systemctl start tapegate");
    let old_pid = c.prop("MainPID");
    publish(c, work, &[deb], false);
    let upgrade = c.ok("DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q \
         -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold 2>&1");
    assert!(upgrade.contains("tapegate"), "{upgrade}");
    assert_eq!(installed_version(c), "0.1.0-1", "{upgrade}");
    // The edited conffile is kept (the new default beside it as .dpkg-dist).
    let kept = std::fs::read_to_string(c.file("/etc/tapegate/config.toml")).unwrap();
    assert_eq!(kept, edited, "the conffile was replaced");
    // The running unit was restarted onto the new binary, which migrated the outbox.
    let status = c.wait_logged(Duration::from_secs(30), "the new daemon", || {
        let p = c.show();
        if p["ActiveState"] != "active" || p["MainPID"] == old_pid {
            return None;
        }
        let s = c.status();
        (s["inventory"]["commit"].is_string()).then_some(s)
    });
    assert_eq!(
        status["inventory"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{status}"
    );
    assert!(
        status["pending"].as_u64().unwrap() >= backlog as u64,
        "the backlog survived the upgrade: {status}"
    );
    let log = c.ok("journalctl -u tapegate -o cat --no-pager");
    assert!(log.contains("outbox open"), "{log}");
    eprintln!(
        "upgraded to {}: {} pending, unit restarted (PID {old_pid} -> {})",
        installed_version(c),
        status["pending"],
        c.prop("MainPID")
    );
}

/// The service back: every capture of N's backlog reaches it (answered 200), and every
/// accepted capture has its fate (none evicted, none pending).
fn every_capture_of_the_backlog_is_delivered(
    c: &Container,
    service: &MockHandle,
    backlog: &[Sent],
) {
    service.set_storm(None);
    let status = c.wait_logged(Duration::from_secs(120), "the backlog drained", || {
        let s = c.status();
        (s["pending"].as_u64()? == 0).then_some(s)
    });
    let n = |k: &str| status[k].as_u64().unwrap();
    assert_eq!(n("evicted"), 0, "{status}");
    assert_eq!(
        n("admitted"),
        n("delivered") + n("dead_letters"),
        "{status}"
    );
    let answered: std::collections::HashSet<Sent> = service
        .received()
        .iter()
        .filter(|r| r.status == Some(200))
        .flat_map(|r| r.items.iter())
        .map(|i| (i.mac_id.clone(), i.scan_time.clone()))
        .collect();
    let missing: Vec<&Sent> = backlog.iter().filter(|b| !answered.contains(b)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} backlog captures never reached the service: {:?}",
        missing.len(),
        backlog.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(user_version(c), schema(), "the outbox migrated");
    eprintln!(
        "after the upgrade: all {} backlog captures delivered or refused by the service ({} delivered, {} dead letters, 0 evicted, 0 pending)",
        backlog.len(),
        n("delivered"),
        n("dead_letters")
    );
}

/// `tapegate support-bundle` on the gateway, with the real journal: WARN records of the
/// outage are in it, the service password is not.
fn a_support_bundle_from_the_real_journal_holds_no_password(c: &Container, service: &MockHandle) {
    c.ok("rm -rf /root/bundle && mkdir /root/bundle && tapegate support-bundle --output /root/bundle.tar.gz && tar -xzf /root/bundle.tar.gz -C /root/bundle");
    let journal = c.ok("cat /root/bundle/*/journal.json");
    let records: Vec<Value> = journal
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        records.iter().any(|r| r["PRIORITY"] == "4"),
        "no WARN record in the bundle's journal:\n{journal}"
    );
    let password = super::common::environment_settings(service, "ppe")
        .unwrap()
        .password;
    let all = c.ok("find /root/bundle -type f -exec cat {} +");
    assert!(all.contains("config_hash"), "{all}");
    assert!(
        !all.contains(password.expose()),
        "the password is in the bundle"
    );
}

/// A database from a newer tapegate: the daemon refuses it (exit 65, not restarted,
/// the reason at ERROR, the file untouched) and the package refuses to install over it.
fn a_downgrade_is_refused_by_the_daemon_and_by_the_package(c: &Container) {
    c.ok("systemctl stop tapegate");
    let newer = schema() + 1;
    {
        let conn = db(c);
        conn.execute_batch(&format!("PRAGMA user_version = {newer};"))
            .unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
    }
    let before = std::fs::read(c.file("/var/lib/tapegate/outbox.db")).unwrap();
    assert!(!c.sh("systemctl start tapegate").status.success());
    let p = wait_until(Duration::from_secs(20), "the unit to fail", || {
        let p = c.show();
        (p["ActiveState"] == "failed").then_some(p)
    });
    assert_eq!(
        (p["ExecMainStatus"].as_str(), p["NRestarts"].as_str()),
        ("65", "0"),
        "refused without a restart loop: {p:?}"
    );
    // systemd names the code for what it is (sysexits: EX_DATAERR).
    let said = c.ok("journalctl -u tapegate -o cat --no-pager");
    assert!(said.contains("status=65/DATAERR"), "{said}");
    let why = c.ok("journalctl -u tapegate -p warning -o cat --no-pager");
    assert!(
        why.contains(&format!("schema version {newer}, newer than this tapegate")),
        "{why}"
    );
    assert_eq!(
        std::fs::read(c.file("/var/lib/tapegate/outbox.db")).unwrap(),
        before,
        "the newer database was changed"
    );
    // The package's preinst refuses too: nothing installed, the installed one kept.
    let out =
        c.sh("DEBIAN_FRONTEND=noninteractive apt-get install --reinstall -y -q tapegate 2>&1");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    let refusal = format!("newer than this package's tapegate reads ({})", schema());
    assert!(text.contains(&refusal), "{text}");
    assert!(c
        .ok("dpkg -s tapegate")
        .contains("Status: install ok installed"));
    // Back to the schema it reads: it starts again.
    {
        let conn = db(c);
        conn.execute_batch(&format!("PRAGMA user_version = {};", schema()))
            .unwrap();
    }
    c.ok("systemctl reset-failed tapegate && systemctl start tapegate");
    assert_eq!(c.prop("ActiveState"), "active");
}
