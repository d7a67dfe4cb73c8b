//! Broker configuration: a TOML file, overridden by command-line flags.
//!
//! Every key of the file has the name of its flag with `_` for `-`:
//!
//! ```toml
//! node_id = 1
//! listen = "127.0.0.1:9092"
//! advertised = "127.0.0.1:9092"   # default: the listen address
//! data_dir = "./data"
//! cores = 2                       # default: every online CPU
//! default_partitions = 1
//! auto_create_topics = true
//! socket_request_max_bytes = 104857600
//! group_initial_rebalance_delay_ms = 3000
//! group_min_session_timeout_ms = 6000
//! group_max_session_timeout_ms = 1800000
//! offsets_retention_minutes = 10080
//! log_retention_check_interval_ms = 60000
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Kafka's `socket.request.max.bytes` default: 100 MiB.
pub const SOCKET_REQUEST_MAX_BYTES: usize = 100 * 1024 * 1024;
/// Kafka's `group.initial.rebalance.delay.ms` default.
pub const GROUP_INITIAL_REBALANCE_DELAY_MS: i64 = 3_000;
/// Kafka's `group.min.session.timeout.ms` default.
pub const GROUP_MIN_SESSION_TIMEOUT_MS: i32 = 6_000;
/// Kafka's `group.max.session.timeout.ms` default (30 minutes).
pub const GROUP_MAX_SESSION_TIMEOUT_MS: i32 = 1_800_000;
/// Kafka's `offsets.retention.minutes` default (7 days).
pub const OFFSETS_RETENTION_MINUTES: i64 = 7 * 24 * 60;
/// How often the retention and compaction pass runs (Kafka's
/// `log.retention.check.interval.ms` is 300000; Sluice checks every minute).
pub const LOG_RETENTION_CHECK_INTERVAL_MS: u64 = 60_000;

/// The file form: every field optional, so flags and defaults fill the gaps.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub node_id: Option<i32>,
    pub listen: Option<String>,
    pub advertised: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub cores: Option<usize>,
    pub default_partitions: Option<i32>,
    pub auto_create_topics: Option<bool>,
    pub socket_request_max_bytes: Option<usize>,
    pub group_initial_rebalance_delay_ms: Option<i64>,
    pub group_min_session_timeout_ms: Option<i32>,
    pub group_max_session_timeout_ms: Option<i32>,
    pub offsets_retention_minutes: Option<i64>,
    pub log_retention_check_interval_ms: Option<u64>,
    pub controller_listen: Option<String>,
    pub controller_quorum: Option<String>,
    pub broker_session_timeout_ms: Option<u64>,
    pub broker_heartbeat_interval_ms: Option<u64>,
    pub replica_lag_time_max_ms: Option<u64>,
}

impl FileConfig {
    pub fn load(path: &std::path::Path) -> Result<FileConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
    }
}

/// The resolved configuration of one broker process.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: i32,
    pub listen: SocketAddr,
    /// Host and port clients are told to connect to (Metadata, DescribeCluster).
    pub advertised_host: String,
    pub advertised_port: i32,
    pub data_dir: PathBuf,
    pub cores: usize,
    pub default_partitions: i32,
    pub auto_create_topics: bool,
    pub socket_request_max_bytes: usize,
    /// group.initial.rebalance.delay.ms
    pub group_initial_rebalance_delay_ms: i64,
    /// group.min.session.timeout.ms
    pub group_min_session_timeout_ms: i32,
    /// group.max.session.timeout.ms
    pub group_max_session_timeout_ms: i32,
    /// offsets.retention.minutes
    pub offsets_retention_minutes: i64,
    /// log.retention.check.interval.ms: the storage retention and compaction pass.
    pub log_retention_check_interval_ms: u64,
    /// The metadata quorum's listener (absent: a quorum of this node alone).
    pub controller_listen: Option<SocketAddr>,
    /// The controller voters and their addresses (this node included).
    pub controller_quorum: Vec<(i32, SocketAddr)>,
    /// broker.session.timeout.ms
    pub broker_session_timeout_ms: u64,
    /// broker.heartbeat.interval.ms
    pub broker_heartbeat_interval_ms: u64,
    /// replica.lag.time.max.ms
    pub replica_lag_time_max_ms: u64,
}

