//! The documentation holds together: every internal link of `README.md` and
//! the book in `docs/` (relative `.md` links and their `#anchors`, images)
//! points at something that exists, every page of the book is in its
//! `SUMMARY.md`, and the configuration reference
//! (`docs/reference/configuration.md`) lists exactly the keys the
//! configuration accepts, section by section, and every key that
//! `config/rozd.toml` shows. mdBook itself builds the book (scripts/test.sh
//! runs `mdbook build docs`) but does not fail on a broken link; this does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use rozd::config::{Config, ConfigSource};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every Markdown file of the book, recursively, plus the README.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut files);
    files
}

/// The text outside fenced code blocks, line by line (code lines become
/// empty, so line numbers stay right).
fn prose_lines(text: &str) -> Vec<String> {
    let mut fence: Option<&str> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match fence {
                Some(f) => {
                    if trimmed.starts_with(f) {
                        fence = None;
                    }
                    String::new()
                }
                None if trimmed.starts_with("```") => {
                    fence = Some("```");
                    String::new()
                }
                None if trimmed.starts_with("~~~") => {
                    fence = Some("~~~");
                    String::new()
                }
                None => line.to_string(),
            }
        })
        .collect()
}

/// `line` without its inline code spans.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let fence = "`".repeat(ticks);
        let after = &rest[start + ticks..];
        match after.find(&fence) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The anchor mdBook (and GitHub) give a heading: its text without markup,
/// lowercased, spaces to '-', every other character but letters, digits,
/// '_' and '-' dropped.
fn anchor_of(heading: &str) -> String {
    let link = regex::Regex::new(r"\[([^\]]*)\]\([^)]*\)").unwrap();
    let text = link.replace_all(heading, "$1");
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_string())
            } else {
                None
            }
        })
        .collect()
}

/// The anchors a page defines: its headings (a repeated one gets `-1`,
/// `-2`, ... as mdBook and GitHub number them) and explicit `id="..."`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let id = regex::Regex::new(r#"(?:id|name)="([^"]+)""#).unwrap();
    for line in prose_lines(text) {
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                let base = anchor_of(heading.trim());
                let n = seen.entry(base.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
        }
        for c in id.captures_iter(&line) {
            out.insert(c[1].to_string());
        }
    }
    out
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Each link target of a page with its line number: inline links and
/// images, outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let link = regex::Regex::new(r#"\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)"#).unwrap();
    let mut out = Vec::new();
    for (i, line) in prose_lines(text).iter().enumerate() {
        for c in link.captures_iter(&without_code_spans(line)) {
            out.push((i + 1, c[1].to_string()));
        }
    }
    out
}

#[test]
fn anchors_are_computed_as_mdbook_and_github_do() {
    assert_eq!(
        anchor_of("Browsers: Origin, Host and content type"),
        "browsers-origin-host-and-content-type"
    );
    assert_eq!(anchor_of("`[server.tls]`"), "servertls");
    assert_eq!(anchor_of("`[[rules]]` `then`"), "rules-then");
    assert_eq!(
        anchor_of("A model provider's API key"),
        "a-model-providers-api-key"
    );
    assert_eq!(anchor_of("Upgrade, remove, purge"), "upgrade-remove-purge");
    let page = "# A\n\n## Same\n\n```\n# not a heading\n```\n\n## Same\n";
    let a = anchors(page);
    assert!(a.contains("a") && a.contains("same") && a.contains("same-1"));
    assert!(!a.contains("not-a-heading"));
}

