//! Tests of the `sim` source: a fleet that is a pure function of its seed.

use std::collections::HashMap;
use std::time::Duration;

use super::*;

fn settings() -> SimSettings {
    SimSettings {
        tapes: 20,
        interval_ms: 1_000,
        change_every: 3,
        unregistered: 4,
        others_ratio: 0.5,
        seed: 7,
        duration_ms: Some(30_000),
        realtime: false,
        start_ms: 1_763_719_200_000,
    }
}

async fn collect(s: SimSettings) -> (SourceReport, Vec<Advertisement>) {
    let (tx, mut rx) = mpsc::channel(256);
    let task = tokio::spawn(Sim::new(s, test_clock()).run(tx, CancellationToken::new()));
    let mut got = Vec::new();
    while let Some(heard) = rx.recv().await {
        assert_eq!(
            heard.capture, None,
            "a simulation leaves matching to ingest"
        );
        got.push(heard.advert);
    }
    (task.await.unwrap().unwrap(), got)
}

fn tape_adverts(got: &[Advertisement], mac: Mac) -> Vec<&Advertisement> {
    got.iter().filter(|a| a.mac == mac).collect()
}

fn reading(adv: &Advertisement) -> TapeReading {
    TapeReading::from_payload(adv.manufacturer(TAPE_COMPANY_ID).unwrap()).unwrap()
}

#[tokio::test]
async fn the_same_seed_gives_the_same_adverts() {
    let (_, first) = collect(settings()).await;
    let (_, second) = collect(settings()).await;
    assert!(!first.is_empty());
    assert_eq!(first, second);
    let (_, other_seed) = collect(SimSettings {
        seed: 8,
        ..settings()
    })
    .await;
    assert_ne!(first, other_seed);
    assert_eq!(Sim::fleet(&settings()), Sim::fleet(&settings()));
}

#[test]
fn the_fleet_has_distinct_static_macs_and_unregistered_tapes_start_c0_de_ad() {
    let fleet = Sim::fleet(&settings());
    assert_eq!(fleet.len(), 20);
    assert_eq!(fleet.iter().collect::<HashSet<_>>().len(), 20);
    for (i, mac) in fleet.iter().enumerate() {
        let o = mac.octets();
        assert_eq!(o[0] & 0xC0, 0xC0, "{mac} is a static random address");
        assert_eq!(o[..3] == UNREGISTERED_PREFIX, i < 4, "{mac} (tape {i})");
    }
}

#[tokio::test]
async fn tape_adverts_carry_the_tape_payload_name_and_plausible_readings() {
    let (_, got) = collect(settings()).await;
    let fleet = Sim::fleet(&settings());
    for (i, mac) in fleet.iter().enumerate() {
        let adverts = tape_adverts(&got, *mac);
        assert_eq!(adverts.len(), 30, "one advert a second for 30 s");
        for adv in adverts {
            assert_eq!(
                adv.name.as_deref(),
                Some(format!("TT-{:04}", i + 1).as_str())
            );
            assert_eq!(adv.manufacturer_data.len(), 1);
            let r = reading(adv);
            assert!((200..=2700).contains(&r.temp_centi), "{r:?}");
            assert!((50..=100).contains(&r.battery), "{r:?}");
            assert!(r.serial <= 0x00FF_FFFF);
            assert!((-90..=-50).contains(&adv.rssi.unwrap()));
        }
    }
}

#[tokio::test]
async fn the_counter_moves_every_change_every_adverts_of_a_tape() {
    let (_, got) = collect(settings()).await;
    for mac in Sim::fleet(&settings()) {
        let adverts = tape_adverts(&got, mac);
        let first = reading(adverts[0]);
        for (n, adv) in adverts.iter().enumerate() {
            let r = reading(adv);
            assert_eq!(
                r.counter,
                first.counter.wrapping_add((n / 3) as u16),
                "advert {n}"
            );
            assert_eq!(r.serial, first.serial);
            if n % 3 != 0 {
                assert_eq!(r, reading(adverts[n - 1]), "unchanged within a group");
            }
        }
    }
}

