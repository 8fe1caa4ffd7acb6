/*!
The small leaves every floor may use, each a file of its own that imports nothing of the
crate but its neighbours here: text and secrets made safe for a log, an error or a page
(`text`, `secret`); the one retry delay of the flusher and the service's callers
(`backoff`); systemd's notify socket, the watchdog and the stop signals (`systemd`); and
what a test may ask of a debug build, built once in `main` and passed down as a value
(`debug_hooks`).
*/

pub mod backoff;
pub mod debug_hooks;
pub mod secret;
pub mod systemd;
pub mod text;
