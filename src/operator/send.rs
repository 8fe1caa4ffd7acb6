/*!
The one send of the operator's client: every call (add, label, relabel, show,
deactivate, configure, locate, history, message) goes through [`Base::send`] with
a retry [`Policy`] declared for it, so that what spec 7 asks ("retry 429, 500, 503 and
timeouts with exponential backoff") holds for every call by construction, and what
differs between calls is data. It may touch the transport's one request
(`api::ServiceClient::call`), the token cache and the rate window (`rate.rs`).

What a send does with each outcome of an attempt:

| outcome | may it have been applied? | what happens |
|---|---|---|
| 2xx, or a 4xx other than 401 and 429 | (the answer says) | returned to the caller |
| 401 | no | the token is dropped, a new one fetched, the request sent once more (taking a rate slot like any send); a second 401 is [`ApiError::Unauthorized`] |
| 429 | no | sent again after the backoff and `Retry-After`; a rate-limited call also marks the shared window full |
| no token (token endpoint down, refused connection, DNS, TLS) | no: nothing reached the service | sent again after the backoff (the token cache's own backoff honoured) |
| 5xx, timeout, connection closed | yes | [`AfterLost`]: sent again (idempotent calls), sent again marked as a repeat (add-device's `retry=1`), or returned as [`Sent::Lost`] for the caller to look (label) or report (messages) |

Waits end early on an interrupt ([`Interrupt`]): the first stops before anything new
is sent (the request in flight is finished), the second gives up the request in flight.
*/

use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode};
use url::Url;

use super::base::{Base, OperatorError};
use crate::api::TransportKind;
use crate::api::{Account, Answer, ApiError};
use crate::util::backoff::Backoff;

/// First wait after a failed attempt, doubling with full jitter...
const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// ...up to this (a `Retry-After` may ask for longer).
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What a request whose answer may have been lost (5xx, timeout, connection closed after
/// sending) allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterLost {
    /// Sending twice changes no more than once (reads, relabel, deactivate,
    /// configure): send again.
    Repeat,
    /// Send again with this query parameter added, which tells the service it is a
    /// repeat (add-device's `retry=1`, spec 4.6).
    RepeatMarked(&'static str, &'static str),
    /// Not idempotent and nothing marks a repeat (label, messages): return
    /// [`Sent::Lost`]; the caller looks before sending again, or reports.
    Stop,
}

/// How a call is sent: declared once per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Policy {
    /// Takes a slot of the shared rate window before every send (spec 8).
    pub rate_limited: bool,
    pub after_lost: AfterLost,
    /// Sends at most, the first included (the resend after a 401 not counted).
    pub attempts: u32,
}

impl Policy {
    /// Locate and history: reads outside the rate window.
    pub const READ: Policy = Policy {
        rate_limited: false,
        after_lost: AfterLost::Repeat,
        attempts: 5,
    };
    /// Label lookup, relabel, deactivate, configure: in the rate window, safe to repeat
    /// (relabel and configure set values; deactivate is idempotent, spec 7).
    pub const DEVICES_IDEMPOTENT: Policy = Policy {
        rate_limited: true,
        after_lost: AfterLost::Repeat,
        attempts: 5,
    };
    /// Label: in the rate window, not idempotent (spec 7: "Label is not idempotent").
    pub const LABEL: Policy = Policy {
        rate_limited: true,
        after_lost: AfterLost::Stop,
        attempts: 5,
    };
    /// Add-device: its rate limit is not shown (spec 8), so only a 429 slows it; a
    /// repeat after a lost answer carries `retry=1`.
    pub const ADD: Policy = Policy {
        rate_limited: false,
        after_lost: AfterLost::RepeatMarked("retry", "1"),
        attempts: 5,
    };
    /// Integration messages: no way to look, no way to mark a repeat.
    pub const MESSAGE: Policy = Policy {
        rate_limited: false,
        after_lost: AfterLost::Stop,
        attempts: 5,
    };
}

/// One request of a call, as every attempt sends it.
#[derive(Debug, Clone)]
pub(super) struct Call {
    /// For the operator's messages: "label", "locate 020-12345675".
    pub what: String,
    pub method: Method,
    pub url: Url,
    pub account: Account,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Bytes>,
    pub correlation_id: String,
}

/// How a send ended, short of an error that ends the call ([`OperatorError`]).
pub(super) enum Sent {
    /// An answer for the caller to read. `lost_before`: an earlier attempt may have been
    /// applied without our hearing of it.
    Answered { answer: Answer, lost_before: bool },
    /// [`AfterLost::Stop`]: the request may have been applied; its answer is lost.
    Lost { cause: String },
    /// Every attempt failed (429, 5xx, no answer). `lost_before` as above.
    NoAnswer { cause: String, lost_before: bool },
    /// Interrupted. `in_flight`: a request was on its way and was given up, so it may
    /// have been applied; `lost_before` as above.
    Interrupted { in_flight: bool, lost_before: bool },
}

