/*!
The ingest stage: advertisements → products → dedup → commit groups in the outbox.
An advertisement the source already matched (BLE) comes with its capture and is not
matched again.

Captures are collected into a group and committed `outbox.commit_interval_ms` after
the group opened, or at [`GROUP_MAX`] captures. The only timer is that commit (or a
capture dedup holds): with nothing in hand the stage sleeps on its input and tells the
watchdog it is idle, so a quiet dock costs nothing here. A capture is *accepted* when its group commits; the group
held here is the whole loss window of a crash. A commit that fails (disk full, I/O
error) keeps the group and retries it with backoff; meanwhile no advertisement is read,
so the bounded channel behind the source applies back-pressure. From the first failed
commit to the next good one, [`Admission`] says so (`/healthz` answers 503 with the
reason); a cause that waiting will not cure (a database this user cannot write) is
logged at ERROR with the path and the fix.

The stage ends when its input closes (the source ended or was stopped), after admitting
what dedup still holds and committing the last group. It touches the outbox only
through its handle ([`IngestWriter`]: commit a group, say why it cannot be written).
*/

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{ClockKeeper, SharedClock};
use crate::dedup::{Dedup, DedupSettings};
use crate::health::Admission;
use crate::heard_now::HeardNow;
use crate::metrics::Metrics;
use crate::outbox::{IngestWriter, GROUP_MAX};

mod commit;

use crate::products::Products;
use crate::record::{Capture, EpochMillis};
use crate::source::Heard;
use crate::util::systemd::Beat;
use commit::Committer;
pub use commit::IngestReport;

/// Advertisements taken from the source's channel at most per wake-up.
const RECV_BATCH: usize = 256;

/// Settings the stage needs.
pub struct IngestSettings {
    pub products: Products,
    pub dedup: DedupSettings,
    pub commit_interval: Duration,
    /// Live sources (BLE, real-time simulation): captures carry boot time, which orders
    /// them and releases dedup's held captures (a wall clock may step); otherwise only
    /// the capture times seen do (replay, synthetic simulation).
    pub live: bool,
    /// Holds and releases captures while the clock is not trusted (`None`: never held).
    pub clock: Option<ClockKeeper>,
    /// The clock captures are stamped by (wall time for what is heard, boot time for
    /// live sources).
    pub time: SharedClock,
    /// Touched on every turn, idle while there is nothing in hand, for the watchdog.
    pub beat: Beat,
    /// New products (SIGHUP).
    pub reload_products: Option<watch::Receiver<Products>>,
    /// New dedup settings (SIGHUP); dedup keeps its per-MAC state.
    pub reload_dedup: Option<watch::Receiver<DedupSettings>>,
    /// Counts every advertisement for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Keeps each tape's last RSSI for the status page.
    pub tapes_heard: Arc<HeardNow>,
    /// Told whether each commit succeeded, for `/healthz`.
    pub admission: Arc<Admission>,
}

/// Runs the stage until `input` closes. `committed` is bumped after every commit so the
/// flusher knows there is new work. `abandon` is cancelled when the shutdown grace has
/// run out: a group that still cannot be committed is then given up (and logged).
pub async fn run(
    mut settings: IngestSettings,
    mut input: mpsc::Receiver<Heard>,
    outbox: IngestWriter,
    committed: watch::Sender<u64>,
    abandon: CancellationToken,
) -> IngestReport {
    let mut committer = Committer {
        outbox,
        committed,
        abandon,
        beat: settings.beat.clone(),
        admission: settings.admission.clone(),
    };
    let mut intake = Intake::new(&settings);
    let mut reload_products = settings.reload_products.take();
    let mut reload_dedup = settings.reload_dedup.take();
    let mut keeper = settings.clock.take();
    // Armed only while a group is open or dedup holds a capture: a quiet dock sleeps on
    // its input alone, with no timer.
    let commit_at = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(commit_at);
    let mut armed = false;
    let mut batch: Vec<Heard> = Vec::with_capacity(RECV_BATCH);

    loop {
        if !armed && intake.holds_any() {
            commit_at
                .as_mut()
                .reset(Instant::now() + settings.commit_interval);
            armed = true;
        }
        if !armed {
            settings.beat.idle();
        }
        tokio::select! {
            biased;
            // Everything already queued at one wake-up.
            n = input.recv_many(&mut batch, RECV_BATCH) => {
                if n == 0 {
                    break;
                }
                intake.take(&settings, &mut batch, &mut committer).await;
            }
            new = reloaded(&mut reload_products) => {
                tracing::info!(products = new.0.len(), "reloaded products");
                intake.products = new;
            }
            new = reloaded(&mut reload_dedup) => {
                intake.dedup.set_settings(new);
                tracing::info!("reloaded dedup settings");
            }
            () = clock_due(&keeper) => {
                if let Some(k) = keeper.as_mut() {
                    committer.check_clock(k).await;
                }
            }
            () = &mut commit_at, if armed => {
                armed = false;
                intake.due(&settings, &mut committer).await;
            }
        }
    }
    intake.finish(&mut committer).await
}

