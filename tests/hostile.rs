//! Hostile answers and hostile states (issue 9), through the real binary: a token
//! endpoint that answers absurd lifetimes or unsendable tokens, a stage that dies, two
//! daemons on one state directory, the database pulled away, secrets in odd places. The
//! mock runs on its own runtime in this process; the daemon is a child process talking
//! to it over loopback, with a real SQLite file.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{
    eventually, mock_service_section, mock_with, tape_advert, tape_mac, text, write_records,
    Gateway, T0_MS,
};
use tapegate_mock::{MockConfig, MockEnvironment, MockHandle};

/// Longest any daemon here may take to do its work.
const LIMIT: Duration = Duration::from_secs(40);

fn mock_on_own_runtime() -> (tokio::runtime::Runtime, MockHandle) {
    mock_with(MockConfig::demo())
}

/// A gateway replaying `n` captures of distinct tapes into the mock, dedup off.
fn replaying(mock: &MockHandle, n: u32) -> Gateway {
    let g = Gateway::new("");
    g.write_config(&(mock_service_section(mock) + &replay_section(&g, n)));
    g
}

/// The sections of a replay of `n` captures of distinct tapes (written into the
/// gateway's dir), dedup off, quick commits.
fn replay_section(g: &Gateway, n: u32) -> String {
    let trace = g.path("trace.jsonl");
    let adverts: Vec<_> = (0..n)
        .map(|i| tape_advert(tape_mac(i), T0_MS + i64::from(i), 1))
        .collect();
    write_records(&trace, &adverts);
    format!(
        "\n[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n\n[dedup]\nwindow_secs = 0\nmin_interval_secs = 0\n\n[outbox]\ncommit_interval_ms = 20\n",
        trace.display()
    )
}

/// Runs `tapegate <args>` to its end (at most [`LIMIT`]); the exit status and the log.
fn run_to_exit(
    g: &Gateway,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String) {
    let mut child = g
        .command(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tapegate starts");
    let (log, reader) = common::collect_stderr(&mut child);
    let status = eventually(LIMIT, || child.try_wait().unwrap());
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{args:?}: no exit within {LIMIT:?}:\n{}",
            log.lock().unwrap()
        );
    };
    let _ = reader.join();
    let log = log.lock().unwrap().clone();
    (status, log)
}

fn run_until_drained(g: &Gateway, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    run_to_exit(g, &["run", "--until-drained"], env)
}

