//! `sluice cluster describe`: brokers, the controller, and every partition's leader,
//! leader epoch, replicas and ISR, then the under-replicated partitions (ISR smaller
//! than the replica set) and the offline ones (no leader). It asks one broker (the
//! bootstrap) through [`sluice_client`]: ApiVersions, Metadata (v1+, which also
//! names the controller) and DescribeCluster when the broker serves it (its controller
//! id wins, and from v2 it lists fenced brokers too). How many replicas each shard of
//! a broker owns comes from that broker's metrics endpoint (`sluice_shard_partitions`;
//! found by the default convention, its Kafka port + 552 on the host it advertises,
//! unless `--metrics` lists the endpoints), since no Kafka API tells.
//!
//! Fetching ([`fetch`]) and printing ([`render`]) are separate so that the printing is
//! unit-tested without a broker.
//!
//! `sluice cluster quorum` ([`describe_quorum`]) asks DescribeQuorum of the metadata
//! quorum's leader; the partition-move commands are in `crate::cli::reassign`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{
    ApiKey, DescribeClusterRequest, DescribeConfigsRequest, DescribeLogDirsRequest, MetadataRequest,
};

use sluice::base::config::{DiskMinimum, METRICS_PORT_OFFSET};

use sluice_client::blocking::Conn;
use sluice_client::{code_err, error_name};

/// A CLI result: the error is the message printed.
pub type Res<T> = Result<T, String>;

