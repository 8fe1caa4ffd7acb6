/*!
`[telemetry]`: where the metrics of `/metrics` are pushed and how the receiver is told
who pushes; raw to typed. It touches its raw section and the files as read. Off unless
`url` is set; every other key is checked all the same, so that a mistake shows before
the day someone turns it on. The receiver's credential (a basic-auth password or a
bearer token, inline or in a file) is handled as the service password: never in a
problem, read only when the caller reads secrets ([`Password::Read`]).
*/

use std::time::Duration;

use url::Url;

use super::files::{ca_file, CaFile, Files, Password};
use super::host::PasswordFile;
use super::problem::Check;
use super::raw::RawTelemetry;
use super::DEFAULTS;
use crate::util::secret::Secret;

/// `[telemetry]`: the metrics of `/metrics`, pushed to a Prometheus remote-write
/// receiver (see [`crate::telemetry`]).
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    pub url: Url,
    pub interval: Duration,
    pub timeout: Duration,
    /// Pushes kept while the receiver cannot be reached; the oldest go first.
    pub max_buffered: usize,
    /// CA certificates trusted besides the system's, for the receiver.
    pub ca_file: Option<CaFile>,
    pub auth: TelemetryAuth,
}

/// How the receiver is told who pushes. A credential is `None` when the config was
/// loaded without reading secrets ([`Password::Skip`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TelemetryAuth {
    None,
    Basic {
        username: String,
        password: Option<Secret>,
    },
    Bearer(Option<Secret>),
}

/// The typed `[telemetry]`, `None` when no `url` is set (or it is refused: the
/// problems say why).
pub(super) fn validate(
    t: RawTelemetry,
    files: Files<'_>,
    c: &mut Check,
) -> Option<TelemetrySettings> {
    let interval = Duration::from_secs(c.int(
        "telemetry.interval_secs",
        t.interval_secs,
        DEFAULTS.telemetry.interval_secs,
        1,
        86_400,
    ));
    let timeout = Duration::from_secs(c.int(
        "telemetry.timeout_secs",
        t.timeout_secs,
        DEFAULTS.telemetry.timeout_secs,
        1,
        300,
    ));
    let max_buffered = c.int(
        "telemetry.max_buffered",
        t.max_buffered,
        DEFAULTS.telemetry.max_buffered,
        0,
        100_000,
    ) as usize;
    let ca = files
        .telemetry
        .ca_file
        .and_then(|read| ca_file(read, "telemetry.ca_file", c));
    let auth = auth(&t, files, c);
    let url = match t.url.or(DEFAULTS.telemetry.url.map(String::from)) {
        None => {
            for (key, set) in [
                ("ca_file", t.ca_file.is_some()),
                ("username", t.username.is_some()),
            ] {
                if set {
                    c.other(
                        format!("telemetry.{key}"),
                        "is set but telemetry.url is not: set the receiver's URL, or remove it",
                    );
                }
            }
            return None;
        }
        url => c.url("telemetry.url", url)?,
    };
    Some(TelemetrySettings {
        url,
        interval,
        timeout,
        max_buffered,
        ca_file: ca,
        auth: auth?,
    })
}

/// The credential: basic (`username` with `password` or `password_file`), bearer
/// (`bearer_token` or `bearer_token_file`), or none. `None` when it is refused.
fn auth(t: &RawTelemetry, files: Files<'_>, c: &mut Check) -> Option<TelemetryAuth> {
    let password = one_of(
        c,
        "password",
        t.password.as_deref(),
        t.password_file.is_some(),
    )?;
    let token = one_of(
        c,
        "bearer_token",
        t.bearer_token.as_deref(),
        t.bearer_token_file.is_some(),
    )?;
    let read = |c: &mut Check, inline: Option<&str>, key: &str| -> Option<Option<Secret>> {
        match inline {
            Some(value) => Some(Some(Secret::new(value))),
            None if files.password == Password::Skip => Some(None),
            None => secret_from_file(files.telemetry.secret, key, c).map(Some),
        }
    };
    match (&t.username, password, token) {
        (_, Given::Yes, Given::Yes) => {
            c.other(
                "telemetry.bearer_token",
                "set either a password (basic auth) or a bearer token, not both",
            );
            None
        }
        (Some(username), Given::Yes, Given::No) => {
            let username = c.text("telemetry.username", Some(username.clone()), "a user name")?;
            let password = read(c, t.password.as_deref(), "telemetry.password_file")?;
            Some(TelemetryAuth::Basic { username, password })
        }
        (None, Given::Yes, Given::No) => {
            c.missing(
                "telemetry.username",
                "a user name beside telemetry.password (basic auth)",
            );
            None
        }
        (Some(_), Given::No, _) => {
            c.missing(
                "telemetry.password_file",
                "password_file (or password) beside telemetry.username (basic auth)",
            );
            None
        }
        (None, Given::No, Given::Yes) => {
            let token = read(c, t.bearer_token.as_deref(), "telemetry.bearer_token_file")?;
            Some(TelemetryAuth::Bearer(token))
        }
        (None, Given::No, Given::No) => Some(TelemetryAuth::None),
    }
}

/// Whether a credential is given.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Given {
    Yes,
    No,
}

