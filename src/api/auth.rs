/*!
The token cache (spec section 5: password grant, cache until expiry, new token after a
401).

Why it is shaped like this: a flusher, `tapegate check` and any number of concurrent
requests share one client, and the token endpoint belongs to someone else. So a token is
fetched by one caller at a time (an async mutex held across the fetch; whoever waited
reuses what it produced), and a failed grant is remembered: until its backoff deadline
(1 s doubling to 5 min) every caller gets the remembered error instead of a new request.
A wrong password therefore costs the token endpoint one request per backoff step, not
one per batch.

Time is tokio's `Instant`, so tests can reason about it the same way as the rest of the
daemon.
*/

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::util::backoff::Backoff;
use crate::util::secret::Secret;

use super::error::ApiError;

/// First wait after a failed grant.
pub(crate) const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest wait between two grant attempts.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A token is refreshed this long before it expires at most (10 % earlier for short
/// lifetimes), so a request never leaves with a token about to die in flight.
const REFRESH_MARGIN_MAX: Duration = Duration::from_secs(60);
/// Shortest lifetime taken from an answer: a token endpoint that says 0 (or less) would
/// otherwise be asked again for every request; with this, at most about once a second.
pub(crate) const MIN_LIFETIME: Duration = Duration::from_secs(1);
/// Longest lifetime taken from an answer. `expires_in` is the server's word, and a value
/// such as 1e20 seconds is no `Duration` at all or overflows the clock when added to
/// now; a week costs one grant a week, and a token revoked earlier gets a 401 anyway.
pub(crate) const MAX_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// The lifetime to use for an `expires_in` of `secs` seconds as the server sent it:
/// clamped to [`MIN_LIFETIME`]..=[`MAX_LIFETIME`]; `None` when it is no number (NaN).
pub(crate) fn clamp_lifetime(secs: f64) -> Option<Duration> {
    if secs.is_nan() {
        return None;
    }
    let (lo, hi) = (MIN_LIFETIME.as_secs_f64(), MAX_LIFETIME.as_secs_f64());
    // Clamped as a float first: `Duration::from_secs_f64` panics past u64 seconds.
    Some(Duration::from_secs_f64(secs.clamp(lo, hi)))
}

/// What is kept of a token endpoint's refusal, never its body as it came: the OAuth 2.0
/// `error` code (RFC 6749 5.2: `invalid_grant`, `access_denied`, ...) when it is one,
/// and its `error_description` (or `message`) scrubbed of the password in every
/// encoding, bounded, and left out altogether when it quotes the request (names a form
/// field as the request spelt it). A token endpoint that echoes the request it refuses
/// (a debug page, a proxy's error) would otherwise carry the password into the log,
/// `last_error`, `status`, `check` and the page. What stays tells a wrong password
/// (401 `invalid_grant: Wrong email or password.`) from a wrong audience (403
/// `access_denied: Service not found: https://...`).
pub(crate) fn refusal(body: &[u8], password: &str) -> String {
    let Ok(serde_json::Value::Object(v)) = serde_json::from_slice(body) else {
        return "no error code given".into();
    };
    let text = |k: &str| v.get(k).and_then(|t| t.as_str());
    let code = text("error").filter(|c| {
        (1..=64).contains(&c.len())
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
            // A server that puts the password where the code goes gets no code.
            && crate::util::secret::scrub(c, &[password]) == *c
            && !c.contains(password)
    });
    let description = text("error_description")
        .or_else(|| text("message"))
        .map(|d| crate::util::secret::scrub(d, &[password]))
        .filter(|d| !quotes_the_request(d))
        .map(|d| crate::util::text::bounded(&d, 200));
    match (code, description) {
        (Some(c), Some(d)) => format!("{c}: {d}"),
        (Some(c), None) => c.to_string(),
        (None, Some(d)) => d,
        (None, None) => "no error code given".into(),
    }
}

/// Whether `text` names a field of the password grant as the request spelt it (`password=`,
/// `"password":`, `grant_type`): an echo of the request, whatever else it holds.
fn quotes_the_request(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    [
        "grant_type",
        "password=",
        "password%3d",
        "\"password\"",
        "password:",
        "client_id=",
    ]
    .iter()
    .any(|f| t.contains(f))
}

/// What the token endpoint granted.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub token: Secret,
    pub expires_in: Duration,
}

