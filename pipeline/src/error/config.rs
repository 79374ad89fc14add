//! Problems in a config file, each with its file, line and column, kept short and with a
//! "did you mean" for a misspelt name. Plain data: the config model (above) produces them.

use std::fmt;

/// One problem in a config file, with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The config file (or `<string>`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong and what is allowed there.
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(file: &str, line: usize, column: usize, message: String) -> Self {
        ConfigError {
            file: file.to_string(),
            line,
            column,
            message: with_suggestion(shorten(&plain_sizes(message))),
        }
    }

    /// A problem with a setting that has no place in a file (a config built in code, or what
    /// the machine allows): shown as `setting: message`.
    pub(crate) fn unlocated(setting: &str, message: String) -> Self {
        ConfigError {
            file: setting.to_string(),
            line: 0,
            column: 0,
            message: shorten(&message),
        }
    }
}

/// `bytesize`'s own message for a size it cannot parse ("expected parsable string") names
/// neither what a size looks like nor the units; every size setting goes through it, so the
/// message is completed here once instead of a custom deserializer per field.
fn plain_sizes(message: String) -> String {
    const BYTESIZE: &str = "expected parsable string";
    match message.find(BYTESIZE) {
        Some(at) => format!(
            "{}expected a size: a number of bytes or a number and a unit, e.g. `64 MiB`, `512 KB`, `2 GB`{}",
            &message[..at],
            &message[at + BYTESIZE.len()..]
        ),
        None => message,
    }
}

/// Longest quoted value (between backticks or double quotes) a message shows whole, in bytes.
pub const MAX_QUOTED_BYTES: usize = 80;
/// Longest message shown whole, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 2000;
/// Most problems a list of config errors shows; the rest are counted.
pub const MAX_SHOWN_ERRORS: usize = 50;

/// `text` cut to at most `max` bytes (at a character boundary), with how much was left out.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

/// A message with every long quoted value (a 50 MB string, a pasted file) cut to
/// [`MAX_QUOTED_BYTES`], and the whole to [`MAX_MESSAGE_BYTES`]: what was left out is counted.
fn shorten(message: &str) -> String {
    if message.len() <= MAX_QUOTED_BYTES {
        return message.to_string();
    }
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE_BYTES + 64));
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = &rest[open..open + 1];
        out.push_str(&rest[..=open]);
        let inner = &rest[open + 1..];
        let (value, after) = match inner.find(quote) {
            Some(close) => (&inner[..close], &inner[close..]),
            None => (inner, ""),
        };
        out.push_str(&cut(value, MAX_QUOTED_BYTES));
        match after.strip_prefix(quote) {
            Some(tail) => {
                out.push_str(quote);
                rest = tail;
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    cut(&out, MAX_MESSAGE_BYTES)
}

/// A message naming an unknown name and what was expected ("unknown field `colums`,
/// expected one of path, …, columns, …") gains the likely intended one ("; did you mean
/// `columns`?") when one is close (Jaro–Winkler similarity at least 0.8).
fn with_suggestion(message: String) -> String {
    const EXPECTED: &str = "expected one of";
    let Some(at) = message.find(EXPECTED) else {
        return message;
    };
    let head = &message[..at];
    let Some(unknown) = head
        .rfind('`')
        .and_then(|end| head[..end].rfind('`').map(|start| &head[start + 1..end]))
    else {
        return message;
    };
    let hint = did_you_mean(
        unknown,
        message[at + EXPECTED.len()..]
            .trim_start_matches(':')
            .split(',')
            .map(|c| c.trim().trim_matches('`')),
    );
    message + &hint
}

/// `; did you mean `x`?` naming the candidate closest to `unknown` when one is close
/// (Jaro–Winkler similarity at least 0.8), else nothing: for messages about an unknown key,
/// type or column that list the known ones.
pub fn did_you_mean<'a>(unknown: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    // Names are short; comparing a huge value with each candidate would take long for nothing.
    if unknown.len() > 64 {
        return String::new();
    }
    let best = candidates
        .into_iter()
        .filter(|c| !c.is_empty() && *c != unknown)
        .map(|c| (strsim::jaro_winkler(unknown, c), c))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((score, c)) if score >= 0.8 => format!("; did you mean `{c}`?"),
        _ => String::new(),
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            return write!(f, "{}: {}", self.file, self.message);
        }
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

/// All problems found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

/// The first [`MAX_SHOWN_ERRORS`] problems, one per line, then how many more there are.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().take(MAX_SHOWN_ERRORS).enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        match self.0.len().saturating_sub(MAX_SHOWN_ERRORS) {
            0 => Ok(()),
            1 => f.write_str("\n… and 1 more problem"),
            n => write!(f, "\n… and {n} more problems"),
        }
    }
}

impl std::error::Error for ConfigErrors {}

impl ConfigErrors {
    /// The errors in file order.
    pub fn sorted(mut errors: Vec<ConfigError>) -> Self {
        errors.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
        ConfigErrors(errors)
    }
}
