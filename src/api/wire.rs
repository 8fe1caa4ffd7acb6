/*!
How a decode request goes on the wire: once it can, and taking what it carries only then.

A decode request waits for two things before it can go: the end of any pause the
service asked for (`pause`) and a token (`auth`; after a failed grant, a token endpoint
that cannot be reached makes it wait again and again). What the request carries is
taken only when both are there ([`Outgoing::take`]), and let go if it must wait after
all ([`Outgoing::let_go`]: a pause began in between, or the service refused the token
and a new one is needed). For the flusher, what a request carries is its claims on the
batch's captures: a batch waiting out a `Retry-After`, or for a token through an outage
of any length, holds none, so the outbox evicts from it as from any other row, and the
request carries only what is left (`flush::send`).

The one retry after a 401 is here too: the refused token is dropped, one new token
fetched, and the request sent once more; a second 401 with a fresh token is
[`ApiError::Unauthorized`] (spec 5.5, 5.7).
*/

use std::future::Future;

use reqwest::{RequestBuilder, StatusCode};

use super::{Answer, ApiError, ServiceClient};
use crate::util::secret::Secret;

/// What a decode request carries, taken as it goes on the wire.
pub trait Outgoing {
    /// What goes on the wire.
    type Request: Send;
    /// The request can go now: take what it carries and build it; `None` when nothing
    /// is left to send (then nothing is). What it took stays taken after it was sent:
    /// the caller, who reads the answer, lets go when it is done with it.
    fn take(&mut self) -> impl Future<Output = Option<Self::Request>> + Send;
    /// The request must wait after all: let go of what [`Outgoing::take`] took.
    fn let_go(&mut self) -> impl Future<Output = ()> + Send;
}

/// A request that carries nothing to take: the same one, whenever it goes.
pub(crate) struct Always<T>(pub(crate) T);

impl<T: Clone + Send + Sync> Outgoing for Always<T> {
    type Request = T;

    async fn take(&mut self) -> Option<T> {
        Some(self.0.clone())
    }

    async fn let_go(&mut self) {}
}

impl ServiceClient {
    /// Sends the decode request `out` carries, built by `build` with the token, once it
    /// can go (see the module doc): each time it goes it passes the decode gate last
    /// thing, and an answer with `Retry-After` closes the gate (`pause`). On 401 drops
    /// that token, gets one new token and sends once more. Returns what was sent with
    /// its answer, or `None` when `out` had nothing left to send.
    pub(crate) async fn send_decode<O, F>(
        &self,
        correlation_id: &str,
        out: &mut O,
        build: F,
    ) -> Result<Option<(O::Request, Answer)>, ApiError>
    where
        O: Outgoing,
        F: Fn(&O::Request, &Secret) -> RequestBuilder,
    {
        let gate = &self.inner.decode_gate;
        let tokens = &self.inner.tokens;
        let mut refused = false;
        loop {
            // Before the token is taken, so that a long pause does not leave it stale.
            gate.wait_open(correlation_id).await;
            let token = tokens.get(|| self.grant()).await?;
            let Some(request) = out.take().await else {
                return Ok(None);
            };
            if !gate.try_pass(correlation_id) {
                // A pause began while it was taken: it waits again, holding nothing.
                out.let_go().await;
                continue;
            }
            let gate = Some((gate, correlation_id));
            let answer = self.execute(build(&request, &token), &token, gate).await?;
            if answer.status != StatusCode::UNAUTHORIZED {
                return Ok(Some((request, answer)));
            }
            if refused {
                return Err(ApiError::Unauthorized {
                    message: answer.message,
                });
            }
            tracing::debug!(
                correlation_id,
                "the service refused the token; retrying once with a new one"
            );
            tokens.invalidate_if(&token);
            refused = true;
            out.let_go().await;
        }
    }
}
