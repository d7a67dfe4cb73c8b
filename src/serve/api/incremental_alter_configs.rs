//! IncrementalAlterConfigs (key 44): SET / DELETE / APPEND / SUBTRACT on topic configs
//! and on the dynamic broker configs (see [`crate::base::broker_configs`]): a BROKER resource
//! named by this broker's id changes its own, the empty name the cluster-wide
//! defaults; another broker's id is INVALID_REQUEST (clients send it to that broker).
//! A BROKER_LOGGER resource (this broker's id) sets or removes log levels of this
//! process, here and at once ([`crate::observe::loggers`]). A GROUP resource changes a
//! consumer group's configs ([`crate::base::group_configs`]) through the metadata
//! quorum.
//!
//! Checked here first, as Kafka's `ConfigAdminManager.preprocess`: every entry of a
//! resource named twice, a resource naming a config twice, or a null value on an
//! operation other than DELETE is INVALID_REQUEST and changes nothing.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, IncrementalAlterConfigsRequest,
};
use kafka_protocol::messages::incremental_alter_configs_response::{
    AlterConfigsResourceResponse, IncrementalAlterConfigsResponse,
};

use super::describe_configs::{
    this_broker, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_GROUP, RESOURCE_TOPIC,
};
use super::sb;
use crate::base::error::ApiError;
use crate::base::rpc::{
    AlterConfigOp, BrokerConfigChange, ConfigChange, ConfigOp, TopicConfigChange,
};
use crate::partition::broker::Broker;

