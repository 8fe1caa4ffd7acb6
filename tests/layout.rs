//! The layout guard: the house drawn from `src/` by reading it as text (no build), held
//! to these rules.
//!
//! 1. No import circle between modules (each file is a module; `super::` circles inside
//!    a directory count).
//! 2. No arrow runs back up the layers in [`LAYERS`] (a module may import its own layer
//!    and those below).
//! 3. A file in `src/` over [`MAX_FILE_LINES`] lines is warned of (printed), not refused:
//!    a state machine may read better whole.
//! 4. No function in `src/` over [`MAX_FN_LINES`] lines, from its `fn` to its closing
//!    brace.
//! 5. A type's `pub` and `pub(crate)` methods live in the file that defines it
//!    (`tests/layout/visibility.rs`).
//! 6. Each top-level module keeps within its budget of `pub` items (`PUB_BUDGETS`).
//! 7. No function in `src/`, `tests/` or the mock crate is named in more than
//!    [`MAX_NAME_CHARS`] characters (a test's name says what it shows in a few words,
//!    its doc line the rest).
//! 8. No paragraph of a module's own doc (`mod.rs`, `lib.rs`) names more than
//!    [`MAX_FILES_NAMED`] files: a module's doc says its seams, each file's doc what it
//!    holds, and no list is kept in step by hand.
//! 9. A guarded module is reached only by its keepers ([`GUARDS`]): the state database
//!    (`db`) by the outbox and the side tables, so no command or stage holds SQLite of
//!    its own.
//!
//! An arrow is a path that names another module's item: in a `use` (`use
//! crate::outbox::Outbox;`) or in code (`crate::clock::now_ms()`, `super::store::X`,
//! `child::f()`), resolved through `pub use` re-exports to the file that defines it.
//! Test code (items under `#[cfg(test)]` and the modules declared there) draws no arrow:
//! a test may reach wherever it must. A module's `pub use` of its own children shows
//! them and draws no arrow either.
//!
//! The mock service's crate (`mock/src`, a crate of the workspace) is held to rules 1, 3
//! and 4 too, on its own graph (its `crate::` is its own root; it has no floors drawn
//! here: `mock/src/lib.rs` says its order, and `mock/tests/layout.rs` checks it).
//!
//! What breaks a rule today and is to be mended by a later pass is named, with why, in
//! `tests/layout/allow.rs`; an entry there that no longer matches fails too, so the list
//! only shrinks. `LAYOUT_DUMP=1 cargo test --test layout -- --nocapture` prints every
//! arrow with where it is written; `LAYOUT_ROOT=DIR` reads `DIR/src` instead (another
//! commit's tree, `git archive COMMIT src | tar -x -C DIR`).

mod layout {
    pub mod allow;
    pub mod graph;
    pub mod lex;
    pub mod rules;
    pub mod scan;
    pub mod visibility;
}

use std::path::Path;

use layout::allow::{
    CIRCLES, LONG_FILES, LONG_FUNCTIONS, METHODS_AWAY, MOCK_CIRCLES, MOCK_LONG_FILES,
    MOCK_LONG_FUNCTIONS, PUB_BUDGETS, UPWARD,
};
use layout::graph::{self, House};
use layout::rules;

pub const MAX_FILE_LINES: usize = 500;
pub const MAX_FN_LINES: usize = 80;

