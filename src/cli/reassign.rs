//! `sluice cluster reassign`, `reassignments`, `decommission` and `rebalance`: moving replicas
//! between brokers with AlterPartitionReassignments and following the moves with
//! ListPartitionReassignments (KIP-455), as Kafka's `kafka-reassign-partitions.sh`
//! does. A plan is Kafka's JSON (`{"version":1,"partitions":[{"topic":"t",
//! "partition":0,"replicas":[2,3]}]}`); a decommission plans it from the metadata:
//! every replica on the broker goes to the live broker holding the fewest replicas
//! that the partition does not use yet (one in a rack the partition does not use yet
//! while there is such a one), at the leaving replica's place in the list. The broker
//! itself stays registered until it is stopped and `sluice cluster unregister`ed
//! (UnregisterBroker, [`unregister`]). A rebalance plans moves
//! that even out replicas and then preferred leaders ([`plan_rebalance`]) and can
//! throttle the copies with Kafka's reassignment throttle configs ([`throttle`]).
//!
//! Planning ([`plan_decommission`], [`plan_rebalance`]) and parsing ([`parse_plan`]) are pure and
//! unit-tested; the rest talks to a broker.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, ApiKey, BrokerId, ListPartitionReassignmentsRequest,
    TopicName,
};
use sluice::base::rpc::OngoingReassignment;
use sluice::cluster::throttle::{FOLLOWER_RATE, FOLLOWER_REPLICAS};
use sluice_client::blocking::Conn;
use sluice_client::{code_err, error_name};
use sluice_protocol::TopicPartition;

use super::cluster::{ClusterView, Res};

const CLIENT_ID: &str = "sluice-cli";

/// One partition's move: its target replicas, or `None` to cancel its move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub topic: String,
    pub partition: i32,
    pub target: Option<Vec<i32>>,
}

/// Kafka's reassignment JSON (the `partitions` list; `log_dirs` are ignored, as one
/// data directory per broker leaves nothing to choose).
pub fn parse_plan(text: &str) -> Res<Vec<Move>> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the plan is not JSON: {e}"))?;
    let parts = v
        .get("partitions")
        .and_then(|p| p.as_array())
        .ok_or("the plan has no \"partitions\" list")?;
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let topic = p.get("topic").and_then(|t| t.as_str());
            let partition = p.get("partition").and_then(|t| t.as_i64());
            let replicas = p.get("replicas").and_then(|r| r.as_array());
            match (topic, partition, replicas) {
                (Some(topic), Some(partition), Some(replicas)) => {
                    let target = replicas
                        .iter()
                        .map(|b| b.as_i64().map(|b| b as i32))
                        .collect::<Option<Vec<i32>>>()
                        .ok_or(format!("plan entry {i}: replicas must be broker ids"))?;
                    Ok(Move {
                        topic: topic.to_string(),
                        partition: partition as i32,
                        target: Some(target),
                    })
                }
                _ => Err(format!(
                    "plan entry {i} needs \"topic\", \"partition\" and \"replicas\""
                )),
            }
        })
        .collect()
}

/// The moves that take every replica off broker `leaving` (see the module doc).
pub fn plan_decommission(view: &ClusterView, leaving: i32) -> Res<Vec<Move>> {
    if !view.brokers.iter().any(|b| b.id == leaving) {
        return Err(format!("broker {leaving} is not registered"));
    }
    let live: Vec<&super::cluster::BrokerRow> = view
        .brokers
        .iter()
        .filter(|b| b.id != leaving && b.fenced != Some(true))
        .collect();
    let rack = |id: i32| {
        view.brokers
            .iter()
            .find(|b| b.id == id)
            .and_then(|b| b.rack.clone())
    };
    let mut load: BTreeMap<i32, usize> = live.iter().map(|b| (b.id, 0)).collect();
    for p in &view.partitions {
        for r in &p.replicas {
            if let Some(n) = load.get_mut(r) {
                *n += 1;
            }
        }
    }
    let mut out = Vec::new();
    for p in view
        .partitions
        .iter()
        .filter(|p| p.replicas.contains(&leaving))
    {
        let staying: Vec<i32> = p
            .replicas
            .iter()
            .copied()
            .filter(|r| *r != leaving)
            .collect();
        let racks_used: Vec<Option<String>> = staying.iter().map(|r| rack(*r)).collect();
        let candidates = live.iter().filter(|b| !p.replicas.contains(&b.id));
        let pick = candidates
            .min_by_key(|b| (racks_used.contains(&b.rack), load[&b.id], b.id))
            .ok_or(format!(
                "{}-{}: no live broker left to take broker {leaving}'s replica (replicas {:?})",
                p.topic, p.partition, p.replicas
            ))?;
        *load.get_mut(&pick.id).expect("a live broker") += 1;
        let target = p
            .replicas
            .iter()
            .map(|r| if *r == leaving { pick.id } else { *r })
            .collect();
        out.push(Move {
            topic: p.topic.clone(),
            partition: p.partition,
            target: Some(target),
        });
    }
    Ok(out)
}

