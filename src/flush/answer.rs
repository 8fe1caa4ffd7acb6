//! What an answer of the bulk decode endpoint means for the batch that was sent: one
//! function, [`classify`], maps it to an [`Action`]; the planner carries the action out.

use std::collections::HashMap;
use std::time::Duration;

use crate::api::{ApiError, BulkAnswerItem, TransportKind};
use crate::outbox::{Outcome, Reading};

/// What to do with a batch after its answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Settle each row by its index in the batch: delivered or dead letter. A row not
    /// in the list was left out of the answer.
    Settle(Vec<(usize, Outcome)>),
    /// Refused whole because of what it holds (400): split it (a single item becomes a
    /// dead letter with this message).
    Split(String),
    /// The request itself was refused (400 for missing headers, a validation failure
    /// not about items): not the captures' fault. Back off and report; keep them.
    Refused(String),
    /// Too large (413): never send this many again.
    Shrink,
    /// Back off and retry; the text is the operator-readable cause. `isolate`: the
    /// failure may be caused by what the batch holds (see [`may_be_the_batchs_fault`]).
    Retry {
        cause: String,
        retry_after: Option<Duration>,
        isolate: bool,
    },
}

/// Maps the answer to a batch sent with `mac_ids` to an action. Items are matched by
/// `mac_id`, not position; a row whose MAC is not in the answer is left out.
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
                                raw: d.raw.to_string(),
                            }),
                            Err(e) => Outcome::DeadLetter(e.clone()),
                        },
                    ))
                })
                .collect();
            Action::Settle(outcomes)
        }
        Err(ApiError::Rejected { message, .. }) => Action::Split(message),
        Err(ApiError::RequestRefused { message, .. }) => Action::Refused(message),
        Err(ApiError::TooLarge { .. }) => Action::Shrink,
        Err(e) => Action::Retry {
            cause: e.operator_cause(),
            retry_after: e.retry_after(),
            isolate: may_be_the_batchs_fault(&e),
        },
    }
}

/// Whether a failure may be caused by what the batch holds (the service choking on a
/// capture): a 5xx, a timeout or a closed connection of the decode request itself, or
/// an answer that cannot be read. Never a rate limit, a refused token, the token
/// endpoint, or a connection that never opened: retrying those alone would only blame
/// a capture for the service's state.
pub fn may_be_the_batchs_fault(e: &ApiError) -> bool {
    match e {
        ApiError::BadAnswer(_) => true,
        ApiError::Transient {
            cause, transport, ..
        } => {
            !cause.starts_with("token endpoint")
                && match transport {
                    Some(t) => matches!(t.kind, TransportKind::Timeout | TransportKind::Closed),
                    None => cause.starts_with("server error") || cause == "timeout",
                }
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    //! One test per row of the answer table in the module doc.
    use super::*;
    use crate::api::Decoded;
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
    fn a_400_for_what_the_batch_holds_splits_it() {
        let e = ApiError::Rejected {
            status: 400,
            message: "invalid packet".into(),
        };
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Split("invalid packet".into())
        );
    }

    #[test]
    fn a_400_refusing_the_request_itself_is_not_the_captures_fault() {
        let e = ApiError::RequestRefused {
            status: 400,
            message: "Missing required headers".into(),
        };
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Refused("Missing required headers".into())
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
        let e = ApiError::transient("rate limited", Some(Duration::from_secs(30)));
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "rate limited".into(),
                retry_after: Some(Duration::from_secs(30)),
                isolate: false
            }
        );
    }

    #[test]
    fn a_5xx_a_timeout_or_a_connection_error_backs_off() {
        for (cause, isolate) in [
            ("server error 503", true),
            ("timeout", true),
            ("token endpoint error 500", false),
        ] {
            let e = ApiError::transient(cause, None);
            assert_eq!(
                classify(&macs(), Err(e)),
                Action::Retry {
                    cause: cause.into(),
                    retry_after: None,
                    isolate
                }
            );
        }
    }

    #[test]
    fn an_unreadable_answer_backs_off_and_settles_nothing() {
        let e = ApiError::BadAnswer("not JSON".into());
        assert_eq!(
            classify(&macs(), Err(e)),
            Action::Retry {
                cause: "unreadable answer".into(),
                retry_after: None,
                isolate: true
            }
        );
    }
}
