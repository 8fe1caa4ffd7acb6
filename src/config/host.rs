/*!
The machine's side of loading a config: what validation needs besides the file (the
host name, the credentials directory) and the one file the config points to (the
password file). `load` reads these; validation is handed them, so that it does no I/O
and tests can hand it any machine they like.
The only room of config that reads the machine.
*/

use std::path::{Path, PathBuf};

use crate::util::secret::Secret;

/// What validation needs to know about the machine it runs on.
#[derive(Debug, Clone)]
pub struct Host {
    /// The default `gateway.id`.
    pub hostname: String,
    /// `$CREDENTIALS_DIRECTORY`: where systemd's `LoadCredential=` puts credentials, and
    /// where a relative `password_file` is looked up when it is set.
    pub credentials_dir: Option<PathBuf>,
}

impl Host {
    /// This machine: its host name (`tapegate` when it cannot be read) and the credentials
    /// directory systemd gave this process, if any.
    pub fn from_system() -> Host {
        Host::from_facts(
            std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
            std::env::var_os("CREDENTIALS_DIRECTORY"),
        )
    }

    /// The host that these facts describe: the kernel's host name file as read (if it
    /// could be) and `$CREDENTIALS_DIRECTORY` (if set). Pure, so tests give it any
    /// machine instead of reading the one they run on.
    pub fn from_facts(
        hostname_file: Option<String>,
        credentials_directory: Option<std::ffi::OsString>,
    ) -> Host {
        let hostname = hostname_file
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "tapegate".into());
        Host {
            hostname,
            credentials_dir: credentials_directory.map(PathBuf::from),
        }
    }

    /// Where `password_file` is for the config at `config_path`: a relative path names
    /// a credential of the unit (in the credentials directory) when there is one, and
    /// otherwise a file beside the config. So `password_file = "password"` is the
    /// credential under the unit (`LoadCredential=password:/etc/tapegate/password`) and
    /// that same root-only file for `sudo tapegate check` outside it.
    pub fn password_path(&self, file: &Path, config_path: &Path) -> PathBuf {
        if file.is_absolute() {
            return file.to_path_buf();
        }
        match &self.credentials_dir {
            Some(dir) => dir.join(file),
            None => config_path
                .parent()
                .map_or_else(|| file.to_path_buf(), |dir| dir.join(file)),
        }
    }
}

/// A password file as it was read: where, and what it held (or why it could not be
/// read). Validation turns it into the password or a problem naming the key.
#[derive(Debug)]
pub struct PasswordFile {
    pub path: PathBuf,
    pub contents: std::io::Result<Secret>,
}

impl PasswordFile {
    pub fn read(path: PathBuf) -> PasswordFile {
        let contents = std::fs::read_to_string(&path).map(Secret::new);
        PasswordFile { path, contents }
    }
}

/// The CA file as it was read: where, and its bytes (or why it could not be read).
#[derive(Debug)]
pub struct CaFileRead {
    pub path: PathBuf,
    pub contents: std::io::Result<Vec<u8>>,
}

impl CaFileRead {
    pub fn read(path: &Path) -> CaFileRead {
        CaFileRead {
            path: path.to_path_buf(),
            contents: std::fs::read(path),
        }
    }
}

/// A warning when the config file at `path` holds a password inline (any
/// `[service.environments.*]` with `password`) and every user of the machine may read
/// it; `None` otherwise, or when the file cannot be read.
pub fn world_readable_password(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    if mode & 0o004 == 0 {
        return None;
    }
    let table: toml::Table = std::fs::read_to_string(path).ok()?.parse().ok()?;
    let envs = table.get("service")?.get("environments")?.as_table()?;
    let inline: Vec<&String> = envs
        .iter()
        .filter(|(_, e)| e.get("password").is_some())
        .map(|(name, _)| name)
        .collect();
    (!inline.is_empty()).then(|| {
        format!(
            "{} is readable by every user (mode {:o}) and holds a password inline (environment {}): use password_file, or chmod o-r it",
            path.display(),
            mode & 0o777,
            inline.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_support::{parse, parse_on, problems, SERVICE};

    #[test]
    fn password_file_is_read_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "from-file\n").unwrap();
        let text = SERVICE.replace(
            "password = \"s3cr3t-value\"",
            &format!("password_file = \"{}\"", file.display()),
        );
        let c = parse(&text, &[]).unwrap();
        assert_eq!(c.service.unwrap().endpoint.password.expose(), "from-file");
        let missing = text.replace(&file.display().to_string(), "/nonexistent/pw");
        let p = problems(&missing, &[]);
        assert!(
            p[0].to_string().contains("password_file = /nonexistent/pw"),
            "{:?}",
            p[0]
        );
    }

    #[test]
    fn a_relative_password_file_is_looked_up_in_the_credentials_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("password"), "from-credentials\n").unwrap();
        let host = Host {
            hostname: "test-host".into(),
            credentials_dir: Some(dir.path().to_path_buf()),
        };
        let text = SERVICE.replace(
            "password = \"s3cr3t-value\"",
            "password_file = \"password\"",
        );
        let c = parse_on(&text, &[], &host).unwrap();
        assert_eq!(
            c.service.unwrap().endpoint.password.expose(),
            "from-credentials"
        );
        // An absolute path is taken as written.
        let absolute = Path::new("/etc/tapegate/password");
        let config = Path::new("/etc/tapegate/config.toml");
        assert_eq!(host.password_path(absolute, config), absolute);
    }

    #[test]
    fn outside_the_unit_a_relative_password_file_is_beside_the_config() {
        let host = Host {
            hostname: "test-host".into(),
            credentials_dir: None,
        };
        let config = Path::new("/etc/tapegate/config.toml");
        assert_eq!(
            host.password_path(Path::new("password"), config),
            Path::new("/etc/tapegate/password")
        );
        assert_eq!(
            host.password_path(Path::new("password"), Path::new("config.toml")),
            Path::new("password")
        );
    }

    #[test]
    fn an_inline_password_in_a_world_readable_file_is_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, SERVICE).unwrap();
        let chmod = |mode| std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode));
        chmod(0o644).unwrap();
        let warning = world_readable_password(&file).expect("a warning");
        assert!(
            warning.contains("ppe") && warning.contains("644"),
            "{warning}"
        );
        assert!(!warning.contains("s3cr3t-value"), "{warning}");
        chmod(0o640).unwrap();
        assert_eq!(world_readable_password(&file), None);
        let by_file = SERVICE.replace("password = \"s3cr3t-value\"", "password_file = \"pw\"");
        std::fs::write(&file, by_file).unwrap();
        chmod(0o644).unwrap();
        assert_eq!(world_readable_password(&file), None);
    }

    /// A machine always has a name and a credentials directory only when systemd gave one.
    #[test]
    fn a_machine_has_a_name_and_credentials_only_from_systemd() {
        let host = Host::from_facts(
            Some("dock-7\n".into()),
            Some("/run/credentials/tapegate.service".into()),
        );
        assert_eq!(host.hostname, "dock-7");
        assert_eq!(
            host.credentials_dir.as_deref(),
            Some(Path::new("/run/credentials/tapegate.service"))
        );
        for unreadable in [None, Some(String::new()), Some(" \n".into())] {
            let host = Host::from_facts(unreadable.clone(), None);
            assert_eq!(host.hostname, "tapegate", "{unreadable:?}");
            assert_eq!(host.credentials_dir, None);
        }
    }
}
