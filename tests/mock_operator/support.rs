//! What the operator-endpoint tests share: the seeded account, a client holding a
//! token (`Op`) and readers of the answers' bodies.

use reqwest::Method;
use serde_json::{json, Value};

#[cfg(debug_assertions)]
use crate::common::day::Day;
use tapegate_mock::{
    self as mock, seed, DeviceStatus, MockConfig, MockHandle, Readings, HISTORY_OPERATION_ID,
};

pub(crate) const LABEL: &str = "external/v1/devices/label";
pub(crate) const STATUS: &str = "external/v1/devices/status";
pub(crate) const CONFIG: &str = "external/v1/devices/config";
pub(crate) const PARCEL: &str = "devices/v1/parcel";
pub(crate) const MESSAGES: &str = "external/messages";
pub(crate) const ACCOUNT: [(&str, &str); 2] = [
    ("customer_id", "demo-customer"),
    ("authorized_groups", "demo-group"),
];

/// A QR code the service does not know.
pub(crate) const UNKNOWN: &str = "TTC0DEAD000001";

/// The mock, a token of its environment "ppe", and a client.
pub(crate) struct Op {
    pub(crate) mock: MockHandle,
    pub(crate) http: reqwest::Client,
    pub(crate) token: String,
}

/// An answer: status and JSON body (`Null` when not JSON).
#[derive(Debug)]
pub(crate) struct Got {
    pub(crate) status: u16,
    pub(crate) body: Value,
    pub(crate) headers: reqwest::header::HeaderMap,
}

pub(crate) async fn op() -> Op {
    let mock = mock::start(MockConfig::demo()).await.expect("mock starts");
    with_token_of(mock, "ppe").await
}

/// An `Op` on a mock whose clock reads `day`, playing `readings`.
#[cfg(debug_assertions)]
pub(crate) async fn op_on(day: &Day, readings: Readings) -> Op {
    let mock = mock::start(MockConfig {
        readings,
        clock: day.mock_clock(),
        ..MockConfig::demo()
    })
    .await
    .expect("mock starts");
    with_token_of(mock, "ppe").await
}