impl BrokerConfig {
    /// Resolves flags (`flags`, the same shape as the file) over the file over defaults.
    pub fn resolve(
        file: FileConfig,
        flags: FileConfig,
        online_cpus: usize,
    ) -> Result<BrokerConfig, String> {
        let groups = GroupSettings::resolve(&file, &flags)?;
        let node_id = flags.node_id.or(file.node_id).unwrap_or(1);
        let cluster = ClusterSettings::resolve(&file, &flags, node_id)?;
        let pick = |f: Option<String>, c: Option<String>| f.or(c);
        let listen_s = pick(flags.listen, file.listen).unwrap_or_else(|| "127.0.0.1:9092".into());
        let listen: SocketAddr = listen_s
            .parse()
            .map_err(|e| format!("--listen {listen_s}: expected IP:PORT ({e})"))?;
        let advertised =
            pick(flags.advertised, file.advertised).unwrap_or_else(|| listen.to_string());
        let (host, port) = advertised
            .rsplit_once(':')
            .ok_or_else(|| format!("--advertised {advertised}: expected HOST:PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|e| format!("--advertised {advertised}: bad port ({e})"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let cores = flags.cores.or(file.cores).unwrap_or(online_cpus.max(1));
        if cores == 0 {
            return Err("--cores must be at least 1".into());
        }
        let default_partitions = flags
            .default_partitions
            .or(file.default_partitions)
            .unwrap_or(1);
        if default_partitions < 1 {
            return Err("--default-partitions must be at least 1".into());
        }
        let socket_request_max_bytes = flags
            .socket_request_max_bytes
            .or(file.socket_request_max_bytes)
            .unwrap_or(SOCKET_REQUEST_MAX_BYTES);
        if socket_request_max_bytes < 1024 {
            return Err("socket_request_max_bytes must be at least 1024".into());
        }
        let log_retention_check_interval_ms = flags
            .log_retention_check_interval_ms
            .or(file.log_retention_check_interval_ms)
            .unwrap_or(LOG_RETENTION_CHECK_INTERVAL_MS);
        // Kafka's lower bound is 1; an upper bound keeps the timer arithmetic finite.
        if !(1..=i64::MAX as u64 / 2).contains(&log_retention_check_interval_ms) {
            return Err(format!(
                "--log-retention-check-interval-ms {log_retention_check_interval_ms}: must be between 1 and {}",
                i64::MAX as u64 / 2
            ));
        }
        Ok(BrokerConfig {
            node_id,
            listen,
            advertised_host: host,
            advertised_port: i32::from(port),
            data_dir: flags
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./data")),
            cores,
            default_partitions,
            auto_create_topics: flags
                .auto_create_topics
                .or(file.auto_create_topics)
                .unwrap_or(true),
            socket_request_max_bytes,
            group_initial_rebalance_delay_ms: groups.initial_rebalance_delay_ms,
            group_min_session_timeout_ms: groups.min_session_timeout_ms,
            group_max_session_timeout_ms: groups.max_session_timeout_ms,
            offsets_retention_minutes: groups.offsets_retention_minutes,
            log_retention_check_interval_ms,
            controller_listen: cluster.listen,
            controller_quorum: cluster.quorum,
            broker_session_timeout_ms: cluster.session_timeout_ms,
            broker_heartbeat_interval_ms: cluster.heartbeat_interval_ms,
            replica_lag_time_max_ms: cluster.replica_lag_time_max_ms,
        })
    }
}

/// The metadata quorum and replication settings, validated together.
struct ClusterSettings {
    listen: Option<SocketAddr>,
    quorum: Vec<(i32, SocketAddr)>,
    session_timeout_ms: u64,
    heartbeat_interval_ms: u64,
    replica_lag_time_max_ms: u64,
}

impl ClusterSettings {
    fn resolve(
        file: &FileConfig,
        flags: &FileConfig,
        node_id: i32,
    ) -> Result<ClusterSettings, String> {
        if node_id < 1 {
            return Err(format!("--node-id {node_id}: must be at least 1"));
        }
        let listen = match flags
            .controller_listen
            .clone()
            .or(file.controller_listen.clone())
        {
            Some(s) => Some(
                s.parse::<SocketAddr>()
                    .map_err(|e| format!("--controller-listen {s}: expected IP:PORT ({e})"))?,
            ),
            None => None,
        };
        let quorum = match flags
            .controller_quorum
            .clone()
            .or(file.controller_quorum.clone())
        {
            Some(q) => parse_quorum(&q)?,
            None => {
                // A quorum of this node alone; the address is never dialled.
                let addr = listen.unwrap_or_else(|| "127.0.0.1:0".parse().expect("address"));
                vec![(node_id, addr)]
            }
        };
        if !quorum.iter().any(|(id, _)| *id == node_id) {
            return Err(format!(
                "--controller-quorum does not list this node (--node-id {node_id})"
            ));
        }
        if quorum.len() > 1 && listen.is_none() {
            return Err(
                "--controller-listen is required with more than one controller voter".into(),
            );
        }
        let pick = |f: Option<u64>, c: Option<u64>, d: u64| f.or(c).unwrap_or(d);
        let s = ClusterSettings {
            listen,
            quorum,
            session_timeout_ms: pick(
                flags.broker_session_timeout_ms,
                file.broker_session_timeout_ms,
                9_000,
            ),
            heartbeat_interval_ms: pick(
                flags.broker_heartbeat_interval_ms,
                file.broker_heartbeat_interval_ms,
                500,
            ),
            replica_lag_time_max_ms: pick(
                flags.replica_lag_time_max_ms,
                file.replica_lag_time_max_ms,
                30_000,
            ),
        };
        if s.heartbeat_interval_ms == 0 || s.heartbeat_interval_ms * 2 > s.session_timeout_ms {
            return Err(format!(
                "--broker-heartbeat-interval-ms {} must be positive and at most half of --broker-session-timeout-ms {}",
                s.heartbeat_interval_ms, s.session_timeout_ms
            ));
        }
        if s.replica_lag_time_max_ms == 0 {
            return Err("--replica-lag-time-max-ms must be positive".into());
        }
        Ok(s)
    }
}

/// The group coordinator's settings, validated together (min <= max).
struct GroupSettings {
    initial_rebalance_delay_ms: i64,
    min_session_timeout_ms: i32,
    max_session_timeout_ms: i32,
    offsets_retention_minutes: i64,
}

impl GroupSettings {
    fn resolve(file: &FileConfig, flags: &FileConfig) -> Result<GroupSettings, String> {
        let s = GroupSettings {
            initial_rebalance_delay_ms: flags
                .group_initial_rebalance_delay_ms
                .or(file.group_initial_rebalance_delay_ms)
                .unwrap_or(GROUP_INITIAL_REBALANCE_DELAY_MS),
            min_session_timeout_ms: flags
                .group_min_session_timeout_ms
                .or(file.group_min_session_timeout_ms)
                .unwrap_or(GROUP_MIN_SESSION_TIMEOUT_MS),
            max_session_timeout_ms: flags
                .group_max_session_timeout_ms
                .or(file.group_max_session_timeout_ms)
                .unwrap_or(GROUP_MAX_SESSION_TIMEOUT_MS),
            offsets_retention_minutes: flags
                .offsets_retention_minutes
                .or(file.offsets_retention_minutes)
                .unwrap_or(OFFSETS_RETENTION_MINUTES),
        };
        // Kafka types these as int: the same ranges here.
        if !(0..=i64::from(i32::MAX)).contains(&s.initial_rebalance_delay_ms) {
            return Err(format!(
                "--group-initial-rebalance-delay-ms {}: must be between 0 and {}",
                s.initial_rebalance_delay_ms,
                i32::MAX
            ));
        }
        if s.min_session_timeout_ms < 1 {
            return Err(format!(
                "--group-min-session-timeout-ms {}: must be at least 1",
                s.min_session_timeout_ms
            ));
        }
        if s.max_session_timeout_ms < s.min_session_timeout_ms {
            return Err(format!(
                "--group-max-session-timeout-ms {} is below --group-min-session-timeout-ms {}",
                s.max_session_timeout_ms, s.min_session_timeout_ms
            ));
        }
        if !(1..=i64::from(i32::MAX)).contains(&s.offsets_retention_minutes) {
            return Err(format!(
                "--offsets-retention-minutes {}: must be between 1 and {}",
                s.offsets_retention_minutes,
                i32::MAX
            ));
        }
        Ok(s)
    }
}

/// Parses `1@host:port,2@host:port,...`.
pub fn parse_quorum(s: &str) -> Result<Vec<(i32, std::net::SocketAddr)>, String> {
    let mut out: Vec<(i32, std::net::SocketAddr)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('@')
            .ok_or_else(|| format!("--controller-quorum: '{part}' is not ID@HOST:PORT"))?;
        let id: i32 = id
            .parse()
            .map_err(|_| format!("--controller-quorum: bad node id '{id}'"))?;
        if id < 1 {
            return Err(format!(
                "--controller-quorum: node id {id} must be at least 1"
            ));
        }
        let addr: std::net::SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .map_err(|e| format!("--controller-quorum: '{addr}': {e}"))?
            .next()
            .ok_or_else(|| format!("--controller-quorum: '{addr}' resolves to nothing"))?;
        if out.iter().any(|(i, _)| *i == id) {
            return Err(format!("--controller-quorum: node {id} listed twice"));
        }
        out.push((id, addr));
    }
    if out.is_empty() {
        return Err("--controller-quorum is empty".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file() {
        let file: FileConfig =
            toml::from_str("listen = \"127.0.0.1:1000\"\ncores = 3\nnode_id = 7").unwrap();
        let flags = FileConfig {
            listen: Some("127.0.0.1:2000".into()),
            ..Default::default()
        };
        let c = BrokerConfig::resolve(file, flags, 2).unwrap();
        assert_eq!(c.listen.port(), 2000);
        assert_eq!(c.cores, 3);
        assert_eq!(c.node_id, 7);
        assert_eq!(c.advertised_port, 2000);
        assert!(c.auto_create_topics);
    }

    #[test]
    fn group_and_retention_settings_default_to_kafkas_and_come_from_file_or_flags() {
        let c = BrokerConfig::resolve(FileConfig::default(), FileConfig::default(), 1).unwrap();
        assert_eq!(c.group_initial_rebalance_delay_ms, 3_000);
        assert_eq!(c.group_min_session_timeout_ms, 6_000);
        assert_eq!(c.group_max_session_timeout_ms, 1_800_000);
        assert_eq!(c.offsets_retention_minutes, 10_080);
        assert_eq!(c.log_retention_check_interval_ms, 60_000);
        let file: FileConfig = toml::from_str(
            "group_initial_rebalance_delay_ms = 0\n\
             group_min_session_timeout_ms = 1000\n\
             group_max_session_timeout_ms = 20000\n\
             offsets_retention_minutes = 60\n\
             log_retention_check_interval_ms = 500",
        )
        .unwrap();
        let flags = FileConfig {
            group_max_session_timeout_ms: Some(30_000),
            ..Default::default()
        };
        let c = BrokerConfig::resolve(file, flags, 1).unwrap();
        assert_eq!(c.group_initial_rebalance_delay_ms, 0);
        assert_eq!(c.group_min_session_timeout_ms, 1_000);
        assert_eq!(c.group_max_session_timeout_ms, 30_000);
        assert_eq!(c.offsets_retention_minutes, 60);
        assert_eq!(c.log_retention_check_interval_ms, 500);
    }

    #[test]
    fn bad_group_and_retention_settings_are_refused_with_the_flag_named() {
        let bad = [
            (
                FileConfig {
                    group_initial_rebalance_delay_ms: Some(-1),
                    ..Default::default()
                },
                "--group-initial-rebalance-delay-ms",
            ),
            (
                FileConfig {
                    group_min_session_timeout_ms: Some(0),
                    ..Default::default()
                },
                "--group-min-session-timeout-ms",
            ),
            (
                FileConfig {
                    group_min_session_timeout_ms: Some(10_000),
                    group_max_session_timeout_ms: Some(9_000),
                    ..Default::default()
                },
                "--group-max-session-timeout-ms",
            ),
            (
                FileConfig {
                    offsets_retention_minutes: Some(0),
                    ..Default::default()
                },
                "--offsets-retention-minutes",
            ),
            (
                FileConfig {
                    log_retention_check_interval_ms: Some(0),
                    ..Default::default()
                },
                "--log-retention-check-interval-ms",
            ),
        ];
        for (flags, flag) in bad {
            let e = BrokerConfig::resolve(FileConfig::default(), flags, 1).unwrap_err();
            assert!(e.starts_with(flag), "{e}");
        }
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        assert!(toml::from_str::<FileConfig>("colour = 1").is_err());
    }
}
