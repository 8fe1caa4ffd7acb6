//! Watching the stages: each a task, all watched at once, not awaited in order. One that
//! dies (a panic, a failed source) is noticed when it happens and the ordered shutdown
//! begins ([`Stopper`]); a stop signal begins it too; past the grace, what cannot finish is
//! abandoned. Touches the stages only through their tasks and the stop tokens.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::RunError;
use super::parts::Stops;
use crate::flush::FlushReport;
use crate::ingest::IngestReport;
use crate::source::SourceReport;
use crate::util::debug_hooks::DebugHooks;
use crate::util::systemd::{Beat, Notifier};

/// What the stages reported as they ended, and how the run ended.
#[derive(Default)]
pub(super) struct Outcome {
    pub source: Option<SourceReport>,
    pub ingest: Option<IngestReport>,
    pub flush: Option<FlushReport>,
    /// A stop signal (the `shutdown` future) ended the run.
    pub stopped: bool,
    /// The first stage that failed, and why.
    pub failure: Option<RunError>,
}

/// Watches `stages` until they have all ended after a stop (or, with `until_drained`,
/// on their own): a stage that dies and `shutdown` each begin the ordered shutdown; past
/// the grace, `abandon` is cancelled.
pub(super) async fn watch(
    mut stages: Stages,
    mut stopper: Stopper,
    shutdown: impl Future<Output = ()> + Send,
    until_drained: bool,
    abandon: &CancellationToken,
) -> Outcome {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut abandoned = false;
    let mut outcome = Outcome::default();
    loop {
        // Without --until-drained, a daemon whose stages have all ended (a replay
        // without a [service]) waits for its stop signal like any other.
        if stages.running.is_empty() && (until_drained || stopper.deadline.is_some()) {
            break;
        }
        let grace_over = async {
            match stopper.deadline {
                Some(at) if !abandoned => tokio::time::sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            next = stages.running.next(), if !stages.running.is_empty() => {
                let Some((stage, ended)) = next else { break };
                outcome.note(stage, ended, &mut stopper);
            }
            _ = &mut shutdown, if stopper.deadline.is_none() => {
                outcome.stopped = true;
                tracing::info!("shutting down: stopping the source, committing what is held, finishing the batch in flight");
                stopper.begin();
            }
            _ = grace_over => {
                tracing::warn!(
                    grace_secs = stopper.grace.as_secs(),
                    "shutdown grace ran out; abandoning what cannot finish (it stays pending)"
                );
                abandon.cancel();
                abandoned = true;
            }
        }
    }
    outcome
}

impl Outcome {
    /// `stage` ended: keeps its report, or notes its failure and begins the shutdown.
    fn note(
        &mut self,
        stage: &'static str,
        ended: Result<Ended, tokio::task::JoinError>,
        stopper: &mut Stopper,
    ) {
        match ended {
            Ok(Ended::Source(Ok(report))) => self.source = Some(report),
            Ok(Ended::Source(Err(e))) => {
                // The reason in the message itself: `journalctl -p warning -o cat`
                // and `systemctl status` show the message, not the fields.
                tracing::error!(stage, "the source failed, stopping: {e}");
                // systemd keeps the last STATUS= after the exit: `systemctl status`
                // then says why the unit failed (when systemd reads it before it
                // reaps the process: without a barrier, not always).
                stopper.notifier.status(&format!("the source failed: {e}"));
                self.failure.get_or_insert(e);
                stopper.begin();
            }
            Ok(Ended::Ingest(report)) => self.ingest = Some(report),
            Ok(Ended::Flush(report)) => self.flush = Some(report),
            Err(source) => {
                tracing::error!(stage, error = %source, "the {stage} stage died; stopping the daemon (exit 1) so that it is restarted");
                self.failure
                    .get_or_insert(RunError::Stage { stage, source });
                stopper.begin();
            }
        }
    }
}

/// How a stage's task ended, when it did not die.
pub(super) enum Ended {
    Source(Result<SourceReport, RunError>),
    Ingest(IngestReport),
    Flush(FlushReport),
}

type StageEnd = (&'static str, Result<Ended, tokio::task::JoinError>);

/// The running stages, each a task, watched together.
#[derive(Default)]
pub(super) struct Stages {
    running: FuturesUnordered<BoxFuture<'static, StageEnd>>,
    /// A debug build's hooks: a stage a test asks to panic at its start, as a real bug
    /// would.
    hooks: DebugHooks,
}

impl Stages {
    pub(super) fn new(hooks: DebugHooks) -> Stages {
        Stages {
            running: FuturesUnordered::new(),
            hooks,
        }
    }

    /// Spawns `stage` as a task named `name`; its end is reported as `ended` of its
    /// output. A stage that ends normally marks its `beat` done: a finished stage (the
    /// ingest after a replay reached its end) is not a stuck one, and the watchdog goes
    /// on pinging for the stages still running.
    pub(super) fn spawn<T: Send + 'static>(
        &mut self,
        name: &'static str,
        stage: impl Future<Output = T> + Send + 'static,
        ended: fn(T) -> Ended,
        beat: Option<Beat>,
    ) {
        let hooks = self.hooks.clone();
        let task = tokio::spawn(
            async move {
                hooks.panic_if_asked(name);
                let out = stage.await;
                if let Some(beat) = beat {
                    beat.done();
                }
                out
            }
            .in_current_span(),
        );
        self.running
            .push(Box::pin(async move { (name, task.await.map(ended)) }));
    }
}

/// Begins the ordered shutdown once: the source is told to stop (the ingest stage behind
/// it ends as its input closes) and the flusher to send nothing new (it waits for the
/// answers of its batches in flight); past the grace, what is left is abandoned.
pub(super) struct Stopper {
    notifier: Notifier,
    stop_source: CancellationToken,
    stop_flush: CancellationToken,
    grace: Duration,
    /// When the grace runs out; `None` while not stopping.
    deadline: Option<tokio::time::Instant>,
}

impl Stopper {
    /// A stopper that will tell `notifier` (STOPPING=1) and cancel the source's and the
    /// flusher's tokens of `stops`, giving the stages `grace` to finish.
    pub(super) fn new(notifier: Notifier, stops: &Stops, grace: Duration) -> Stopper {
        Stopper {
            notifier,
            stop_source: stops.source.clone(),
            stop_flush: stops.flush.clone(),
            grace,
            deadline: None,
        }
    }

    fn begin(&mut self) {
        if self.deadline.is_some() {
            return;
        }
        self.notifier.stopping();
        self.stop_source.cancel();
        self.stop_flush.cancel();
        self.deadline = Some(tokio::time::Instant::now() + self.grace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::systemd::Liveness;

    #[tokio::test(start_paused = true)]
    async fn a_stage_that_ends_normally_leaves_the_watchdog_satisfied() {
        let mut liveness = Liveness::default();
        let beat = liveness.stage("ingest", Duration::from_secs(30));
        let still_running = liveness.stage("flush", Duration::from_secs(30));
        let mut stages = Stages::default();
        stages.spawn(
            "ingest",
            async { IngestReport::default() },
            Ended::Ingest,
            Some(beat),
        );
        let (name, ended) = stages.running.next().await.unwrap();
        assert_eq!(name, "ingest");
        assert!(matches!(ended, Ok(Ended::Ingest(_))));
        // Long after the ingest stage ended, only a stage still running must beat.
        tokio::time::advance(Duration::from_secs(120)).await;
        still_running.touch();
        assert_eq!(liveness.check(tokio::time::Instant::now()), Ok(()));
    }

    #[tokio::test]
    async fn a_stage_that_panics_is_reported_with_its_name_and_message() {
        let mut stages = Stages::default();
        stages.spawn(
            "flush",
            async {
                if true {
                    panic!("boom in flush");
                }
                FlushReport::default()
            },
            Ended::Flush,
            None,
        );
        let (name, ended) = stages.running.next().await.unwrap();
        assert_eq!(name, "flush");
        let err = ended.err().expect("a panic");
        assert!(
            err.is_panic() && err.to_string().contains("boom in flush"),
            "{err}"
        );
    }
}
