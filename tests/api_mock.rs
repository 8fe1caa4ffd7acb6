//! The service client against the mock tracking service, over real loopback HTTP: the
//! answers of spec sections 4.3, 4.4, 5 and 7, and what the client makes of them.

mod common;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use tapegate::api::{ApiError, BulkItem, BulkRequest, Outgoing, ServiceClient, TransportKind};
use tapegate::config::ServiceSettings;
use tapegate::record::hex_upper;
use tapegate::source::sim::tape::TapeReading;
use tapegate::util::secret::Secret;
use tapegate_mock::{
    self as mock, Fault, MacFormat, MockConfig, MockEnvironment, MockHandle, Registry, Storm,
    WireRules,
};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The mock's default wire rules, with `mac_id` taken in both forms.
fn both_mac_forms() -> WireRules {
    WireRules {
        mac_formats: vec![MacFormat::Plain, MacFormat::Colon],
        ..WireRules::default()
    }
}

async fn mock() -> MockHandle {
    mock::start(MockConfig::demo()).await.expect("mock starts")
}

fn settings(mock: &MockHandle, timeout: Duration) -> ServiceSettings {
    common::service_settings(mock, "ppe", timeout).expect("ppe is configured")
}

fn client(mock: &MockHandle) -> ServiceClient {
    ServiceClient::new(&settings(mock, TIMEOUT), tapegate::clock::system()).unwrap()
}

fn packet(counter: u16) -> String {
    let p = TapeReading {
        counter,
        temp_centi: 2150,
        battery: 87,
        shock_count: 2,
        serial: 0x00AB_CDEF,
    };
    hex_upper(&p.manufacturer_data())
}

fn item(mac: &str) -> BulkItem {
    BulkItem {
        mac_id: mac.to_string(),
        ble_packet: packet(7),
        product_id: "tape".to_string(),
        scan_time: "1763719200".to_string(),
    }
}

fn items(n: usize) -> Vec<BulkItem> {
    (0..n).map(|i| item(&format!("C0FFEE{i:06X}"))).collect()
}

/// Bulk decode answers registered MACs with readings and unknown ones with an error.
#[tokio::test]
async fn bulk_decode_answers_known_macs_with_readings_unknown_with_an_error() {
    let mock = mock().await;
    // Both mac_id forms, to see each echoed as sent.
    mock.set_wire_rules(both_mac_forms());
    let client = client(&mock);
    let mut bad_packet = item("C0FFEE000003");
    bad_packet.ble_packet = "00112233".into();
    let sent = vec![
        item("C0FFEE000001"),
        item("C0:FF:EE:00:00:02"),
        item("C0DEAD000001"),
        bad_packet,
    ];
    let answer = client.decode_bulk(&sent, "dock-7-1").await.unwrap();
    assert_eq!(answer.len(), 4);

    let by_mac = |m: &str| answer.iter().find(|a| a.mac_id == m).unwrap();
    let d = by_mac("C0FFEE000001").result.as_ref().unwrap();
    assert_eq!(d.qr_code.as_deref(), Some("TTC0FFEE000001"));
    assert_eq!(d.cts, Some(7.0));
    assert_eq!(d.ts, Some(1_763_719_200.0));
    assert_eq!(d.bat, Some(87.0));
    assert_eq!(d.temp, Some(21.5));
    // A bulk item's fields are read as they stream by, not kept whole.
    assert_eq!(d.raw, None);
    let colon = by_mac("C0:FF:EE:00:00:02").result.as_ref().unwrap();
    assert_eq!(colon.qr_code.as_deref(), Some("TTC0FFEE000002"));
    assert_eq!(
        by_mac("C0DEAD000001").result,
        Err("device not found or not associated with the customer".to_string())
    );
    assert_eq!(
        by_mac("C0FFEE000003").result,
        Err("invalid ble_packet".to_string())
    );
    assert_eq!(mock.decoded_items(), 2);

    let received = mock.received();
    assert_eq!(received.len(), 1);
    let r = &received[0];
    assert_eq!(r.path, "/ppe/external/v1/devices/decode");
    assert_eq!(r.correlation_id.as_deref(), Some("dock-7-1"));
    assert_eq!(r.customer_id.as_deref(), Some("demo-customer"));
    assert_eq!(r.authorized_groups.as_deref(), Some("demo-group"));
    assert_eq!(r.status, Some(200));
    assert_eq!(r.items.len(), 4);
    assert_eq!(r.items[1].mac_id, "C0:FF:EE:00:00:02");
    assert_eq!(r.items[0].scan_time, "1763719200");
}

