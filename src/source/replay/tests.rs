//! The replay source, tested on real files and pipes.
use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn record(i: u32) -> String {
    format!(
        r#"{{"ts": {}.5, "mac": "C0:FF:EE:00:{:02X}:{:02X}", "rssi": -60, "manufacturer_data": {{"3831": "4956e29f84211e44ffb51e"}}}}"#,
        1_763_719_200 + i,
        (i >> 8) & 0xff,
        i & 0xff
    )
}

fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    f.flush().unwrap();
    f
}

async fn collect(path: PathBuf, capacity: usize) -> (SourceReport, Vec<Advertisement>) {
    let (tx, mut rx) = mpsc::channel(capacity);
    let task = tokio::spawn(Replay::new(path, test_clock()).run(tx, CancellationToken::new()));
    let mut got = Vec::new();
    while let Some(heard) = rx.recv().await {
        assert_eq!(heard.capture, None, "a replay leaves matching to ingest");
        got.push(heard.advert);
    }
    (task.await.unwrap().unwrap(), got)
}

#[tokio::test]
async fn valid_lines_arrive_in_order_with_their_capture_times() {
    let text: String = (0..100).map(|i| record(i) + "\n").collect();
    let f = file_with(text.as_bytes());
    let (report, got) = collect(f.path().to_path_buf(), 4).await;
    assert_eq!(
        report,
        SourceReport {
            adverts: 100,
            malformed: 0
        }
    );
    let want: Vec<Advertisement> = (0..100)
        .map(|i| Advertisement::from_record(&record(i)).unwrap())
        .collect();
    assert_eq!(got, want);
    assert_eq!(got[0].ts_ms, 1_763_719_200_500);
}

#[test]
fn capture_times_outside_a_sane_range_and_oversized_packets_are_refused() {
    let now = 1_763_719_200_000;
    let line = |ts: &str, data_bytes: usize| {
        let data = "ab".repeat(data_bytes);
        let text = format!(
            r#"{{"ts": {ts}, "mac": "C0:FF:EE:00:00:01", "manufacturer_data": {{"3831": "{data}"}}}}"#
        );
        let adv = Advertisement::from_record(&text).unwrap();
        check_bounds(&adv, now)
    };
    assert_eq!(line("1763719200.5", 11), Ok(()));
    assert_eq!(line("1763805500", 252), Ok(()), "a clock a little ahead");
    for (ts, why) in [
        ("1e20", "ahead"),
        ("1763719200500", "milliseconds?"),
        ("1763719.2", "before 2015"),
        ("0", "before 2015"),
    ] {
        let err = line(ts, 11).unwrap_err();
        assert!(err.starts_with("ts: ") && err.contains(why), "{ts}: {err}");
    }
    let err = line("1763719200", 100 * 1024).unwrap_err();
    assert!(
        err.starts_with("manufacturer_data: a value of 102400 bytes"),
        "{err}"
    );
    let service = format!(
        r#"{{"ts": 1763719200, "mac": "C0:FF:EE:00:00:01", "service_data": {{"feaa": "{}"}}}}"#,
        "00".repeat(253)
    );
    let adv = Advertisement::from_record(&service).unwrap();
    assert!(check_bounds(&adv, now)
        .unwrap_err()
        .starts_with("service_data"));
}

