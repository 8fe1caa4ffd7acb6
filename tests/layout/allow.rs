//! What may break the layout rules, each entry with why. Every entry names exactly what
//! it excuses, and an entry that no longer matches fails the guard: the list only
//! shrinks. No import circle, no arrow up the floors, no file in `src/` or `mock/src/`
//! over 500 lines (a warning now) and no function over 80 are excused; the public
//! methods away from their type are, each named. A new exception is argued here, next to
//! its entry, or the code is mended instead.

/// Files over 500 lines.
pub const LONG_FILES: &[(&str, &str)] = &[];

/// Functions over 80 lines (by file and name).
pub const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// Import circles, each the exact set of modules in it.
pub const CIRCLES: &[(&[&str], &str)] = &[];

/// Arrows from a lower floor to a higher one, by module.
pub const UPWARD: &[(&str, &str, &str)] = &[];

/// The mock service's crate (`mock/src`): files over 500 lines, functions over 80 lines
/// and import circles. Empty: it keeps every rule.
pub const MOCK_LONG_FILES: &[(&str, &str)] = &[];
pub const MOCK_LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];
pub const MOCK_CIRCLES: &[(&[&str], &str)] = &[];

/// Public methods of a type in a file other than the one that defines it: (type, file,
/// why). Empty: every type's public API is in its own file.
pub const METHODS_AWAY: &[(&str, &str, &str)] = &[];

/// The `pub` items (not `pub(crate)` or `pub(super)`, not fields) each top-level module
/// of `src/` may have: what it has today. A module over its budget fails; a new public
/// item is argued here, or made `pub(crate)` / `pub(super)`.
pub const PUB_BUDGETS: &[(&str, usize)] = &[
    ("api", 47),
    ("bin", 0),
    ("clock", 40),
    ("cmd", 99),
    ("config", 117),
    ("db", 4),
    ("dedup", 11),
    ("flush", 46),
    ("health", 11),
    ("heard_now", 11),
    ("http", 13),
    ("ingest", 4),
    ("inventory", 6),
    ("lib", 20),
    ("main", 0),
    ("metrics", 23),
    ("operator", 90),
    ("outbox", 115),
    ("pipeline", 33),
    ("products", 11),
    ("record", 19),
    ("side_tables", 4),
    ("source", 179),
    ("telemetry", 13),
    ("util", 50),
];
