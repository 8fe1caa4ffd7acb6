//! The shipped alert rules and Grafana dashboard (`monitoring/`, installed under
//! `/usr/share/tapegate/` by the package): the rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`: each alert fires on the situation it names),
//! and every metric the rules and the dashboard name is one tapegate serves (read from
//! the registry in-process, as `/metrics` writes it).
//!
//! The promtool checks need the `prometheus` package; without it they say so loudly and
//! pass, except under CI (`CI` set), where they fail: `.ci/run` installs it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const RULES: &str = "monitoring/tapegate.rules.yml";
const RULE_TESTS: &str = "monitoring/tapegate.rules.test.yml";
const DASHBOARD: &str = "monitoring/tapegate-dashboard.json";

fn promtool(args: &[&str]) -> Option<std::process::Output> {
    match Command::new("promtool").args(args).output() {
        Ok(out) => Some(out),
        Err(e) => {
            let why = format!("promtool cannot be run ({e}): apt-get install prometheus");
            if std::env::var_os("CI").is_some() {
                panic!("{why}");
            }
            eprintln!("\n*** SKIPPED the promtool check: {why} ***\n*** (it runs under CI, `CI` set, where this is a failure) ***\n");
            None
        }
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let Some(check) = promtool(&["check", "rules", RULES]) else {
        return;
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(check.status.success(), "{text}");
    assert!(text.contains("SUCCESS"), "{text}");
    let test = promtool(&["test", "rules", RULE_TESTS]).unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

/// Every `tapegate_*` and `process_*` name in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for prefix in ["tapegate_", "process_"] {
        let mut rest = text;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            // A metric name, not part of a longer word (`/usr/share/tapegate_x`) nor a
            // field of a template's value (`$externalLabels.tapegate_runbook`).
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || "_/.".contains(c)) {
                names.insert(tail[..end].to_string());
            }
            rest = &tail[end..];
        }
    }
    names
}

/// The series names `/metrics` serves, from the registry in-process: those it has
/// values for, and those a family declares (`# TYPE`) before its first value (failures
/// by cause appear with the first failure).
fn served() -> BTreeSet<String> {
    let config = tapegate::config::from_toml("", Path::new("test.toml"), []).unwrap();
    let metrics = tapegate::metrics::Metrics::new();
    metrics.set_inventory(&tapegate::inventory::Inventory::gather(&config, 0));
    // A failed request: the failures by cause are served from the first one.
    metrics.request().answered(&[], Some("http_401"), 0);
    let text = metrics
        .encode(&tapegate::outbox::Stats::default(), 0)
        .unwrap();
    let mut names: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();
    for l in text.lines() {
        let mut words = l.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(family), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
        }
    }
    names
}

#[test]
fn every_metric_the_rules_and_the_dashboard_name_is_served() {
    let served = served();
    assert!(served.contains("tapegate_inventory_info"), "{served:?}");
    // The rules without their comments (prose names an external label, not a metric).
    let rules: String = std::fs::read_to_string(RULES)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let dashboard = std::fs::read_to_string(DASHBOARD).unwrap();
    let parsed: serde_json::Value =
        serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let mut exprs = String::new();
    for panel in parsed["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            exprs.push_str(t["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    exprs.push_str(&parsed["templating"].to_string());
    for (what, text) in [("rules", rules.as_str()), ("dashboard", exprs.as_str())] {
        let named = names_in(text);
        assert!(named.len() >= 8, "{what} names only {named:?}");
        let unknown: Vec<&String> = named.difference(&served).collect();
        assert!(
            unknown.is_empty(),
            "{what} names metrics tapegate does not serve: {unknown:?}"
        );
    }
    // The check can fail: a misspelt name is caught.
    assert!(!served.contains("tapegate_pending_total"));
}

#[test]
fn the_package_installs_the_rules_and_the_dashboard() {
    let manifest = std::fs::read_to_string("Cargo.toml").unwrap();
    for file in [RULES, DASHBOARD] {
        let line = format!("[\"{file}\", \"usr/share/tapegate/\", \"644\"]");
        assert!(
            manifest.contains(&line),
            "Cargo.toml's deb assets lack {line}"
        );
    }
}

/// Every object of `v` with a `datasource` key, and what it holds.
fn datasources<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if k == "datasource" {
                    out.push(v);
                }
                datasources(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| datasources(v, out)),
        _ => {}
    }
}

