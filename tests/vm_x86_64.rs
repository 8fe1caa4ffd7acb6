//! The amd64 package on Debian's x86_64 kernel, in virtual machines (`tests/vm/`): the
//! BLE path through a real kernel and BlueZ ([`ble`]), and committed captures through
//! twenty power cuts ([`power`]). The two tests run side by side, each machine QEMU
//! under TCG on one of the build machines' two cores, on the one image (the first to
//! ask builds it). The power cuts follow `tests/systemd_container.rs`, whose upgrade
//! check builds the earlier commit's package they migrate from (cargo runs the test
//! binaries in name order); run alone, they are skipped loudly (under CI: fail) for
//! want of it.

mod common;
#[path = "vm/mod.rs"]
mod vm;

#[path = "vm_x86_64/ble.rs"]
mod ble;
#[path = "vm_x86_64/power.rs"]
mod power;