#[test]
fn a_token_lifetime_of_1e20_seconds_is_clamped_and_everything_is_delivered() {
    let (_rt, mock) = mock_on_own_runtime();
    mock.set_answered_expires_in(Some(serde_json::json!(1e20)));
    let g = replaying(&mock, 20);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(g.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (status, log) = run_until_drained(&g, &[]);
    assert!(status.success(), "{status}:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("expires_in is out of range"), "{log}");
    // The config, readable by all, holds the mock's password inline: said at start.
    assert!(
        log.contains("WARN") && log.contains("is readable by every user"),
        "{log}"
    );
    let s = g.stats();
    assert_eq!((s.admitted, s.delivered, s.pending), (20, 20, 0));
    assert_eq!(mock.token_grants(), 1, "one grant serves the whole run");
}

#[test]
fn a_token_a_header_cannot_carry_is_not_cached_and_the_grant_backs_off() {
    let (_rt, mock) = mock_on_own_runtime();
    mock.set_token_text(Some("bad\ntoken".into()));
    let g = replaying(&mock, 5);
    let mut daemon = g
        .command(&["run"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tapegate starts");
    let (log, _reader) = common::collect_stderr(&mut daemon);
    // Reported, and asked again only after a backoff: two grants take at least a second.
    let reported = eventually(LIMIT, || {
        (mock.token_requests() >= 2 && log.lock().unwrap().contains("HTTP header cannot carry"))
            .then_some(())
    });
    let _ = daemon.kill();
    let _ = daemon.wait();
    let log = log.lock().unwrap().clone();
    assert!(reported.is_some(), "{log}");
    assert_eq!(
        mock.decode_requests(),
        0,
        "no request left with the bad token"
    );
    assert!(
        !log.contains("bad\ntoken") && !log.contains("bad\\ntoken"),
        "{log}"
    );
}

#[test]
fn a_stage_that_panics_ends_the_daemon_non_zero_and_the_log_names_the_stage() {
    let (_rt, mock) = mock_on_own_runtime();
    let g = replaying(&mock, 5);
    // Without --until-drained the daemon would run forever: only the death ends it.
    let (status, log) = run_to_exit(&g, &["run"], &[("TAPEGATE_DEBUG_PANIC_STAGE", "flush")]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("the flush stage died"), "{log}");
    assert!(
        log.contains("asked the flush stage to panic"),
        "the panic's message: {log}"
    );
    // The other stages stopped in order: what was accepted stays pending, the file whole.
    let s = g.stats();
    assert_eq!(s.pending, s.admitted);
    assert_eq!(
        common::integrity_check(&g.state_dir().join("outbox.db")),
        "ok"
    );
}

/// A second daemon on the same state directory is refused, and operator commands still
/// work.
#[test]
fn a_second_daemon_on_the_same_state_directory_is_refused() {
    let g = Gateway::new(&common::stdin_replay_config(20));
    let mut first = common::Daemon::start(&g);
    first.send(&[tape_advert(tape_mac(1), T0_MS, 1)]);
    let pending = eventually(LIMIT, || {
        (g.try_stats().map(|s| s.pending) == Some(1)).then_some(())
    });
    assert!(pending.is_some(), "{}", first.stderr());

    let second = g.run(&["run"]);
    let err = text(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(err.contains(&g.state_dir().display().to_string()), "{err}");
    assert!(
        err.contains("already runs") && err.contains("(PID "),
        "{err}"
    );
    for args in [
        &["status", "--json"][..],
        &["tapes"],
        &["dead-letters", "list"],
        &["check", "--config-only"],
    ] {
        let out = g.run(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    assert!(first.is_running());
    let (status, log) = first.terminate(LIMIT);
    assert!(status.success(), "{log}");
    assert_eq!(g.stats().pending, 1, "the refused daemon touched nothing");
}

/// A TOML syntax error on the password line names the line but never echoes the
/// password.
#[test]
fn a_toml_error_on_the_password_line_never_echoes_the_password() {
    let g = Gateway::new(
        "[service.environments.ppe]\nusername = \"gw\"\npassword = \"hunter2-is-secret\n",
    );
    for args in [&["check", "--config-only"][..], &["run"]] {
        let out = g.run(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("hunter2"), "{args:?}: {err}");
        assert!(
            err.contains("line 8") && err.contains("`password`"),
            "{err}"
        );
    }
}

#[test]
fn a_password_override_of_1e3_reaches_the_grant_as_the_string_1e3() {
    let env = MockEnvironment {
        password: "1e3".to_string(),
        ..MockEnvironment::demo()
    };
    let (_rt, mock) = mock_with(MockConfig {
        environments: vec![env],
        ..MockConfig::demo()
    });
    let g = replaying(&mock, 3);
    let config = std::fs::read_to_string(g.config_path()).unwrap();
    let without = config.replace("password = \"1e3\"\n", "");
    assert_ne!(config, without, "the password line was taken out");
    std::fs::write(g.config_path(), without).unwrap();
    let (status, log) = run_until_drained(
        &g,
        &[("TAPEGATE_SERVICE__ENVIRONMENTS__PPE__PASSWORD", "1e3")],
    );
    assert!(status.success(), "{log}");
    // The mock grants only to the exact password, so a grant is the proof.
    assert_eq!(
        (mock.token_requests(), mock.token_grants()),
        (1, 1),
        "{log}"
    );
    assert_eq!(g.stats().delivered, 3);
}

/// A gateway whose service is reached at `base` (the mock's environment "ppe" under it),
/// replaying one capture.
fn reaching(mock: &MockHandle, base: &str, service_extra: &str) -> Gateway {
    let section = mock_service_section(mock)
        .replace(&mock.base_url("ppe").to_string(), &format!("{base}/ppe/"))
        .replace(
            &mock.auth_url("ppe").to_string(),
            &format!("{base}/ppe/oauth/token"),
        )
        .replace("[service]\n", &format!("[service]\n{service_extra}"));
    let g = Gateway::new("");
    g.write_config(&(section + &replay_section(&g, 1)));
    g
}

/// TLS to a server of an unknown CA fails as unknown issuer, works with `ca_file`, and
/// names a name mismatch.
#[test]
fn tls_to_an_unknown_ca_fails_as_unknown_issuer_and_works_with_ca_file() {
    let (rt, mock) = mock_on_own_runtime();
    let (port, ca_pem) = common::tls::tls_front(&rt, mock.addr(), false);
    let base = format!("https://localhost:{port}");

    let g = reaching(&mock, &base, "");
    let out = g.run(&["check"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("unknown issuer"), "{said}");

    // The running daemon says the same in `status`.
    let mut daemon = g
        .command(&["run"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tapegate starts");
    let last_error = eventually(LIMIT, || {
        let e = g.try_stats()?.last_error?;
        e.contains("unknown issuer").then_some(e)
    });
    let _ = daemon.kill();
    let _ = daemon.wait();
    let last_error = last_error.expect("status names the unknown issuer");
    assert!(last_error.contains("TLS failure"), "{last_error}");

    let ca = g.path("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let g = reaching(&mock, &base, &format!("ca_file = \"{}\"\n", ca.display()));
    let out = g.run(&["check"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(mock.token_grants() >= 1);

    // The same server by address: the CA is trusted, but the certificate names another host.
    let by_address = format!("https://127.0.0.1:{port}");
    let ca_file = format!("ca_file = \"{}\"\n", ca.display());
    let g = reaching(&mock, &by_address, &ca_file);
    let out = g.run(&["check"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("name mismatch"), "{said}");
}

/// A CA the system trusts (here through `SSL_CERT_FILE`, where `update-ca-certificates`
/// would put it in `/etc/ssl/certs`; the container test does that) is trusted without a
/// `ca_file`: a TLS-inspecting proxy's CA that IT installed, a renewed root.
#[test]
fn a_ca_in_the_systems_trust_store_is_trusted_without_ca_file() {
    let (rt, mock) = mock_on_own_runtime();
    let (port, ca_pem) = common::tls::tls_front(&rt, mock.addr(), false);
    let g = reaching(&mock, &format!("https://localhost:{port}"), "");
    let store = g.path("system-store.pem");
    std::fs::write(&store, ca_pem).unwrap();
    let out = g
        .command(&["check"])
        .env("SSL_CERT_FILE", &store)
        .env_remove("SSL_CERT_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("trust            the system's store (1 certificate authorities)"),
        "{said}"
    );
    assert!(mock.token_grants() >= 1);
}

#[test]
fn http_proxy_is_used_and_no_proxy_bypasses_it() {
    let (_rt, mock) = mock_on_own_runtime();
    let g = Gateway::new(&mock_service_section(&mock));
    // Nothing listens on the proxy's port: going through it is "connection refused".
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = format!("http://127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let check = |no_proxy: &str| {
        g.command(&["check"])
            .env("HTTP_PROXY", &proxy)
            .env("http_proxy", &proxy)
            .env("NO_PROXY", no_proxy)
            .env("no_proxy", no_proxy)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let through = check("");
    assert_eq!(through.status.code(), Some(1), "{}", text(&through.stdout));
    assert!(text(&through.stdout).contains("connection refused"));
    assert_eq!(mock.token_requests(), 0, "the proxy was bypassed");
    let bypassed = check("127.0.0.1");
    assert!(bypassed.status.success(), "{}", text(&bypassed.stdout));
}

/// `outbox.db` deleted under a running daemon is noticed, and a fresh one keeps what
/// follows.
#[test]
fn outbox_db_deleted_under_a_running_daemon_is_noticed_and_replaced() {
    let g = Gateway::new(&common::stdin_replay_config(20));
    let db = g.state_dir().join("outbox.db");
    let mut daemon = common::Daemon::start(&g);
    daemon.send(&[tape_advert(tape_mac(1), T0_MS, 1)]);
    let first = eventually(LIMIT, || (g.try_stats()?.pending == 1).then_some(()));
    assert!(first.is_some(), "{}", daemon.stderr());

    std::fs::remove_file(&db).unwrap();
    daemon.send(&[
        tape_advert(tape_mac(2), T0_MS + 1, 1),
        tape_advert(tape_mac(3), T0_MS + 2, 1),
    ]);
    let fresh = eventually(LIMIT, || (g.try_stats()?.pending == 2).then_some(()));
    assert!(fresh.is_some(), "{}", daemon.stderr());
    let (status, log) = daemon.terminate(LIMIT);
    assert!(status.success(), "{log}");
    assert!(
        log.contains("ERROR")
            && log.contains("the outbox database was deleted under the running daemon"),
        "{log}"
    );
    let rows = g.store().pending_captures().unwrap();
    let macs: Vec<_> = rows.iter().map(|r| r.capture.mac).collect();
    assert_eq!(macs, [tape_mac(2), tape_mac(3)], "what came after is kept");
    assert_eq!(common::integrity_check(&db), "ok");
}

#[test]
fn check_sends_the_oldest_waiting_capture_and_warns_about_a_doubled_base_url() {
    let (_rt, mock) = mock_on_own_runtime();
    // Captured without a service: the two captures wait in the outbox.
    let g = Gateway::new("");
    g.write_config(&replay_section(&g, 2));
    let (status, log) = run_until_drained(&g, &[]);
    assert!(status.success(), "{log}");
    assert_eq!(g.stats().pending, 2);

    let config = mock_service_section(&mock) + &replay_section(&g, 2);
    g.write_config(&config);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(g.config_path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = g.run(&["check"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "a warning fails nothing: {said}");
    assert!(
        said.contains("warn password") && said.contains("readable by every user"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "decoded the oldest capture waiting in the outbox (tape {})",
            tape_mac(0)
        )),
        "{said}"
    );
    let sent = mock.received();
    assert_eq!(sent.last().unwrap().items[0].mac_id, tape_mac(0).plain());

    let doubled = config.replace(
        &mock.base_url("ppe").to_string(),
        &format!("{}external/", mock.base_url("ppe")),
    );
    g.write_config(&doubled);
    let out = g.run(&["check"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("warn base_url") && said.contains("/external twice"),
        "{said}"
    );
}

#[test]
fn a_wire_mistake_is_an_item_error_the_operator_sees_not_a_silent_success() {
    let (_rt, mock) = mock_on_own_runtime();
    let g = Gateway::new("");
    let section =
        mock_service_section(&mock).replace("[service]\n", "[service]\nmac_format = \"colon\"\n");
    g.write_config(&(section + &replay_section(&g, 3)));
    let (status, log) = run_until_drained(&g, &[]);
    assert!(status.success(), "{log}");
    let s = g.stats();
    assert_eq!((s.delivered, s.dead_letters), (0, 3), "{log}");
    let listed = text(&g.run(&["dead-letters", "list"]).stdout);
    assert!(listed.contains("invalid mac_id format"), "{listed}");
}

#[test]
fn a_missing_permission_is_401_even_with_a_fresh_token_and_reported_as_such() {
    let (rt, mock) = mock_on_own_runtime();
    mock.set_decode_permission(false);
    let settings = common::service_settings(&mock, "ppe", Duration::from_secs(5)).unwrap();
    let client = tapegate::api::ServiceClient::new(&settings, tapegate::clock::system()).unwrap();
    let item = tapegate::api::BulkItem {
        mac_id: tape_mac(1).plain(),
        ble_packet: common::tape_packet(1),
        product_id: "tape".into(),
        scan_time: (T0_MS / 1000).to_string(),
    };
    let err = rt
        .block_on(client.decode_bulk(&[item], "perm-1"))
        .unwrap_err();
    assert!(
        matches!(err, tapegate::api::ApiError::Unauthorized { .. }),
        "{err:?}"
    );
    assert_eq!(err.operator_cause(), "credentials or permission");
    assert_eq!(mock.token_grants(), 2, "one fresh token was tried too");
}

#[test]
fn a_server_error_text_quoting_the_token_is_scrubbed_before_it_is_stored_or_shown() {
    let (_rt, mock) = mock_on_own_runtime();
    mock.set_token_text(Some("tok-SECRET-4242".into()));
    mock.set_echo_token_in_errors(true);
    mock.set_registry(tapegate_mock::Registry::Only(Default::default()));
    let g = replaying(&mock, 2);
    let (status, log) = run_until_drained(&g, &[]);
    assert!(status.success(), "{log}");
    assert_eq!(g.stats().dead_letters, 2, "{log}");
    let listed = text(&g.run(&["dead-letters", "list", "--json"]).stdout);
    assert!(
        listed.contains("device not found") && listed.contains("<redacted>"),
        "{listed}"
    );
    let status = text(&g.run(&["status", "--json"]).stdout);
    for shown in [&listed, &status, &log] {
        assert!(!shown.contains("tok-SECRET-4242"), "{shown}");
    }
}

#[test]
fn a_host_that_does_not_resolve_is_an_unknown_host_not_just_unreachable() {
    let (_rt, mock) = mock_on_own_runtime();
    // `.invalid` never resolves (RFC 6761), with or without a network.
    let g = reaching(&mock, "https://tapegate-test.invalid", "");
    let out = g.run(&["check"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("unknown host"), "{said}");
    assert_eq!(mock.token_requests(), 0);
}

#[test]
fn tls_with_an_expired_certificate_says_certificate_expired() {
    let (rt, mock) = mock_on_own_runtime();
    let (port, ca_pem) = common::tls::tls_front(&rt, mock.addr(), true);
    let g = Gateway::new("");
    let ca = g.path("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();
    let ca_file = format!("ca_file = \"{}\"\n", ca.display());
    let g = reaching(&mock, &format!("https://localhost:{port}"), &ca_file);
    let out = g.run(&["check"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("certificate expired"), "{said}");
}

// ---------------------------------------------------------------------------------
// Smaller things a user trips on (issue 20)
// ---------------------------------------------------------------------------------

/// A pipe whose reader has gone, as `2>&1 | head -1` leaves it once `head` exits: the
/// stdout and stderr of a command.
fn closed_pipe() -> (Stdio, Stdio) {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills both descriptors, which are then owned here alone.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    let err = writer.try_clone().unwrap();
    (Stdio::from(writer), Stdio::from(err))
}

#[test]
fn a_closed_stderr_is_no_panic_for_an_error_or_for_the_log() {
    let g = Gateway::new("");
    // `locate` without a [service] fails at once: its reason goes to a closed stderr,
    // and it exits as it does with an open one (101 would be a panic).
    let (stdout, stderr) = closed_pipe();
    let status = g
        .command(&["locate", "AWB-1"])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .status()
        .unwrap();
    let open = g.run(&["locate", "AWB-1"]);
    assert!(!open.status.success(), "{}", text(&open.stderr));
    assert_eq!(status.code(), open.status.code(), "exit 101 is a panic");

    // The daemon logs to a closed stderr from start to end.
    let empty = g.path("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    g.write_config(&format!(
        "[scanner]\nsource = \"replay\"\nreplay_path = \"{}\"\n",
        empty.display()
    ));
    let (stdout, stderr) = closed_pipe();
    let status = g
        .command(&["run", "--until-drained"])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0), "exit 101 is a panic");
}

#[test]
fn an_error_and_its_cause_are_said_once_not_twice() {
    let g = Gateway::new("");
    std::fs::create_dir_all(g.state_dir()).unwrap();
    std::fs::write(
        tapegate::outbox::StateReader::path_in(&g.state_dir()),
        b"this is not a database, but it is long enough to be mistaken for one".repeat(100),
    )
    .unwrap();
    let out = g.run(&["status"]);
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert_eq!(said.matches("file is not a database").count(), 1, "{said}");
}

#[test]
fn run_until_drained_stopped_by_sigterm_with_captures_pending_exits_4_not_0() {
    let g = Gateway::new(&common::stdin_replay_config(20));
    let mut d = common::Daemon::start_with(&g, |c| {
        c.arg("--until-drained");
    });
    let adverts: Vec<_> = (0..3)
        .map(|i| tape_advert(tape_mac(i), T0_MS + i64::from(i), 1))
        .collect();
    d.send(&adverts);
    // No [service]: the captures stay pending; the replay's input stays open.
    eventually(LIMIT, || g.try_stats().filter(|s| s.pending == 3))
        .unwrap_or_else(|| panic!("not committed:\n{}", d.stderr()));
    let (status, log) = d.terminate(LIMIT);
    assert_eq!(status.code(), Some(75), "stopped, not drained:\n{log}");
    assert!(
        log.contains("stopped by a signal before the outbox was drained"),
        "{log}"
    );
    assert_eq!(g.stats().pending, 3);

    // Without --until-drained, SIGTERM is the normal end of a daemon: exit 0.
    let d = common::Daemon::start(&g);
    eventually(LIMIT, || d.stderr().contains("outbox open").then_some(())).unwrap();
    let (status, log) = d.terminate(LIMIT);
    assert_eq!(status.code(), Some(0), "{log}");
}

#[test]
fn state_files_are_created_0600_in_a_0700_directory_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let g = Gateway::new(&common::stdin_replay_config(20));
    let mut d = common::Daemon::start_with(&g, |c| {
        // SAFETY: umask(2) only, between fork and exec.
        unsafe {
            c.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
    });
    d.send(&[tape_advert(tape_mac(1), T0_MS, 1)]);
    eventually(LIMIT, || g.try_stats().filter(|s| s.pending == 1))
        .unwrap_or_else(|| panic!("not committed:\n{}", d.stderr()));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&g.state_dir()), 0o700, "the state directory");
    let db = tapegate::outbox::StateReader::path_in(&g.state_dir());
    for file in [
        db.clone(),
        db.with_extension("db-wal"),
        db.with_extension("db-shm"),
        g.state_dir().join(tapegate::outbox::LOCK_FILE),
    ] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    let (status, log) = d.terminate(LIMIT);
    assert!(status.success(), "{log}");
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Asserts `shown` holds no character that acts on a terminal or reorders text.
fn assert_inert(what: &str, shown: &str) {
    for c in ['\u{1b}', '\u{7}', '\u{202e}', '\u{9b}'] {
        assert!(!shown.contains(c), "{what} shows {c:?} raw: {shown:?}");
    }
}

#[cfg(debug_assertions)]
#[test]
fn service_texts_are_stored_and_shown_bounded_and_inert() {
    use tapegate_mock::MacFault;
    let (rt, mock) = mock_on_own_runtime();
    let huge = format!("refused: {}", "x".repeat(1_000_000));
    let hostile = "\u{1b}[2J\u{1b}[31mRED\u{202e}txet desrever\u{7}\u{9b}2J".to_string();
    mock.set_mac_fault(&tape_mac(1).plain(), Some(MacFault::ItemError(huge)));
    mock.set_mac_fault(&tape_mac(2).plain(), Some(MacFault::ItemError(hostile)));
    let port = free_port();
    let g = Gateway::new("");
    g.write_config(&format!(
        "{}{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
        mock_service_section(&mock),
        common::stdin_replay_config(20)
    ));
    let day = common::day::Day::one();
    day.set_on(&g);
    let mut d = common::Daemon::start(&g);
    let now = day.now_ms();
    d.send(&[
        tape_advert(tape_mac(1), now, 1),
        tape_advert(tape_mac(2), now, 1),
    ]);
    eventually(LIMIT, || g.try_stats().filter(|s| s.dead_letters == 2))
        .unwrap_or_else(|| panic!("not refused:\n{}", d.stderr()));

    // Stored bounded, as every other text from elsewhere.
    let db =
        rusqlite::Connection::open(tapegate::outbox::StateReader::path_in(&g.state_dir())).unwrap();
    let longest: i64 = db
        .query_row("SELECT MAX(length(error)) FROM dead_letters", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(
        longest <= 301,
        "a reason of {longest} characters was stored"
    );

    // The page: both tapes are heard now, each card with the service's reason.
    let page = rt
        .block_on(async {
            reqwest::get(format!("http://127.0.0.1:{port}/"))
                .await?
                .text()
                .await
        })
        .unwrap();
    assert!(page.len() < 64 * 1024, "the page is {} bytes", page.len());
    assert_inert("the page", &page);
    assert!(
        page.contains("\\e[2J") && page.contains("refused: xxx"),
        "{page}"
    );

    let listed = g.run(&["dead-letters", "list"]);
    let listed = text(&listed.stdout);
    assert!(
        listed.len() < 4 * 1024,
        "dead-letters list printed {} bytes",
        listed.len()
    );
    assert_inert("dead-letters list", &listed);
    assert!(
        listed.contains("\\e[31mRED\\u{202e}txet") && listed.contains("x…"),
        "{listed}"
    );

    // Arguments come back in tables and errors: inert too.
    let out = g.run(&["device", "show", "--qr", "TT\u{1b}]0;owned\u{7}\u{202e}QR"]);
    assert_inert("device show", &text(&out.stdout));
    assert_inert("device show's error", &text(&out.stderr));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("TT\\e]0;owned"), "{said}");
    // A refusal's message becomes the last error `status` shows.
    mock.push_fault(tapegate_mock::Fault::Refuse {
        status: 400,
        message: "Missing required headers \u{1b}[31mRED\u{202e}".into(),
    });
    d.send(&[tape_advert(tape_mac(3), now, 1)]);
    eventually(LIMIT, || {
        g.try_stats()
            .filter(|s| s.last_error.as_deref().is_some_and(|e| e.contains("RED")))
    })
    .unwrap_or_else(|| panic!("no last error:\n{}", d.stderr()));
    let status = text(&g.run(&["status"]).stdout);
    assert_inert("status", &status);
    assert!(status.contains("\\e[31mRED\\u{202e}"), "{status}");
    let out = g.run(&["locate", "AWB\u{1b}[2J\u{202e}1"]);
    assert!(!out.status.success());
    assert_inert("locate's error", &text(&out.stderr));
    assert!(
        text(&out.stderr).contains("AWB\\e[2J"),
        "{}",
        text(&out.stderr)
    );
    let (status, log) = d.terminate(LIMIT);
    assert!(status.success(), "{log}");
}

/// Asserts no encoding of the test password shows in `shown`.
fn assert_no_password(what: &str, shown: &str) {
    for part in [
        "Sup3rSecret",
        "3rSecretPw",
        "%53%75%70%33",
        "\\u0053\\u0075",
    ] {
        assert!(
            !shown.contains(part),
            "{what} shows the password ({part}): {shown}"
        );
    }
}

#[cfg(debug_assertions)]
#[test]
fn a_token_endpoint_echoing_the_password_form_encoded_shows_it_nowhere() {
    let env = MockEnvironment {
        password: "Sup3rSecretPw!".to_string(),
        ..MockEnvironment::demo()
    };
    let (rt, mock) = mock_with(MockConfig {
        environments: vec![env],
        ..MockConfig::demo()
    });
    mock.set_echo_grant_refusals(true);
    let port = free_port();
    let g = Gateway::new("");
    g.write_config(&format!(
        "{}{}\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
        mock_service_section(&mock),
        common::stdin_replay_config(20)
    ));
    let day = common::day::Day::one();
    day.set_on(&g);
    let mut d = common::Daemon::start(&g);
    d.send(&[tape_advert(tape_mac(1), day.now_ms(), 1)]);
    let stats = eventually(LIMIT, || g.try_stats().filter(|s| s.last_error.is_some()))
        .unwrap_or_else(|| panic!("no failure recorded:\n{}", d.stderr()));
    assert_eq!(
        stats.last_error.as_deref(),
        Some("token refused: invalid_grant"),
        "only the OAuth error code is kept"
    );
    assert!(mock.token_requests() >= 1);

    let page = rt
        .block_on(async {
            reqwest::get(format!("http://127.0.0.1:{port}/"))
                .await?
                .text()
                .await
        })
        .unwrap();
    let check = g.run(&["check"]);
    let check = format!("{}{}", text(&check.stdout), text(&check.stderr));
    assert!(check.contains("wrong username or password"), "{check}");
    let db =
        rusqlite::Connection::open(tapegate::outbox::StateReader::path_in(&g.state_dir())).unwrap();
    let meta: Vec<String> = db
        .prepare("SELECT key || '=' || value FROM meta")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let (status, log) = d.terminate(LIMIT);
    assert!(status.success(), "{log}");
    assert!(log.contains("invalid_grant"), "the log says why:\n{log}");
    for (what, shown) in [
        ("the log", log),
        ("the database", meta.join("\n")),
        ("status", text(&g.run(&["status"]).stdout)),
        ("status --json", text(&g.run(&["status", "--json"]).stdout)),
        ("check", check),
        ("the page", page),
    ] {
        assert_no_password(what, &shown);
    }
}
