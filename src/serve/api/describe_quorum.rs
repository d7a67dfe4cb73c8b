//! DescribeQuorum (key 55, KIP-595; v1 adds the timestamps): the metadata quorum —
//! partition 0 of `__cluster_metadata` — as its leader sees it: leader, leader epoch
//! (the raft term), high watermark (the commit index), and per voter its replicated
//! log end and last contact. The leader's broker answers; another one answers the
//! partition NOT_LEADER_OR_FOLLOWER with the leader's id, as a Kafka controller that
//! does not lead does (so the client asks there). Another topic or partition is
//! UNKNOWN_TOPIC_OR_PARTITION. Observers are the quorum's learners: the nodes that
//! joined outside the bootstrap voters and are not voters (yet). A node's last contact
//! is the controller's last broker heartbeat or hello from it; its last caught-up time
//! is that contact when its log end has reached the high watermark, else -1 (no
//! history of it is kept).

use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_quorum_request::DescribeQuorumRequest;
use kafka_protocol::messages::describe_quorum_response::{
    DescribeQuorumResponse, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::BrokerId;

use super::sb;
use crate::base::rpc::DescribeQuorum;
use crate::partition::broker::Broker;

/// The metadata log's name, as Kafka's.
const METADATA_TOPIC: &str = "__cluster_metadata";

pub async fn handle(
    broker: &Rc<Broker>,
    _version: i16,
    req: DescribeQuorumRequest,
) -> DescribeQuorumResponse {
    let view = broker.control(DescribeQuorum).await;
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let out = PartitionData::default().with_partition_index(p.partition_index);
                    if t.topic_name.0.as_str() != METADATA_TOPIC || p.partition_index != 0 {
                        return out.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    }
                    match &view {
                        Err(e) => out
                            .with_error_code(e.code())
                            .with_error_message(e.message.clone().map(sb)),
                        Ok(Err(leader)) => out
                            .with_error_code(ResponseError::NotLeaderOrFollower.code())
                            .with_leader_id(BrokerId(*leader)),
                        Ok(Ok(q)) => {
                            let states = |nodes: &[(i32, i64, i64)]| {
                                nodes
                                    .iter()
                                    .map(|&(id, end, heard)| {
                                        let caught_up =
                                            if end >= q.high_watermark { heard } else { -1 };
                                        ReplicaState::default()
                                            .with_replica_id(BrokerId(id))
                                            .with_log_end_offset(end)
                                            .with_last_fetch_timestamp(heard)
                                            .with_last_caught_up_timestamp(caught_up)
                                    })
                                    .collect()
                            };
                            out.with_leader_id(BrokerId(q.leader))
                                .with_leader_epoch(q.term)
                                .with_high_watermark(q.high_watermark)
                                .with_current_voters(states(&q.voters))
                                .with_observers(states(&q.observers))
                        }
                    }
                })
                .collect();
            TopicData::default()
                .with_topic_name(t.topic_name.clone())
                .with_partitions(partitions)
        })
        .collect();
    DescribeQuorumResponse::default().with_topics(topics)
}
