//! `tapegate support-bundle` through the real binary: the archive is a real `.tar.gz`
//! that the system's `tar` extracts, it holds what support needs, and no secret of the
//! config is in any of its files, in any form text can take (as is, JSON-escaped,
//! percent-encoded, base64, a basic-auth header), whether the secret is inline, in a
//! file or in the environment, and even when it already leaked into the state database
//! or the journal.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use common::{tape_advert, tape_mac, Gateway, T0_MS};
use tapegate::outbox::{Seeder, StateReader, StoreOptions};

/// Distinctive secrets, with characters that JSON and URLs write differently.
const SERVICE_INLINE: &str = "pw-INLINE 7/+@:q";
const SERVICE_FILE: &str = "pw-FILE \"8\"\\back";
const SERVICE_FILE_2: &str = "pw-FILE2 9&=?x";
const TELEMETRY_INLINE: &str = "tele-INLINE 3/%z";
const TELEMETRY_FILE: &str = "tele-FILE 4\"#y";
const TOKEN_FILE: &str = "tok-FILE 5/=w";
const TOKEN_ENV: &str = "tok-ENV 6+&v";
const ALL: [&str; 7] = [
    SERVICE_INLINE,
    SERVICE_FILE,
    SERVICE_FILE_2,
    TELEMETRY_INLINE,
    TELEMETRY_FILE,
    TOKEN_FILE,
    TOKEN_ENV,
];
/// Every way text can carry `s` (computed here, independently of the command), with
/// the `users` of its config in a basic-auth header.
fn forms_with(s: &str, users: &[&str]) -> Vec<String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let json = serde_json::to_string(s).unwrap();
    let pct = |space_plus: bool| -> String {
        s.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' if space_plus => "+".into(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let mut f = vec![
        s.to_string(),
        json[1..json.len() - 1].to_string(),
        pct(false),
        pct(true),
        b64.encode(s),
    ];
    for u in users {
        f.push(b64.encode(format!("{u}:{s}")));
    }
    f
}

fn forms(s: &str) -> Vec<String> {
    forms_with(s, &[])
}

fn service(env_name: &str, password_line: &str) -> String {
    format!(
        "[service.environments.{env_name}]\nbase_url = \"https://api.example.com/\"\nauth_url = \"https://auth.example.com/oauth/token\"\nclient_id = \"cid\"\naudience = \"aud\"\nusername = \"gw-user\"\n{password_line}\ncustomer_id = \"cust\"\nauthorized_groups = \"grp\"\n"
    )
}

/// A `journalctl` that prints what a journal holding `leaked` secrets would.
fn fake_journalctl(dir: &Path, leaked: &[&str]) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let mut lines = vec![serde_json::json!({
        "PRIORITY": "4", "MESSAGE": "service unreachable: connection refused", "_SYSTEMD_UNIT": "tapegate.service"
    })
    .to_string()];
    for s in leaked {
        lines.push(
            serde_json::json!({"PRIORITY": "3", "MESSAGE": format!("leaked {s} and {}", forms(s)[2])})
                .to_string(),
        );
    }
    let script = bin.join("journalctl");
    let data = dir.join("journal.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    std::fs::write(&script, format!("#!/bin/sh\ncat '{}'\n", data.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// Runs `support-bundle` for `g` with `path_env` as PATH and `env` set; extracts the
/// archive and returns (extracted dir, every file's bytes).
fn bundle(g: &Gateway, path_env: &str, env: &[(&str, &str)]) -> (PathBuf, Vec<(PathBuf, Vec<u8>)>) {
    let out_file = g.path("bundle.tar.gz");
    let _ = std::fs::remove_file(&out_file);
    let output = format!("--output={}", out_file.display());
    let mut cmd = g.command(&["support-bundle", &output]);
    cmd.env("PATH", path_env);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "support-bundle failed: {}{}",
        common::text(&out.stdout),
        common::text(&out.stderr)
    );
    let stdout = common::text(&out.stdout);
    for s in ALL {
        assert!(!stdout.contains(s) && !common::text(&out.stderr).contains(s));
    }
    let dest = g.path("extracted");
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir_all(&dest).unwrap();
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(&out_file)
        .arg("-C")
        .arg(&dest)
        .output()
        .unwrap();
    assert!(tar.status.success(), "{tar:?}");
    let mut files = Vec::new();
    let mut stack = vec![dest.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    // Every byte of the archive too, compressed or not.
    files.push((out_file.clone(), std::fs::read(&out_file).unwrap()));
    (dest, files)
}

fn assert_no_secret(files: &[(PathBuf, Vec<u8>)], users: &[&str]) {
    for s in ALL {
        for form in forms_with(s, users) {
            for (path, bytes) in files {
                assert!(
                    !bytes.windows(form.len()).any(|w| w == form.as_bytes()),
                    "{form:?} (a form of a secret) is in {}",
                    path.display()
                );
            }
        }
    }
}

fn find<'a>(files: &'a [(PathBuf, Vec<u8>)], suffix: &str) -> Option<&'a str> {
    files
        .iter()
        .find(|(p, _)| p.to_string_lossy().ends_with(suffix))
        .map(|(_, b)| std::str::from_utf8(b).unwrap())
}

