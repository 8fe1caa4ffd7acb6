/*!
The environment layer: `TAPEGATE_<SECTION>__<KEY>=value` overrides a key of the file
(`TAPEGATE_FLUSH__MAX_BATCH=100` sets `flush.max_batch`), applied to the file's TOML
table before the sections are read, so an override is checked exactly like the file.
It touches the TOML table only.
*/

use super::Problem;

/// Prefix of environment overrides: `TAPEGATE_<SECTION>__<KEY>`.
const ENV_PREFIX: &str = "TAPEGATE_";

/// Applies `TAPEGATE_GATEWAY__ID=dock-7` style overrides. Segments are lower-cased;
/// a numeric segment indexes an array (`TAPEGATE_PRODUCTS__0__ID`). A value is read as
/// a TOML value when it is one (`100`, `true`, `0x0EF7`) unless the file has a string
/// there, and as a plain string otherwise. Returns the keys set (dotted:
/// `products.0.id`), each with the variable that set it.
pub fn apply(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
    problems: &mut Vec<Problem>,
) -> Vec<(String, String)> {
    let mut applied = Vec::new();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k.contains("__"))
        .collect();
    vars.sort();
    for (name, raw) in vars {
        let segments: Vec<String> = name[ENV_PREFIX.len()..]
            .split("__")
            .map(|s| s.to_ascii_lowercase())
            .collect();
        if segments.iter().any(|s| s.is_empty()) {
            problems.push(Problem::new(
                name.clone(),
                None,
                "expected TAPEGATE_<SECTION>__<KEY> with non-empty parts",
            ));
            continue;
        }
        match set_path(table, &segments, &raw) {
            Ok(()) => applied.push((segments.join("."), name)),
            Err(message) => problems.push(Problem::new(
                segments.join("."),
                None,
                format!("cannot apply {name}: {message}"),
            )),
        }
    }
    applied
}

fn set_path(table: &mut toml::Table, segments: &[String], raw: &str) -> Result<(), String> {
    let (first, rest) = segments.split_first().ok_or("empty key")?;
    if rest.is_empty() {
        // A secret is taken exactly as given: a password `1e3` is not the number 1000.
        let value = if crate::util::secret::is_secret_key(first) {
            toml::Value::String(raw.to_string())
        } else {
            env_value(table.get(first), raw)
        };
        table.insert(first.clone(), value);
        return Ok(());
    }
    let entry = table
        .entry(first.clone())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    set_in_value(entry, rest, raw)
}

fn set_in_value(node: &mut toml::Value, segments: &[String], raw: &str) -> Result<(), String> {
    match node {
        toml::Value::Table(t) => set_path(t, segments, raw),
        toml::Value::Array(a) => {
            let (first, rest) = segments.split_first().ok_or("empty key")?;
            let i: usize = first
                .parse()
                .map_err(|_| format!("{first:?} is not an index into the list"))?;
            let len = a.len();
            let slot = a
                .get_mut(i)
                .ok_or_else(|| format!("no entry {i} (the list has {len})"))?;
            if rest.is_empty() {
                *slot = env_value(Some(slot), raw);
                Ok(())
            } else {
                set_in_value(slot, rest, raw)
            }
        }
        _ => Err("its parent is not a table".to_string()),
    }
}

/// The TOML value of an override: a string where the file has a string, else the
/// value as TOML when it parses as a scalar, else the raw string.
fn env_value(existing: Option<&toml::Value>, raw: &str) -> toml::Value {
    if let Some(toml::Value::String(_)) = existing {
        return toml::Value::String(raw.to_string());
    }
    let parsed = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"));
    match parsed {
        Some(
            v @ (toml::Value::Integer(_)
            | toml::Value::Float(_)
            | toml::Value::Boolean(_)
            | toml::Value::String(_)),
        ) => v,
        _ => toml::Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::test_support::{parse, problems, SERVICE};
    use crate::config::Durability;

    #[test]
    fn environment_variables_override_file_keys() {
        let c = parse(
            SERVICE,
            &[
                ("TAPEGATE_FLUSH__MAX_BATCH", "100"),
                ("TAPEGATE_GATEWAY__ID", "dock-9"),
                ("TAPEGATE_SERVICE__ENVIRONMENTS__PPE__CUSTOMER_ID", "12345"),
                ("TAPEGATE_OUTBOX__DURABILITY", "normal"),
                ("TAPEGATE_CONFIG", "/ignored/not/a/key"),
                ("OTHER_FLUSH__MAX_BATCH", "1"),
            ],
        )
        .unwrap();
        assert_eq!(c.flush.max_batch, 100);
        assert_eq!(c.gateway.id, "dock-9");
        assert_eq!(c.service.unwrap().endpoint.customer_id, "12345");
        assert_eq!(c.outbox.durability, Durability::Normal);
    }

    #[test]
    fn a_password_override_is_the_exact_string_never_a_toml_scalar() {
        let text = SERVICE.replace("password = \"s3cr3t-value\"\n", "");
        for pw in ["1e3", "true", "0x10", "\"quoted\"", "007"] {
            let c = parse(
                &text,
                &[("TAPEGATE_SERVICE__ENVIRONMENTS__PPE__PASSWORD", pw)],
            )
            .unwrap();
            assert_eq!(c.service.unwrap().endpoint.password.expose(), pw);
        }
    }

    #[test]
    fn a_bad_environment_override_is_named_like_a_file_key() {
        let p = problems(
            "",
            &[
                ("TAPEGATE_FLUSH__MAX_BATCH", "9000"),
                ("TAPEGATE_FLUSH__NOPE", "1"),
            ],
        );
        let shown: Vec<String> = p.iter().map(|p| p.to_string()).collect();
        assert!(shown.iter().any(|s| s.starts_with("flush")), "{shown:#?}");
    }
}