/// Whether a failed attempt may have reached the service and been applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// No connection was made, or no token was had: nothing was sent.
    NotSent,
    /// Sent, or maybe sent: it may have been applied.
    MaybeApplied,
}

/// What a failed call (not a status) means, by kind: the transport failures that come
/// before a connection exists cannot have sent anything; any other may have.
fn reach(e: &ApiError) -> Option<Reach> {
    match e {
        ApiError::Transient { .. } => Some(match e.transport_kind() {
            Some(
                TransportKind::Dns
                | TransportKind::ConnectionRefused
                | TransportKind::Tls
                | TransportKind::Connect,
            ) => Reach::NotSent,
            _ => Reach::MaybeApplied,
        }),
        // A success answer that could not be read: the request was applied.
        ApiError::BadAnswer(_) => Some(Reach::MaybeApplied),
        _ => None,
    }
}

/// A status that says the service failed while handling the request (spec 7 retries
/// 500 and 503; 502 and 504 come from the proxies in front of it).
fn server_error(status: StatusCode) -> bool {
    status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT
}

/// What a send does after an attempt.
enum Next {
    /// The send is over.
    Done(Sent),
    /// Send again at once, not counted as an attempt (the resend after a 401).
    Resend,
    /// Wait (the backoff, at least `Retry-After`) and try again: why, for the operator.
    Retry(String, Option<Duration>),
}