#[test]
fn the_bundle_holds_what_support_needs_and_no_secret_in_any_form() {
    let g = Gateway::new("");
    let secret_dir = g.path("secrets");
    std::fs::create_dir_all(&secret_dir).unwrap();
    let write = |name: &str, s: &str| {
        let p = secret_dir.join(name);
        std::fs::write(&p, format!("{s}\n")).unwrap();
        p
    };
    let service_file = write("service-pw", SERVICE_FILE);
    let service_file_2 = write("service-pw-2", SERVICE_FILE_2);
    let telemetry_file = write("telemetry-pw", TELEMETRY_FILE);
    let token_file = write("token", TOKEN_FILE);

    // Four configs, between them every secret key inline, in a file and in the
    // environment.
    let state = g.state_dir();
    let head = format!(
        "[gateway]\nid = \"dock-help\"\nstate_dir = \"{}\"\n[scanner]\nsource = \"sim\"\n[service]\nenvironment = \"ppe\"\n",
        state.display()
    );
    // (config text, environment, the secrets it holds)
    type Case<'a> = (String, Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let configs: Vec<Case> = vec![
        (
            format!(
                "{head}{}{}[telemetry]\nurl = \"https://r.example/push\"\nusername = \"tele-user\"\npassword = \"{TELEMETRY_INLINE}\"\n",
                service("ppe", &format!("password = \"{SERVICE_INLINE}\"")),
                service("production", &format!("password_file = \"{}\"", service_file.display())),
            ),
            vec![],
            vec![SERVICE_INLINE, SERVICE_FILE, TELEMETRY_INLINE],
        ),
        (
            format!(
                "{head}{}[telemetry]\nurl = \"https://r.example/push\"\nbearer_token_file = \"{}\"\n",
                service("ppe", &format!("password_file = \"{}\"", service_file_2.display())),
                token_file.display()
            ),
            vec![],
            vec![SERVICE_FILE_2, TOKEN_FILE],
        ),
        (
            format!(
                "{head}{}[telemetry]\nurl = \"https://r.example/push\"\nusername = \"tele-user\"\npassword_file = \"{}\"\n",
                service("ppe", &format!("password = \"{SERVICE_INLINE}\"")),
                telemetry_file.display()
            ),
            vec![],
            vec![SERVICE_INLINE, TELEMETRY_FILE],
        ),
        (
            format!(
                "{head}{}[telemetry]\nurl = \"https://r.example/push\"\n",
                service("ppe", &format!("password = \"{SERVICE_INLINE}\""))
            ),
            vec![("TAPEGATE_TELEMETRY__BEARER_TOKEN", TOKEN_ENV)],
            vec![SERVICE_INLINE, TOKEN_ENV],
        ),
    ];

    // A state database with captures.
    {
        let (mut store, _) = Seeder::open(&state, StoreOptions::default()).unwrap();
        let captures: Vec<_> = (0..3)
            .map(|i| {
                let a = tape_advert(tape_mac(i), T0_MS + i64::from(i), 1);
                tapegate::record::Capture {
                    rssi: a.rssi,
                    ..common::fixture::capture(a.mac, a.ts_ms, "F70E")
                }
            })
            .collect();
        store.enqueue(&captures).unwrap();
    }

    let mut covered = Vec::new();
    for (i, (text, env, secrets)) in configs.iter().enumerate() {
        covered.extend(secrets.iter().copied());
        std::fs::write(g.config_path(), text).unwrap();
        let check = g
            .command(&["check", "--config-only"])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(check.status.success(), "config {i}: {check:?}");
        // Every secret of this config has leaked, in every form, into the last error,
        // a dead letter and the journal (as a careless older version might have let it).
        let users: &[&str] = if text.contains("tele-user") {
            &["gw-user", "tele-user"]
        } else {
            &["gw-user"]
        };
        let leaked: Vec<String> = secrets.iter().flat_map(|s| forms_with(s, users)).collect();
        let c = rusqlite::Connection::open(StateReader::path_in(&state)).unwrap();
        c.execute("DELETE FROM dead_letters", []).unwrap();
        c.execute(
            "INSERT INTO dead_letters(mac, captured_at, product_id, packet, rssi, error, dead_at)
             VALUES (1, ?1, 'tape', 'F70E', -60, ?2, ?1)",
            rusqlite::params![T0_MS, format!("refused: {}", leaked.join(" "))],
        )
        .unwrap();
        c.execute(
            "INSERT INTO meta(key, value) VALUES ('last_error', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            [format!("service said {}", leaked.join(" | "))],
        )
        .unwrap();
        drop(c);
        let journal_bin = fake_journalctl(g.dir.path(), secrets);
        let path_env = format!(
            "{}:{}",
            journal_bin.display(),
            std::env::var("PATH").unwrap()
        );
        let (_, files) = bundle(&g, &path_env, env);
        assert_no_secret(&files, users);
        let effective = find(&files, "config/effective.toml").expect("effective config");
        assert!(effective.contains("<redacted>"), "{effective}");
        assert!(effective.contains("max_batch = 250"), "{effective}");
        assert!(effective.contains("[telemetry]"), "{effective}");
        let journal = find(&files, "journal.json").expect("journal records");
        assert!(
            journal.contains("service unreachable: connection refused"),
            "{journal}"
        );
        let status: serde_json::Value =
            serde_json::from_str(find(&files, "status.json").unwrap()).unwrap();
        assert_eq!(status["pending"], 3, "{status}");
        assert_eq!(status["gateway_id"], "dock-help");
        let dead: serde_json::Value =
            serde_json::from_str(find(&files, "dead-letters.json").unwrap()).unwrap();
        assert_eq!(dead["stored"], 1, "{dead}");
        for name in [
            "README.txt",
            "scanner.json",
            "versions.json",
            "clock.json",
            "config/file.toml",
            "config/environment.txt",
        ] {
            assert!(find(&files, name).is_some(), "config {i}: no {name}");
        }
        let readme = find(&files, "README.txt").unwrap();
        assert!(readme.contains("gateway       dock-help"), "{readme}");
        let versions = find(&files, "versions.json").unwrap();
        assert!(versions.contains(env!("CARGO_PKG_VERSION")), "{versions}");
    }

    covered.sort();
    covered.dedup();
    assert_eq!(covered.len(), ALL.len(), "every secret is in some config");

    // Without journalctl the bundle says so instead of failing.
    let empty = g.path("empty-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let last_env = &configs[configs.len() - 1].1;
    let (_, files) = bundle(&g, &empty.display().to_string(), last_env);
    assert_no_secret(&files, &["gw-user"]);
    let note = find(&files, "journal.txt").expect("a note on the journal");
    assert!(note.contains("journalctl cannot be run"), "{note}");
    assert!(find(&files, "README.txt")
        .unwrap()
        .contains("no journal records"));
}

#[test]
fn a_refused_config_still_gives_a_bundle_that_says_why() {
    let g = Gateway::new("[flush]\nmax_batch = 300\n[service]\nenvironment = \"nowhere\"\n");
    let out_file = g.path("b.tar.gz");
    let output = format!("--output={}", out_file.display());
    let out = g.command(&["support-bundle", &output]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let list = Command::new("tar")
        .arg("-xzOf")
        .arg(&out_file)
        .output()
        .unwrap();
    let all = common::text(&list.stdout);
    assert!(all.contains("flush.max_batch = 300"), "{all}");
    assert!(all.contains("the config is refused"), "{all}");
}