pub(crate) struct TokenCache {
    state: Mutex<State>,
    /// Held across a fetch: one grant request at a time.
    refresh: tokio::sync::Mutex<()>,
}

struct State {
    token: Option<Cached>,
    failure: Option<Failure>,
    /// Grows with each failed grant in a row; reset by a granted token.
    backoff: Backoff,
}

struct Cached {
    token: Secret,
    refresh_at: Instant,
}

struct Failure {
    error: ApiError,
    retry_at: Instant,
}

/// How long a token with lifetime `expires_in` is used before a new one is fetched.
fn usable_for(expires_in: Duration) -> Duration {
    expires_in.saturating_sub(REFRESH_MARGIN_MAX.min(expires_in / 10))
}

/// The remembered error, with the transient kind's `retry_after` set to what is left
/// of the backoff (the flusher then waits at least that long).
fn remembered(error: &ApiError, left: Duration) -> ApiError {
    match error {
        ApiError::Transient {
            endpoint,
            kind,
            retry_after,
        } => ApiError::Transient {
            endpoint: *endpoint,
            kind: kind.clone(),
            retry_after: Some(retry_after.map_or(left, |r| r.max(left))),
        },
        other => other.clone(),
    }
}

impl TokenCache {
    pub(crate) fn new() -> Self {
        Self::with_backoff(BACKOFF_INITIAL, BACKOFF_MAX)
    }