#[tokio::test]
async fn adverts_follow_the_schedule_and_the_duration_ends_the_source() {
    let s = settings();
    let (report, got) = collect(s.clone()).await;
    assert_eq!(report.adverts as usize, got.len());
    let end = s.start_ms + 30_000;
    assert!(got.iter().all(|a| (s.start_ms..end).contains(&a.ts_ms)));
    assert!(
        got.windows(2).all(|w| w[0].ts_ms <= w[1].ts_ms),
        "in time order"
    );
    let mut last: HashMap<Mac, EpochMillis> = HashMap::new();
    for adv in got
        .iter()
        .filter(|a| a.manufacturer(TAPE_COMPANY_ID).is_some())
    {
        if let Some(prev) = last.insert(adv.mac, adv.ts_ms) {
            assert_eq!(
                adv.ts_ms - prev,
                1_000,
                "{} adverts every interval",
                adv.mac
            );
        }
    }
}

#[tokio::test]
async fn other_devices_advert_in_between_at_about_the_ratio() {
    let (_, got) = collect(settings()).await;
    let tapes: HashSet<Mac> = Sim::fleet(&settings()).into_iter().collect();
    let (tape, other): (Vec<_>, Vec<_>) = got.iter().partition(|a| tapes.contains(&a.mac));
    assert_eq!(tape.len(), 600);
    assert!((200..400).contains(&other.len()), "{} others", other.len());
    assert!(other
        .iter()
        .all(|a| a.manufacturer(TAPE_COMPANY_ID).is_none()));
    assert!(other.iter().any(|a| !a.service_data.is_empty()));
    assert!(other.iter().any(|a| a.manufacturer(0x004C).is_some()));
    let (_, none) = collect(SimSettings {
        others_ratio: 0.0,
        ..settings()
    })
    .await;
    assert_eq!(none.len(), 600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_realtime_the_source_runs_as_fast_as_it_is_read() {
    let s = SimSettings {
        tapes: 500,
        duration_ms: Some(200_000),
        ..settings()
    };
    let started = Instant::now();
    let (report, _) = collect(s).await;
    let took = started.elapsed();
    assert!(report.adverts >= 100_000, "{report:?}");
    // 200 s of a 500-tape fleet; unoptimised test builds are slow, still seconds.
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[tokio::test]
async fn in_realtime_adverts_come_at_the_real_rate_stamped_with_the_wall_clock() {
    let s = SimSettings {
        tapes: 2,
        unregistered: 0,
        interval_ms: 100,
        others_ratio: 0.0,
        duration_ms: Some(300),
        realtime: true,
        ..settings()
    };
    let before = test_clock().wall_ms();
    let started = Instant::now();
    let (report, got) = collect(s).await;
    let took = started.elapsed();
    let after = test_clock().wall_ms();
    assert_eq!(report.adverts, 6);
    assert!(took >= Duration::from_millis(200), "took {took:?}");
    assert!(got.iter().all(|a| (before..=after).contains(&a.ts_ms)));
}

#[tokio::test]
async fn the_stop_token_ends_an_endless_simulation() {
    let s = SimSettings {
        duration_ms: None,
        realtime: true,
        ..settings()
    };
    let (tx, mut rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let task = tokio::spawn(Sim::new(s, test_clock()).run(tx, stop.clone()));
    rx.recv().await.unwrap();
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the simulation ends when stopped")
        .unwrap()
        .unwrap();
    assert!(report.adverts >= 1);
}

#[tokio::test]
async fn a_closed_receiver_ends_the_simulation() {
    let (tx, rx) = mpsc::channel(16);
    drop(rx);
    let s = SimSettings {
        duration_ms: None,
        ..settings()
    };
    let run = Sim::new(s, test_clock()).run(tx, CancellationToken::new());
    let report = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the simulation ends when nobody listens")
        .unwrap();
    assert_eq!(report.adverts, 0);
}

/// The clock the source stamps by: one that reads a fixed day.
fn test_clock() -> crate::clock::SharedClock {
    let day = crate::clock::fake::FIXED_DAYS[3];
    std::sync::Arc::new(crate::clock::fake::HandClock::at(day.wall_ms))
}