#[tokio::test]
async fn a_base_url_without_trailing_slash_reaches_the_same_endpoint() {
    let mock = mock().await;
    let mut s = settings(&mock, TIMEOUT);
    let no_slash = s
        .endpoint
        .base_url
        .as_str()
        .trim_end_matches('/')
        .to_string();
    s.endpoint.base_url = no_slash.parse().unwrap();
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    assert_eq!(
        client.decode_bulk_url().path(),
        "/ppe/external/v1/devices/decode"
    );
    let answer = client.decode_bulk(&items(1), "c").await.unwrap();
    assert!(answer[0].result.is_ok());
}

#[tokio::test]
async fn many_requests_share_one_cached_token() {
    let mock = mock().await;
    let client = client(&mock);
    for i in 0..5 {
        client
            .decode_bulk(&items(3), &format!("c{i}"))
            .await
            .unwrap();
    }
    assert_eq!(mock.token_grants(), 1);
    assert_eq!(mock.decode_requests(), 5);
}

#[tokio::test]
async fn concurrent_callers_cause_exactly_one_token_grant() {
    let mock = mock().await;
    let client = client(&mock);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client.decode_bulk(&items(2), &format!("c{i}")).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(mock.token_requests(), 1);
    assert_eq!(mock.token_grants(), 1);
}

#[tokio::test]
async fn an_expired_token_is_replaced_by_a_new_grant() {
    let mock = mock().await;
    assert!(mock.set_expires_in("ppe", 1));
    let client = client(&mock);
    client.decode_bulk(&items(1), "c1").await.unwrap();
    // The token's second of life passes: the service says so.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while mock.live_tokens("ppe") > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the token never expired"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    client.decode_bulk(&items(1), "c2").await.unwrap();
    assert_eq!(mock.token_grants(), 2);
    // The client refreshed before use: the service never saw the expired token.
    assert!(mock.received().iter().all(|r| r.status == Some(200)));
}

#[tokio::test]
async fn a_revoked_token_gets_one_new_token_and_one_retry() {
    let mock = mock().await;
    let client = client(&mock);
    client.decode_bulk(&items(1), "c1").await.unwrap();
    mock.revoke_all_tokens();
    let answer = client.decode_bulk(&items(1), "c2").await.unwrap();
    assert!(answer[0].result.is_ok());
    assert_eq!(mock.token_grants(), 2);
    let statuses: Vec<_> = mock.received().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [Some(200), Some(401), Some(200)]);
}

#[tokio::test]
async fn a_token_the_service_refuses_even_fresh_is_unauthorized() {
    // Tokens of environment "b" are not valid in "a" (spec 5.6): every decode is 401.
    let config = MockConfig {
        environments: vec![MockEnvironment::named("a"), MockEnvironment::named("b")],
        ..MockConfig::demo()
    };
    let mock = mock::start(config).await.unwrap();
    let mut s = common::service_settings(&mock, "a", TIMEOUT).unwrap();
    s.endpoint.auth_url = mock.auth_url("b");
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let err = client.decode_bulk(&items(1), "c").await.unwrap_err();
    assert!(matches!(err, ApiError::Unauthorized { .. }), "{err:?}");
    assert_eq!(err.operator_cause(), "credentials or permission");
    assert_eq!(mock.token_grants(), 2, "one new token, not more");
    assert_eq!(mock.decode_requests(), 2, "one retry, not more");
}

