//! Where a key is in the TOML text: the line of a dotted key
//! (`actuators[1].safe_value`), and the key at a byte offset of a parse
//! error. Both read the spans of the `toml` crate's own document tree, so
//! multi-line strings, dotted keys, inline tables and arrays of tables are
//! located as the parser saw them.

use std::ops::Range;

use toml::de::{DeTable, DeValue};

/// Name of the whole document in errors that belong to no key.
pub(super) const DOCUMENT: &str = "<document>";

/// One key of the document: its dotted path and where it is.
struct Entry {
    path: String,
    /// The key itself (for an array's element: the element).
    key: Range<usize>,
    /// Its value; for a table opened by a `[header]`, the header.
    value: Range<usize>,
    depth: usize,
}

/// Every key of the document (best effort on text that does not parse).
fn entries(text: &str) -> Vec<Entry> {
    let (root, _errors) = DeTable::parse_recoverable(text);
    let mut out = Vec::new();
    walk(root.get_ref(), "", 1, &mut out);
    out
}

fn walk(table: &DeTable<'_>, prefix: &str, depth: usize, out: &mut Vec<Entry>) {
    for (key, value) in table.iter() {
        let path = if prefix.is_empty() {
            key.get_ref().to_string()
        } else {
            format!("{prefix}.{}", key.get_ref())
        };
        out.push(Entry {
            path: path.clone(),
            key: key.span(),
            value: value.span(),
            depth,
        });
        match value.get_ref() {
            DeValue::Table(inner) => walk(inner, &path, depth + 1, out),
            // Elements are keys of their own only when they are tables
            // (`[[actuators]]`, or inline tables in an array).
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let DeValue::Table(inner) = item.get_ref() {
                        let element = format!("{path}[{i}]");
                        out.push(Entry {
                            path: element.clone(),
                            key: item.span(),
                            value: item.span(),
                            depth: depth + 1,
                        });
                        walk(inner, &element, depth + 2, out);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The 1-based line of a byte offset.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The 1-based line and dotted key at a byte offset of the text (of a
/// parse error): the innermost key whose name or value holds the offset,
/// else the table whose header comes last before it.
pub(super) fn locate_span(text: &str, offset: usize) -> (Option<usize>, String) {
    let entries = entries(text);
    let holds = |r: &Range<usize>| r.start <= offset && offset < r.end.max(r.start + 1);
    let inner = entries
        .iter()
        .filter(|e| holds(&e.key) || holds(&e.value))
        .max_by_key(|e| e.depth);
    let key = match inner {
        Some(e) => e.path.clone(),
        None => entries
            .iter()
            .filter(|e| e.value.start <= offset && text[e.value.clone()].starts_with('['))
            .max_by_key(|e| (e.value.start, e.depth))
            .map_or_else(|| DOCUMENT.to_string(), |e| e.path.clone()),
    };
    (Some(line_of(text, offset)), key)
}

/// The line where a dotted key (`server.listen`, `actuators[1].max`) is set;
/// if it is not set, the line of the innermost table that holds it (not the
/// document).
pub(super) fn locate_key(text: &str, dotted: &str) -> Option<usize> {
    let entries = entries(text);
    let mut path = dotted;
    loop {
        if let Some(e) = entries.iter().find(|e| e.path == path) {
            return Some(line_of(text, e.key.start));
        }
        // `a.b[2].c` -> `a.b[2]` -> `a.b` -> `a`
        let cut = path.rfind(['.', '['])?;
        path = &path[..cut];
    }
}
