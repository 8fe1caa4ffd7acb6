//! `tapegate message (DEVICE_DATA|MANIFEST_DATA|AIRCARGO) FILE`: one integration
//! message (spec 4.5); FILE holds the payload (the `data` object; `-` reads stdin).

use std::io::{Read, Write};
use std::path::Path;

use serde_json::Value;

use super::device::operator;
use super::CmdError;
use crate::api::MessageType;
use crate::config::Config;

pub async fn run(
    config: &Config,
    t: MessageType,
    file: &Path,
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
    let message = operator(config)?.message(t, data).await?;
    writeln!(
        out,
        "{}: {}",
        t.as_str(),
        crate::text::shown(&message, crate::text::SHOWN_MAX_CHARS)
    )?;
    Ok(())
}
