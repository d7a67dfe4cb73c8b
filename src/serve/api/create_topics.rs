//! CreateTopics (key 19): validated and persisted by the controller; partitions are
//! placed by the controller or, with `num_partitions` and `replication_factor` -1, as
//! the request's manual `assignments` say (checked as Kafka checks them). A name given
//! twice creates nothing and is answered once, INVALID_REQUEST.

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreateTopicsRequest;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult, CreateTopicsResponse,
};

use super::sb;
use crate::base::broker_configs;
use crate::base::rpc::{CreateTopics, CreatedTopic, ManualAssignment, NewTopic, NewTopicConfig};
use crate::partition::broker::Broker;

pub async fn handle(
    broker: &Rc<Broker>,
    version: i16,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let (once, repeated) = super::once_each(req.topics, |t| t.name.clone());
    let names: Vec<_> = once.iter().map(|t| t.name.clone()).collect();
    let topics = once
        .into_iter()
        .map(|t| NewTopic {
            name: t.name.0.to_string(),
            num_partitions: t.num_partitions,
            replication_factor: t.replication_factor,
            assignments: t
                .assignments
                .into_iter()
                .map(|a| ManualAssignment {
                    partition: a.partition_index,
                    broker_ids: a.broker_ids.into_iter().map(Into::into).collect(),
                })
                .collect(),
            configs: t
                .configs
                .into_iter()
                .map(|c| NewTopicConfig {
                    name: c.name.to_string(),
                    value: c.value.map(|v| v.to_string()),
                })
                .collect(),
        })
        .collect();
    let results = match broker
        .control(CreateTopics {
            topics,
            validate_only: req.validate_only,
        })
        .await
    {
        Ok(r) => r,
        Err(e) => names.iter().map(|_| Err(e.clone())).collect(),
    };
    let (image, me) = (broker.image(), broker.config.node_id);
    let topics = names
        .into_iter()
        .zip(results)
        .map(|(name, r)| {
            let base = CreatableTopicResult::default().with_name(name);
            match r {
                Ok(CreatedTopic { meta, .. }) => {
                    let rf = meta
                        .assignments
                        .first()
                        .map_or(-1, |a| a.replicas.len() as i16);
                    // v5+ (KIP-525): the topic's configs as DescribeConfigs would give
                    // them, which the Java AdminClient's CreateTopicsResult.config reads.
                    let configs = (version >= 5).then(|| {
                        broker_configs::describe_topic(
                            &image,
                            crate::base::ids::BrokerId::new(me),
                            &meta.configs,
                            meta.assignments.iter().map(|a| a.replicas.len()).min(),
                        )
                        .into_iter()
                        .map(|d| {
                            CreatableTopicConfigs::default()
                                .with_name(sb(d.name))
                                .with_value(d.value.map(sb))
                                .with_read_only(d.read_only)
                                .with_config_source(d.source)
                        })
                        .collect()
                    });
                    base.with_topic_id(meta.id)
                        .with_num_partitions(meta.partitions)
                        .with_replication_factor(rf)
                        .with_configs(configs)
                }
                Err(e) => base
                    .with_error_code(e.code())
                    .with_error_message(e.message.map(sb))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1),
            }
        })
        .chain(repeated.into_iter().map(|name| {
            CreatableTopicResult::default()
                .with_name(name)
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_error_message(Some(sb("Duplicate topic name.")))
                .with_num_partitions(-1)
                .with_replication_factor(-1)
        }))
        .collect();
    CreateTopicsResponse::default().with_topics(topics)
}
