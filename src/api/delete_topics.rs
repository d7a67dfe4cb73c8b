//! DeleteTopics (key 20): by name (v0-5) or topic id (v6).

use std::rc::Rc;

use kafka_protocol::messages::delete_topics_request::DeleteTopicsRequest;
use kafka_protocol::messages::delete_topics_response::{
    DeletableTopicResult, DeleteTopicsResponse,
};
use kafka_protocol::messages::TopicName;

use super::sb;
use crate::broker::Broker;
use crate::rpc::{DeleteTopics, TopicRef};

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let refs: Vec<TopicRef> = if version >= 6 {
        req.topics
            .iter()
            .map(|t| match &t.name {
                Some(n) => TopicRef::Name(n.0.to_string()),
                None => TopicRef::Id(t.topic_id),
            })
            .collect()
    } else {
        req.topic_names
            .iter()
            .map(|n| TopicRef::Name(n.0.to_string()))
            .collect()
    };
    let results = match broker
        .control(DeleteTopics {
            topics: refs.clone(),
        })
        .await
    {
        Ok(r) => r,
        Err(e) => refs.iter().map(|_| Err(e.clone())).collect(),
    };
    let responses = refs
        .into_iter()
        .zip(results)
        .map(|(r, res)| {
            let base = match &r {
                TopicRef::Name(n) => {
                    DeletableTopicResult::default().with_name(Some(TopicName(sb(n.clone()))))
                }
                TopicRef::Id(id) => DeletableTopicResult::default().with_topic_id(*id),
            };
            match res {
                Ok((name, id)) => base.with_name(Some(TopicName(sb(name)))).with_topic_id(id),
                Err(e) => base
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            }
        })
        .collect();
    DeleteTopicsResponse::default().with_responses(responses)
}
