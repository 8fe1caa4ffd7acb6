//! The typed errors' own tests: Retry-After, the transport's kinds and the words
//! each error says (moved from error.rs, which stays under 500 lines).

use super::*;

#[test]
fn retry_after_reads_delay_seconds() {
    let now = SystemTime::now();
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
    let now = SystemTime::now();
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
fn decisions_and_labels_follow_the_kind_whatever_the_words() {
    let service = |s, ra| ApiError::status(Endpoint::Service, s, ra);
    let token = |s| ApiError::status(Endpoint::Token, s, None);
    let no_answer = |endpoint, kind| ApiError::Transient {
        endpoint,
        kind: TransientKind::NoAnswer(Transport {
            kind,
            detail: String::new(),
        }),
        retry_after: None,
    };
    for (e, blame, label) in [
        (service(503, None), true, "http_5xx"),
        (service(500, None), true, "http_5xx"),
        (service(408, None), true, "timeout"),
        (service(429, None), false, "http_429"),
        (token(500), false, "http_5xx"),
        (token(429), false, "http_429"),
        (
            no_answer(Endpoint::Service, TransportKind::Timeout),
            true,
            "timeout",
        ),
        (
            no_answer(Endpoint::Service, TransportKind::Closed),
            true,
            "connection_closed",
        ),
        (
            no_answer(Endpoint::Service, TransportKind::ConnectionRefused),
            false,
            "unreachable",
        ),
        (
            no_answer(Endpoint::Token, TransportKind::Timeout),
            false,
            "timeout",
        ),
        (ApiError::BadAnswer("x".into()), true, "bad_answer"),
        (
            ApiError::Transient {
                endpoint: Endpoint::Token,
                kind: TransientKind::Unreadable("not JSON".into()),
                retry_after: None,
            },
            false,
            "bad_answer",
        ),
        (
            ApiError::Unauthorized {
                message: "server error 503".into(),
            },
            false,
            "http_401",
        ),
        (
            ApiError::Rejected {
                status: 400,
                message: "rate limited".into(),
                errors: false,
            },
            false,
            "http_400",
        ),
    ] {
        assert_eq!(e.may_be_caused_by_the_request(), blame, "{e:?}");
        assert_eq!(e.label(), label, "{e:?}");
    }
    let ra = Some(Duration::from_secs(2));
    assert_eq!(service(429, ra).service_retry_after(), ra);
    assert_eq!(service(503, ra).service_retry_after(), ra);
    let held_back = ApiError::status(Endpoint::Token, 503, ra);
    assert_eq!(
        held_back.service_retry_after(),
        None,
        "the token endpoint's own"
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

#[test]
fn tls_failures_say_why_in_an_installers_words() {
    for (detail, want) in [
        ("invalid peer certificate: UnknownIssuer", "unknown issuer"),
        ("invalid peer certificate: certificate expired: verification time 1 (UNIX)", "certificate expired"),
        ("invalid peer certificate: certificate not valid for name \"a\"; certificate is only valid for b", "name mismatch"),
        ("invalid peer certificate: NotValidForName", "name mismatch"),
        ("received corrupt message of type InvalidContentType", "does not speak TLS"),
        ("something else", "handshake failed"),
    ] {
        assert!(tls_reason(detail).starts_with(want) || tls_reason(detail).contains(want), "{detail}");
    }
}

#[test]
fn operator_cause_is_short_and_names_the_problem() {
    assert_eq!(
        ApiError::Unauthorized {
            message: "Unauthorized access".into()
        }
        .operator_cause(),
        "credentials or permission"
    );
    assert_eq!(
        ApiError::status(Endpoint::Service, 503, Some(Duration::from_secs(7))).operator_cause(),
        "server error 503"
    );
    assert_eq!(
        ApiError::status(Endpoint::Token, 502, None).operator_cause(),
        "token endpoint error 502"
    );
    assert_eq!(
        ApiError::status(Endpoint::Token, 429, None).to_string(),
        "token endpoint rate limited"
    );
    let refused = ApiError::Transient {
        endpoint: Endpoint::Service,
        kind: TransientKind::NoAnswer(Transport {
            kind: TransportKind::ConnectionRefused,
            detail: "tcp connect error".into(),
        }),
        retry_after: None,
    };
    assert_eq!(
        refused.operator_cause(),
        "service unreachable: connection refused"
    );
    assert_eq!(
        refused.to_string(),
        "service unreachable: connection refused (connection refused: tcp connect error)"
    );
    assert_eq!(
        ApiError::AuthRejected {
            status: 401,
            message: "invalid_grant: Wrong email or password.".into()
        }
        .operator_cause(),
        "token refused: invalid_grant: Wrong email or password."
    );
}