impl Base {
    /// Sends `call` under `policy` to the end: retried, repeated or returned as the
    /// table in the module doc says. `Err` only for what no retry fixes (a fresh token
    /// refused, a refused grant, settings, the state database).
    pub(super) async fn send(&self, policy: Policy, call: &Call) -> Result<Sent, OperatorError> {
        let mut backoff = Backoff::new(RETRY_INITIAL, RETRY_MAX);
        let mut lost_before = false;
        let mut refreshed = false;
        let mut attempt = 0;
        let stop = &self.interrupt.stop;
        loop {
            if stop.is_cancelled() {
                return Ok(Sent::Interrupted {
                    in_flight: false,
                    lost_before,
                });
            }
            attempt += 1;
            let tried = self.attempt(policy, call, lost_before).await?;
            let (reason, retry_after) = match self
                .next(policy, call, tried, &mut lost_before, &mut refreshed)
                .await?
            {
                Next::Done(sent) => return Ok(sent),
                Next::Resend => {
                    attempt -= 1;
                    continue;
                }
                Next::Retry(reason, retry_after) => (reason, retry_after),
            };
            if attempt >= policy.attempts {
                return Ok(Sent::NoAnswer {
                    cause: format!("{reason} ({attempt} attempts)"),
                    lost_before,
                });
            }
            let delay = backoff.next_delay(fastrand::f64(), retry_after);
            (self.on_retry)(&format!(
                "{}: {reason}; trying again in {:.1} s",
                call.what,
                delay.as_secs_f64()
            ));
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => {}
            }
        }
    }

    /// What follows an attempt that went as `tried`, by the table in the module doc.
    async fn next(
        &self,
        policy: Policy,
        call: &Call,
        tried: Attempt,
        lost_before: &mut bool,
        refreshed: &mut bool,
    ) -> Result<Next, OperatorError> {
        let interrupted = |in_flight| {
            Ok(Next::Done(Sent::Interrupted {
                in_flight,
                lost_before: *lost_before,
            }))
        };
        let (why, retry_after, maybe_applied) = match tried {
            Attempt::Answer(a) if a.status == StatusCode::UNAUTHORIZED => {
                if *refreshed {
                    return Err(ApiError::Unauthorized { message: a.message }.into());
                }
                // Spec 5.5: a new token after a 401, and once more; it takes a
                // slot of the window like any send (it counts, spec 8).
                *refreshed = true;
                tracing::debug!(
                    correlation_id = %call.correlation_id,
                    "the service refused the token; retrying once with a new one"
                );
                return Ok(Next::Resend);
            }
            Attempt::Answer(a) if a.status == StatusCode::TOO_MANY_REQUESTS => {
                if policy.rate_limited {
                    self.gate.refused().await?;
                }
                let why = if policy.rate_limited {
                    "the service's rate window was full (429)".to_string()
                } else {
                    "the service is rate limiting (429)".to_string()
                };
                (why, a.retry_after, false)
            }
            Attempt::Answer(a) if server_error(a.status) => {
                let why = format!("the service answered {}", a.status.as_u16());
                (why, a.retry_after, true)
            }
            Attempt::Answer(answer) => {
                return Ok(Next::Done(Sent::Answered {
                    answer,
                    lost_before: *lost_before,
                }))
            }
            Attempt::Failed(e, Reach::NotSent) => (e.operator_cause(), e.retry_after(), false),
            Attempt::Failed(e, Reach::MaybeApplied) => (e.operator_cause(), e.retry_after(), true),
            Attempt::Interrupted => return interrupted(true),
            Attempt::NotStarted => return interrupted(false),
        };
        if maybe_applied {
            if let Some(lost) = self.lost(policy, lost_before, &why) {
                return Ok(Next::Done(lost));
            }
        }
        Ok(Next::Retry(why, retry_after))
    }

    /// An attempt that may have been applied: `Some` ends the send (the policy does
    /// not repeat it), `None` repeats it.
    fn lost(&self, policy: Policy, lost_before: &mut bool, why: &str) -> Option<Sent> {
        *lost_before = true;
        match policy.after_lost {
            AfterLost::Stop => Some(Sent::Lost {
                cause: why.to_string(),
            }),
            AfterLost::Repeat | AfterLost::RepeatMarked(..) => None,
        }
    }

    /// One attempt: a token (nothing is sent without one), a rate slot when the
    /// policy says, the request.
    async fn attempt(
        &self,
        policy: Policy,
        call: &Call,
        lost_before: bool,
    ) -> Result<Attempt, OperatorError> {
        let token = match self.client.operator_token().await {
            Ok(t) => t,
            Err(e @ (ApiError::Transient { .. } | ApiError::BadAnswer(_))) => {
                return Ok(Attempt::Failed(e, Reach::NotSent))
            }
            Err(e) => return Err(e.into()),
        };
        let ticket = if policy.rate_limited {
            match self.gate.acquire(&self.interrupt.stop).await? {
                Some(t) => Some(t),
                None => return Ok(Attempt::NotStarted),
            }
        } else {
            None
        };
        let mut url = call.url.clone();
        if let (true, AfterLost::RepeatMarked(k, v)) = (lost_before, policy.after_lost) {
            url.query_pairs_mut().append_pair(k, v);
        }
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let sent = self.client.call(
            &token,
            call.method.clone(),
            &url,
            call.account,
            &call.headers,
            call.body.clone(),
            &call.correlation_id,
        );
        let result = tokio::select! {
            r = sent => Some(r),
            () = self.interrupt.abandon.cancelled() => None,
        };
        if let Some(t) = ticket {
            // The request went (or went and was given up): a failure to restamp its
            // slot only leaves the slot stamped when it was taken.
            if let Err(e) = self.gate.finish(t).await {
                tracing::warn!(error = %e, "the rate window's stamp of a request could not be updated");
            }
        }
        let Some(result) = result else {
            return Ok(Attempt::Interrupted);
        };
        match &result {
            Ok(a) => tracing::debug!(
                correlation_id = %call.correlation_id,
                status = a.status.as_u16(),
                "{} answered",
                call.what
            ),
            Err(e) => tracing::debug!(
                correlation_id = %call.correlation_id,
                cause = %e.operator_cause(),
                "{} failed",
                call.what
            ),
        }
        match result {
            Ok(a) => {
                if a.status == StatusCode::UNAUTHORIZED {
                    self.client.token_refused(&token);
                }
                Ok(Attempt::Answer(a))
            }
            Err(e) => match reach(&e) {
                Some(r) => Ok(Attempt::Failed(e, r)),
                None => Err(e.into()),
            },
        }
    }
}

/// How one attempt went.
enum Attempt {
    Answer(Answer),
    Failed(ApiError, Reach),
    /// Given up while in flight (the second interrupt).
    Interrupted,
    /// Stopped while waiting for a rate slot: nothing sent.
    NotStarted,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Endpoint, TransientKind, Transport};

    fn transport(kind: TransportKind) -> ApiError {
        ApiError::Transient {
            endpoint: Endpoint::Service,
            kind: TransientKind::NoAnswer(Transport {
                kind,
                detail: String::new(),
            }),
            retry_after: None,
        }
    }

    #[test]
    fn only_a_failure_before_any_connection_is_known_not_to_have_been_sent() {
        for kind in [
            TransportKind::Dns,
            TransportKind::ConnectionRefused,
            TransportKind::Tls,
            TransportKind::Connect,
        ] {
            assert_eq!(reach(&transport(kind)), Some(Reach::NotSent), "{kind:?}");
        }
        for kind in [
            TransportKind::Timeout,
            TransportKind::Closed,
            TransportKind::Other,
        ] {
            assert_eq!(
                reach(&transport(kind)),
                Some(Reach::MaybeApplied),
                "{kind:?}"
            );
        }
        assert_eq!(
            reach(&ApiError::BadAnswer("too large".into())),
            Some(Reach::MaybeApplied)
        );
        assert_eq!(reach(&ApiError::Setup("x".into())), None);
    }
}
