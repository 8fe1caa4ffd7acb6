//! What an answer of the bulk decode endpoint means for the batch that was sent: one
//! function, [`classify`], maps it to an [`Action`]; the planner carries the action out.

use std::collections::HashMap;
use std::time::Duration;

use crate::api::{ApiError, BulkAnswerItem};
use crate::outbox::{Outcome, Reading};

/// What to do with a batch after its answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Settle each row by its index in the batch: delivered or dead letter. A row not
    /// in the list was left out of the answer.
    Settle(Vec<(usize, Outcome)>),
    /// Refused whole (400). Whether the request or a capture in it is at fault, the
    /// answer cannot say (spec 7 gives both the same body); the planner splits the batch
    /// and lets the evidence decide. The text is the service's message, for people.
    Refused(String),
    /// Too large (413): never send this many again.
    Shrink,
    /// Back off and retry. `cause` is the operator-readable cause and `label` the same
    /// as a metric label; `retry_after` the service's own `Retry-After` (a pause of the
    /// whole gateway); `isolate`: the failure may be caused by what the batch holds
    /// ([`ApiError::may_be_caused_by_the_request`]).
    Retry {
        cause: String,
        label: &'static str,
        retry_after: Option<Duration>,
        isolate: bool,
    },
}

/// Maps the answer to a batch sent with `mac_ids` to an action, by kind alone (status,
/// endpoint, transport, structure): no decision reads the words of a message. Items are
/// matched by `mac_id`, not position; a row whose MAC is not in the answer is left out.
pub fn classify(mac_ids: &[String], answer: Result<Vec<BulkAnswerItem>, ApiError>) -> Action {
    match answer {
        Ok(items) => {
            let mut by_mac: HashMap<&str, &BulkAnswerItem> = HashMap::with_capacity(items.len());
            for item in &items {
                by_mac.insert(item.mac_id.as_str(), item);
            }
            let outcomes = mac_ids
                .iter()
                .enumerate()
                .filter_map(|(i, mac)| {
                    let item = by_mac.get(mac.as_str())?;
                    Some((
                        i,
                        match &item.result {
                            Ok(d) => Outcome::Delivered(Reading {
                                qr_code: d.qr_code.clone(),
                                temp: d.temp,
                                bat: d.bat,
                            }),
                            Err(e) => Outcome::DeadLetter(e.clone()),
                        },
                    ))
                })
                .collect();
            Action::Settle(outcomes)
        }
        Err(ApiError::Rejected { message, .. }) => Action::Refused(message),
        Err(ApiError::TooLarge { .. }) => Action::Shrink,
        Err(e) => Action::Retry {
            cause: e.operator_cause(),
            label: e.label(),
            retry_after: e.service_retry_after(),
            isolate: e.may_be_caused_by_the_request(),
        },
    }
}

#[cfg(test)]
mod tests {
    //! One test per row of the answer table in the module doc.
    use super::*;
    use crate::api::{Decoded, Endpoint, TransientKind, Transport, TransportKind};
    use serde_json::json;

    fn macs() -> Vec<String> {
        vec!["C0FFEE000001".into(), "C0FFEE000002".into()]
    }

    fn decoded(qr: &str) -> Result<crate::api::Decoded, String> {
        let raw = json!({"qr_code": qr, "temp": 21.5, "bat": 90});
        Ok(Decoded::from_json(&raw))
    }

    #[test]
    fn a_decoded_item_is_delivered_with_its_reading() {
        let answer = vec![BulkAnswerItem {
            mac_id: "C0FFEE000002".into(),
            result: decoded("QR2"),
        }];
        let Action::Settle(outcomes) = classify(&macs(), Ok(answer)) else {
            panic!("not settled")
        };
        assert_eq!(outcomes.len(), 1);
        let (i, Outcome::Delivered(reading)) = &outcomes[0] else {
            panic!("not delivered: {outcomes:?}")
        };
        assert_eq!(*i, 1, "matched by mac_id, not position");
        assert_eq!(reading.qr_code.as_deref(), Some("QR2"));
        assert_eq!(reading.temp, Some(21.5));
        assert_eq!(reading.bat, Some(90.0));
    }

