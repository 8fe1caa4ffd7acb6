//! The crate read as a house: every file under `src/` with its module path, the arrows
//! between modules drawn from `crate::…`, `super::…`, `self::…` and child paths (in
//! `use` statements and in code), each arrow resolved through `pub use` re-exports to
//! the file that defines what it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::scan::{self, Function, PathUse};

/// A source file: its path from the package root, its module node, its lines and
/// functions.
pub struct File {
    pub path: String,
    pub node: String,
    pub lines: usize,
    pub functions: Vec<Function>,
}

/// Where an arrow is written: the first place, as `file:line`, and the path.
#[derive(Debug, Clone)]
pub struct Site {
    pub at: String,
    pub path: String,
}

pub struct House {
    pub files: Vec<File>,
    /// from node -> to node -> where the arrow is first written.
    pub arrows: BTreeMap<String, BTreeMap<String, Site>>,
}

/// `src/config/mod.rs` -> `config`, `src/config/raw.rs` -> `config::raw`, `src/lib.rs`
/// -> `` (the crate), `src/main.rs` -> `main` (the binary, a crate of its own). Another
/// crate of the workspace reads the same from its own `src/`: `mock/src/service/mod.rs`
/// -> `service`.
pub fn module_of(rel: &str) -> Vec<String> {
    let inner = rel.split_once("src/").map_or(rel, |(_, r)| r);
    let inner = inner.trim_end_matches(".rs");
    let mut parts: Vec<String> = inner.split('/').map(String::from).collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts
}

pub fn node_name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

/// Reads `root/src/**/*.rs`.
pub fn read(root: &Path) -> Vec<(String, String)> {
    read_crate(root, "src")
}

/// Reads `root/SRC/**/*.rs` (`src` for the gateway, `mock/src` for the mock service's
/// crate), each path from `root`.
pub fn read_crate(root: &Path, src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.join(src)];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).expect("read a crate's src/");
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).expect("under the root");
                let text = std::fs::read_to_string(&path).expect("a readable source file");
                out.push((rel.to_string_lossy().into_owned(), text));
            }
        }
    }
    out.sort();
    out
}

/// Builds the house from `(path, text)` pairs (paths like `src/config/mod.rs`).
pub fn build(sources: &[(String, String)]) -> House {
    let mut files = Vec::new();
    // module path -> the node (file module) it lives in.
    let mut modules: BTreeMap<Vec<String>, String> = BTreeMap::new();
    let mut paths: Vec<(String, String, PathUse)> = Vec::new();
    // Modules only tests compile (`#[cfg(test)] mod tests;`) and what is under them.
    let mut test_modules: Vec<Vec<String>> = Vec::new();
    for (rel, text) in sources {
        let module = module_of(rel);
        let node = node_name(&module);
        let code = scan::blank(text);
        let toks = scan::tokens(&code);
        let scanned = scan::scan(&toks, &module);
        modules.insert(module.clone(), node.clone());
        test_modules.extend(scanned.test_children.iter().cloned());
        for inline in &scanned.inline_modules {
            modules.insert(inline.clone(), node.clone());
        }
        paths.extend(
            scanned
                .paths
                .into_iter()
                .map(|p| (rel.clone(), node.clone(), p)),
        );
        files.push(File {
            path: rel.clone(),
            node,
            lines: text.lines().count(),
            functions: scan::functions(&toks),
        });
    }
    // (module, name) -> the path a `use` binds that name to, in that module.
    let mut bindings = Bindings::new();
    for (_, _, p) in &paths {
        if let Some(name) = p.binds.as_ref().filter(|n| !n.is_empty()) {
            bindings
                .entry((p.scope.clone(), name.clone()))
                .or_insert((p.scope.clone(), p.segments.clone()));
        }
    }
    let resolver = Resolver { modules, bindings };
    let mut arrows: BTreeMap<String, BTreeMap<String, Site>> = BTreeMap::new();
    for (rel, node, p) in &paths {
        let file_module = module_of(rel);
        if p.test || test_modules.iter().any(|t| file_module.starts_with(t)) {
            continue;
        }
        let Some(target) = resolver.resolve(&p.scope, &p.segments, 0) else {
            continue;
        };
        let to = resolver.modules[&target].clone();
        // A module re-exporting what its own children define (`pub use keeper::X` in
        // clock/mod.rs) shows them; it does not depend on them.
        let reexport_of_child = p.public && target.starts_with(&p.scope);
        if &to == node || reexport_of_child {
            continue;
        }
        arrows
            .entry(node.clone())
            .or_default()
            .entry(to)
            .or_insert_with(|| Site {
                at: format!("{rel}:{}", p.line),
                path: p.segments.join("::"),
            });
    }
    House { files, arrows }
}

