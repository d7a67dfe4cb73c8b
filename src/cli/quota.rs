//! Client quotas from `sluice config --entity-type users|clients` (as kafka-configs.sh
//! sets them): DescribeClientQuotas and AlterClientQuotas against any Kafka-protocol
//! broker. An entity is a user, a client id or both (`--entity-type users --entity-name
//! alice --entity-type clients --entity-name app`); `<default>` names the default.

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{AlterClientQuotasRequest, DescribeClientQuotasRequest};
use sluice_client::blocking::Conn;
use sluice_client::{error_name, sbs};

const CLIENT_ID: &str = "sluice-cli";
const DEFAULT: &str = "<default>";

/// The quota entity types of `--entity-type` (Kafka's `user`, `client-id`), or `None`
/// for a config resource type.
pub fn entity_type(name: &str) -> Option<&'static str> {
    match name {
        "user" | "users" => Some("user"),
        "client" | "clients" | "client-id" => Some("client-id"),
        _ => None,
    }
}

/// (entity type, name; `None` = the default) from the paired flags.
fn components(
    types: &[&'static str],
    names: &[String],
) -> Result<Vec<(&'static str, Option<String>)>, String> {
    if types.len() != names.len() || types.is_empty() || types.len() > 2 {
        return Err("give one --entity-name per --entity-type (users, clients or both)".into());
    }
    if types.len() == 2 && types[0] == types[1] {
        return Err(format!("--entity-type {} given twice", types[0]));
    }
    Ok(types
        .iter()
        .zip(names)
        .map(|(t, n)| (*t, (n != DEFAULT).then(|| n.clone())))
        .collect())
}

fn label(parts: &[(String, Option<String>)]) -> String {
    parts
        .iter()
        .map(|(t, n)| format!("{t}={}", n.as_deref().unwrap_or(DEFAULT)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The quotas of exactly this entity.
pub fn describe(bootstrap: &str, types: &[&'static str], names: &[String]) -> Result<(), String> {
    let parts = components(types, names)?;
    let req = DescribeClientQuotasRequest::default()
        .with_strict(true)
        .with_components(
            parts
                .iter()
                .map(|(t, n)| {
                    ComponentData::default()
                        .with_entity_type(sbs(t))
                        .with_match_type(if n.is_some() { 0 } else { 1 })
                        .with_match(n.as_deref().map(sbs))
                })
                .collect(),
        );
    let mut c = Conn::open(bootstrap, CLIENT_ID).map_err(|e| e.to_string())?;
    let r = c.call(1, &req).map_err(|e| e.to_string())?;
    if r.error_code != 0 {
        return Err(refusal(r.error_code, r.error_message.as_deref()));
    }
    for e in r.entries.unwrap_or_default() {
        let parts: Vec<(String, Option<String>)> = e
            .entity
            .iter()
            .map(|c| {
                (
                    c.entity_type.to_string(),
                    c.entity_name.as_ref().map(|n| n.to_string()),
                )
            })
            .collect();
        for v in e.values {
            println!("{}  {}={}", label(&parts), &*v.key, v.value);
        }
    }
    Ok(())
}

fn refusal(code: i16, message: Option<&str>) -> String {
    match message.filter(|m| !m.is_empty()) {
        Some(m) => format!("{}: {m}", error_name(code)),
        None => error_name(code),
    }
}

/// Sets `set` (key=value) and removes `delete` on the entity.
pub fn alter(
    bootstrap: &str,
    types: &[&'static str],
    names: &[String],
    set: &std::collections::BTreeMap<String, String>,
    delete: &[String],
) -> Result<(), String> {
    let parts = components(types, names)?;
    if set.is_empty() && delete.is_empty() {
        return Err("nothing to change: give --add-config key=value or --delete-config key".into());
    }
    let mut ops = Vec::new();
    for (k, v) in set {
        let value: f64 = v
            .parse()
            .map_err(|_| format!("{k}={v}: a quota is a number (bytes per second)"))?;
        ops.push(OpData::default().with_key(sbs(k)).with_value(value));
    }
    ops.extend(
        delete
            .iter()
            .map(|k| OpData::default().with_key(sbs(k)).with_remove(true)),
    );
    let entry = EntryData::default()
        .with_entity(
            parts
                .iter()
                .map(|(t, n)| {
                    EntityData::default()
                        .with_entity_type(sbs(t))
                        .with_entity_name(n.as_deref().map(sbs))
                })
                .collect(),
        )
        .with_ops(ops);
    let mut c = Conn::open(bootstrap, CLIENT_ID).map_err(|e| e.to_string())?;
    let r = c
        .call(
            1,
            &AlterClientQuotasRequest::default().with_entries(vec![entry]),
        )
        .map_err(|e| e.to_string())?;
    for e in &r.entries {
        if e.error_code != 0 {
            return Err(refusal(e.error_code, e.error_message.as_deref()));
        }
    }
    let owned: Vec<(String, Option<String>)> =
        parts.into_iter().map(|(t, n)| (t.to_string(), n)).collect();
    println!("altered quotas of {}", label(&owned));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_pair_types_with_names() {
        assert_eq!(entity_type("users"), Some("user"));
        assert_eq!(entity_type("clients"), Some("client-id"));
        assert_eq!(entity_type("topics"), None);
        assert_eq!(
            components(
                &["user", "client-id"],
                &["alice".into(), "<default>".into()]
            )
            .unwrap(),
            vec![("user", Some("alice".to_string())), ("client-id", None)]
        );
        assert!(components(&["user"], &[]).is_err());
        assert!(components(&["user", "user"], &["a".into(), "b".into()]).is_err());
    }
}
