//! Config drop-ins through the real binary: the `.toml` files of `config.d/` beside the
//! config file are merged over it in name order (the environment's overrides over
//! them), every command sees the merged result, a problem names the file and the key
//! that holds it, and a support bundle shows what was merged and keeps the drop-ins'
//! secrets out.

mod common;

use std::process::Command;

use common::{text, Gateway};

/// `config.d/<name>` of `g`, holding `body`.
fn drop_in(g: &Gateway, name: &str, body: &str) {
    let dir = g.path("config.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), body).unwrap();
}

fn check(g: &Gateway) -> std::process::Output {
    g.run(&["check", "--config-only"])
}

#[test]
fn drop_ins_are_merged_over_the_file_in_name_order_and_the_environment_over_them() {
    let g = Gateway::new("[flush]\nmax_batch = 100\n");
    let out = check(&g);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("(gateway test-gw, 1 product(s)"),
        "{}",
        text(&out.stdout)
    );

    drop_in(&g, "20-site.toml", "[gateway]\nid = \"dock-7\"\n");
    drop_in(
        &g,
        "10-fleet.toml",
        "[gateway]\nid = \"fleet-default\"\n\n[[products]]\nid = \"tape\"\nmanufacturer_id = 0x0EF7\n\n[[products]]\nid = \"beacon\"\nmanufacturer_id = 76\n",
    );
    // Not drop-ins: an editor's and dpkg's leftovers, a hidden file.
    drop_in(&g, "30-x.toml~", "[gateway]\nid = \"backup\"\n");
    drop_in(&g, "40-x.toml.dpkg-old", "[gateway]\nid = \"old\"\n");
    drop_in(&g, ".50-x.toml", "[gateway]\nid = \"hidden\"\n");
    let out = check(&g);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The site's id (the last file wins), the fleet's two products (a list replaced
    // whole), the main file's other keys kept.
    assert!(
        text(&out.stdout).contains("(gateway dock-7, 2 product(s)"),
        "{}",
        text(&out.stdout)
    );
    let out = g
        .command(&["check", "--config-only"])
        .env("TAPEGATE_GATEWAY__ID", "from-env")
        .output()
        .unwrap();
    assert!(
        text(&out.stdout).contains("(gateway from-env,"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_problem_names_the_file_and_key_that_hold_it() {
    let g = Gateway::new("[flush]\nmax_batch = 100\n");
    drop_in(&g, "10-fleet.toml", "[flush]\nmax_batch = 900\n");
    drop_in(&g, "20-site.toml", "[outbox]\nmax_pendng = 5\n");
    let out = check(&g);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    let fleet = g.path("config.d/10-fleet.toml");
    let site = g.path("config.d/20-site.toml");
    assert!(
        err.contains(&format!(
            "{}: flush.max_batch = 900: expected",
            fleet.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}: outbox.max_pendng", site.display())),
        "{err}"
    );
    // A key the environment set is its variable's.
    let out = g
        .command(&["check", "--config-only"])
        .env("TAPEGATE_FLUSH__MAX_BATCH", "0")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(
        err.contains("TAPEGATE_FLUSH__MAX_BATCH: flush.max_batch = 0: expected"),
        "{err}"
    );
    // A drop-in that is not TOML is named, with the place, never with its text.
    drop_in(
        &g,
        "15-broken.toml",
        "[service.environments.ppe]\npassword = \"hunter2\n",
    );
    let out = check(&g);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "config {} is not valid TOML: line 2",
            g.path("config.d/15-broken.toml").display()
        )),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn a_support_bundle_shows_the_merged_config_and_keeps_a_drop_ins_secret_out() {
    let secret = "drop-in-SECRET 42";
    let g = Gateway::new("");
    drop_in(
        &g,
        "10-telemetry.toml",
        &format!("[telemetry]\nurl = \"https://mimir.example.com/api/v1/push\"\nusername = \"u\"\npassword = \"{secret}\"\n"),
    );
    let bundle = g.path("bundle.tar.gz");
    let out = g.run(&["support-bundle", "--output", bundle.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let unpacked = g.path("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(&bundle)
        .arg("-C")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(tar.success());
    let top = std::fs::read_dir(&unpacked)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let read = |name: &str| std::fs::read_to_string(top.join(name)).unwrap();
    let files = read("config/files.txt");
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            g.config_path().display().to_string(),
            g.path("config.d/10-telemetry.toml").display().to_string()
        ]
    );
    assert!(read("config/file.toml").contains("mimir.example.com"));
    assert!(read("config/effective.toml").contains("mimir.example.com"));
    for entry in walk(&top) {
        let bytes = std::fs::read(&entry).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(secret),
            "{} holds the drop-in's secret",
            entry.display()
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
