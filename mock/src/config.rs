/*!
What the mock serves: its environments and their credentials, which MACs are known
tapes ([`Registry`]), what a decode item may look like ([`WireRules`]), the limits and
the readings of the spec's open points, all in [`MockConfig`]. Plain data; it touches
only `mac.rs`, `rate.rs` and `readings.rs` for their types and defaults.
*/

use std::collections::HashSet;
use std::time::Duration;

use super::clock::MockClock;
use super::mac::MacFormat;
use super::rate::{DEFAULT_RATE_LIMIT, DEFAULT_RATE_WINDOW};
use super::readings::Readings;

/// Items per bulk request (spec section 8).
pub const DEFAULT_MAX_ITEMS: usize = 250;
/// Received requests kept by default.
pub const DEFAULT_RECORD_LIMIT: usize = 10_000;
/// `fw_ver` of every decoded packet.
pub const FW_VER: &str = "1.4.2";
/// The application ids the operator issued to the mock's account (`appId` of
/// add-device, `application_id` of labels); the first is the demo's default.
pub const APP_IDS: [&str; 2] = ["demo-app", "cold-chain"];

/// The plain-MAC prefix of the simulated fleet's unregistered tapes (`C0:DE:AD`), which
/// the default registry does not know.
pub const UNREGISTERED_PREFIX: &str = "C0DEAD";

/// One environment: what onboarding would hand out for it.
#[derive(Clone, PartialEq, Eq)]
pub struct MockEnvironment {
    /// Path prefix (`/ppe/...`).
    pub name: String,
    pub client_id: String,
    pub audience: String,
    pub username: String,
    /// The mock's own credential: not a secret worth protecting, but left out of
    /// `Debug` like a real one.
    pub password: String,
    pub customer_id: String,
    pub authorized_groups: String,
    /// Lifetime of granted tokens, seconds.
    pub expires_in: u64,
}

impl std::fmt::Debug for MockEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockEnvironment")
            .field("name", &self.name)
            .field("client_id", &self.client_id)
            .field("audience", &self.audience)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("customer_id", &self.customer_id)
            .field("authorized_groups", &self.authorized_groups)
            .field("expires_in", &self.expires_in)
            .finish()
    }
}

impl MockEnvironment {
    /// The demo environment "ppe".
    pub fn demo() -> Self {
        Self::named("ppe")
    }

    /// An environment with the demo credentials under another name.
    pub fn named(name: &str) -> Self {
        MockEnvironment {
            name: name.to_string(),
            client_id: "tapegate-demo".to_string(),
            audience: "https://api.example/decode".to_string(),
            username: "demo".to_string(),
            password: "demo-password".to_string(),
            customer_id: "demo-customer".to_string(),
            authorized_groups: "demo-group".to_string(),
            expires_in: 3600,
        }
    }
}

/// Which MACs are known tapes associated with the customer. MACs are compared in their
/// plain form: 12 upper-case hex digits, no separators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registry {
    All,
    AllExcept(HashSet<String>),
    Only(HashSet<String>),
    /// Every MAC except those whose plain form starts with the prefix.
    AllExceptPrefix(String),
    /// The first, and these MACs too (tapes added with add-device).
    Plus(Box<Registry>, HashSet<String>),
}

impl Registry {
    /// Every MAC except the simulated fleet's unregistered ones ([`UNREGISTERED_PREFIX`]).
    pub fn simulated_fleet() -> Self {
        Registry::AllExceptPrefix(UNREGISTERED_PREFIX.to_string())
    }

    /// Whether the MAC (plain form) is registered.
    pub fn is_registered(&self, plain_mac: &str) -> bool {
        match self {
            Registry::All => true,
            Registry::AllExcept(set) => !set.contains(plain_mac),
            Registry::Only(set) => set.contains(plain_mac),
            Registry::AllExceptPrefix(prefix) => !plain_mac.starts_with(prefix.as_str()),
            Registry::Plus(base, extra) => {
                extra.contains(plain_mac) || base.is_registered(plain_mac)
            }
        }
    }

    /// Makes the MAC (plain form) known from now on.
    pub fn register(&mut self, plain_mac: &str) {
        if self.is_registered(plain_mac) {
            return;
        }
        match self {
            Registry::AllExcept(set) => {
                set.remove(plain_mac);
            }
            Registry::Only(set) | Registry::Plus(_, set) => {
                set.insert(plain_mac.to_string());
            }
            Registry::All | Registry::AllExceptPrefix(_) => {
                let base = std::mem::replace(self, Registry::All);
                *self = Registry::Plus(Box::new(base), [plain_mac.to_string()].into());
            }
        }
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::simulated_fleet()
    }
}

