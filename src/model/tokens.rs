//! A small, deterministic token estimate: the same text always counts the
//! same, and counts grow with text roughly like a BPE tokenizer's (about one
//! token per four characters of a word, one per punctuation mark).

/// Estimated tokens in `text`.
pub fn count(text: &str) -> u32 {
    let mut tokens: u32 = 0;
    let mut word_len: u32 = 0;
    let flush = |len: &mut u32, tokens: &mut u32| {
        if *len > 0 {
            *tokens = tokens.saturating_add(len.div_ceil(4));
            *len = 0;
        }
    };
    for c in text.chars() {
        if c.is_alphanumeric() || c == '_' {
            word_len += 1;
        } else {
            flush(&mut word_len, &mut tokens);
            if !c.is_whitespace() {
                tokens = tokens.saturating_add(1);
            }
        }
    }
    flush(&mut word_len, &mut tokens);
    tokens
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_words_by_length_and_punctuation() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hi"), 1);
        assert_eq!(count("hello world"), 4); // 5 chars -> 2, 5 chars -> 2
        assert_eq!(count("set gripper 0.5"), 1 + 2 + 3); // "0", ".", "5"
        assert_eq!(count("  \n\t "), 0);
        assert_eq!(count("{\"a\":1}"), 7);
    }
}
