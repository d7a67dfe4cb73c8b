//! IncrementalAlterConfigs (key 44): SET / DELETE / APPEND / SUBTRACT on topic configs.
//! Broker configs are static (the config file and flags): altering them is refused.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::incremental_alter_configs_request::IncrementalAlterConfigsRequest;
use kafka_protocol::messages::incremental_alter_configs_response::{
    AlterConfigsResourceResponse, IncrementalAlterConfigsResponse,
};

use super::describe_configs::RESOURCE_TOPIC;
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
    let mut shape = Vec::new();
    for r in &req.resources {
        if r.resource_type == RESOURCE_TOPIC {
            let ops = r
                .configs
                .iter()
                .map(|c| {
                    (
                        c.name.to_string(),
                        c.config_operation,
                        c.value.as_ref().map(|v| v.to_string()),
                    )
                })
                .collect();
            items.push((r.resource_name.to_string(), ConfigChange::Incremental(ops)));
            shape.push((r.resource_type, r.resource_name.clone(), None));
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
    let n = items.len();
    let mut results = match broker
        .control(AlterConfigs {
            items,
            validate_only: req.validate_only,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => (0..n).map(|_| Err(e.clone())).collect(),
    }
    .into_iter();
    let responses = shape
        .into_iter()
        .map(|(rt, name, err)| {
            let r = match err {
                Some(e) => Err(e),
                None => results.next().expect("one result per topic resource"),
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
