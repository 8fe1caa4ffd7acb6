//! The rules over a [`House`], each returning what breaks it (one line each, saying
//! where and what to do), allow-listed exceptions taken out and stale ones reported.

use std::collections::{BTreeMap, BTreeSet};

use super::graph::{self, House};

/// Whether `node` is the module `m` or a module under it.
fn under(node: &str, m: &str) -> bool {
    node == m || node.starts_with(&format!("{m}::"))
}

/// The floor of a module: the index in `layers` of its longest listed prefix.
pub fn layer_of(node: &str, layers: &[(&str, &[&str])]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (floor, (_, members)) in layers.iter().enumerate() {
        for m in *members {
            if under(node, m) && best.is_none_or(|(len, _)| m.len() > len) {
                best = Some((m.len(), floor));
            }
        }
    }
    best.map(|(_, floor)| floor)
}

/// A module only its keepers may reach: `(module, keepers, open parts, why)`. An arrow
/// into the module (or anything under it) from outside it and its keepers breaks
/// rule 9, unless it lands on one of the open parts (a word it shows to all).
pub type Guard<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a str);

/// Arrows into a guarded module from modules that are not its keepers.
pub fn reached_from_outside(house: &House, guards: &[Guard<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for (from, tos) in &house.arrows {
        for (to, site) in tos {
            for (module, keepers, open, why) in guards {
                if !under(to, module)
                    || under(from, module)
                    || keepers.iter().any(|k| under(from, k))
                    || open.iter().any(|o| under(to, o))
                {
                    continue;
                }
                out.push(format!(
                    "{from} -> {to} reaches {module}, which only {} may ({why}) ({} {})",
                    keepers.join(" and "),
                    site.at,
                    site.path
                ));
            }
        }
    }
    out
}

/// Circles not in `allowed` (each an exact set of modules), and allowed ones now gone.
pub fn circles(house: &House, allowed: &[(&[&str], &str)]) -> Vec<String> {
    let edges: BTreeMap<String, BTreeSet<String>> = house
        .arrows
        .iter()
        .map(|(from, tos)| (from.clone(), tos.keys().cloned().collect()))
        .collect();
    let found = graph::circles(&edges);
    let mut out = Vec::new();
    for circle in &found {
        if allowed.iter().any(|(members, _)| same(members, circle)) {
            continue;
        }
        let mut text = format!("import circle: {}; its arrows:", circle.join(", "));
        for from in circle {
            for (to, site) in &house.arrows[from] {
                if circle.contains(to) {
                    text.push_str(&format!(
                        "\n    {from} -> {to}  ({} {})",
                        site.at, site.path
                    ));
                }
            }
        }
        out.push(text);
    }
    for (members, _) in allowed {
        if !found.iter().any(|c| same(members, c)) {
            out.push(format!(
                "the allowed circle {members:?} is no longer there (gone or changed): remove or correct it in tests/layout/allow.rs"
            ));
        }
    }
    out
}

fn same(members: &[&str], circle: &[String]) -> bool {
    members.len() == circle.len() && members.iter().all(|m| circle.iter().any(|c| c == m))
}

/// Arrows from a lower floor to a higher one not in `allowed`, and allowed ones gone.
pub fn upward(
    house: &House,
    layers: &[(&str, &[&str])],
    allowed: &[(&str, &str, &str)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (from, tos) in &house.arrows {
        for (to, site) in tos {
            let (Some(a), Some(b)) = (layer_of(from, layers), layer_of(to, layers)) else {
                continue;
            };
            if a >= b {
                continue;
            }
            if allowed.iter().any(|(f, t, _)| f == from && t == to) {
                seen.insert((from.as_str(), to.as_str()));
                continue;
            }
            out.push(format!(
                "{from} -> {to} runs up from \"{}\" to \"{}\" ({} {})",
                short(layers[a].0),
                short(layers[b].0),
                site.at,
                site.path
            ));
        }
    }
    for (f, t, _) in allowed {
        if !seen.contains(&(*f, *t)) {
            out.push(format!(
                "the allowed arrow {f} -> {t} no longer runs up (gone or moved): remove it from tests/layout/allow.rs"
            ));
        }
    }
    out
}

fn short(floor: &str) -> &str {
    floor.split(':').next().unwrap_or(floor)
}

/// Files over `max` lines not in `allowed`, and allowed ones now within it.
pub fn long_files(house: &House, max: usize, allowed: &[(&str, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    for f in &house.files {
        let excused = allowed.iter().any(|(p, _)| *p == f.path);
        if f.lines > max && !excused {
            out.push(format!(
                "{} is {} lines (at most {max}): split it by seam",
                f.path, f.lines
            ));
        }
        if f.lines <= max && excused {
            out.push(format!(
                "{} is {} lines now: its allowance is no longer needed, remove it from tests/layout/allow.rs",
                f.path, f.lines
            ));
        }
    }
    for (p, _) in allowed {
        if !house.files.iter().any(|f| f.path == *p) {
            out.push(format!(
                "{p} is allowed but gone: remove it from tests/layout/allow.rs"
            ));
        }
    }
    out
}

/// Functions over `max` lines not in `allowed` (by file and name), and allowed ones
/// now within it.
pub fn long_functions(house: &House, max: usize, allowed: &[(&str, &str, &str)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut still = BTreeSet::new();
    for f in &house.files {
        for func in &f.functions {
            if func.lines <= max {
                continue;
            }
            if allowed
                .iter()
                .any(|(p, n, _)| *p == f.path && *n == func.name)
            {
                still.insert((f.path.as_str(), func.name.as_str()));
                continue;
            }
            out.push(format!(
                "{}:{} {} is {} lines (at most {max}): name its steps",
                f.path, func.line, func.name, func.lines
            ));
        }
    }
    for (p, n, _) in allowed {
        if !still.contains(&(*p, *n)) {
            out.push(format!(
                "{p} {n} is within {max} lines or gone: its allowance is no longer needed, remove it from tests/layout/allow.rs"
            ));
        }
    }
    out
}

/// Functions in `files` (path, text) named in more than `max` characters: a test's name
/// says what it shows in a few words, and the rest goes in its doc line.
pub fn long_names(files: &[(String, String)], max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (path, text) in files {
        for (i, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("fn ") {
                let before = rest[..at].chars().next_back();
                rest = &rest[at + 3..];
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if name.len() > max {
                    out.push(format!(
                        "{path}:{} fn {name} is named in {} characters (at most {max}): say the rest in its doc line",
                        i + 1,
                        name.len()
                    ));
                }
            }
        }
    }
    out
}

/// Paragraphs of a module's own doc (`mod.rs`, `lib.rs`: the `//!` or `/*!` before its
/// first item) that name more than `max` files (`` `name.rs` ``): a file list to keep
/// in step by hand. A module's doc says what the module does and by which seams; each
/// file's doc says what it holds.
pub fn file_lists(files: &[(String, String)], max: usize) -> Vec<String> {
    let mut out = Vec::new();
    for (path, text) in files {
        if !(path.ends_with("/mod.rs") || path.ends_with("/lib.rs")) {
            continue;
        }
        let doc = module_doc(text);
        for (i, paragraph) in doc.split("\n\n").enumerate() {
            let named = file_names(paragraph);
            if named.len() > max {
                out.push(format!(
                    "{path}: paragraph {} of its doc lists {} files ({}): say the seams, and let each file's doc say what it holds",
                    i + 1,
                    named.len(),
                    named.join(", ")
                ));
            }
        }
    }
    out
}

/// The module's own doc: a leading `/*! … */`, or its leading `//!` lines.
fn module_doc(text: &str) -> String {
    let t = text.trim_start();
    if let Some(rest) = t.strip_prefix("/*!") {
        return rest.split("*/").next().unwrap_or("").to_string();
    }
    t.lines()
        .map_while(|l| l.trim_start().strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The distinct `` `name.rs` `` written in `text`, in order.
fn file_names(text: &str) -> Vec<String> {
    let mut named: Vec<String> = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        let is_name = part.ends_with(".rs")
            && part.len() > 3
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_/.".contains(c));
        if i % 2 == 1 && is_name && !named.iter().any(|n| n == part) {
            named.push(part.to_string());
        }
    }
    named
}