/// The floors of the house, bottom first, each with the modules on it (a module path
/// and everything under it; the longest match wins). What a floor is for says what it
/// may touch: its own floor and those below.
pub const LAYERS: &[(&str, &[&str])] = &[
    (
        "leaves: the domain's words (Mac, Capture, the tape's packet), text and secrets \
         made safe, the retry delay, the system's clocks and systemd's notify socket; \
         they import nothing of the crate but each other",
        &["record", "util", "clock", "clock::source", "clock::fake"],
    ),
    (
        "pure core: decisions with input and time passed in (which adverts are tapes, \
         per-MAC dedup, the clock's hold policy); config validates into their settings",
        &["products", "dedup", "clock::policy"],
    ),
    (
        "config: raw layers validated into typed settings, one step, every problem named",
        &["config"],
    ),
    (
        "the state database: the one SQLite file, who may create and write it, its schema \
         and migrations (reached only by the stores that keep tables in it: rule 9)",
        &["db"],
    ),
    (
        "stores, shared state and clients: the SQLite outbox and the tables beside it, the \
         inventory, the metrics registry, the tapes heard now, the service's transport and \
         the operator's client",
        &[
            "outbox",
            "side_tables",
            "inventory",
            "metrics",
            "heard_now",
            "api",
            "operator",
        ],
    ),
    (
        "stages: the source, ingest, the clock keeper, the flusher, the telemetry pusher \
         and the health they report into",
        &[
            "source",
            "ingest",
            "clock::keeper",
            "flush",
            "telemetry",
            "health",
        ],
    ),
    (
        "the daemon: the pipeline that wires the stages, SIGHUP's reload, the HTTP server",
        &["pipeline", "http"],
    ),
    (
        "commands: one file per command over the library, and the command line",
        &["cmd"],
    ),
    (
        "the binaries: the daemon's and the one that writes the man pages and completions",
        &["main", "bin"],
    ),
];

/// Rule 9: the modules only their keepers may reach, and the parts they show to all.
pub const GUARDS: &[rules::Guard<'static>] = &[(
    "db",
    &["outbox", "side_tables"],
    // The error every store reports, and whether the state directory's file system
    // takes writes (`/healthz` asks; no database is opened for it).
    &["db::error", "db::storage"],
    "every other module goes through a store's handle named for its role",
)];

