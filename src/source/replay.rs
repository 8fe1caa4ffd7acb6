//! The `replay` source: JSON Lines advertisement records from a file or stdin.
