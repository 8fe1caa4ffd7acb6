//! The tapes heard that the service refused as unknown, recorded by the outbox in the
//! transaction that settles their answer (`side_tables::heard`), read back as
//! `device add --nearest` reads them.

use crate::heard_now::HeardNow;
use crate::outbox::tests as fixture;
use crate::outbox::{AnswerNotes, Outcome, Reading, Store, StoreOptions};
use crate::record::{Capture, EpochMillis};
use crate::side_tables::heard::{self, HeardChanges, HeardTape, HEARD_KEEP_MS};

fn capture(mac: &str, ts_ms: EpochMillis, rssi: i16) -> Capture {
    Capture {
        rssi: Some(rssi),
        ..fixture::capture(mac.parse().unwrap(), ts_ms, "00")
    }
}

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), StoreOptions::default()).unwrap();
    (dir, store)
}

fn known(store: &Store) -> Vec<(String, Option<bool>)> {
    heard::since(&store.conn, 0)
        .unwrap()
        .iter()
        .map(|h| (h.mac.to_string(), h.known))
        .collect()
}

/// Settles the next batch with `outcome` per MAC, telling `heard` as the flusher does.
fn settle(store: &mut Store, heard: &HeardNow, outcome: impl Fn(&str) -> Outcome) {
    let batch = store.next_batch(10, 100).unwrap();
    let settled: Vec<_> = batch
        .into_iter()
        .map(|p| {
            let o = outcome(&p.capture.mac.to_string());
            (p, o)
        })
        .collect();
    let notes = AnswerNotes {
        flusher: None,
        heard: heard.changes(&settled),
    };
    store.settle_noting(&settled, 2_000, &notes).unwrap();
    heard.answered(&settled);
}

fn decoded() -> Outcome {
    Outcome::Delivered(Reading {
        qr_code: None,
        temp: None,
        bat: None,
    })
}

#[test]
fn only_tapes_refused_as_unknown_are_written_and_known_once_decoded() {
    let (_dir, mut store) = store();
    let heard = HeardNow::default();
    for (mac, rssi) in [
        ("C0:00:00:00:00:01", -50),
        ("C0:DE:AD:00:00:01", -40),
        ("C0:00:00:00:00:02", -50),
    ] {
        heard.heard(mac.parse().unwrap(), Some(rssi), 1_500);
        store.enqueue(&[capture(mac, 1_000, rssi)]).unwrap();
    }
    let enqueued = heard::since(&store.conn, 0).unwrap();
    assert!(
        enqueued.is_empty(),
        "nothing on the capture path: {enqueued:?}"
    );
    settle(&mut store, &heard, |mac| match mac {
        "C0:00:00:00:00:01" => decoded(),
        "C0:DE:AD:00:00:01" => {
            Outcome::DeadLetter("device not found or not associated with the customer".into())
        }
        _ => Outcome::DeadLetter("invalid packet".into()),
    });
    assert_eq!(
        known(&store),
        [("C0:DE:AD:00:00:01".to_string(), Some(false))]
    );
    let h = &heard::since(&store.conn, 0).unwrap()[0];
    assert_eq!((h.best_rssi, h.last_at), (Some(-40), 1_500), "as heard");

    // Activated and re-queued: decoded now, so no longer a candidate.
    store
        .enqueue(&[capture("C0:DE:AD:00:00:01", 3_000, -40)])
        .unwrap();
    settle(&mut store, &heard, |_| decoded());
    assert_eq!(
        known(&store),
        [("C0:DE:AD:00:00:01".to_string(), Some(true))]
    );
}

#[test]
fn heard_forgets_tapes_not_heard_for_ten_minutes() {
    let (_dir, mut store) = store();
    let t0 = 1_000_000_000;
    let tape = |mac: &str, at: EpochMillis| HeardTape {
        mac: mac.parse().unwrap(),
        last_at: at,
        best_rssi: Some(-50),
        best_at: at,
        known: Some(false),
    };
    let write = |store: &mut Store, t: HeardTape| {
        let notes = AnswerNotes {
            flusher: None,
            heard: HeardChanges {
                unknown: vec![t.clone()],
                known: vec![],
            },
        };
        store.settle_noting(&[], t.last_at, &notes).unwrap();
    };
    write(&mut store, tape("C0:00:00:00:00:01", t0));
    write(
        &mut store,
        tape("C0:00:00:00:00:02", t0 + HEARD_KEEP_MS + 1),
    );
    let macs: Vec<String> = heard::since(&store.conn, 0)
        .unwrap()
        .iter()
        .map(|h| h.mac.to_string())
        .collect();
    assert_eq!(macs, ["C0:00:00:00:00:02"]);
}
