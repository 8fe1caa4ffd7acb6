//! What a test may ask of a debug build of the daemon, as one value: built once by the
//! binary's entry point from the environment (debug builds, or the `test-hooks` feature
//! for a benchmark's release build) and handed down like the clock. A release build
//! makes only the empty value: it reads no test variable.

use std::path::PathBuf;
use std::time::Duration;

/// Names a Unix socket whose peer plays the kernel's management socket.
pub const MGMT_SOCKET_ENV: &str = "TAPEGATE_MGMT_SOCKET";
/// Names a stage (`flush`, `ingest`, ...) that panics at its start, as a real bug would.
pub const PANIC_STAGE_ENV: &str = "TAPEGATE_DEBUG_PANIC_STAGE";
/// Milliseconds the tapes' unwritten readings wait instead of a minute (0: written with
/// every answer), for tests that read `tapes` from another process while the daemon runs.
pub const LATEST_EVERY_ENV: &str = "TAPEGATE_LATEST_EVERY_MS";

/// The test hooks in force; [`DebugHooks::default`] is none, as in a release build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DebugHooks {
    /// Read management frames from this peer instead of the kernel.
    pub mgmt_socket: Option<PathBuf>,
    /// Panic this stage at its start.
    pub panic_stage: Option<String>,
    /// How long the tapes' unwritten readings wait.
    pub latest_every: Option<Duration>,
}

impl DebugHooks {
    /// The hooks the environment asks for (compiled in debug builds and with the
    /// `test-hooks` feature only).
    #[cfg(any(debug_assertions, feature = "test-hooks"))]
    pub fn from_env() -> DebugHooks {
        DebugHooks::from_vars(|name| std::env::var(name).ok())
    }

    /// The hooks `var` names (an empty value is none).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> DebugHooks {
        let set = |name| var(name).filter(|v: &String| !v.is_empty());
        DebugHooks {
            mgmt_socket: set(MGMT_SOCKET_ENV).map(PathBuf::from),
            panic_stage: set(PANIC_STAGE_ENV),
            latest_every: set(LATEST_EVERY_ENV)
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
        }
    }

    /// Panics if the hooks ask `stage` to.
    pub fn panic_if_asked(&self, stage: &str) {
        if self.panic_stage.as_deref() == Some(stage) {
            panic!("{PANIC_STAGE_ENV} asked the {stage} stage to panic");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variable_sets_its_hook_and_an_empty_one_sets_none() {
        let vars = |name: &str| match name {
            MGMT_SOCKET_ENV => Some("/run/peer.sock".to_string()),
            PANIC_STAGE_ENV => Some(String::new()),
            LATEST_EVERY_ENV => Some("0".to_string()),
            _ => None,
        };
        let hooks = DebugHooks::from_vars(vars);
        assert_eq!(hooks.mgmt_socket, Some(PathBuf::from("/run/peer.sock")));
        assert_eq!(hooks.panic_stage, None);
        assert_eq!(hooks.latest_every, Some(Duration::ZERO));
        assert_eq!(DebugHooks::from_vars(|_| None), DebugHooks::default());
    }
}
