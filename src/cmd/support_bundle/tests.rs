//! Tests of the support bundle's scrubbing: secrets out in every form.

use super::secrets::{forms_of, redact};

#[test]
fn every_form_of_a_secret_is_scrubbed() {
    let forms = forms_of("p@ss w\"rd/1", "gw");
    for f in [
        "p@ss w\"rd/1",
        "p@ss w\\\"rd/1",
        "p%40ss+w%22rd%2F1",
        "p%40ss%20w%22rd%2F1",
    ] {
        assert!(forms.iter().any(|x| x == f), "{f} not in {forms:?}");
    }
    assert!(
        forms.iter().any(|x| x == "Z3c6cEBzcyB3InJkLzE="),
        "basic auth of gw"
    );
}

#[test]
fn secret_keys_of_the_file_are_redacted_at_any_depth() {
    let mut v: toml::Value = toml::from_str(
            "[service.environments.ppe]\npassword = \"x1\"\nusername = \"u\"\n[telemetry]\nbearer_token_file = \"t\"\n",
        )
        .unwrap();
    redact(&mut v, "");
    let text = toml::to_string(&v).unwrap();
    assert!(!text.contains("x1") && !text.contains("\"t\""), "{text}");
    assert!(text.contains("username = \"u\""), "{text}");
}
