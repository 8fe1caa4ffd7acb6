//! `[service]` and the selected `[service.environments.<name>]`: where the tracking
//! service is, who we are to it (the onboarding values and the password) and what the
//! operator commands add. Raw to typed; touches its raw section and the files as read.

use std::collections::BTreeMap;
use std::time::Duration;

use url::Url;

use super::files::{ca_file, password_from_file, CaFile, Files, Password};
use super::problem::Check;
use super::raw::{RawEnvironment, RawService};
use super::DEFAULTS;
use crate::record::Mac;
use crate::util::secret::Secret;

/// `mac_id` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacFormat {
    /// `AABBCCDDEEFF` (default).
    Plain,
    /// `AA:BB:CC:DD:EE:FF`.
    Colon,
}

impl MacFormat {
    /// `mac` as `mac_id` on the wire.
    pub fn format(self, mac: Mac) -> String {
        match self {
            MacFormat::Plain => mac.plain(),
            MacFormat::Colon => mac.colon(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// Name of the selected environment.
    pub environment: String,
    pub mac_format: MacFormat,
    pub request_timeout: Duration,
    /// `[service] ca_file`: CA certificates trusted besides the system's.
    pub ca_file: Option<CaFile>,
    /// The selected environment's settings.
    pub endpoint: EnvironmentSettings,
}

/// Everything onboarding hands out for one environment.
#[derive(Debug, Clone)]
pub struct EnvironmentSettings {
    pub base_url: Url,
    pub auth_url: Url,
    pub client_id: String,
    pub audience: String,
    pub username: String,
    pub password: Secret,
    pub customer_id: String,
    pub authorized_groups: String,
}

/// What the operator commands need beyond the decode client: the history address and
/// the defaults of `device add` and `device label`, from the selected environment, and
/// the length of the service's rate window.
#[derive(Debug, Clone)]
pub struct OperatorSettings {
    /// `None`: not configured; `tapegate history` says which key to set.
    pub historical_base_url: Option<Url>,
    pub history_operation_id: Option<String>,
    pub default_app_id: Option<String>,
    pub default_tape_type: String,
    pub rate_window: Duration,
}

/// A section found invalid; the problems say why.
pub(super) struct Invalid;

/// The `[service]` settings and the operator's; `Ok(None)` when they are valid but left
/// out because the password was not to be read.
pub(super) fn validate(
    s: RawService,
    files: Files<'_>,
    c: &mut Check,
) -> Result<Option<(ServiceSettings, OperatorSettings)>, Invalid> {
    let ca_file = files
        .ca_file
        .and_then(|read| ca_file(read, "service.ca_file", c));
    let environment = s.environment().to_string();
    let rate_window = Duration::from_secs(c.int(
        "service.rate_window_secs",
        s.rate_window_secs,
        DEFAULTS.service.rate_window_secs,
        1,
        3600,
    ));
    let mac_format = c.choice(
        "service.mac_format",
        s.mac_format.as_deref(),
        DEFAULTS.service.mac_format,
        &[("plain", MacFormat::Plain), ("colon", MacFormat::Colon)],
    );
    let request_timeout = Duration::from_secs(c.int(
        "service.request_timeout_secs",
        s.request_timeout_secs,
        DEFAULTS.service.request_timeout_secs,
        1,
        600,
    ));
    let mut e = selected(s.environments.unwrap_or_default(), &environment, c)?;
    let keys = Keys(&environment);
    let onboarding = onboarding(&mut e, keys, c);
    let operator = operator(&mut e, keys, rate_window, c);
    // The password's value never appears in a problem.
    let password = password(e, keys, files, c);
    let Some(endpoint) = onboarding else {
        return Err(Invalid);
    };
    if files.password == Password::Skip {
        return Ok(None);
    }
    let password = password.ok_or(Invalid)?;
    let service = ServiceSettings {
        environment: environment.clone(),
        mac_format,
        request_timeout,
        ca_file,
        endpoint: endpoint.with(password),
    };
    Ok(Some((service, operator)))
}

/// The keys of the selected environment: `service.environments.<name>.<field>`.
#[derive(Clone, Copy)]
struct Keys<'a>(&'a str);

impl Keys<'_> {
    fn of(self, field: &str) -> String {
        format!("service.environments.{}.{field}", self.0)
    }
}

/// The `[service.environments.<name>]` that `service.environment` names.
fn selected(
    mut envs: BTreeMap<String, RawEnvironment>,
    environment: &str,
    c: &mut Check,
) -> Result<RawEnvironment, Invalid> {
    if let Some(e) = envs.remove(environment) {
        return Ok(e);
    }
    let known: Vec<&String> = envs.keys().collect();
    c.bad(
        "service.environment",
        format!("{environment:?}"),
        &if known.is_empty() {
            "the name of a [service.environments.<name>] table (there is none)".to_string()
        } else {
            format!("the name of a [service.environments.<name>] table: {known:?}")
        },
    );
    Err(Invalid)
}

/// The onboarding values of an environment, all of them or none.
struct Onboarding {
    base_url: Url,
    auth_url: Url,
    client_id: String,
    audience: String,
    username: String,
    customer_id: String,
    authorized_groups: String,
}

impl Onboarding {
    fn with(self, password: Secret) -> EnvironmentSettings {
        EnvironmentSettings {
            base_url: self.base_url,
            auth_url: self.auth_url,
            client_id: self.client_id,
            audience: self.audience,
            username: self.username,
            password,
            customer_id: self.customer_id,
            authorized_groups: self.authorized_groups,
        }
    }
}

/// Every onboarding key checked (each problem reported); `None` if one is wrong.
fn onboarding(e: &mut RawEnvironment, k: Keys, c: &mut Check) -> Option<Onboarding> {
    let base_url = c.url(&k.of("base_url"), e.base_url.take());
    let auth_url = c.url(&k.of("auth_url"), e.auth_url.take());
    let client_id = c.text(
        &k.of("client_id"),
        e.client_id.take(),
        "the client id from onboarding",
    );
    let audience = c.text(
        &k.of("audience"),
        e.audience.take(),
        "the audience from onboarding",
    );
    let username = c.text(&k.of("username"), e.username.take(), "the API user name");
    let customer_id = c.text(
        &k.of("customer_id"),
        e.customer_id.take(),
        "the customer id from onboarding",
    );
    let authorized_groups = c.text(
        &k.of("authorized_groups"),
        e.authorized_groups.take(),
        "the authorized groups from onboarding",
    );
    Some(Onboarding {
        base_url: base_url?,
        auth_url: auth_url?,
        client_id: client_id?,
        audience: audience?,
        username: username?,
        customer_id: customer_id?,
        authorized_groups: authorized_groups?,
    })
}

/// The operator's keys: each optional, a bad one named with its value.
fn operator(
    e: &mut RawEnvironment,
    k: Keys,
    rate_window: Duration,
    c: &mut Check,
) -> OperatorSettings {
    let historical_base_url = match e.historical_base_url.take() {
        None => None,
        some => c.url(&k.of("historical_base_url"), some),
    };
    let optional = |c: &mut Check, key: &str, v: Option<String>, what: &str| match v {
        None => None,
        some => c.text(&k.of(key), some, what),
    };
    let history_operation_id = optional(
        c,
        "history_operation_id",
        e.history_operation_id.take(),
        "the fixed UUID that ends the history path",
    );
    if let Some(id) = history_operation_id.as_deref() {
        if uuid::Uuid::parse_str(id).is_err() {
            c.bad(
                k.of("history_operation_id"),
                format!("{id:?}"),
                "a UUID such as \"3f2a9c4e-8b1d-4e6f-a7c2-5d9e0b1f6a38\"",
            );
        }
    }
    let default_app_id = optional(
        c,
        "default_app_id",
        e.default_app_id.take(),
        "an application id from the operator",
    );
    let default_tape_type = optional(
        c,
        "default_tape_type",
        e.default_tape_type.take(),
        "a tape type such as Green or Black",
    )
    .unwrap_or_else(|| DEFAULTS.environment.default_tape_type.to_string());
    OperatorSettings {
        historical_base_url,
        history_operation_id,
        default_app_id,
        default_tape_type,
        rate_window,
    }
}

/// The password, inline or from its file; never shown in a problem.
fn password(e: RawEnvironment, k: Keys, files: Files<'_>, c: &mut Check) -> Option<Secret> {
    match (e.password, e.password_file) {
        (Some(_), Some(_)) => {
            c.other(
                k.of("password"),
                "set either password or password_file, not both",
            );
            None
        }
        (None, None) => {
            c.missing(k.of("password_file"), "password_file (or password)");
            None
        }
        (Some(p), None) if p.is_empty() => {
            c.other(k.of("password"), "is empty");
            None
        }
        (Some(p), None) => Some(Secret::new(p)),
        (None, Some(_)) if files.password == Password::Skip => None,
        (None, Some(file)) => match files.password_file {
            Some(read) => password_from_file(read, &k.of("password_file"), c),
            // Only a caller that skipped reading the file gets here.
            None => {
                c.bad(
                    k.of("password_file"),
                    file.display(),
                    "a readable file holding the password (it was not read)",
                );
                None
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::test_support::{parse, problems, SERVICE};

    #[test]
    fn a_password_never_appears_in_a_config_error() {
        let text = SERVICE.replace("https://api.example.com/", "not a url");
        let err = parse(&format!("{text}\n[flush]\nmax_batch = 0\n"), &[]).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("base_url"), "{shown}");
        assert!(!shown.contains("s3cr3t-value"), "{shown}");
        // A valid config's Debug output hides it too.
        let c = parse(SERVICE, &[]).unwrap();
        assert!(!format!("{c:?}").contains("s3cr3t-value"));
    }

    #[test]
    fn a_url_with_credentials_is_refused_naming_the_key_without_the_secret() {
        let text = SERVICE.replace(
            "https://api.example.com/",
            "https://gw:hunter2@api.example.com/",
        );
        let p = problems(&text, &[]);
        assert_eq!(p[0].key, "service.environments.ppe.base_url");
        let shown = p[0].to_string();
        assert!(
            !shown.contains("hunter2") && !shown.contains("gw:"),
            "{shown}"
        );
        assert!(shown.contains("without credentials"), "{shown}");
    }

    #[test]
    fn a_ca_file_must_be_a_readable_pem_file_of_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let not_pem = dir.path().join("ca.pem");
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        for (path, why) in [
            (not_pem.display().to_string(), "it holds none"),
            ("/nonexistent/ca.pem".to_string(), "that can be read"),
        ] {
            let text = SERVICE.replace(
                "environment = \"ppe\"",
                &format!("environment = \"ppe\"\nca_file = \"{path}\""),
            );
            let p = problems(&text, &[]);
            let shown = p[0].to_string();
            assert!(
                shown.starts_with(&format!("service.ca_file = {path}: expected a PEM file")),
                "{shown}"
            );
            assert!(shown.contains(why), "{shown}");
        }
    }

    #[test]
    fn the_operator_keys_are_optional_and_a_bad_one_is_named_with_its_value() {
        let c = parse(SERVICE, &[]).unwrap();
        let o = c.operator.unwrap();
        assert_eq!(o.historical_base_url, None);
        assert_eq!(o.default_tape_type, "Green");
        assert_eq!(o.rate_window, Duration::from_secs(60));
        let text = format!(
            "{SERVICE}historical_base_url = \"ftp://h/\"\nhistory_operation_id = \"not-a-uuid\"\ndefault_app_id = \"\"\n"
        );
        let p = problems(
            &text.replace("[service]\n", "[service]\nrate_window_secs = 0\n"),
            &[],
        );
        let keys: Vec<(&str, Option<&str>)> = p
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_deref()))
            .collect();
        assert_eq!(
            keys,
            [
                ("service.rate_window_secs", Some("0")),
                (
                    "service.environments.ppe.historical_base_url",
                    Some("\"ftp://h/\"")
                ),
                (
                    "service.environments.ppe.history_operation_id",
                    Some("\"not-a-uuid\"")
                ),
                ("service.environments.ppe.default_app_id", Some("\"\"")),
            ]
        );
    }

    #[test]
    fn the_selected_environment_must_exist() {
        let text = SERVICE.replace("environment = \"ppe\"", "environment = \"production\"");
        let p = problems(&text, &[]);
        assert_eq!(p[0].key, "service.environment");
        assert!(p[0].message.contains("ppe"), "{:?}", p[0]);
    }
}
