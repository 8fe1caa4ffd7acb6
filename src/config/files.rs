//! The files a config points to (the service password, `[telemetry]`'s credential, CA
//! certificates) as the shell read them, checked into typed values here without any
//! I/O; whether the password is read at all ([`Password`]). Reading is `host.rs`'s.

use std::fmt;
use std::path::PathBuf;

use super::host::{CaFileRead, PasswordFile};
use super::problem::Check;
use crate::util::secret::Secret;

/// Whether loading reads the service password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Password {
    /// Read it: the caller talks to the service (`run`, `check`, the operator commands).
    #[default]
    Read,
    /// Leave it unread, and the `[service]` settings out of the result (`service` is
    /// `None`), every other key validated as usual: for what does not talk to the
    /// service (`status`, `tapes`, `dead-letters`, `scan`, `check --config-only`, a
    /// reload), so that it works where the password cannot be read (outside the unit,
    /// as another user, in `ExecReload=`).
    Skip,
}

/// The files a config points to, as the caller read them.
#[derive(Default, Clone, Copy)]
pub struct Files<'a> {
    /// The file [`RawConfig::password_file`](super::raw::RawConfig::password_file) names.
    pub password_file: Option<&'a PasswordFile>,
    /// The file [`RawConfig::ca_file`](super::raw::RawConfig::ca_file) names.
    pub ca_file: Option<&'a CaFileRead>,
    /// `[telemetry]`'s credential file and CA file, as read.
    pub telemetry: TelemetryFiles<'a>,
    /// Whether the password is wanted: with [`Password::Skip`] the `[service]` settings,
    /// validated but for the password, are left out of the result.
    pub password: Password,
}

/// The files `[telemetry]` names, as the caller read them.
#[derive(Default, Clone, Copy)]
pub struct TelemetryFiles<'a> {
    /// The file [`RawTelemetry::secret_file`](super::raw::RawTelemetry::secret_file) names (unread with [`Password::Skip`]).
    pub secret: Option<&'a PasswordFile>,
    /// `ca_file`.
    pub ca_file: Option<&'a CaFileRead>,
}

/// A PEM file of CA certificates, as read and checked when the config was loaded.
#[derive(Clone)]
pub struct CaFile {
    pub path: PathBuf,
    /// The PEM text (one or more certificates).
    pub pem: Vec<u8>,
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The CA certificates of a `ca_file` (`key`): a readable PEM file holding at least one.
pub(super) fn ca_file(read: &CaFileRead, key: &str, c: &mut Check) -> Option<CaFile> {
    let path = read.path.display();
    let expected = "a PEM file of CA certificates (-----BEGIN CERTIFICATE-----)";
    match &read.contents {
        Ok(pem) => match reqwest::Certificate::from_pem_bundle(pem) {
            Ok(certs) if !certs.is_empty() => Some(CaFile {
                path: read.path.clone(),
                pem: pem.clone(),
            }),
            _ => {
                c.bad(key, path, &format!("{expected}; it holds none"));
                None
            }
        },
        Err(e) => {
            c.bad(key, path, &format!("{expected} that can be read ({e})"));
            None
        }
    }
}

/// The password a password file holds; one trailing newline is dropped.
pub(super) fn password_from_file(read: &PasswordFile, key: &str, c: &mut Check) -> Option<Secret> {
    let path = &read.path;
    match &read.contents {
        Ok(text) => {
            let text = text.expose();
            let p = text.strip_suffix('\n').unwrap_or(text);
            let p = p.strip_suffix('\r').unwrap_or(p);
            if p.is_empty() {
                c.bad(
                    key,
                    path.display(),
                    "a file holding the password (it is empty)",
                );
                None
            } else {
                Some(Secret::new(p))
            }
        }
        Err(e) => {
            c.bad(
                key,
                path.display(),
                &format!("a readable file holding the password ({e})"),
            );
            None
        }
    }
}
