//! DescribeConfigs (key 32): a topic's configs (explicit, broker defaults and Kafka's
//! defaults) and a broker's (its settings by Kafka's names and the dynamic broker
//! configs), with synonyms (v1+, `include_synonyms`) and documentation (v3+,
//! `include_documentation`); see [`crate::base::broker_configs`].
//!
//! A BROKER resource names this broker (its id) or is empty: the cluster-wide dynamic
//! defaults, as Kafka answers both. Another broker's id is INVALID_REQUEST, as in Kafka
//! (a client sends a broker's resource to that broker). A BROKER_LOGGER resource, named
//! by this broker's id, lists its loggers and their levels ([`crate::observe::loggers`]).

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult,
    DescribeConfigsSynonym,
};

use super::sb;
use crate::base::broker_configs::{self, Described};
use crate::partition::broker::Broker;

pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
/// The broker's log levels ([`crate::observe::loggers`]), named by the broker's id.
pub const RESOURCE_BROKER_LOGGER: i8 = 8;
/// A consumer group's configs ([`crate::base::group_configs`]), named by its id.
pub const RESOURCE_GROUP: i8 = 32;
/// Kafka's config source of a logger's level.
const DYNAMIC_BROKER_LOGGER_CONFIG: i8 = 6;

/// INVALID_REQUEST unless a BROKER or BROKER_LOGGER resource `name` is this broker's
/// id (`empty_ok`: or empty, the cluster-wide scope of BROKER).
pub fn this_broker(name: &str, me: i32, empty_ok: bool) -> Result<(), (ResponseError, String)> {
    if name == me.to_string() || (empty_ok && name.is_empty()) {
        return Ok(());
    }
    let expected = if empty_ok { " or empty string" } else { "" };
    Err((
        ResponseError::InvalidRequest,
        format!("Unexpected broker id, expected {me}{expected}, but received {name}"),
    ))
}

/// Kafka's config types (v3+), guessed from the value as Kafka's own type would be.
fn config_type(value: Option<&str>) -> i8 {
    const BOOLEAN: i8 = 1;
    const STRING: i8 = 2;
    const LONG: i8 = 5;
    const DOUBLE: i8 = 6;
    match value {
        Some("true" | "false") => BOOLEAN,
        Some(v) if v.parse::<i64>().is_ok() => LONG,
        Some(v) if v.parse::<f64>().is_ok() => DOUBLE,
        _ => STRING,
    }
}

fn entry(d: Described, synonyms: bool, docs: bool) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(sb(d.name))
        .with_config_type(config_type(d.value.as_deref()))
        .with_value(d.value.map(sb))
        .with_read_only(d.read_only)
        .with_config_source(d.source)
        .with_synonyms(if synonyms {
            d.synonyms
                .into_iter()
                .map(|(n, v, s)| {
                    DescribeConfigsSynonym::default()
                        .with_name(sb(n))
                        .with_value(v.map(sb))
                        .with_source(s)
                })
                .collect()
        } else {
            Vec::new()
        })
        .with_documentation(docs.then(|| sb(d.documentation)))
}

fn wanted(keys: &Option<Vec<kafka_protocol::protocol::StrBytes>>, name: &str) -> bool {
    keys.as_ref()
        .is_none_or(|ks| ks.is_empty() || ks.iter().any(|k| k.as_str() == name))
}

pub fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let image = broker.image();
    let c = &broker.config;
    let (synonyms, docs) = (req.include_synonyms, req.include_documentation);
    let results = req
        .resources
        .into_iter()
        .map(|r| {
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let name = r.resource_name.as_str();
            let described = match r.resource_type {
                RESOURCE_TOPIC => match image.topics.get(name) {
                    Some(meta) => Ok(broker_configs::describe_topic(
                        &image,
                        c.broker_id(),
                        &meta.configs,
                        meta.assignments.iter().map(|a| a.replicas.len()).min(),
                    )),
                    None => Err((
                        ResponseError::UnknownTopicOrPartition,
                        format!("Topic {name} does not exist"),
                    )),
                },
                RESOURCE_BROKER => this_broker(name, c.node_id, true)
                    .map(|()| broker_configs::describe_broker(c, &image, name.is_empty())),
                RESOURCE_BROKER_LOGGER => this_broker(name, c.node_id, false).and_then(|()| {
                    let levels = crate::observe::loggers::describe()
                        .map_err(|e| (e.code, e.message.unwrap_or_default()))?;
                    Ok(levels
                        .into_iter()
                        .map(|(name, level)| Described {
                            name,
                            value: Some(level),
                            source: DYNAMIC_BROKER_LOGGER_CONFIG,
                            read_only: false,
                            synonyms: Vec::new(),
                            documentation: String::new(),
                        })
                        .collect())
                }),
                RESOURCE_GROUP if name.is_empty() => Err((
                    ResponseError::InvalidRequest,
                    "Group name must not be empty".to_string(),
                )),
                RESOURCE_GROUP => Ok(crate::base::group_configs::describe(
                    image.group_configs.get(name),
                )),
                other => Err((
                    ResponseError::InvalidRequest,
                    format!("unsupported resource type {other}"),
                )),
            };
            match described {
                Ok(all) => base.with_configs(
                    all.into_iter()
                        .filter(|d| wanted(&r.configuration_keys, &d.name))
                        .map(|d| entry(d, synonyms, docs))
                        .collect(),
                ),
                Err((code, message)) => base
                    .with_error_code(code.code())
                    .with_error_message(Some(sb(message))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}
