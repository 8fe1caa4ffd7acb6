//! End-to-end delivery (DESIGN.md, "Delivery"): the real flusher against the mock
//! tracking service over loopback HTTP, with a real temp SQLite outbox.
//!
//! Most tests run the daemon in-process (`pipeline::run` until drained) on a generated
//! replay trace; the crash and signal tests run the real binary. What the service got
//! is read from the mock's record of received requests, what the gateway kept from its
//! state database. Every wait polls with a deadline.

mod common;

mod delivery {
    pub mod support;

    mod batches;
    mod crashes;
    mod outage;
    mod refusals;
}
