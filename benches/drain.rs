//! Delivery benchmark: drain a backlog of 1,000,000 captures (10,000 MACs) to the mock
//! service on loopback, batches of 250, up to `flush.max_in_flight` (32 by default) in flight,
//! `durability = "full"`.
//!
//! `cargo bench --bench drain -- [CAPTURES] [--delay-ms N] [--outage]`:
//! - `--delay-ms 200` holds every answer of the mock 200 ms (an uplink with a long
//!   round trip: what many batches in flight are for);
//! - `--outage` makes the mock answer 503 to everything for 10 s once half the backlog
//!   is delivered, to show the concurrency window backing off and recovering.
//!
//! The mock runs in this process, the daemon (`tapegate run --until-drained`) in its own,
//! so the figures (wall captures/s, CPU per capture, peak RSS) are the daemon's alone,
//! from its own `wait4` rusage. Every half second a row of the table says what was
//! delivered, the batches the mock is answering, and the daemon's concurrency limit.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

// tokio's Instant, the crate's one clock (.clippy.toml): outside a runtime it is std's.
use tokio::time::Instant;

use tapegate::outbox::Durability;
use tapegate::outbox::{Seeder, StateReader, StoreOptions};
use tapegate::record::{hex_upper, Mac};
use tapegate_mock::{self as mock, Fault, MockConfig, MockHandle, Storm};

const MACS: u32 = 10_000;
const OUTAGE: Duration = Duration::from_secs(10);
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

struct Args {
    captures: u64,
    delay: Option<Duration>,
    outage: bool,
}

fn args() -> Args {
    let mut a = Args {
        captures: 1_000_000,
        delay: None,
        outage: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--delay-ms" => {
                let ms = it.next().and_then(|v| v.parse().ok()).unwrap_or(200);
                a.delay = Some(Duration::from_millis(ms));
            }
            "--outage" => a.outage = true,
            other => {
                if let Ok(n) = other.parse() {
                    a.captures = n;
                }
            }
        }
    }
    a
}

fn fill_outbox(state: &std::path::Path, captures: u64) {
    let options = StoreOptions {
        latest_every: tapegate::outbox::LATEST_EVERY,
        durability: Durability::Normal,
        max_pending: captures,
        max_page_count: None,
        clock: tapegate::clock::system(),
    };
    let (mut store, _) = Seeder::open(state, options).expect("outbox");
    let mut group = Vec::with_capacity(10_000);
    for i in 0..captures {
        let m = (i % u64::from(MACS)) as u32;
        let b = m.to_be_bytes();
        let counter = ((i / u64::from(MACS)) as u16).to_le_bytes();
        let packet = [
            0xF7, 0x0E, 0x49, 0x56, counter[0], counter[1], 0x10, 0x01, 90, 0, b[1], b[2], b[3],
        ];
        group.push(common::fixture::capture(
            Mac::new([0xC0, 0xFF, 0xEE, b[1], b[2], b[3]]),
            1_763_719_200_000 + i as i64,
            hex_upper(&packet),
        ));
        if group.len() == 10_000 {
            store.enqueue(&group).expect("enqueue");
            group.clear();
        }
    }
    store.enqueue(&group).expect("enqueue");
}

fn config(dir: &std::path::Path, state: &std::path::Path, mock: &MockHandle, captures: u64) {
    let service = common::service_toml(mock, "ppe", 30).expect("the mock serves ppe");
    std::fs::write(
        dir.join("config.toml"),
        format!(
            r#"[gateway]
id = "bench"
state_dir = "{state}"
{service}
[scanner]
source = "replay"
replay_path = "/dev/null"
[outbox]
max_pending = {captures}
"#,
            state = state.display(),
        ),
    )
    .expect("config");
}

/// The outage of `--outage`: not yet, on since, or over.
enum Outage {
    Waiting,
    On(Instant),
    Over,
}

fn main() {
    let a = args();
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    fill_outbox(&state, a.captures);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mock = rt
        .block_on(mock::start(MockConfig::demo()))
        .expect("mock starts");
    mock.set_recording(false);
    mock.set_answer_delay(a.delay);
    config(dir.path(), &state, &mock, a.captures);

    let bin = env!("CARGO_BIN_EXE_tapegate");
    let started = Instant::now();
    // Reaped by wait4 below, which also gives the child's own resource usage.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(bin)
        .args(["run", "--until-drained", "--config"])
        .arg(dir.path().join("config.toml"))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("spawn tapegate");
    println!("   t (s)   delivered   captures/s   in flight   limit");
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut last = (Instant::now(), 0u64);
    let mut outage = Outage::Waiting;
    loop {
        let pid = unsafe { libc::wait4(child.id() as i32, &mut status, libc::WNOHANG, &mut usage) };
        if pid != 0 {
            assert!(pid > 0, "wait4 failed");
            break;
        }
        std::thread::sleep(SAMPLE_EVERY);
        let Some(stats) = StateReader::open(&state)
            .ok()
            .flatten()
            .and_then(|s| s.stats().ok())
        else {
            continue;
        };
        let now = Instant::now();
        let rate = (stats.delivered - last.1) as f64 / (now - last.0).as_secs_f64();
        last = (now, stats.delivered);
        println!(
            "{:8.1} {:11} {:12.0} {:11} {:7}{}",
            started.elapsed().as_secs_f64(),
            stats.delivered,
            rate,
            mock.requests_in_progress(),
            stats.flush_concurrency.unwrap_or(0),
            if matches!(outage, Outage::On(_)) {
                "   503"
            } else {
                ""
            }
        );
        outage = match outage {
            Outage::Waiting if a.outage && stats.delivered >= a.captures / 2 => {
                mock.set_storm(Some(Storm {
                    probability: 1.0,
                    seed: 1,
                    mix: vec![Fault::Status {
                        status: 503,
                        retry_after: None,
                    }],
                }));
                Outage::On(now)
            }
            Outage::On(since) if now - since >= OUTAGE => {
                mock.set_storm(None);
                Outage::Over
            }
            other => other,
        };
    }
    let wall = started.elapsed();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "tapegate failed: {status}"
    );

    let store = StateReader::open(&state).expect("open").expect("exists");
    let stats = store.stats().expect("stats");
    assert_eq!(stats.pending, 0, "drained");
    let cpu = usage.ru_utime.tv_sec as f64
        + usage.ru_utime.tv_usec as f64 / 1e6
        + usage.ru_stime.tv_sec as f64
        + usage.ru_stime.tv_usec as f64 / 1e6;
    let n = a.captures as f64;
    let delay = a.delay.map_or("no added delay".to_string(), |d| {
        format!("{d:?} added to every answer")
    });
    let outage_note = if a.outage {
        ", 503 for 10 s at half way"
    } else {
        ""
    };
    println!("drain benchmark: {} pending captures over {MACS} MACs to the mock service on loopback ({delay}{outage_note}), batches of 250, up to 8 in flight, durability full", a.captures);
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
    drop(mock);
    drop(rt);
}
