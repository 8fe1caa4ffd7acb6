//! What breaks the layout rules today, each with why. Every entry names exactly what it
//! excuses, and an entry that no longer matches fails the guard: the list only shrinks.
//! "pending issue 23 pass" marks the rooms another helper is rebuilding (the speed
//! work: outbox, flush, ingest, clock, pipeline, http, metrics; the house work: api and
//! the operator client, the mock, the device/demo/locate/history/message commands); the
//! lead empties the list as those land.

const PERF: &str =
    "pending issue 23 pass (speed work: outbox, flush, ingest, clock, pipeline, http, metrics)";
const HOUSE: &str =
    "pending issue 23 pass (house work: src/operator, the mock's own crate, the operator commands)";

/// Files over 500 lines.
pub const LONG_FILES: &[(&str, &str)] = &[
    ("src/api/devices.rs", HOUSE),
    ("src/api/error.rs", HOUSE),
    ("src/api/history.rs", HOUSE),
    ("src/api/mod.rs", HOUSE),
    ("src/cmd/device.rs", HOUSE),
    ("src/flush/mod.rs", PERF),
    ("src/flush/plan.rs", PERF),
    ("src/flush/plan/tests.rs", PERF),
    ("src/metrics.rs", PERF),
    ("src/mock/devices.rs", HOUSE),
    ("src/mock/mod.rs", HOUSE),
    ("src/mock/ops.rs", HOUSE),
    ("src/outbox/store.rs", PERF),
    ("src/pipeline.rs", PERF),
];

/// Functions over 80 lines (by file and name).
pub const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[
    ("src/api/devices.rs", "chunk", HOUSE),
    ("src/api/devices.rs", "add_device", HOUSE),
    ("src/api/devices.rs", "outcomes", HOUSE),
    ("src/api/history.rs", "history", HOUSE),
    ("src/api/send.rs", "send", HOUSE),
    ("src/cmd/demo.rs", "run", HOUSE),
    ("src/cmd/demo.rs", "at_the_dock", HOUSE),
    ("src/cmd/device.rs", "run_devices", HOUSE),
    ("src/cmd/device.rs", "add", HOUSE),
    ("src/cmd/device.rs", "add_rows", HOUSE),
    ("src/flush/mod.rs", "run", PERF),
    ("src/flush/mod.rs", "note", PERF),
    ("src/ingest.rs", "run", PERF),
    ("src/ingest.rs", "commit", PERF),
    ("src/metrics.rs", "new", PERF),
    ("src/metrics.rs", "stored", PERF),
    ("src/mock/decode.rs", "decode", HOUSE),
    ("src/mock/decode.rs", "answer_bulk", HOUSE),
    ("src/mock/devices.rs", "add", HOUSE),
    ("src/mock/history.rs", "history", HOUSE),
    ("src/mock/ops.rs", "handle", HOUSE),
    ("src/mock/seed.rs", "new", HOUSE),
    ("src/mock/token.rs", "token", HOUSE),
    ("src/pipeline.rs", "run_in", PERF),
];

/// Import circles, each the exact set of modules in it.
pub const CIRCLES: &[(&[&str], &str)] = &[
    (&["api::devices", "api::send"], HOUSE),
    (&["http", "http::page"], PERF),
    (
        &[
            "mock",
            "mock::decode",
            "mock::devices",
            "mock::fault",
            "mock::history",
            "mock::locations",
            "mock::messages",
            "mock::ops",
            "mock::rate",
            "mock::readings",
            "mock::seed",
            "mock::service",
            "mock::token",
        ],
        HOUSE,
    ),
    (
        &["outbox::clock", "outbox::store"],
        "pending issue 23 pass (speed work): a leaf db module and one narrow handle per user",
    ),
];

/// Arrows from a lower floor to a higher one, by module.
pub const UPWARD: &[(&str, &str, &str)] = &[];