/// The request-shape refusal of each resource, in order (pure; Kafka's preprocess).
fn shape_errors(resources: &[AlterConfigsResource]) -> Vec<Option<ApiError>> {
    let invalid = |m: String| Some(ApiError::with(ResponseError::InvalidRequest, m));
    let named_twice = super::repeated(
        resources
            .iter()
            .map(|r| (r.resource_type, r.resource_name.as_str())),
    );
    resources
        .iter()
        .map(|r| {
            if named_twice.contains(&(r.resource_type, r.resource_name.as_str())) {
                return invalid("Each resource must appear at most once.".into());
            }
            if !super::repeated(r.configs.iter().map(|c| c.name.as_str())).is_empty() {
                return invalid("Error due to duplicate config keys".into());
            }
            let nulls: Vec<&str> = r
                .configs
                .iter()
                .filter(|c| {
                    AlterConfigOp::from_code(c.config_operation) != Some(AlterConfigOp::Delete)
                        && c.value.is_none()
                })
                .map(|c| c.name.as_str())
                .collect();
            if !nulls.is_empty() {
                return invalid(format!(
                    "Null value not supported for : {}",
                    nulls.join(", ")
                ));
            }
            None
        })
        .collect()
}

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut items = Vec::new();
    let mut brokers = Vec::new();
    let mut shape = Vec::new();
    let me = broker.config.node_id;
    let refused = shape_errors(&req.resources);
    for (r, refused) in req.resources.iter().zip(refused) {
        if let Some(e) = refused {
            shape.push((r.resource_type, r.resource_name.clone(), Some(Err(e))));
            continue;
        }
        // The operations, or the first wire code Kafka does not define.
        let ops = r
            .configs
            .iter()
            .map(|c| {
                let op = AlterConfigOp::from_code(c.config_operation).ok_or(c.config_operation)?;
                Ok(ConfigOp::new(c.name.as_str(), op, c.value.as_deref()))
            })
            .collect::<Result<Vec<ConfigOp>, i8>>();
        let name = r.resource_name.as_str();
        if r.resource_type == RESOURCE_BROKER_LOGGER {
            // This process's log levels: answered here, never through the controller.
            let done = this_broker(name, me, false)
                .map_err(|(code, m)| ApiError::with(code, m))
                .and_then(|()| {
                    let ops = ops.map_err(|code| {
                        crate::observe::loggers::not_for_loggers(&code.to_string())
                    })?;
                    crate::observe::loggers::alter(&ops, req.validate_only)
                });
            shape.push((r.resource_type, r.resource_name.clone(), Some(done)));
            continue;
        }
        if r.resource_type == RESOURCE_GROUP {
            let done = match ops {
                Ok(ops) => alter_group(broker, name, ops, req.validate_only).await,
                Err(code) => Err(ApiError::with(
                    ResponseError::InvalidConfig,
                    format!("Unknown config operation {code}"),
                )),
            };
            shape.push((r.resource_type, r.resource_name.clone(), Some(done)));
            continue;
        }
        // A topic's or this broker's configs go to the controller; an operation Kafka
        // does not define is an invalid config, as the controller judged it before.
        let to_controller = r.resource_type == RESOURCE_TOPIC
            || (r.resource_type == RESOURCE_BROKER && (name.is_empty() || name == me.to_string()));
        if to_controller {
            let change = match ops {
                Ok(ops) => ConfigChange::Incremental(ops),
                Err(code) => {
                    let e = ApiError::with(
                        ResponseError::InvalidConfig,
                        format!("Unknown config operation {code}"),
                    );
                    shape.push((r.resource_type, r.resource_name.clone(), Some(Err(e))));
                    continue;
                }
            };
            if r.resource_type == RESOURCE_TOPIC {
                items.push(TopicConfigChange {
                    topic: name.to_string(),
                    change,
                });
            } else {
                brokers.push(BrokerConfigChange {
                    scope: if name.is_empty() { -1 } else { me },
                    change,
                });
            }
            shape.push((r.resource_type, r.resource_name.clone(), None));
        } else if r.resource_type == RESOURCE_BROKER {
            let e = ApiError::with(
                ResponseError::InvalidRequest,
                format!("This is broker {me}, not broker {name}"),
            );
            shape.push((r.resource_type, r.resource_name.clone(), Some(Err(e))));
        } else {
            let e = ApiError::with(
                ResponseError::InvalidRequest,
                format!(
                    "resource type {} cannot be altered on this broker",
                    r.resource_type
                ),
            );
            shape.push((r.resource_type, r.resource_name.clone(), Some(Err(e))));
        }
    }
    let (mut results, mut broker_results) =
        super::alter_configs::through_controller(broker, items, brokers, req.validate_only).await;
    let responses = shape
        .into_iter()
        .map(|(rt, name, err)| {
            let r = match err {
                Some(answered) => answered,
                None if rt == RESOURCE_TOPIC => results.next().expect("one per topic"),
                None => broker_results.next().expect("one per broker scope"),
            };
            let base = AlterConfigsResourceResponse::default()
                .with_resource_type(rt)
                .with_resource_name(name);
            match r {
                Ok(()) => base,
                Err(e) => base
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            }
        })
        .collect();
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// A GROUP resource: `ops` on the group's explicit configs, checked, then (unless
/// `validate_only`) the new set through the metadata quorum.
async fn alter_group(
    broker: &Broker,
    group: &str,
    ops: Vec<ConfigOp>,
    validate_only: bool,
) -> Result<(), ApiError> {
    if group.is_empty() {
        return Err(ApiError::with(
            ResponseError::InvalidRequest,
            "Group name must not be empty",
        ));
    }
    let current = broker
        .image()
        .group_configs
        .get(group)
        .cloned()
        .unwrap_or_default();
    let configs = crate::cluster::controller::apply_ops(current, ops)?;
    crate::base::group_configs::check(&configs)?;
    if validate_only {
        return Ok(());
    }
    let cmd = sluice_replication::cluster::Command::AlterGroupConfigs {
        group: group.to_string(),
        configs,
    };
    match broker.control(crate::base::rpc::Propose(cmd)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) | Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig;

    fn resource(name: &str, configs: &[(&str, i8, Option<&str>)]) -> AlterConfigsResource {
        AlterConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(sb(name))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, op, v)| {
                        AlterableConfig::default()
                            .with_name(sb(*k))
                            .with_config_operation(*op)
                            .with_value(v.map(sb))
                    })
                    .collect(),
            )
    }

    #[test]
    fn repeated_resources_keys_and_null_values_are_invalid_request() {
        let (set, delete) = (0, 1);
        let errors = shape_errors(&[
            resource("a", &[("retention.ms", set, Some("1"))]),
            resource(
                "b",
                &[
                    ("retention.ms", set, Some("1")),
                    ("retention.ms", delete, None),
                ],
            ),
            resource("a", &[]),
            resource(
                "c",
                &[("retention.ms", delete, None), ("segment.ms", set, None)],
            ),
            resource("d", &[("retention.ms", delete, None)]),
        ]);
        let messages: Vec<_> = errors
            .into_iter()
            .map(|e| e.map(|e| (e.code, e.message.unwrap_or_default())))
            .collect();
        let invalid = |m: &str| Some((ResponseError::InvalidRequest, m.to_string()));
        assert_eq!(
            messages,
            vec![
                invalid("Each resource must appear at most once."),
                invalid("Error due to duplicate config keys"),
                invalid("Each resource must appear at most once."),
                invalid("Null value not supported for : segment.ms"),
                None,
            ]
        );
    }
}
