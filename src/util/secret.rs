//! Secrets (password, token) behind a newtype that never prints its value, and the
//! helpers that keep them out of text from elsewhere: [`scrub`] for what a server
//! answered, [`is_secret_key`] for what a config file or the environment holds.
//! A leaf: it imports nothing of the crate.

use std::fmt;

/// A secret string. `Debug` and `Display` print `<redacted>`; the value is reachable
/// only through [`Secret::expose`], so it cannot slip into a log line or an error.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Secrets shorter than this many characters are not looked for in text: so short a
/// string turns up in ordinary words and numbers, and replacing it there would garble
/// what the service said without keeping anything secret. (The token is always far
/// longer; a password this short is for the service's owner to change, and the one
/// endpoint that sees it, the token endpoint, never has its answer shown: see
/// `api::auth::refusal`.)
pub const SCRUB_MIN_CHARS: usize = 8;

/// What replaces a secret.
pub const REDACTED: &str = "<redacted>";

/// `text` with every whole occurrence of each secret of at least [`SCRUB_MIN_CHARS`]
/// characters replaced by `<redacted>`, in whatever encoding the secret appears: as
/// it is, form-encoded (`Sup3rSecretPw%21`, `+` for a space), percent-encoded (any
/// case of hex, any mix), JSON-escaped (`\"`, `\\`, `\/`, `\u0021`, surrogate
/// pairs), HTML-escaped (`&amp;`, `&#33;`, `&#x21;`), character by character. *Whole*:
/// an occurrence that a letter or digit continues on a side where the secret itself
/// ends in one is part of a longer word, not the secret, and is left alone. Longer
/// secrets go first, so that one holding another is not left half shown.
pub fn scrub(text: &str, secrets: &[&str]) -> String {
    let mut secrets: Vec<Vec<char>> = secrets
        .iter()
        .filter(|s| s.chars().count() >= SCRUB_MIN_CHARS)
        .map(|s| s.chars().collect())
        .collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for secret in &secrets {
        out = scrub_one(&out, secret);
    }
    out
}

fn scrub_one(text: &str, secret: &[char]) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut at = 0;
    while at < bytes.len() {
        if text.is_char_boundary(at) {
            if let Some(end) =
                longest_match(bytes, at, secret).filter(|&end| whole(text, at, end, secret))
            {
                out.push_str(&text[copied..at]);
                out.push_str(REDACTED);
                copied = end;
                at = end;
                continue;
            }
        }
        at += 1;
    }
    out.push_str(&text[copied..]);
    out
}

/// Whether the match `start..end` is not continued by a letter or digit where the
/// secret itself begins or ends with one.
fn whole(text: &str, start: usize, end: usize, secret: &[char]) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric());
    let before = text[..start].chars().next_back();
    let after = text[end..].chars().next();
    !(alnum(secret.first().copied()) && alnum(before)
        || alnum(secret.last().copied()) && alnum(after))
}

/// The end of the longest encoded occurrence of `secret` starting at `start`, if any:
/// every character of the secret in turn, each in any of its encodings (a small
/// nondeterministic match: the set of positions reachable so far).
fn longest_match(text: &[u8], start: usize, secret: &[char]) -> Option<usize> {
    let mut reach = vec![start];
    for &c in secret {
        let mut next = Vec::new();
        for &at in &reach {
            for end in encodings_at(text, at, c) {
                if !next.contains(&end) {
                    next.push(end);
                }
            }
        }
        if next.is_empty() {
            return None;
        }
        reach = next;
    }
    reach.into_iter().max()
}

/// Where `c` ends if it is written at `at` in one of its encodings (possibly several).
fn encodings_at(text: &[u8], at: usize, c: char) -> Vec<usize> {
    let mut ends = Vec::new();
    let rest = &text[at..];
    let mut buf = [0u8; 4];
    let utf8 = c.encode_utf8(&mut buf).as_bytes();
    if rest.starts_with(utf8) {
        ends.push(at + utf8.len());
    }
    if c == ' ' && rest.starts_with(b"+") {
        ends.push(at + 1);
    }
    // Percent-encoded, byte by byte, hex of any case.
    if let Some(n) = percent_encoded(rest, utf8) {
        ends.push(at + n);
    }
    // JSON escapes.
    let short = match c {
        '"' => Some(b'"'),
        '\\' => Some(b'\\'),
        '/' => Some(b'/'),
        '\u{8}' => Some(b'b'),
        '\u{c}' => Some(b'f'),
        '\n' => Some(b'n'),
        '\r' => Some(b'r'),
        '\t' => Some(b't'),
        _ => None,
    };
    if let Some(e) = short {
        if rest.starts_with(&[b'\\', e]) {
            ends.push(at + 2);
        }
    }
    let mut units = [0u16; 2];
    let mut n = 0;
    let mut ok = true;
    for unit in c.encode_utf16(&mut units).iter() {
        match json_unit(&rest[n..]) {
            Some(u) if u == *unit => n += 6,
            _ => {
                ok = false;
                break;
            }
        }
    }
    if ok {
        ends.push(at + n);
    }
    // HTML character references.
    if rest.first() == Some(&b'&') {
        if let Some(semi) = rest.iter().take(12).position(|&b| b == b';') {
            let name = &rest[1..semi];
            let named = match name {
                b"amp" => Some('&'),
                b"lt" => Some('<'),
                b"gt" => Some('>'),
                b"quot" => Some('"'),
                b"apos" => Some('\''),
                _ => None,
            };
            let numeric = match name {
                [b'#', b'x' | b'X', hex @ ..] => std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u32::from_str_radix(h, 16).ok()),
                [b'#', dec @ ..] => std::str::from_utf8(dec).ok().and_then(|d| d.parse().ok()),
                _ => None,
            };
            if named == Some(c) || numeric == Some(c as u32) {
                ends.push(at + semi + 1);
            }
        }
    }
    ends
}