/// What the stage holds between commits: products and dedup, the open group, the
/// report.
struct Intake {
    dedup: Dedup,
    products: Products,
    group: Vec<Capture>,
    admitted: Vec<Capture>,
    /// The latest time seen (boot time for live sources, capture time otherwise).
    clock: EpochMillis,
    report: IngestReport,
}

impl Intake {
    fn new(settings: &IngestSettings) -> Intake {
        Intake {
            dedup: Dedup::new(settings.dedup),
            products: settings.products.clone(),
            group: Vec::with_capacity(GROUP_MAX),
            admitted: Vec::with_capacity(4),
            clock: EpochMillis::MIN,
            report: IngestReport::default(),
        }
    }

    /// A group is open or dedup holds a capture: a commit is to come.
    fn holds_any(&self) -> bool {
        !self.group.is_empty() || self.dedup.held() > 0
    }

    /// Matches, dedups and groups what was heard; commits a group once it is full.
    async fn take(
        &mut self,
        settings: &IngestSettings,
        batch: &mut Vec<Heard>,
        committer: &mut Committer,
    ) {
        settings.beat.touch();
        let heard_at = settings.time.wall_ms();
        // Boot time is taken on receipt: the source's channel delay apart, the moment
        // the wall time was stamped.
        let boot = settings.live.then(|| settings.time.boot_ms());
        for heard in batch.drain(..) {
            self.report.adverts += 1;
            self.clock = self.clock.max(boot.unwrap_or(heard.advert.ts_ms));
            let Some(mut capture) = heard
                .capture
                .map(|c| *c)
                .or_else(|| self.products.capture(&heard.advert))
            else {
                self.report.unmatched += 1;
                settings.metrics.advert(false);
                continue;
            };
            capture.boot_ms = boot;
            settings.metrics.advert(true);
            settings
                .tapes_heard
                .heard(capture.mac, capture.rssi, heard_at);
            self.dedup.offer(capture, &mut self.admitted);
            self.group.append(&mut self.admitted);
            if self.group.len() >= GROUP_MAX {
                committer.commit(&mut self.group, &mut self.report).await;
            }
        }
    }

    /// The commit interval has passed: releases what dedup held long enough and commits.
    async fn due(&mut self, settings: &IngestSettings, committer: &mut Committer) {
        settings.beat.touch();
        let now = if settings.live {
            self.clock.max(settings.time.boot_ms())
        } else {
            self.clock
        };
        self.dedup.release_due(now, &mut self.admitted);
        self.group.append(&mut self.admitted);
        committer.commit(&mut self.group, &mut self.report).await;
    }

    /// The input closed: admits what dedup still holds and commits the last group.
    async fn finish(mut self, committer: &mut Committer) -> IngestReport {
        self.dedup.drain(&mut self.admitted);
        self.group.append(&mut self.admitted);
        committer.commit(&mut self.group, &mut self.report).await;
        let r = &mut self.report;
        r.deduplicated = r.adverts - r.unmatched - r.accepted - r.lost;
        self.report
    }
}

/// When the clock keeper wants to look at the clock; never without one.
async fn clock_due(keeper: &Option<ClockKeeper>) {
    match keeper {
        Some(k) => k.due().await,
        None => std::future::pending().await,
    }
}

