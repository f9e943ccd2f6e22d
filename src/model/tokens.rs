//! A small, deterministic token estimate: the same text always counts the
//! same, and counts grow with text roughly like a BPE tokenizer's (about one
//! token per four characters of a word, one per punctuation mark).

/// Estimated tokens in `text`.
pub(crate) fn count(text: &str) -> u32 {
    // Runs over the system prompt, the Observation and every new message
    // before each model call: ASCII, nearly all of that text, is classified
    // a byte at a time; other characters are decoded as they come.
    let mut counter = Counter::default();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        if let Some(&class) = ASCII.get(usize::from(byte)) {
            counter.push(class == WORD, class == SPACE);
            at += 1;
        } else {
            // `at` is a char boundary: it only ever moves by whole characters.
            let Some(c) = text.get(at..).and_then(|rest| rest.chars().next()) else {
                break;
            };
            counter.push(c.is_alphanumeric(), c.is_whitespace());
            at += c.len_utf8();
        }
    }
    counter.finish()
}

const WORD: u8 = 0;
const SPACE: u8 = 1;
const OTHER: u8 = 2;

/// The class of each ASCII byte: a word character (alphanumeric or `_`),
/// whitespace ([`is_ascii_whitespace_char`]), or other.
const ASCII: [u8; 128] = {
    let mut classes = [OTHER; 128];
    let mut byte = 0;
    while byte < 128 {
        let b = byte as u8;
        if b.is_ascii_alphanumeric() || b == b'_' {
            classes[byte] = WORD;
        } else if is_ascii_whitespace_char(b) {
            classes[byte] = SPACE;
        }
        byte += 1;
    }
    classes
};

/// Whether an ASCII byte is whitespace as `char::is_whitespace` has it:
/// unlike `u8::is_ascii_whitespace`, that includes the vertical tab.
pub(crate) const fn is_ascii_whitespace_char(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}

/// A word's characters count a token per four; any other character that
/// is not whitespace is a token of its own.
#[derive(Default)]
struct Counter {
    tokens: u32,
    word_len: u32,
}

impl Counter {
    fn push(&mut self, in_word: bool, space: bool) {
        if in_word {
            self.word_len = self.word_len.saturating_add(1);
        } else {
            self.end_word();
            if !space {
                self.tokens = self.tokens.saturating_add(1);
            }
        }
    }

    fn end_word(&mut self) {
        if self.word_len > 0 {
            self.tokens = self.tokens.saturating_add(self.word_len.div_ceil(4));
            self.word_len = 0;
        }
    }

    fn finish(mut self) -> u32 {
        self.end_word();
        self.tokens
    }
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
        assert_eq!(count("a\u{b}b"), 2); // a vertical tab separates words
        assert_eq!(count("größe 3 µm"), 2 + 1 + 1);
        assert_eq!(count("日本語、テスト"), 1 + 1 + 1);
    }

    /// The count as first written: a char at a time.
    fn count_by_char(text: &str) -> u32 {
        let mut tokens: u32 = 0;
        let mut word_len: u32 = 0;
        for c in text.chars() {
            if c.is_alphanumeric() || c == '_' {
                word_len += 1;
            } else {
                if word_len > 0 {
                    tokens += word_len.div_ceil(4);
                    word_len = 0;
                }
                if !c.is_whitespace() {
                    tokens += 1;
                }
            }
        }
        tokens + word_len.div_ceil(4)
    }

    proptest::proptest! {
        #[test]
        fn counts_as_a_char_at_a_time(text in "(?s).{0,200}") {
            proptest::prop_assert_eq!(count(&text), count_by_char(&text));
        }

        #[test]
        fn counts_ascii_as_a_char_at_a_time(text in "[\\x00-\\x7f]{0,200}") {
            proptest::prop_assert_eq!(count(&text), count_by_char(&text));
        }
    }
}