/// How many bytes of `text` spell `bytes` percent-encoded (`%21`, `%c3%A9`).
fn percent_encoded(text: &[u8], bytes: &[u8]) -> Option<usize> {
    let mut n = 0;
    for &b in bytes {
        let hex = text.get(n..n + 3)?;
        if hex[0] != b'%' || !hex[1..].iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let v = u8::from_str_radix(std::str::from_utf8(&hex[1..]).ok()?, 16).ok()?;
        if v != b {
            return None;
        }
        n += 3;
    }
    Some(n)
}

/// The UTF-16 unit of a JSON `\uXXXX` escape at the start of `text`.
fn json_unit(text: &[u8]) -> Option<u16> {
    let esc = text.get(..6)?;
    if &esc[..2] != b"\\u" || !esc[2..].iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u16::from_str_radix(std::str::from_utf8(&esc[2..]).ok()?, 16).ok()
}

/// Whether a config key holds a secret whose value must never be echoed (and never be
/// reinterpreted: an override of it is taken as the exact string).
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|s| key.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_removes_every_secret_longest_first() {
        assert_eq!(
            scrub(
                "pw hunter2hunter tok abcdefgh hunter2hunter",
                &["hunter2hunter", "abcdefgh", ""]
            ),
            "pw <redacted> tok <redacted> <redacted>"
        );
        assert_eq!(
            scrub("t=abcdefgh-ijklmnop", &["abcdefgh", "abcdefgh-ijklmnop"]),
            "t=<redacted>"
        );
    }

    const PW: &str = "Sup3rSecretPw!";

    #[test]
    fn a_secret_is_scrubbed_in_every_encoding_it_can_take() {
        for (shown, encoded) in [
            ("literal", "Sup3rSecretPw!"),
            ("form-encoded", "Sup3rSecretPw%21"),
            ("lower-case hex", "Sup3rSecretPw%21"),
            (
                "every byte percent-encoded",
                "%53%75%70%33%72%53%65%63%72%65%74%50%77%21",
            ),
            ("mixed case hex", "%53u%70%33rSecretPw%21"),
            ("JSON \\u escapes", "Sup3rSecretPw\\u0021"),
            (
                "JSON \\u escapes throughout",
                "\\u0053\\u0075p3rSecretPw\\u0021",
            ),
            ("HTML numeric", "Sup3rSecretPw&#33;"),
            ("HTML hex", "Sup3rSecretPw&#x21;"),
        ] {
            let text = format!("bad request: password={encoded}&client_id=x");
            assert_eq!(
                scrub(&text, &[PW]),
                "bad request: password=<redacted>&client_id=x",
                "{shown}: {encoded}"
            );
        }
        let awkward = "a \"b\\c/d é😀 e&f";
        for encoded in [
            r#"a \"b\\c\/d \u00e9\ud83d\ude00 e&f"#,
            "a+%22b%5Cc%2Fd+%C3%A9%F0%9F%98%80+e%26f",
            "a%20%22b%5cc/d%20%c3%a9%f0%9f%98%80%20e%26f",
            "a &quot;b\\c/d é😀 e&amp;f",
        ] {
            assert_eq!(
                scrub(&format!("[{encoded}]"), &[awkward]),
                "[<redacted>]",
                "{encoded}"
            );
        }
    }

    #[test]
    fn a_short_secret_or_a_part_of_a_longer_word_is_left_alone() {
        // Too short to tell from ordinary text: the message stays readable.
        assert_eq!(
            scrub(
                "table 42: the value 1234 is not acceptable",
                &["abl", "1234"]
            ),
            "table 42: the value 1234 is not acceptable"
        );
        // Whole occurrences only.
        let pw = "hunter22";
        assert_eq!(
            scrub("hunter22 hunter222 xhunter22", &[pw]),
            "<redacted> hunter222 xhunter22"
        );
        assert_eq!(scrub("(hunter22)", &[pw]), "(<redacted>)");
        // A secret that ends in a symbol ends there, whatever follows.
        assert_eq!(scrub("Sup3rSecretPw!abc", &[PW]), "<redacted>abc");
    }

    #[test]
    fn secret_keys_are_recognised_by_name() {
        for k in [
            "password",
            "PASSWORD",
            "password_file",
            "client_secret",
            "token",
        ] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["username", "base_url", "customer_id"] {
            assert!(!is_secret_key(k), "{k}");
        }
    }

    #[test]
    fn secret_never_formats_its_value() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?} {s}").contains("hunter2"));
        assert_eq!(s.expose(), "hunter2");
    }
}
