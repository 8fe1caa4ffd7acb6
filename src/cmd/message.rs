//! `tapegate message (DEVICE_DATA|MANIFEST_DATA|AIRCARGO) FILE [--json]`: one
//! integration message (spec 4.5); FILE holds the payload (the `data` object; `-`
//! reads stdin).

use std::io::{Read, Write};
use std::path::Path;

use serde_json::Value;

use super::operator_run::{interrupts, operator_on, Console};
use super::CmdError;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::operator::MessageType;

pub async fn run(
    config: &Config,
    clock: &SharedClock,
    t: MessageType,
    file: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CmdError> {
    let mut text = String::new();
    let read = if file == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(file).map(|t| text = t)
    };
    read.map_err(|e| CmdError::Usage(format!("cannot read {}: {e}", file.display())))?;
    let data: Value = serde_json::from_str(&text)
        .map_err(|e| CmdError::Usage(format!("{} is not JSON: {e}", file.display())))?;
    let console = Console::stderr();
    let operator = operator_on(config, clock, &console)?.with_interrupt(interrupts(&console));
    let sent = match operator.message(t, data).await {
        Ok(s) => s,
        Err(e) => {
            let e = CmdError::from(e);
            if json && !matches!(e, CmdError::Usage(_)) {
                let doc = serde_json::json!({"message_type": t.as_str(), "error": e.to_string()});
                writeln!(out, "{doc:#}")?;
            }
            return Err(e);
        }
    };
    if json {
        let text = serde_json::to_string_pretty(&sent)
            .map_err(|e| CmdError::Output(std::io::Error::other(e)))?;
        writeln!(out, "{text}")?;
    } else {
        writeln!(
            out,
            "{}: HTTP {} {}",
            sent.message_type,
            sent.status,
            crate::util::text::shown(&sent.message, crate::util::text::SHOWN_MAX_CHARS)
        )?;
    }
    Ok(())
}
