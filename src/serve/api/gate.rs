//! The authorizer in front of every API (`--authorizer`): Kafka's checks per request,
//! made before the handler acts ([`check`]), with Kafka's answers.
//!
//! A request one resource decides (the cluster for admin APIs, the group for JoinGroup,
//! the transactional id for EndTxn) is refused whole with the API's error. A request
//! over many topics, groups or transactional ids goes on with the ones the principal
//! may act on; the others are answered with TOPIC_AUTHORIZATION_FAILED,
//! GROUP_AUTHORIZATION_FAILED or TRANSACTIONAL_ID_AUTHORIZATION_FAILED beside the
//! handler's answers (the [`Patch`] run on its response). Listings (Metadata of every
//! topic, ListGroups, ListTransactions, OffsetFetch of every topic) leave out what the
//! principal may not describe. Which operation each API needs is Kafka's
//! (`KafkaApis`), table in docs/security.md.
//!
//! Without `--authorizer` nothing here runs ([`check`] returns the request untouched).

use std::collections::HashSet;
use std::rc::Rc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorized_ops::NOT_PROVIDED;
use super::sb;
use crate::partition::broker::Broker;
use crate::serve::authz::{op, resource, Caller};

/// What the handler's response gets afterwards.
pub type Patch = Box<dyn FnOnce(&Broker, &mut ResponseKind)>;

/// The gate's verdict on a request.
pub enum Gate {
    /// Go on with this request (some of its resources may have been taken out), then
    /// run the patch over the response.
    Pass(Box<RequestKind>, Option<Patch>),
    /// Refused whole: answer this.
    Refuse(Box<ResponseKind>),
    /// Produce with acks=0 that names a refused topic: the allowed partitions are
    /// appended, then the connection closes (Kafka's answer to a failed acks=0 write).
    PassThenClose(Box<RequestKind>),
}

/// What the ACL APIs answer without `--authorizer` (SECURITY_DISABLED).
const NO_AUTHORIZER: &str =
    "No Authorizer is configured on the broker (sluice serve --authorizer true)";

const TOPIC_DENIED: ResponseError = ResponseError::TopicAuthorizationFailed;
const GROUP_DENIED: ResponseError = ResponseError::GroupAuthorizationFailed;
const CLUSTER_DENIED: ResponseError = ResponseError::ClusterAuthorizationFailed;
const TXN_DENIED: ResponseError = ResponseError::TransactionalIdAuthorizationFailed;

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// The topics among `names` the caller may not perform `operation` on.
fn denied_topics<'a>(
    broker: &Broker,
    caller: &Caller,
    operation: i8,
    names: impl IntoIterator<Item = &'a str>,
) -> HashSet<String> {
    let mut seen = HashSet::new();
    names
        .into_iter()
        .filter(|n| seen.insert(*n))
        .filter(|n| !caller.may(broker, operation, resource::TOPIC, n))
        .map(str::to_string)
        .collect()
}

