//! Text from elsewhere (the service, a CSV file, an argument) made safe to show: cut to
//! a bound ([`bounded`]) and made inert for a terminal or a log line ([`inert`]), so that
//! a server's 1 MB reason or an escape sequence in a QR code cannot flood or repaint an
//! operator's screen. Pure functions; every command that prints such text uses them.
//! Also the one set of bytes a URI carries as they are ([`UNRESERVED`]), for
//! `percent_encoding`. A leaf: it imports nothing of the crate.

use std::borrow::Cow;
use std::fmt::Write as _;

/// What RFC 3986 calls unreserved (letters, digits, `-`, `.`, `_`, `~`): every other
/// byte is percent-encoded (`percent_encoding::utf8_percent_encode(s, UNRESERVED)`).
pub const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Longest text from elsewhere that is stored or shown, in characters (the rest is cut,
/// marked with an ellipsis).
pub const SHOWN_MAX_CHARS: usize = 300;

/// `s` trimmed and cut to at most `max` characters, the cut marked with `…`.
pub fn bounded(s: &str, max: usize) -> String {
    let s = s.trim();
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Whether `c` must not reach a terminal as it is: C0 and C1 controls (escape
/// sequences, carriage return, backspace...), DEL, and the invisible format characters
/// that reorder or hide text (bidi embeddings, overrides and isolates, zero-width
/// characters, the byte order mark).
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2069}'
                | '\u{FEFF}'
        )
}

/// `s` with every character that could act on a terminal shown escaped instead
/// (`\n`, `\t`, `\r`, `\e`, `\u{202e}`...), and a backslash doubled only where it would
/// be ambiguous. Borrowed when nothing needs escaping (the common case).
pub fn inert(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_unsafe) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{1b}' => out.push_str("\\e"),
            c if is_unsafe(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`bounded`] then [`inert`]: what a table cell or a log field of foreign text shows.
pub fn shown(s: &str, max: usize) -> String {
    inert(&bounded(s, max)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cuts_long_text_on_a_character_and_marks_it() {
        assert_eq!(bounded("  abc  ", 5), "abc");
        assert_eq!(bounded("abcdef", 3), "abc…");
        assert_eq!(bounded("ééééé", 2), "éé…");
        assert_eq!(bounded(&"x".repeat(1_000_000), 300).chars().count(), 301);
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        assert!(matches!(inert("TTC0DEAD000001 °C ü"), Cow::Borrowed(_)));
    }

    #[test]
    fn controls_and_bidi_overrides_are_shown_escaped() {
        assert_eq!(inert("a\nb\tc\rd"), "a\\nb\\tc\\rd");
        assert_eq!(inert("\u{1b}[31mred"), "\\e[31mred");
        assert_eq!(inert("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(inert("x\u{7f}\u{9b}y"), "x\\u{7f}\\u{9b}y");
        assert_eq!(
            inert("zero\u{200b}width\u{feff}"),
            "zero\\u{200b}width\\u{feff}"
        );
        for c in ['\u{2066}', '\u{2069}', '\u{061c}', '\u{200f}'] {
            assert!(!inert(&c.to_string()).contains(c), "{c:?} passed raw");
        }
    }

    #[test]
    fn shown_bounds_before_escaping() {
        let s = format!("{}\n", "a".repeat(10));
        assert_eq!(shown(&s, 4), "aaaa…");
        assert_eq!(shown("a\u{1b}b", 10), "a\\eb");
    }
}
