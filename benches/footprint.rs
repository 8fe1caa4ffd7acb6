//! The footprint benchmark: issue 22's table, for any tapegate binaries side by side,
//! interleaved, in one run on one machine.
//!
//! ```sh
//! cargo bench --bench footprint -- --bin 69e6c1c=/work/wt/base69/target/release/tapegate
//! ```
//!
//! For each round and each binary in turn (`--bin LABEL=PATH`, repeatable; this build's
//! release binary is always one of them, labelled `this`, the last; `--bin this=PATH`,
//! given last, measures that build of this tree instead):
//! 1. **ingest**: `run --until-drained` replays [`CAPTURES`] captures over [`MACS`] tapes
//!    (dedup off, no service) into a fresh state directory. The binary under test fills
//!    its own outbox through its own replay ingest, so binaries with different schemas
//!    compare on the same input. CPU (user + sys), peak RSS and the bytes it wrote to
//!    storage (`write_bytes` of `/proc/PID/io`, read after it exits and before it is
//!    reaped), and the database's size per capture.
//! 2. **drain**: `run --until-drained` on that state with the mock service (in this
//!    process, on loopback) and nothing to replay; CPU, peak RSS, and the bytes written
//!    (`wait4`'s `ru_oublock`) by ingest and drain together, per capture.
//! 3. **catch-up over a slow uplink**: [`SLOW_CAPTURES`] captures replayed into a fresh
//!    state (not measured), then drained with every answer held `--delay-ms` (200 ms):
//!    captures per second of wall time, and peak RSS.
//!
//! The daemon is pinned to CPU 1 and this process (the mock service, the replay writer)
//! to CPU 0, so the two do not compete for a core; wall figures stay noisy on a shared
//! machine (the instruction guard, `tests/instructions.rs`, is what CI trusts), which is
//! why binaries are interleaved and each figure is given as the range over rounds.
//!
//! Options: `--captures N`, `--slow-captures N` (0 skips the catch-up), `--rounds N`
//! (default 3), `--delay-ms N`, `--goals` (judge the first `--bin` as the base and
//! `this` against issue 22's goals). For a closer look, in the environment:
//! `FOOTPRINT_LOG` is the daemon's log filter (default `warn`), and `FOOTPRINT_WRAP` a
//! command that runs it (`valgrind --tool=massif --massif-out-file=/tmp/massif.%p`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

// tokio's Instant, the crate's one clock (.clippy.toml): outside a runtime it is std's.
use tokio::time::Instant;

use tapegate_mock::{self as mock, MockConfig, MockHandle};

const CAPTURES: u64 = 500_000;
const SLOW_CAPTURES: u64 = 200_000;
const MACS: u64 = 10_000;
const DAEMON_CPU: usize = 1;
const BENCH_CPU: usize = 0;

struct Args {
    bins: Vec<(String, PathBuf)>,
    captures: u64,
    slow_captures: u64,
    rounds: usize,
    delay: Duration,
    goals: bool,
}

fn args() -> Args {
    let mut a = Args {
        bins: Vec::new(),
        captures: CAPTURES,
        slow_captures: SLOW_CAPTURES,
        rounds: 3,
        delay: Duration::from_millis(200),
        goals: false,
    };
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>, what: &str| -> u64 {
        v.and_then(|v| v.replace('_', "").parse().ok())
            .unwrap_or_else(|| panic!("{what} takes a whole number"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bin" => {
                let v = it.next().expect("--bin LABEL=PATH");
                let (label, path) = v.split_once('=').expect("--bin LABEL=PATH");
                a.bins.push((label.to_string(), PathBuf::from(path)));
            }
            "--captures" => a.captures = number(it.next(), "--captures"),
            "--slow-captures" => a.slow_captures = number(it.next(), "--slow-captures"),
            "--rounds" => a.rounds = number(it.next(), "--rounds") as usize,
            "--delay-ms" => a.delay = Duration::from_millis(number(it.next(), "--delay-ms")),
            "--goals" => a.goals = true,
            // cargo bench passes --bench.
            _ => {}
        }
    }
    // `--bin this=PATH` measures another build of this tree (the package's, built
    // `--no-default-features`) in place of the bench's own.
    if !a.bins.iter().any(|(label, _)| label == "this") {
        a.bins
            .push(("this".into(), PathBuf::from(env!("CARGO_BIN_EXE_tapegate"))));
    }
    a
}

