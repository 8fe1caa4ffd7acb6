//! The gateway's layout, read from its source: the mock service (the `tapegate-mock`
//! crate) is used by `tapegate demo` and `tapegate mock` alone (`src/cmd/demo.rs` and
//! `src/cmd/demo/`, and `src/main.rs` may name it), so that the package's binary, built
//! without the `mock` feature, holds none of it, and no module of the daemon leans on a
//! test double.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// Whether `text` names the mock crate outside comments.
fn uses_the_mock(text: &str) -> bool {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .any(|code| code.contains("tapegate_mock"))
}

#[test]
fn only_the_demo_commands_use_the_mock_service() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let demo = root.join("src/cmd/demo.rs");
    let allowed = |f: &PathBuf| {
        *f == demo || f.starts_with(root.join("src/cmd/demo")) || *f == root.join("src/main.rs")
    };
    let files = sources(&root.join("src"));
    assert!(files.len() > 50, "the scan found the gateway's files");
    let users: Vec<PathBuf> = files
        .into_iter()
        .filter(|f| uses_the_mock(&std::fs::read_to_string(f).unwrap()))
        .collect();
    assert!(
        users.contains(&demo),
        "the scan sees the demo's use of the mock: {users:?}"
    );
    let others: Vec<&PathBuf> = users.iter().filter(|f| !allowed(f)).collect();
    assert!(
        others.is_empty(),
        "only `tapegate demo` and `tapegate mock` may use the mock service; also: {others:?}"
    );
}

#[test]
fn the_mock_service_is_no_module_of_the_gateway() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(!root.join("src/mock").exists(), "src/mock is back");
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(
        !lib.lines()
            .any(|l| l.trim_start().starts_with("pub mod mock")
                || l.trim_start().starts_with("mod mock")),
        "lib.rs declares a mock module"
    );
    assert!(
        root.join("mock/src/lib.rs").exists(),
        "the mock crate is in mock/"
    );
}

#[test]
fn a_use_in_a_comment_is_not_a_use() {
    assert!(uses_the_mock("use tapegate_mock::MockConfig;"));
    assert!(uses_the_mock("let m = tapegate_mock::start(c);"));
    assert!(!uses_the_mock("//! the mock (`tapegate_mock`) is apart"));
    assert!(!uses_the_mock("let x = 1; // not tapegate_mock"));
}