#[test]
fn every_internal_link_and_anchor_resolves() {
    let root = root();
    let docs = root.join("docs");
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = read(&file);
        let here = file.parent().unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                normalize(&here.join(path))
            };
            if !resolved.exists() {
                broken.push(format!("{name}:{line}: {target}: no such file"));
                continue;
            }
            // The built book holds only docs/: a page there that links out
            // of it would be a dead link on the rendered page.
            if file.starts_with(&docs) && !resolved.starts_with(&docs) {
                broken.push(format!(
                    "{name}:{line}: {target}: leaves docs/ (name the file in `code` instead)"
                ));
                continue;
            }
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&resolved)).contains(anchor)
            {
                broken.push(format!(
                    "{name}:{line}: {target}: no heading with anchor #{anchor} in {}",
                    resolved.strip_prefix(&root).unwrap_or(&resolved).display()
                ));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_include_of_the_book_names_a_file() {
    let include = regex::Regex::new(r"\{\{#include ([^}:]+)(?::[^}]*)?\}\}").unwrap();
    let mut missing = Vec::new();
    for file in markdown_files() {
        let text = read(&file);
        for c in include.captures_iter(&text) {
            let target = normalize(&file.parent().unwrap().join(c[1].trim()));
            if !target.is_file() {
                missing.push(format!("{}: {}", file.display(), &c[1]));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{{{{#include}}}} of missing files: {missing:?}"
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let docs = root().join("docs");
    let summary = read(&docs.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|(_, t)| normalize(&docs.join(t)))
        .collect();
    let missing: Vec<String> = markdown_files()
        .into_iter()
        .filter(|f| f.starts_with(&docs) && f.file_name().is_some_and(|n| n != "SUMMARY.md"))
        .filter(|f| !listed.contains(f))
        .map(|f| f.strip_prefix(&docs).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "pages of docs/ that SUMMARY.md does not list (unreachable in the book): {missing:?}"
    );
}

/// The safety model names the tests that check each guarantee; a renamed or
/// deleted test must not leave the page pointing at nothing.
#[test]
fn every_test_the_safety_model_names_exists() {
    fn sources(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push_str(&read(&path));
            }
        }
    }
    let mut code = String::new();
    sources(&root().join("src"), &mut code);
    sources(&root().join("tests"), &mut code);
    let page = read(&root().join("docs/safety.md"));
    // Test names are code spans of at least four snake_case words.
    let name = regex::Regex::new(r"`([a-z0-9]+(?:_[a-z0-9]+){3,})`").unwrap();
    let named: BTreeSet<&str> = name
        .captures_iter(&page)
        .map(|c| c.get(1).unwrap().as_str())
        .collect();
    assert!(
        named.len() > 30,
        "the safety model names its tests: {named:?}"
    );
    let missing: Vec<&&str> = named
        .iter()
        .filter(|n| !code.contains(&format!("fn {n}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/safety.md names tests that do not exist: {missing:?}"
    );
}

#[test]
fn the_readme_keeps_the_two_set_up_commands() {
    let readme = read(&root().join("README.md"));
    for command in ["cargo run --locked --release -- run", "./scripts/test.sh"] {
        assert!(
            readme.contains(&format!("```bash\n{command}\n```")),
            "README.md must show `{command}` as its own code block"
        );
    }
}

// ---------------------------------------------------------------- configuration reference

const REFERENCE: &str = "docs/reference/configuration.md";

/// Every table of the configuration, as the reference names it in a
/// heading, with a snippet that puts an unknown key (`ZZZ`) into it.
const TABLES: &[(&str, &str)] = &[
    ("[host]", "[host]\nZZZ\n"),
    ("[server]", "[server]\nZZZ\n"),
    ("[server.tls]", "[server.tls]\nZZZ\n"),
    ("[[server.tokens]]", "[[server.tokens]]\nZZZ\n"),
    ("[[server.clients]]", "[[server.clients]]\nZZZ\n"),
    ("[log]", "[log]\nZZZ\n"),
    ("[store]", "[store]\nZZZ\n"),
    ("[session]", "[session]\nZZZ\n"),
    ("[tasks]", "[tasks]\nZZZ\n"),
    ("[[permissions]]", "[[permissions]]\nZZZ\n"),
    ("[approvals]", "[approvals]\nZZZ\n"),
    ("[agent]", "[agent]\nZZZ\n"),
    ("[mcp]", "[mcp]\nZZZ\n"),
    ("[foxglove]", "[foxglove]\nZZZ\n"),
    ("[record]", "[record]\nZZZ\n"),
    ("[replay]", "[replay]\nZZZ\n"),
    ("[model]", "[model]\nZZZ\n"),
    ("[[model.endpoints]]", "[[model.endpoints]]\nZZZ\n"),
    ("[ooda]", "[ooda]\nZZZ\n"),
    ("[safety]", "[safety]\nZZZ\n"),
    ("[fleet]", "[fleet]\nurl = \"mqtt://127.0.0.1\"\nZZZ\n"),
    ("[gpio]", "[gpio]\nZZZ\n"),
    ("[mqtt]", "[mqtt]\nurl = \"mqtt://127.0.0.1\"\nZZZ\n"),
    (
        "[[serial]]",
        "[[serial]]\nname = \"p\"\npath = \"/dev/null\"\nZZZ\n",
    ),
    (
        "[[modbus]]",
        "[[modbus]]\nname = \"m\"\nurl = \"tcp://h\"\nZZZ\n",
    ),
    (
        "[[modbus]] rtu",
        "[[modbus]]\nname = \"m\"\nrtu = { port = \"/dev/x\", ZZZ }\n",
    ),
    ("[sim]", "[sim]\nZZZ\n"),
    ("[sim.battery]", "[sim.battery]\nZZZ\n"),
    ("[sim.motor]", "[sim.motor]\nZZZ\n"),
    ("[sim.faults]", "[sim.faults]\nZZZ\n"),
    ("[sim] start", "[sim]\nstart = { x = 1, y = 1, ZZZ }\n"),
    (
        "[sim] obstacles",
        "[sim]\nobstacles = [{ min_x = 1, min_y = 1, max_x = 2, max_y = 2, ZZZ }]\n",
    ),
    (
        "[[sensors]]",
        "[[sensors]]\nname = \"s\"\nsource = \"sim\"\nZZZ\n",
    ),
    (
        "[[actuators]]",
        "[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\nZZZ\n",
    ),
    (
        "[[actuators]] feedback",
        "[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\nfeedback = { ZZZ }\n",
    ),
    (
        "[[actuators]] feedback cross_check",
        "[[sensors]]\nname = \"s\"\nsource = \"sim\"\n[[actuators]]\nname = \"a\"\nkind = \"sim\"\nmin = 0\nmax = 1\nsafe_value = 0\nfeedback = { sensor = \"s\", tolerance = 1, settle_ms = 1, cross_check = { ZZZ } }\n",
    ),
    (
        "[[rules]]",
        "[[rules]]\nname = \"r\"\nwhen = \"true\"\nZZZ\nthen = { estop = true }\n",
    ),
    (
        "[[rules]] then",
        "[[rules]]\nname = \"r\"\nwhen = \"true\"\nthen = { ZZZ }\n",
    ),
    (
        "[[cameras]]",
        "[[cameras]]\nname = \"c\"\nsource = \"sim\"\nZZZ\n",
    ),
];

/// The keys a table accepts, from the error an unknown key produces (as
/// tests/integration/config_doc.rs reads them).
fn accepted_keys(snippet: &str) -> BTreeSet<String> {
    let text = snippet.replace("ZZZ", "zzz_not_a_key = 1");
    let err = Config::parse(&text, ConfigSource::BuiltIn)
        .expect_err("an unknown key is an error")
        .to_string();
    let expected = err
        .split_once("expected")
        .unwrap_or_else(|| panic!("no list of expected keys in: {err}"))
        .1;
    let keys: BTreeSet<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    assert!(!keys.is_empty(), "{err}");
    keys
}

/// The reference page's sections: a `##`/`###` heading whose code spans
/// name the table (`[server]`, `[[rules]]` `then`), and the keys its table
/// rows list in their first column.
fn reference_sections() -> BTreeMap<String, BTreeSet<String>> {
    let text = read(&root().join(REFERENCE));
    let code = regex::Regex::new(r"`([^`]+)`").unwrap();
    let row = regex::Regex::new(r"^\|\s*`([a-z_][a-z0-9_]*)`").unwrap();
    let mut sections: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in prose_lines(&text) {
        if line.starts_with("## ") || line.starts_with("### ") {
            let spans: Vec<&str> = code
                .captures_iter(&line)
                .map(|c| c.get(1).unwrap().as_str())
                .collect();
            current = spans
                .first()
                .filter(|s| s.starts_with('['))
                .map(|_| spans.join(" "));
            if let Some(name) = &current {
                assert!(
                    sections.insert(name.clone(), BTreeSet::new()).is_none(),
                    "{REFERENCE}: section {name} twice"
                );
            }
        } else if let (Some(name), Some(c)) = (&current, row.captures(&line)) {
            sections.get_mut(name).unwrap().insert(c[1].to_string());
        }
    }
    sections
}

#[test]
fn the_configuration_reference_lists_exactly_the_accepted_keys() {
    let sections = reference_sections();
    let mut problems = Vec::new();
    for (table, snippet) in TABLES {
        let accepted = accepted_keys(snippet);
        let Some(listed) = sections.get(*table) else {
            problems.push(format!("no section for {table}"));
            continue;
        };
        let missing: Vec<&String> = accepted.difference(listed).collect();
        let unknown: Vec<&String> = listed.difference(&accepted).collect();
        if !missing.is_empty() {
            problems.push(format!("{table}: keys not listed: {missing:?}"));
        }
        if !unknown.is_empty() {
            problems.push(format!(
                "{table}: listed keys the configuration does not accept: {unknown:?}"
            ));
        }
    }
    for name in sections.keys() {
        if !TABLES.iter().any(|(t, _)| t == name) {
            problems.push(format!(
                "section {name} is not a table this test knows (add it to TABLES)"
            ));
        }
    }
    // Every top-level table has its section.
    for key in accepted_keys("ZZZ\n") {
        if !sections.contains_key(&format!("[{key}]"))
            && !sections.contains_key(&format!("[[{key}]]"))
        {
            problems.push(format!("top-level table {key} has no section"));
        }
    }
    assert!(problems.is_empty(), "{REFERENCE}:\n{}", problems.join("\n"));
}

#[test]
fn the_configuration_reference_and_the_annotated_config_name_the_same_keys() {
    let doc = read(&root().join("config/rozd.toml"));
    let listed: BTreeSet<String> = reference_sections().into_values().flatten().collect();
    // Every `key = ...` in config/rozd.toml, set or commented, also inside
    // inline tables.
    let assignment =
        regex::Regex::new(r"(?m)(?:^#?[ \t]*|[{,][ \t]*)([a-z_][a-z0-9_]*)[ \t]*=[^=]").unwrap();
    let shown: BTreeSet<String> = assignment
        .captures_iter(&doc)
        .map(|c| c[1].to_string())
        .collect();
    let not_in_reference: Vec<&String> = shown.difference(&listed).collect();
    assert!(
        not_in_reference.is_empty(),
        "config/rozd.toml shows keys that {REFERENCE} does not list: {not_in_reference:?}"
    );
    let word = |k: &str| regex::Regex::new(&format!(r"\b{k}\b")).unwrap();
    let not_in_config: Vec<&String> = listed.iter().filter(|k| !word(k).is_match(&doc)).collect();
    assert!(
        not_in_config.is_empty(),
        "{REFERENCE} lists keys that config/rozd.toml never names: {not_in_config:?}"
    );
}
