/*!
The daemon's read-only HTTP server (`[http] listen`), on the daemon's own runtime:

| path | answers |
|---|---|
| `/metrics` | the Prometheus (OpenMetrics text) exposition of [`crate::metrics`] |
| `/healthz` | 200 `ok` while every stage makes progress; 503 `<stage>: <reason>` otherwise ([`crate::health::verdict`]) |
| `/` | the status page for an installer at the dock (`page.rs`) |

Everything is read-only and answers `GET` (and `HEAD`) only. Nothing it serves comes
from the service settings, so no password or token can reach an answer; what comes
from the service (its error texts) was scrubbed of both by the client.

A gateway's port may face a whole dock network, and a few slow clients must not blind
the monitor that asks `/healthz`. Connections are capped at [`MAX_CONNECTIONS`]; a
client gets [`HEADER_TIMEOUT`] to send its request; and when every connection is taken,
a new one takes the place of the connection that has waited longest for its request
(a client trickling a header byte a second, an idle keep-alive), which is closed, once
that one has waited [`EVICTABLE_AFTER`]: until then the new one waits for a slot. A
client whose request is complete is answered at once, so slow clients can only evict
each other, never keep a prompt one out, however fast they reconnect. A connection
being answered is never cut.

This file only declares the room: binding, the connection cap and serving; what each
path answers; the status page; and, under them all, the state every answer reads and
how an answer is made. The room reads the outbox, the metrics, health and the tapes heard; it writes
nothing.
*/

mod answer;
mod page;
mod routes;
mod server;

pub use answer::HttpState;
pub use server::{
    bind, exposure_warning, serve, BindError, EVICTABLE_AFTER, HEADER_TIMEOUT, MAX_CONNECTIONS,
};
