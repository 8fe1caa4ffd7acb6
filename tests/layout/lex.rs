//! The layout guard's lexer: Rust source with comments and the insides of literals
//! blanked (lines kept), then cut into tokens with their lines.

/// `text` with every comment and the inside of every string and character literal
/// replaced by spaces; newlines are kept, so line numbers still hold.
pub fn blank(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let mut out: Vec<char> = Vec::with_capacity(s.len());
    let mut i = 0;
    let keep = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.extend([' ', ' ']);
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.extend([' ', ' ']);
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(keep(s[i]));
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&s, i) {
            // r"…", r#"…"#, br"…": up to the quote and as many hashes.
            while s[i] != '"' {
                out.push(s[i]);
                i += 1;
            }
            out.push('"');
            i += 1;
            while i < s.len() {
                if s[i] == '"' && (0..hashes).all(|h| s.get(i + 1 + h) == Some(&'#')) {
                    out.push('"');
                    out.extend(std::iter::repeat_n('#', hashes));
                    i += 1 + hashes;
                    break;
                }
                out.push(keep(s[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < s.len() && s[i] != '"' {
                if s[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < s.len() {
                    out.push(keep(s[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && is_char_literal(&s, i) {
            out.push('\'');
            i += 1;
            while i < s.len() && s[i] != '\'' {
                if s[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// The number of hashes of a raw string starting at `i`, if one does.
fn raw_string_start(s: &[char], i: usize) -> Option<usize> {
    if i > 0 && is_ident_char(s[i - 1]) {
        return None;
    }
    let mut j = i;
    if s[j] == 'b' || s[j] == 'c' {
        j += 1;
    }
    if s.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&c| c == '#').count();
    (s.get(j + hashes) == Some(&'"')).then_some(hashes)
}

/// `'x'` or `'\n'`, not a lifetime (`'a`).
fn is_char_literal(s: &[char], i: usize) -> bool {
    match s.get(i + 1) {
        Some('\\') => true,
        Some(_) => s.get(i + 2) == Some(&'\''),
        None => false,
    }
}

pub fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A token of blanked source: an identifier or keyword, or one punctuation character
/// (`::` is one token), with its line (1-based).
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub text: String,
    pub line: usize,
}

pub fn tokens(code: &str) -> Vec<Token> {
    let s: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < s.len() {
        let c = s[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if is_ident_char(c) || (c == '$' && s.get(i + 1).is_some_and(|&n| is_ident_char(n)))
        {
            let start = i;
            i += 1;
            while i < s.len() && is_ident_char(s[i]) {
                i += 1;
            }
            out.push(Token {
                text: s[start..i].iter().collect(),
                line,
            });
        } else if c == ':' && s.get(i + 1) == Some(&':') {
            out.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}
