//! The mock's layout, read from its source: no file imports one that imports it back
//! (the mock was once one circle of ten files), and the parts of the spec never import
//! the router, the shared state or the handle: the router hands each its piece.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each file's module path (`""` for lib.rs, `service::state` for
/// `service/state.rs`) and its code: comments and the test module left out.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
            let mut segs: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if segs.last().is_some_and(|s| s == "mod" || s == "lib") {
                segs.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            out.insert(segs.join("::"), code_of(&text));
        }
    }
    out
}

/// `text` without its comments and its `#[cfg(test)] mod tests`.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The file modules `module` imports: every path that starts `crate::`, `super::` or
/// `self::`, and every name of a `{...}` group after one, resolved to the longest
/// prefix that is a file of the crate.
fn imports(module: &str, code: &str, files: &BTreeSet<String>) -> BTreeSet<String> {
    let own: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let mut out = BTreeSet::new();
    for head in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(head) {
            let at = from + i;
            from = at + head.len();
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let base: Vec<&str> = match head {
                "crate::" => Vec::new(),
                "super::" => own[..own.len().saturating_sub(1)].to_vec(),
                _ => own.clone(),
            };
            let rest = &code[from..];
            let paths: Vec<String> = match rest.strip_prefix('{') {
                Some(group) => group[..group.find('}').unwrap_or(0)]
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .collect(),
                None => {
                    let end = rest
                        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                        .unwrap_or(rest.len());
                    vec![rest[..end].to_string()]
                }
            };
            for p in paths {
                let mut path: Vec<&str> = base.clone();
                let mut target = None;
                for seg in p.split("::").map(ident_at) {
                    path.push(seg);
                    let m = path.join("::");
                    if files.contains(&m) {
                        target = Some(m);
                    } else {
                        break;
                    }
                }
                if let Some(t) = target.filter(|t| t != module) {
                    out.insert(t);
                }
            }
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    let files: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(m, code)| (m.clone(), imports(m, code, &files)))
        .collect()
}

/// A circle of imports through `from`, if there is one.
fn circle(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    if let Some(i) = path.iter().position(|m| m == from) {
        return Some(path[i..].to_vec());
    }
    path.push(from.to_string());
    for next in &graph[from] {
        if let Some(c) = circle(graph, next, path) {
            return Some(c);
        }
    }
    path.pop();
    None
}

#[test]
fn no_file_of_the_mock_imports_one_that_imports_it_back() {
    let graph = graph();
    assert!(
        graph.len() > 20,
        "the scan found the crate's files: {graph:?}"
    );
    assert!(
        graph["service::ops"].contains("labels") && graph["labels"].contains("devices"),
        "the scan reads imports: {graph:?}"
    );
    for m in graph.keys() {
        if let Some(c) = circle(&graph, m, &mut Vec::new()) {
            panic!("an import circle: {}", c.join(" -> "));
        }
    }
}

#[test]
fn the_parts_of_the_spec_never_import_the_router_its_state_or_the_handle() {
    let graph = graph();
    let above = |m: &str| m == "handle" || m == "service" || m.starts_with("service::");
    for (m, imports) in &graph {
        if m.is_empty() || above(m) {
            continue;
        }
        let up: Vec<&String> = imports.iter().filter(|i| above(i)).collect();
        assert!(up.is_empty(), "{m} imports {up:?}");
    }
}

#[test]
fn the_scan_sees_a_circle_when_there_is_one() {
    let files: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), imports("a", "use super::b::X;", &files));
    graph.insert("b".to_string(), imports("b", "use crate::{c, d};", &files));
    graph.insert(
        "c".to_string(),
        imports("c", "fn f() { crate::a::g() }", &files),
    );
    assert_eq!(
        circle(&graph, "a", &mut Vec::new()),
        Some(vec!["a".to_string(), "b".to_string(), "c".to_string()])
    );
    let commented = code_of("/* crate::a */ // crate::a::g()");
    graph.insert("c".to_string(), imports("c", &commented, &files));
    assert_eq!(circle(&graph, "a", &mut Vec::new()), None);
}
