//! The size of an answer: a budget in tokens, counted as characters / 4, and the text
//! written within it.
//!
//! A tool writes its header, then rows while they fit, then one line for what did not:
//! [`Answer`] keeps the count, so a tool cannot overrun its budget by forgetting to check.

/// Characters per token, the usual estimate for English text and code.
pub const CHARS_PER_TOKEN: usize = 4;
/// Tokens an answer takes at most unless its `limit` or `max_nodes` asks for more.
pub const DEFAULT_TOKENS: usize = 2_000;
/// Room kept for the closing lines (what was cut, the link) whatever the rows take.
const TRAILER_CHARS: usize = 600;

/// Tokens of `text`, as the budget counts them.
pub fn tokens(text: &str) -> usize {
    text.chars().count().div_ceil(CHARS_PER_TOKEN)
}

/// The budget for a tool called with `asked` rows where `default` is its usual count: the
/// default budget, widened in proportion when more rows are asked for.
pub fn tokens_for(asked: usize, default: usize) -> usize {
    if asked <= default || default == 0 {
        DEFAULT_TOKENS
    } else {
        DEFAULT_TOKENS.saturating_mul(asked).div_ceil(default)
    }
}

/// An answer being written.
#[derive(Debug)]
pub struct Answer {
    text: String,
    chars: usize,
    limit: usize,
}

impl Answer {
    pub fn new(tokens: usize) -> Answer {
        Answer {
            text: String::new(),
            chars: 0,
            limit: tokens.saturating_mul(CHARS_PER_TOKEN),
        }
    }

    /// A line that must be there (a header, a closing line).
    pub fn line(&mut self, line: impl AsRef<str>) {
        let line = line.as_ref();
        self.text.push_str(line);
        self.text.push('\n');
        self.chars += line.chars().count() + 1;
    }

    /// A row, if it fits with room left for the closing lines; false when it did not.
    pub fn row(&mut self, line: impl AsRef<str>) -> bool {
        let line = line.as_ref();
        let size = line.chars().count() + 1;
        if self.chars + size + TRAILER_CHARS > self.limit {
            return false;
        }
        self.line(line);
        true
    }

    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_stop_at_the_budget_and_closing_lines_still_fit() {
        let mut answer = Answer::new(300); // 1,200 characters
        answer.line("header");
        let row = "x".repeat(99);
        let mut rows = 0;
        while answer.row(&row) {
            rows += 1;
        }
        // 7 header characters, then 100 per row, with 600 kept back.
        assert_eq!(rows, 5);
        answer.line("… 3 more rows: 1.0 % of the total");
        assert!(tokens(&answer.finish()) <= 300);
    }

    #[test]
    fn asking_for_more_rows_widens_the_budget() {
        assert_eq!(tokens_for(10, 20), DEFAULT_TOKENS);
        assert_eq!(tokens_for(40, 20), 2 * DEFAULT_TOKENS);
        assert_eq!(tokens("abcde"), 2);
    }
}
