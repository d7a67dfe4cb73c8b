//! `sluice cluster describe`: brokers, the controller, and every partition's leader,
//! leader epoch, replicas and ISR, then the under-replicated partitions (ISR smaller
//! than the replica set) and the offline ones (no leader). It asks one broker (the
//! bootstrap) through [`sluice_client`]: ApiVersions, Metadata (v1+, which also
//! names the controller) and DescribeCluster when the broker serves it (its controller
//! id wins, and from v2 it lists fenced brokers too).
//!
//! Fetching ([`fetch`]) and printing ([`render`]) are separate so that the printing is
//! unit-tested without a broker.

use std::fmt::Write as _;

use kafka_protocol::messages::{ApiKey, DescribeClusterRequest, MetadataRequest};

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
    },
}

/// Runs `sluice cluster …`; the error is the message to print.
pub fn run(args: ClusterArgs) -> Res<()> {
    match args.command {
        ClusterCommand::Describe { exclude_internal } => {
            let mut view = fetch(&args.bootstrap_server)?;
            if exclude_internal {
                view.partitions.retain(|p| !p.internal);
            }
            print!("{}", render(&view));
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
}

/// Asks the broker at `bootstrap`.
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

/// The report `sluice cluster describe` prints.
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
    fn describe_of_an_unreachable_broker_fails_with_its_address() {
        let e = fetch("127.0.0.1:1").unwrap_err();
        assert!(e.starts_with("cannot reach broker at 127.0.0.1:1"), "{e}");
    }
}