    pub(crate) fn with_backoff(initial: Duration, max: Duration) -> Self {
        TokenCache {
            state: Mutex::new(State {
                token: None,
                failure: None,
                backoff: Backoff::new(initial, max),
            }),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    /// No lock here is held across an await, so a poisoned state is still consistent.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached token, or the remembered failure while its backoff runs, or `None`
    /// when a grant is needed.
    fn cached(&self) -> Option<Result<Secret, ApiError>> {
        let now = Instant::now();
        let st = self.lock();
        if let Some(c) = st.token.as_ref().filter(|c| now < c.refresh_at) {
            return Some(Ok(c.token.clone()));
        }
        if let Some(f) = st.failure.as_ref().filter(|f| now < f.retry_at) {
            return Some(Err(remembered(&f.error, f.retry_at - now)));
        }
        None
    }

    /// A usable token: the cached one, or one from `fetch` (called by one caller at a
    /// time, and not before a failed grant's backoff deadline).
    pub(crate) async fn get<F, Fut>(&self, fetch: F) -> Result<Secret, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Grant, ApiError>>,
    {
        if let Some(r) = self.cached() {
            return r;
        }
        let _one_at_a_time = self.refresh.lock().await;
        // Whoever held the lock before may have just fetched (or failed) for us.
        if let Some(r) = self.cached() {
            return r;
        }
        self.run(fetch).await.map(|g| g.token)
    }

    /// A fresh grant now, ignoring the cached token and the backoff (for `tapegate
    /// check`, which an operator runs once by hand). The result is cached as usual.
    pub(crate) async fn force<F, Fut>(&self, fetch: F) -> Result<Grant, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Grant, ApiError>>,
    {
        let _one_at_a_time = self.refresh.lock().await;
        self.run(fetch).await
    }

    async fn run<F, Fut>(&self, fetch: F) -> Result<Grant, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Grant, ApiError>>,
    {
        let result = fetch().await;
        let now = Instant::now();
        let mut st = self.lock();
        match result {
            Ok(grant) => {
                // Lifetimes are clamped where they are read; `checked_add` keeps a
                // grant made some other way from overflowing the clock all the same.
                let usable = usable_for(grant.expires_in.min(MAX_LIFETIME));
                st.token = Some(Cached {
                    token: grant.token.clone(),
                    refresh_at: now.checked_add(usable).unwrap_or(now),
                });
                st.failure = None;
                st.backoff.reset();
                Ok(grant)
            }
            Err(error) => {
                // No jitter: one caller at a time asks, so there is no herd to spread.
                let delay = st.backoff.next_delay(1.0, error.retry_after());
                tracing::warn!(
                    retry_in_ms = delay.as_millis() as u64,
                    cause = %error.operator_cause(),
                    %error,
                    "token grant failed; not asking again before the backoff ends"
                );
                let out = remembered(&error, delay);
                st.token = None;
                st.failure = Some(Failure {
                    error,
                    retry_at: now + delay,
                });
                Err(out)
            }
        }
    }

    /// The cached token, if any (for scrubbing answer text of it).
    pub(crate) fn current(&self) -> Option<Secret> {
        self.lock().token.as_ref().map(|c| c.token.clone())
    }

    /// Drops the cached token (the next request fetches a new one).
    pub(crate) fn invalidate(&self) {
        self.lock().token = None;
    }

    /// Drops the cached token if it is still `used` (the one the service just refused).
    /// When concurrent requests all get a 401 for the same token, the first drops it and
    /// the others find the replacement, so the service sees one new grant, not many.
    pub(crate) fn invalidate_if(&self, used: &Secret) {
        let mut st = self.lock();
        if st.token.as_ref().is_some_and(|c| &c.token == used) {
            st.token = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn grant(token: &str, secs: u64) -> Grant {
        Grant {
            token: Secret::new(token),
            expires_in: Duration::from_secs(secs),
        }
    }

    fn refused() -> ApiError {
        ApiError::AuthRejected {
            status: 401,
            message: "invalid_grant".into(),
        }
    }

    /// Of a refused grant only a scrubbed reason that does not quote the request is kept.
    #[test]
    fn a_refused_grant_keeps_only_a_scrubbed_reason() {
        let pw = "Sup3rSecretPw!";
        let echoed = br#"{"error":"invalid_grant","error_description":"bad credentials: grant_type=password&username=demo&password=Sup3rSecretPw%21","message":"password=Sup3rSecretPw%21"}"#;
        assert_eq!(refusal(echoed, pw), "invalid_grant");
        let json_echo = br#"{"error":"invalid_grant","error_description":"refused {\"password\": \"Sup3rSecretPw!\"}"}"#;
        assert_eq!(refusal(json_echo, pw), "invalid_grant");
        assert_eq!(
            refusal(
                br#"{"error":"invalid_grant","error_description":"Wrong email or password."}"#,
                pw
            ),
            "invalid_grant: Wrong email or password."
        );
        assert_eq!(
            refusal(br#"{"error":"access_denied","error_description":"Service not found: https://wrong.example/"}"#, pw),
            "access_denied: Service not found: https://wrong.example/"
        );
        // Quoted without a field name: scrubbed.
        assert_eq!(
            refusal(
                br#"{"error":"invalid_grant","error_description":"no user for Sup3rSecretPw%21"}"#,
                pw
            ),
            "invalid_grant: no user for <redacted>"
        );
        for body in [
            &b"grant_type=password&password=Sup3rSecretPw%21"[..],
            br#"{"error":"password=Sup3rSecretPw%21"}"#,
            br#"{"error":"Sup3rSecretPw"}"#,
            b"",
        ] {
            assert_eq!(refusal(body, "Sup3rSecretPw"), "no error code given");
        }
    }

    #[test]
    fn a_token_is_used_until_shortly_before_it_expires() {
        assert_eq!(
            usable_for(Duration::from_secs(3600)),
            Duration::from_secs(3540)
        );
        assert_eq!(
            usable_for(Duration::from_secs(100)),
            Duration::from_secs(90)
        );
        assert_eq!(
            usable_for(Duration::from_secs(1)),
            Duration::from_millis(900)
        );
        assert_eq!(usable_for(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_lifetime_from_the_server_is_clamped_to_a_sane_range() {
        assert_eq!(clamp_lifetime(3600.0), Some(Duration::from_secs(3600)));
        for huge in [1e19, 1e20, 1e300, f64::INFINITY, u64::MAX as f64] {
            assert_eq!(clamp_lifetime(huge), Some(MAX_LIFETIME), "{huge}");
        }
        for tiny in [0.0, -1.0, -1e20, f64::NEG_INFINITY, 0.5] {
            assert_eq!(clamp_lifetime(tiny), Some(MIN_LIFETIME), "{tiny}");
        }
        assert_eq!(clamp_lifetime(f64::NAN), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_with_a_huge_lifetime_is_cached_without_overflowing_the_clock() {
        let cache = TokenCache::new();
        let huge = Grant {
            token: Secret::new("t1"),
            expires_in: Duration::MAX,
        };
        let t = cache.get(|| async { Ok(huge) }).await.unwrap();
        assert_eq!(t.expose(), "t1");
        assert_eq!(cache.get(|| async { Err(refused()) }).await.unwrap(), t);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_one_grant() {
        let cache = Arc::new(TokenCache::new());
        let fetches = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (cache, fetches) = (cache.clone(), fetches.clone());
            tasks.push(tokio::spawn(async move {
                cache
                    .get(|| async {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(grant("t1", 3600))
                    })
                    .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap().expose(), "t1");
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_grant_is_remembered_until_its_backoff_ends_and_the_backoff_doubles() {
        let cache = TokenCache::with_backoff(Duration::from_millis(100), Duration::from_secs(1));
        let fetches = AtomicUsize::new(0);
        let fail = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            Err(refused())
        };
        assert_eq!(cache.get(fail).await.unwrap_err(), refused());
        assert_eq!(cache.get(fail).await.unwrap_err(), refused());
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            1,
            "asked again inside the backoff"
        );

        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(cache.get(fail).await.is_err());
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        // The second failure waits 200 ms: still held back after 120 ms.
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(cache.get(fail).await.is_err());
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ok = cache.get(|| async { Ok(grant("t2", 3600)) }).await.unwrap();
        assert_eq!(ok.expose(), "t2");
    }

    #[tokio::test(start_paused = true)]
    async fn a_remembered_transient_failure_says_how_long_is_left() {
        let cache = TokenCache::with_backoff(Duration::from_secs(4), Duration::from_secs(60));
        let unreachable =
            || async { Err(ApiError::status(crate::api::Endpoint::Token, 503, None)) };
        let first = cache.get(unreachable).await.unwrap_err();
        assert_eq!(first.retry_after(), Some(Duration::from_secs(4)));
        let second = cache.get(unreachable).await.unwrap_err();
        let left = second.retry_after().unwrap();
        assert!(
            left <= Duration::from_secs(4) && left > Duration::from_secs(3),
            "{left:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn force_ignores_the_backoff() {
        let cache = TokenCache::new();
        assert!(cache.get(|| async { Err(refused()) }).await.is_err());
        let g = cache.force(|| async { Ok(grant("t3", 60)) }).await.unwrap();
        assert_eq!(g.token.expose(), "t3");
        let again = cache.get(|| async { Err(refused()) }).await.unwrap();
        assert_eq!(again.expose(), "t3", "the forced grant is cached");
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_refused_token_is_dropped() {
        let cache = TokenCache::new();
        let t1 = cache.get(|| async { Ok(grant("t1", 3600)) }).await.unwrap();
        cache.invalidate_if(&Secret::new("other"));
        assert_eq!(cache.get(|| async { Err(refused()) }).await.unwrap(), t1);
        cache.invalidate_if(&t1);
        let t2 = cache.get(|| async { Ok(grant("t2", 3600)) }).await.unwrap();
        assert_eq!(t2.expose(), "t2");
        cache.invalidate();
        let t3 = cache.get(|| async { Ok(grant("t3", 3600)) }).await.unwrap();
        assert_eq!(t3.expose(), "t3");
    }
}
