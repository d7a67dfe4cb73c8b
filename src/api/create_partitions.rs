//! CreatePartitions (key 37): grows a topic's partition count.

use std::rc::Rc;

use kafka_protocol::messages::create_partitions_request::CreatePartitionsRequest;
use kafka_protocol::messages::create_partitions_response::{
    CreatePartitionsResponse, CreatePartitionsTopicResult,
};

use super::sb;
use crate::broker::Broker;
use crate::rpc::CreatePartitions;

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let names: Vec<_> = req.topics.iter().map(|t| t.name.clone()).collect();
    let items = req
        .topics
        .iter()
        .map(|t| (t.name.0.to_string(), t.count))
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
        .collect();
    CreatePartitionsResponse::default().with_results(results)
}
