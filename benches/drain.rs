//! Delivery benchmark: drain a backlog of 1,000,000 captures (10,000 MACs) to the mock
//! service on loopback, one batch of 250 in flight, `durability = "full"`.
//!
//! `cargo bench --bench drain` (or `-- 200000`). The mock runs as its own process
//! (`tapegate mock`), so the figures (wall captures/s, CPU per capture, peak RSS) are
//! the daemon's alone, from its own `wait4` rusage.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

// tokio's Instant, the crate's one clock (.clippy.toml): outside a runtime it is std's.
use tokio::time::Instant;

use tapegate::outbox::Durability;
use tapegate::outbox::{Store, StoreOptions};
use tapegate::record::{hex_upper, Capture, Mac};

const MACS: u32 = 10_000;

fn main() {
    let captures: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    {
        let options = StoreOptions {
            durability: Durability::Normal,
            max_pending: captures,
            max_page_count: None,
        };
        let (mut store, _) = Store::open(&state, options).expect("outbox");
        let mut group = Vec::with_capacity(10_000);
        for i in 0..captures {
            let m = (i % u64::from(MACS)) as u32;
            let b = m.to_be_bytes();
            let counter = ((i / u64::from(MACS)) as u16).to_le_bytes();
            let packet = [
                0xF7, 0x0E, 0x49, 0x56, counter[0], counter[1], 0x10, 0x01, 90, 0, b[1], b[2], b[3],
            ];
            group.push(Capture {
                mac: Mac::new([0xC0, 0xFF, 0xEE, b[1], b[2], b[3]]),
                ts_ms: 1_763_719_200_000 + i as i64,
                product_id: "tape".into(),
                packet: hex_upper(&packet),
                rssi: Some(-60),
                boot_ms: None,
            });
            if group.len() == 10_000 {
                store.enqueue(&group).expect("enqueue");
                group.clear();
            }
        }
        store.enqueue(&group).expect("enqueue");
    }

    let bin = env!("CARGO_BIN_EXE_tapegate");
    let mut mock = Command::new(bin)
        .args(["mock", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mock");
    let mut lines = BufReader::new(mock.stdout.take().expect("stdout")).lines();
    let mut base = String::new();
    let mut auth = String::new();
    while base.is_empty() || auth.is_empty() {
        let line = lines.next().expect("mock printed its URLs").expect("read");
        if let Some(u) = line.strip_prefix("ppe base_url ") {
            base = u.to_string();
        } else if let Some(u) = line.strip_prefix("ppe auth_url ") {
            auth = u.to_string();
        }
    }
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"[gateway]
id = "bench"
state_dir = "{state}"
[service.environments.ppe]
base_url = "{base}"
auth_url = "{auth}"
client_id = "tapegate-demo"
audience = "https://api.example/decode"
username = "demo"
password = "demo-password"
customer_id = "demo-customer"
authorized_groups = "demo-group"
[scanner]
source = "replay"
replay_path = "/dev/null"
[outbox]
max_pending = {captures}
"#,
            state = state.display()
        ),
    )
    .expect("config");

    let started = Instant::now();
    // Reaped by wait4 below, which also gives the child's own resource usage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(bin)
        .args(["run", "--until-drained", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn tapegate");
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    let _ = mock.kill();
    let _ = mock.wait();
    assert!(
        pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "tapegate failed: {status}"
    );

    let store = Store::open_existing(&state).expect("open").expect("exists");
    let stats = store.stats().expect("stats");
    assert_eq!(stats.pending, 0, "drained");
    let cpu = usage.ru_utime.tv_sec as f64
        + usage.ru_utime.tv_usec as f64 / 1e6
        + usage.ru_stime.tv_sec as f64
        + usage.ru_stime.tv_usec as f64 / 1e6;
    let n = captures as f64;
    println!("drain benchmark: {captures} pending captures over {MACS} MACs to the mock service on loopback, batches of 250, one in flight, durability full");
    println!(
        "  delivered       {} (dead letters {})",
        stats.delivered, stats.dead_letters
    );
    println!(
        "  wall            {:.2} s  ->  {:.0} captures/s",
        wall.as_secs_f64(),
        n / wall.as_secs_f64()
    );
    println!(
        "  daemon cpu      {:.2} s  ->  {:.2} us/capture",
        cpu,
        cpu * 1e6 / n
    );
    println!(
        "  daemon peak RSS {:.1} MB",
        usage.ru_maxrss as f64 / 1024.0
    );
}
