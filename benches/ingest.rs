//! Ingest benchmark: 1,000,000 captures over 10,000 MACs from a replay file, dedup
//! off, into the outbox, by the real release binary pinned to one core.
//!
//! `cargo bench --bench ingest` (or `-- 200000` for fewer captures). Reports
//! captures/s (wall), CPU per capture, the daemon's peak RSS and the bytes it wrote to
//! disk per capture (Linux `ru_oublock`, the same accounting as `write_bytes` in
//! `/proc/<pid>/io`), from the child's own `wait4` rusage so that the generator's work
//! is not counted.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::process::{Command, Stdio};

// tokio's Instant, the crate's one clock (.clippy.toml): outside a runtime it is std's.
use tokio::time::Instant;

const MACS: u32 = 10_000;

fn main() {
    let captures: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let trace = dir.path().join("trace.jsonl");
    {
        let mut f = std::io::BufWriter::with_capacity(
            1 << 20,
            std::fs::File::create(&trace).expect("trace"),
        );
        for i in 0..captures {
            let adv =
                common::fixture::trace_advert(i, u64::from(MACS), 1_763_719_200_000 + i as i64);
            writeln!(f, "{}", adv.to_record()).expect("write");
        }
    }
    let size = std::fs::metadata(&trace).map(|m| m.len()).unwrap_or(0);
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nid = \"bench\"\nstate_dir = \"{}\"\n[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n[outbox]\nmax_pending = {}\n",
            dir.path().join("state").display(),
            trace.display(),
            captures.max(1)
        ),
    )
    .expect("config");

    let started = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tapegate"));
    cmd.args(["run", "--until-drained", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    // Pin the daemon to one core.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        });
    }
    // Reaped by wait4 below, which also gives the child's own resource usage.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().expect("spawn tapegate");
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    assert!(
        pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "tapegate failed: {status}"
    );

    let cpu = usage.ru_utime.tv_sec as f64
        + usage.ru_utime.tv_usec as f64 / 1e6
        + usage.ru_stime.tv_sec as f64
        + usage.ru_stime.tv_usec as f64 / 1e6;
    let written = usage.ru_oublock as f64 * 512.0;
    let db = dir.path().join("state").join("outbox.db");
    let db_size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
    let n = captures as f64;
    println!("ingest benchmark: {captures} captures over {MACS} MACs, replay file {:.1} MB, dedup off, durability full, pinned to 1 core", size as f64 / 1e6);
    println!(
        "  wall            {:.2} s  ->  {:.0} captures/s",
        wall.as_secs_f64(),
        n / wall.as_secs_f64()
    );
    println!(
        "  cpu (user+sys)  {:.2} s  ->  {:.2} us/capture",
        cpu,
        cpu * 1e6 / n
    );
    println!(
        "  peak RSS        {:.1} MB",
        usage.ru_maxrss as f64 / 1024.0
    );
    println!(
        "  written to disk {:.1} MB  ->  {:.0} bytes/capture",
        written / 1e6,
        written / n
    );
    println!(
        "  outbox.db       {:.1} MB  ->  {:.0} bytes/capture",
        db_size as f64 / 1e6,
        db_size as f64 / n
    );
}
