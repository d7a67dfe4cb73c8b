//! The metadata controller: the only writer of topic metadata. Runs on shard 0.
//!
//! A change is computed against the current image, validated per item, persisted
//! through the [`MetadataStore`], and then adopted by every shard (a
//! [`ShardReq::Apply`] to each) before the request is answered: when a client hears
//! "created", every shard can serve the topic. Changes run one at a time.

use std::collections::BTreeMap;
use std::sync::Arc;

use glommio::sync::Semaphore;
use kafka_protocol::error::ResponseError;
use sluice_shard::ShardId;
use uuid::Uuid;

use crate::broker::{Broker, ShardReq};
use crate::error::ApiError;
use crate::metadata::{MetadataImage, MetadataStore, TopicMeta};
use crate::topic_config::{validate_topic_name, TopicConfig};

/// Largest partition count a topic may have (a bound on per-topic work).
pub const PARTITIONS_MAX: i32 = 10_000;

#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    /// -1: the broker default.
    pub num_partitions: i32,
    /// -1: the broker default (1).
    pub replication_factor: i16,
    pub configs: Vec<(String, Option<String>)>,
}

/// IncrementalAlterConfigs operations (Kafka's numbering).
pub const OP_SET: i8 = 0;
pub const OP_DELETE: i8 = 1;
pub const OP_APPEND: i8 = 2;
pub const OP_SUBTRACT: i8 = 3;

#[derive(Debug, Clone)]
pub enum TopicRef {
    Name(String),
    Id(Uuid),
}

/// One IncrementalAlterConfigs operation: (config name, operation, value).
pub type ConfigOp = (String, i8, Option<String>);

pub enum ControlOp {
    CreateTopics {
        topics: Vec<NewTopic>,
        validate_only: bool,
    },
    DeleteTopics {
        topics: Vec<TopicRef>,
    },
    CreatePartitions {
        items: Vec<(String, i32)>,
        validate_only: bool,
    },
    AlterConfigs {
        items: Vec<(String, Vec<ConfigOp>)>,
        validate_only: bool,
    },
}

pub enum ControlResult {
    Created(Vec<Result<(String, TopicMeta), ApiError>>),
    Deleted(Vec<Result<(String, Uuid), ApiError>>),
    Done(Vec<Result<(), ApiError>>),
}

pub struct Controller {
    store: Box<dyn MetadataStore>,
    lock: Semaphore,
}

impl Controller {
    pub fn new(store: Box<dyn MetadataStore>) -> Controller {
        Controller {
            store,
            lock: Semaphore::new(1),
        }
    }

    pub async fn execute(&self, broker: &Broker, op: ControlOp) -> ControlResult {
        let _guard = self
            .lock
            .acquire_permit(1)
            .await
            .expect("controller lock never closes");
        let mut image: MetadataImage = (*broker.image()).clone();
        let (result, changed) = match op {
            ControlOp::CreateTopics {
                topics,
                validate_only,
            } => {
                let r: Vec<_> = topics
                    .into_iter()
                    .map(|t| create(&mut image, broker, t, validate_only))
                    .collect();
                let changed = !validate_only && r.iter().any(|x| x.is_ok());
                (ControlResult::Created(r), changed)
            }
            ControlOp::DeleteTopics { topics } => {
                let r: Vec<_> = topics.into_iter().map(|t| delete(&mut image, t)).collect();
                let changed = r.iter().any(|x| x.is_ok());
                (ControlResult::Deleted(r), changed)
            }
            ControlOp::CreatePartitions {
                items,
                validate_only,
            } => {
                let r: Vec<_> = items
                    .into_iter()
                    .map(|(t, n)| add_partitions(&mut image, &t, n, validate_only))
                    .collect();
                let changed = !validate_only && r.iter().any(|x| x.is_ok());
                (ControlResult::Done(r), changed)
            }
            ControlOp::AlterConfigs {
                items,
                validate_only,
            } => {
                let r: Vec<_> = items
                    .into_iter()
                    .map(|(t, ops)| alter(&mut image, &t, ops, validate_only))
                    .collect();
                let changed = !validate_only && r.iter().any(|x| x.is_ok());
                (ControlResult::Done(r), changed)
            }
        };
        if !changed {
            return result;
        }
        image.epoch += 1;
        if let Err(e) = self.store.store(&image) {
            tracing::error!(error = %e, "persisting metadata failed");
            let fail = || {
                ApiError::with(
                    ResponseError::KafkaStorageError,
                    format!("metadata not persisted: {e}"),
                )
            };
            return match result {
                ControlResult::Created(r) => {
                    ControlResult::Created(r.into_iter().map(|x| x.and(Err(fail()))).collect())
                }
                ControlResult::Deleted(r) => {
                    ControlResult::Deleted(r.into_iter().map(|x| x.and(Err(fail()))).collect())
                }
                ControlResult::Done(r) => {
                    ControlResult::Done(r.into_iter().map(|x| x.and(Err(fail()))).collect())
                }
            };
        }
        publish(broker, Arc::new(image)).await;
        result
    }
}

/// Hands `image` to every shard and waits until all have adopted it.
pub async fn publish(broker: &Broker, image: Arc<MetadataImage>) {
    let calls = broker
        .table
        .shards()
        .map(|s: ShardId| {
            let image = image.clone();
            async move {
                if let Err(e) = broker.mesh.call(s, ShardReq::Apply(image)).await {
                    tracing::error!(shard = %s, error = %e, "shard did not adopt the metadata image");
                }
            }
        })
        .collect();
    crate::util::join_all(calls).await;
}