/// Sends the moves in one AlterPartitionReassignments; the per-partition failures as
/// one message (every partition's), or nothing.
pub fn submit(bootstrap: &str, moves: &[Move]) -> Res<()> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let v = c
        .api_versions()?
        .pick(ApiKey::AlterPartitionReassignments, (0, 1))
        .ok_or("the broker does not serve AlterPartitionReassignments")?;
    let mut topics: BTreeMap<&str, Vec<ReassignablePartition>> = BTreeMap::new();
    for m in moves {
        let replicas = m
            .target
            .as_ref()
            .map(|t| t.iter().map(|b| BrokerId(*b)).collect());
        topics.entry(&m.topic).or_default().push(
            ReassignablePartition::default()
                .with_partition_index(m.partition)
                .with_replicas(replicas),
        );
    }
    let req = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(60_000)
        .with_allow_replication_factor_change(true)
        .with_topics(
            topics
                .into_iter()
                .map(|(t, ps)| {
                    ReassignableTopic::default()
                        .with_name(TopicName(t.to_string().into()))
                        .with_partitions(ps)
                })
                .collect(),
        );
    let r = c.call(v, &req)?;
    code_err("AlterPartitionReassignments", r.error_code)?;
    let failed: Vec<String> = r
        .responses
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| p.error_code != 0)
                .map(move |p| {
                    format!(
                        "{}-{}: {} {}",
                        t.name.0,
                        p.partition_index,
                        error_name(p.error_code),
                        p.error_message.as_deref().unwrap_or("")
                    )
                })
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

/// The reassignments in progress (of `topic`, or all).
pub fn list(bootstrap: &str, topic: Option<&str>) -> Res<Vec<OngoingReassignment>> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    c.api_versions()?
        .pick(ApiKey::ListPartitionReassignments, (0, 0))
        .ok_or("the broker does not serve ListPartitionReassignments")?;
    // Every move, filtered here by topic: naming a topic's partitions would need its
    // partition count first (another request, to every broker for their disks).
    let r = c.call(
        0,
        &ListPartitionReassignmentsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(None),
    )?;
    code_err("ListPartitionReassignments", r.error_code)?;
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
    Ok(r.topics
        .iter()
        .filter(|t| topic.is_none_or(|name| t.name.0.as_str() == name))
        .flat_map(|t| {
            t.partitions.iter().map(move |p| OngoingReassignment {
                partition: TopicPartition::new(t.name.0.as_str(), p.partition_index),
                replicas: ids(&p.replicas),
                adding: ids(&p.adding_replicas),
                removing: ids(&p.removing_replicas),
            })
        })
        .collect())
}

