//! `${VAR}` interpolation of environment variables in config text, before YAML parsing (as
//! Vector does): `${VAR}` is replaced by the variable's value, `${VAR:-default}` falls back to
//! `default` when the variable is unset or empty, and `$$` is a literal `$`. Comments
//! (`#` at the start of a line or after whitespace) are left alone.

use super::ConfigError;

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
    fn comments_are_not_interpolated() {
        let out = interpolate("# uses ${NOPE}\nx: 1 # ${NOPE}\ny: \"#${A}\"\n", "f", &env).unwrap();
        assert_eq!(out, "# uses ${NOPE}\nx: 1 # ${NOPE}\ny: \"#alpha\"\n");
    }
}
