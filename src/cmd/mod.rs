//! The commands a person runs beside the daemon, apart from the pipeline stages:
//! reading and changing the state database (`status`, `tapes`, `dead-letters`),
//! `decode`, `check`, `scan` and `demo`. Each prints for a person or, where asked, as JSON.

pub mod check;
#[cfg(feature = "mock")]
pub mod demo;
pub mod scan;
pub mod state;
