/*!
Bulk decode (spec 4.4) and single decode (4.3): the request items and how an answer is
read into [`Decoded`] (`decoded.rs`, the leaf both fill).

Why it is built this way: the bulk answer is read leniently. Every field is optional,
numbers may come as strings, and fields we do not know are skipped, so a server that
adds or drops a field does not make us lose readings. It is read as it streams by
(`bulk_answer.rs`), not as a JSON tree per item: draining a backlog reads thousands of
items a second. Items are matched to the request by `mac_id` (separators and case
ignored); an item we cannot match is skipped, and the caller retries whatever is
missing.
*/

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use super::bulk_answer::{Element, Top};
use super::decoded::Decoded;
use super::error::truncate;
use super::wire::{Always, Outgoing};
use super::{join, Answer, ApiError, Endpoint, ServiceClient};

/// One packet to decode, as sent in the bulk request body. The caller has already
/// formatted `mac_id` (`mac_format`) and `scan_time` (epoch seconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BulkItem {
    pub mac_id: String,
    pub ble_packet: String,
    pub product_id: String,
    pub scan_time: String,
}

/// A bulk request encoded once: the body (sent again as it is on a fresh-token retry)
/// and the `mac_id`s it holds, which the answer is matched against. All a batch in
/// flight keeps of its items, so that thirty-two batches waiting on a slow uplink do not
/// each hold their items twice over.
#[derive(Debug, Clone)]
pub struct BulkRequest {
    body: Bytes,
    mac_ids: Vec<String>,
}

impl BulkRequest {
    /// Encodes `items` as the request body, into a buffer of about its size (grown by
    /// doubling, it would hold up to twice the body for as long as the batch is in
    /// flight).
    pub fn encode(items: &[BulkItem]) -> Result<BulkRequest, ApiError> {
        // The four keys, their quotes and separators: 61 bytes an item.
        let size: usize = items
            .iter()
            .map(|i| {
                61 + i.mac_id.len() + i.ble_packet.len() + i.product_id.len() + i.scan_time.len()
            })
            .sum();
        let mut body = Vec::with_capacity(size + 2);
        serde_json::to_writer(&mut body, items)
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        Ok(BulkRequest {
            body: Bytes::from(body),
            mac_ids: items.iter().map(|i| i.mac_id.clone()).collect(),
        })
    }

    /// The items' `mac_id`s, in the order sent.
    pub fn mac_ids(&self) -> &[String] {
        &self.mac_ids
    }
}

/// One item of the bulk answer. `mac_id` is the request's `mac_id` exactly as it was
/// sent (the answer's may differ in case or separators).
#[derive(Debug, Clone, PartialEq)]
pub struct BulkAnswerItem {
    pub mac_id: String,
    /// The decoded packet, or the server's error text for this item.
    pub result: Result<Decoded, String>,
}

/// Upper case without separators, to match answer `mac_id`s to request `mac_id`s.
fn mac_key(mac: &str) -> String {
    mac.chars()
        .filter(|c| !matches!(c, ':' | '-'))
        .map(|c| c.to_ascii_uppercase())
        .collect()
}

impl ServiceClient {
    /// [`ServiceClient::decode_bulk`]: the request encoded whole, then sent.
    pub(super) async fn bulk(
        &self,
        items: &[BulkItem],
        correlation_id: &str,
    ) -> Result<Vec<BulkAnswerItem>, ApiError> {
        let mut out = Always(BulkRequest::encode(items)?);
        let answered = self.bulk_when_ready(&mut out, correlation_id).await?;
        Ok(answered.map(|(_, items)| items).unwrap_or_default())
    }

