#!/usr/bin/env bash
# The man pages and shell completions the package installs, written from the command
# line's own definition (src/bin/tapegate_docs.rs) into target/generated/, where
# Cargo.toml's deb assets take them from. Built as the package's binary is, without the
# mock service's commands (`demo`, `mock`), so the pages name only what it has. Run
# before every `cargo deb` (scripts/build-deb.sh and the tests that build the package do).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf target/generated
cargo run --quiet --locked --no-default-features --features docs --bin tapegate-docs -- target/generated