#[tokio::test]
async fn bad_lines_are_counted_by_line_number_and_the_rest_arrive() {
    let mut text = Vec::new();
    text.extend_from_slice((record(1) + "\n").as_bytes()); // line 1
    text.extend_from_slice(b"{not json\n"); // line 2
    text.extend_from_slice(b"\n"); // line 3: blank, ignored
    text.extend_from_slice(br#"{"ts": 1, "mac": "nope"}"#); // line 4
    text.extend_from_slice(b"\r\n");
    text.extend_from_slice(b"\xff\xfe\n"); // line 5: not UTF-8
    text.extend_from_slice((record(2) + "\r\n").as_bytes()); // line 6
    text.extend_from_slice(b"   \n"); // line 7: blank
    text.extend_from_slice(record(3).as_bytes()); // line 8, no final newline
    let f = file_with(&text);
    let logs = LogCapture::default();
    let (report, got) = {
        let _guard = tracing::subscriber::set_default(logs.subscriber());
        collect(f.path().to_path_buf(), 16).await
    };
    assert_eq!(
        report,
        SourceReport {
            adverts: 3,
            malformed: 3
        }
    );
    let macs: Vec<String> = got.iter().map(|a| a.mac.to_string()).collect();
    assert_eq!(
        macs,
        [
            "C0:FF:EE:00:00:01",
            "C0:FF:EE:00:00:02",
            "C0:FF:EE:00:00:03"
        ]
    );

    let warnings: Vec<String> = logs
        .text()
        .lines()
        .filter(|l| l.contains("WARN"))
        .map(str::to_string)
        .collect();
    assert_eq!(warnings.len(), 3, "{warnings:#?}");
    for (w, line) in warnings.iter().zip([2, 4, 5]) {
        assert!(w.contains(&format!("replay line {line} skipped: ")), "{w}");
        assert!(w.contains(&format!("line={line}")), "{w}");
    }
    assert!(
        warnings[0].contains("not a JSON advertisement record"),
        "{}",
        warnings[0]
    );
    assert!(warnings[1].contains("skipped: mac:"), "{}", warnings[1]);
    assert!(warnings[2].contains("not valid UTF-8"), "{}", warnings[2]);
}

/// Collects what is logged on this thread (the tests run on one thread).
#[derive(Clone, Default)]
struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let sink = self.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || sink.clone())
            .finish()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_missing_file_is_a_replay_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.jsonl");
    let (tx, _rx) = mpsc::channel(1);
    let err = Replay::new(&path, test_clock())
        .run(tx, CancellationToken::new())
        .await
        .unwrap_err();
    assert!(matches!(&err, SourceError::Replay { path: p, .. } if *p == path));
    assert!(err.to_string().contains("missing.jsonl"), "{err}");
}

#[tokio::test]
async fn the_stop_token_ends_a_replay_blocked_on_a_full_channel() {
    let text: String = (0..1000).map(|i| record(i) + "\n").collect();
    let f = file_with(text.as_bytes());
    let (tx, mut rx) = mpsc::channel(8);
    let stop = CancellationToken::new();
    let task = tokio::spawn(Replay::new(f.path(), test_clock()).run(tx, stop.clone()));
    let first = rx.recv().await.unwrap();
    assert_eq!(first.advert.mac.to_string(), "C0:FF:EE:00:00:00");
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("replay ends when stopped")
        .unwrap()
        .unwrap();
    assert!(report.adverts < 1000, "{report:?}");
}

#[tokio::test]
async fn stopping_passes_on_what_was_already_read_and_stops_reading() {
    let (mut writer, reader) = tokio::io::duplex(1 << 16);
    let lines: String = (0..3).map(|i| record(i) + "\n").collect();
    tokio::io::AsyncWriteExt::write_all(&mut writer, lines.as_bytes())
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::channel(10);
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            replay(
                BufReader::new(reader),
                &tx,
                &stop,
                &crate::clock::SystemClock,
            )
            .await
        }
    });
    // One read took all three lines; the first is through, two are held.
    let first = rx.recv().await.unwrap();
    stop.cancel();
    let report = task.await.unwrap().unwrap();
    let mut got = vec![first];
    while let Some(adv) = rx.recv().await {
        got.push(adv);
    }
    assert_eq!(report.adverts, 3);
    assert_eq!(got.len(), 3, "the held lines were passed on");
    // The writer is still open: the replay ended on the stop, not at the end.
    drop(writer);
}

#[tokio::test]
async fn a_closed_receiver_ends_the_replay() {
    let text: String = (0..1000).map(|i| record(i) + "\n").collect();
    let f = file_with(text.as_bytes());
    let (tx, rx) = mpsc::channel(8);
    drop(rx);
    let report = Replay::new(f.path(), test_clock())
        .run(tx, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.adverts, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_recording_replays_quickly() {
    let n = 100_000;
    let mut text = String::with_capacity(n as usize * 120);
    for i in 0..n {
        text.push_str(&record(i));
        text.push('\n');
    }
    let f = file_with(text.as_bytes());
    let started = Instant::now();
    let (report, got) = collect(f.path().to_path_buf(), 1024).await;
    let took = started.elapsed();
    assert_eq!((report.adverts, got.len()), (u64::from(n), n as usize));
    // Unoptimised test builds are several times slower than release.
    assert!(took < Duration::from_secs(20), "{n} lines took {took:?}");
}

/// The clock the source stamps by: one that reads a fixed day.
fn test_clock() -> crate::clock::SharedClock {
    let day = crate::clock::fake::FIXED_DAYS[3];
    std::sync::Arc::new(crate::clock::fake::HandClock::at(day.wall_ms))
}
