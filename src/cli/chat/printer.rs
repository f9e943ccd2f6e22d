//! How `rozd chat` writes to the terminal: the answer on stdout, thinking
//! dimmed (or on stderr when stdout is not a terminal), status lines and
//! the prompt on stderr, each screen's lines kept whole.

use std::io::Write as _;

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// Writes to the terminal, keeping stdout's text and stderr's status lines
/// on separate lines. Write errors (a closed pipe) are ignored: there is
/// nowhere left to report them.
pub(super) struct Printer {
    stdout_tty: bool,
    /// stdout has a line without its newline yet.
    stdout_open: bool,
    /// A thinking block is open (on stdout when a terminal, else stderr).
    thinking_open: bool,
    /// A `> ` prompt is open on stderr.
    prompt_open: bool,
}

impl Printer {
    pub(super) fn new(stdout_tty: bool) -> Printer {
        Printer {
            stdout_tty,
            stdout_open: false,
            thinking_open: false,
            prompt_open: false,
        }
    }

    fn stdout(text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }

    fn stderr(text: &str) {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(text.as_bytes());
        let _ = err.flush();
    }

    pub(super) fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.end_thinking();
        self.end_prompt();
        Self::stdout(text);
        self.stdout_open = !text.ends_with('\n');
    }

    pub(super) fn thinking(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.end_prompt();
        if self.stdout_tty {
            Self::stdout(&format!("{DIM}{text}{RESET}"));
            self.stdout_open = !text.ends_with('\n');
        } else {
            Self::stderr(text);
        }
        self.thinking_open = !text.ends_with('\n');
    }

    fn end_thinking(&mut self) {
        if !self.thinking_open {
            return;
        }
        self.thinking_open = false;
        if self.stdout_tty {
            Self::stdout("\n");
            self.stdout_open = false;
        } else {
            Self::stderr("\n");
        }
    }

    /// One line on stderr, after ending any open line of the same screen.
    pub(super) fn status(&mut self, line: &str) {
        self.end_thinking();
        self.end_prompt();
        if self.stdout_tty && self.stdout_open {
            Self::stdout("\n");
            self.stdout_open = false;
        }
        Self::stderr(&format!("{line}\n"));
    }

    pub(super) fn prompt(&mut self, prompt: &str) {
        Self::stderr(prompt);
        self.prompt_open = true;
    }

    /// The user answered the prompt (their newline ended its line).
    pub(super) fn end_prompt(&mut self) {
        self.prompt_open = false;
    }

    /// The prompt got no line (end of input, Ctrl-C): end its line for them.
    pub(super) fn abandon_prompt(&mut self) {
        if self.prompt_open {
            Self::stderr("\n");
            self.prompt_open = false;
        }
    }

    /// Ends the open stdout line, so text from the next model call starts
    /// on its own line even when stdout is not a terminal.
    pub(super) fn break_text(&mut self) {
        self.end_thinking();
        if self.stdout_open {
            Self::stdout("\n");
            self.stdout_open = false;
        }
    }

    pub(super) fn end_turn(&mut self) {
        self.break_text();
    }
}