/// Grafana's file provisioning (Ansible, Helm, a ConfigMap) reads the dashboard as it
/// is: an import-time input (`__inputs`, `${DS_PROMETHEUS}`) is never filled in there,
/// and every panel would name a data source that does not exist. So each data source a
/// panel, target or variable names is a data-source variable of the dashboard itself,
/// which both an import and provisioning set (to the default Prometheus, changeable).
#[test]
fn the_dashboard_works_provisioned_from_a_file_and_imported() {
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    assert!(
        d.get("__inputs").is_none(),
        "import-time inputs: {}",
        d["__inputs"]
    );
    let variables = d["templating"]["list"].as_array().unwrap();
    let own: Vec<String> = variables
        .iter()
        .filter(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .map(|v| format!("${{{}}}", v["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        own.len(),
        1,
        "one Prometheus data-source variable: {variables:?}"
    );
    let mut named = Vec::new();
    datasources(&d, &mut named);
    assert!(named.len() > 10, "{named:?}");
    for ds in named {
        assert_eq!(ds["type"], "prometheus", "{ds}");
        assert_eq!(ds["uid"].as_str(), Some(own[0].as_str()), "{ds}");
    }
}

/// A rate over a fixed window is blank at a scrape interval longer than it and noisy
/// at a short one: every rate, and every increase not of a window the panel names ("per
/// hour"), takes Grafana's `$__rate_interval`.
#[test]
fn the_dashboards_rates_follow_the_scrape_interval() {
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut rates = 0;
    for panel in d["panels"].as_array().unwrap() {
        let title = panel["title"].as_str().unwrap();
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for f in ["rate(", "irate(", "increase(", "deriv("] {
                for (at, _) in expr.match_indices(f) {
                    if f == "rate(" && at > 0 && expr[..at].ends_with('i') {
                        continue;
                    }
                    let rest = &expr[at..];
                    let window = &rest[rest.find('[').unwrap()..=rest.find(']').unwrap()];
                    let named = f == "increase(" && window == "[1h]" && title.contains("per hour");
                    assert!(window == "[$__rate_interval]" || named, "{title}: {expr}");
                    rates += 1;
                }
            }
        }
    }
    assert!(rates >= 8, "{rates}");
}

/// The alerts of the rules file, each with the text of its block.
fn alerts() -> Vec<(String, String)> {
    let rules = std::fs::read_to_string(RULES).unwrap();
    let mut out: Vec<(String, String)> = Vec::new();
    for line in rules.lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            out.push((name.to_string(), String::new()));
        } else if let Some((_, block)) = out.last_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    out
}

/// Every alert is tested both ways (it fires on its situation; it is quiet at another
/// time or on a healthy gateway), says what happened and links to what to do: a
/// heading of the README, whose anchor is the alert's name in lower case.
#[test]
fn every_alert_is_tested_both_ways_described_and_linked_to_what_to_do() {
    let tests = std::fs::read_to_string(RULE_TESTS).unwrap();
    let readme = std::fs::read_to_string("README.md").unwrap();
    let alerts = alerts();
    assert!(alerts.len() >= 12, "{alerts:?}");
    for (name, block) in &alerts {
        let cases: Vec<&str> = tests
            .split("- eval_time:")
            .filter(|c| c.contains(&format!("alertname: {name}\n")))
            .collect();
        assert!(
            cases.iter().any(|c| c.contains("exp_labels")),
            "{name}: no test that it fires"
        );
        assert!(
            cases.iter().any(|c| c.contains("exp_alerts: []")),
            "{name}: no test that it stays quiet"
        );
        assert!(block.contains("description: "), "{name}: no description");
        let anchor = format!("#{}'", name.to_lowercase());
        assert!(
            block.contains("runbook_url: ") && block.contains(&anchor),
            "{name}: no runbook link to {anchor}"
        );
        assert!(
            readme.contains(&format!("#### {name}\n")),
            "{name}: no README heading says what to do"
        );
    }
}

/// Names kept one release for dashboards built on them, and said so: the shipped rules
/// and dashboard use their successors.
const DEPRECATED: [&str; 2] = ["tapegate_evicted_total", "tapegate_scanner_dropped_total"];

#[test]
fn the_rules_and_dashboard_use_no_deprecated_metric_and_the_old_names_say_they_go() {
    let rules = std::fs::read_to_string(RULES).unwrap();
    let dashboard = std::fs::read_to_string(DASHBOARD).unwrap();
    for name in DEPRECATED {
        assert!(!rules.contains(name), "the rules use {name}");
        assert!(!dashboard.contains(name), "the dashboard uses {name}");
    }
    let config = tapegate::config::from_toml("", Path::new("test.toml"), []).unwrap();
    let metrics = tapegate::metrics::Metrics::new();
    metrics.set_inventory(&tapegate::inventory::Inventory::gather(&config, 0));
    let text = metrics
        .encode(&tapegate::outbox::Stats::default(), 0)
        .unwrap();
    for name in DEPRECATED {
        let family = name.trim_end_matches("_total");
        let help = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# HELP {family} ")))
            .unwrap_or_else(|| panic!("no HELP for {family}"));
        assert!(help.starts_with("Deprecated"), "{family}: {help}");
    }
}