    #[test]
    fn an_item_with_an_error_is_a_dead_letter_with_the_servers_text() {
        let answer = vec![BulkAnswerItem {
            mac_id: "C0FFEE000001".into(),
            result: Err("device not found".into()),
        }];
        assert_eq!(
            classify(&macs(), Ok(answer)),
            Action::Settle(vec![(0, Outcome::DeadLetter("device not found".into()))])
        );
    }

    #[test]
    fn an_item_missing_from_the_answer_is_left_out() {
        assert_eq!(classify(&macs(), Ok(vec![])), Action::Settle(vec![]));
    }

    #[test]
    fn a_400_is_refused_whatever_its_words_and_the_evidence_decides() {
        for (message, errors) in [
            ("invalid packet", false),
            (
                "Missing required headers: customer_id or authorized_groups",
                false,
            ),
            ("Bad Request", false),
            ("Validation failed", true),
        ] {
            let e = ApiError::Rejected {
                status: 400,
                message: message.into(),
                errors,
            };
            assert_eq!(classify(&macs(), Err(e)), Action::Refused(message.into()));
        }
    }

    #[test]
    fn a_request_refused_by_its_structure_backs_off_and_blames_nothing() {
        let e = ApiError::RequestRefused {
            status: 400,
            message: "Missing required headers".into(),
        };
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "request refused: Missing required headers".into(),
                label: "http_400_request",
                retry_after: None,
                isolate: false
            }
        );
    }

    #[test]
    fn a_401_with_a_fresh_token_backs_off_as_credentials_or_permission() {
        let e = ApiError::Unauthorized {
            message: "Unauthorized access".into(),
        };
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "credentials or permission".into(),
                label: "http_401",
                retry_after: None,
                isolate: false
            }
        );
    }

    #[test]
    fn a_413_shrinks_the_batch() {
        let e = ApiError::TooLarge {
            message: "too many items".into(),
        };
        assert_eq!(classify(&macs(), Err(e)), Action::Shrink);
    }

    #[test]
    fn a_429_backs_off_no_less_than_retry_after() {
        let e = ApiError::status(Endpoint::Service, 429, Some(Duration::from_secs(30)));
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "rate limited".into(),
                label: "http_429",
                retry_after: Some(Duration::from_secs(30)),
                isolate: false
            }
        );
    }

    #[test]
    fn a_5xx_a_timeout_or_a_connection_error_backs_off() {
        let no_answer = |endpoint, kind| ApiError::Transient {
            endpoint,
            kind: TransientKind::NoAnswer(Transport {
                kind,
                detail: String::new(),
            }),
            retry_after: None,
        };
        for (e, cause, label, isolate) in [
            (
                ApiError::status(Endpoint::Service, 503, None),
                "server error 503",
                "http_5xx",
                true,
            ),
            (
                no_answer(Endpoint::Service, TransportKind::Timeout),
                "timeout",
                "timeout",
                true,
            ),
            (
                no_answer(Endpoint::Service, TransportKind::ConnectionRefused),
                "service unreachable: connection refused",
                "unreachable",
                false,
            ),
            (
                ApiError::status(Endpoint::Token, 500, None),
                "token endpoint error 500",
                "http_5xx",
                false,
            ),
        ] {
            assert_eq!(
                classify(&macs(), Err(e)),
                Action::Retry {
                    cause: cause.into(),
                    label,
                    retry_after: None,
                    isolate
                }
            );
        }
    }

    #[test]
    fn a_token_endpoints_retry_after_is_no_pause_of_the_service() {
        let e = ApiError::status(Endpoint::Token, 429, Some(Duration::from_secs(30)));
        let Action::Retry { retry_after, .. } = classify(&macs(), Err(e)) else {
            panic!("retry")
        };
        assert_eq!(retry_after, None);
    }

    #[test]
    fn an_unreadable_answer_backs_off_and_settles_nothing() {
        let e = ApiError::BadAnswer("not JSON".into());
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "unreadable answer".into(),
                label: "bad_answer",
                retry_after: None,
                isolate: true
            }
        );
    }
}
