//! The operator commands through the real binary against the mock service on loopback:
//! the shared rate window, chunking, per-device results, label never repeated blindly,
//! AWB retry, history splitting, CSV manifests and `device add --nearest`; each
//! item against the reading of the spec that shows it.
//!
//! Where the spec is silent the mock plays each reading (`tapegate_mock::Readings`):
//! the tests run under every variant of [`Readings::variants`] (a loop inside the
//! test), except those that wait for the rate window, which run under one variant per
//! rate reading. The mock runs in-process; each command is a child process with its own
//! state database in a temp dir.

mod common;

mod operator {
    pub mod support;

    mod devices;
    mod input_and_output;
    mod locate_and_history;
    mod rate_window;
}