#[tokio::test]
async fn a_wrong_password_is_auth_rejected_and_not_asked_again_within_the_backoff() {
    let mock = mock().await;
    let mut s = settings(&mock, TIMEOUT);
    s.endpoint.password = Secret::new("hunter2-wrong");
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let err = client.decode_bulk(&items(1), "c1").await.unwrap_err();
    match &err {
        ApiError::AuthRejected { status, message } => {
            assert_eq!(*status, 401);
            assert!(message.contains("Wrong email or password."), "{message}");
        }
        other => panic!("expected AuthRejected, got {other:?}"),
    }
    assert!(err.operator_cause().starts_with("token refused: "));
    let again = client.decode_bulk(&items(1), "c2").await.unwrap_err();
    assert_eq!(again, err);
    assert_eq!(
        mock.token_requests(),
        1,
        "the token endpoint was asked again"
    );
    assert_eq!(mock.decode_requests(), 0);
    assert!(!format!("{err} {err:?}").contains("hunter2"));
}

#[tokio::test]
async fn a_wrong_audience_is_refused_with_403_and_the_reason() {
    let mock = mock().await;
    let mut s = settings(&mock, TIMEOUT);
    s.endpoint.audience = "https://wrong.example/".into();
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let err = client.fetch_token().await.unwrap_err();
    match err {
        ApiError::AuthRejected { status, message } => {
            assert_eq!(status, 403);
            assert!(message.contains("access_denied"), "{message}");
            assert!(message.contains("https://wrong.example/"), "{message}");
        }
        other => panic!("expected AuthRejected, got {other:?}"),
    }
}

#[tokio::test]
async fn fetch_token_forces_a_fresh_grant_and_returns_its_lifetime() {
    let mock = mock().await;
    let client = client(&mock);
    assert_eq!(
        client.fetch_token().await.unwrap(),
        Duration::from_secs(3600)
    );
    assert_eq!(
        client.fetch_token().await.unwrap(),
        Duration::from_secs(3600)
    );
    assert_eq!(mock.token_grants(), 2);
    client.decode_bulk(&items(1), "c").await.unwrap();
    assert_eq!(mock.token_grants(), 2, "the forced token is cached");
}

#[tokio::test]
async fn more_items_than_the_service_takes_is_too_large() {
    let mock = mock().await;
    mock.set_max_items(2);
    let client = client(&mock);
    let err = client.decode_bulk(&items(3), "c").await.unwrap_err();
    assert!(matches!(err, ApiError::TooLarge { .. }), "{err:?}");
    assert!(client.decode_bulk(&items(2), "c").await.is_ok());
}

#[tokio::test]
async fn the_default_limit_is_250_items() {
    let mock = mock().await;
    let client = client(&mock);
    assert_eq!(
        client.decode_bulk(&items(250), "c").await.unwrap().len(),
        250
    );
    let err = client.decode_bulk(&items(251), "c").await.unwrap_err();
    assert!(matches!(err, ApiError::TooLarge { .. }), "{err:?}");
}