/// Runs Kafka's authorization of `body` for `caller`.
pub fn check(broker: &Rc<Broker>, caller: &Rc<Caller>, version: i16, body: RequestKind) -> Gate {
    if broker.config.authorizer.is_none() {
        return match body {
            // Kafka without an authorizer: bindings can be neither made nor read.
            RequestKind::CreateAcls(r) => {
                let results = r
                    .creations
                    .iter()
                    .map(|_| {
                        create_acls_response::AclCreationResult::default()
                            .with_error_code(code(ResponseError::SecurityDisabled))
                            .with_error_message(Some(sb(NO_AUTHORIZER)))
                    })
                    .collect();
                Gate::Refuse(Box::new(ResponseKind::CreateAcls(
                    CreateAclsResponse::default().with_results(results),
                )))
            }
            RequestKind::DeleteAcls(r) => {
                let results = r
                    .filters
                    .iter()
                    .map(|_| {
                        delete_acls_response::DeleteAclsFilterResult::default()
                            .with_error_code(code(ResponseError::SecurityDisabled))
                            .with_error_message(Some(sb(NO_AUTHORIZER)))
                    })
                    .collect();
                Gate::Refuse(Box::new(ResponseKind::DeleteAcls(
                    DeleteAclsResponse::default().with_filter_results(results),
                )))
            }
            RequestKind::DescribeAcls(_) => Gate::Refuse(Box::new(ResponseKind::DescribeAcls(
                DescribeAclsResponse::default()
                    .with_error_code(code(ResponseError::SecurityDisabled))
                    .with_error_message(Some(sb(NO_AUTHORIZER))),
            ))),
            body => Gate::Pass(Box::new(body), None),
        };
    }
    let b: &Broker = broker;
    let c: &Caller = caller;
    let cluster = |operation| c.may_cluster(b, operation);
    let group = |operation, g: &str| c.may(b, operation, resource::GROUP, g);
    let txn = |operation, t: &str| c.may(b, operation, resource::TRANSACTIONAL_ID, t);
    let refuse = |r: ResponseKind| Gate::Refuse(Box::new(r));
    let pass = |r: RequestKind| Gate::Pass(Box::new(r), None);
    let caller = caller.clone();
    match body {
        RequestKind::ApiVersions(_)
        | RequestKind::SaslHandshake(_)
        | RequestKind::SaslAuthenticate(_) => pass(body),
        RequestKind::DescribeCluster(r) => {
            let asked = r.include_cluster_authorized_operations;
            let patch: Patch = Box::new(move |b, resp| {
                if let ResponseKind::DescribeCluster(d) = resp {
                    if asked {
                        d.cluster_authorized_operations = cluster_ops(b, &caller);
                    }
                }
            });
            Gate::Pass(Box::new(RequestKind::DescribeCluster(r)), Some(patch))
        }
        // The cluster decides these.
        RequestKind::CreateAcls(r) if !cluster(op::ALTER) => {
            let results = r
                .creations
                .iter()
                .map(|_| {
                    create_acls_response::AclCreationResult::default()
                        .with_error_code(code(CLUSTER_DENIED))
                })
                .collect();
            refuse(ResponseKind::CreateAcls(
                CreateAclsResponse::default().with_results(results),
            ))
        }
        RequestKind::DeleteAcls(r) if !cluster(op::ALTER) => {
            let results = r
                .filters
                .iter()
                .map(|_| {
                    delete_acls_response::DeleteAclsFilterResult::default()
                        .with_error_code(code(CLUSTER_DENIED))
                })
                .collect();
            refuse(ResponseKind::DeleteAcls(
                DeleteAclsResponse::default().with_filter_results(results),
            ))
        }
        RequestKind::DescribeClientQuotas(_) if !cluster(op::DESCRIBE_CONFIGS) => {
            refuse(ResponseKind::DescribeClientQuotas(
                DescribeClientQuotasResponse::default()
                    .with_error_code(code(CLUSTER_DENIED))
                    .with_entries(None),
            ))
        }
        RequestKind::AlterClientQuotas(r) if !cluster(op::ALTER_CONFIGS) => {
            use alter_client_quotas_response::*;
            let entries = r
                .entries
                .into_iter()
                .map(|e| {
                    EntryData::default()
                        .with_error_code(code(CLUSTER_DENIED))
                        .with_entity(
                            e.entity
                                .into_iter()
                                .map(|c| {
                                    EntityData::default()
                                        .with_entity_type(c.entity_type)
                                        .with_entity_name(c.entity_name)
                                })
                                .collect(),
                        )
                })
                .collect();
            refuse(ResponseKind::AlterClientQuotas(
                AlterClientQuotasResponse::default().with_entries(entries),
            ))
        }
        RequestKind::DescribeAcls(_) if !cluster(op::DESCRIBE) => {
            refuse(ResponseKind::DescribeAcls(
                DescribeAclsResponse::default().with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::ElectLeaders(r) if !cluster(op::ALTER) => {
            // v0 has no top-level error: every partition named carries it.
            use elect_leaders_response::*;
            let results = r
                .topic_partitions
                .iter()
                .flatten()
                .map(|t| {
                    ReplicaElectionResult::default()
                        .with_topic(t.topic.clone())
                        .with_partition_result(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    PartitionResult::default()
                                        .with_partition_id(*p)
                                        .with_error_code(code(CLUSTER_DENIED))
                                })
                                .collect(),
                        )
                })
                .collect();
            let resp = ElectLeadersResponse::default().with_replica_election_results(results);
            refuse(ResponseKind::ElectLeaders(if version >= 1 {
                resp.with_error_code(code(CLUSTER_DENIED))
            } else {
                resp
            }))
        }
        RequestKind::AlterPartitionReassignments(_) if !cluster(op::ALTER) => {
            refuse(ResponseKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsResponse::default()
                    .with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::ListPartitionReassignments(_) if !cluster(op::DESCRIBE) => {
            refuse(ResponseKind::ListPartitionReassignments(
                ListPartitionReassignmentsResponse::default().with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::DescribeQuorum(_) if !cluster(op::DESCRIBE) => {
            refuse(ResponseKind::DescribeQuorum(
                DescribeQuorumResponse::default().with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::AddRaftVoter(_) if !cluster(op::ALTER) => refuse(ResponseKind::AddRaftVoter(
            AddRaftVoterResponse::default().with_error_code(code(CLUSTER_DENIED)),
        )),
        RequestKind::RemoveRaftVoter(_) if !cluster(op::ALTER) => {
            refuse(ResponseKind::RemoveRaftVoter(
                RemoveRaftVoterResponse::default().with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::UnregisterBroker(_) if !cluster(op::ALTER) => {
            refuse(ResponseKind::UnregisterBroker(
                UnregisterBrokerResponse::default().with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::DescribeLogDirs(_) if !cluster(op::DESCRIBE) => {
            refuse(ResponseKind::DescribeLogDirs(
                DescribeLogDirsResponse::default().with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::DescribeUserScramCredentials(_) if !cluster(op::DESCRIBE) => {
            refuse(ResponseKind::DescribeUserScramCredentials(
                DescribeUserScramCredentialsResponse::default()
                    .with_error_code(code(CLUSTER_DENIED)),
            ))
        }
        RequestKind::AlterUserScramCredentials(r) if !cluster(op::ALTER) => {
            let users: Vec<String> = r
                .deletions
                .iter()
                .map(|d| d.name.to_string())
                .chain(r.upsertions.iter().map(|u| u.name.to_string()))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let results = users
                .into_iter()
                .map(|u| {
                    alter_user_scram_credentials_response::AlterUserScramCredentialsResult::default(
                    )
                    .with_user(sb(u))
                    .with_error_code(code(CLUSTER_DENIED))
                })
                .collect();
            refuse(ResponseKind::AlterUserScramCredentials(
                AlterUserScramCredentialsResponse::default().with_results(results),
            ))
        }
        RequestKind::AlterReplicaLogDirs(r) if !cluster(op::ALTER) => {
            let results = r
                .dirs
                .iter()
                .flat_map(|d| &d.topics)
                .map(|t| {
                    alter_replica_log_dirs_response::AlterReplicaLogDirTopicResult::default()
                        .with_topic_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    alter_replica_log_dirs_response::AlterReplicaLogDirPartitionResult::default()
                                        .with_partition_index(*p)
                                        .with_error_code(code(CLUSTER_DENIED))
                                })
                                .collect(),
                        )
                })
                .collect();
            refuse(ResponseKind::AlterReplicaLogDirs(
                AlterReplicaLogDirsResponse::default().with_results(results),
            ))
        }
        RequestKind::WriteTxnMarkers(r) if !cluster(op::CLUSTER_ACTION) => {
            use write_txn_markers_response::*;
            let markers = r
                .markers
                .iter()
                .map(|m| {
                    WritableTxnMarkerResult::default()
                        .with_producer_id(m.producer_id)
                        .with_topics(
                            m.topics
                                .iter()
                                .map(|t| {
                                    WritableTxnMarkerTopicResult::default()
                                        .with_name(t.name.clone())
                                        .with_partitions(
                                            t.partition_indexes
                                                .iter()
                                                .map(|p| {
                                                    WritableTxnMarkerPartitionResult::default()
                                                        .with_partition_index(*p)
                                                        .with_error_code(code(CLUSTER_DENIED))
                                                })
                                                .collect(),
                                        )
                                })
                                .collect(),
                        )
                })
                .collect();
            refuse(ResponseKind::WriteTxnMarkers(
                WriteTxnMarkersResponse::default().with_markers(markers),
            ))
        }
        // A group decides these.
        RequestKind::JoinGroup(r) if !group(op::READ, &r.group_id) => {
            refuse(ResponseKind::JoinGroup(
                JoinGroupResponse::default()
                    .with_error_code(code(GROUP_DENIED))
                    .with_generation_id(-1),
            ))
        }
        RequestKind::SyncGroup(r) if !group(op::READ, &r.group_id) => {
            refuse(ResponseKind::SyncGroup(
                SyncGroupResponse::default().with_error_code(code(GROUP_DENIED)),
            ))
        }
        RequestKind::Heartbeat(r) if !group(op::READ, &r.group_id) => {
            refuse(ResponseKind::Heartbeat(
                HeartbeatResponse::default().with_error_code(code(GROUP_DENIED)),
            ))
        }
        RequestKind::ConsumerGroupHeartbeat(r) if !group(op::READ, &r.group_id) => {
            refuse(ResponseKind::ConsumerGroupHeartbeat(
                ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(code(GROUP_DENIED))
                    .with_error_message(Some(sb("Group authorization failed."))),
            ))
        }
        RequestKind::ConsumerGroupDescribe(mut r) => {
            let refused = take(&mut r.group_ids, |g| !group(op::DESCRIBE, g));
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::ConsumerGroupDescribe(resp) = resp {
                    resp.groups.extend(refused.into_iter().map(|g| {
                        consumer_group_describe_response::DescribedGroup::default()
                            .with_group_id(g)
                            .with_error_code(code(GROUP_DENIED))
                            .with_authorized_operations(NOT_PROVIDED)
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::ConsumerGroupDescribe(r)), Some(patch))
        }
        RequestKind::LeaveGroup(r) if !group(op::READ, &r.group_id) => {
            refuse(ResponseKind::LeaveGroup(
                LeaveGroupResponse::default().with_error_code(code(GROUP_DENIED)),
            ))
        }
        RequestKind::OffsetDelete(r) if !group(op::DELETE, &r.group_id) => {
            refuse(ResponseKind::OffsetDelete(
                OffsetDeleteResponse::default().with_error_code(code(GROUP_DENIED)),
            ))
        }
        RequestKind::OffsetDelete(mut r) => {
            let refused = take(&mut r.topics, |t| {
                !c.may(b, op::READ, resource::TOPIC, &t.name)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::OffsetDelete(resp) = resp {
                    use offset_delete_response::*;
                    resp.topics.extend(refused.into_iter().map(|t| {
                        OffsetDeleteResponseTopic::default()
                            .with_name(t.name)
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        OffsetDeleteResponsePartition::default()
                                            .with_partition_index(p.partition_index)
                                            .with_error_code(code(TOPIC_DENIED))
                                    })
                                    .collect(),
                            )
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::OffsetDelete(r)), Some(patch))
        }
        // Transactional ids decide these.
        RequestKind::EndTxn(r) if !txn(op::WRITE, &r.transactional_id) => refuse(
            ResponseKind::EndTxn(EndTxnResponse::default().with_error_code(code(TXN_DENIED))),
        ),
        RequestKind::AddOffsetsToTxn(r) => {
            let e = if !txn(op::WRITE, &r.transactional_id) {
                Some(TXN_DENIED)
            } else if !group(op::READ, &r.group_id) {
                Some(GROUP_DENIED)
            } else {
                None
            };
            match e {
                Some(e) => refuse(ResponseKind::AddOffsetsToTxn(
                    AddOffsetsToTxnResponse::default().with_error_code(code(e)),
                )),
                None => pass(RequestKind::AddOffsetsToTxn(r)),
            }
        }
        RequestKind::InitProducerId(r) => {
            let e = match r.transactional_id.as_ref().filter(|t| !t.is_empty()) {
                Some(t) if !txn(op::WRITE, t) => Some(TXN_DENIED),
                Some(_) => None,
                None if !cluster(op::IDEMPOTENT_WRITE)
                    && !c.may_any(b, op::WRITE, resource::TOPIC) =>
                {
                    Some(CLUSTER_DENIED)
                }
                None => None,
            };
            match e {
                Some(e) => refuse(ResponseKind::InitProducerId(
                    InitProducerIdResponse::default()
                        .with_error_code(code(e))
                        .with_producer_id((-1).into())
                        .with_producer_epoch(-1),
                )),
                None => pass(RequestKind::InitProducerId(r)),
            }
        }
        RequestKind::Produce(r) => produce(b, c, r),
        RequestKind::Fetch(r) => fetch(b, c, caller, r),
        RequestKind::ListOffsets(mut r) => {
            let denied = denied_topics(b, c, op::DESCRIBE, r.topics.iter().map(|t| &*t.name.0));
            let refused = take(&mut r.topics, |t| denied.contains(&*t.name.0));
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::ListOffsets(resp) = resp {
                    use list_offsets_response::*;
                    resp.topics.extend(refused.into_iter().map(|t| {
                        ListOffsetsTopicResponse::default()
                            .with_name(t.name)
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        ListOffsetsPartitionResponse::default()
                                            .with_partition_index(p.partition_index)
                                            .with_error_code(code(TOPIC_DENIED))
                                            .with_offset(-1)
                                            .with_timestamp(-1)
                                    })
                                    .collect(),
                            )
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::ListOffsets(r)), Some(patch))
        }
        RequestKind::OffsetForLeaderEpoch(mut r) => {
            // Kafka: CLUSTER_ACTION (a follower) may ask of every topic; anyone else
            // needs DESCRIBE on each.
            if c.may_cluster_quietly(b, op::CLUSTER_ACTION) {
                return pass(RequestKind::OffsetForLeaderEpoch(r));
            }
            let denied = denied_topics(b, c, op::DESCRIBE, r.topics.iter().map(|t| &*t.topic.0));
            let refused = take(&mut r.topics, |t| denied.contains(&*t.topic.0));
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::OffsetForLeaderEpoch(resp) = resp {
                    resp.topics.extend(epoch_errors(refused, TOPIC_DENIED));
                }
            });
            Gate::Pass(Box::new(RequestKind::OffsetForLeaderEpoch(r)), Some(patch))
        }
        RequestKind::Metadata(r) => metadata(b, c, caller, version, r),
        RequestKind::DescribeTopicPartitions(r) => {
            let named: HashSet<String> = r.topics.iter().map(|t| t.name.to_string()).collect();
            let patch: Patch = Box::new(move |b, resp| {
                if let ResponseKind::DescribeTopicPartitions(resp) = resp {
                    resp.topics.retain_mut(|t| {
                        let name = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                        if named.contains(&name) {
                            if !caller.may(b, op::DESCRIBE, resource::TOPIC, &name) {
                                *t = describe_topic_partitions_response::DescribeTopicPartitionsResponseTopic::default()
                                    .with_name(t.name.clone())
                                    .with_error_code(code(TOPIC_DENIED))
                                    .with_topic_authorized_operations(NOT_PROVIDED);
                            }
                            true
                        } else {
                            caller.may_see(b, op::DESCRIBE, resource::TOPIC, &name)
                        }
                    });
                    for t in &mut resp.topics {
                        if t.error_code == 0 && t.topic_authorized_operations != NOT_PROVIDED {
                            let name = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                            t.topic_authorized_operations = topic_ops(b, &caller, &name);
                        }
                    }
                }
            });
            Gate::Pass(
                Box::new(RequestKind::DescribeTopicPartitions(r)),
                Some(patch),
            )
        }
        RequestKind::CreateTopics(mut r) => {
            let may_all = c.may_cluster_quietly(b, op::CREATE);
            let refused = take(&mut r.topics, |t| {
                !may_all && !c.may(b, op::CREATE, resource::TOPIC, &t.name)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::CreateTopics(resp) = resp {
                    resp.topics.extend(refused.into_iter().map(|t| {
                        create_topics_response::CreatableTopicResult::default()
                            .with_name(t.name)
                            .with_error_code(code(TOPIC_DENIED))
                            .with_num_partitions(-1)
                            .with_replication_factor(-1)
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::CreateTopics(r)), Some(patch))
        }
        RequestKind::DeleteTopics(mut r) => {
            let image = b.image();
            let name_of = |t: &delete_topics_request::DeleteTopicState| match &t.name {
                Some(n) => n.to_string(),
                None => image
                    .topics
                    .iter()
                    .find(|(_, m)| m.id == t.topic_id)
                    .map(|(n, _)| n.clone())
                    .unwrap_or_default(),
            };
            let denied = |name: &str| !c.may(b, op::DELETE, resource::TOPIC, name);
            let old = take(&mut r.topic_names, |n| denied(n));
            let new = take(&mut r.topics, |t| {
                let n = name_of(t);
                !n.is_empty() && denied(&n)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::DeleteTopics(resp) = resp {
                    let result = |name: Option<TopicName>, id| {
                        delete_topics_response::DeletableTopicResult::default()
                            .with_name(name)
                            .with_topic_id(id)
                            .with_error_code(code(TOPIC_DENIED))
                    };
                    resp.responses
                        .extend(old.into_iter().map(|n| result(Some(n), Default::default())));
                    resp.responses
                        .extend(new.into_iter().map(|t| result(t.name, t.topic_id)));
                }
            });
            Gate::Pass(Box::new(RequestKind::DeleteTopics(r)), Some(patch))
        }
        RequestKind::CreatePartitions(mut r) => {
            let refused = take(&mut r.topics, |t| {
                !c.may(b, op::ALTER, resource::TOPIC, &t.name)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::CreatePartitions(resp) = resp {
                    resp.results.extend(refused.into_iter().map(|t| {
                        create_partitions_response::CreatePartitionsTopicResult::default()
                            .with_name(t.name)
                            .with_error_code(code(TOPIC_DENIED))
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::CreatePartitions(r)), Some(patch))
        }
        RequestKind::DeleteRecords(mut r) => {
            let refused = take(&mut r.topics, |t| {
                !c.may(b, op::DELETE, resource::TOPIC, &t.name)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::DeleteRecords(resp) = resp {
                    use delete_records_response::*;
                    resp.topics.extend(refused.into_iter().map(|t| {
                        DeleteRecordsTopicResult::default()
                            .with_name(t.name)
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        DeleteRecordsPartitionResult::default()
                                            .with_partition_index(p.partition_index)
                                            .with_low_watermark(-1)
                                            .with_error_code(code(TOPIC_DENIED))
                                    })
                                    .collect(),
                            )
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::DeleteRecords(r)), Some(patch))
        }
        RequestKind::DescribeConfigs(mut r) => {
            let refused = refused_configs(b, c, op::DESCRIBE_CONFIGS, &mut r.resources, |res| {
                (res.resource_type, &res.resource_name)
            });
            config_patch!(
                r,
                refused,
                DescribeConfigs,
                results,
                describe_configs_response::DescribeConfigsResult
            )
        }
        RequestKind::AlterConfigs(mut r) => {
            let refused = refused_configs(b, c, op::ALTER_CONFIGS, &mut r.resources, |res| {
                (res.resource_type, &res.resource_name)
            });
            config_patch!(
                r,
                refused,
                AlterConfigs,
                responses,
                alter_configs_response::AlterConfigsResourceResponse
            )
        }
        RequestKind::IncrementalAlterConfigs(mut r) => {
            let refused = refused_configs(b, c, op::ALTER_CONFIGS, &mut r.resources, |res| {
                (res.resource_type, &res.resource_name)
            });
            config_patch!(
                r,
                refused,
                IncrementalAlterConfigs,
                responses,
                incremental_alter_configs_response::AlterConfigsResourceResponse
            )
        }
        RequestKind::DescribeProducers(mut r) => {
            let refused = take(&mut r.topics, |t| {
                !c.may(b, op::READ, resource::TOPIC, &t.name)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::DescribeProducers(resp) = resp {
                    use describe_producers_response::*;
                    resp.topics.extend(refused.into_iter().map(|t| {
                        TopicResponse::default().with_name(t.name).with_partitions(
                            t.partition_indexes
                                .iter()
                                .map(|p| {
                                    PartitionResponse::default()
                                        .with_partition_index(*p)
                                        .with_error_code(code(TOPIC_DENIED))
                                })
                                .collect(),
                        )
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::DescribeProducers(r)), Some(patch))
        }
        RequestKind::FindCoordinator(mut r) => {
            // Checked before the handler, which may create the coordinators' topic.
            let denied = |key: &str| match r.key_type {
                1 => (!txn(op::DESCRIBE, key)).then_some(TXN_DENIED),
                _ => (!group(op::DESCRIBE, key)).then_some(GROUP_DENIED),
            };
            if version < 4 {
                return match denied(&r.key) {
                    Some(e) => refuse(ResponseKind::FindCoordinator(
                        FindCoordinatorResponse::default()
                            .with_error_code(code(e))
                            .with_node_id((-1).into())
                            .with_host(sb(""))
                            .with_port(-1),
                    )),
                    None => pass(RequestKind::FindCoordinator(r)),
                };
            }
            let mut refused = Vec::new();
            r.coordinator_keys.retain(|k| match denied(k) {
                Some(e) => {
                    refused.push((k.clone(), e));
                    false
                }
                None => true,
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::FindCoordinator(resp) = resp {
                    resp.coordinators
                        .extend(refused.into_iter().map(|(key, e)| {
                            find_coordinator_response::Coordinator::default()
                                .with_key(key)
                                .with_node_id((-1).into())
                                .with_host(sb(""))
                                .with_port(-1)
                                .with_error_code(code(e))
                        }));
                }
            });
            Gate::Pass(Box::new(RequestKind::FindCoordinator(r)), Some(patch))
        }
        RequestKind::OffsetCommit(mut r) => {
            if !group(op::READ, &r.group_id) {
                let topics = offset_commit_errors(std::mem::take(&mut r.topics), GROUP_DENIED);
                return refuse(ResponseKind::OffsetCommit(
                    OffsetCommitResponse::default().with_topics(topics),
                ));
            }
            let refused = take(&mut r.topics, |t| {
                !c.may(b, op::READ, resource::TOPIC, &t.name)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::OffsetCommit(resp) = resp {
                    resp.topics
                        .extend(offset_commit_errors(refused, TOPIC_DENIED));
                }
            });
            Gate::Pass(Box::new(RequestKind::OffsetCommit(r)), Some(patch))
        }
        RequestKind::TxnOffsetCommit(mut r) => {
            let whole = if !txn(op::WRITE, &r.transactional_id) {
                Some(TXN_DENIED)
            } else if !group(op::READ, &r.group_id) {
                Some(GROUP_DENIED)
            } else {
                None
            };
            if let Some(e) = whole {
                let topics = txn_offset_commit_errors(std::mem::take(&mut r.topics), e);
                return refuse(ResponseKind::TxnOffsetCommit(
                    TxnOffsetCommitResponse::default().with_topics(topics),
                ));
            }
            let refused = take(&mut r.topics, |t| {
                !c.may(b, op::READ, resource::TOPIC, &t.name)
            });
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::TxnOffsetCommit(resp) = resp {
                    resp.topics
                        .extend(txn_offset_commit_errors(refused, TOPIC_DENIED));
                }
            });
            Gate::Pass(Box::new(RequestKind::TxnOffsetCommit(r)), Some(patch))
        }
        RequestKind::AddPartitionsToTxn(r) => {
            if version >= 4 {
                // Batched verification: brokers only (KIP-890).
                if cluster(op::CLUSTER_ACTION) {
                    return pass(RequestKind::AddPartitionsToTxn(r));
                }
                return refuse(ResponseKind::AddPartitionsToTxn(
                    AddPartitionsToTxnResponse::default().with_error_code(code(CLUSTER_DENIED)),
                ));
            }
            let txn_ok = txn(op::WRITE, &r.v3_and_below_transactional_id);
            let denied = denied_topics(
                b,
                c,
                op::WRITE,
                r.v3_and_below_topics.iter().map(|t| &*t.name.0),
            );
            if txn_ok && denied.is_empty() {
                return pass(RequestKind::AddPartitionsToTxn(r));
            }
            // Kafka: nothing is added; the refused partitions get their error, the
            // others OPERATION_NOT_ATTEMPTED.
            use add_partitions_to_txn_response::*;
            let results = r
                .v3_and_below_topics
                .iter()
                .map(|t| {
                    let e = if !txn_ok {
                        TXN_DENIED
                    } else if denied.contains(&*t.name.0) {
                        TOPIC_DENIED
                    } else {
                        ResponseError::OperationNotAttempted
                    };
                    AddPartitionsToTxnTopicResult::default()
                        .with_name(t.name.clone())
                        .with_results_by_partition(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    AddPartitionsToTxnPartitionResult::default()
                                        .with_partition_index(*p)
                                        .with_partition_error_code(code(e))
                                })
                                .collect(),
                        )
                })
                .collect();
            refuse(ResponseKind::AddPartitionsToTxn(
                AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results),
            ))
        }
        RequestKind::OffsetFetch(r) => offset_fetch(b, c, caller, r),
        RequestKind::DescribeGroups(mut r) => {
            let asked = r.include_authorized_operations;
            let refused = take(&mut r.groups, |g| !group(op::DESCRIBE, g));
            let patch: Patch = Box::new(move |b, resp| {
                if let ResponseKind::DescribeGroups(resp) = resp {
                    if asked {
                        for g in &mut resp.groups {
                            g.authorized_operations = caller.allowed_ops(
                                b,
                                &[
                                    op::READ,
                                    op::DESCRIBE,
                                    op::DELETE,
                                    op::DESCRIBE_CONFIGS,
                                    op::ALTER_CONFIGS,
                                ],
                                resource::GROUP,
                                &g.group_id,
                            );
                        }
                    }
                    resp.groups.extend(refused.into_iter().map(|g| {
                        describe_groups_response::DescribedGroup::default()
                            .with_group_id(g)
                            .with_error_code(code(GROUP_DENIED))
                            .with_authorized_operations(NOT_PROVIDED)
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::DescribeGroups(r)), Some(patch))
        }
        RequestKind::DeleteGroups(mut r) => {
            let refused = take(&mut r.groups_names, |g| !group(op::DELETE, g));
            let patch: Patch = Box::new(move |_, resp| {
                if let ResponseKind::DeleteGroups(resp) = resp {
                    resp.results.extend(refused.into_iter().map(|g| {
                        delete_groups_response::DeletableGroupResult::default()
                            .with_group_id(g)
                            .with_error_code(code(GROUP_DENIED))
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::DeleteGroups(r)), Some(patch))
        }
        RequestKind::ListGroups(r) => {
            if c.may_cluster_quietly(b, op::DESCRIBE) {
                return pass(RequestKind::ListGroups(r));
            }
            let patch: Patch = Box::new(move |b, resp| {
                if let ResponseKind::ListGroups(resp) = resp {
                    resp.groups
                        .retain(|g| caller.may_see(b, op::DESCRIBE, resource::GROUP, &g.group_id));
                }
            });
            Gate::Pass(Box::new(RequestKind::ListGroups(r)), Some(patch))
        }
        RequestKind::DescribeTransactions(mut r) => {
            let refused = take(&mut r.transactional_ids, |t| !txn(op::DESCRIBE, t));
            let patch: Patch = Box::new(move |b, resp| {
                if let ResponseKind::DescribeTransactions(resp) = resp {
                    // A transaction's topics the caller may not describe are left out.
                    for state in &mut resp.transaction_states {
                        state
                            .topics
                            .retain(|t| caller.may_see(b, op::DESCRIBE, resource::TOPIC, &t.topic));
                    }
                    resp.transaction_states.extend(refused.into_iter().map(|t| {
                        describe_transactions_response::TransactionState::default()
                            .with_transactional_id(t)
                            .with_error_code(code(TXN_DENIED))
                    }));
                }
            });
            Gate::Pass(Box::new(RequestKind::DescribeTransactions(r)), Some(patch))
        }
        RequestKind::ListTransactions(r) => {
            let patch: Patch = Box::new(move |b, resp| {
                if let ResponseKind::ListTransactions(resp) = resp {
                    resp.transaction_states.retain(|t| {
                        caller.may_see(
                            b,
                            op::DESCRIBE,
                            resource::TRANSACTIONAL_ID,
                            &t.transactional_id,
                        )
                    });
                }
            });
            Gate::Pass(Box::new(RequestKind::ListTransactions(r)), Some(patch))
        }
        other => pass(other),
    }
}

/// Takes the entries `refused` picks out of `list`, keeping the others in order.
fn take<T>(list: &mut Vec<T>, mut refused: impl FnMut(&T) -> bool) -> Vec<T> {
    let (out, kept): (Vec<T>, Vec<T>) = std::mem::take(list).into_iter().partition(|t| refused(t));
    *list = kept;
    out
}

/// Passes a config request narrowed to the allowed resources; its answer gets one
/// `$entry` per refused resource (type, name, error) in its `$field` list (the three
/// config APIs' answers differ only in those names).
macro_rules! config_patch {
    ($req:expr, $refused:expr, $kind:ident, $field:ident, $entry:ty) => {{
        let refused = $refused;
        let patch: Patch = Box::new(move |_, resp| {
            if let ResponseKind::$kind(resp) = resp {
                resp.$field.extend(refused.into_iter().map(|(t, n, e)| {
                    <$entry>::default()
                        .with_resource_type(t)
                        .with_resource_name(n)
                        .with_error_code(code(e))
                        .with_error_message(Some(sb(e.to_string())))
                }));
            }
        });
        Gate::Pass(Box::new(RequestKind::$kind($req)), Some(patch))
    }};
}
use config_patch;

/// Takes the config resources of `list` the caller may not perform `operation` on
/// (each checked once), as (type, name, error).
fn refused_configs<T>(
    b: &Broker,
    c: &Caller,
    operation: i8,
    list: &mut Vec<T>,
    key: impl Fn(&T) -> (i8, &StrBytes),
) -> Vec<(i8, StrBytes, ResponseError)> {
    let mut refused = Vec::new();
    list.retain(|res| {
        let (t, n) = key(res);
        match config_denied(b, c, operation, t, n) {
            Some(e) => {
                refused.push((t, n.clone(), e));
                false
            }
            None => true,
        }
    });
    refused
}

/// The error a config resource's operation is refused with, if it is (Kafka: topics
/// by the topic, groups by the group, brokers and loggers by the cluster).
fn config_denied(
    b: &Broker,
    c: &Caller,
    operation: i8,
    resource_type: i8,
    name: &str,
) -> Option<ResponseError> {
    match resource_type {
        2 => (!c.may(b, operation, resource::TOPIC, name)).then_some(TOPIC_DENIED),
        32 => (!c.may(b, operation, resource::GROUP, name)).then_some(GROUP_DENIED),
        _ => (!c.may_cluster(b, operation)).then_some(CLUSTER_DENIED),
    }
}

fn produce(b: &Broker, c: &Caller, mut r: ProduceRequest) -> Gate {
    let txn_denied = r
        .transactional_id
        .as_ref()
        .filter(|t| !t.is_empty())
        .is_some_and(|t| !c.may(b, op::WRITE, resource::TRANSACTIONAL_ID, t));
    let image = b.image();
    let may_create = || c.may_cluster_quietly(b, op::CREATE);
    let mut create_checked: Option<bool> = None;
    let refused: Vec<(produce_request::TopicProduceData, ResponseError)> = if txn_denied {
        std::mem::take(&mut r.topic_data)
            .into_iter()
            .map(|t| (t, TXN_DENIED))
            .collect()
    } else {
        let denied = denied_topics(b, c, op::WRITE, r.topic_data.iter().map(|t| &*t.name.0));
        // A topic that does not exist would be created by the produce: only for a
        // principal allowed to create it.
        let uncreatable: HashSet<String> = r
            .topic_data
            .iter()
            .map(|t| t.name.to_string())
            .filter(|n| {
                b.config.auto_create_topics && !denied.contains(n) && !image.topics.contains_key(n)
            })
            .filter(|n| {
                !*create_checked.get_or_insert_with(may_create)
                    && !c.may(b, op::CREATE, resource::TOPIC, n)
            })
            .collect();
        take(&mut r.topic_data, |t| {
            denied.contains(&*t.name.0) || uncreatable.contains(&*t.name.0)
        })
        .into_iter()
        .map(|t| {
            let e = if denied.contains(&*t.name.0) {
                TOPIC_DENIED
            } else {
                ResponseError::UnknownTopicOrPartition
            };
            (t, e)
        })
        .collect()
    };
    if refused.is_empty() {
        return Gate::Pass(Box::new(RequestKind::Produce(r)), None);
    }
    if r.acks == 0 {
        return Gate::PassThenClose(Box::new(RequestKind::Produce(r)));
    }
    let patch: Patch = Box::new(move |_, resp| {
        if let ResponseKind::Produce(resp) = resp {
            use produce_response::*;
            resp.responses.extend(refused.into_iter().map(|(t, e)| {
                TopicProduceResponse::default()
                    .with_name(t.name)
                    .with_partition_responses(
                        t.partition_data
                            .iter()
                            .map(|p| {
                                PartitionProduceResponse::default()
                                    .with_index(p.index)
                                    .with_error_code(code(e))
                                    .with_base_offset(-1)
                                    .with_log_append_time_ms(-1)
                                    .with_log_start_offset(-1)
                            })
                            .collect(),
                    )
            }));
        }
    });
    Gate::Pass(Box::new(RequestKind::Produce(r)), Some(patch))
}

fn fetch(b: &Broker, c: &Caller, caller: Rc<Caller>, r: FetchRequest) -> Gate {
    let replica = r.replica_id.0 >= 0 || r.replica_state.replica_id.0 >= 0;
    if replica {
        if c.may_cluster(b, op::CLUSTER_ACTION) {
            return Gate::Pass(Box::new(RequestKind::Fetch(r)), None);
        }
        // Kafka: every partition named, TOPIC_AUTHORIZATION_FAILED.
        use fetch_response::*;
        let responses = r
            .topics
            .iter()
            .map(|t| {
                FetchableTopicResponse::default()
                    .with_topic(t.topic.clone())
                    .with_topic_id(t.topic_id)
                    .with_partitions(
                        t.partitions
                            .iter()
                            .map(|p| denied_fetch_partition(p.partition))
                            .collect(),
                    )
            })
            .collect();
        return Gate::Refuse(Box::new(ResponseKind::Fetch(
            FetchResponse::default()
                .with_session_id(r.session_id)
                .with_responses(responses),
        )));
    }
    // The fetch session takes every partition named (as Kafka builds its context
    // first); the answer is checked, partition data of a topic the caller may not
    // read replaced by TOPIC_AUTHORIZATION_FAILED. So a session holding partitions from
    // before a binding was removed is checked too. A topic id nobody knows keeps its
    // UNKNOWN_TOPIC_ID.
    let patch: Patch = Box::new(move |b, resp| {
        if let ResponseKind::Fetch(resp) = resp {
            use fetch_response::*;
            let image = b.image();
            let name_of = |t: &FetchableTopicResponse| -> String {
                if !t.topic.is_empty() {
                    return t.topic.to_string();
                }
                image
                    .topics
                    .iter()
                    .find(|(_, m)| m.id == t.topic_id)
                    .map(|(n, _)| n.clone())
                    .unwrap_or_default()
            };
            let mut allowed = std::collections::HashMap::new();
            for t in &mut resp.responses {
                let n = name_of(t);
                if n.is_empty() {
                    continue;
                }
                let ok = *allowed
                    .entry(n.clone())
                    .or_insert_with(|| caller.may(b, op::READ, resource::TOPIC, &n));
                if !ok {
                    for p in &mut t.partitions {
                        *p = denied_fetch_partition(p.partition_index);
                    }
                }
            }
        }
    });
    Gate::Pass(Box::new(RequestKind::Fetch(r)), Some(patch))
}

fn denied_fetch_partition(index: i32) -> fetch_response::PartitionData {
    fetch_response::PartitionData::default()
        .with_partition_index(index)
        .with_error_code(code(TOPIC_DENIED))
        .with_high_watermark(-1)
        .with_last_stable_offset(-1)
        .with_log_start_offset(-1)
        .with_preferred_read_replica((-1).into())
}

fn metadata(
    b: &Broker,
    c: &Caller,
    caller: Rc<Caller>,
    version: i16,
    mut r: MetadataRequest,
) -> Gate {
    let image = b.image();
    let asked_topic_ops = version >= 8 && r.include_topic_authorized_operations;
    let asked_cluster_ops = (8..=10).contains(&version) && r.include_cluster_authorized_operations;
    // Named topics: refused ones answered TOPIC_AUTHORIZATION_FAILED whether or not
    // they exist, and so are missing ones that would be created but the principal may
    // not create (Kafka's answers).
    let mut refused: Vec<(metadata_request::MetadataRequestTopic, ResponseError)> = Vec::new();
    if let Some(topics) = r.topics.as_mut() {
        let auto = (version < 4 || r.allow_auto_topic_creation) && b.config.auto_create_topics;
        let mut create_all: Option<bool> = None;
        let mut may_create_all =
            || *create_all.get_or_insert_with(|| c.may_cluster_quietly(b, op::CREATE));
        let name_of = |t: &metadata_request::MetadataRequestTopic| match &t.name {
            Some(n) => n.to_string(),
            None => image
                .topics
                .iter()
                .find(|(_, m)| m.id == t.topic_id)
                .map(|(n, _)| n.clone())
                .unwrap_or_default(),
        };
        let mut kept = Vec::new();
        for t in std::mem::take(topics) {
            let n = name_of(&t);
            let would_create = || {
                auto && !image.topics.contains_key(&n)
                    && !crate::serve::api::metadata::is_internal(&n)
            };
            let denied = !n.is_empty()
                && (!c.may(b, op::DESCRIBE, resource::TOPIC, &n)
                    || (would_create()
                        && !may_create_all()
                        && !c.may(b, op::CREATE, resource::TOPIC, &n)));
            if denied {
                refused.push((t, TOPIC_DENIED));
            } else {
                kept.push(t);
            }
        }
        *topics = kept;
        if version == 0 && topics.is_empty() && !refused.is_empty() {
            // v0 reads an empty list as "all topics".
            return Gate::Refuse(Box::new(ResponseKind::Metadata(metadata_errors(
                MetadataResponse::default(),
                refused,
            ))));
        }
    }
    let every =
        r.topics.is_none() || (version == 0 && r.topics.as_ref().is_some_and(Vec::is_empty));
    let patch: Patch = Box::new(move |b, resp| {
        if let ResponseKind::Metadata(resp) = resp {
            if every {
                resp.topics.retain(|t| {
                    let n = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                    caller.may_see(b, op::DESCRIBE, resource::TOPIC, &n)
                });
            }
            if asked_topic_ops {
                for t in &mut resp.topics {
                    if t.error_code == 0 {
                        let n = t.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                        t.topic_authorized_operations = topic_ops(b, &caller, &n);
                    }
                }
            }
            if asked_cluster_ops {
                resp.cluster_authorized_operations = cluster_ops(b, &caller);
            }
            let taken = std::mem::take(resp);
            *resp = metadata_errors(taken, refused);
        }
    });
    Gate::Pass(Box::new(RequestKind::Metadata(r)), Some(patch))
}

fn metadata_errors(
    mut resp: MetadataResponse,
    refused: Vec<(metadata_request::MetadataRequestTopic, ResponseError)>,
) -> MetadataResponse {
    resp.topics.extend(refused.into_iter().map(|(t, e)| {
        metadata_response::MetadataResponseTopic::default()
            .with_name(t.name)
            .with_topic_id(t.topic_id)
            .with_error_code(code(e))
            .with_topic_authorized_operations(NOT_PROVIDED)
    }));
    resp
}

fn offset_fetch(b: &Broker, c: &Caller, caller: Rc<Caller>, mut r: OffsetFetchRequest) -> Gate {
    // v0-v7 name one group; v8+ several, each answered on its own.
    let single = r.groups.is_empty();
    if single && !c.may(b, op::DESCRIBE, resource::GROUP, &r.group_id) {
        use offset_fetch_response::*;
        let topics = r
            .topics
            .iter()
            .flatten()
            .map(|t| {
                OffsetFetchResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(
                        t.partition_indexes
                            .iter()
                            .map(|p| {
                                OffsetFetchResponsePartition::default()
                                    .with_partition_index(*p)
                                    .with_committed_offset(-1)
                                    .with_committed_leader_epoch(-1)
                                    .with_error_code(code(GROUP_DENIED))
                            })
                            .collect(),
                    )
            })
            .collect();
        return Gate::Refuse(Box::new(ResponseKind::OffsetFetch(
            OffsetFetchResponse::default()
                .with_error_code(code(GROUP_DENIED))
                .with_topics(topics),
        )));
    }
    let refused_groups = take(&mut r.groups, |g| {
        !c.may(b, op::DESCRIBE, resource::GROUP, &g.group_id)
    });
    let named_single = r.topics.is_some();
    let named_groups: HashSet<String> = r
        .groups
        .iter()
        .filter(|g| g.topics.is_some())
        .map(|g| g.group_id.to_string())
        .collect();
    let patch: Patch = Box::new(move |b, resp| {
        if let ResponseKind::OffsetFetch(resp) = resp {
            let mut cache = std::collections::HashMap::new();
            let mut may = |name: &str, named: bool| -> bool {
                *cache.entry(name.to_string()).or_insert_with(|| {
                    if named {
                        caller.may(b, op::DESCRIBE, resource::TOPIC, name)
                    } else {
                        caller.may_see(b, op::DESCRIBE, resource::TOPIC, name)
                    }
                })
            };
            // Named topics the principal may not describe: errors; all topics: left out.
            if named_single {
                for t in &mut resp.topics {
                    if !may(&t.name, true) {
                        for p in &mut t.partitions {
                            p.committed_offset = -1;
                            p.metadata = None;
                            p.error_code = code(TOPIC_DENIED);
                        }
                    }
                }
            } else {
                resp.topics.retain(|t| may(&t.name, false));
            }
            for g in &mut resp.groups {
                if named_groups.contains(g.group_id.as_str()) {
                    for t in &mut g.topics {
                        if !may(&t.name, true) {
                            for p in &mut t.partitions {
                                p.committed_offset = -1;
                                p.metadata = None;
                                p.error_code = code(TOPIC_DENIED);
                            }
                        }
                    }
                } else {
                    g.topics.retain(|t| may(&t.name, false));
                }
            }
            resp.groups.extend(refused_groups.into_iter().map(|g| {
                offset_fetch_response::OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_error_code(code(GROUP_DENIED))
            }));
        }
    });
    Gate::Pass(Box::new(RequestKind::OffsetFetch(r)), Some(patch))
}

fn epoch_errors(
    topics: Vec<offset_for_leader_epoch_request::OffsetForLeaderTopic>,
    e: ResponseError,
) -> Vec<offset_for_leader_epoch_response::OffsetForLeaderTopicResult> {
    use offset_for_leader_epoch_response::*;
    topics
        .into_iter()
        .map(|t| {
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            EpochEndOffset::default()
                                .with_partition(p.partition)
                                .with_error_code(code(e))
                                .with_leader_epoch(-1)
                                .with_end_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect()
}

fn offset_commit_errors(
    topics: Vec<offset_commit_request::OffsetCommitRequestTopic>,
    e: ResponseError,
) -> Vec<offset_commit_response::OffsetCommitResponseTopic> {
    use offset_commit_response::*;
    topics
        .into_iter()
        .map(|t| {
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code(e))
                        })
                        .collect(),
                )
        })
        .collect()
}

fn txn_offset_commit_errors(
    topics: Vec<txn_offset_commit_request::TxnOffsetCommitRequestTopic>,
    e: ResponseError,
) -> Vec<txn_offset_commit_response::TxnOffsetCommitResponseTopic> {
    use txn_offset_commit_response::*;
    topics
        .into_iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code(e))
                        })
                        .collect(),
                )
        })
        .collect()
}

/// The KIP-430 bits of a topic for the caller.
fn topic_ops(b: &Broker, c: &Caller, name: &str) -> i32 {
    use op::*;
    c.allowed_ops(
        b,
        &[
            READ,
            WRITE,
            CREATE,
            DELETE,
            ALTER,
            DESCRIBE,
            DESCRIBE_CONFIGS,
            ALTER_CONFIGS,
        ],
        resource::TOPIC,
        name,
    )
}

/// The KIP-430 bits of the cluster for the caller (none without DESCRIBE on it, as
/// Kafka).
fn cluster_ops(b: &Broker, c: &Caller) -> i32 {
    use op::*;
    if !c.may_cluster_quietly(b, DESCRIBE) {
        return 0;
    }
    c.allowed_ops(
        b,
        &[
            CREATE,
            ALTER,
            DESCRIBE,
            CLUSTER_ACTION,
            DESCRIBE_CONFIGS,
            ALTER_CONFIGS,
            IDEMPOTENT_WRITE,
        ],
        resource::CLUSTER,
        sluice_replication::acl::CLUSTER_NAME,
    )
}
