//! `${VAR}` interpolation of environment variables in config text, before YAML parsing (as
//! Vector does): `${VAR}` is replaced by the variable's value, `${VAR:-default}` falls back to
//! `default` when the variable is unset or empty, and `$$` is a literal `$`. Comments
//! (`#` at the start of a line or after whitespace) are left alone.
//!
//! Line breaks are made uniform first ([`normalize_line_breaks`]): YAML counts `\r\n`, `\n`
//! and a lone `\r` alike as one break, and so must interpolation and every position in a
//! message, or a file saved with old Mac line endings would be one long "line" to them.

use std::borrow::Cow;

use super::ConfigError;

/// `text` with every `\r\n` and every lone `\r` turned into `\n`. YAML itself reads all three
/// as one line break (and folds them to `\n` inside scalars), so the document means the same;
/// lines and columns stay those an editor shows.
pub(crate) fn normalize_line_breaks(text: &str) -> Cow<'_, str> {
    if !text.contains('\r') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\r') {
        out.push_str(&rest[..at]);
        out.push('\n');
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('\n') {
            rest = after;
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// The text of a config file's bytes. Bytes that are not UTF-8 are refused naming the first
/// one: its byte offset, and its line and column (counted over the valid text before it).
pub(crate) fn decode(bytes: Vec<u8>, origin: &str) -> Result<String, ConfigError> {
    if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
        return Err(ConfigError::new(
            origin,
            1,
            1,
            "not UTF-8: the file starts with a UTF-16 byte-order mark (byte offset 0); a pipeline file must be UTF-8 text: save it as UTF-8".to_string(),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let bad = e.utf8_error().error_len();
        let shown: Vec<String> = bytes[at..]
            .iter()
            .take(bad.unwrap_or(4).min(4))
            .map(|b| format!("0x{b:02X}"))
            .collect();
        let (line, column) = line_and_column(std::str::from_utf8(&bytes[..at]).unwrap_or(""));
        let what = match bad {
            Some(_) => "is not UTF-8",
            None => "starts a character the file ends before finishing: it is not UTF-8",
        };
        ConfigError::new(
            origin,
            line,
            column,
            format!(
                "byte offset {at} ({}) {what}; a pipeline file must be UTF-8 text: save it as UTF-8, or remove the byte",
                shown.join(" ")
            ),
        )
    })
}

/// 1-based line and column (in characters) just past `prefix`, counting line breaks as YAML
/// does (`\r\n`, `\n` or a lone `\r`): where the text that follows `prefix` starts.
pub(crate) fn line_and_column(prefix: &str) -> (usize, usize) {
    let mut line = 1;
    let mut column = 1;
    let mut after_cr = false;
    for c in prefix.chars() {
        match c {
            '\n' if after_cr => {}
            '\n' | '\r' => {
                line += 1;
                column = 1;
            }
            _ => column += 1,
        }
        after_cr = c == '\r';
    }
    (line, column)
}

/// Replaces every `${…}` in `text` using `lookup`. Returns every unset variable as an error
/// with its line and column, all at once.
pub(crate) fn interpolate(
    text: &str,
    origin: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, Vec<ConfigError>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    for (line_no, line) in text.split_inclusive('\n').enumerate() {
        let comment_at = comment_start(line);
        let (body, comment) = line.split_at(comment_at);
        let mut rest = body;
        let mut col = 1usize;
        while let Some(pos) = rest.find('$') {
            out.push_str(&rest[..pos]);
            col += rest[..pos].chars().count();
            let after = &rest[pos + 1..];
            if let Some(stripped) = after.strip_prefix('$') {
                out.push('$');
                rest = stripped;
                col += 2;
            } else if let Some(inner) = after.strip_prefix('{') {
                match inner.find('}') {
                    Some(end) => {
                        let expr = &inner[..end];
                        let (name, default) = match expr.split_once(":-") {
                            Some((n, d)) => (n, Some(d)),
                            None => (expr, None),
                        };
                        let valid = !name.is_empty()
                            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                        if !valid {
                            errors.push(ConfigError::new(
                                origin,
                                line_no + 1,
                                col,
                                format!(
                                    "`${{{expr}}}` is not a valid variable reference; use ${{NAME}} or ${{NAME:-default}} with NAME made of letters, digits and _ (write $$ for a literal $)"
                                ),
                            ));
                        } else {
                            match lookup(name).filter(|v| !v.is_empty() || default.is_none()) {
                                Some(v) => out.push_str(&v),
                                None => match default {
                                    Some(d) => out.push_str(d),
                                    None => errors.push(ConfigError::new(
                                        origin,
                                        line_no + 1,
                                        col,
                                        format!(
                                            "environment variable `{name}` is not set (used as `${{{name}}}`); set it, or give a default with `${{{name}:-value}}`"
                                        ),
                                    )),
                                },
                            }
                        }
                        let consumed = 2 + end + 1;
                        col += rest[pos..pos + consumed].chars().count();
                        rest = &rest[pos + consumed..];
                    }
                    None => {
                        errors.push(ConfigError::new(
                            origin,
                            line_no + 1,
                            col,
                            "unterminated `${`: missing `}` (write $$ for a literal $)".to_string(),
                        ));
                        out.push_str(&rest[pos..]);
                        rest = "";
                    }
                }
            } else {
                out.push('$');
                rest = after;
                col += 1;
            }
        }
        out.push_str(rest);
        out.push_str(comment);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Byte index where a YAML comment starts on this line (or the line length). A `#` starts a
/// comment at the beginning of the line or after whitespace, outside quotes.
fn comment_start(line: &str) -> usize {
    let mut quote: Option<char> = None;
    let mut prev_ws = true;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && prev_ws => return i,
            None => {}
        }
        prev_ws = c.is_whitespace();
    }
    line.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "A" => Some("alpha".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn replaces_defaults_and_escapes() {
        let out = interpolate("x: ${A}/${B:-beta}/$$HOME/${EMPTY:-e}\n", "f", &env).unwrap();
        assert_eq!(out, "x: alpha/beta/$HOME/e\n");
    }

    #[test]
    fn reports_every_unset_variable_with_position() {
        let errs = interpolate("a: 1\nb: ${NOPE}\nc: x${ALSO_NOT}\n", "p.yaml", &env).unwrap_err();
        assert_eq!(errs.len(), 2);
        assert_eq!((errs[0].line, errs[0].column), (2, 4));
        assert!(errs[0].message.contains("`NOPE` is not set"), "{}", errs[0]);
        assert_eq!((errs[1].line, errs[1].column), (3, 5));
    }

    #[test]
    fn line_breaks_are_made_uniform() {
        assert_eq!(normalize_line_breaks("a\nb\n"), "a\nb\n");
        assert!(matches!(normalize_line_breaks("a\nb"), Cow::Borrowed(_)));
        assert_eq!(normalize_line_breaks("a\r\nb\r\n"), "a\nb\n");
        assert_eq!(normalize_line_breaks("a\rb\r"), "a\nb\n");
        assert_eq!(normalize_line_breaks("a\r\rb\r\n\nc"), "a\n\nb\n\nc");
        assert_eq!(normalize_line_breaks("\r"), "\n");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_placed() {
        assert_eq!(decode(b"a: 1\n".to_vec(), "f").unwrap(), "a: 1\n");
        let e = decode(b"a: 1\r\nb: x\xFFy\n".to_vec(), "f.yaml").unwrap_err();
        assert_eq!((e.line, e.column), (2, 5), "{e}");
        assert!(e.message.contains("byte offset 10 (0xFF)"), "{e}");
        assert!(e.message.contains("must be UTF-8"), "{e}");
        let e = decode(b"a: \xC3".to_vec(), "f.yaml").unwrap_err();
        assert!(e.message.contains("byte offset 3 (0xC3)"), "{e}");
        let e = decode(b"\xFF\xFEa\0".to_vec(), "f.yaml").unwrap_err();
        assert!(e.message.contains("UTF-16"), "{e}");
    }

    #[test]
    fn positions_count_every_kind_of_line_break() {
        for text in ["ab\ncd\nef", "ab\r\ncd\r\nef", "ab\rcd\ref"] {
            assert_eq!(line_and_column(text), (3, 3), "{text:?}");
        }
        assert_eq!(line_and_column(""), (1, 1));
        assert_eq!(line_and_column("é\r"), (2, 1));
        assert_eq!(line_and_column("éa"), (1, 3));
    }

    #[test]
    fn comments_are_not_interpolated() {
        let out = interpolate("# uses ${NOPE}\nx: 1 # ${NOPE}\ny: \"#${A}\"\n", "f", &env).unwrap();
        assert_eq!(out, "# uses ${NOPE}\nx: 1 # ${NOPE}\ny: \"#alpha\"\n");
    }
}