#[tokio::test]
async fn a_duplicate_mac_id_rejects_the_whole_batch() {
    let mock = mock().await;
    let client = client(&mock);
    let sent = [item("C0FFEE000001"), item("C0:FF:EE:00:00:01")];
    match client.decode_bulk(&sent, "c").await.unwrap_err() {
        ApiError::Rejected {
            status,
            message,
            errors,
        } => {
            assert_eq!(status, 400);
            assert!(message.contains("Duplicate mac_id"), "{message}");
            assert!(errors, "a validation failure carries `errors` (spec 7)");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert_eq!(mock.decoded_items(), 0);
}

#[tokio::test]
async fn a_poison_mac_rejects_the_whole_batch_naming_it() {
    let mock = mock().await;
    mock.set_poison(Some("C0:FF:EE:00:00:02"));
    let client = client(&mock);
    match client.decode_bulk(&items(4), "c").await.unwrap_err() {
        ApiError::Rejected {
            status,
            message,
            errors,
        } => {
            assert_eq!(status, 400);
            assert_eq!(message, "Invalid ble_packet for C0FFEE000002");
            assert!(!errors, "`{{message, code}}` only");
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    // Without the poisoned MAC the rest goes through.
    let rest: Vec<_> = items(4)
        .into_iter()
        .filter(|i| i.mac_id != "C0FFEE000002")
        .collect();
    assert_eq!(client.decode_bulk(&rest, "c").await.unwrap().len(), 3);
}

#[tokio::test]
async fn status_503_with_retry_after_seconds_is_transient_with_that_delay() {
    let mock = mock().await;
    mock.push_fault(Fault::Status {
        status: 503,
        retry_after: Some("7".into()),
    });
    let client = client(&mock);
    let err = client.decode_bulk(&items(1), "c").await.unwrap_err();
    assert!(matches!(err, ApiError::Transient { .. }), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)));
    assert_eq!(err.operator_cause(), "server error 503");
    assert!(
        client.decode_bulk(&items(1), "c").await.is_ok(),
        "faults are one-shot"
    );
}

#[tokio::test]
async fn retry_after_as_an_http_date_is_honoured() {
    let mock = mock().await;
    // The date is read against the client's clock: one that reads a given moment.
    let now = SystemTime::UNIX_EPOCH + Duration::from_millis(common::T0_MS as u64);
    let at = now + Duration::from_secs(30);
    mock.push_fault(Fault::Status {
        status: 429,
        retry_after: Some(httpdate::fmt_http_date(at)),
    });
    let clock = std::sync::Arc::new(common::StillClock(common::T0_MS));
    let client = ServiceClient::new(&settings(&mock, TIMEOUT), clock).unwrap();
    let err = client.decode_bulk(&items(1), "c").await.unwrap_err();
    assert_eq!(err.operator_cause(), "rate limited");
    let wait = err.retry_after().unwrap();
    assert!(
        wait <= Duration::from_secs(30) && wait >= Duration::from_secs(27),
        "{wait:?}"
    );
}

#[tokio::test]
async fn a_server_error_without_retry_after_is_transient_without_a_delay() {
    let mock = mock().await;
    mock.push_fault(Fault::Status {
        status: 500,
        retry_after: None,
    });
    let err = client(&mock).decode_bulk(&items(1), "c").await.unwrap_err();
    assert_eq!(err.operator_cause(), "server error 500");
    assert_eq!(err.retry_after(), None);
}

#[tokio::test]
async fn a_connection_closed_without_answer_is_transient() {
    let mock = mock().await;
    mock.push_fault(Fault::Close);
    let client = client(&mock);
    let err = client.decode_bulk(&items(1), "c").await.unwrap_err();
    assert!(matches!(err, ApiError::Transient { .. }), "{err:?}");
    assert_eq!(err.transport_kind(), Some(TransportKind::Closed), "{err}");
    let r = &mock.received()[0];
    assert_eq!((r.status, r.fault.clone()), (None, Some(Fault::Close)));
    assert!(client.decode_bulk(&items(1), "c").await.is_ok());
}

#[tokio::test]
async fn an_answer_slower_than_the_timeout_is_a_transient_timeout() {
    let mock = mock().await;
    let client = ServiceClient::new(
        &settings(&mock, Duration::from_secs(1)),
        tapegate::clock::system(),
    )
    .unwrap();
    client.fetch_token().await.unwrap();
    mock.push_fault(Fault::Delay(Duration::from_millis(2500)));
    let err = client.decode_bulk(&items(1), "c").await.unwrap_err();
    assert_eq!(err.operator_cause(), "timeout", "{err:?}");
    assert_eq!(err.transport_kind(), Some(TransportKind::Timeout));
}

#[tokio::test]
async fn an_unreachable_service_is_transient_and_says_connection_refused() {
    let mock = mock().await;
    let mut s = settings(&mock, TIMEOUT);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    s.endpoint.base_url = format!("http://127.0.0.1:{port}/ppe/").parse().unwrap();
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let err = client.decode_bulk(&items(1), "c").await.unwrap_err();
    assert_eq!(
        err.operator_cause(),
        "service unreachable: connection refused",
        "{err:?}"
    );
    assert_eq!(err.transport_kind(), Some(TransportKind::ConnectionRefused));

    s.endpoint.auth_url = format!("http://127.0.0.1:{port}/ppe/oauth/token")
        .parse()
        .unwrap();
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let err = client.fetch_token().await.unwrap_err();
    assert_eq!(
        err.operator_cause(),
        "token endpoint unreachable: connection refused",
        "{err:?}"
    );
    assert!(
        err.retry_after().is_some(),
        "the token cache says when it asks again"
    );
}

#[tokio::test]
async fn dropped_items_are_missing_from_the_answer() {
    let mock = mock().await;
    mock.push_fault(Fault::DropItems(2));
    let client = client(&mock);
    let sent = items(5);
    let answer = client.decode_bulk(&sent, "c").await.unwrap();
    let got: HashSet<_> = answer.iter().map(|a| a.mac_id.as_str()).collect();
    let want: HashSet<_> = sent[..3].iter().map(|i| i.mac_id.as_str()).collect();
    assert_eq!(got, want);
    assert_eq!(mock.decoded_items(), 3);
}

#[tokio::test]
async fn a_storm_of_server_errors_fails_every_request_until_it_stops() {
    let mock = mock().await;
    mock.set_storm(Some(Storm {
        probability: 1.0,
        seed: 7,
        mix: vec![Fault::Status {
            status: 503,
            retry_after: Some("1".into()),
        }],
    }));
    let client = client(&mock);
    for _ in 0..3 {
        let err = client.decode_bulk(&items(1), "c").await.unwrap_err();
        assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    }
    mock.set_storm(None);
    assert!(client.decode_bulk(&items(1), "c").await.is_ok());
    assert_eq!(mock.stats().faults_applied, 3);
}

#[tokio::test]
async fn a_customer_the_devices_are_not_associated_with_gets_item_errors() {
    let mock = mock().await;
    let mut s = settings(&mock, TIMEOUT);
    s.endpoint.customer_id = "other-customer".into();
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let answer = client.decode_bulk(&items(2), "c").await.unwrap();
    assert!(answer.iter().all(|a| a.result.is_err()));
    let err = client
        .decode_one("C0FFEE000001", "tape", &packet(1), "1763719200", "c")
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn the_registry_decides_which_macs_are_known() {
    let mock = mock().await;
    mock.set_registry(Registry::Only(["C0FFEE000001".to_string()].into()));
    let answer = client(&mock).decode_bulk(&items(2), "c").await.unwrap();
    let known = |m: &str| {
        answer
            .iter()
            .find(|a| a.mac_id == m)
            .unwrap()
            .result
            .is_ok()
    };
    assert!(known("C0FFEE000001"));
    assert!(!known("C0FFEE000000"));
}

#[tokio::test]
async fn single_decode_answers_every_field_and_unregistered_is_not_found() {
    let mock = mock().await;
    // The colon form, to see it travel unescaped in the path.
    mock.set_wire_rules(both_mac_forms());
    let client = client(&mock);
    let d = client
        .decode_one(
            "C0:FF:EE:00:00:09",
            "tape",
            &packet(42),
            "1763719200",
            "one-1",
        )
        .await
        .unwrap();
    assert_eq!(d.qr_code.as_deref(), Some("TTC0FFEE000009"));
    assert_eq!(d.cts, Some(42.0));
    assert_eq!(d.temp, Some(21.5));
    assert_eq!(d.shock_count, Some(2.0));
    assert_eq!(d.over_temp, Some(0.0));
    assert_eq!(d.fw_ver.as_deref(), Some("1.4.2"));
    let r = &mock.received()[0];
    assert_eq!(r.path, "/ppe/external/v1/devices/C0:FF:EE:00:00:09/decode");
    assert_eq!(r.items[0].ble_packet, packet(42));
    assert_eq!(r.correlation_id.as_deref(), Some("one-1"));

    let err = client
        .decode_one("C0DEAD000001", "tape", &packet(1), "1763719200", "one-2")
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::NotFound { .. }), "{err:?}");
    let err = client
        .decode_one("C0FFEE000001", "tape", "0011", "1763719200", "one-3")
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApiError::Rejected { status: 400, .. }),
        "{err:?}"
    );
}

