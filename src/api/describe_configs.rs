//! DescribeConfigs (key 32): topic configs (explicit and default) and the broker's.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult,
};

use super::sb;
use crate::broker::Broker;
use crate::topic_config::TopicConfig;

pub const RESOURCE_TOPIC: i8 = 2;
pub const RESOURCE_BROKER: i8 = 4;
/// Config sources (Kafka's numbering).
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

fn entry(name: &str, value: String, source: i8, read_only: bool) -> DescribeConfigsResourceResult {
    DescribeConfigsResourceResult::default()
        .with_name(sb(name))
        .with_value(Some(sb(value)))
        .with_read_only(read_only)
        .with_config_source(source)
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
    let results = req
        .resources
        .into_iter()
        .map(|r| {
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            match r.resource_type {
                RESOURCE_TOPIC => match image.topics.get(r.resource_name.as_str()) {
                    Some(meta) => base.with_configs(
                        TopicConfig::describe(&meta.configs)
                            .into_iter()
                            .filter(|(n, _, _)| wanted(&r.configuration_keys, n))
                            .map(|(n, v, set)| {
                                entry(
                                    n,
                                    v,
                                    if set {
                                        SOURCE_DYNAMIC_TOPIC
                                    } else {
                                        SOURCE_DEFAULT
                                    },
                                    false,
                                )
                            })
                            .collect(),
                    ),
                    None => base
                        .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                        .with_error_message(Some(sb(format!(
                            "Topic {} does not exist",
                            r.resource_name.as_str()
                        )))),
                },
                RESOURCE_BROKER => {
                    let all = [
                        ("broker.id", c.node_id.to_string()),
                        ("num.partitions", c.default_partitions.to_string()),
                        (
                            "auto.create.topics.enable",
                            c.auto_create_topics.to_string(),
                        ),
                        (
                            "socket.request.max.bytes",
                            c.socket_request_max_bytes.to_string(),
                        ),
                        ("log.dirs", c.data_dir.display().to_string()),
                        // Sluice's free-space minimum (`sluice cluster describe` shows
                        // whether a broker refuses appends with it).
                        ("disk.min.free.bytes", c.disk_min_free.bytes.to_string()),
                        ("disk.min.free.percent", c.disk_min_free.percent.to_string()),
                    ];
                    base.with_configs(
                        all.into_iter()
                            .filter(|(n, _)| wanted(&r.configuration_keys, n))
                            .map(|(n, v)| entry(n, v, SOURCE_STATIC_BROKER, true))
                            .collect(),
                    )
                }
                other => base
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(sb(format!("unsupported resource type {other}")))),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}
