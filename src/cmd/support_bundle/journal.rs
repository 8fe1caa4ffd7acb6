//! The unit's journal as the bundle carries it: the WARN-and-above records of the last
//! 24 h, read with `journalctl`, bounded. Touches `journalctl` only.

use std::io::Read;
use std::process::{Command, Stdio};

/// The journal read at most (bytes); the newest records are what matters.
const MAX_JOURNAL_BYTES: usize = 16 * 1024 * 1024;
/// The systemd unit whose journal is read.
const UNIT: &str = "tapegate";

/// The unit's WARN-and-above journal records of the last 24 h, as JSON lines; or why
/// there are none.
pub(super) fn journal() -> Result<Vec<u8>, String> {
    let mut child = Command::new("journalctl")
        .args([
            "-u",
            UNIT,
            "-p",
            "warning",
            "--since",
            "-24h",
            "-o",
            "json",
            "--no-pager",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("journalctl cannot be run ({e}): not a systemd machine?"))?;
    let mut records = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = stdout
            .take(MAX_JOURNAL_BYTES as u64)
            .read_to_end(&mut records);
    }
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    let _ = child.kill();
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() && records.is_empty() {
        return Err(format!(
            "journalctl -u {UNIT} failed ({status}): {}",
            crate::util::text::shown(err.trim(), 500)
        ));
    }
    if records.iter().all(u8::is_ascii_whitespace) {
        return Err(format!(
            "journalctl -u {UNIT} -p warning --since -24h found no records{}",
            if err.trim().is_empty() {
                String::new()
            } else {
                format!(" ({})", crate::util::text::shown(err.trim(), 500))
            }
        ));
    }
    Ok(records)
}
