//! Internal topics on the partition host: creating `__consumer_offsets` and
//! `__transaction_state` on first use, and replaying a partition of one for the
//! coordinator shell that loads it.

use super::*;

impl Broker {
    /// Reads a partition of this shard from its log start to its end, handing each
    /// decoded record to `each` (a coordinator replaying its internal topic). The
    /// requesting shard may have seen the partition before this one's image or open
    /// logs did (a topic just created, leadership just moved): that, and a read
    /// failure, is COORDINATOR_LOAD_IN_PROGRESS (what Kafka answers while a coordinator
    /// loads; clients retry it); an undecodable batch is COORDINATOR_NOT_AVAILABLE.
    /// Returns the number of records read.
    pub async fn replay(
        &self,
        topic: &str,
        partition: i32,
        mut each: impl FnMut(kafka_protocol::records::Record),
    ) -> Result<usize, ApiError> {
        const READ_BYTES: usize = 1 << 20;
        let (log, _) = self.log(topic, partition).map_err(|e| {
            ApiError::with(
                ResponseError::CoordinatorLoadInProgress,
                format!("{topic}-{partition} is not ready on this shard: {e}"),
            )
        })?;
        let mut offset = log.log_start_offset();
        let mut n = 0usize;
        loop {
            let r = log.read(offset, READ_BYTES, None).await.map_err(|e| {
                ApiError::with(ResponseError::CoordinatorLoadInProgress, e.to_string())
            })?;
            if r.records.is_empty() || r.next_offset <= offset {
                return Ok(n);
            }
            offset = r.next_offset;
            let mut buf = r.records.clone();
            while !buf.is_empty() {
                let set =
                    kafka_protocol::records::RecordBatchDecoder::decode(&mut buf).map_err(|e| {
                        ApiError::with(
                            ResponseError::CoordinatorNotAvailable,
                            format!("{topic}-{partition}: {e}"),
                        )
                    })?;
                for rec in set.records {
                    n += 1;
                    each(rec);
                }
            }
        }
    }

    /// Creates an internal topic (`__consumer_offsets`, `__transaction_state`) if it
    /// does not exist yet: compacted, Kafka's 100 MiB segments, the default
    /// replication factor.
    pub async fn ensure_internal_topic(&self, name: &str, partitions: i32) -> Result<(), ApiError> {
        if self.image().topics.contains_key(name) {
            return Ok(());
        }
        let topic = crate::base::rpc::NewTopic {
            name: name.to_string(),
            num_partitions: partitions,
            replication_factor: -1,
            configs: [
                ("cleanup.policy", "compact"),
                ("segment.bytes", "104857600"),
            ]
            .map(|(name, value)| crate::base::rpc::NewTopicConfig {
                name: name.into(),
                value: Some(value.into()),
            })
            .into(),
            assignments: Vec::new(),
        };
        let create = crate::base::rpc::CreateTopics {
            topics: vec![topic],
            validate_only: false,
        };
        match self.control(create).await?.pop() {
            Some(Ok(_)) => {
                tracing::info!("created {name}");
                Ok(())
            }
            Some(Err(e)) if e.code == ResponseError::TopicAlreadyExists => Ok(()),
            Some(Err(e)) => Err(e),
            None => Err(ApiError::new(ResponseError::CoordinatorNotAvailable)),
        }
    }
}
