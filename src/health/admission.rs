//! Whether captures can be committed now ([`Admission`]). The ingest stage says so at
//! every commit; and the state directory's file system is looked at whenever health is
//! asked (`crate::outbox::why_read_only`: no write, a `statvfs` and two small reads), so
//! that a file system turned read-only (an SD card's, after an error) makes `/healthz`
//! answer 503 at once, naming the directory and what to do, even at a dock that hears
//! nothing and so commits nothing.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::db::why_read_only;

/// Whether captures can be committed now (see the module doc).
#[derive(Debug, Default)]
pub struct Admission {
    /// Why commits fail, and since when; `None` while they succeed.
    failing: Mutex<Option<Failing>>,
    /// The state directory, whose file system is looked at; `None`: not looked at.
    state_dir: Option<PathBuf>,
}

#[derive(Debug)]
struct Failing {
    reason: String,
    since: Instant,
    /// Seen by looking at the file system, not by a commit that failed: it ends when
    /// the file system takes writes again.
    looked: bool,
}

impl Admission {
    /// An admission that also looks at the file system of `state_dir`.
    pub fn watching(state_dir: &Path) -> Admission {
        Admission {
            failing: Mutex::default(),
            state_dir: Some(state_dir.to_path_buf()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Failing>> {
        self.failing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A commit failed, for `reason`.
    pub fn failed(&self, reason: String) {
        let mut failing = self.lock();
        match &mut *failing {
            Some(f) => {
                f.reason = reason;
                f.looked = false;
            }
            None => {
                *failing = Some(Failing {
                    reason,
                    since: Instant::now(),
                    looked: false,
                })
            }
        }
    }

    /// A commit succeeded.
    pub fn committed(&self) {
        let mut failing = self.lock();
        if failing.is_some() {
            *failing = None;
        }
    }

    /// Why commits fail (or cannot work: the state directory's file system is
    /// read-only) and for how long, while they do.
    pub fn failing(&self) -> Option<(String, Duration)> {
        let read_only = self.state_dir.as_deref().and_then(why_read_only);
        let mut failing = self.lock();
        match (&mut *failing, read_only) {
            (Some(f), _) if !f.looked => {}
            (Some(f), Some(why)) => f.reason = why,
            (None, Some(why)) => {
                *failing = Some(Failing {
                    reason: why,
                    since: Instant::now(),
                    looked: true,
                })
            }
            (Some(_), None) => *failing = None,
            (None, None) => {}
        }
        failing
            .as_ref()
            .map(|f| (f.reason.clone(), f.since.elapsed()))
    }
}