/// (module, name) -> (the module the `use` is written in, the path it binds the name to).
type Bindings = BTreeMap<(Vec<String>, String), (Vec<String>, Vec<String>)>;

struct Resolver {
    modules: BTreeMap<Vec<String>, String>,
    bindings: Bindings,
}

impl Resolver {
    /// The module a path written in `scope` lands in (the deepest known module along it,
    /// followed through a `use` of the item it then names), or `None` when it leaves the
    /// crate (`std::…`, `tokio::…`) or names a local item (`Self::…`, `Vec::new`).
    fn resolve(&self, scope: &[String], segments: &[String], depth: usize) -> Option<Vec<String>> {
        if depth > 8 || segments.is_empty() {
            return None;
        }
        let (mut module, rest): (Vec<String>, &[String]) = match segments[0].as_str() {
            "crate" | "$crate" | "tapegate" => (Vec::new(), &segments[1..]),
            "self" => (scope.to_vec(), &segments[1..]),
            "super" => {
                let mut m = scope.to_vec();
                let mut k = 0;
                while segments.get(k).is_some_and(|s| s == "super") {
                    m.pop();
                    k += 1;
                }
                (m, &segments[k..])
            }
            first => {
                let mut child = scope.to_vec();
                child.push(first.to_string());
                if self.modules.contains_key(&child) {
                    (child, &segments[1..])
                } else {
                    let (from, path) = self.bindings.get(&(scope.to_vec(), first.to_string()))?;
                    if path.len() == 1 && path[0] == first {
                        return None; // `use tokio;`
                    }
                    let mut full = path.clone();
                    full.extend_from_slice(&segments[1..]);
                    return self.resolve(from, &full, depth + 1);
                }
            }
        };
        let mut rest = rest.iter();
        for seg in rest.by_ref() {
            let mut deeper = module.clone();
            deeper.push(seg.clone());
            if self.modules.contains_key(&deeper) {
                module = deeper;
                continue;
            }
            // An item of `module`: perhaps a `use` there (a re-export) names it.
            if let Some((from, path)) = self.bindings.get(&(module.clone(), seg.clone())) {
                if let Some(target) = self.resolve(from, path, depth + 1) {
                    return Some(target);
                }
            }
            break;
        }
        self.modules.contains_key(&module).then_some(module)
    }
}

/// The circles of a directed graph: each strongly connected component of more than one
/// node, as its sorted members.
pub fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, iterative enough for a few hundred nodes.
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut State<'a>, v: &'a str) {
        st.index.insert(v, st.next);
        st.low.insert(v, st.next);
        st.next += 1;
        st.stack.push(v);
        st.on_stack.insert(v);
        if let Some(targets) = st.edges.get(v) {
            for w in targets {
                let w = w.as_str();
                if !st.index.contains_key(w) {
                    visit(st, w);
                    let low = st.low[v].min(st.low[w]);
                    st.low.insert(v, low);
                } else if st.on_stack.contains(w) {
                    let low = st.low[v].min(st.index[w]);
                    st.low.insert(v, low);
                }
            }
        }
        if st.low[v] == st.index[v] {
            let mut component = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                st.out.push(component);
            }
        }
    }
    let mut st = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.out.sort();
    st.out
}