fn root() -> std::path::PathBuf {
    std::env::var_os("LAYOUT_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf())
}

fn house() -> House {
    dumped(graph::build(&graph::read(&root())))
}

/// The mock service's crate, `mock/src` under `root`, as a house of its own.
fn mock_house(root: &Path) -> House {
    dumped(graph::build(&graph::read_crate(root, "mock/src")))
}

fn dumped(house: House) -> House {
    if std::env::var_os("LAYOUT_DUMP").is_some() {
        for (from, tos) in &house.arrows {
            for (to, site) in tos {
                println!("{from} -> {to}    {} {}", site.at, site.path);
            }
        }
    }
    house
}

#[test]
fn no_import_circle_between_modules() {
    let found = rules::circles(&house(), CIRCLES);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_import_runs_up_the_layers() {
    let found = rules::upward(&house(), LAYERS, UPWARD);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_guarded_module_is_reached_only_by_its_keepers() {
    let house = house();
    assert!(
        house.arrows.keys().any(|from| from.starts_with("outbox")),
        "src was not read"
    );
    let found = rules::reached_from_outside(&house, GUARDS);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn every_module_stands_on_a_layer() {
    let house = house();
    let lost: Vec<_> = house
        .files
        .iter()
        .filter(|f| rules::layer_of(&f.node, LAYERS).is_none() && f.node != "crate")
        .map(|f| format!("{} ({}) is on no layer: add it to LAYERS", f.node, f.path))
        .collect();
    assert!(lost.is_empty(), "{}", lost.join("\n"));
}

/// A long file is a warning, not a wall: a state machine may read better whole than cut
/// in two (the guard measures what hurts: where a type's API lives, and what is shown).
#[test]
fn a_file_in_src_over_500_lines_is_warned_of() {
    for line in rules::long_files(&house(), MAX_FILE_LINES, LONG_FILES) {
        println!("warning: {line}");
    }
}

#[test]
fn a_types_public_methods_live_in_its_defining_file() {
    let found =
        layout::visibility::methods_away_from_their_type(&graph::read(&root()), METHODS_AWAY);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn each_module_keeps_within_its_pub_budget() {
    let counts = layout::visibility::public_items(&graph::read(&root()));
    if std::env::var_os("LAYOUT_DUMP").is_some() {
        println!("{counts:?}");
    }
    let found = layout::visibility::over_budget(&counts, PUB_BUDGETS);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_function_in_src_is_over_80_lines() {
    let found = rules::long_functions(&house(), MAX_FN_LINES, LONG_FUNCTIONS);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Rule 7's limit.
const MAX_NAME_CHARS: usize = 80;

/// The `.rs` files under `dir`, recursively, as (path from `root`, text).
fn rust_files(root: &Path, dir: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![root.join(dir)];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out
}

#[test]
fn no_function_is_named_in_more_than_80_characters() {
    let root = root();
    let files: Vec<_> = ["src", "tests", "mock/src", "mock/tests", "benches"]
        .iter()
        .filter(|d| root.join(d).is_dir())
        .flat_map(|d| rust_files(&root, d))
        .collect();
    assert!(files.len() > 100, "src and tests were not read");
    let found = rules::long_names(&files, MAX_NAME_CHARS);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Rule 8's limit.
const MAX_FILES_NAMED: usize = 2;

#[test]
fn no_module_doc_keeps_a_list_of_its_files() {
    let root = root();
    let files: Vec<_> = ["src", "mock/src"]
        .iter()
        .flat_map(|d| rust_files(&root, d))
        .collect();
    assert!(
        files.iter().any(|(p, _)| p == "src/outbox/mod.rs"),
        "src was not read"
    );
    let found = rules::file_lists(&files, MAX_FILES_NAMED);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_import_circle_in_the_mock_crate() {
    let house = mock_house(&root());
    assert!(house.files.len() > 10, "mock/src was not read");
    let found = rules::circles(&house, MOCK_CIRCLES);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn no_file_or_function_in_the_mock_crate_is_too_long() {
    let house = mock_house(&root());
    let mut found = rules::long_files(&house, MAX_FILE_LINES, MOCK_LONG_FILES);
    found.extend(rules::long_functions(
        &house,
        MAX_FN_LINES,
        MOCK_LONG_FUNCTIONS,
    ));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The guard itself, on a planted house: each rule can fail.
mod the_guard {
    use super::layout::{graph, rules, scan};

    fn planted() -> graph::House {
        let file = |path: &str, text: &str| (path.to_string(), text.to_string());
        let long_body = "    let x = 1;\n".repeat(90);
        graph::build(&[
            file("src/lib.rs", "pub mod a;\npub mod b;\npub mod low;\n"),
            file(
                "src/a/mod.rs",
                "mod inner;\npub use inner::Thing;\nuse crate::b::B;\npub struct A;\n",
            ),
            file(
                "src/a/inner.rs",
                "// crate::low::Nothing in a comment\npub struct Thing(super::A);\n",
            ),
            file(
                "src/b.rs",
                &format!(
                    "use crate::a::Thing;\npub struct B;\nfn long() {{\n{long_body}}}\n\
                     #[cfg(test)]\nmod tests {{ use crate::low::L; }}\n"
                ),
            ),
            file(
                "src/low.rs",
                "pub struct L;\nfn f() -> &'static str { \"crate::b::B }\" }\n",
            ),
        ])
    }

    const PLANTED_LAYERS: &[(&str, &[&str])] = &[("low", &["low", "a"]), ("high", &["b"])];

    #[test]
    fn sees_a_circle_through_a_re_export_and_super() {
        // a -> b (use), b -> a::inner (through a's re-export), inner -> a (super::A).
        let found = rules::circles(&planted(), &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("a, a::inner, b"), "{}", found[0]);
    }

    #[test]
    fn sees_an_arrow_running_up() {
        let found = rules::upward(&planted(), PLANTED_LAYERS, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("a -> b"), "{}", found[0]);
    }

    #[test]
    fn sees_a_guarded_module_reached_from_outside() {
        // b reaches a::inner through a's re-export; low is a's only keeper.
        let guard = |open: &'static [&'static str]| [("a", &["low"][..], open, "planted")];
        let found = rules::reached_from_outside(&planted(), &guard(&[]));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("b -> a::inner"), "{}", found[0]);
        assert!(rules::reached_from_outside(&planted(), &guard(&["a::inner"])).is_empty());
    }

    #[test]
    fn ignores_comments_strings_and_tests() {
        let house = planted();
        assert!(!house.arrows.contains_key("low"), "{:?}", house.arrows);
        assert!(!house.arrows["b"].contains_key("low"), "{:?}", house.arrows);
        assert!(!house.arrows["a::inner"].contains_key("low"));
    }

    #[test]
    fn measures_a_function_from_fn_to_its_closing_brace() {
        let found = rules::long_functions(&planted(), 80, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("src/b.rs:3 long is 92 lines"),
            "{}",
            found[0]
        );
        assert!(rules::long_files(&planted(), 50, &[])[0].contains("src/b.rs"));
    }

    #[test]
    fn a_stale_allowance_fails() {
        let found = rules::long_functions(&planted(), 80, &[("src/low.rs", "f", "why")]);
        assert!(
            found.iter().any(|f| f.contains("no longer needed")),
            "{found:?}"
        );
    }

    /// The mock crate's guard, on a crate planted on disk the way the real one is read
    /// (`ROOT/mock/src`): the router importing a part that names the router back
    /// through the crate root's re-export is a circle, named with its files.
    #[test]
    fn sees_a_circle_in_the_mock_crate() {
        let root = tempfile::tempdir().expect("a temporary directory");
        let write = |path: &str, text: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "mock/src/lib.rs",
            "mod decode;\nmod service;\npub use service::Router;\n",
        );
        write(
            "mock/src/service/mod.rs",
            "mod state;\nuse crate::decode::answer;\npub struct Router(state::State);\n",
        );
        write("mock/src/service/state.rs", "pub struct State;\n");
        write(
            "mock/src/decode.rs",
            "pub fn answer(r: &crate::Router) {}\n",
        );
        let house = super::mock_house(root.path());
        let found = rules::circles(&house, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("import circle: decode, service;"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("mock/src/decode.rs:1"), "{}", found[0]);
        // Without the arrow back, no circle.
        write("mock/src/decode.rs", "pub fn answer() {}\n");
        assert!(rules::circles(&super::mock_house(root.path()), &[]).is_empty());
    }

    #[test]
    fn blanking_keeps_lines_and_hides_literals() {
        let text = "let s = r#\"a \"{\" b\"#; // }\nlet c = '{'; let l: &'a str = \"\\\"}\";\n/* { /* } */ */ fn x() {}\n";
        let code = scan::blank(text);
        assert_eq!(code.lines().count(), text.lines().count());
        assert_eq!(code.matches('{').count(), 1, "{code}");
        assert_eq!(code.matches('}').count(), 1, "{code}");
        let toks = scan::tokens(&code);
        let f = scan::functions(&toks);
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].name.as_str(), f[0].line, f[0].lines), ("x", 3, 1));
    }

    /// A name over the limit is seen wherever `fn` starts it (a test, a nested helper,
    /// after `pub(crate)`), and not inside a longer word or at the limit.
    #[test]
    fn sees_a_function_named_too_long() {
        let long = "a".repeat(81);
        let limit = "b".repeat(80);
        let text = format!(
            "#[test]\nfn {long}() {{}}\nfn {limit}() {{}}\n    pub(crate) fn {long}x() {{}}\nlet dfn {long} = 1;\n"
        );
        let found = rules::long_names(&sources(&[("tests/t.rs", &text)]), 80);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("tests/t.rs:2 fn aaa"), "{}", found[0]);
        assert!(found[0].contains("81 characters"), "{}", found[0]);
        assert!(found[1].starts_with("tests/t.rs:4 "), "{}", found[1]);
    }

    /// A module doc's paragraph naming three files is a list (in `/*!` or `//!`); two
    /// files a paragraph, a file's own doc, and a name outside backticks are not.
    #[test]
    fn sees_a_module_doc_that_lists_its_files() {
        let listing =
            "//! The room.\n//!\n//! `a.rs` this, `b.rs` that, `c/d.rs` the rest.\n\nmod a;\n";
        let block = "/*!\nThe room: `a.rs` and `b.rs`.\n\nThen `c.rs`, `d.rs` and `e.rs`.\n*/\n";
        let fine = "//! `a.rs` and `b.rs`.\n//!\n//! `c.rs` and a.rs, d.rs.\n";
        let leaf = "//! `a.rs`, `b.rs`, `c.rs`.\n";
        let found = rules::file_lists(
            &sources(&[
                ("src/x/mod.rs", listing),
                ("src/lib.rs", block),
                ("src/y/mod.rs", fine),
                ("src/z/leaf.rs", leaf),
            ]),
            2,
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("src/x/mod.rs: paragraph 2"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("a.rs, b.rs, c/d.rs"), "{}", found[0]);
        assert!(
            found[1].starts_with("src/lib.rs: paragraph 2"),
            "{}",
            found[1]
        );
    }

    fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
        files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    /// A public (or crate-wide) method in another file than its type's is seen, the type
    /// found in the impl's own module when two modules use its name; `pub(super)` and a
    /// trait impl are not; an allowed entry that no longer matches fails too.
    #[test]
    fn sees_a_public_method_away_from_its_type() {
        use super::layout::visibility::methods_away_from_their_type as away;
        let planted = sources(&[
            (
                "src/a/mod.rs",
                "pub struct Thing;\nimpl Thing { pub fn here(&self) {} }\n",
            ),
            (
                "src/a/more.rs",
                "use super::Thing;\nimpl Thing {\n    pub fn far(&self) {}\n    \
                 pub(super) fn near(&self) {}\n}\nimpl Clone for Thing { fn clone(&self) -> \
                 Thing { Thing } }\n",
            ),
            (
                "src/a/crate_wide.rs",
                "impl super::Thing { pub(crate) fn wide(&self) {} }\n",
            ),
            ("src/b.rs", "pub enum Other {}\n"),
            ("src/c/mod.rs", "pub struct Other;\n"),
            (
                "src/c/x.rs",
                "impl super::Other { pub fn fine(&self) {} }\n",
            ),
        ]);
        let found = away(&planted, &[]);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("src/a/more.rs:2 `impl Thing` has public methods (far) "));
        assert!(found[1].contains("src/a/crate_wide.rs:1 `impl Thing` has public methods (wide)"));
        // `Other` is two types; the one in `c` is the home of c's impl, not b's enum.
        assert!(
            found[2].contains("where Other is defined (src/c/mod.rs)"),
            "{}",
            found[2]
        );
        let allowed = [
            ("Thing", "src/a/more.rs", "planted"),
            ("Thing", "src/a/crate_wide.rs", "planted"),
            ("Other", "src/c/x.rs", "planted"),
            ("Thing", "src/a/gone.rs", "planted"),
        ];
        let found = away(&planted, &allowed);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("src/a/gone.rs no longer"), "{}", found[0]);
    }

    /// `pub` items are counted per top-level module (not fields, not `pub(crate)`, not
    /// test files); a module over its budget, or without one, fails.
    #[test]
    fn holds_each_module_to_its_pub_budget() {
        use super::layout::visibility::{over_budget, public_items};
        let planted = sources(&[
            (
                "src/a/mod.rs",
                "pub struct S { pub field: u8 }\npub(crate) fn inner() {}\npub fn f() {}\n",
            ),
            (
                "src/a/deep.rs",
                "pub const C: u8 = 1;\npub use super::S as T;\n",
            ),
            ("src/a/tests.rs", "pub fn helper() {}\n"),
            ("src/b.rs", "pub mod c;\n"),
        ]);
        let counts = public_items(&planted);
        assert_eq!(counts["a"], 4, "{counts:?}");
        assert_eq!(counts["b"], 1, "{counts:?}");
        assert!(over_budget(&counts, &[("a", 4), ("b", 1)]).is_empty());
        let found = over_budget(&counts, &[("a", 3)]);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("a has 4 pub items, over its budget of 3"));
        assert!(found[1].contains("b has 1 pub items and no budget"));
    }
}
