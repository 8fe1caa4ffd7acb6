//! The outbox's tests that drive the store itself, beside it in the crate: the model
//! test holds the real SQLite store (and the real planner over it) against a simple
//! model.

mod model;