    /// [`ServiceClient::decode_bulk_when_ready`]: sent through the decode gate, the
    /// answer read and mapped, its items' error texts scrubbed.
    pub(super) async fn bulk_when_ready<O>(
        &self,
        out: &mut O,
        correlation_id: &str,
    ) -> Result<Option<(BulkRequest, Vec<BulkAnswerItem>)>, ApiError>
    where
        O: Outgoing<Request = BulkRequest>,
    {
        let started = Instant::now();
        let url = &self.inner.bulk_url;
        let answer = self
            .send_decode(correlation_id, out, |request, token| {
                self.request(url, token, correlation_id)
                    .body(request.body.clone())
            })
            .await;
        let (request, answer) = match answer {
            Ok(Some(sent)) => sent,
            Ok(None) => return Ok(None),
            Err(err) => {
                tracing::debug!(
                    correlation_id,
                    cause = %err.operator_cause(),
                    "bulk decode failed"
                );
                return Err(err);
            }
        };
        let items = request.mac_ids();
        tracing::debug!(
            correlation_id,
            items = items.len(),
            status = answer.status.as_u16(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "bulk decode answered"
        );
        if !answer.status.is_success() {
            return Err(Self::decode_error(&answer, false));
        }
        let mut answered = parse_bulk_answer(&answer.body, items, correlation_id)?;
        // An item's error text is stored in a dead letter and shown: never a secret.
        for item in &mut answered {
            if let Err(text) = &mut item.result {
                *text = self.scrub(text);
            }
        }
        Ok(Some((request, answered)))
    }

    /// [`ServiceClient::decode_one`]: the values in headers, the answer mapped.
    pub(super) async fn one(
        &self,
        mac_id: &str,
        product_id: &str,
        ble_packet: &str,
        scan_time: &str,
        correlation_id: &str,
    ) -> Result<Decoded, ApiError> {
        let url = join(
            &self.inner.endpoint.base_url,
            &["external", "v1", "devices", mac_id, "decode"],
        )?;
        let sent = self
            .send_decode(correlation_id, &mut Always(()), |(), token| {
                self.request(&url, token, correlation_id)
                    .header("product_id", product_id)
                    .header("ble_packet", ble_packet)
                    .header("scan_time", scan_time)
            })
            .await?;
        let Some(((), answer)) = sent else {
            return Err(ApiError::InvalidRequest("nothing to send".into()));
        };
        tracing::debug!(
            correlation_id,
            status = answer.status.as_u16(),
            "single decode answered"
        );
        if !answer.status.is_success() {
            return Err(Self::decode_error(&answer, true));
        }
        match serde_json::from_slice::<Value>(&answer.body) {
            Ok(v @ Value::Object(_)) => Ok(Decoded::from_json(&v)),
            Ok(_) => Err(ApiError::BadAnswer(
                "single decode answer is not a JSON object".into(),
            )),
            Err(e) => Err(ApiError::BadAnswer(format!(
                "single decode answer is not JSON: {e}"
            ))),
        }
    }

    /// Maps a non-success decode answer to what the caller should do (spec 7), by
    /// status and structure alone. Every 400 is [`ApiError::Rejected`]: the spec gives
    /// an invalid packet and missing headers the same body, so whether the request or
    /// what it holds is at fault is for the evidence of a split to say (the flusher's
    /// planner), never for the words of `message`.
    fn decode_error(answer: &Answer, single: bool) -> ApiError {
        let status = answer.status.as_u16();
        let message = answer.message.clone();
        match status {
            400 => ApiError::Rejected {
                status,
                message,
                errors: answer.carries_errors(),
            },
            404 if single => ApiError::NotFound { message },
            413 => ApiError::TooLarge { message },
            408 | 429 | 500..=599 => {
                ApiError::status(Endpoint::Service, status, answer.retry_after)
            }
            _ => ApiError::UnexpectedStatus { status, message },
        }
    }
}

/// The bulk answer's elements; a bad answer when it is not a JSON array.
fn bulk_elements(body: &[u8]) -> Result<Vec<Element>, ApiError> {
    match super::bulk_answer::read(body) {
        Ok(Top::Array(elements)) => Ok(elements),
        Ok(Top::NotArray) => Err(ApiError::BadAnswer(
            "bulk answer is not a JSON array".into(),
        )),
        Err(e) => Err(ApiError::BadAnswer(format!(
            "bulk answer is not JSON ({e}): {}",
            truncate(&String::from_utf8_lossy(body), 80)
        ))),
    }
}

/// What one answered item says: decoded or refused; `None` when neither (only
/// `mac_id`, or `"error": null`): no answer for its capture, never a delivery with an
/// empty reading.
fn item_result(item: super::bulk_answer::Item) -> Option<Result<Decoded, String>> {
    match item.error {
        None | Some(Value::Null) if !item.qr_present => None,
        None | Some(Value::Null) => Some(Ok(item.decoded)),
        Some(Value::String(s)) if s.is_empty() => Some(Err("(no error text)".to_string())),
        Some(Value::String(s)) => Some(Err(s)),
        Some(other) => Some(Err(truncate(&other.to_string(), 300))),
    }
}

/// Reads the bulk answer: a JSON array of items matched to the request by `mac_id`.
fn parse_bulk_answer(
    body: &[u8],
    sent: &[String],
    correlation_id: &str,
) -> Result<Vec<BulkAnswerItem>, ApiError> {
    let elements = bulk_elements(body)?;
    let by_key: HashMap<String, &str> = sent
        .iter()
        .map(|mac_id| (mac_key(mac_id), mac_id.as_str()))
        .collect();
    let mut seen = HashSet::with_capacity(sent.len());
    let mut out = Vec::with_capacity(elements.len());
    for (index, element) in elements.into_iter().enumerate() {
        let Element(Some(item)) = element else {
            tracing::warn!(
                correlation_id,
                index,
                "bulk answer item without a mac_id skipped; its capture will be retried"
            );
            continue;
        };
        let Some(answered) = item.mac_id.as_deref() else {
            tracing::warn!(
                correlation_id,
                index,
                "bulk answer item without a mac_id skipped; its capture will be retried"
            );
            continue;
        };
        let Some(&mac_id) = by_key.get(&mac_key(answered)) else {
            tracing::warn!(
                correlation_id,
                index,
                mac_id = answered,
                "bulk answer item for a MAC that was not sent skipped"
            );
            continue;
        };
        if !seen.insert(mac_id) {
            tracing::warn!(
                correlation_id,
                index,
                mac_id,
                "bulk answer holds a MAC twice; the first item is used"
            );
            continue;
        }
        let Some(result) = item_result(item) else {
            tracing::debug!(
                correlation_id,
                index,
                mac_id,
                "bulk answer item with neither qr_code nor error; its capture will be retried"
            );
            continue;
        };
        out.push(BulkAnswerItem {
            mac_id: mac_id.to_string(),
            result,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request item's `mac_id`, as the request keeps it (`BulkRequest::mac_ids`).
    fn item(mac: &str) -> String {
        let item = BulkItem {
            mac_id: mac.into(),
            ble_packet: "00".into(),
            product_id: "tape".into(),
            scan_time: "1".into(),
        };
        BulkRequest::encode(&[item]).unwrap().mac_ids[0].clone()
    }

    #[test]
    fn bulk_answer_items_are_matched_to_the_request_by_mac() {
        let sent = [
            item("AABBCCDDEEFF"),
            item("C0:DE:AD:00:00:01"),
            item("112233445566"),
        ];
        let body = br#"[
            {"mac_id":"aa:bb:cc:dd:ee:ff","qr_code":"TTAABBCCDDEEFF","cts":"12","ts":1700000000,
             "bat":80,"temp":21.5,"shock_count":3,"fw_ver":"1.4.2","extra":"kept"},
            {"mac_id":"C0DEAD000001","error":"device not found or not associated with the customer"},
            {"qr_code":"no mac"},
            "not an object",
            {"mac_id":"FFFFFFFFFFFF","qr_code":"not sent"}
        ]"#;
        let got = parse_bulk_answer(body, &sent, "c1").unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].mac_id, "AABBCCDDEEFF");
        let d = got[0].result.as_ref().unwrap();
        assert_eq!(d.qr_code.as_deref(), Some("TTAABBCCDDEEFF"));
        assert_eq!(d.cts, Some(12.0));
        assert_eq!(d.temp, Some(21.5));
        assert_eq!(d.shock_count, Some(3.0));
        assert_eq!(d.over_temp, None);
        assert_eq!(d.fw_ver.as_deref(), Some("1.4.2"));
        // A field the gateway does not know is skipped; the item is not kept whole.
        assert_eq!(d.raw, None);
        assert_eq!(got[1].mac_id, "C0:DE:AD:00:00:01");
        assert_eq!(
            got[1].result,
            Err("device not found or not associated with the customer".to_string())
        );
    }

    #[test]
    fn a_bulk_answer_that_is_not_a_json_array_is_a_bad_answer() {
        for body in [&b"<html>"[..], b"{\"mac_id\":\"x\"}", b""] {
            assert!(matches!(
                parse_bulk_answer(body, &[item("AABBCCDDEEFF")], "c"),
                Err(ApiError::BadAnswer(_))
            ));
        }
    }

    #[test]
    fn an_item_with_only_a_mac_id_or_a_null_error_is_no_answer() {
        let sent = [
            item("AABBCCDDEEFF"),
            item("112233445566"),
            item("C0FFEE000001"),
        ];
        let body = br#"[{"mac_id":"AABBCCDDEEFF"},{"mac_id":"112233445566","error":null},
            {"mac_id":"C0FFEE000001","error":null,"qr_code":"TTC0FFEE000001"}]"#;
        let got = parse_bulk_answer(body, &sent, "c").unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].mac_id, "C0FFEE000001");
        assert!(got[0].result.is_ok());
    }

    #[test]
    fn a_mac_answered_twice_counts_once() {
        let body = br#"[{"mac_id":"AABBCCDDEEFF","qr_code":"Q","bat":1},{"mac_id":"AABBCCDDEEFF","error":"x"}]"#;
        let got = parse_bulk_answer(body, &[item("AABBCCDDEEFF")], "c").unwrap();
        assert_eq!(got.len(), 1);
        assert!(got[0].result.is_ok());
    }
}