/// The next reloaded value; pending when there is none to wait for (no reload, or its
/// sender is gone: then the receiver is dropped so this does not spin).
async fn reloaded<T: Clone>(reload: &mut Option<watch::Receiver<T>>) -> T {
    if let Some(r) = reload {
        if r.changed().await.is_ok() {
            return r.borrow_and_update().clone();
        }
        *reload = None;
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::{Outbox, Retention, StoreOptions};
    use crate::record::{Advertisement, Mac};
    use crate::util::systemd::Liveness;

    const INTERVAL: Duration = Duration::from_millis(200);
    const ALLOWANCE: Duration = Duration::from_secs(10);

    /// One tape advert at `ts_ms`, already matched (as the BLE source sends it).
    fn heard(n: u8, ts_ms: EpochMillis) -> Heard {
        let mac = Mac::new([0xC0, 0xFF, 0xEE, 0, 0, n]);
        Heard {
            advert: Advertisement {
                ts_ms,
                mac,
                rssi: Some(-60),
                name: None,
                manufacturer_data: Vec::new(),
                service_data: Vec::new(),
            },
            capture: Some(Box::new(Capture {
                mac,
                ts_ms,
                product_id: "tape".into(),
                packet: format!("F70E{n:02X}"),
                rssi: Some(-60),
                boot_ms: None,
            })),
        }
    }

    /// A running ingest stage on a real outbox in `dir`, dedup as given: its input, the
    /// commit count it bumps, the watchdog's view of it and the task.
    fn start(
        dir: &std::path::Path,
        dedup: DedupSettings,
    ) -> (
        mpsc::Sender<Heard>,
        watch::Receiver<u64>,
        Liveness,
        tokio::task::JoinHandle<IngestReport>,
    ) {
        let (outbox, _owner) = Outbox::open(dir, StoreOptions::default(), Retention::default())
            .unwrap()
            .start()
            .unwrap();
        let mut liveness = Liveness::default();
        let beat = liveness.stage("ingest", ALLOWANCE);
        let (tx, rx) = mpsc::channel(16);
        let (committed_tx, committed) = watch::channel(0);
        let task = tokio::spawn(run(
            IngestSettings {
                products: Products(Vec::new()),
                dedup,
                commit_interval: INTERVAL,
                live: true,
                clock: None,
                time: crate::clock::system(),
                beat,
                reload_products: None,
                reload_dedup: None,
                metrics: Arc::default(),
                tapes_heard: Arc::default(),
                admission: Arc::default(),
            },
            rx,
            crate::outbox::Handles::new(&outbox).ingest(),
            committed_tx,
            CancellationToken::new(),
        ));
        (tx, committed, liveness, task)
    }

    fn no_dedup() -> DedupSettings {
        DedupSettings {
            window_ms: 0,
            min_interval_ms: 0,
            max_tracked: 1000,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_is_committed_one_commit_interval_after_it_opened() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut committed, _liveness, task) = start(dir.path(), no_dedup());
        let opened = Instant::now();
        tx.send(heard(1, crate::clock::system().wall_ms()))
            .await
            .unwrap();
        tx.send(heard(2, crate::clock::system().wall_ms()))
            .await
            .unwrap();
        tokio::time::advance(INTERVAL - Duration::from_millis(1)).await;
        assert_eq!(*committed.borrow(), 0, "held until the interval ends");
        committed.changed().await.unwrap();
        assert_eq!(
            *committed.borrow_and_update(),
            2,
            "one group, both captures"
        );
        assert!(opened.elapsed() >= INTERVAL);
        drop(tx);
        assert_eq!(task.await.unwrap().accepted, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stage_is_idle_for_the_watchdog_not_stalled() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut committed, liveness, task) = start(dir.path(), no_dedup());
        // Long past the allowance with nothing to do: idle, and no stall.
        tokio::time::sleep(ALLOWANCE * 100).await;
        assert_eq!(liveness.check(Instant::now()), Ok(()));
        tx.send(heard(1, crate::clock::system().wall_ms()))
            .await
            .unwrap();
        committed.changed().await.unwrap();
        tokio::time::sleep(ALLOWANCE * 100).await;
        assert_eq!(liveness.check(Instant::now()), Ok(()));
        drop(tx);
        assert_eq!(task.await.unwrap().accepted, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_capture_dedup_holds_is_released_by_the_commit_timer_alone() {
        let dir = tempfile::tempdir().unwrap();
        let dedup = DedupSettings {
            window_ms: 0,
            min_interval_ms: 50,
            max_tracked: 1000,
        };
        let (tx, mut committed, _liveness, task) = start(dir.path(), dedup);
        let first = heard(1, crate::clock::system().wall_ms());
        let mut changed = heard(1, crate::clock::system().wall_ms());
        if let Some(c) = &mut changed.capture {
            c.packet = "F70E99".into();
        }
        tx.send(first).await.unwrap();
        tx.send(changed).await.unwrap();
        committed.changed().await.unwrap();
        assert_eq!(*committed.borrow_and_update(), 1, "the second is held");
        // No more input: the held capture still comes out once its interval has passed.
        committed.changed().await.unwrap();
        assert_eq!(*committed.borrow(), 2);
        drop(tx);
        assert_eq!(task.await.unwrap().accepted, 2);
    }
}
