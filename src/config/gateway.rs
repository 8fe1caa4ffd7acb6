//! `[gateway]`: who this gateway is, where its state lives, how long a stop may take and
//! when captures wait for the clock. Raw to typed; touches only its raw section, the
//! host's name and [`DEFAULTS`].

use std::path::PathBuf;
use std::time::Duration;

use super::host::Host;
use super::problem::Check;
use super::raw::RawGateway;
use super::DEFAULTS;
use crate::clock::{ClockPolicy, ClockSettings};

#[derive(Debug, Clone)]
pub struct GatewaySettings {
    pub id: String,
    pub state_dir: PathBuf,
    pub shutdown_grace: Duration,
    /// When captures are held for an untrusted clock.
    pub clock: ClockSettings,
}

pub(super) fn validate(g: RawGateway, host: &Host, c: &mut Check) -> GatewaySettings {
    GatewaySettings {
        id: match g.id {
            None => host.hostname.clone(),
            Some(id) => {
                let ok = !id.is_empty()
                    && id.len() <= 64
                    && id
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch));
                if !ok {
                    c.bad(
                        "gateway.id",
                        format!("{id:?}"),
                        "1 to 64 letters, digits, '-', '_' or '.'",
                    );
                }
                id
            }
        },
        state_dir: match g.state_dir {
            None => PathBuf::from(DEFAULTS.gateway.state_dir),
            Some(p) if p.as_os_str().is_empty() => {
                c.bad("gateway.state_dir", "\"\"", "a directory path");
                p
            }
            Some(p) => p,
        },
        shutdown_grace: Duration::from_secs(c.int(
            "gateway.shutdown_grace_secs",
            g.shutdown_grace_secs,
            DEFAULTS.gateway.shutdown_grace_secs,
            1,
            600,
        )),
        clock: ClockSettings {
            policy: c.choice(
                "gateway.clock",
                g.clock.as_deref(),
                DEFAULTS.gateway.clock,
                &[
                    ("auto", ClockPolicy::Auto),
                    ("wait", ClockPolicy::Wait),
                    ("trust", ClockPolicy::Trust),
                ],
            ),
            max_hold: Duration::from_secs(c.int(
                "gateway.clock_max_hold_secs",
                g.clock_max_hold_secs,
                DEFAULTS.gateway.clock_max_hold_secs,
                1,
                604_800,
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::config::host::Host;
    use crate::config::test_support::parse_on;

    #[test]
    fn the_gateway_id_defaults_to_the_host_name_it_is_given() {
        let host = Host {
            hostname: "dock-42".into(),
            credentials_dir: None,
        };
        assert_eq!(parse_on("", &[], &host).unwrap().gateway.id, "dock-42");
        let named = parse_on("[gateway]\nid = \"dock-7\"\n", &[], &host).unwrap();
        assert_eq!(named.gateway.id, "dock-7");
    }
}
