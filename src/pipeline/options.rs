//! How `run` behaves beyond the config: the caller's choices (drain and return, re-read
//! the config on SIGHUP). A leaf of the pipeline.

use std::path::PathBuf;

use crate::clock::SharedClock;
use crate::util::debug_hooks::DebugHooks;

/// How `run` behaves beyond the config.
pub struct RunOptions {
    /// Return once the source has ended and nothing deliverable is pending.
    pub until_drained: bool,
    /// Re-read the config on SIGHUP; `None`: SIGHUP is not handled here.
    pub reload: Option<Reload>,
    /// The clock every stage reads (the machine's by default; the binary's entry point
    /// may hand in the test clock of a debug build).
    pub clock: SharedClock,
    /// The kernel's management socket the unit's start step stored in systemd's file
    /// descriptor store, taken by the daemon's entry point whatever the source (one
    /// left in the store would refuse the next start step's); the BLE source reads the
    /// side channel from it, any other closes it.
    pub mgmt_socket: Option<std::os::fd::OwnedFd>,
    /// What a test asks of a debug build (none by default, and always none in a release
    /// build): made by the binary's entry point, like the clock.
    pub hooks: DebugHooks,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            until_drained: false,
            reload: None,
            clock: crate::clock::system(),
            mgmt_socket: None,
            hooks: DebugHooks::default(),
        }
    }
}

/// What SIGHUP re-reads: the config file (with the process environment's
/// `TAPEGATE_*` overrides). A valid new config is applied as [`crate::pipeline::reload`] says
/// (at once, or by restarting the delivery stage, the HTTP server or the pusher in
/// process), dropping nothing; a bad one is refused with an ERROR line and the running
/// one stays in force. What cannot change in a running daemon waits for a restart.
pub struct Reload {
    pub path: PathBuf,
    /// Applies a new `log.level` (the log subscriber belongs to the binary).
    pub set_log_level: SetLogLevel,
}

pub use crate::pipeline::reload::SetLogLevel;