fn configs_map(
    configs: Vec<(String, Option<String>)>,
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut map = BTreeMap::new();
    for (k, v) in configs {
        match v {
            Some(v) => {
                map.insert(k, v);
            }
            None => {
                return Err(ApiError::with(
                    ResponseError::InvalidConfig,
                    format!("Null value for config {k}"),
                ))
            }
        }
    }
    TopicConfig::parse(&map).map_err(|m| ApiError::with(ResponseError::InvalidConfig, m))?;
    Ok(map)
}

fn create(
    image: &mut MetadataImage,
    broker: &Broker,
    t: NewTopic,
    validate_only: bool,
) -> Result<(String, TopicMeta), ApiError> {
    validate_topic_name(&t.name)
        .map_err(|m| ApiError::with(ResponseError::InvalidTopicException, m))?;
    if image.topics.contains_key(&t.name) {
        return Err(ApiError::with(
            ResponseError::TopicAlreadyExists,
            format!("Topic '{}' already exists.", t.name),
        ));
    }
    let partitions = if t.num_partitions == -1 {
        broker.config.default_partitions
    } else {
        t.num_partitions
    };
    if !(1..=PARTITIONS_MAX).contains(&partitions) {
        return Err(ApiError::with(
            ResponseError::InvalidPartitions,
            format!("Number of partitions must be in [1, {PARTITIONS_MAX}], got {partitions}"),
        ));
    }
    if t.replication_factor != -1 && t.replication_factor != 1 {
        return Err(ApiError::with(
            ResponseError::InvalidReplicationFactor,
            format!(
                "Replication factor {} is larger than the 1 available broker",
                t.replication_factor
            ),
        ));
    }
    let configs = configs_map(t.configs)?;
    let meta = TopicMeta {
        id: Uuid::new_v4(),
        partitions,
        configs,
    };
    if !validate_only {
        image.topics.insert(t.name.clone(), meta.clone());
    }
    Ok((t.name, meta))
}

fn delete(image: &mut MetadataImage, t: TopicRef) -> Result<(String, Uuid), ApiError> {
    let name = match &t {
        TopicRef::Name(n) => Some(n.clone()),
        TopicRef::Id(id) => image.topic_by_id(*id).map(|(n, _)| n.clone()),
    };
    let unknown = || match &t {
        TopicRef::Name(_) => ApiError::new(ResponseError::UnknownTopicOrPartition),
        TopicRef::Id(_) => ApiError::new(ResponseError::UnknownTopicId),
    };
    let name = name.ok_or_else(unknown)?;
    let meta = image.topics.remove(&name).ok_or_else(unknown)?;
    Ok((name, meta.id))
}

fn add_partitions(
    image: &mut MetadataImage,
    topic: &str,
    count: i32,
    validate_only: bool,
) -> Result<(), ApiError> {
    let meta = image
        .topics
        .get_mut(topic)
        .ok_or_else(|| ApiError::new(ResponseError::UnknownTopicOrPartition))?;
    if count <= meta.partitions {
        return Err(ApiError::with(
            ResponseError::InvalidPartitions,
            format!("Topic currently has {} partitions, which is higher than or equal to the requested {count}.", meta.partitions),
        ));
    }
    if count > PARTITIONS_MAX {
        return Err(ApiError::with(
            ResponseError::InvalidPartitions,
            format!("at most {PARTITIONS_MAX} partitions"),
        ));
    }
    if !validate_only {
        meta.partitions = count;
    }
    Ok(())
}

fn alter(
    image: &mut MetadataImage,
    topic: &str,
    ops: Vec<ConfigOp>,
    validate_only: bool,
) -> Result<(), ApiError> {
    let meta = image
        .topics
        .get_mut(topic)
        .ok_or_else(|| ApiError::new(ResponseError::UnknownTopicOrPartition))?;
    let mut configs = meta.configs.clone();
    for (name, op, value) in ops {
        let bad = |m: String| ApiError::with(ResponseError::InvalidConfig, m);
        match op {
            OP_SET => {
                let v = value.ok_or_else(|| bad(format!("Null value for config {name}")))?;
                configs.insert(name, v);
            }
            OP_DELETE => {
                configs.remove(&name);
            }
            // List-valued configs: only cleanup.policy among the ones Sluice knows.
            OP_APPEND | OP_SUBTRACT if name == "cleanup.policy" => {
                let v = value.ok_or_else(|| bad(format!("Null value for config {name}")))?;
                let current = configs
                    .get(&name)
                    .cloned()
                    .unwrap_or_else(|| "delete".into());
                let mut items: Vec<String> =
                    current.split(',').map(|s| s.trim().to_string()).collect();
                for x in v.split(',').map(str::trim) {
                    if op == OP_APPEND {
                        if !items.iter().any(|i| i == x) {
                            items.push(x.to_string());
                        }
                    } else {
                        items.retain(|i| i != x);
                    }
                }
                configs.insert(name, items.join(","));
            }
            OP_APPEND | OP_SUBTRACT => {
                return Err(bad(format!(
                    "Config {name} is not a list; cannot APPEND or SUBTRACT"
                )))
            }
            _ => return Err(bad(format!("Unknown config operation {op}"))),
        }
    }
    TopicConfig::parse(&configs).map_err(|m| ApiError::with(ResponseError::InvalidConfig, m))?;
    if !validate_only {
        meta.configs = configs;
    }
    Ok(())
}
