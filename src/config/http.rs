//! `[http]`: where `/metrics`, `/healthz` and the status page are served, if anywhere.
//! Raw to typed; touches its raw section only.

use super::problem::Check;
use super::raw::RawHttp;
use super::DEFAULTS;

#[derive(Debug, Clone, Default)]
pub struct HttpSettings {
    /// Where /metrics, /healthz and the status page are served; `None`: nowhere.
    pub listen: Option<std::net::SocketAddr>,
}

pub(super) fn validate(h: RawHttp, c: &mut Check) -> HttpSettings {
    HttpSettings {
        listen: h
            .listen
            .or(DEFAULTS.http.listen.map(String::from))
            .and_then(|text| match text.trim().parse() {
                Ok(addr) => Some(addr),
                Err(_) => {
                    c.bad(
                        "http.listen",
                        format!("{text:?}"),
                        "an IP address and port such as \"0.0.0.0:9464\", \"127.0.0.1:9464\" or \"[::]:9464\"",
                    );
                    None
                }
            }),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use crate::config::test_support::{parse, problems};

    #[test]
    fn no_http_listener_unless_one_is_configured() {
        assert_eq!(parse("", &[]).unwrap().http.listen, None);
        let c = parse("[http]\nlisten = \"0.0.0.0:9464\"\n", &[]).unwrap();
        assert_eq!(c.http.listen, Some(SocketAddr::from(([0, 0, 0, 0], 9464))));
        let c = parse("", &[("TAPEGATE_HTTP__LISTEN", "[::1]:9000")]).unwrap();
        assert_eq!(c.http.listen, Some("[::1]:9000".parse().unwrap()));
    }

    #[test]
    fn a_listen_address_without_a_port_is_refused_naming_key_and_value() {
        for bad in ["9464", "localhost:9464", "0.0.0.0"] {
            let p = problems(&format!("[http]\nlisten = \"{bad}\"\n"), &[]);
            let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
            assert_eq!(p.len(), 1, "{shown:?}");
            assert!(
                shown[0].starts_with(&format!(
                    "http.listen = \"{bad}\": expected an IP address and port"
                )),
                "{shown:?}"
            );
        }
    }
}
