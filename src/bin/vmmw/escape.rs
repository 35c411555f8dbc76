//! Names and messages made safe to print: control characters and the
//! bidirectional overrides written as escapes, so a hostile tensor name cannot
//! move the cursor or reorder a terminal line. Below both `output` and `exit`,
//! which each print through it.

/// Whether `c` must not reach a terminal raw: C0/C1 controls, and the
/// bidirectional overrides that reorder what follows them.
fn is_hazard(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(s: &str, keep_newlines: bool) -> String {
    if !s.chars().any(is_hazard) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if keep_newlines && c == '\n' {
            out.push(c);
        } else if is_hazard(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A tensor or destination name as it may be printed: every control
/// character (newline and escape included) written as `\n`, `\u{1b}`.
pub fn escape_name(s: &str) -> String {
    escape(s, false)
}

/// A message as it may be printed: like [`escape_name`], but line breaks stay.
pub fn escape_controls(s: &str) -> String {
    escape(s, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_and_plain_names_are_not() {
        assert_eq!(escape_name("model.embed"), "model.embed");
        assert_eq!(escape_name("a\u{1b}[31mb\nc"), "a\\u{1b}[31mb\\nc");
        assert_eq!(escape_name("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(escape_controls("one\ntwo\u{7}"), "one\ntwo\\u{7}");
    }
}
