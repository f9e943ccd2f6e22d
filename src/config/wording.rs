//! Serde's and the TOML parser's messages in the words of the
//! configuration's reader: `expected u32` is "a whole number", `[sensors]`
//! written for `[[sensors]]` says so, a misspelt key gets "did you mean".
//! Plain functions of the message and the key; unit-tested on strings.

/// `message` (from deserialising at `key`) reworded for people.
pub(super) fn reword(message: &str, key: &str) -> String {
    if message == "invalid type: map, expected a sequence" {
        let name = key.rsplit('.').next().unwrap_or(key);
        return format!(
            "`[{key}]` is one table, but `{name}` is a list of tables: write `[[{key}]]` \
             (double brackets) before each entry"
        );
    }
    let mut text = numbers(message);
    if let Some(guess) = unknown_field_guess(message) {
        text.push_str(&format!("; did you mean `{guess}`?"));
    }
    text
}

/// Rust's number types as words.
fn numbers(message: &str) -> String {
    const WORDS: [(&str, &str); 12] = [
        ("u8", "a whole number from 0 to 255"),
        ("u16", "a whole number from 0 to 65535"),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u64", "a whole number from 0 up"),
        ("usize", "a whole number from 0 up"),
        ("i8", "a whole number"),
        ("i16", "a whole number"),
        ("i32", "a whole number"),
        ("i64", "a whole number"),
        ("isize", "a whole number"),
        ("f32", "a number"),
        ("f64", "a number"),
    ];
    let mut text = message.to_string();
    for (ty, words) in WORDS {
        let from = format!("expected {ty}");
        if let Some(at) = text.find(&from) {
            let end = at + from.len();
            // Only the whole word: `expected u8` is not `expected u80`.
            if !text[end..].starts_with(|c: char| c.is_alphanumeric()) {
                text.replace_range(at..end, &format!("expected {words}"));
            }
        }
    }
    text.replace("floating point `", "a number with a fraction `")
}

/// For `unknown field `x`, expected one of `a`, `b``: the known field
/// closest to `x`, if it is close (a typo, not another word).
fn unknown_field_guess(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (unknown, rest) = rest.split_once('`')?;
    let known = rest
        .strip_prefix(", expected one of ")
        .or_else(|| rest.strip_prefix(", expected "))?;
    known
        .split(", ")
        .map(|k| k.trim_matches('`'))
        .filter(|k| !k.is_empty())
        .map(|k| (distance(unknown, k), k))
        .filter(|(d, k)| *d <= (k.len().max(unknown.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.to_string())
}

/// Edit distance (insertions, deletions, substitutions, adjacent swaps).
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 35, item 15: the words a person reads.
    #[test]
    fn messages_in_words() {
        assert_eq!(
            reword(
                "invalid type: floating point `1.5`, expected u32",
                "server.max_connections"
            ),
            "invalid type: a number with a fraction `1.5`, expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            reword("invalid value: integer `-3`, expected u64", "ooda.x"),
            "invalid value: integer `-3`, expected a whole number from 0 up"
        );
        assert_eq!(
            reword(
                "invalid type: string \"a\", expected f64",
                "sensors[0].offset"
            ),
            "invalid type: string \"a\", expected a number"
        );
        assert_eq!(
            reword("invalid type: map, expected a sequence", "sensors"),
            "`[sensors]` is one table, but `sensors` is a list of tables: write `[[sensors]]` \
             (double brackets) before each entry"
        );
        let typo = reword(
            "unknown field `listne`, expected one of `listen`, `auth_tokens`, `tls`",
            "server.listne",
        );
        assert!(typo.ends_with("; did you mean `listen`?"), "{typo}");
        let far = reword(
            "unknown field `colour`, expected one of `listen`, `auth_tokens`, `tls`",
            "server.colour",
        );
        assert!(!far.contains("did you mean"), "{far}");
        assert!(
            reword("unknown field `nmae`, expected `name`", "x").ends_with("did you mean `name`?")
        );
    }
}