/// What one daemon run cost, from its own accounting.
#[derive(Debug, Clone, Copy, Default)]
struct Cost {
    wall: f64,
    cpu: f64,
    max_rss_mb: f64,
    /// The most of the resident set that was anonymous (heap, stacks), sampled every
    /// 20 ms from `/proc/PID/smaps_rollup`: what is left when the binary's own pages,
    /// which the kernel may drop and read again, are set aside.
    max_anon_mb: f64,
    /// `/proc/PID/io` `write_bytes`.
    write_bytes: u64,
    /// `wait4` `ru_oublock` in bytes.
    oublock_bytes: u64,
}

/// One binary's figures of one round.
#[derive(Debug, Clone, Default)]
struct Figures {
    ingest: Cost,
    drain: Cost,
    db_bytes: u64,
    slow: Option<(Cost, u64)>,
}

fn main() {
    let a = args();
    pin(BENCH_CPU);
    let dir = tempfile::tempdir().expect("temp dir");
    let replay = dir.path().join("captures.jsonl");
    write_replay(&replay, a.captures);
    let slow_replay = dir.path().join("slow.jsonl");
    if a.slow_captures > 0 {
        write_replay(&slow_replay, a.slow_captures);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let service = rt
        .block_on(mock::start(MockConfig::demo()))
        .expect("the mock starts");
    service.set_recording(false);
    let service_toml = decode_only_service(&service);

    println!(
        "footprint: {} captures over {MACS} tapes; catch-up {} captures at {:?} per answer; {} round(s); daemon on CPU {DAEMON_CPU}",
        a.captures, a.slow_captures, a.delay, a.rounds
    );
    let mut results: Vec<Vec<Figures>> = vec![Vec::new(); a.bins.len()];
    for round in 0..a.rounds {
        for (i, (label, bin)) in a.bins.iter().enumerate() {
            let state = dir.path().join(format!("{label}-{round}"));
            let mut f = Figures::default();
            let before = service.decoded_items();
            f.ingest = run(bin, &config(&state, &replay, None));
            f.db_bytes = db_bytes(&state.join("state"));
            f.drain = run(
                bin,
                &config(&state, &empty(dir.path()), Some(&service_toml)),
            );
            let delivered = service.decoded_items() - before;
            assert_eq!(
                delivered, a.captures,
                "{label}: the drain delivered {delivered} of {} captures",
                a.captures
            );
            if a.slow_captures > 0 {
                let slow = dir.path().join(format!("{label}-{round}-slow"));
                run(bin, &config(&slow, &slow_replay, None));
                service.set_answer_delay(Some(a.delay));
                let before = service.decoded_items();
                let cost = run(bin, &config(&slow, &empty(dir.path()), Some(&service_toml)));
                service.set_answer_delay(None);
                let delivered = service.decoded_items() - before;
                f.slow = Some((cost, delivered));
                let _ = std::fs::remove_dir_all(&slow);
            }
            let _ = std::fs::remove_dir_all(&state);
            println!("round {} {label:>10}: {}", round + 1, one_line(&f, &a));
            results[i].push(f);
        }
    }
    table(&a, &results);
    drop(service);
    drop(rt);
}

fn one_line(f: &Figures, a: &Args) -> String {
    let n = a.captures as f64;
    let mut s = format!(
        "ingest {:.2} s cpu, drain {:.2} s cpu, rss {:.1}/{:.1} MB (anon {:.1}/{:.1}), db {:.0} B, written {:.0}/{:.0} B per capture",
        f.ingest.cpu,
        f.drain.cpu,
        f.ingest.max_rss_mb,
        f.drain.max_rss_mb,
        f.ingest.max_anon_mb,
        f.drain.max_anon_mb,
        f.db_bytes as f64 / n,
        f.ingest.write_bytes as f64 / n,
        (f.ingest.oublock_bytes + f.drain.oublock_bytes) as f64 / n
    );
    if let Some((c, delivered)) = f.slow {
        s += &format!(
            ", catch-up {:.0}/s rss {:.1} MB (anon {:.1})",
            delivered as f64 / c.wall,
            c.max_rss_mb,
            c.max_anon_mb
        );
    }
    s
}

/// The table: per binary, the range over rounds of each figure (and the goals).
fn table(a: &Args, results: &[Vec<Figures>]) {
    let n = a.captures as f64;
    type Pick = Box<dyn Fn(&Figures) -> Option<f64>>;
    let rows: Vec<(&str, Pick, usize)> = vec![
        ("ingest CPU (s)", Box::new(|f| Some(f.ingest.cpu)), 2),
        (
            "ingest CPU (us/capture)",
            Box::new(move |f| Some(f.ingest.cpu * 1e6 / n)),
            2,
        ),
        ("drain CPU (s)", Box::new(|f| Some(f.drain.cpu)), 2),
        (
            "drain CPU (us/capture)",
            Box::new(move |f| Some(f.drain.cpu * 1e6 / n)),
            2,
        ),
        (
            "peak RSS, ingest and drain (MB)",
            Box::new(|f| Some(f.ingest.max_rss_mb.max(f.drain.max_rss_mb))),
            1,
        ),
        (
            "peak anonymous RSS, ingest and drain (MB)",
            Box::new(|f| Some(f.ingest.max_anon_mb.max(f.drain.max_anon_mb))),
            1,
        ),
        (
            "peak RSS, slow catch-up (MB)",
            Box::new(|f| f.slow.map(|(c, _)| c.max_rss_mb)),
            1,
        ),
        (
            "database bytes per capture",
            Box::new(move |f| Some(f.db_bytes as f64 / n)),
            0,
        ),
        (
            "bytes written per capture, ingest (/proc/PID/io)",
            Box::new(move |f| Some(f.ingest.write_bytes as f64 / n)),
            0,
        ),
        (
            "bytes written per capture, ingest + drain (ru_oublock)",
            Box::new(move |f| Some((f.ingest.oublock_bytes + f.drain.oublock_bytes) as f64 / n)),
            0,
        ),
        (
            "catch-up at the delay (captures/s)",
            Box::new(|f| f.slow.map(|(c, d)| d as f64 / c.wall)),
            0,
        ),
        ("ingest wall (s)", Box::new(|f| Some(f.ingest.wall)), 2),
        ("drain wall (s)", Box::new(|f| Some(f.drain.wall)), 2),
    ];
    println!();
    print!("| figure |");
    for (label, _) in &a.bins {
        print!(" {label} |");
    }
    println!();
    print!("|---|");
    for _ in &a.bins {
        print!("---|");
    }
    println!();
    for (name, pick, digits) in &rows {
        print!("| {name} |");
        for figures in results {
            let mut v: Vec<f64> = figures.iter().filter_map(pick).collect();
            v.sort_by(f64::total_cmp);
            match (v.first(), v.last()) {
                (Some(lo), Some(hi)) if (hi - lo).abs() < 10f64.powi(-(*digits as i32)) => {
                    print!(" {lo:.digits$} |", digits = *digits)
                }
                (Some(lo), Some(hi)) => print!(" {lo:.digits$}-{hi:.digits$} |", digits = *digits),
                _ => print!(" - |"),
            }
        }
        println!();
    }
    if a.goals && results.len() >= 2 {
        goals(a, &results[0], &results[results.len() - 1]);
    }
}

/// Issue 22's goals for `this` against the base (medians over rounds).
fn goals(a: &Args, base: &[Figures], this: &[Figures]) {
    let n = a.captures as f64;
    let median = |f: &[Figures], pick: &dyn Fn(&Figures) -> Option<f64>| -> f64 {
        let mut v: Vec<f64> = f.iter().filter_map(pick).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let ingest = |f: &Figures| Some(f.ingest.cpu);
    let drain = |f: &Figures| Some(f.drain.cpu);
    let rss = |f: &Figures| Some(f.ingest.max_rss_mb.max(f.drain.max_rss_mb));
    let slow_rss = |f: &Figures| f.slow.map(|(c, _)| c.max_rss_mb);
    let db = |f: &Figures| Some(f.db_bytes as f64 / n);
    let ingest_w = |f: &Figures| Some(f.ingest.write_bytes as f64 / n);
    let total_w = |f: &Figures| Some((f.ingest.oublock_bytes + f.drain.oublock_bytes) as f64 / n);
    let rate = |f: &Figures| f.slow.map(|(c, d)| d as f64 / c.wall);
    let checks = [
        (
            "ingest CPU <= 0.8x base",
            median(this, &ingest) <= 0.8 * median(base, &ingest),
        ),
        (
            "drain CPU <= 0.6x base",
            median(this, &drain) <= 0.6 * median(base, &drain),
        ),
        ("peak RSS <= 15 MB", median(this, &rss) <= 15.0),
        (
            "peak RSS in the catch-up <= 25 MB",
            median(this, &slow_rss) <= 25.0,
        ),
        (
            "database bytes <= base",
            median(this, &db) <= median(base, &db),
        ),
        (
            "written by ingest <= 160 B/capture",
            median(this, &ingest_w) <= 160.0,
        ),
        (
            "written by ingest + drain <= 1000 B/capture",
            median(this, &total_w) <= 1000.0,
        ),
        ("catch-up >= 15,000/s", median(this, &rate) >= 15_000.0),
    ];
    println!();
    for (what, ok) in checks {
        println!("  {} {what}", if ok { "met   " } else { "MISSED" });
    }
}

fn empty(dir: &Path) -> PathBuf {
    let p = dir.join("empty.jsonl");
    if !p.exists() {
        std::fs::write(&p, "").expect("empty replay");
    }
    p
}

/// A config every tapegate since 69e6c1c reads: the replay source, dedup off, and the
/// decode service when given.
fn config(dir: &Path, replay: &Path, service: Option<&str>) -> PathBuf {
    std::fs::create_dir_all(dir).expect("state dir");
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!(
            "[gateway]\nid = \"bench\"\nstate_dir = \"{}\"\n{}\n[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n",
            dir.join("state").display(),
            service.unwrap_or(""),
            replay.display()
        ),
    )
    .expect("config");
    path
}

/// The `[service]` section of the decode path alone (keys every version reads).
fn decode_only_service(service: &MockHandle) -> String {
    let e = common::environment_settings(service, "ppe").expect("ppe");
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

/// The database file and what its write-ahead log still holds.
fn db_bytes(state: &Path) -> u64 {
    ["outbox.db", "outbox.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(state.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// Captures over [`MACS`] tapes, each capture's packet new for its tape (so dedup, were
/// it on, would keep them all), a millisecond apart.
fn write_replay(path: &Path, n: u64) {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    for i in 0..n {
        let adv = common::fixture::trace_advert(i, MACS, 1_763_719_200_000 + i as i64);
        writeln!(f, "{}", adv.to_record()).unwrap();
    }
    f.flush().unwrap();
}

fn pin(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Runs `bin run --until-drained --config CONFIG` pinned to [`DAEMON_CPU`], and reads
/// what it cost from its own accounting: `/proc/PID/io` once it has exited (before it
/// is reaped), then `wait4`'s rusage.
fn run(bin: &Path, config: &Path) -> Cost {
    // FOOTPRINT_WRAP: a command that runs the daemon (a profiler: `valgrind
    // --tool=massif`, `perf record -g --`); the figures are then the wrapper's.
    let wrap = std::env::var("FOOTPRINT_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    let mut cmd = match words.next() {
        Some(wrapper) => {
            let mut cmd = Command::new(wrapper);
            cmd.args(words).arg(bin);
            cmd
        }
        None => Command::new(bin),
    };
    cmd.args(["run", "--until-drained", "--config"])
        .arg(config)
        // FOOTPRINT_LOG: the daemon's log filter (RUST_LOG) for a closer look.
        .env(
            "RUST_LOG",
            std::env::var("FOOTPRINT_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null());
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            pin(DAEMON_CPU);
            Ok(())
        });
    }
    let started = Instant::now();
    // Reaped by wait4 below, which also gives the child's own resource usage.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().expect("spawn tapegate");
    let pid = child.id() as libc::pid_t;
    let sampler = std::thread::spawn(move || max_anonymous_kb(pid));
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let waited = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    assert_eq!(waited, 0, "waitid");
    let wall = started.elapsed().as_secs_f64();
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let write_bytes = io
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let max_anon_kb = sampler.join().unwrap_or(0);
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert!(
        reaped == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{} run --config {} failed: {status}",
        bin.display(),
        config.display()
    );
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Cost {
        wall,
        cpu: secs(usage.ru_utime) + secs(usage.ru_stime),
        max_rss_mb: usage.ru_maxrss as f64 / 1024.0,
        max_anon_mb: max_anon_kb as f64 / 1024.0,
        write_bytes,
        oublock_bytes: usage.ru_oublock as u64 * 512,
    }
}

/// The most anonymous memory (kB) process `pid` had, sampled every 20 ms until it
/// exits (its `smaps_rollup` reads empty once it is a zombie).
fn max_anonymous_kb(pid: libc::pid_t) -> u64 {
    let path = format!("/proc/{pid}/smaps_rollup");
    let mut max = 0;
    loop {
        let Some(kb) = std::fs::read_to_string(&path).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Anonymous:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        }) else {
            return max;
        };
        max = max.max(kb);
        std::thread::sleep(Duration::from_millis(20));
    }
}
