//! `tapegate side-channel`: the unit's privileged start step, which opens the kernel's
//! Bluetooth management socket and hands it to the daemon through systemd's file
//! descriptor store. Touches the BLE source's socket opener only.

use std::io::Write;

use crate::source::ble::mgmt::socket::{hand_to_systemd, Handed};

/// Hands the socket over and says what happened (never a failure: without the socket,
/// the daemon reads adverts over D-Bus).
pub fn run(out: &mut dyn Write) -> std::io::Result<()> {
    let said = match hand_to_systemd() {
        Ok(Handed::Stored) => {
            "the kernel's Bluetooth management socket is open for tapegate (the side channel)"
                .to_string()
        }
        Ok(Handed::NoManager) => {
            "not under systemd: no file descriptor store to hand the management socket to"
                .to_string()
        }
        Err(e) => {
            format!("no Bluetooth management socket here ({e}): tapegate reads adverts over D-Bus")
        }
    };
    writeln!(out, "{said}")
}