/// Sends a bulk request by hand, to see what the mock answers a client that breaks
/// the rules.
async fn raw_bulk(
    mock: &MockHandle,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, serde_json::Value) {
    let url = mock
        .base_url("ppe")
        .join("external/v1/devices/decode")
        .unwrap();
    let mut req = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

async fn raw_token(mock: &MockHandle) -> String {
    let form = [
        ("grant_type", "password"),
        ("username", "demo"),
        ("password", "demo-password"),
        ("client_id", "tapegate-demo"),
        ("audience", "https://api.example/decode"),
    ];
    let v: serde_json::Value = reqwest::Client::new()
        .post(mock.auth_url("ppe"))
        .form(&form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["token_type"], "Bearer");
    assert_eq!(v["expires_in"], 3600);
    v["access_token"].as_str().unwrap().to_string()
}

const GOOD: [(&str, &str); 2] = [
    ("customer_id", "demo-customer"),
    ("authorized_groups", "demo-group"),
];

#[tokio::test]
async fn the_mock_answers_400_when_customer_id_is_missing() {
    let mock = mock().await;
    let token = raw_token(&mock).await;
    let body = serde_json::to_string(&items(1)).unwrap();
    let (status, v) = raw_bulk(&mock, Some(&token), &[GOOD[1]], &body).await;
    assert_eq!(status, 400);
    assert_eq!(
        v,
        serde_json::json!({"message": "Missing required headers: customer_id or authorized_groups", "code": 400})
    );
    // The singular header name is not read.
    let (status, _) = raw_bulk(
        &mock,
        Some(&token),
        &[GOOD[0], ("authorized_group", "demo-group")],
        &body,
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_mock_answers_401_without_a_valid_token() {
    let mock = mock().await;
    let body = serde_json::to_string(&items(1)).unwrap();
    for token in [None, Some("made-up")] {
        let (status, v) = raw_bulk(&mock, token, &GOOD, &body).await;
        assert_eq!(status, 401);
        assert_eq!(
            v,
            serde_json::json!({"message": "Unauthorized access", "code": 401})
        );
    }
}

#[tokio::test]
async fn the_mock_checks_the_body_as_the_spec_says() {
    let mock = mock().await;
    let token = raw_token(&mock).await;
    // Not JSON: 401 (spec section 7). JSON but not an array: 400.
    assert_eq!(raw_bulk(&mock, Some(&token), &GOOD, "{nope").await.0, 401);
    assert_eq!(raw_bulk(&mock, Some(&token), &GOOD, "{}").await.0, 400);
    // An item without scan_time, or with a number for it: 400 naming the item.
    let (status, v) = raw_bulk(
        &mock,
        Some(&token),
        &GOOD,
        r#"[{"mac_id":"C0FFEE000001","ble_packet":"00","product_id":"tape","scan_time":"1"},
            {"mac_id":"C0FFEE000002","ble_packet":"00","product_id":"tape","scan_time":1}]"#,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(v["message"], "Validation failed", "{v}");
    assert_eq!(v["code"], 400, "{v}");
    assert!(v["errors"][0].as_str().unwrap().contains("item 1"), "{v}");
    assert_eq!(
        raw_bulk(&mock, Some(&token), &GOOD, "[]").await,
        (200, serde_json::json!([]))
    );
}

#[tokio::test]
async fn the_mock_token_endpoint_checks_every_field() {
    let mock = mock().await;
    let good = [
        ("grant_type", "password"),
        ("username", "demo"),
        ("password", "demo-password"),
        ("client_id", "tapegate-demo"),
        ("audience", "https://api.example/decode"),
    ];
    let post = |form: Vec<(&'static str, &'static str)>| {
        let url = mock.auth_url("ppe");
        async move {
            let resp = reqwest::Client::new()
                .post(url)
                .form(&form)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let v: serde_json::Value = resp.json().await.unwrap();
            (status, v["error"].as_str().unwrap_or("").to_string())
        }
    };
    let with = |k: &str, v: &'static str| {
        good.iter()
            .map(|(gk, gv)| if *gk == k { (*gk, v) } else { (*gk, *gv) })
            .collect::<Vec<_>>()
    };
    assert_eq!(post(good.to_vec()).await.0, 200);
    assert_eq!(
        post(with("password", "nope")).await,
        (401, "invalid_grant".into())
    );
    assert_eq!(
        post(with("username", "nope")).await,
        (401, "invalid_grant".into())
    );
    assert_eq!(
        post(with("client_id", "nope")).await,
        (403, "access_denied".into())
    );
    assert_eq!(
        post(with("audience", "nope")).await,
        (403, "access_denied".into())
    );
    assert_eq!(
        post(with("grant_type", "client_credentials")).await,
        (400, "unsupported_grant_type".into())
    );
    assert_eq!(
        post(good[1..].to_vec()).await,
        (400, "invalid_request".into())
    );
    assert_eq!(mock.token_grants(), 1);
    assert_eq!(mock.token_requests(), 7);
}

#[tokio::test]
async fn debug_and_display_never_show_the_password_or_the_token() {
    let mock = mock().await;
    let s = settings(&mock, TIMEOUT);
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    client.decode_bulk(&items(1), "c").await.unwrap();
    let shown = format!("{client:?} {s:?} {:?}", mock);
    assert!(!shown.contains("demo-password"), "{shown}");
    assert!(!shown.contains("mock-ppe-"), "token in {shown}");

    mock.revoke_all_tokens();
    mock.set_registry(Registry::All);
    let mut other = s.clone();
    other.endpoint.auth_url = mock.auth_url("ppe");
    other.endpoint.password = Secret::new("hunter2");
    let refused = ServiceClient::new(&other, tapegate::clock::system()).unwrap();
    let errors = [
        refused.decode_bulk(&items(1), "c").await.unwrap_err(),
        refused.fetch_token().await.unwrap_err(),
    ];
    for e in &errors {
        let text = format!("{e} {e:?} {}", e.operator_cause());
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("demo-password"), "{text}");
    }
}

#[tokio::test]
async fn one_client_is_shared_across_tasks_through_clones() {
    let mock = mock().await;
    let client = client(&mock);
    let clone = client.clone();
    let other = tokio::spawn(async move { clone.decode_bulk(&items(1), "b").await });
    assert!(client.decode_bulk(&items(1), "a").await.is_ok());
    assert!(other.await.unwrap().is_ok());
    assert_eq!(mock.token_grants(), 1);
}

#[tokio::test]
async fn the_mock_stops_when_shut_down() {
    let mock = mock().await;
    let addr = mock.addr();
    mock.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn talking_tls_to_a_plain_http_port_is_a_tls_failure() {
    let mock = mock().await;
    let mut s = settings(&mock, TIMEOUT);
    s.endpoint.auth_url = format!("https://{}/ppe/oauth/token", mock.addr())
        .parse()
        .unwrap();
    let client = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let err = client.fetch_token().await.unwrap_err();
    assert_eq!(err.transport_kind(), Some(TransportKind::Tls), "{err}");
    assert_eq!(
        err.operator_cause(),
        "token endpoint unreachable: TLS failure, the server does not speak TLS on this port"
    );
}

/// The mock reads the simulated tapes' packets with a decoder of its own (a second
/// implementation of the layout in `tapegate::source::sim::tape`, so that a slip in the gateway's
/// encoder cannot be read back by the same code): the two agree on every field, in
/// every encoding, and on which tapes the simulated fleet leaves unregistered.
#[test]
fn the_mock_reads_the_simulated_tapes_packets_with_a_decoder_of_its_own() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let readings = [
        TapeReading {
            counter: 0,
            temp_centi: 0,
            battery: 0,
            shock_count: 0,
            serial: 0,
        },
        TapeReading {
            counter: u16::MAX,
            temp_centi: i16::MIN,
            battery: 100,
            shock_count: u8::MAX,
            serial: 0x00FF_FFFF,
        },
        TapeReading {
            counter: 0x1234,
            temp_centi: -1250,
            battery: 87,
            shock_count: 3,
            serial: 0x00AB_CDEF,
        },
    ];
    for r in readings {
        for text in [
            hex_upper(&r.manufacturer_data()),
            hex_upper(&r.payload()),
            b64.encode(r.manufacturer_data()),
        ] {
            let p = mock::packet::decode_packet(&text)
                .unwrap_or_else(|| panic!("the mock cannot read {text}"));
            assert_eq!(
                (p.counter, p.temp_centi, p.battery, p.shock_count, p.serial),
                (r.counter, r.temp_centi, r.battery, r.shock_count, r.serial),
                "{text}"
            );
            assert_eq!(p.temp_c(), r.temp_c(), "{text}");
        }
    }
    assert_eq!(
        mock::UNREGISTERED_PREFIX,
        hex_upper(&tapegate::source::sim::tape::UNREGISTERED_PREFIX)
    );
}

/// What a decode request carries, recording when it is taken and let go.
struct Carried {
    request: Option<BulkRequest>,
    events: Vec<(&'static str, tokio::time::Instant)>,
}

impl Carried {
    fn new(request: Option<BulkRequest>) -> Carried {
        Carried {
            request,
            events: Vec::new(),
        }
    }

    fn names(&self) -> Vec<&'static str> {
        self.events.iter().map(|(name, _)| *name).collect()
    }
}

impl Outgoing for Carried {
    type Request = BulkRequest;

    async fn take(&mut self) -> Option<BulkRequest> {
        self.events.push(("take", tokio::time::Instant::now()));
        self.request.clone()
    }

    async fn let_go(&mut self) {
        self.events.push(("let go", tokio::time::Instant::now()));
    }
}

/// A request takes what it carries only with a token in hand and no `Retry-After`
/// holding.
///
/// A decode request takes what it carries (for the flusher, its claims on the batch's
/// captures) only once it can go: never while it waits for a token or out the service's
/// `Retry-After`, and again after letting go when a refused token must be replaced.
#[tokio::test]
async fn a_request_takes_its_load_only_with_a_token_and_no_retry_after_holding() {
    let mock = mock().await;
    let request = || Some(BulkRequest::encode(&items(2)).unwrap());

    // No token to be had: nothing is taken, nothing sent.
    let mut s = settings(&mock, TIMEOUT);
    s.endpoint.password = Secret::new("wrong");
    let refused = ServiceClient::new(&s, tapegate::clock::system()).unwrap();
    let mut out = Carried::new(request());
    let err = refused.decode_bulk_when_ready(&mut out, "a").await;
    assert!(matches!(err, Err(ApiError::AuthRejected { .. })), "{err:?}");
    assert!(
        out.events.is_empty(),
        "taken without a token: {:?}",
        out.names()
    );

    // A Retry-After read: the next request takes nothing before it ends.
    let client = client(&mock);
    mock.push_fault(Fault::Status {
        status: 429,
        retry_after: Some("1".into()),
    });
    assert!(client.decode_bulk(&items(1), "b").await.is_err());
    let until = client.decode_paused_until().expect("a pause holds");
    let mut out = Carried::new(request());
    let (sent, answer) = client
        .decode_bulk_when_ready(&mut out, "c")
        .await
        .unwrap()
        .expect("sent");
    assert_eq!((sent.mac_ids().len(), answer.len()), (2, 2));
    assert_eq!(out.names(), ["take"]);
    assert!(out.events[0].1 >= until, "taken inside the pause");

    // A refused token: let go while a new one is fetched, taken again to be sent.
    mock.revoke_all_tokens();
    let mut out = Carried::new(request());
    let answered = client.decode_bulk_when_ready(&mut out, "d").await.unwrap();
    assert!(answered.is_some());
    assert_eq!(out.names(), ["take", "let go", "take"]);

    // Nothing left to carry: nothing is sent.
    let before = mock.decode_requests();
    let mut out = Carried::new(None);
    assert!(client
        .decode_bulk_when_ready(&mut out, "e")
        .await
        .unwrap()
        .is_none());
    assert_eq!(mock.decode_requests(), before);
}
