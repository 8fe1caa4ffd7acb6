//! Tests of what a reload applies and what needs a restart.

use super::changes::{changed_keys, how, in_force, Apply};
use crate::config::test_support::{parse, SERVICE};

#[test]
fn changes_are_named_by_key_and_sorted_by_how_they_apply() {
    let old = parse(&format!("{SERVICE}\n[flush]\nmax_batch = 10\n"), &[]).unwrap();
    let new = parse(
            &format!(
                "{}\n[flush]\nmax_batch = 20\n[http]\nlisten = \"127.0.0.1:9464\"\n[gateway]\nid = \"other\"\n[dedup]\nwindow_secs = 1\n",
                SERVICE.replace("s3cr3t-value", "new-pw")
            ),
            &[],
        )
        .unwrap();
    let keys = changed_keys(&old, &new);
    assert_eq!(
        keys,
        [
            "dedup.window_secs",
            "flush.max_batch",
            "gateway.id",
            "http.listen",
            "service.environments.ppe.password"
        ]
    );
    let hows: Vec<Apply> = keys.iter().map(|k| how(k, false)).collect();
    assert_eq!(
        hows,
        [
            Apply::Now,
            Apply::Delivery,
            Apply::Restart,
            Apply::Http,
            Apply::Delivery
        ]
    );
    // No password value in the keys.
    assert!(!format!("{keys:?}").contains("new-pw"));
    // What needs a restart keeps its running value.
    let running = in_force(&old, &new);
    assert_eq!(running.gateway.id, old.gateway.id);
    assert_eq!(running.flush.max_batch, 20);
}

#[test]
fn adding_or_removing_the_service_needs_a_restart() {
    let without = parse("", &[]).unwrap();
    let with = parse(SERVICE, &[]).unwrap();
    let keys = changed_keys(&without, &with);
    assert!(
        keys.iter().all(|k| how(k, true) == Apply::Restart),
        "{keys:?}"
    );
    assert!(in_force(&without, &with).service.is_none());
}