/// Checks that a credential is given at most one way (`key` inline or `key_file`);
/// `None` when both are. An empty inline value is refused without being shown.
fn one_of(c: &mut Check, key: &str, inline: Option<&str>, file: bool) -> Option<Given> {
    match (inline, file) {
        (Some(_), true) => {
            c.other(
                format!("telemetry.{key}"),
                format!("set either {key} or {key}_file, not both"),
            );
            None
        }
        (Some(""), false) => {
            c.other(format!("telemetry.{key}"), "is empty");
            None
        }
        (Some(_), false) | (None, true) => Some(Given::Yes),
        (None, false) => Some(Given::No),
    }
}

/// The credential a file holds (one trailing newline dropped); its path is shown in a
/// problem, never its contents.
fn secret_from_file(read: Option<&PasswordFile>, key: &str, c: &mut Check) -> Option<Secret> {
    let Some(read) = read else {
        c.other(key, "was not read");
        return None;
    };
    let expected = "a readable file holding the receiver's credential";
    match &read.contents {
        Ok(text) => {
            let text = text.expose();
            let value = text.strip_suffix('\n').unwrap_or(text);
            let value = value.strip_suffix('\r').unwrap_or(value);
            if value.is_empty() {
                c.bad(
                    key,
                    read.path.display(),
                    &format!("{expected} (it is empty)"),
                );
                None
            } else {
                Some(Secret::new(value))
            }
        }
        Err(e) => {
            c.bad(key, read.path.display(), &format!("{expected} ({e})"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_support::{parse, problems};
    use crate::config::TelemetryAuth;

    #[test]
    fn off_by_default_and_on_with_a_url() {
        assert!(parse("", &[]).unwrap().telemetry.is_none());
        let c = parse(
            "[telemetry]\nurl = \"http://127.0.0.1:9090/api/v1/write\"\ninterval_secs = 15\n",
            &[],
        )
        .unwrap();
        let t = c.telemetry.unwrap();
        assert_eq!(t.url.as_str(), "http://127.0.0.1:9090/api/v1/write");
        assert_eq!(t.interval.as_secs(), 15);
        assert_eq!(t.max_buffered, 360);
        assert_eq!(t.auth, TelemetryAuth::None);
    }

    #[test]
    fn a_bad_telemetry_key_is_named_with_its_value_and_what_was_expected() {
        let shown: Vec<String> = problems(
            "[telemetry]\nurl = \"ftp://x\"\ninterval_secs = 0\nmax_buffered = -1\n",
            &[],
        )
        .iter()
        .map(ToString::to_string)
        .collect();
        assert!(
            shown.iter().any(|s| s.contains("telemetry.max_buffered")),
            "{shown:#?}"
        );
        let shown: Vec<String> =
            problems("[telemetry]\nurl = \"ftp://x\"\ninterval_secs = 0\n", &[])
                .iter()
                .map(ToString::to_string)
                .collect();
        assert!(
            shown.contains(
                &"telemetry.interval_secs = 0: expected a whole number from 1 to 86400".into()
            ),
            "{shown:#?}"
        );
        assert!(
            shown
                .iter()
                .any(|s| s.starts_with("telemetry.url = \"ftp://x\"")),
            "{shown:#?}"
        );
    }

    #[test]
    fn credentials_are_read_from_files_and_never_shown_in_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "tok-FILE-7731\n").unwrap();
        let c = parse(
            &format!(
                "[telemetry]\nurl = \"https://r.example/push\"\nbearer_token_file = \"{}\"\n",
                token.display()
            ),
            &[],
        )
        .unwrap();
        match c.telemetry.unwrap().auth {
            TelemetryAuth::Bearer(Some(t)) => assert_eq!(t.expose(), "tok-FILE-7731"),
            other => panic!("{other:?}"),
        }
        let both = "[telemetry]\nurl = \"https://r.example/push\"\nusername = \"u\"\npassword = \"pw-INLINE-5521\"\nbearer_token = \"tok-INLINE-5521\"\n";
        let shown = format!("{:?}", problems(both, &[]));
        assert!(shown.contains("not both"), "{shown}");
        assert!(!shown.contains("INLINE-5521"), "{shown}");
        let alone =
            "[telemetry]\nurl = \"https://r.example/push\"\npassword = \"pw-INLINE-5521\"\n";
        let shown = format!("{:?}", problems(alone, &[]));
        assert!(shown.contains("telemetry.username"), "{shown}");
        assert!(!shown.contains("INLINE-5521"), "{shown}");
        let basic = "[telemetry]\nurl = \"https://r.example/push\"\nusername = \"u\"\npassword = \"pw-INLINE-5521\"\n";
        match parse(basic, &[]).unwrap().telemetry.unwrap().auth {
            TelemetryAuth::Basic { username, password } => {
                assert_eq!(username, "u");
                assert_eq!(password.unwrap().expose(), "pw-INLINE-5521");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn credentials_in_the_url_are_refused_and_not_shown() {
        let text = "[telemetry]\nurl = \"https://user:pw-URL-3391@r.example/push\"\n";
        let shown = format!("{:?}", problems(text, &[]));
        assert!(shown.contains("telemetry.url"), "{shown}");
        assert!(!shown.contains("pw-URL-3391"), "{shown}");
    }
}
