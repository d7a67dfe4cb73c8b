//! DeleteTopics (key 20): by name (v0-5) or topic id (v6). A topic named (or
//! identified) twice is not deleted and is answered once, INVALID_REQUEST.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_topics_request::DeleteTopicsRequest;
use kafka_protocol::messages::delete_topics_response::{
    DeletableTopicResult, DeleteTopicsResponse,
};
use kafka_protocol::messages::TopicName;

use super::sb;
use crate::base::rpc::{DeleteTopics, DeletedTopic, TopicRef};
use crate::partition::broker::Broker;

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
    let (refs, repeated) = super::once_each(refs, |r| r.clone());
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
                Ok(DeletedTopic { name, id }) => {
                    base.with_name(Some(TopicName(sb(name)))).with_topic_id(id)
                }
                Err(e) => base
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb)),
            }
        })
        .chain(repeated.into_iter().map(|r| {
            let (base, what) = match r {
                TopicRef::Name(n) => (
                    DeletableTopicResult::default().with_name(Some(TopicName(sb(n)))),
                    "Duplicate topic name.",
                ),
                TopicRef::Id(id) => (
                    DeletableTopicResult::default().with_topic_id(id),
                    "Duplicate topic id.",
                ),
            };
            base.with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(sb(what)))
        }))
        .collect();
    DeleteTopicsResponse::default().with_responses(responses)
}
