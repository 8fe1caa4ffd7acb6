//! Reading an error answer's body and headers: the operator-readable message (bounded),
//! whether it carries the spec's `errors` array, and `Retry-After`. A leaf: it reads
//! bytes and text, nothing of the client.

use std::time::{Duration, SystemTime};

/// Longest server message kept in an error (the rest is cut, with an ellipsis).
pub(super) const MESSAGE_MAX_CHARS: usize = crate::util::text::SHOWN_MAX_CHARS;

pub(crate) use crate::util::text::bounded as truncate;

/// The operator-readable message of an error answer: `message` (and `errors`) of the
/// spec's error body, `error`/`error_description` of an OAuth answer, or else the body
/// text, truncated.
pub(crate) fn answer_message(body: &[u8]) -> String {
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(body) {
        let text = |k: &str| map.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let msg = match (text("error"), text("error_description"), text("message")) {
            (Some(e), Some(d), _) => Some(format!("{e}: {d}")),
            (_, Some(d), _) => Some(d),
            (_, _, Some(m)) => Some(m),
            (Some(e), None, None) => Some(e),
            _ => None,
        };
        if let Some(mut msg) = msg {
            if let Some(errors) = map.get("errors").filter(|e| !e.is_null()) {
                msg.push_str(&format!(" {errors}"));
            }
            return truncate(&msg, MESSAGE_MAX_CHARS);
        }
    }
    let text = String::from_utf8_lossy(body);
    if text.trim().is_empty() {
        "(empty body)".to_string()
    } else {
        truncate(&text, MESSAGE_MAX_CHARS)
    }
}

/// Whether an error answer's body carries the spec's `errors` array (a validation
/// failure, spec 2.6 and 7): structure, read once, so that no caller reads it from the
/// words of `message`.
pub(crate) fn carries_errors(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("errors").map(serde_json::Value::is_array))
        .unwrap_or(false)
}

/// Parses a `Retry-After` value: delay-seconds or an HTTP date (relative to `now`; a
/// past date is zero). Anything else is `None`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_delay_seconds() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
    }

    #[test]
    fn retry_after_reads_an_http_date_relative_to_now() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn retry_after_in_the_past_is_zero() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn retry_after_garbage_is_none() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        for v in ["", "soon", "-5", "1.5", "Sun, 32 Nov 1994 08:49:37 GMT"] {
            assert_eq!(parse_retry_after(v, now), None, "{v:?}");
        }
    }

    #[test]
    fn answer_message_prefers_the_error_body_fields() {
        assert_eq!(
            answer_message(br#"{"message":"Invalid ble_packet for X","code":400}"#),
            "Invalid ble_packet for X"
        );
        assert_eq!(
            answer_message(
                br#"{"error":"invalid_grant","error_description":"Wrong email or password."}"#
            ),
            "invalid_grant: Wrong email or password."
        );
        assert_eq!(
            answer_message(br#"{"message":"Validation failed","code":400,"errors":["a"]}"#),
            r#"Validation failed ["a"]"#
        );
        assert_eq!(
            answer_message(b"<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        assert_eq!(answer_message(b""), "(empty body)");
        assert_eq!(
            answer_message("x".repeat(1000).as_bytes()).chars().count(),
            301
        );
    }

    #[test]
    fn an_errors_array_is_read_from_the_structure() {
        assert!(carries_errors(
            br#"{"message":"Bad","code":400,"errors":["item 1"]}"#
        ));
        assert!(carries_errors(br#"{"errors":[]}"#));
        assert!(!carries_errors(
            br#"{"message":"Validation failed [\"a\"]","code":400}"#
        ));
        assert!(!carries_errors(
            br#"{"message":"x","errors":"not an array"}"#
        ));
        assert!(!carries_errors(b"<html>errors</html>"));
    }
}
