//! The house rules a crate's source keeps, checked from the source itself: its modules import
//! one way down a table of floors (no circle, nothing looks up), and no file or production
//! function outgrows a reader. Each crate's `tests/floors.rs` calls [`check`] with its table.
//!
//! An import is any `crate::a::b` or `super::x` path outside comments and outside the trailing
//! `#[cfg(test)] mod tests` block, resolved to the longest module of the crate it names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Limits every crate keeps.
pub const MAX_FILE_LINES: usize = 1500;
pub const MAX_FN_LINES: usize = 150;

/// One module of a crate: its path (`a::b`, `""` for the crate root), its file, its source
/// without comments and without its trailing test module.
#[derive(Debug)]
pub struct Module {
    pub name: String,
    pub file: PathBuf,
    pub lines: usize,
    pub code: String,
}

/// Reads every `.rs` file under `src` as a module.
pub fn modules(src: &Path) -> Vec<Module> {
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            let name = if parts == ["lib"] || parts == ["main"] {
                String::new()
            } else {
                parts.join("::")
            };
            let text = fs::read_to_string(&file).unwrap();
            Module {
                name,
                lines: text.lines().count(),
                code: strip(&text),
                file,
            }
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            // `src/bin` holds binaries, each a crate of its own.
            if p.file_name().is_some_and(|n| n != "bin") {
                walk(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs")
            // A module's unit tests in a file of their own (`mod tests;`) are not production.
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

/// The source without comments, string contents, and the trailing `#[cfg(test)] mod tests`.
fn strip(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The crate's import edges: module → the modules it names.
pub fn edges(mods: &[Module]) -> BTreeMap<String, BTreeSet<String>> {
    let names: BTreeSet<&str> = mods.iter().map(|m| m.name.as_str()).collect();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in mods {
        let e = out.entry(m.name.clone()).or_default();
        for (prefix, base) in [("crate::", String::new()), ("super::", parent(&m.name))] {
            for (i, _) in m.code.match_indices(prefix) {
                if m.code[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
                {
                    continue;
                }
                let path: Vec<&str> = m.code[i + prefix.len()..]
                    .split("::")
                    .map(|s| {
                        let end = s
                            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                            .unwrap_or(s.len());
                        &s[..end]
                    })
                    .take_while(|s| !s.is_empty())
                    .collect();
                for k in (1..=path.len()).rev() {
                    let cand = join(&base, &path[..k].join("::"));
                    if names.contains(cand.as_str()) {
                        if cand != m.name && !m.name.starts_with(&format!("{cand}::")) {
                            e.insert(cand);
                        }
                        break;
                    }
                }
            }
        }
    }
    out
}

fn parent(name: &str) -> String {
    name.rsplit_once("::")
        .map(|(p, _)| p.to_string())
        .unwrap_or_default()
}

fn join(base: &str, rest: &str) -> String {
    if base.is_empty() {
        rest.to_string()
    } else {
        format!("{base}::{rest}")
    }
}

/// The import circles (strongly connected components of more than one module).
pub fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Kosaraju: order by finish time, then collect on the reversed graph.
    let nodes: Vec<&String> = edges.keys().collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for n in &nodes {
        finish(n, edges, &mut seen, &mut order);
    }
    let mut rev: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, bs) in edges {
        for b in bs {
            rev.entry(b.as_str()).or_default().push(a.as_str());
        }
    }
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.iter().rev() {
        if done.contains(n.as_str()) {
            continue;
        }
        let mut comp = Vec::new();
        let mut stack = vec![n.as_str()];
        done.insert(n.as_str());
        while let Some(v) = stack.pop() {
            comp.push(v.to_string());
            for w in rev.get(v).into_iter().flatten() {
                if done.insert(w) {
                    stack.push(w);
                }
            }
        }
        if comp.len() > 1 {
            comp.sort();
            out.push(comp);
        }
    }
    out
}

fn finish(
    n: &String,
    edges: &BTreeMap<String, BTreeSet<String>>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<String>,
) {
    if !seen.insert(n.clone()) {
        return;
    }
    // Iterative DFS keeps deep graphs off the stack.
    let mut stack: Vec<(String, Vec<String>)> = vec![(
        n.clone(),
        edges.get(n).into_iter().flatten().cloned().collect(),
    )];
    while let Some((v, mut rest)) = stack.pop() {
        if let Some(w) = rest.pop() {
            stack.push((v, rest));
            if seen.insert(w.clone()) {
                let next = edges.get(&w).into_iter().flatten().cloned().collect();
                stack.push((w, next));
            }
        } else {
            order.push(v);
        }
    }
}

/// The rank of `module` in `floors` (module-path prefix → rank; higher floors import lower
/// ones): the entry of the longest prefix that names it or a room around it.
pub fn rank(floors: &[(&str, u32)], module: &str) -> Option<u32> {
    floors
        .iter()
        .filter(|(p, _)| module == *p || module.starts_with(&format!("{p}::")))
        .max_by_key(|(p, _)| p.len())
        .map(|&(_, r)| r)
}

/// Production functions longer than [`MAX_FN_LINES`]: (file:line, name, lines).
pub fn long_functions(m: &Module) -> Vec<(String, String, usize)> {
    let lines: Vec<&str> = m.code.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some(name) = fn_name(lines[i]) {
            let (mut depth, mut started, mut j) = (0i64, false, i);
            'body: while j < lines.len() {
                for c in without_literals(lines[j]).chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            started = true
                        }
                        '}' => depth -= 1,
                        ';' if !started && depth == 0 => break 'body,
                        _ => {}
                    }
                }
                if started && depth <= 0 {
                    break;
                }
                j += 1;
            }
            let n = j - i + 1;
            if started && n > MAX_FN_LINES {
                out.push((format!("{}:{}", m.file.display(), i + 1), name, n));
            }
        }
        i += 1;
    }
    out
}

fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.next() {
        match w {
            "pub" | "const" | "unsafe" | "async" | "extern" | "\"C\"" => continue,
            w if w.starts_with("pub(") => continue,
            "fn" => {
                let n = words.next()?;
                let end = n
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(n.len());
                return Some(n[..end].to_string());
            }
            _ => return None,
        }
    }
    None
}

/// A line with its string and char literals emptied, so braces inside them do not count.
fn without_literals(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            '\'' => {
                // A char literal ('x', '\n', '{') — not a lifetime ('a).
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    chars.next();
                    chars.next();
                    while chars.next_if(|&d| d != '\'').is_some() {}
                    chars.next();
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Every breach of the house rules in the crate whose source is `src`, one line each: an
/// unranked module, an import circle, an import that looks up a floor, a file over
/// [`MAX_FILE_LINES`], a production function over [`MAX_FN_LINES`].
pub fn breaches(src: &Path, floors: &[(&str, u32)]) -> Vec<String> {
    let mut mods = modules(src);
    // Files named from the crate's folder (`src/a.rs`), not from this machine's root.
    let base = src.parent().unwrap_or(src);
    for m in &mut mods {
        m.file = m.file.strip_prefix(base).unwrap_or(&m.file).to_path_buf();
    }
    let g = edges(&mods);
    let mut out = Vec::new();
    for m in &mods {
        if rank(floors, &m.name).is_none() {
            out.push(format!("module `{}` is on no floor of the table", m.name));
        }
        if m.lines > MAX_FILE_LINES {
            out.push(format!(
                "{}: {} lines (at most {MAX_FILE_LINES})",
                m.file.display(),
                m.lines
            ));
        }
        for (at, name, n) in long_functions(m) {
            out.push(format!(
                "{at}: fn {name} is {n} lines (at most {MAX_FN_LINES})"
            ));
        }
    }
    for c in circles(&g) {
        out.push(format!("import circle: {}", c.join(" ⇄ ")));
    }
    for (a, bs) in &g {
        for b in bs {
            if let (Some(ra), Some(rb)) = (rank(floors, a), rank(floors, b)) {
                if rb > ra {
                    out.push(format!(
                        "`{a}` (floor {ra}) imports `{b}` (floor {rb}): an import looks up"
                    ));
                }
            }
        }
    }
    out
}

/// Panics with every breach listed when the crate at `src` breaks a house rule.
pub fn check(src: &Path, floors: &[(&str, u32)]) {
    let b = breaches(src, floors);
    assert!(
        b.is_empty(),
        "{} breaks the house rules:\n  {}",
        src.display(),
        b.join("\n  ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small crate written to a temporary directory.
    fn tree(files: &[(&str, &str)]) -> PathBuf {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vur-house-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        for (path, text) in files {
            let p = dir.join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    const FLOORS: &[(&str, u32)] = &[("", 9), ("top", 3), ("room", 2), ("floor", 1)];

    fn lib() -> (&'static str, &'static str) {
        ("lib.rs", "pub mod floor;\npub mod room;\npub mod top;\n")
    }

    #[test]
    fn a_house_that_keeps_the_rules_passes() {
        let d = tree(&[
            lib(),
            (
                "top.rs",
                "use crate::room::a::A;\n// crate::top is a comment\n",
            ),
            ("room/mod.rs", "pub mod a;\npub mod b;\n"),
            ("room/a.rs", "use super::b::B;\nuse crate::floor::F;\n"),
            ("room/b.rs", "pub struct B; // use crate::top::T;\n"),
            (
                "floor.rs",
                "#[cfg(test)]\nmod tests {\n use crate::top::T;\n}\n",
            ),
        ]);
        assert_eq!(breaches(&d, FLOORS), Vec::<String>::new());
        let g = edges(&modules(&d));
        assert_eq!(g["room::a"], ["floor", "room::b"].map(String::from).into());
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_circle_a_look_up_and_an_unranked_module_are_breaches() {
        let d = tree(&[
            ("lib.rs", "pub mod floor;\npub mod room;\npub mod attic;\n"),
            ("room/mod.rs", "pub mod a;\npub mod b;\n"),
            ("room/a.rs", "use super::b::B;\n"),
            ("room/b.rs", "fn f() { crate::room::a::g() }\n"),
            ("floor.rs", "use crate::room::a;\n"),
            ("attic.rs", ""),
        ]);
        let b = breaches(&d, FLOORS);
        assert!(
            b.contains(&"import circle: room::a ⇄ room::b".to_string()),
            "{b:?}"
        );
        assert!(
            b.contains(
                &"`floor` (floor 1) imports `room::a` (floor 2): an import looks up".to_string()
            ),
            "{b:?}"
        );
        assert!(
            b.contains(&"module `attic` is on no floor of the table".to_string()),
            "{b:?}"
        );
        assert_eq!(b.len(), 3, "{b:?}");
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_long_function_and_a_long_file_are_breaches() {
        let body = "    let x = '{';\n    let s = \"}}\";\n".repeat(75);
        let long = format!("pub fn long() {{\n{body}}}\nfn short() {{}}\n");
        let big = "// a line\n".repeat(MAX_FILE_LINES + 1);
        let d = tree(&[
            ("lib.rs", "pub mod floor;\npub mod room;\n"),
            ("room.rs", &long),
            ("floor.rs", &big),
        ]);
        let b = breaches(&d, FLOORS);
        assert_eq!(b.len(), 2, "{b:?}");
        assert!(
            b[0].ends_with("floor.rs: 1501 lines (at most 1500)"),
            "{b:?}"
        );
        assert!(
            b[1].ends_with("room.rs:1: fn long is 152 lines (at most 150)"),
            "{b:?}"
        );
        fs::remove_dir_all(d).unwrap();
    }
}
