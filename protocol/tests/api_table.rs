//! The API table of docs/kafka-apis.md ("# Kafka APIs served") against the registry:
//! every registered API has its row with the registered versions in the Sluice column,
//! and every other row says "not served", so the documentation cannot drift from what
//! ApiVersions answers.

use kafka_protocol::messages::ApiKey;
use sluice_protocol::{lookup, REGISTRY};

/// (key, API name, Sluice column) of each table row.
fn rows() -> Vec<(i16, String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/kafka-apis.md");
    let doc = std::fs::read_to_string(path).expect("docs/kafka-apis.md");
    // The table: from its header row to the first line that is not a table row.
    let table = doc
        .split("\n| key | API | Kafka 3.9 | Sluice |")
        .nth(1)
        .expect("a table headed \"| key | API | Kafka 3.9 | Sluice | ...\"");
    table
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // "| key | API | Kafka 3.9 | Sluice | differences |" splits into 7 cells.
            let key = cells.get(1)?.parse::<i16>().ok()?;
            assert_eq!(cells.len(), 7, "row of key {key}: {line}");
            Some((key, cells[2].to_string(), cells[4].to_string()))
        })
        .collect()
}

fn versions(min: i16, max: i16) -> String {
    if min == max {
        min.to_string()
    } else {
        format!("{min}–{max}")
    }
}

#[test]
fn the_documented_api_table_matches_the_registry() {
    let rows = rows();
    assert!(rows.len() > 70, "the table lists every Kafka 3.9 API key");
    assert!(
        rows.windows(2).all(|w| w[0].0 < w[1].0),
        "rows in increasing key order, each key once"
    );
    for (key, name, sluice) in &rows {
        match lookup(*key) {
            Some(spec) => {
                assert_eq!(name, &format!("{:?}", spec.key), "name of key {key}");
                assert_eq!(
                    sluice,
                    &versions(spec.min, spec.max),
                    "Sluice column of {name} (key {key}) against REGISTRY"
                );
            }
            None => assert_eq!(sluice, "not served", "{name} (key {key}) is not registered"),
        }
        if let Ok(k) = ApiKey::try_from(*key) {
            // Key 74 was renamed after Kafka 3.9 (ListClientMetricsResources).
            if *key != 74 {
                assert_eq!(name, &format!("{k:?}"), "Kafka's name of key {key}");
            }
        }
    }
    for spec in REGISTRY {
        assert!(
            rows.iter().any(|(k, _, _)| *k == spec.key as i16),
            "{:?} is registered but has no row",
            spec.key
        );
    }
}