/// Waits until none of `moves` is still in progress, printing the count as it falls.
pub fn wait(bootstrap: &str, moves: &[Move], timeout: Duration) -> Res<()> {
    let deadline = Instant::now() + timeout;
    let mut last = usize::MAX;
    loop {
        let ongoing = list(bootstrap, None)?;
        let left = moves
            .iter()
            .filter(|m| {
                ongoing.iter().any(|o| {
                    o.partition.topic() == m.topic && o.partition.partition() == m.partition
                })
            })
            .count();
        if left == 0 {
            println!("all {} moves completed", moves.len());
            return Ok(());
        }
        if left != last {
            println!("{left} of {} moves in progress", moves.len());
            last = left;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{left} moves still in progress after {} s (they go on; `sluice cluster reassignments` follows them)",
                timeout.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// One line per move, as the plan prints it.
pub fn render_moves(view: Option<&ClusterView>, moves: &[Move]) -> String {
    let mut out = String::new();
    for m in moves {
        let now = view.and_then(|v| {
            v.partitions
                .iter()
                .find(|p| p.topic == m.topic && p.partition == m.partition)
                .map(|p| format!("{:?}", p.replicas))
        });
        let to = m
            .target
            .as_ref()
            .map_or("(cancel)".to_string(), |t| format!("{t:?}"));
        out.push_str(&format!(
            "{}-{}: {} -> {}\n",
            m.topic,
            m.partition,
            now.unwrap_or_else(|| "?".into()),
            to
        ));
    }
    out
}

/// The moves that even out the live brokers' replica counts, then their preferred
/// leaderships (first replicas), as `sluice cluster rebalance` plans them. Replicas go
/// from the busiest broker to the least busy one that does not hold the partition yet,
/// only where that leaves the partition's racks at least as spread, the smallest
/// partitions first (fewest bytes to copy); then preferred leaderships move by
/// reordering replicas (no copy). Each broker ends within one replica (and one
/// preferred leadership) of every other where the racks allow it. Partitions moving
/// now are left alone.
pub fn plan_rebalance(view: &ClusterView, moving: &[(String, i32)]) -> Vec<Move> {
    let live: Vec<i32> = view
        .brokers
        .iter()
        .filter(|b| b.fenced != Some(true))
        .map(|b| b.id)
        .collect();
    if live.len() < 2 {
        return Vec::new();
    }
    let rack = |id: i32| {
        view.brokers
            .iter()
            .find(|b| b.id == id)
            .and_then(|b| b.rack.clone())
    };
    let size = |p: &super::cluster::PartitionRow| partition_bytes(view, &p.topic, p.partition);
    let mut parts: Vec<(&super::cluster::PartitionRow, Vec<i32>)> = view
        .partitions
        .iter()
        .filter(|p| {
            !moving
                .iter()
                .any(|(t, q)| *t == p.topic && *q == p.partition)
        })
        .filter(|p| !p.replicas.is_empty() && p.replicas.iter().all(|r| live.contains(r)))
        .map(|p| (p, p.replicas.clone()))
        .collect();
    // Topic by topic (each topic's load spread, not only the brokers' totals: a busy
    // topic must not stay on the old brokers while empty internal partitions fill the
    // new ones); within one, smallest first: the first partition found for a move
    // copies the fewest bytes.
    parts.sort_by_key(|(p, _)| (p.topic.clone(), size(p), p.partition));
    let mut start = 0;
    while start < parts.len() {
        let topic = parts[start].0.topic.clone();
        let end = start
            + parts[start..]
                .iter()
                .take_while(|(p, _)| p.topic == topic)
                .count();
        even_out(&mut parts[start..end], &live, &rack, false);
        start = end;
    }
    // Then the brokers' totals (topics with fewer partitions than brokers never move
    // in their own pass), keeping each topic's own spread; smallest first again.
    parts.sort_by_key(|(p, _)| (size(p), p.topic.clone(), p.partition));
    even_out(&mut parts, &live, &rack, true);
    let mut out: Vec<Move> = parts
        .into_iter()
        .filter(|(p, t)| p.replicas != *t)
        .map(|(p, t)| Move {
            topic: p.topic.clone(),
            partition: p.partition,
            target: Some(t),
        })
        .collect();
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    out
}

/// Evens out the replicas, then the preferred leaders, of `parts` (partitions with
/// their replica lists, changed in place) over the `live` brokers; a move never puts
/// two replicas of a partition in one rack where it can avoid it. With `keep_topics`,
/// a move must also go to a broker holding fewer of that topic's replicas (or
/// preferred leaderships) than the one giving it, so no topic's spread widens.
fn even_out<'a>(
    parts: &mut [(&'a super::cluster::PartitionRow, Vec<i32>)],
    live: &[i32],
    rack: &dyn Fn(i32) -> Option<String>,
    keep_topics: bool,
) {
    // Per topic and broker, the replicas (or preferred leaderships) it holds: counted
    // once per move searched, so a check is a lookup (at 10,000 partitions a scan per
    // candidate made the search quadratic).
    let topic_holds = |parts: &[(&'a super::cluster::PartitionRow, Vec<i32>)], leaders: bool| {
        let mut held: std::collections::HashMap<(&'a str, i32), usize> =
            std::collections::HashMap::new();
        if keep_topics {
            for (p, t) in parts.iter() {
                let topic: &'a str = p.topic.as_str();
                for r in if leaders { &t[..1] } else { &t[..] } {
                    *held.entry((topic, *r)).or_default() += 1;
                }
            }
        }
        held
    };
    let spread_kept = |held: &std::collections::HashMap<(&'a str, i32), usize>,
                       topic: &'a str,
                       from: i32,
                       to: i32| {
        let n = |b: i32| held.get(&(topic, b)).copied().unwrap_or(0);
        !keep_topics || n(to) < n(from)
    };
    // The pairs (giver, taker) whose move evens out: the taker holds at least two
    // fewer (replicas, or preferred leaderships), busiest givers first, each with its
    // takers least busy first. Every giver is tried, not only the busiest: its
    // partitions may have no replica on any taker while another giver's do.
    let pairs = |parts: &[(&super::cluster::PartitionRow, Vec<i32>)], leaders: bool| {
        let mut c: BTreeMap<i32, usize> = live.iter().map(|b| (*b, 0)).collect();
        for (_, t) in parts {
            let held = if leaders { &t[..1] } else { &t[..] };
            for r in held {
                *c.entry(*r).or_default() += 1;
            }
        }
        let mut by_load: Vec<(usize, i32)> = c.iter().map(|(b, n)| (*n, *b)).collect();
        by_load.sort();
        let mut out = Vec::new();
        for &(most, from) in by_load.iter().rev() {
            for &(_, to) in by_load.iter().take_while(|(n, _)| n + 1 < most) {
                out.push((from, to));
            }
        }
        out
    };
    // Replicas: the busiest broker gives one to the least busy one that can take it.
    for _ in 0..parts.len() * 4 {
        let held = topic_holds(parts, false);
        let moved = pairs(parts, false).into_iter().find_map(|(from, to)| {
            let i = (0..parts.len()).find(|&i| {
                let t = &parts[i].1;
                let others: Vec<Option<String>> =
                    t.iter().filter(|r| **r != from).map(|r| rack(*r)).collect();
                t.contains(&from)
                    && !t.contains(&to)
                    && (rack(to) == rack(from) || !others.contains(&rack(to)))
                    && spread_kept(&held, parts[i].0.topic.as_str(), from, to)
            })?;
            Some((i, from, to))
        });
        let Some((i, from, to)) = moved else { break };
        for r in parts[i].1.iter_mut().filter(|r| **r == from) {
            *r = to;
        }
    }
    // Preferred leaderships: reorder a partition's replicas to put a less busy one first.
    for _ in 0..parts.len() * 2 {
        let held = topic_holds(parts, true);
        let moved = pairs(parts, true).into_iter().find_map(|(from, to)| {
            let i = (0..parts.len()).find(|&i| {
                let t = &parts[i].1;
                t[0] == from
                    && t.contains(&to)
                    && spread_kept(&held, parts[i].0.topic.as_str(), from, to)
            })?;
            Some((i, to))
        });
        let Some((i, to)) = moved else { break };
        let t = &mut parts[i].1;
        let j = t.iter().position(|r| *r == to).expect("checked above");
        t.swap(0, j);
    }
}

/// The partition's size on its leader (DescribeLogDirs), 0 when unknown.
pub fn partition_bytes(view: &ClusterView, topic: &str, partition: i32) -> i64 {
    let leader = view
        .partitions
        .iter()
        .find(|p| p.topic == topic && p.partition == partition)
        .map(|p| p.leader);
    view.disks
        .iter()
        .find(|d| Some(d.broker) == leader)
        .and_then(|d| d.sizes.get(&(topic.to_string(), partition)).copied())
        .unwrap_or(0)
}

/// Bytes a plan copies: each added replica's partition size.
pub fn bytes_to_copy(view: &ClusterView, moves: &[Move]) -> i64 {
    moves
        .iter()
        .map(|m| {
            let now = view
                .partitions
                .iter()
                .find(|p| p.topic == m.topic && p.partition == m.partition);
            let added = match (now, &m.target) {
                (Some(p), Some(t)) => t.iter().filter(|b| !p.replicas.contains(b)).count(),
                _ => 0,
            };
            added as i64 * partition_bytes(view, &m.topic, m.partition)
        })
        .sum()
}

/// UnregisterBroker of `broker`; the controller's reason as the error.
pub fn unregister(bootstrap: &str, broker: i32) -> Res<()> {
    use kafka_protocol::messages::UnregisterBrokerRequest;
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    c.api_versions()?
        .pick(ApiKey::UnregisterBroker, (0, 0))
        .ok_or("the broker does not serve UnregisterBroker")?;
    let r = c.call(
        0,
        &UnregisterBrokerRequest::default().with_broker_id(BrokerId(broker)),
    )?;
    if r.error_code != 0 {
        return Err(format!(
            "unregistering broker {broker}: {} {}",
            error_name(r.error_code),
            r.error_message.as_deref().unwrap_or("")
        ));
    }
    Ok(())
}

/// Sets (`Some`) or deletes (`None`) one config of a resource (IncrementalAlterConfigs;
/// resource type 2 topic, 4 broker).
pub fn alter_config(
    bootstrap: &str,
    resource_type: i8,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Res<()> {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::IncrementalAlterConfigsRequest;
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let v = c
        .api_versions()?
        .pick(ApiKey::IncrementalAlterConfigs, (0, 1))
        .ok_or("the broker does not serve IncrementalAlterConfigs")?;
    let op = if value.is_some() { 0 } else { 1 }; // SET, DELETE
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(name.to_string().into())
            .with_configs(vec![AlterableConfig::default()
                .with_name(key.to_string().into())
                .with_config_operation(op)
                .with_value(value.map(|v| v.to_string().into()))]),
    ]);
    let r = c.call(v, &req)?;
    for res in &r.responses {
        if res.error_code != 0 {
            return Err(format!(
                "{key} of {name}: {} {}",
                error_name(res.error_code),
                res.error_message.as_deref().unwrap_or("")
            ));
        }
    }
    Ok(())
}

/// Throttles the replicas `moves` add (Kafka's reassignment throttle): each receiving
/// broker's `follower.replication.throttled.rate`, each topic's
/// `follower.replication.throttled.replicas` listing its added replicas. `rate: None`
/// removes both again.
pub fn throttle(bootstrap: &str, view: &ClusterView, moves: &[Move], rate: Option<u64>) -> Res<()> {
    let mut brokers: Vec<i32> = Vec::new();
    let mut topics: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for m in moves {
        let now = view
            .partitions
            .iter()
            .find(|p| p.topic == m.topic && p.partition == m.partition);
        let (Some(p), Some(t)) = (now, &m.target) else {
            continue;
        };
        for b in t.iter().filter(|b| !p.replicas.contains(b)) {
            if !brokers.contains(b) {
                brokers.push(*b);
            }
            topics
                .entry(&m.topic)
                .or_default()
                .push(format!("{}:{b}", m.partition));
        }
    }
    let rate = rate.map(|r| r.to_string());
    for b in brokers {
        // A broker's own config is changed through that broker (as Kafka requires).
        let addr = view
            .brokers
            .iter()
            .find(|r| r.id == b)
            .map(|r| format!("{}:{}", r.host, r.port))
            .ok_or(format!("broker {b} is not in the cluster's metadata"))?;
        alter_config(&addr, 4, &b.to_string(), FOLLOWER_RATE, rate.as_deref())?;
    }
    for (t, list) in topics {
        let list = list.join(",");
        let value = rate.as_ref().map(|_| list.as_str());
        alter_config(bootstrap, 2, t, FOLLOWER_REPLICAS, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::cluster::{BrokerRow, PartitionRow};

    fn broker(id: i32, rack: Option<&str>) -> BrokerRow {
        BrokerRow {
            id,
            host: "127.0.0.1".into(),
            port: 9091 + id,
            rack: rack.map(str::to_string),
            fenced: Some(false),
        }
    }

    fn part(topic: &str, partition: i32, replicas: &[i32]) -> PartitionRow {
        PartitionRow {
            topic: topic.into(),
            partition,
            internal: false,
            leader: replicas[0],
            leader_epoch: 0,
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
            offline_replicas: Vec::new(),
            error: 0,
        }
    }

    #[test]
    fn a_kafka_plan_parses_and_a_bad_one_is_named() {
        let plan = r#"{"version":1,"partitions":[{"topic":"t","partition":1,"replicas":[2,3],"log_dirs":["any","any"]}]}"#;
        assert_eq!(
            parse_plan(plan).unwrap(),
            vec![Move {
                topic: "t".into(),
                partition: 1,
                target: Some(vec![2, 3])
            }]
        );
        assert!(parse_plan("{").unwrap_err().contains("not JSON"));
        assert!(parse_plan(r#"{"version":1}"#)
            .unwrap_err()
            .contains("partitions"));
        let e = parse_plan(r#"{"partitions":[{"topic":"t","replicas":[1]}]}"#).unwrap_err();
        assert!(e.contains("entry 0"), "{e}");
    }

    #[test]
    fn decommissioning_moves_each_replica_to_the_least_loaded_broker_in_a_new_rack() {
        let view = ClusterView {
            brokers: vec![
                broker(1, Some("a")),
                broker(2, Some("b")),
                broker(3, Some("a")),
                broker(4, Some("c")),
            ],
            partitions: vec![
                part("t", 0, &[1, 2]),
                part("t", 1, &[2, 1]),
                part("t", 2, &[3, 4]),
                part("u", 0, &[2, 3]),
            ],
            ..ClusterView::default()
        };
        let moves = plan_decommission(&view, 1).unwrap();
        let targets: Vec<(i32, Vec<i32>)> = moves
            .iter()
            .map(|m| (m.partition, m.target.clone().unwrap()))
            .collect();
        // t-0: racks in use b; 3 (a) and 4 (c) are both new racks, 4 and 3 hold one
        // and two replicas: 4. t-1: racks in use b; 3 holds 2, 4 now 2: 3 (lower id).
        assert_eq!(targets, vec![(0, vec![4, 2]), (1, vec![2, 3])]);
        assert!(plan_decommission(&view, 9).is_err());
        let two = ClusterView {
            brokers: vec![broker(1, None), broker(2, None)],
            partitions: vec![part("t", 0, &[1, 2])],
            ..ClusterView::default()
        };
        let e = plan_decommission(&two, 1).unwrap_err();
        assert!(e.contains("no live broker left"), "{e}");
    }

    #[test]
    fn a_rebalance_evens_each_topic_and_then_the_brokers_totals() {
        // A 6-partition topic and six 1-partition topics, all on brokers 1 and 2; a
        // third broker joined.
        let mut partitions: Vec<PartitionRow> = (0..6)
            .map(|p| part("big", p, if p % 2 == 0 { &[1, 2] } else { &[2, 1] }))
            .collect();
        partitions.extend((0..6).map(|t| part(&format!("small{t}"), 0, &[1, 2])));
        let view = ClusterView {
            brokers: vec![broker(1, None), broker(2, None), broker(3, None)],
            partitions,
            ..ClusterView::default()
        };
        let moves = plan_rebalance(&view, &[]);
        let mut after: BTreeMap<(String, i32), Vec<i32>> = view
            .partitions
            .iter()
            .map(|p| ((p.topic.clone(), p.partition), p.replicas.clone()))
            .collect();
        for m in &moves {
            after.insert((m.topic.clone(), m.partition), m.target.clone().unwrap());
        }
        let holds = |b: i32, topic: Option<&str>| {
            after
                .iter()
                .filter(|((t, _), r)| topic.is_none_or(|x| x == t) && r.contains(&b))
                .count()
        };
        // The big topic spread on its own: 4 replicas each.
        assert_eq!(
            [1, 2, 3].map(|b| holds(b, Some("big"))),
            [4, 4, 4],
            "{after:?}"
        );
        // And the totals (24 replicas): 8 each, which the small topics alone give.
        assert_eq!([1, 2, 3].map(|b| holds(b, None)), [8, 8, 8], "{after:?}");
    }

    #[test]
    fn preferred_leaders_move_from_any_busier_broker_not_only_the_busiest() {
        // Replicas already even (5 brokers, 6 partitions, RF 2: 2 or 3 each);
        // preferred leaders 1:2, 2:2, 3:1, 4:1, 5:0. The busiest giver by id order (2)
        // leads partitions whose replicas never include 5; broker 1's do: the move
        // that evens the leaders out is 1 -> 5.
        let view = ClusterView {
            brokers: (1..=5).map(|b| broker(b, None)).collect(),
            partitions: vec![
                part("t", 0, &[1, 5]),
                part("t", 1, &[1, 3]),
                part("t", 2, &[2, 4]),
                part("t", 3, &[2, 3]),
                part("t", 4, &[3, 5]),
                part("t", 5, &[4, 1]),
            ],
            ..ClusterView::default()
        };
        let moves = plan_rebalance(&view, &[]);
        let mut after: Vec<Vec<i32>> = view.partitions.iter().map(|p| p.replicas.clone()).collect();
        for m in &moves {
            after[m.partition as usize] = m.target.clone().unwrap();
        }
        let mut leaders = [0usize; 6];
        for t in &after {
            leaders[t[0] as usize] += 1;
        }
        assert!(
            leaders[1..].iter().all(|n| (1..=2).contains(n)),
            "{after:?}"
        );
    }

    #[test]
    fn a_rebalance_evens_replicas_then_preferred_leaders_and_keeps_racks_spread() {
        let mut view = ClusterView {
            brokers: vec![broker(1, None), broker(2, None), broker(3, None)],
            partitions: (0..6)
                .map(|p| part("t", p, if p % 2 == 0 { &[1, 2] } else { &[2, 1] }))
                .collect(),
            ..ClusterView::default()
        };
        let moves = plan_rebalance(&view, &[]);
        let mut after: Vec<Vec<i32>> = view.partitions.iter().map(|p| p.replicas.clone()).collect();
        for m in &moves {
            after[m.partition as usize] = m.target.clone().unwrap();
        }
        let count = |leaders: bool| {
            let mut c = [0usize; 4];
            for t in &after {
                for r in if leaders { &t[..1] } else { &t[..] } {
                    c[*r as usize] += 1;
                }
            }
            c
        };
        assert_eq!(&count(false)[1..], &[4, 4, 4], "{after:?}");
        assert_eq!(&count(true)[1..], &[2, 2, 2], "{after:?}");
        assert!(after.iter().all(|t| t.len() == 2 && t[0] != t[1]));
        // A partition moving now is left alone; a balanced cluster needs nothing.
        let moving: Vec<(String, i32)> = (0..6).map(|p| ("t".to_string(), p)).collect();
        assert!(plan_rebalance(&view, &moving).is_empty());
        for (p, t) in view.partitions.iter_mut().zip(&after) {
            p.replicas = t.clone();
        }
        assert!(plan_rebalance(&view, &[]).is_empty());
        // Racks: a, a, b. A replica never joins a rack its partition already uses
        // while it leaves one the partition keeps using otherwise.
        let racked = ClusterView {
            brokers: vec![
                broker(1, Some("a")),
                broker(2, Some("b")),
                broker(3, Some("a")),
            ],
            partitions: (0..4).map(|p| part("t", p, &[1, 2])).collect(),
            ..ClusterView::default()
        };
        for m in plan_rebalance(&racked, &[]) {
            let t = m.target.unwrap();
            assert!(t.contains(&2) || t.len() < 2, "{t:?} lost rack b");
        }
    }
}
