//! What a file's tokens say: its functions and their lengths, its inline and child
//! modules, the items under `#[cfg(test)]`, and every path it writes (in `use` trees,
//! expanded, and in code). No build, no parser crate: what a reviewer reads, read the
//! same way.

use super::lex::is_ident_char;
pub use super::lex::{blank, tokens, Token};

/// A function and how many lines it spans, from its `fn` line to its closing brace.
#[derive(Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// Every function with a body (nested ones too, each on its own).
pub fn functions(toks: &[Token]) -> Vec<Function> {
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if t.text != "fn" {
            continue;
        }
        let Some(name) = toks
            .get(i + 1)
            .filter(|n| n.text.starts_with(is_ident_char))
        else {
            continue; // a function pointer type: `fn(u8) -> u8`
        };
        let (mut depth, mut j) = (0i32, i + 2);
        let body = loop {
            match toks.get(j).map(|t| t.text.as_str()) {
                None => break None,
                Some("(" | "[") => depth += 1,
                Some(")" | "]") => depth -= 1,
                Some(";") if depth == 0 => break None,
                Some("{") if depth == 0 => break Some(j),
                _ => {}
            }
            j += 1;
        };
        let Some(open) = body else { continue };
        if let Some(close) = matching_brace(toks, open) {
            out.push(Function {
                name: name.text.clone(),
                line: t.line,
                lines: toks[close].line - t.line + 1,
            });
        }
    }
    out
}

