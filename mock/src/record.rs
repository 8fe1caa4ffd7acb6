/*!
What the mock received and counted: each decode request ([`Received`]) and operator
request ([`OperatorReceived`]) with what it did with it, and the counters
([`MockStats`]), for tests to read through the handle. Plain data; it touches only the
fault type (a record says which fault it got).
*/

use std::time::SystemTime;

use super::fault::Fault;

/// Which decode endpoint a request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKind {
    Bulk,
    Single,
}

/// One item of a received decode request, as sent (non-string values as JSON text,
/// missing fields empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedItem {
    pub mac_id: String,
    pub ble_packet: String,
    pub product_id: String,
    pub scan_time: String,
}

/// A decode request the mock received, and what it did with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub at: SystemTime,
    pub kind: DecodeKind,
    pub environment: String,
    pub path: String,
    pub correlation_id: Option<String>,
    pub customer_id: Option<String>,
    pub authorized_groups: Option<String>,
    /// Empty when the body was not a JSON array.
    pub items: Vec<ReceivedItem>,
    /// `None` when the connection was closed without an answer.
    pub status: Option<u16>,
    /// The injected fault, if one was applied.
    pub fault: Option<Fault>,
    /// Items answered with a decoded value (after any `DropItems`).
    pub decoded: usize,
}

/// Counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MockStats {
    /// Requests to the token endpoints, granted or not.
    pub token_requests: u64,
    pub token_grants: u64,
    pub decode_requests: u64,
    /// Items answered with a decoded value in a 200 answer: what was delivered.
    pub decoded_items: u64,
    /// Items answered with an item error in a 200 answer.
    pub item_errors: u64,
    pub faults_applied: u64,
    /// Received records dropped because of the record limit.
    pub dropped_records: u64,
}

/// An operator endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /devices/v1/parcel`
    AddDevice,
    /// `POST /external/v1/devices/label`
    Label,
    /// `PUT /external/v1/devices/label`
    Relabel,
    /// `GET /external/v1/devices/label`
    ShowLabels,
    /// `POST /external/v1/devices/status`
    Deactivate,
    /// `POST /external/v1/devices/config`
    Configure,
    /// `GET /external/locations/{asset_id}`
    Locate,
    /// `POST {historical}/agent-service/v1/agent/exec/{uuid}`
    History,
    /// `POST /external/messages`
    Message,
}

impl Endpoint {
    /// The five calls that share the rate window (spec section 8).
    pub fn rate_limited(self) -> bool {
        matches!(
            self,
            Endpoint::Label
                | Endpoint::Relabel
                | Endpoint::ShowLabels
                | Endpoint::Deactivate
                | Endpoint::Configure
        )
    }
}

/// An operator request the mock received, and its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorReceived {
    pub at: SystemTime,
    pub endpoint: Endpoint,
    pub environment: String,
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    /// Every header but `authorization`, names lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// `None` when the connection was closed without an answer.
    pub status: Option<u16>,
    pub fault: Option<Fault>,
}

impl OperatorReceived {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
