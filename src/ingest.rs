/*!
The ingest stage: advertisements → products → dedup → commit groups in the outbox.
An advertisement the source already matched (BLE) comes with its capture and is not
matched again.

Captures are collected into a group and committed every `outbox.commit_interval_ms` or
every [`GROUP_MAX`] captures. A capture is *accepted* when its group commits; the group
held here is the whole loss window of a crash. A commit that fails (disk full, I/O
error) keeps the group and retries it with backoff; meanwhile no advertisement is read,
so the bounded channel behind the source applies back-pressure.

The stage ends when its input closes (the source ended or was stopped), after admitting
what dedup still holds and committing the last group.
*/

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::clock::now_ms;
use crate::dedup::{Dedup, DedupSettings};
use crate::heard_now::HeardNow;
use crate::metrics::Metrics;
use crate::outbox::{Outbox, GROUP_MAX};
use crate::products::Products;
use crate::record::{Capture, EpochMillis};
use crate::source::Heard;
use crate::systemd::Beat;

/// A failed commit is retried after this, doubling (no jitter: one writer)...
const COMMIT_RETRY_INITIAL: Duration = Duration::from_millis(100);
/// ...up to this, so that space coming back is noticed within seconds.
const COMMIT_RETRY_MAX: Duration = Duration::from_secs(5);

/// What the ingest stage did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    pub adverts: u64,
    /// Matched no product.
    pub unmatched: u64,
    /// Dropped or merged by dedup.
    pub deduplicated: u64,
    /// Committed to the outbox.
    pub accepted: u64,
    /// Evicted from the outbox to stay within `max_pending`.
    pub evicted: u64,
    /// Captures that could not be committed before shutdown gave up (logged at ERROR).
    pub lost: u64,
}

/// Settings the stage needs.
pub struct IngestSettings {
    pub products: Products,
    pub dedup: DedupSettings,
    pub commit_interval: Duration,
    /// Release held captures on wall-clock time (live sources) rather than only on the
    /// capture times seen (replay, synthetic simulation).
    pub live: bool,
    /// Touched on every turn, for the watchdog.
    pub beat: Beat,
    /// New products (SIGHUP).
    pub reload_products: Option<watch::Receiver<Products>>,
    /// New dedup settings (SIGHUP); dedup keeps its per-MAC state.
    pub reload_dedup: Option<watch::Receiver<DedupSettings>>,
    /// Counts every advertisement for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Keeps each tape's last RSSI for the status page.
    pub tapes_heard: Arc<HeardNow>,
}

/// Runs the stage until `input` closes. `committed` is bumped after every commit so the
/// flusher knows there is new work. `abandon` is cancelled when the shutdown grace has
/// run out: a group that still cannot be committed is then given up (and logged).
pub async fn run(
    settings: IngestSettings,
    mut input: mpsc::Receiver<Heard>,
    outbox: Outbox,
    committed: watch::Sender<u64>,
    abandon: CancellationToken,
) -> IngestReport {
    let mut dedup = Dedup::new(settings.dedup);
    let mut products = settings.products;
    let mut reload_products = settings.reload_products;
    let mut reload_dedup = settings.reload_dedup;
    let beat = settings.beat;
    let mut report = IngestReport::default();
    let mut group: Vec<Capture> = Vec::with_capacity(GROUP_MAX);
    let mut admitted: Vec<Capture> = Vec::with_capacity(4);
    let mut clock: EpochMillis = EpochMillis::MIN;
    let mut tick = tokio::time::interval(settings.commit_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut committer = Committer::new(outbox, committed, abandon, beat.clone());

    loop {
        tokio::select! {
            biased;
            heard = input.recv() => {
                let Some(heard) = heard else { break };
                report.adverts += 1;
                clock = clock.max(heard.advert.ts_ms);
                let Some(capture) = heard.capture.map(|c| *c).or_else(|| products.capture(&heard.advert)) else {
                    report.unmatched += 1;
                    settings.metrics.advert(false);
                    continue;
                };
                settings.metrics.advert(true);
                settings.tapes_heard.heard(capture.mac, capture.rssi, now_ms());
                dedup.offer(capture, &mut admitted);
                group.append(&mut admitted);
                if group.len() >= GROUP_MAX {
                    committer.commit(&mut group, &mut report).await;
                }
            }
            new = reloaded(&mut reload_products) => {
                products = new;
                tracing::info!(products = products.0.len(), "reloaded products");
            }
            new = reloaded(&mut reload_dedup) => {
                dedup.set_settings(new);
                tracing::info!("reloaded dedup settings");
            }
            _ = tick.tick() => {
                beat.touch();
                let now = if settings.live { clock.max(now_ms()) } else { clock };
                dedup.release_due(now, &mut admitted);
                group.append(&mut admitted);
                committer.commit(&mut group, &mut report).await;
            }
        }
    }
    dedup.drain(&mut admitted);
    group.append(&mut admitted);
    committer.commit(&mut group, &mut report).await;
    report.deduplicated = report.adverts - report.unmatched - report.accepted - report.lost;
    report
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

/// Commits groups, retrying a failed one with backoff until it commits or shutdown
/// gives up on it.
struct Committer {
    outbox: Outbox,
    committed: watch::Sender<u64>,
    abandon: CancellationToken,
    beat: Beat,
}

impl Committer {
    fn new(
        outbox: Outbox,
        committed: watch::Sender<u64>,
        abandon: CancellationToken,
        beat: Beat,
    ) -> Self {
        Committer {
            outbox,
            committed,
            abandon,
            beat,
        }
    }

    async fn commit(&mut self, group: &mut Vec<Capture>, report: &mut IngestReport) {
        if group.is_empty() {
            return;
        }
        let mut backoff = Backoff::new(COMMIT_RETRY_INITIAL, COMMIT_RETRY_MAX);
        loop {
            let batch = std::mem::take(group);
            let n = batch.len() as u64;
            let (result, batch) = self
                .outbox
                .call(move |store| {
                    let r = store.enqueue(&batch);
                    Ok((r, batch))
                })
                .await
                .unwrap_or_else(|e| (Err(e), Vec::new()));
            match result {
                Ok(evicted) => {
                    report.accepted += n;
                    if evicted > 0 {
                        report.evicted += evicted;
                        tracing::error!(
                            evicted,
                            "outbox full (outbox.max_pending): evicted the oldest pending captures"
                        );
                    }
                    if backoff.failures() > 0 {
                        tracing::info!(
                            captures = n,
                            failures = backoff.failures(),
                            "outbox write recovered"
                        );
                    }
                    self.committed.send_modify(|c| *c += n);
                    return;
                }
                Err(e) if e.is_retryable() && !self.abandon.is_cancelled() => {
                    *group = batch;
                    let delay = backoff.next_delay(1.0, None);
                    // Holding a group on a full disk is not a stall.
                    self.beat.touch();
                    if backoff.failures() == 1 {
                        tracing::warn!(captures = n, error = %e, "outbox write failed; holding the group and retrying");
                    } else {
                        tracing::debug!(
                            captures = n,
                            failures = backoff.failures(),
                            retry_in_ms = delay.as_millis() as u64,
                            "outbox write failed again; still holding the group"
                        );
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(Instant::now() + delay) => {}
                        _ = self.abandon.cancelled() => {}
                    }
                }
                Err(e) => {
                    report.lost += n;
                    tracing::error!(captures = n, error = %e, "captures lost: the outbox could not take them before shutdown");
                    return;
                }
            }
        }
    }
}
