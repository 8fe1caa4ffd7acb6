//! What every `device` subcommand prints with: the report row of an add ([`Added`],
//! which `--nearest` prints too), the table's widest cell and its note cell, the rows of
//! a CSV that were not sent, and one JSON document. A leaf: it may touch the operator's
//! outcome types, the manifest's [`BadRow`] and [`crate::util::text`], nothing of its siblings
//! that use it.

use std::io::Write;

use serde::Serialize;

use super::manifest::BadRow;
use crate::cmd::CmdError;
use crate::operator::AddOutcome;

/// What became of one tape of `device add`.
#[derive(Debug, Clone, Serialize)]
pub struct Added {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(flatten)]
    pub outcome: AddOutcome,
    pub requeued_dead_letters: u64,
}

/// Widest cell of a table.
pub(super) const CELL: usize = 60;

/// One JSON document on `out`.
pub(super) fn print_json(out: &mut dyn Write, v: &impl Serialize) -> Result<(), CmdError> {
    let text =
        serde_json::to_string_pretty(v).map_err(|e| CmdError::Output(std::io::Error::other(e)))?;
    writeln!(out, "{text}")?;
    Ok(())
}

pub(super) fn print_bad_rows(bad: &[BadRow], out: &mut dyn Write) -> Result<(), CmdError> {
    for b in bad {
        writeln!(
            out,
            "line {}: {} (not sent)",
            b.line,
            crate::util::text::inert(&b.message)
        )?;
    }
    Ok(())
}

/// The note and the hint of an outcome, in one cell.
pub(super) fn note_cell(note: Option<&str>, hint: Option<&str>) -> String {
    let text = match (note, hint) {
        (Some(n), Some(h)) => format!("{n}; {h}"),
        (Some(t), None) | (None, Some(t)) => t.to_string(),
        (None, None) => String::new(),
    };
    crate::util::text::inert(&text).into_owned()
}
