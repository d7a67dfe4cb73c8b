//! IncrementalAlterConfigs (key 44): SET / DELETE / APPEND / SUBTRACT on topic configs
//! and on the dynamic broker configs (see [`crate::broker_configs`]): a BROKER resource
//! named by this broker's id changes its own, the empty name the cluster-wide
//! defaults; another broker's id is INVALID_REQUEST (clients send it to that broker).

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::incremental_alter_configs_request::IncrementalAlterConfigsRequest;
use kafka_protocol::messages::incremental_alter_configs_response::{
    AlterConfigsResourceResponse, IncrementalAlterConfigsResponse,
};

use super::describe_configs::{RESOURCE_BROKER, RESOURCE_TOPIC};
use super::sb;
use crate::broker::Broker;
use crate::error::ApiError;
use crate::rpc::{AlterConfigs, ConfigChange};

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut items = Vec::new();
    let mut brokers = Vec::new();
    let mut shape = Vec::new();
    let me = broker.config.node_id;
    for r in &req.resources {
        let ops = || {
            r.configs
                .iter()
                .map(|c| {
                    (
                        c.name.to_string(),
                        c.config_operation,
                        c.value.as_ref().map(|v| v.to_string()),
                    )
                })
                .collect()
        };
        let name = r.resource_name.as_str();
        if r.resource_type == RESOURCE_TOPIC {
            items.push((name.to_string(), ConfigChange::Incremental(ops())));
            shape.push((r.resource_type, r.resource_name.clone(), None));
        } else if r.resource_type == RESOURCE_BROKER && (name.is_empty() || name == me.to_string())
        {
            let scope = if name.is_empty() { -1 } else { me };
            brokers.push((scope, ConfigChange::Incremental(ops())));
            shape.push((r.resource_type, r.resource_name.clone(), None));
        } else if r.resource_type == RESOURCE_BROKER {
            let e = ApiError::with(
                ResponseError::InvalidRequest,
                format!("This is broker {me}, not broker {name}"),
            );
            shape.push((r.resource_type, r.resource_name.clone(), Some(e)));
        } else {
            let e = ApiError::with(
                ResponseError::InvalidRequest,
                format!(
                    "resource type {} cannot be altered on this broker",
                    r.resource_type
                ),
            );
            shape.push((r.resource_type, r.resource_name.clone(), Some(e)));
        }
    }
    let topics_n = items.len();
    let n = topics_n + brokers.len();
    let mut results = match broker
        .control(AlterConfigs {
            items,
            brokers,
            validate_only: req.validate_only,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    };
    // The controller answers the topics first, then the broker scopes.
    let mut broker_results = results.split_off(topics_n.min(results.len())).into_iter();
    let mut results = results.into_iter();
    let responses = shape
        .into_iter()
        .map(|(rt, name, err)| {
            let r = match err {
                Some(e) => Err(e),
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
