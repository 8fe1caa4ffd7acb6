//! The package as Debian expects it, in the container: the config's ownership through
//! `dpkg-statoverride` (an admin's own choice kept), the drop-in directory, the man
//! pages and completions, the system's trust store, and a purge that removes what the
//! package made while a remove keeps it.

use super::{common, config, Container};
use tapegate_mock::MockHandle;

/// After the install: the config readable by root and the daemon's group only, through
/// dpkg's record; an admin who chose otherwise keeps it across a reconfigure; the
/// drop-in directory; a man page per command; the shells' completions.
pub fn installed_as_debian_expects(c: &Container) {
    let mode = |c: &Container| c.ok("stat -c '%U:%G %a' /etc/tapegate/config.toml");
    assert_eq!(mode(c).trim(), "root:tapegate 640");
    let recorded = c.ok("dpkg-statoverride --list /etc/tapegate/config.toml");
    assert_eq!(
        recorded.trim(),
        "root tapegate 640 /etc/tapegate/config.toml"
    );
    // An admin's choice stays when the package is configured again (an upgrade).
    c.ok("dpkg-statoverride --remove /etc/tapegate/config.toml && dpkg-statoverride --update --add root root 0600 /etc/tapegate/config.toml");
    c.ok("/var/lib/dpkg/info/tapegate.postinst configure 0.1.0-1");
    assert_eq!(
        mode(c).trim(),
        "root:root 600",
        "postinst overrode the admin"
    );
    c.ok("dpkg-statoverride --remove /etc/tapegate/config.toml && dpkg-statoverride --update --add root tapegate 0640 /etc/tapegate/config.toml");
    assert_eq!(mode(c).trim(), "root:tapegate 640");

    assert!(c.file("/etc/tapegate/config.d").is_dir());
    for page in [
        "tapegate.1.gz",
        "tapegate-run.1.gz",
        "tapegate-device-add.1.gz",
    ] {
        let path = c.file(&format!("/usr/share/man/man1/{page}"));
        assert!(path.is_file(), "no {}", path.display());
    }
    assert!(
        !c.file("/usr/share/man/man1/tapegate-demo.1.gz").exists(),
        "a page for a command the package lacks"
    );
    for (file, says) in [
        (
            "/usr/share/bash-completion/completions/tapegate",
            "_tapegate",
        ),
        (
            "/usr/share/zsh/vendor-completions/_tapegate",
            "#compdef tapegate",
        ),
        (
            "/usr/share/fish/vendor_completions.d/tapegate.fish",
            "complete -c tapegate",
        ),
    ] {
        let text = std::fs::read_to_string(c.file(file)).unwrap_or_default();
        assert!(
            text.contains(says),
            "{file}: {}",
            &text[..text.len().min(200)]
        );
    }
}

/// A private CA that IT adds with `update-ca-certificates` (a TLS-inspecting proxy's) is
/// trusted without `ca_file`; before it is added, the same server is an unknown issuer.
pub fn a_ca_added_to_the_system_store_is_trusted(
    c: &Container,
    rt: &tokio::runtime::Runtime,
    service: &MockHandle,
) {
    let (port, ca_pem) = common::tls::tls_front(rt, service.addr(), false);
    let https = format!("https://localhost:{port}");
    let text = config(service)
        .replace(
            &service.base_url("ppe").to_string(),
            &format!("{https}/ppe/"),
        )
        .replace(
            &service.auth_url("ppe").to_string(),
            &format!("{https}/ppe/oauth/token"),
        );
    assert!(text.contains(&https), "{text}");
    // The certificate names `localhost`, which a Debian installer's /etc/hosts names
    // (debootstrap's minimal root has none).
    c.ok("grep -qw localhost /etc/hosts 2>/dev/null || echo '127.0.0.1 localhost' >> /etc/hosts");
    std::fs::create_dir_all(c.file("/root/tls")).unwrap();
    c.write("/root/tls/config.toml", &text);
    c.ok("cp /etc/tapegate/password /root/tls/password");
    let check = |c: &Container| c.sh("tapegate check --config /root/tls/config.toml");

    let before = check(c);
    let said = String::from_utf8_lossy(&before.stdout).into_owned();
    assert!(
        !before.status.success() && said.contains("unknown issuer"),
        "{said}"
    );

    c.write(
        "/usr/local/share/ca-certificates/tapegate-test-proxy.crt",
        &ca_pem,
    );
    c.ok("update-ca-certificates");
    let after = check(c);
    let said = String::from_utf8_lossy(&after.stdout).into_owned();
    assert!(after.status.success(), "{said}");
    assert!(
        said.contains("trust            the system's store"),
        "{said}"
    );

    c.ok("rm -r /root/tls /usr/local/share/ca-certificates/tapegate-test-proxy.crt && update-ca-certificates --fresh");
}

/// `apt-get remove` keeps the state, the password and the config; `apt-get purge`
/// removes what the package made: the password, the ownership record, the drop-in
/// directory, the state directory, the config.
pub fn remove_keeps_and_purge_removes_what_the_package_made(c: &Container) {
    c.ok("DEBIAN_FRONTEND=noninteractive apt-get remove -y -q tapegate");
    for kept in [
        "/etc/tapegate/password",
        "/etc/tapegate/config.toml",
        "/var/lib/tapegate/outbox.db",
    ] {
        assert!(c.file(kept).exists(), "remove took {kept}");
    }
    c.ok("DEBIAN_FRONTEND=noninteractive apt-get purge -y -q tapegate");
    for gone in [
        "/etc/tapegate/password",
        "/etc/tapegate/config.toml",
        "/etc/tapegate/config.d",
        "/var/lib/tapegate",
    ] {
        assert!(!c.file(gone).exists(), "purge left {gone}");
    }
    let record = c.sh("dpkg-statoverride --list /etc/tapegate/config.toml");
    assert!(!record.status.success(), "purge left the ownership record");
    // Whatever the earlier checks left there is the test's, not the package's.
    c.ok("rm -rf /etc/tapegate");
}
