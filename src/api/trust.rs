//! Which certificate authorities the HTTPS clients trust: the system's store
//! (`/etc/ssl/certs`, as `update-ca-certificates` writes it, or `SSL_CERT_FILE` /
//! `SSL_CERT_DIR`), so that a root the distribution renews, or the CA of a
//! TLS-inspecting proxy that IT installed there, is trusted without a new tapegate or a
//! `ca_file`; the list compiled into the binary only where the system has none (a
//! minimal container). A `ca_file` adds to either. It reads the system's store, nothing
//! else.

use std::sync::OnceLock;

use reqwest::ClientBuilder;

/// The roots a client trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    /// The system's certificate authorities (DER).
    System(Vec<Vec<u8>>),
    /// The list compiled into the binary: the system has none.
    BuiltIn,
}

impl Roots {
    /// The system's, when it has any.
    pub fn from_system(found: Vec<Vec<u8>>) -> Roots {
        if found.is_empty() {
            Roots::BuiltIn
        } else {
            Roots::System(found)
        }
    }

    /// What `tapegate check` says of them.
    pub fn describe(&self) -> String {
        match self {
            Roots::System(certs) => format!(
                "the system's store ({} certificate authorities)",
                certs.len()
            ),
            Roots::BuiltIn => {
                "the list built into tapegate (the system's store is empty or missing: apt-get install ca-certificates)".into()
            }
        }
    }
}

/// The system's roots, read once per process.
pub fn system() -> &'static Roots {
    static ROOTS: OnceLock<Roots> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in found.errors.iter().take(3) {
            tracing::debug!(error = %e, "a certificate of the system's store could not be read");
        }
        Roots::from_system(found.certs.into_iter().map(|c| c.to_vec()).collect())
    })
}

/// `builder` trusting `roots` (and nothing else but what the caller adds).
pub fn trusting(builder: ClientBuilder, roots: &Roots) -> ClientBuilder {
    match roots {
        Roots::BuiltIn => builder,
        Roots::System(certs) => certs
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok())
            .fold(builder.tls_built_in_root_certs(false), |b, cert| {
                b.add_root_certificate(cert)
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_list_is_used_only_where_the_system_has_none() {
        assert_eq!(Roots::from_system(Vec::new()), Roots::BuiltIn);
        let one = vec![vec![0x30, 0x03, 0x02, 0x01, 0x01]];
        assert_eq!(Roots::from_system(one.clone()), Roots::System(one));
        assert!(Roots::BuiltIn.describe().contains("ca-certificates"));
    }

    /// This machine has Debian's ca-certificates (the build needs it to fetch crates).
    #[test]
    fn this_machines_store_is_read() {
        match system() {
            Roots::System(certs) => assert!(certs.len() > 50, "{}", certs.len()),
            Roots::BuiltIn => panic!("no system store read on this machine"),
        }
    }
}
