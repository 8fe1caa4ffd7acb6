//! The devices CSV of the operator commands (a "manifest"): RFC 4180, read strictly so
//! that a slip in the file can never send a request a person did not mean.
//! Pure: it touches text only.
//!
//! - A header row names the columns; a column named twice, or one that no command
//!   knows, stops the command before anything is sent (naming it and its line). A known
//!   column that this command does not use is ignored, so one manifest drives `add`,
//!   `label`, `show` and `deactivate`.
//! - A quoted field may hold commas, doubled quotes and line breaks; a quote opened and
//!   never closed stops the command, naming the line where it opened (it would
//!   otherwise swallow every row after it).
//! - A row that cannot be read (a quote inside an unquoted field, text after a closing
//!   quote, the wrong number of fields) is reported with its line number and not sent;
//!   the other rows are.
//! - A UTF-8 byte order mark (spreadsheet exports) and CRLF line ends are taken;
//!   unquoted fields are trimmed; blank lines are skipped.

use std::collections::HashMap;

use serde::Serialize;

/// A row that cannot be sent, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadRow {
    pub line: u64,
    pub message: String,
}

/// A row read: its line (where it starts) and its values by column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub line: u64,
    pub values: HashMap<String, String>,
}

impl Row {
    /// The value of `column`, `None` when absent or empty.
    pub fn get(&self, column: &str) -> Option<&str> {
        self.values
            .get(column)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// A manifest read: the header, the rows, and the rows that cannot be read.
#[derive(Debug, Default, PartialEq)]
pub struct Manifest {
    pub header: Vec<String>,
    pub rows: Vec<Row>,
    pub bad: Vec<BadRow>,
}

/// One record as the tokenizer read it.
struct Record {
    line: u64,
    fields: Vec<String>,
    problem: Option<String>,
}

/// Splits `text` into records (RFC 4180). `Err` for a quote never closed.
fn records(text: &str) -> Result<Vec<Record>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut reader = Reader {
        chars: text.chars().peekable(),
        line: 1,
    };
    let mut out = Vec::new();
    while reader.chars.peek().is_some() {
        let record = reader.record()?;
        let blank =
            record.fields.len() == 1 && record.fields[0].is_empty() && record.problem.is_none();
        if !blank {
            out.push(record);
        }
    }
    Ok(out)
}

/// The tokenizer: the text still to read and the line it is on.
struct Reader<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: u64,
}

impl Reader<'_> {
    /// One record, up to and including its line end.
    fn record(&mut self) -> Result<Record, String> {
        let start = self.line;
        let mut fields = Vec::new();
        let mut problem = None;
        loop {
            self.skip_blanks();
            let field = if self.chars.peek() == Some(&'"') {
                self.chars.next();
                self.quoted(&mut problem)?
            } else {
                self.unquoted(&mut problem).trim().to_string()
            };
            fields.push(field);
            if !self.field_end() {
                break;
            }
        }
        Ok(Record {
            line: start,
            fields,
            problem,
        })
    }

    fn skip_blanks(&mut self) {
        while matches!(self.chars.peek(), Some(' ' | '\t')) {
            self.chars.next();
        }
    }

    /// A quoted field, after its opening quote, up to the comma or line end after it.
    fn quoted(&mut self, problem: &mut Option<String>) -> Result<String, String> {
        let mut field = String::new();
        let opened = self.line;
        loop {
            match self.chars.next() {
                None => {
                    return Err(format!(
                        "line {opened}: a quoted field opened here is never closed (a missing \")"
                    ))
                }
                Some('"') if self.chars.peek() == Some(&'"') => {
                    self.chars.next();
                    field.push('"');
                }
                Some('"') => break,
                Some(c) => {
                    if c == '\n' {
                        self.line += 1;
                    }
                    field.push(c);
                }
            }
        }
        // After the closing quote: space, then a comma or the end of the line.
        self.skip_blanks();
        if !matches!(self.chars.peek(), None | Some(',' | '\n' | '\r')) {
            problem.get_or_insert_with(|| "text after a closing quote".to_string());
            while !matches!(self.chars.peek(), None | Some(',' | '\n' | '\r')) {
                self.chars.next();
            }
        }
        Ok(field)
    }

    /// An unquoted field, up to a comma or a line end (untrimmed).
    fn unquoted(&mut self, problem: &mut Option<String>) -> String {
        let mut field = String::new();
        while let Some(&c) = self.chars.peek() {
            if matches!(c, ',' | '\n' | '\r') {
                break;
            }
            if c == '"' {
                problem.get_or_insert_with(|| {
                    "a quote inside an unquoted field (quote the whole field and double the quotes in it)".to_string()
                });
            }
            field.push(c);
            self.chars.next();
        }
        field
    }

    /// Ends a field at a comma, a line end or the end of the text; `true` when the
    /// record goes on (a comma).
    fn field_end(&mut self) -> bool {
        match self.chars.next() {
            Some(',') => true,
            Some('\r') => {
                if self.chars.peek() == Some(&'\n') {
                    self.chars.next();
                }
                self.line += 1;
                false
            }
            Some(_) => {
                self.line += 1;
                false
            }
            None => false,
        }
    }
}