/// An `Op` on `mock` holding a token granted by environment `env`.
pub(crate) async fn with_token_of(mock: MockHandle, env: &str) -> Op {
    let http = reqwest::Client::new();
    let form = [
        ("grant_type", "password"),
        ("username", "demo"),
        ("password", "demo-password"),
        ("client_id", "tapegate-demo"),
        ("audience", "https://api.example/decode"),
    ];
    let v: Value = http
        .post(mock.auth_url(env))
        .form(&form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = v["access_token"].as_str().unwrap().to_string();
    Op { mock, http, token }
}

impl Op {
    pub(crate) async fn send(
        &self,
        method: Method,
        url: reqwest::Url,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Got {
        let mut req = self.http.request(method, url).bearer_auth(&self.token);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.json().await.unwrap_or(Value::Null);
        Got {
            status,
            body,
            headers,
        }
    }

    pub(crate) fn url(&self, path: &str) -> reqwest::Url {
        self.mock.base_url("ppe").join(path).unwrap()
    }

    pub(crate) fn history_url(&self) -> reqwest::Url {
        self.mock
            .historical_base_url("ppe")
            .join(&format!(
                "agent-service/v1/agent/exec/{HISTORY_OPERATION_ID}"
            ))
            .unwrap()
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Got {
        self.send(Method::POST, self.url(path), &[], Some(&body))
            .await
    }

    pub(crate) async fn label(&self, devices: Value, override_: bool) -> Got {
        self.post(LABEL, json!({"override": override_, "devices": devices}))
            .await
    }

    pub(crate) async fn relabel(&self, devices: Value) -> Got {
        self.send(
            Method::PUT,
            self.url(LABEL),
            &[],
            Some(&json!({"devices": devices})),
        )
        .await
    }

    pub(crate) async fn show(&self, qrs: &[&str]) -> Got {
        let mut url = self.url(LABEL);
        for qr in qrs {
            url.query_pairs_mut().append_pair("qrcode", qr);
        }
        self.send(Method::GET, url, &[], None).await
    }

    pub(crate) async fn deactivate(&self, qrs: &[&str]) -> Got {
        let devices: Vec<Value> = qrs.iter().map(|q| json!({"qrcode": q})).collect();
        self.post(STATUS, json!({"action": "DEACTIVATE", "devices": devices}))
            .await
    }

    pub(crate) async fn add(&self, params: &[(&str, &str)], headers: &[(&str, &str)]) -> Got {
        let mut url = self.url(PARCEL);
        url.query_pairs_mut().extend_pairs(params);
        self.send(Method::POST, url, headers, None).await
    }

    pub(crate) async fn locate(&self, asset: &str, sensor: bool, headers: &[(&str, &str)]) -> Got {
        let mut url = self.url("external/locations/");
        url.path_segments_mut().unwrap().pop().push(asset);
        if sensor {
            url.query_pairs_mut().append_pair("event", "sensor");
        }
        self.send(Method::GET, url, headers, None).await
    }

    pub(crate) async fn history(&self, filters: Value) -> Got {
        let body = json!({"context": {
            "customer_id": "demo-customer",
            "authorized_groups": "demo-group",
            "filters": filters,
        }});
        self.send(Method::POST, self.history_url(), &ACCOUNT, Some(&body))
            .await
    }

    pub(crate) async fn message(&self, header_type: &str, body: Value) -> Got {
        let headers = [ACCOUNT[0], ACCOUNT[1], ("message_type", header_type)];
        self.send(Method::POST, self.url(MESSAGES), &headers, Some(&body))
            .await
    }

    pub(crate) fn status_of(&self, qr: &str) -> DeviceStatus {
        self.mock.device(qr).expect("device exists").status
    }

    pub(crate) fn asset_of(&self, qr: &str) -> Option<String> {
        self.mock
            .device(qr)
            .and_then(|d| d.label)
            .map(|l| l.asset_barcode)
    }
}

pub(crate) fn label_item(qr: &str, asset: &str) -> Value {
    json!({"qrcode": qr, "asset_barcode": asset, "application_id": "demo-app"})
}

/// The per-device error codes of a 2.5 body, as (qrcode, error_code).
pub(crate) fn errors(body: &Value) -> Vec<(String, String)> {
    body["errors"]
        .as_array()
        .expect("errors is an array")
        .iter()
        .map(|e| {
            (
                e["qrcode"].as_str().unwrap().to_string(),
                e["error_code"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub(crate) fn counts(body: &Value) -> (u64, u64) {
    (
        body["successful"].as_u64().unwrap(),
        body["failed"].as_u64().unwrap(),
    )
}

/// Seeded QR of a status.
pub(crate) fn seeded(status: DeviceStatus) -> &'static str {
    seed::STATUS_DEVICES
        .iter()
        .find(|(_, s)| *s == status)
        .map(|(q, _)| *q)
        .unwrap()
}

/// Seeded labelled statuses (all but NOT_ACTIVATED).
pub(crate) fn labelled_statuses() -> Vec<(&'static str, DeviceStatus)> {
    seed::STATUS_DEVICES
        .iter()
        .copied()
        .filter(|(_, s)| *s != DeviceStatus::NotActivated)
        .collect()
}

pub(crate) fn parcel<'a>(qr: &'a str, mac: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("qrcode", qr),
        ("tape_id", mac),
        ("appId", "demo-app"),
        ("dstatus", "1"),
        ("tt", "Green"),
        ("tp", "Parcel"),
    ]
}

pub(crate) fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(crate) fn times(body: &Value) -> Vec<jiff::Timestamp> {
    body["data"]["events"]
        .as_array()
        .expect("data.events")
        .iter()
        .map(|e| e["timestamp"].as_str().unwrap().parse().unwrap())
        .collect()
}

pub(crate) fn manifest() -> Value {
    json!({"asset_barcode": "ASSET-0001", "shipped_date": 1763719200,
           "shipment_id": "SHP-1", "container_id": "ULD-1"})
}
