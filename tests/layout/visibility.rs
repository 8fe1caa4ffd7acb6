//! The rules of who shows what: a type's public methods live in the file that defines
//! it (so that its API reads in one place), and each top-level module keeps within a
//! budget of `pub` items (the rest are `pub(crate)`, `pub(super)` or private). Read from
//! blanked source like the other rules; test files (`tests.rs`, `tests/`) are left out.

use std::collections::BTreeMap;

use super::lex::{blank, tokens, Token};

/// The keywords after which `pub` makes an item public (not a field).
const ITEM_KEYWORDS: &[&str] = &[
    "fn", "struct", "enum", "const", "static", "type", "trait", "mod", "use", "async", "unsafe",
    "extern",
];

fn is_test_file(path: &str) -> bool {
    path.ends_with("/tests.rs") || path.contains("/tests/")
}

/// The types each file defines (`struct`, `enum`, `trait`, `union`), by name.
fn definitions(sources: &[(String, String)]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, text) in sources {
        let toks = tokens(&blank(text));
        for pair in toks.windows(2) {
            if ["struct", "enum", "trait", "union"].contains(&pair[0].text.as_str()) {
                out.entry(pair[1].text.clone())
                    .or_default()
                    .push(path.clone());
            }
        }
    }
    out
}

/// An inherent `impl` block: the type's name and its `pub` and `pub(crate)` fns.
struct Impl {
    type_name: String,
    line: usize,
    public_methods: Vec<String>,
}

/// The inherent impl blocks of `toks` (trait impls, `impl X for Y`, are skipped).
fn impls(toks: &[Token]) -> Vec<Impl> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].text != "impl" {
            i += 1;
            continue;
        }
        let start = i;
        let (mut j, mut angle, mut name, mut is_trait) = (i + 1, 0i32, None, false);
        while j < toks.len() && !(toks[j].text == "{" && angle == 0) {
            match toks[j].text.as_str() {
                "<" => angle += 1,
                ">" => angle -= 1,
                "for" if angle == 0 => is_trait = true,
                "where" if angle == 0 => break,
                t if angle == 0 && t.chars().all(super::lex::is_ident_char) => {
                    name = Some(t.to_string())
                }
                _ => {}
            }
            j += 1;
        }
        while j < toks.len() && toks[j].text != "{" {
            j += 1;
        }
        let (body_end, methods) = public_methods(toks, j);
        if let (Some(type_name), false) = (name, is_trait) {
            out.push(Impl {
                type_name,
                line: toks[start].line,
                public_methods: methods,
            });
        }
        i = body_end.max(i + 1);
    }
    out
}

/// From the `{` at `open`: where its block ends, and the `pub` and `pub(crate)` fns
/// directly in it.
fn public_methods(toks: &[Token], open: usize) -> (usize, Vec<String>) {
    let (mut depth, mut k, mut methods) = (0usize, open, Vec::new());
    while k < toks.len() {
        match toks[k].text.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return (k, methods);
                }
            }
            "pub" if depth == 1 => {
                // `pub` or `pub(crate)`: seen by other modules (`pub(super)` is not).
                let mut m = k + 1;
                if toks.get(m).is_some_and(|t| t.text == "(") {
                    if toks.get(m + 1).is_some_and(|t| t.text != "crate") {
                        k += 1;
                        continue;
                    }
                    m += 3;
                }
                while m < toks.len()
                    && ["async", "const", "unsafe"].contains(&toks[m].text.as_str())
                {
                    m += 1;
                }
                if toks.get(m).is_some_and(|t| t.text == "fn") {
                    if let Some(name) = toks.get(m + 1) {
                        methods.push(name.text.clone());
                    }
                }
            }
            _ => {}
        }
        k += 1;
    }
    (k, methods)
}

/// Public methods of a type defined in one other file, not in `allowed` (type, file),
/// and allowed entries that no longer match.
pub fn methods_away_from_their_type(
    sources: &[(String, String)],
    allowed: &[(&str, &str, &str)],
) -> Vec<String> {
    let defined = definitions(sources);
    let mut found = Vec::new();
    let mut matched = vec![false; allowed.len()];
    for (path, text) in sources.iter().filter(|(p, _)| !is_test_file(p)) {
        for imp in impls(&tokens(&blank(text))) {
            // The type's home: its one definition, or the one in the impl's own module
            // where two modules use the name.
            let homes: Vec<&String> = match defined.get(&imp.type_name) {
                Some(all) if all.len() == 1 => all.iter().collect(),
                Some(all) => all
                    .iter()
                    .filter(|h| top_module(h) == top_module(path))
                    .collect(),
                None => continue,
            };
            if imp.public_methods.is_empty() || homes.len() != 1 || homes[0] == path {
                continue;
            }
            if let Some(n) = allowed
                .iter()
                .position(|(t, f, _)| *t == imp.type_name && f == path)
            {
                matched[n] = true;
                continue;
            }
            found.push(format!(
                "{path}:{} `impl {}` has public methods ({}) away from where {} is defined ({}): \
                 move them there, or make them pub(super) and give the callers a handle",
                imp.line,
                imp.type_name,
                imp.public_methods.join(", "),
                imp.type_name,
                homes[0]
            ));
        }
    }
    for (n, (t, f, _)) in allowed.iter().enumerate() {
        if !matched[n] {
            found.push(format!(
                "allowed `impl {t}` in {f} no longer has public methods there: take it off the list"
            ));
        }
    }
    found
}

/// The `pub` items (not fields, not `pub(...)`) of each top-level module of `src/`.
pub fn public_items(sources: &[(String, String)]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (path, text) in sources.iter().filter(|(p, _)| !is_test_file(p)) {
        let module = top_module(path);
        let toks = tokens(&blank(text));
        let n = toks
            .windows(2)
            .filter(|w| w[0].text == "pub" && ITEM_KEYWORDS.contains(&w[1].text.as_str()))
            .count();
        *out.entry(module).or_insert(0) += n;
    }
    out
}

/// `src/outbox/users/mod.rs` -> `outbox`; `src/util/text.rs` -> `util`; `src/lib.rs` -> `lib`.
fn top_module(path: &str) -> String {
    let rest = path.split_once("src/").map_or(path, |(_, r)| r);
    let first = rest.split('/').next().unwrap_or(rest);
    first.trim_end_matches(".rs").to_string()
}

/// Modules over their budget, and modules with no budget.
pub fn over_budget(counts: &BTreeMap<String, usize>, budgets: &[(&str, usize)]) -> Vec<String> {
    let mut found = Vec::new();
    for (module, n) in counts {
        match budgets.iter().find(|(m, _)| m == module) {
            Some((_, budget)) if n > budget => found.push(format!(
                "{module} has {n} pub items, over its budget of {budget}: make the new ones \
                 pub(crate) or pub(super) unless another module needs them, or argue a \
                 larger budget beside PUB_BUDGETS"
            )),
            Some(_) => {}
            None => found.push(format!(
                "{module} has {n} pub items and no budget in PUB_BUDGETS"
            )),
        }
    }
    found
}