fn matching_brace(toks: &[Token], open: usize) -> Option<usize> {
    let mut depth = 0;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// A path met in a file, in the module (file or inline) it was written in.
#[derive(Debug, Clone, PartialEq)]
pub struct PathUse {
    /// The module the path is written in (`config::validate`, `config::validate::tests`).
    pub scope: Vec<String>,
    pub segments: Vec<String>,
    /// A `use` leaf: the name it binds (`as` or its last segment); `None` for a path in
    /// code.
    pub binds: Option<String>,
    /// A `pub use` (any visibility): a re-export.
    pub public: bool,
    /// Written in test code (an item under `#[cfg(test)]`).
    pub test: bool,
    pub line: usize,
}

/// What a file declares and uses: its inline modules, `mod x;` children, and every
/// path in `use` statements and in code.
#[derive(Debug, Default)]
pub struct Scanned {
    pub inline_modules: Vec<Vec<String>>,
    pub children: Vec<Vec<String>>,
    /// Children declared under `#[cfg(test)]` (`mod tests;`, `mod test_support;`).
    pub test_children: Vec<Vec<String>>,
    pub paths: Vec<PathUse>,
}

/// The token ranges of the items under `#[cfg(test)]`: from the attribute to the end of
/// the item (its `;` or the brace that closes its body).
pub fn test_ranges(toks: &[Token]) -> Vec<(usize, usize)> {
    let text = |k: usize| toks.get(k).map(|t| t.text.as_str());
    let mut out = Vec::new();
    for i in 0..toks.len() {
        let is_cfg_test = text(i) == Some("#")
            && text(i + 1) == Some("[")
            && text(i + 2) == Some("cfg")
            && text(i + 3) == Some("(")
            && text(i + 4) == Some("test")
            && text(i + 5) == Some(")")
            && text(i + 6) == Some("]");
        if !is_cfg_test {
            continue;
        }
        let mut depth = 0;
        let mut end = toks.len() - 1;
        for k in i + 7..toks.len() {
            match toks[k].text.as_str() {
                // Another attribute on the same item.
                "[" | "(" => depth += 1,
                "]" | ")" => depth -= 1,
                ";" if depth == 0 => {
                    end = k;
                    break;
                }
                "{" if depth == 0 => {
                    end = matching_brace(toks, k).unwrap_or(toks.len() - 1);
                    break;
                }
                _ => {}
            }
        }
        out.push((i, end));
    }
    out
}

pub fn scan(toks: &[Token], module: &[String]) -> Scanned {
    let tests = test_ranges(toks);
    let in_test = |k: usize| tests.iter().any(|&(a, b)| a <= k && k <= b);
    let mut out = Scanned::default();
    let mut scope: Vec<(Vec<String>, i32)> = vec![(module.to_vec(), 0)];
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        let here = scope.last().map(|s| s.0.clone()).unwrap_or_default();
        let t = toks[i].text.as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if scope.len() > 1 && scope.last().is_some_and(|s| s.1 == depth) {
                    scope.pop();
                }
            }
            "mod"
                if toks
                    .get(i + 1)
                    .is_some_and(|n| n.text.starts_with(is_ident_char)) =>
            {
                let mut inner = here.clone();
                inner.push(toks[i + 1].text.clone());
                match toks.get(i + 2).map(|t| t.text.as_str()) {
                    Some("{") => {
                        out.inline_modules.push(inner.clone());
                        scope.push((inner, depth));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                    Some(";") if in_test(i) => out.test_children.push(inner),
                    Some(";") => out.children.push(inner),
                    _ => {}
                }
            }
            "use" => {
                let public = is_public(toks, i);
                let end = (i..toks.len())
                    .find(|&k| toks[k].text == ";")
                    .unwrap_or(toks.len());
                let mut leaves = Vec::new();
                use_tree(&toks[i + 1..end], &[], &mut leaves);
                for (segments, binds) in leaves {
                    out.paths.push(PathUse {
                        scope: here.clone(),
                        segments,
                        binds: Some(binds),
                        public,
                        test: in_test(i),
                        line: toks[i].line,
                    });
                }
                i = end + 1;
                continue;
            }
            _ if t.starts_with(is_ident_char)
                && toks.get(i + 1).is_some_and(|n| n.text == "::")
                && (i == 0 || toks[i - 1].text != "::") =>
            {
                let mut segments = vec![t.to_string()];
                let mut k = i + 1;
                while toks.get(k).is_some_and(|n| n.text == "::")
                    && toks
                        .get(k + 1)
                        .is_some_and(|n| n.text.starts_with(is_ident_char))
                {
                    segments.push(toks[k + 1].text.clone());
                    k += 2;
                }
                out.paths.push(PathUse {
                    scope: here,
                    segments,
                    binds: None,
                    public: false,
                    test: in_test(i),
                    line: toks[i].line,
                });
                i = k;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether the `use` at `i` is preceded by `pub` or `pub(…)`.
fn is_public(toks: &[Token], i: usize) -> bool {
    if i >= 1 && toks[i - 1].text == "pub" {
        return true;
    }
    // pub ( crate ) use / pub ( in a :: b ) use
    if i >= 1 && toks[i - 1].text == ")" {
        let open = (0..i).rev().find(|&k| toks[k].text == "(");
        return open.is_some_and(|k| k >= 1 && toks[k - 1].text == "pub");
    }
    false
}

/// Expands a `use` tree into its leaves: the full path and the name it binds.
fn use_tree(toks: &[Token], prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].text.as_str();
        match t {
            "::" => {}
            "{" => {
                let close = matching_brace(toks, i).unwrap_or(toks.len() - 1);
                let mut start = i + 1;
                let mut depth = 0;
                for k in i + 1..=close {
                    match toks[k].text.as_str() {
                        "{" => depth += 1,
                        "}" if depth > 0 => depth -= 1,
                        "," | "}" if depth == 0 => {
                            if start < k {
                                use_tree(&toks[start..k], &path, out);
                            }
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            // A glob binds no one name, but is an arrow all the same.
            "*" => {
                out.push((path, String::new()));
                return;
            }
            "as" => {
                // `as _` binds no name.
                let alias = toks.get(i + 1).map(|a| a.text.clone()).unwrap_or_default();
                out.push((path, if alias == "_" { String::new() } else { alias }));
                return;
            }
            // `use a::{self, B}`: the leaf is the prefix itself.
            "self" if !path.is_empty() => {}
            _ => path.push(t.to_string()),
        }
        i += 1;
    }
    if let Some(last) = path.last().cloned() {
        out.push((path, last));
    }
}
