//! The owner thread: one thread owns the [`Store`] and runs the jobs sent to it, so no
//! lock is ever held across an `.await` and async stages never block on SQLite.
//!
//! It touches only the [`Store`] it owns and [`OutboxError`]. The daemon's pipeline
//! opens the database and starts the thread through [`Outbox::open`] (the store itself
//! never leaves the outbox), the [`super::Seeder`] starts it too; only the outbox's own
//! handles (`users/`) send it jobs, and every user outside the outbox holds one of them.

use std::path::Path;

use tokio::sync::{mpsc, oneshot};

use super::store::{OpenReport, Store, StoreOptions};
use crate::config::Retention;
use crate::db::OutboxError;

type Job = Box<dyn FnOnce(&mut Store) + Send>;

/// A clonable handle to the store's owner thread. The thread ends (closing the
/// database cleanly) when the last handle is dropped; starting it returns its join
/// handle so shutdown can wait for that.
#[derive(Clone)]
pub struct Outbox {
    jobs: mpsc::Sender<Job>,
}

/// The daemon's database, opened and not yet handed to its owner thread: what opening
/// found, to be logged before anything else runs.
pub(crate) struct Opened {
    store: Store,
    pub(crate) report: OpenReport,
}

impl Opened {
    /// Starts the owner thread; its join handle is for waiting on the database's close.
    pub(crate) fn start(self) -> std::io::Result<(Outbox, std::thread::JoinHandle<()>)> {
        Outbox::start(self.store)
    }
}

impl Outbox {
    /// Opens the database of `state_dir` for the daemon with `options`, keeping it to
    /// `retention`: created and migrated as needed, a corrupt one moved aside (said in
    /// the report). Blocking: for a blocking thread.
    pub(crate) fn open(
        state_dir: &Path,
        options: StoreOptions,
        retention: Retention,
    ) -> Result<Opened, OutboxError> {
        let (mut store, report) = Store::open(state_dir, options)?;
        store.set_retention(retention);
        Ok(Opened { store, report })
    }

    /// Moves `store` to a new owner thread.
    pub(super) fn start(store: Store) -> std::io::Result<(Outbox, std::thread::JoinHandle<()>)> {
        // Few jobs are ever queued: each caller awaits its answer.
        let (jobs, mut rx) = mpsc::channel::<Job>(64);
        let thread = std::thread::Builder::new()
            .name("tapegate-outbox".into())
            .spawn(move || {
                let mut store = store;
                while let Some(job) = rx.blocking_recv() {
                    // Before every job (a commit group, a batch): a file deleted or
                    // replaced under us is noticed before anything else goes into it.
                    store.reopen_if_replaced();
                    job(&mut store);
                    if let Err(e) = store.write_latest_if_due() {
                        tracing::warn!(error = %e, "could not write the tapes' latest readings; will retry");
                    }
                }
                if let Err(e) = store.write_latest() {
                    tracing::warn!(error = %e, "could not write the tapes' latest readings at close; the last minute of them is lost (no capture is)");
                }
            })?;
        Ok((Outbox { jobs }, thread))
    }

    /// Runs `f` on the owner thread and returns its result.
    pub(super) async fn call<T, F>(&self, f: F) -> Result<T, OutboxError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Store) -> Result<T, OutboxError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |store| {
            // The caller may have gone away (shutdown); the result is then unwanted.
            let _ = tx.send(f(store));
        });
        self.jobs.send(job).await.map_err(|_| OutboxError::Closed)?;
        rx.await.map_err(|_| OutboxError::Closed)?
    }
}
