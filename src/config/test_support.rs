//! What the config tests share: a valid `[service]` section, a hand-made host, and
//! parsing through the same shell as `load`.

use std::path::Path;

use super::host::Host;
use super::load::from_toml_on;
use super::{Config, ConfigError, Password, Problem};

/// A `[service]` section with every onboarding value, the password inline.
pub const SERVICE: &str = r#"
[service]
environment = "ppe"
[service.environments.ppe]
base_url = "https://api.example.com/"
auth_url = "https://auth.example.com/oauth/token"
client_id = "cid"
audience = "aud"
username = "gw"
password = "s3cr3t-value"
customer_id = "cust"
authorized_groups = "grp"
"#;

/// A machine named `test-host` without a credentials directory, so that tests do not
/// depend on the one they run on.
pub fn test_host() -> Host {
    Host {
        hostname: "test-host".into(),
        credentials_dir: None,
    }
}

pub fn parse(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    parse_on(text, env, &test_host())
}

pub fn parse_on(text: &str, env: &[(&str, &str)], host: &Host) -> Result<Config, ConfigError> {
    from_toml_on(
        text,
        Path::new("test.toml"),
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        host,
        Password::Read,
    )
}

pub fn problems(text: &str, env: &[(&str, &str)]) -> Vec<Problem> {
    match parse(text, env) {
        Err(ConfigError::Invalid { problems, .. }) => problems,
        other => panic!("expected problems, got {other:?}"),
    }
}
