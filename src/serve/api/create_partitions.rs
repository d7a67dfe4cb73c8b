//! CreatePartitions (key 37): grows a topic's partition count; the new partitions are
//! placed by the controller or as the request's assignments say (one replica list per
//! new partition, of the topic's replication factor). A topic named twice grows by
//! neither entry and is answered once, INVALID_REQUEST.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsRequest;
use kafka_protocol::messages::create_partitions_response::{
    CreatePartitionsResponse, CreatePartitionsTopicResult,
};

use super::sb;
use crate::base::rpc::{CreatePartitions, NewPartitions};
use crate::partition::broker::Broker;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let (once, repeated) = super::once_each(req.topics, |t| t.name.clone());
    let names: Vec<_> = once.iter().map(|t| t.name.clone()).collect();
    let items = once
        .into_iter()
        .map(|t| NewPartitions {
            topic: t.name.0.to_string(),
            count: t.count,
            assignments: t.assignments.map(|lists| {
                lists
                    .into_iter()
                    .map(|a| a.broker_ids.into_iter().map(|b| b.0).collect())
                    .collect()
            }),
        })
        .collect();
    let results = match broker
        .control(CreatePartitions {
            items,
            validate_only: req.validate_only,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => names.iter().map(|_| Err(e.clone())).collect(),
    };
    let results = names
        .into_iter()
        .zip(results)
        .map(|(name, r)| {
            let base = CreatePartitionsTopicResult::default().with_name(name);
            match r {
                Ok(()) => base,
                Err(e) => base
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            }
        })
        .chain(repeated.into_iter().map(|name| {
            CreatePartitionsTopicResult::default()
                .with_name(name)
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(sb("Duplicate topic name.")))
        }))
        .collect();
    CreatePartitionsResponse::default().with_results(results)
}