/// What the mock accepts in a decode item beyond the spec's shape. The spec leaves the
/// form of `mac_id` and the encoding of `ble_packet` open, and a real account knows its
/// own `product_id`s; a real service takes one of each, not all. So by default the mock
/// takes exactly tapegate's defaults (`mac_id` as 12 upper-case hex digits, `ble_packet`
/// as upper-case hex, the product `tape`), and a wire mistake becomes an item error a
/// test sees instead of passing. A test that means to send another form says so here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireRules {
    /// The `mac_id` forms accepted.
    pub mac_formats: Vec<MacFormat>,
    /// Also accept `ble_packet` as lower-case hex or base64 (the encodings a product can
    /// be configured with), not only upper-case hex.
    pub any_packet_encoding: bool,
    /// The `product_id`s accepted; empty: any.
    pub product_ids: Vec<String>,
}

impl Default for WireRules {
    fn default() -> Self {
        WireRules {
            mac_formats: vec![MacFormat::Plain],
            any_packet_encoding: false,
            product_ids: vec!["tape".to_string()],
        }
    }
}

impl WireRules {
    /// Every form the mock can read: both `mac_id` forms, every encoding, any product.
    pub fn lenient() -> Self {
        WireRules {
            mac_formats: vec![MacFormat::Plain, MacFormat::Colon],
            any_packet_encoding: true,
            product_ids: Vec::new(),
        }
    }
}

/// What the mock serves.
#[derive(Debug, Clone, PartialEq)]
pub struct MockConfig {
    pub environments: Vec<MockEnvironment>,
    pub registry: Registry,
    /// Items per bulk request; more gets 413.
    pub max_items: usize,
    /// What a decode item may look like.
    pub wire: WireRules,
    /// Requests per rate window of the label, status and config calls (spec 8).
    pub rate_limit: u32,
    /// Length of that window (tests shorten it rather than wait a minute).
    pub rate_window: Duration,
    /// The reading played on each point the spec leaves open.
    pub readings: Readings,
    /// The MACs (any form) of the simulated fleet the demo runs, in its order: the
    /// tapes `seed::DEMO_LABELLED` of it are seeded with labels `DEMO-00NN` (the gateway's
    /// demo gives them; empty, no fleet tape is labelled).
    pub demo_fleet: Vec<String>,
    /// The wall clock the account's times are counted by: the seeded events, "now" of
    /// history's limits, when a request was received.
    pub clock: MockClock,
}

impl MockConfig {
    /// One environment "ppe" with the demo credentials, the simulated fleet's
    /// registry, 250 items per request.
    pub fn demo() -> Self {
        MockConfig {
            environments: vec![MockEnvironment::demo()],
            registry: Registry::default(),
            max_items: DEFAULT_MAX_ITEMS,
            wire: WireRules::default(),
            rate_limit: DEFAULT_RATE_LIMIT,
            rate_window: DEFAULT_RATE_WINDOW,
            readings: Readings::default(),
            demo_fleet: Vec::new(),
            clock: MockClock::machine(),
        }
    }
}

impl Default for MockConfig {
    fn default() -> Self {
        Self::demo()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_registry_knows_every_mac_but_the_unregistered_prefix() {
        let r = Registry::default();
        assert!(r.is_registered("C0FFEE000001"));
        assert!(!r.is_registered("C0DEAD000001"));
        let only = Registry::Only(["AABBCCDDEEFF".to_string()].into());
        assert!(only.is_registered("AABBCCDDEEFF"));
        assert!(!only.is_registered("C0FFEE000001"));
    }

    #[test]
    fn a_registered_mac_is_known_from_then_on_whatever_the_registry_was() {
        let registries = [
            Registry::All,
            Registry::AllExcept(["C0DEAD000001".to_string()].into()),
            Registry::Only(HashSet::new()),
            Registry::simulated_fleet(),
        ];
        for mut r in registries {
            let before = r.clone();
            r.register("C0DEAD000001");
            assert!(r.is_registered("C0DEAD000001"), "{before:?}");
            assert_eq!(
                r.is_registered("C0DEAD000002"),
                before.is_registered("C0DEAD000002"),
                "{before:?}: no other MAC changes"
            );
        }
    }
}