/// Reads a manifest whose columns must be among `known` (`qrcode` required). `Err` when
/// nothing of it may be sent: no header, a column unknown or named twice, a quote never
/// closed.
pub fn parse(text: &str, known: &[&str]) -> Result<Manifest, String> {
    let mut records = records(text)?.into_iter();
    let Some(head) = records.next() else {
        return Err("the file is empty: a header row naming the columns is needed".into());
    };
    if let Some(p) = head.problem {
        return Err(format!("line {}: the header row: {p}", head.line));
    }
    let header = head.fields;
    for (i, h) in header.iter().enumerate() {
        if !known.contains(&h.as_str()) {
            return Err(format!(
                "line {}: unknown column {:?} in the header row; columns are {}",
                head.line,
                crate::util::text::shown(h, 60),
                known.join(", ")
            ));
        }
        if header[..i].contains(h) {
            return Err(format!(
                "line {}: column {h:?} is named twice in the header row",
                head.line
            ));
        }
    }
    if !header.iter().any(|h| h == "qrcode") {
        return Err(format!(
            "line {}: the header row has no qrcode column (it is required)",
            head.line
        ));
    }
    let mut m = Manifest {
        header,
        ..Manifest::default()
    };
    for r in records {
        if let Some(p) = r.problem {
            m.bad.push(BadRow {
                line: r.line,
                message: p,
            });
        } else if r.fields.len() != m.header.len() {
            m.bad.push(BadRow {
                line: r.line,
                message: format!(
                    "{} field(s), the header names {}",
                    r.fields.len(),
                    m.header.len()
                ),
            });
        } else {
            m.rows.push(Row {
                line: r.line,
                values: m.header.iter().cloned().zip(r.fields).collect(),
            });
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["qrcode", "asset_barcode", "shipment"];

    fn lines(m: &Manifest) -> Vec<u64> {
        m.rows.iter().map(|r| r.line).collect()
    }

    #[test]
    fn quoted_fields_hold_commas_quotes_and_line_breaks() {
        let text = "\u{feff}qrcode,asset_barcode,shipment\r\nTT1, AWB-1 ,\"{\"\"awb\"\": \"\"1,2\"\"}\"\r\n\nTT2,\"multi\nline\",\n";
        let m = parse(text, KNOWN).unwrap();
        assert!(m.bad.is_empty(), "{:?}", m.bad);
        assert_eq!(lines(&m), [2, 4]);
        assert_eq!(m.rows[0].get("asset_barcode"), Some("AWB-1"));
        assert_eq!(m.rows[0].get("shipment"), Some("{\"awb\": \"1,2\"}"));
        assert_eq!(m.rows[1].get("asset_barcode"), Some("multi\nline"));
        assert_eq!(m.rows[1].get("shipment"), None);
    }

    #[test]
    fn a_quote_never_closed_refuses_the_file_naming_its_line() {
        let text = "qrcode,asset_barcode\nTT1,AWB-1\nTT2,\"AWB-2\nTT3,AWB-3\nTT4,AWB-4\n";
        let err = parse(text, KNOWN).unwrap_err();
        assert!(
            err.starts_with("line 3:") && err.contains("never closed"),
            "{err}"
        );
    }

    #[test]
    fn a_column_named_twice_or_unknown_refuses_the_file() {
        let err = parse("qrcode,qrcode\nTT1,TT2\n", KNOWN).unwrap_err();
        assert!(
            err.contains("\"qrcode\" is named twice") && err.starts_with("line 1:"),
            "{err}"
        );
        let err = parse("qrcode,colour\nTT1,red\n", KNOWN).unwrap_err();
        assert!(err.contains("\"colour\""), "{err}");
        let err = parse("asset_barcode\nA\n", KNOWN).unwrap_err();
        assert!(err.contains("no qrcode column"), "{err}");
        assert!(parse("", KNOWN).unwrap_err().contains("empty"));
    }

    #[test]
    fn a_row_that_cannot_be_read_names_its_line_and_the_others_are_kept() {
        let text = "qrcode,asset_barcode\nTT1,AWB-1\nTT2,AW\"B-2\nTT3,\"AWB-3\"x\nTT4\nTT5,AWB-5\n";
        let m = parse(text, KNOWN).unwrap();
        let bad: Vec<u64> = m.bad.iter().map(|b| b.line).collect();
        assert_eq!(bad, [3, 4, 5], "{:?}", m.bad);
        assert!(m.bad[0].message.contains("quote inside an unquoted field"));
        assert!(m.bad[1].message.contains("after a closing quote"));
        assert!(m.bad[2].message.contains("1 field(s), the header names 2"));
        assert_eq!(lines(&m), [2, 6]);
    }
}
