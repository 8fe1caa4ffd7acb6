//! The package booted where it runs, in virtual machines on real kernels (`tests/vm/`):
//! the Arm packages on Debian's arm64 and armmp kernels ([`arm`]), and the amd64 one
//! through twenty power cuts ([`power`], opt-in: `TAPEGATE_VM_POWER=1`; in CI they
//! would take the run past its 90 minutes, docs/testing.md). The two tests run side by
//! side: each machine is QEMU under TCG on one of the build machines' two cores. They follow `tests/vm_ble.rs` (its x86_64 image) and
//! `tests/systemd_container.rs` (the earlier commit's package), as cargo runs the test
//! binaries in name order; run alone, the first builds the image and the second is
//! skipped loudly (under CI: fails) for want of that package.

mod common;
#[path = "vm/mod.rs"]
mod vm;

#[path = "vm_boots/arm.rs"]
mod arm;
#[path = "vm_boots/power.rs"]
mod power;