/// The client id the admin CLIs send.
const CLIENT_ID: &str = "sluice-cli";

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Any broker of the cluster.
    #[arg(
        long = "bootstrap-server",
        alias = "bootstrap",
        global = true,
        default_value = "127.0.0.1:9092"
    )]
    bootstrap_server: String,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Brokers, controller, partitions (leader, epoch, replicas, ISR), under-replicated
    /// and offline partitions.
    Describe {
        /// Leave out internal topics (__consumer_offsets).
        #[arg(long)]
        exclude_internal: bool,
        /// Metrics endpoints to ask for each broker's per-shard counts,
        /// HOST:PORT[,HOST:PORT...] [default: every broker's Kafka port + 552].
        #[arg(long, value_delimiter = ',')]
        metrics: Vec<String>,
    },
    /// Moves partitions' replicas to other brokers: a kafka-reassign-partitions JSON
    /// plan (--plan), or one partition (--partition TOPIC:N --replicas 2,3).
    Reassign {
        /// A file with Kafka's reassignment JSON.
        #[arg(long, conflicts_with_all = ["partition", "replicas"])]
        plan: Option<std::path::PathBuf>,
        /// TOPIC:PARTITION to move.
        #[arg(long, requires = "replicas")]
        partition: Option<String>,
        /// The target replicas, preferred leader first.
        #[arg(long, value_delimiter = ',')]
        replicas: Vec<i32>,
        /// Wait for the moves to complete.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Lists the reassignments in progress (replicas, adding, removing); --cancel
    /// cancels them.
    Reassignments {
        /// Only this topic's.
        #[arg(long)]
        topic: Option<String>,
        #[arg(long)]
        cancel: bool,
    },
    /// Prints a plan evening out replicas, then preferred leaders, over the live
    /// brokers (racks kept spread) with the bytes it copies; --execute applies it.
    Rebalance {
        /// Apply the plan and wait for it.
        #[arg(long)]
        execute: bool,
        /// While the copies run, the rate (bytes/s) each receiving broker may fetch
        /// them at (follower.replication.throttled.rate), removed once done.
        #[arg(long)]
        throttle: Option<u64>,
        /// How long --execute waits, in seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// The metadata quorum as its leader sees it: leader, epoch, high watermark, each
    /// voter's log end, lag and last contact (DescribeQuorum).
    Quorum,
    /// Makes a node that joined the metadata quorum as a learner (started with
    /// --process-roles broker,controller, not in --controller-quorum) a voter, once it
    /// has caught up (AddRaftVoter).
    AddVoter {
        #[arg(long)]
        node: i32,
        /// How long to wait for the node to catch up, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
    /// Takes a voter out of the metadata quorum (RemoveRaftVoter): a dead machine's,
    /// or one a new voter replaces. A running node carries on as a learner.
    RemoveVoter {
        #[arg(long)]
        node: i32,
    },
    /// Takes a stopped broker that holds no replica out of the cluster
    /// (UnregisterBroker).
    Unregister {
        #[arg(long)]
        broker: i32,
    },
    /// Spreads replicas and preferred leaders onto a broker that joined (waits until
    /// it is registered and live, then rebalances as `rebalance --execute` does).
    AddBroker {
        #[arg(long)]
        broker: i32,
        /// Print the plan only.
        #[arg(long)]
        dry_run: bool,
        /// While the copies run, the rate (bytes/s) each receiving broker may fetch
        /// them at (follower.replication.throttled.rate), removed once done.
        #[arg(long)]
        throttle: Option<u64>,
        /// How long to wait for the moves, in seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// Moves every replica off a broker onto the other live brokers (same replica
    /// count, racks spread), and waits for the moves.
    Decommission {
        #[arg(long)]
        broker: i32,
        /// Print the plan only.
        #[arg(long)]
        dry_run: bool,
        /// How long to wait for the moves, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
}

/// Runs `sluice cluster …`; the error is the message to print.
pub fn run(args: ClusterArgs) -> Res<()> {
    match args.command {
        ClusterCommand::Describe {
            exclude_internal,
            metrics,
        } => {
            let mut view = fetch(&args.bootstrap_server)?;
            if exclude_internal {
                view.partitions.retain(|p| !p.internal);
            }
            view.shards = fetch_shards(&view.brokers, &metrics);
            print!("{}", render(&view));
            Ok(())
        }
        ClusterCommand::Reassign {
            plan,
            partition,
            replicas,
            wait,
            timeout,
        } => {
            use super::reassign::{parse_plan, render_moves, submit, Move};
            let moves = match (plan, partition) {
                (Some(path), _) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("reading {}: {e}", path.display()))?;
                    parse_plan(&text)?
                }
                (None, Some(tp)) => {
                    let (topic, p) = tp
                        .rsplit_once(':')
                        .and_then(|(t, p)| Some((t, p.parse::<i32>().ok()?)))
                        .ok_or(format!("--partition {tp}: expected TOPIC:PARTITION"))?;
                    vec![Move {
                        topic: topic.to_string(),
                        partition: p,
                        target: Some(replicas),
                    }]
                }
                (None, None) => {
                    return Err("give --plan FILE or --partition TOPIC:N --replicas IDS".into())
                }
            };
            let view = fetch(&args.bootstrap_server).ok();
            print!("{}", render_moves(view.as_ref(), &moves));
            submit(&args.bootstrap_server, &moves)?;
            println!("started {} moves", moves.len());
            if wait {
                super::reassign::wait(
                    &args.bootstrap_server,
                    &moves,
                    Duration::from_secs(timeout),
                )?;
            }
            Ok(())
        }
        ClusterCommand::Reassignments { topic, cancel } => {
            use super::reassign::{list, submit, Move};
            let ongoing = list(&args.bootstrap_server, topic.as_deref())?;
            if ongoing.is_empty() {
                println!("no reassignments in progress");
                return Ok(());
            }
            for o in &ongoing {
                println!(
                    "{}-{}: replicas {} adding {} removing {}",
                    o.partition.topic(),
                    o.partition.partition(),
                    ids(&o.replicas),
                    ids(&o.adding),
                    ids(&o.removing)
                );
            }
            if cancel {
                let moves: Vec<Move> = ongoing
                    .iter()
                    .map(|o| Move {
                        topic: o.partition.topic().to_string(),
                        partition: o.partition.partition(),
                        target: None,
                    })
                    .collect();
                submit(&args.bootstrap_server, &moves)?;
                println!("cancelled {} reassignments", moves.len());
            }
            Ok(())
        }
        ClusterCommand::Quorum => {
            print!("{}", describe_quorum(&args.bootstrap_server)?);
            Ok(())
        }
        ClusterCommand::AddVoter { node, timeout } => {
            change_voter(&args.bootstrap_server, node, Some(timeout))?;
            println!("node {node} is a voter");
            Ok(())
        }
        ClusterCommand::RemoveVoter { node } => {
            change_voter(&args.bootstrap_server, node, None)?;
            println!("node {node} is no longer a voter");
            Ok(())
        }
        ClusterCommand::Unregister { broker } => {
            super::reassign::unregister(&args.bootstrap_server, broker)?;
            println!("broker {broker} unregistered");
            Ok(())
        }
        ClusterCommand::Rebalance {
            execute,
            throttle,
            timeout,
        } => rebalance(&args.bootstrap_server, execute, throttle, timeout),
        ClusterCommand::AddBroker {
            broker,
            dry_run,
            throttle,
            timeout,
        } => {
            let bs = &args.bootstrap_server;
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            loop {
                let view = fetch(bs)?;
                if view
                    .brokers
                    .iter()
                    .any(|b| b.id == broker && b.fenced != Some(true))
                {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    return Err(format!("broker {broker} is not registered and live: start it (a node not in --controller-quorum joins by itself) and ask again"));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            rebalance(bs, !dry_run, throttle, timeout)
        }
        ClusterCommand::Decommission {
            broker,
            dry_run,
            timeout,
        } => {
            use super::reassign::{list, plan_decommission, render_moves, submit, wait};
            // A partition moving now lists its leaving replicas too: planning from that
            // would undo the move. Those moves finish (or are cancelled) first.
            let moving: Vec<String> = list(&args.bootstrap_server, None)?
                .iter()
                .filter(|o| o.replicas.contains(&broker))
                .map(|o| format!("{}-{}", o.partition.topic(), o.partition.partition()))
                .collect();
            if !moving.is_empty() {
                return Err(format!(
                    "partitions on broker {broker} are being moved ({}): wait for them (`sluice cluster reassignments`) or cancel them first",
                    moving.join(", ")
                ));
            }
            let view = fetch(&args.bootstrap_server)?;
            let moves = plan_decommission(&view, broker)?;
            print!("{}", render_moves(Some(&view), &moves));
            println!("{} replicas to move off broker {broker}", moves.len());
            if dry_run || moves.is_empty() {
                return Ok(());
            }
            submit(&args.bootstrap_server, &moves)?;
            wait(&args.bootstrap_server, &moves, Duration::from_secs(timeout))?;
            println!("broker {broker} holds no replica: stop it, then `sluice cluster unregister --broker {broker}`");
            Ok(())
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRow {
    pub id: i32,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
    /// Known only from DescribeCluster v2.
    pub fenced: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRow {
    pub topic: String,
    pub partition: i32,
    pub internal: bool,
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub offline_replicas: Vec<i32>,
    /// The partition's error code in the Metadata response (0: none).
    pub error: i16,
}

impl PartitionRow {
    pub fn under_replicated(&self) -> bool {
        self.isr.len() < self.replicas.len()
    }

    pub fn offline(&self) -> bool {
        self.leader < 0
    }
}

/// What `describe` shows, as the broker reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub cluster_id: Option<String>,
    /// -1: none known.
    pub controller_id: i32,
    pub brokers: Vec<BrokerRow>,
    /// Sorted by topic, then partition.
    pub partitions: Vec<PartitionRow>,
    /// Topics the Metadata response carried an error for.
    pub topic_errors: Vec<(String, i16)>,
    /// Each broker's data directory, asked of the broker itself.
    pub disks: Vec<DiskRow>,
    /// Each broker's replicas per shard, asked of its metrics endpoint.
    pub shards: Shards,
}

/// Per broker, the replicas each of its shards owns (all the broker's replicas,
/// internal topics included), as its shards last published them (twice a second).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shards {
    /// Broker id -> replicas owned by shard 0, 1, ...
    pub by_broker: BTreeMap<i32, Vec<u64>>,
    /// Endpoints that did not tell: (endpoint, why).
    pub errors: Vec<(String, String)>,
}

const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the metrics endpoints (`metrics`, else each broker's by the default
/// convention) for their per-shard counts; which broker answered is the endpoint's
/// own `sluice_node_id`.
pub fn fetch_shards(brokers: &[BrokerRow], metrics: &[String]) -> Shards {
    let endpoints: Vec<String> = if metrics.is_empty() {
        brokers
            .iter()
            .map(|b| {
                let host = if b.host.contains(':') {
                    format!("[{}]", b.host)
                } else {
                    b.host.clone()
                };
                format!("{host}:{}", b.port + i32::from(METRICS_PORT_OFFSET))
            })
            .collect()
    } else {
        metrics.to_vec()
    };
    let agent = ureq::AgentBuilder::new().timeout(HTTP_TIMEOUT).build();
    let mut out = Shards::default();
    for e in endpoints {
        let answer = agent
            .get(&format!("http://{e}/metrics"))
            .call()
            .map_err(|err| err.to_string())
            .and_then(|r| r.into_string().map_err(|err| err.to_string()))
            .and_then(|text| shard_counts(&text));
        match answer {
            Ok((broker, counts)) => {
                out.by_broker.insert(broker, counts);
            }
            Err(why) => out.errors.push((e, why)),
        }
    }
    out
}

/// The node id and the per-shard replica counts in a metrics exposition.
fn shard_counts(exposition: &str) -> Result<(i32, Vec<u64>), String> {
    let mut node = None;
    let mut counts = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(v) = line.strip_prefix("sluice_node_id ") {
            node = v.trim().parse::<f64>().ok().map(|v| v as i32);
        } else if let Some(rest) = line.strip_prefix("sluice_shard_partitions{shard=\"") {
            let (shard, value) = rest
                .split_once("\"} ")
                .ok_or_else(|| format!("malformed line {line:?}"))?;
            let shard: usize = shard
                .parse()
                .map_err(|_| format!("malformed line {line:?}"))?;
            let value: f64 = value
                .trim()
                .parse()
                .map_err(|_| format!("malformed line {line:?}"))?;
            counts.insert(shard, value as u64);
        }
    }
    let node = node.ok_or("no sluice_node_id in its metrics")?;
    if counts.is_empty() || counts.keys().copied().ne(0..counts.len()) {
        return Err("no sluice_shard_partitions for every shard (an older broker?)".into());
    }
    Ok((node, counts.into_values().collect()))
}

/// A broker's data directory: free space against its minimum, offline partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskRow {
    pub broker: i32,
    pub dir: String,
    pub free: i64,
    pub total: i64,
    /// The free-space minimum below which the broker refuses appends (None: unknown).
    pub minimum: Option<u64>,
    /// Partitions offline on this broker after an I/O error.
    pub offline: Vec<(String, i32)>,
    /// Each partition's size on this broker, bytes.
    pub sizes: BTreeMap<(String, i32), i64>,
    /// Tiered storage: each of those partitions' bytes in the object store, and the
    /// store's URL.
    pub remote_sizes: BTreeMap<(String, i32), i64>,
    pub remote: Option<String>,
    /// The broker could not be asked.
    pub error: Option<String>,
}

impl DiskRow {
    pub fn refusing(&self) -> bool {
        self.minimum
            .is_some_and(|m| m > 0 && self.free >= 0 && (self.free as u64) < m)
    }
}

/// Asks one broker for its data directory (DescribeLogDirs v4 for the space) and its
/// free-space minimum (DescribeConfigs of the broker resource).
fn disk_of(b: &BrokerRow) -> Res<DiskRow> {
    let mut c = Conn::open(&format!("{}:{}", b.host, b.port), CLIENT_ID)?;
    let versions = c.api_versions()?;
    let v = versions
        .pick(ApiKey::DescribeLogDirs, (1, 4))
        .ok_or("the broker serves no DescribeLogDirs version from 1 to 4")?;
    let dirs = c.call(v, &DescribeLogDirsRequest::default().with_topics(None))?;
    code_err("DescribeLogDirs", dirs.error_code)?;
    let mut row = DiskRow {
        broker: b.id,
        free: -1,
        total: -1,
        ..DiskRow::default()
    };
    for d in &dirs.results {
        let remote_prefix = sluice::serve::api::describe_log_dirs::REMOTE_DIR_PREFIX;
        if let Some(url) = d.log_dir.strip_prefix(remote_prefix) {
            row.remote = Some(url.to_string());
            for t in &d.topics {
                for p in &t.partitions {
                    row.remote_sizes
                        .insert((t.name.to_string(), p.partition_index), p.partition_size);
                }
            }
        } else if d.error_code == 0 {
            row.dir = d.log_dir.to_string();
            row.free = d.usable_bytes;
            row.total = d.total_bytes;
            for t in &d.topics {
                for p in &t.partitions {
                    row.sizes
                        .insert((t.name.to_string(), p.partition_index), p.partition_size);
                }
            }
        } else {
            for t in &d.topics {
                for p in &t.partitions {
                    row.offline.push((t.name.to_string(), p.partition_index));
                }
            }
        }
    }
    if let Some(cv) = versions.pick(ApiKey::DescribeConfigs, (1, 4)) {
        let keys = ["disk.min.free.bytes", "disk.min.free.percent"];
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(4)
                .with_resource_name(b.id.to_string().into())
                .with_configuration_keys(Some(keys.iter().map(|k| (*k).into()).collect())),
        ]);
        let answer = c.call(cv, &req)?;
        let value = |key: &str| {
            answer
                .results
                .iter()
                .flat_map(|r| &r.configs)
                .find(|e| e.name.as_str() == key)
                .and_then(|e| e.value.as_ref()?.parse::<u64>().ok())
        };
        if let (Some(bytes), Some(percent), true) = (value(keys[0]), value(keys[1]), row.total >= 0)
        {
            let percent = u8::try_from(percent).unwrap_or(100);
            row.minimum = Some(DiskMinimum { bytes, percent }.threshold(row.total as u64));
        }
    }
    Ok(row)
}

/// Asks the broker at `bootstrap`.
/// `sluice cluster rebalance`: prints the plan evening out replicas, then preferred
/// leaders, over the live brokers; with `execute` applies it (throttled while it runs
/// when `throttle` is given) and waits up to `timeout` seconds.
fn rebalance(bs: &str, execute: bool, throttle: Option<u64>, timeout: u64) -> Res<()> {
    use super::reassign::{bytes_to_copy, list, plan_rebalance, render_moves, submit, wait};
    let moving: Vec<(String, i32)> = list(bs, None)?
        .iter()
        .map(|o| (o.partition.topic().to_string(), o.partition.partition()))
        .collect();
    let view = fetch(bs)?;
    let moves = plan_rebalance(&view, &moving);
    print!("{}", render_moves(Some(&view), &moves));
    println!(
        "{} partitions to change, {} bytes to copy{}",
        moves.len(),
        bytes_to_copy(&view, &moves),
        if moving.is_empty() {
            ""
        } else {
            " (partitions moving now are left alone)"
        }
    );
    if moves.is_empty() {
        return Ok(());
    }
    if !execute {
        println!("(a plan only: --execute applies it)");
        return Ok(());
    }
    if let Some(rate) = throttle {
        super::reassign::throttle(bs, &view, &moves, Some(rate))?;
    }
    if let Err(e) = submit(bs, &moves) {
        // Nothing moves: take the throttle off again.
        if throttle.is_some() {
            super::reassign::throttle(bs, &view, &moves, None)?;
        }
        return Err(e);
    }
    if let Err(e) = wait(bs, &moves, Duration::from_secs(timeout)) {
        // The moves go on, still throttled, as kafka-reassign-partitions leaves
        // them until --verify: say how to lift it.
        return Err(match throttle {
            Some(_) => format!("{e}\nthe moves go on, throttled; once `sluice cluster reassignments` lists none, delete follower.replication.throttled.rate on the receiving brokers and follower.replication.throttled.replicas on the moved topics (kafka-configs --alter --delete-config)"),
            None => e,
        });
    }
    if throttle.is_some() {
        super::reassign::throttle(bs, &view, &moves, None)?;
    }
    println!("rebalanced");
    Ok(())
}

/// AddRaftVoter (`timeout` given, in seconds) or RemoveRaftVoter of `node`, asked of
/// the bootstrap broker (it forwards to the metadata quorum's leader; asked again if
/// no leader was known).
fn change_voter(bootstrap: &str, node: i32, timeout: Option<u64>) -> Res<()> {
    use kafka_protocol::messages::{AddRaftVoterRequest, RemoveRaftVoterRequest};
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut c = Conn::open(bootstrap, CLIENT_ID)?;
        let versions = c.api_versions()?;
        let (code, message) = match timeout {
            Some(secs) => {
                let v = versions
                    .pick(ApiKey::AddRaftVoter, (0, 0))
                    .ok_or("the broker does not serve AddRaftVoter")?;
                let req = AddRaftVoterRequest::default()
                    .with_voter_id(node)
                    .with_timeout_ms((secs * 1000).min(i32::MAX as u64) as i32);
                c.set_read_timeout(Duration::from_secs(secs + 10));
                let r = c.call(v, &req)?;
                (r.error_code, r.error_message)
            }
            None => {
                let v = versions
                    .pick(ApiKey::RemoveRaftVoter, (0, 0))
                    .ok_or("the broker does not serve RemoveRaftVoter")?;
                let r = c.call(v, &RemoveRaftVoterRequest::default().with_voter_id(node))?;
                (r.error_code, r.error_message)
            }
        };
        let not_leader = kafka_protocol::error::ResponseError::NotLeaderOrFollower.code();
        if code == not_leader && attempts < 5 {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        if code != 0 {
            let name = if timeout.is_some() {
                "AddRaftVoter"
            } else {
                "RemoveRaftVoter"
            };
            return Err(format!(
                "{name}: {}{}",
                error_name(code),
                message
                    .map(|m| format!(": {}", m.as_str()))
                    .unwrap_or_default()
            ));
        }
        return Ok(());
    }
}

/// The Kafka address of the node leading the metadata quorum.
fn quorum_leader(bootstrap: &str) -> Res<String> {
    let p = ask_quorum(bootstrap)?;
    if p.leader_id.0 < 0 {
        return Err("no metadata quorum leader is known; retry".into());
    }
    let view = fetch(bootstrap)?;
    view.brokers
        .iter()
        .find(|b| b.id == p.leader_id.0)
        .map(|b| format!("{}:{}", b.host, b.port))
        .ok_or(format!(
            "the quorum's leader {} is not in the metadata",
            p.leader_id.0
        ))
}

/// DescribeQuorum of `__cluster_metadata` partition 0, asked of `addr`.
fn ask_quorum(
    addr: &str,
) -> Res<kafka_protocol::messages::describe_quorum_response::PartitionData> {
    use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
    use kafka_protocol::messages::DescribeQuorumRequest;
    let mut c = Conn::open(addr, CLIENT_ID)?;
    let v = c
        .api_versions()?
        .pick(ApiKey::DescribeQuorum, (0, 1))
        .ok_or("the broker does not serve DescribeQuorum")?;
    let req = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(kafka_protocol::messages::TopicName(
            "__cluster_metadata".to_string().into(),
        ))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    let r = c.call(v, &req)?;
    code_err("DescribeQuorum", r.error_code)?;
    r.topics
        .into_iter()
        .flat_map(|t| t.partitions)
        .next()
        .ok_or_else(|| "DescribeQuorum answered no partition".to_string())
}

/// `sluice cluster quorum`: DescribeQuorum, asked of the leader (found through the
/// bootstrap broker's answer), as text.
pub fn describe_quorum(bootstrap: &str) -> Res<String> {
    let mut p = ask_quorum(bootstrap)?;
    if p.error_code != 0 && p.leader_id.0 >= 0 {
        p = ask_quorum(&quorum_leader(bootstrap)?)?;
    }
    code_err("DescribeQuorum", p.error_code)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut out = format!(
        "Metadata quorum: leader {}, epoch {}, high watermark {}\n",
        p.leader_id.0, p.leader_epoch, p.high_watermark
    );
    let voters = p.current_voters.iter().map(|v| ("voter", v));
    for (role, v) in voters.chain(p.observers.iter().map(|v| ("observer", v))) {
        let lag = (p.high_watermark - v.log_end_offset).max(0);
        let heard = if v.replica_id == p.leader_id {
            "(leader)".to_string()
        } else if v.last_fetch_timestamp < 0 {
            "never heard from".to_string()
        } else {
            format!(
                "last heard {} ms ago",
                (now - v.last_fetch_timestamp).max(0)
            )
        };
        out.push_str(&format!(
            "  {role} {}: log end {} (lag {lag}), {heard}\n",
            v.replica_id.0, v.log_end_offset
        ));
    }
    Ok(out)
}

pub fn fetch(bootstrap: &str) -> Res<ClusterView> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let versions = c.api_versions()?;
    let mv = versions
        .pick(ApiKey::Metadata, (1, 12))
        .ok_or("the broker serves no Metadata version from 1 to 12")?;
    let mut req = MetadataRequest::default().with_topics(None);
    if mv >= 4 {
        req = req.with_allow_auto_topic_creation(false);
    }
    let meta = c.call(mv, &req)?;
    let mut view = ClusterView {
        cluster_id: meta.cluster_id.as_ref().map(|s| s.to_string()),
        controller_id: meta.controller_id.0,
        brokers: meta
            .brokers
            .iter()
            .map(|b| BrokerRow {
                id: b.node_id.0,
                host: b.host.to_string(),
                port: b.port,
                rack: b.rack.as_ref().map(|r| r.to_string()),
                fenced: None,
            })
            .collect(),
        ..ClusterView::default()
    };
    for t in &meta.topics {
        let name = t
            .name
            .as_ref()
            .map_or_else(|| "?".into(), |n| n.to_string());
        if t.error_code != 0 {
            view.topic_errors.push((name.clone(), t.error_code));
        }
        for p in &t.partitions {
            view.partitions.push(PartitionRow {
                topic: name.clone(),
                partition: p.partition_index,
                internal: t.is_internal,
                leader: p.leader_id.0,
                leader_epoch: p.leader_epoch,
                replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                isr: p.isr_nodes.iter().map(|b| b.0).collect(),
                offline_replicas: p.offline_replicas.iter().map(|b| b.0).collect(),
                error: p.error_code,
            });
        }
    }
    if let Some(dv) = versions.pick(ApiKey::DescribeCluster, (0, 2)) {
        let mut req = DescribeClusterRequest::default();
        if dv >= 2 {
            req = req.with_include_fenced_brokers(true);
        }
        let d = c.call(dv, &req)?;
        code_err("DescribeCluster", d.error_code)?;
        view.cluster_id = Some(d.cluster_id.to_string());
        view.controller_id = d.controller_id.0;
        view.brokers = d
            .brokers
            .iter()
            .map(|b| BrokerRow {
                id: b.broker_id.0,
                host: b.host.to_string(),
                port: b.port,
                rack: b.rack.as_ref().map(|r| r.to_string()),
                fenced: (dv >= 2).then_some(b.is_fenced),
            })
            .collect();
    }
    view.brokers.sort_by_key(|b| b.id);
    view.disks = view
        .brokers
        .iter()
        .map(|b| {
            disk_of(b).unwrap_or_else(|e| DiskRow {
                broker: b.id,
                free: -1,
                total: -1,
                error: Some(e),
                ..DiskRow::default()
            })
        })
        .collect();
    view.partitions
        .sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    view.topic_errors.sort();
    Ok(view)
}

fn ids(v: &[i32]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Left-aligned columns two spaces apart, each as wide as its widest cell, indented by
/// two spaces; no trailing blanks.
fn table(out: &mut String, rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::from(" ");
        for (i, cell) in r.iter().enumerate() {
            let _ = write!(line, " {cell:<w$}", w = widths[i]);
            line.push(' ');
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

fn partition_rows<'a>(ps: impl Iterator<Item = &'a PartitionRow>) -> Vec<Vec<String>> {
    let mut rows = vec![vec![
        "TOPIC".to_string(),
        "PARTITION".into(),
        "LEADER".into(),
        "EPOCH".into(),
        "REPLICAS".into(),
        "ISR".into(),
        "OFFLINE-REPLICAS".into(),
        "ERROR".into(),
    ]];
    for p in ps {
        rows.push(vec![
            p.topic.clone(),
            p.partition.to_string(),
            if p.leader < 0 {
                "none".into()
            } else {
                p.leader.to_string()
            },
            p.leader_epoch.to_string(),
            ids(&p.replicas),
            ids(&p.isr),
            ids(&p.offline_replicas),
            if p.error == 0 {
                "-".into()
            } else {
                error_name(p.error)
            },
        ]);
    }
    rows
}

/// Bytes in binary units with one decimal (`-`: unknown).
fn human(bytes: i64) -> String {
    if bytes < 0 {
        return "-".into();
    }
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut i) = (bytes as f64, 0);
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

fn render_disks(out: &mut String, disks: &[DiskRow]) {
    let _ = writeln!(
        out,
        "\nData directories (appends are refused below the minimum free space):"
    );
    let mut rows = vec![vec![
        "BROKER".to_string(),
        "FREE".into(),
        "TOTAL".into(),
        "MINIMUM".into(),
        "STATE".into(),
        "DIR".into(),
    ]];
    for d in disks {
        let state = match (&d.error, d.refusing(), d.offline.len()) {
            (Some(e), _, _) => format!("unreachable: {e}"),
            (None, true, _) => "APPENDS REFUSED (disk full)".into(),
            (None, false, 0) => "ok".into(),
            (None, false, n) => format!("{n} partition(s) offline"),
        };
        rows.push(vec![
            d.broker.to_string(),
            human(d.free),
            human(d.total),
            d.minimum.map_or("-".into(), |m| human(m as i64)),
            state,
            if d.dir.is_empty() {
                "-".into()
            } else {
                d.dir.clone()
            },
        ]);
    }
    table(out, &rows);
    let offline: Vec<String> = disks
        .iter()
        .flat_map(|d| {
            d.offline
                .iter()
                .map(move |(t, p)| format!("  {t}-{p} on broker {}", d.broker))
        })
        .collect();
    let _ = writeln!(
        out,
        "\nPartitions offline after I/O errors ({}; each reopens by itself once its files can be written and read):",
        offline.len()
    );
    if offline.is_empty() {
        out.push_str("  (none)\n");
    }
    for line in offline {
        let _ = writeln!(out, "{line}");
    }
    render_tiered(out, disks);
}

/// Tiered storage: per topic, bytes on local disk (every replica) and in the object
/// store (once per partition), for the topics with remote bytes.
fn render_tiered(out: &mut String, disks: &[DiskRow]) {
    let Some(url) = disks.iter().find_map(|d| d.remote.clone()) else {
        return;
    };
    let mut remote: BTreeMap<&str, BTreeMap<i32, i64>> = BTreeMap::new();
    for d in disks {
        for ((t, p), b) in &d.remote_sizes {
            let e = remote.entry(t.as_str()).or_default().entry(*p).or_default();
            *e = (*e).max(*b);
        }
    }
    let _ = writeln!(
        out,
        "\nTiered storage ({url}), topics with remote segments:"
    );
    let mut rows = vec![vec![
        "TOPIC".to_string(),
        "PARTITIONS".into(),
        "LOCAL (ALL REPLICAS)".into(),
        "REMOTE".into(),
    ]];
    for (topic, parts) in &remote {
        let remote_bytes: i64 = parts.values().sum();
        if remote_bytes == 0 {
            continue;
        }
        let local: i64 = disks
            .iter()
            .flat_map(|d| d.sizes.iter())
            .filter(|((t, _), _)| t == topic)
            .map(|(_, b)| *b)
            .sum();
        rows.push(vec![
            topic.to_string(),
            parts.len().to_string(),
            human(local),
            human(remote_bytes),
        ]);
    }
    if rows.len() == 1 {
        out.push_str("  (none)\n");
        return;
    }
    table(out, &rows);
}

/// The report `sluice cluster describe` prints.
/// Per broker, over the partitions listed: the replicas it holds, the partitions it
/// leads now and those it is the preferred leader of (first replica); then the
/// difference between the busiest and the idlest broker in each column (placement
/// keeps new topics within one of even, `ClusterState::place`). When brokers told their
/// shards' counts, a SHARDS column (replicas owned by shard 0, 1, ...: every replica of
/// the broker, internal topics included) and the largest difference between two shards
/// of one broker (slots keep new topics within one of even).
fn render_spread(out: &mut String, v: &ClusterView) {
    let _ = writeln!(out, "\nSpread (partitions per broker):");
    if v.partitions.is_empty() {
        out.push_str("  (none)\n");
        return;
    }
    let mut ids: Vec<i32> = v.brokers.iter().map(|b| b.id).collect();
    ids.extend(v.partitions.iter().flat_map(|p| p.replicas.iter().copied()));
    ids.sort_unstable();
    ids.dedup();
    let counts: Vec<[usize; 3]> = ids
        .iter()
        .map(|id| {
            let ps = &v.partitions;
            [
                ps.iter().filter(|p| p.replicas.contains(id)).count(),
                ps.iter().filter(|p| p.leader == *id).count(),
                ps.iter().filter(|p| p.replicas.first() == Some(id)).count(),
            ]
        })
        .collect();
    let shards = &v.shards.by_broker;
    let mut rows = vec![vec![
        "BROKER".to_string(),
        "REPLICAS".into(),
        "LEADERS".into(),
        "PREFERRED-LEADERS".into(),
    ]];
    if !shards.is_empty() {
        rows[0].push("SHARDS".into());
    }
    for (id, c) in ids.iter().zip(&counts) {
        let mut row = vec![
            id.to_string(),
            c[0].to_string(),
            c[1].to_string(),
            c[2].to_string(),
        ];
        if !shards.is_empty() {
            row.push(shards.get(id).map_or("-".into(), |s| {
                s.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            }));
        }
        rows.push(row);
    }
    table(out, &rows);
    let gap = |k: usize| {
        let col = counts.iter().map(|c| c[k]);
        col.clone().max().unwrap_or(0) - col.min().unwrap_or(0)
    };
    let _ = writeln!(
        out,
        "  max - min: replicas {}, leaders {}, preferred leaders {}",
        gap(0),
        gap(1),
        gap(2)
    );
    let shard_gap = shards
        .values()
        .map(|s| s.iter().max().unwrap_or(&0) - s.iter().min().unwrap_or(&0))
        .max();
    if let Some(g) = shard_gap {
        let _ = writeln!(out, "  max - min between the shards of a broker: {g}");
    }
    for (endpoint, why) in &v.shards.errors {
        let _ = writeln!(out, "  shards unknown from {endpoint}: {why}");
    }
}

pub fn render(v: &ClusterView) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Cluster id: {}",
        v.cluster_id
            .as_deref()
            .filter(|c| !c.is_empty())
            .unwrap_or("(unknown)")
    );
    if v.controller_id < 0 {
        out.push_str("Controller: none\n");
    } else {
        let _ = writeln!(out, "Controller: {}", v.controller_id);
    }
    let _ = writeln!(out, "\nBrokers ({}):", v.brokers.len());
    let mut rows = vec![vec![
        "ID".to_string(),
        "ADDRESS".into(),
        "RACK".into(),
        "STATUS".into(),
    ]];
    for b in &v.brokers {
        let mut status = Vec::new();
        if b.id == v.controller_id {
            status.push("controller");
        }
        match b.fenced {
            Some(true) => status.push("fenced"),
            Some(false) => status.push("active"),
            None => {}
        }
        rows.push(vec![
            b.id.to_string(),
            format!("{}:{}", b.host, b.port),
            b.rack.clone().unwrap_or_else(|| "-".into()),
            if status.is_empty() {
                "-".into()
            } else {
                status.join(",")
            },
        ]);
    }
    table(&mut out, &rows);
    let topics = {
        let mut t: Vec<&str> = v.partitions.iter().map(|p| p.topic.as_str()).collect();
        t.dedup();
        t.len()
    };
    let _ = writeln!(
        out,
        "\nPartitions ({} in {} topic{}):",
        v.partitions.len(),
        topics,
        if topics == 1 { "" } else { "s" }
    );
    if v.partitions.is_empty() {
        out.push_str("  (none)\n");
    } else {
        table(&mut out, &partition_rows(v.partitions.iter()));
    }
    for (name, pick) in [
        (
            "Under-replicated partitions",
            PartitionRow::under_replicated as fn(&PartitionRow) -> bool,
        ),
        ("Offline partitions", PartitionRow::offline),
    ] {
        let n = v.partitions.iter().filter(|p| pick(p)).count();
        let _ = writeln!(out, "\n{name} ({n}):");
        if n == 0 {
            out.push_str("  (none)\n");
        } else {
            table(
                &mut out,
                &partition_rows(v.partitions.iter().filter(|p| pick(p))),
            );
        }
    }
    render_spread(&mut out, v);
    if !v.disks.is_empty() {
        render_disks(&mut out, &v.disks);
    }
    if !v.topic_errors.is_empty() {
        let _ = writeln!(out, "\nTopic errors ({}):", v.topic_errors.len());
        for (t, code) in &v.topic_errors {
            let _ = writeln!(out, "  {t}: {}", error_name(*code));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(
        topic: &str,
        partition: i32,
        leader: i32,
        replicas: &[i32],
        isr: &[i32],
    ) -> PartitionRow {
        PartitionRow {
            topic: topic.into(),
            partition,
            internal: false,
            leader,
            leader_epoch: 3,
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            offline_replicas: Vec::new(),
            error: 0,
        }
    }

    fn broker(id: i32, port: i32) -> BrokerRow {
        BrokerRow {
            id,
            host: "127.0.0.1".into(),
            port,
            rack: None,
            fenced: None,
        }
    }

    #[test]
    fn healthy_single_broker() {
        let v = ClusterView {
            cluster_id: Some("abc".into()),
            controller_id: 1,
            brokers: vec![broker(1, 9092)],
            partitions: vec![part("t", 0, 1, &[1], &[1]), part("t", 1, 1, &[1], &[1])],
            topic_errors: Vec::new(),
            disks: Vec::new(),
            shards: Shards::default(),
        };
        assert_eq!(
            render(&v),
            "\
Cluster id: abc
Controller: 1

Brokers (1):
  ID  ADDRESS         RACK  STATUS
  1   127.0.0.1:9092  -     controller

Partitions (2 in 1 topic):
  TOPIC  PARTITION  LEADER  EPOCH  REPLICAS  ISR  OFFLINE-REPLICAS  ERROR
  t      0          1       3      1         1    -                 -
  t      1          1       3      1         1    -                 -

Under-replicated partitions (0):
  (none)

Offline partitions (0):
  (none)

Spread (partitions per broker):
  BROKER  REPLICAS  LEADERS  PREFERRED-LEADERS
  1       2         2        2
  max - min: replicas 0, leaders 0, preferred leaders 0
"
        );
    }

    #[test]
    fn degraded_three_broker_cluster() {
        let mut offline = part("orders", 2, -1, &[2, 3, 1], &[2]);
        offline.offline_replicas = vec![3, 1];
        offline.error = 5; // LEADER_NOT_AVAILABLE
        let v = ClusterView {
            cluster_id: None,
            controller_id: 2,
            brokers: vec![
                broker(1, 9092),
                BrokerRow {
                    fenced: Some(false),
                    rack: Some("r2".into()),
                    ..broker(2, 9093)
                },
                BrokerRow {
                    fenced: Some(true),
                    ..broker(3, 9094)
                },
            ],
            partitions: vec![
                part("a-long-topic-name", 0, 1, &[1, 2, 3], &[1, 2, 3]),
                part("orders", 0, 1, &[1, 2, 3], &[1, 2]),
                part("orders", 1, 2, &[2, 3, 1], &[2, 3, 1]),
                offline,
            ],
            topic_errors: vec![("gone".into(), 3)],
            disks: Vec::new(),
            shards: Shards::default(),
        };
        let out = render(&v);
        assert_eq!(
            out,
            "\
Cluster id: (unknown)
Controller: 2

Brokers (3):
  ID  ADDRESS         RACK  STATUS
  1   127.0.0.1:9092  -     -
  2   127.0.0.1:9093  r2    controller,active
  3   127.0.0.1:9094  -     fenced

Partitions (4 in 2 topics):
  TOPIC              PARTITION  LEADER  EPOCH  REPLICAS  ISR    OFFLINE-REPLICAS  ERROR
  a-long-topic-name  0          1       3      1,2,3     1,2,3  -                 -
  orders             0          1       3      1,2,3     1,2    -                 -
  orders             1          2       3      2,3,1     2,3,1  -                 -
  orders             2          none    3      2,3,1     2      3,1               LeaderNotAvailable

Under-replicated partitions (2):
  TOPIC   PARTITION  LEADER  EPOCH  REPLICAS  ISR  OFFLINE-REPLICAS  ERROR
  orders  0          1       3      1,2,3     1,2  -                 -
  orders  2          none    3      2,3,1     2    3,1               LeaderNotAvailable

Offline partitions (1):
  TOPIC   PARTITION  LEADER  EPOCH  REPLICAS  ISR  OFFLINE-REPLICAS  ERROR
  orders  2          none    3      2,3,1     2    3,1               LeaderNotAvailable

Spread (partitions per broker):
  BROKER  REPLICAS  LEADERS  PREFERRED-LEADERS
  1       4         2        2
  2       4         1        2
  3       4         0        0
  max - min: replicas 0, leaders 2, preferred leaders 2

Topic errors (1):
  gone: UnknownTopicOrPartition
"
        );
    }

    #[test]
    fn no_controller_no_partitions() {
        let out = render(&ClusterView {
            cluster_id: Some(String::new()),
            controller_id: -1,
            ..ClusterView::default()
        });
        assert!(
            out.starts_with("Cluster id: (unknown)\nController: none\n"),
            "{out}"
        );
        assert!(
            out.contains("Brokers (0):\n  ID  ADDRESS  RACK  STATUS\n"),
            "{out}"
        );
        assert!(
            out.contains("Partitions (0 in 0 topics):\n  (none)\n"),
            "{out}"
        );
    }

    #[test]
    fn data_directories_show_free_space_refusal_and_offline_partitions() {
        let gib = 1i64 << 30;
        let disk = |broker, free, offline: &[(&str, i32)], error: Option<&str>| DiskRow {
            broker,
            dir: format!("/d{broker}"),
            free,
            total: 100 * gib,
            minimum: Some(gib as u64),
            offline: offline.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
            error: error.map(String::from),
            sizes: BTreeMap::new(),
            ..DiskRow::default()
        };
        let v = ClusterView {
            disks: vec![
                disk(1, 50 * gib, &[], None),
                disk(2, gib / 2, &[], None),
                disk(3, 40 * gib, &[("orders", 2)], None),
                DiskRow {
                    dir: String::new(),
                    free: -1,
                    total: -1,
                    minimum: None,
                    ..disk(4, 0, &[], Some("connection refused"))
                },
            ],
            ..ClusterView::default()
        };
        let out = render(&v);
        let tail = &out[out.find("\nData directories").expect("a disks section")..];
        assert_eq!(
            tail,
            "
Data directories (appends are refused below the minimum free space):
  BROKER  FREE       TOTAL      MINIMUM  STATE                            DIR
  1       50.0 GiB   100.0 GiB  1.0 GiB  ok                               /d1
  2       512.0 MiB  100.0 GiB  1.0 GiB  APPENDS REFUSED (disk full)      /d2
  3       40.0 GiB   100.0 GiB  1.0 GiB  1 partition(s) offline           /d3
  4       -          -          -        unreachable: connection refused  -

Partitions offline after I/O errors (1; each reopens by itself once its files can be written and read):
  orders-2 on broker 3
"
        );
    }

    #[test]
    fn per_shard_counts_are_read_from_the_metrics_and_shown_per_broker() {
        let text = "# HELP sluice_node_id This broker's node id.\n\
                    sluice_node_id 2\n\
                    sluice_partitions 41\n\
                    sluice_shard_partitions{shard=\"1\"} 20\n\
                    sluice_shard_partitions{shard=\"0\"} 21\n";
        assert_eq!(shard_counts(text), Ok((2, vec![21, 20])));
        assert!(shard_counts("sluice_node_id 2\n").is_err());
        assert!(shard_counts("sluice_shard_partitions{shard=\"0\"} 3\n").is_err());
        // A shard missing from the list is not silently left out.
        assert!(
            shard_counts("sluice_node_id 1\nsluice_shard_partitions{shard=\"1\"} 3\n").is_err()
        );

        let v = ClusterView {
            brokers: vec![broker(1, 9092), broker(2, 9093)],
            partitions: vec![
                part("t", 0, 1, &[1, 2], &[1, 2]),
                part("t", 1, 2, &[2, 1], &[2, 1]),
            ],
            shards: Shards {
                by_broker: [(2, vec![21, 20])].into(),
                errors: vec![("127.0.0.1:9644".into(), "connection refused".into())],
            },
            ..ClusterView::default()
        };
        let out = render(&v);
        let tail = &out[out.find("\nSpread").expect("a spread section")..];
        assert_eq!(
            tail,
            "
Spread (partitions per broker):
  BROKER  REPLICAS  LEADERS  PREFERRED-LEADERS  SHARDS
  1       2         1        1                  -
  2       2         1        1                  21,20
  max - min: replicas 0, leaders 0, preferred leaders 0
  max - min between the shards of a broker: 1
  shards unknown from 127.0.0.1:9644: connection refused
"
        );
    }

    #[test]
    fn describe_of_an_unreachable_broker_fails_with_its_address() {
        let e = fetch("127.0.0.1:1").unwrap_err();
        assert!(e.starts_with("cannot reach broker at 127.0.0.1:1"), "{e}");
    }
}
