//! Broker configuration: every setting of `sluice serve` is declared once, in
//! `settings!` below, with its doc (the flag's help and the example's comment), its
//! name (the TOML key; the flag is the name with `-` for `_`), its type and its default.
//! [`Settings`] is that declaration as one struct that both clap (the flags) and serde
//! (the TOML file, unknown keys refused) fill in; flags override the file, the file
//! overrides the defaults ([`Settings::or`], [`Settings::with_defaults`]), and
//! [`BrokerConfig::resolve`] validates the result into what the broker reads.
//!
//! The complete TOML example is `deploy/sluice.toml`, generated from the same declaration
//! ([`Settings::example_toml`]; a unit test keeps the file equal to it).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::base::ids::BrokerId;

/// Why a configuration is refused. The text names the flag (the file's key is the flag's
/// name with `_`), as `sluice serve` and `sluice check` print it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Not TOML, a value of the wrong type, or an unknown key.
    #[error("parsing {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("parsing [[alert]] of {}: {source}", path.display())]
    ParseAlerts {
        path: PathBuf,
        source: toml::de::Error,
    },
    /// A setting's value is malformed or out of its range.
    #[error("{flag} {value}: {why}")]
    Value {
        flag: String,
        value: String,
        why: String,
    },
    /// A setting, alone or with others, breaks a rule (`rule` names the others).
    #[error("{flag} {rule}")]
    Rule { flag: String, rule: String },
    /// One entry of a list-valued setting (or one `[[alert]]` table) is refused.
    #[error("{flag}: {why}")]
    Entry { flag: String, why: String },
}

fn bad_value(flag: &str, value: impl std::fmt::Display, why: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        flag: flag.to_string(),
        value: value.to_string(),
        why: why.into(),
    }
}

fn broken_rule(flag: &str, rule: impl Into<String>) -> ConfigError {
    ConfigError::Rule {
        flag: flag.to_string(),
        rule: rule.into(),
    }
}

fn bad_entry(flag: &str, why: impl Into<String>) -> ConfigError {
    ConfigError::Entry {
        flag: flag.to_string(),
        why: why.into(),
    }
}

/// Declares the settings. Each entry is `/// doc`, then `name: Type = default;` for a
/// setting with a fixed default, or `name: Type, example = value;` for one whose default
/// depends on the machine or on other settings (its doc says which); exactly one of the
/// two, or it does not compile.
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident: $ty:ty $(= $default:expr)? $(, example = $example:expr)?;
    )+) => {
        /// The settings one source gives: the flags or the file. `None`: not given there.
        #[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Settings {
            $(
                $(#[doc = $doc])+
                #[arg(long, help = help_text(&[$($doc),+], default_of!($ty $(, $default)?)))]
                pub $name: Option<$ty>,
            )+
        }

        /// Every setting after the defaults are applied: a setting with a fixed default
        /// is a plain value, one without stays an `Option` for [`BrokerConfig::resolve`].
        #[derive(Debug, Clone, PartialEq)]
        pub struct Resolved {
            $(
                $(#[doc = $doc])+
                pub $name: resolved_type!($ty $(, $default)?),
            )+
        }

        impl Settings {
            /// Every TOML key (and flag, with `-` for `_`), in declaration order.
            pub const KEYS: &'static [&'static str] = &[$(stringify!($name)),+];

            /// The keys this source gives (`Some`), in declaration order.
            pub fn given(&self) -> Vec<&'static str> {
                let mut keys = Vec::new();
                $(
                    if self.$name.is_some() {
                        keys.push(stringify!($name));
                    }
                )+
                keys
            }

            /// `self`'s settings, and `under`'s where `self` gives none.
            pub fn or(self, under: Settings) -> Settings {
                Settings {
                    $($name: self.$name.or(under.$name),)+
                }
            }

            /// Fills in every fixed default.
            pub fn with_defaults(self) -> Resolved {
                Resolved {
                    $($name: with_default!(self.$name, $ty $(, $default)?),)+
                }
            }

            /// The fixed defaults (`None` for settings without one).
            pub fn defaults() -> Settings {
                Settings {
                    $($name: default_value!($ty $(, $default)?),)+
                }
            }

            /// The complete TOML example (`deploy/sluice.toml`): every key with its doc;
            /// a key with a fixed default is set to it, any other is commented out with
            /// an example value.
            pub fn example_toml() -> String {
                let mut out = String::from(EXAMPLE_HEADER);
                $(
                    out.push('\n');
                    for line in [$($doc),+] {
                        out.push_str(&format!("#{}\n", line.trim_end()));
                    }
                    example_line!(out, stringify!($name), $ty $(, default = $default)? $(, example = $example)?);
                )+
                out
            }
        }
    };
}

macro_rules! default_of {
    ($ty:ty, $default:expr) => {
        Some(toml_value::<$ty>($default))
    };
    ($ty:ty) => {
        None
    };
}

macro_rules! resolved_type {
    ($ty:ty, $default:expr) => { $ty };
    ($ty:ty) => { Option<$ty> };
}

macro_rules! with_default {
    ($value:expr, $ty:ty, $default:expr) => {
        $value.unwrap_or_else(|| typed::<$ty>($default))
    };
    ($value:expr, $ty:ty) => {
        $value
    };
}

macro_rules! default_value {
    ($ty:ty, $default:expr) => {
        Some(typed::<$ty>($default))
    };
    ($ty:ty) => {
        None
    };
}

macro_rules! example_line {
    ($out:ident, $key:expr, $ty:ty, default = $default:expr) => {
        $out.push_str(&format!("{} = {}\n", $key, toml_value::<$ty>($default)))
    };
    ($out:ident, $key:expr, $ty:ty, example = $example:expr) => {
        $out.push_str(&format!("# {} = {}\n", $key, toml_value::<$ty>($example)))
    };
}

settings! {
    /// This broker's id, unique in the cluster (at least 1).
    node_id: i32 = 1;
    /// Kafka listener address, IP:PORT.
    listen: String = "127.0.0.1:9092".into();
    /// HOST:PORT clients are told to use [default: the listen address].
    advertised: String, example = "127.0.0.1:9092".into();
    /// The Kafka listener's security protocol: `PLAINTEXT`, `SSL` (TLS with
    /// --ssl-certificate and --ssl-key; this broker's own connections to other brokers,
    /// which go to their Kafka listeners, are TLS too and need --ssl-ca),
    /// `SASL_PLAINTEXT` (clients authenticate with SASL; the environment variable
    /// SLUICE_SASL_BOOTSTRAP_USER=name:password names the user brokers authenticate to
    /// each other as, created if it has no credentials) or `SASL_SSL` (both) [default:
    /// PLAINTEXT].
    security_protocol: String, example = "SSL".into();
    /// Several named listeners instead of --listen and --security-protocol (Kafka's
    /// listeners): `NAME://IP:PORT`, comma-separated, each name's protocol from
    /// --listener-security-protocol-map. Clients are answered (Metadata,
    /// FindCoordinator, DescribeCluster) with every broker's endpoint of the listener
    /// they connected through [default: one listener, from --listen and
    /// --security-protocol].
    listeners: String, example = "CLIENT://0.0.0.0:9093,INTERNAL://127.0.0.1:9094".into();
    /// What clients are told per listener (Kafka's advertised.listeners):
    /// `NAME://HOST:PORT`, comma-separated; a listener not named here advertises its
    /// address (which must then not be 0.0.0.0 or ::) [default: each listener's
    /// address].
    advertised_listeners: String, example = "CLIENT://broker1.example.com:9093".into();
    /// Each listener name's security protocol (Kafka's
    /// listener.security.protocol.map): `NAME:PROTOCOL`, comma-separated [default:
    /// PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL name themselves].
    listener_security_protocol_map: String, example = "CLIENT:SASL_SSL,INTERNAL:SSL".into();
    /// The listener brokers connect to each other through (Kafka's
    /// inter.broker.listener.name; the same name on every broker): replication,
    /// transaction markers and the controller port's TLS follow its protocol
    /// [default: the first of --listeners].
    inter_broker_listener_name: String, example = "INTERNAL".into();
    /// The SASL mechanisms a SASL listener offers (Kafka's sasl.enabled.mechanisms):
    /// any of SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN (checked against the users' SCRAM
    /// credentials; its password crosses the wire, so use it over SASL_SSL).
    sasl_enabled_mechanisms: String = "SCRAM-SHA-256,SCRAM-SHA-512".into();
    /// Check Kafka ACLs on every request (Kafka's authorizer.class.name set to its
    /// StandardAuthorizer): a principal may do only what an ACL allows it (`sluice acl
    /// add`), super users everything. Principals are `User:<name>` of the SASL login,
    /// else `User:<certificate subject>` of a TLS client certificate, else
    /// `User:ANONYMOUS`.
    authorizer: bool = false;
    /// Principals allowed everything when --authorizer is on, separated by `;`
    /// (Kafka's super.users, e.g. `User:admin;User:CN=broker1`). The SASL bootstrap
    /// user (brokers log in to each other as it) is always one [default: none].
    super_users: String, example = "User:admin".into();
    /// With --authorizer, whether a resource that no ACL names is open to everyone
    /// (Kafka's allow.everyone.if.no.acl.found).
    allow_everyone_if_no_acl_found: bool = false;
    /// PEM file of the listener's certificate chain, leaf first (Kafka's
    /// ssl.keystore.location with ssl.keystore.type=PEM) [default: none].
    ssl_certificate: String, example = "/etc/sluice/broker.pem".into();
    /// PEM file of the certificate's private key (PKCS#8, PKCS#1 or SEC1) [default:
    /// none].
    ssl_key: String, example = "/etc/sluice/broker.key".into();
    /// PEM file of the certificate authorities trusted (Kafka's
    /// ssl.truststore.location): client certificates are checked against them, and
    /// this broker verifies the brokers it connects to with them [default: none].
    ssl_ca: String, example = "/etc/sluice/ca.pem".into();
    /// Client certificates (Kafka's ssl.client.auth): `none`, `requested` (checked when
    /// a client presents one) or `required`. This broker presents its own certificate
    /// to the brokers it connects to whenever they ask for one.
    ssl_client_auth: String = "none".into();
    /// This broker's rack or zone (Kafka's broker.rack): replicas of a partition are
    /// spread over racks, and consumers that set client.rack may read from a replica in
    /// their rack [default: none].
    rack: String, example = "zone-a".into();
    /// Which replica a consumer is told to fetch from (KIP-392; Kafka's
    /// replica.selector.class): `rack` (an in-sync replica in the consumer's
    /// client.rack, else the leader) or `leader` (always the leader).
    replica_selector: String = "rack".into();
    /// Directory of the partition logs and the metadata.
    data_dir: PathBuf = "./data".into();
    /// Shards (executor threads, one per core) [default: every online CPU]. They are
    /// pinned one to a CPU only when they take every CPU the broker may run on; start it
    /// in a CPU set (`taskset -c`) of exactly this many CPUs to pin fewer.
    cores: usize, example = 2;
    /// Partitions of auto-created topics.
    default_partitions: i32 = 1;
    /// Create unknown topics on Metadata/Produce.
    auto_create_topics: bool = true;
    /// The controller moves each partition's leadership back to its preferred (first)
    /// replica once that replica is alive and in the ISR again
    /// (auto.leader.rebalance.enable); off, only ElectLeaders does.
    auto_leader_rebalance_enable: bool = true;
    /// Largest request a client may send, in bytes (Kafka's socket.request.max.bytes; at
    /// least 1024).
    socket_request_max_bytes: usize = 100 * 1024 * 1024;
    /// How long a new group waits for more members before its first generation (Kafka's
    /// group.initial.rebalance.delay.ms).
    group_initial_rebalance_delay_ms: i64 = 3_000;
    /// Smallest session timeout a member may ask for (group.min.session.timeout.ms).
    group_min_session_timeout_ms: i32 = 6_000;
    /// Largest session timeout a member may ask for (group.max.session.timeout.ms).
    group_max_session_timeout_ms: i32 = 1_800_000;
    /// The most members a consumer group admits (Kafka's group.max.size): a new member
    /// of a full group gets GROUP_MAX_SIZE_REACHED (at least 1).
    group_max_size: i32 = i32::MAX;
    /// Session timeout of consumer groups of the KIP-848 protocol
    /// (group.consumer.session.timeout.ms): a member that does not heartbeat for this
    /// long is removed and its partitions move.
    group_consumer_session_timeout_ms: i32 = 45_000;
    /// How often KIP-848 members heartbeat (group.consumer.heartbeat.interval.ms; below
    /// the session timeout).
    group_consumer_heartbeat_interval_ms: i32 = 5_000;
    /// The server-side assignors KIP-848 groups may use, the first the default
    /// (group.consumer.assignors: uniform, range).
    group_consumer_assignors: String = "uniform,range".into();
    /// Committed offsets of an empty group expire after this long (Kafka's
    /// offsets.retention.minutes, 7 days).
    offsets_retention_minutes: i64 = 7 * 24 * 60;
    /// Longest transaction timeout a producer may ask for (transaction.max.timeout.ms).
    transaction_max_timeout_ms: i32 = 900_000;
    /// How often each shard samples the consumer lag of the groups it coordinates (the
    /// leaders' high watermarks and the records at the committed offsets).
    lag_sample_interval_ms: u64 = 1_000;
    /// Commits per partition in the lag evaluation's sliding window (Burrow's
    /// `intervals`).
    lag_window: usize = 10;
    /// Alert when a group's lag on a topic exceeds this many records (a rule for every
    /// group; `[[alert]]` tables in the config file add per-group rules) [default: none].
    alert_lag_records: i64, example = 10_000;
    /// Alert when a group's oldest unconsumed record on a topic is older than this many
    /// seconds [default: none].
    alert_lag_seconds: f64, example = 300.0;
    /// Alert when a group's lag status on a topic is at least this: WARN, ERR, STOP,
    /// STALL or REWIND [default: none].
    alert_min_status: String, example = "ERR".into();
    /// How long a breach must last before its alert fires.
    alert_for_ms: u64 = 60_000;
    /// How often a firing alert is sent again while the breach lasts.
    alert_repeat_ms: u64 = 300_000;
    /// POST lag alerts to this http:// or https:// URL as Alertmanager's webhook JSON
    /// [default: none].
    alert_webhook: String, example = "http://127.0.0.1:5001/alerts".into();
    /// Tiered storage's object store: file:///PATH or s3://BUCKET/PREFIX (endpoint,
    /// region and credentials from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY); topics with remote.storage.enable=true copy their closed
    /// segments there [default: none, tiered storage off].
    remote_storage: String, example = "s3://sluice-archive/cluster-1".into();
    /// Threads of each kind that talk to the object store: reads, and uploads with deletes.
    remote_storage_threads: u64 = 2;
    /// Bytes of remote segment chunks and indexes each shard keeps for reads.
    remote_fetch_cache_bytes: u64 = 67108864;
    /// How often each shard looks for closed segments to upload and remote segments
    /// past retention.
    remote_log_manager_task_interval_ms: u64 = 1000;
    /// The local disk budget of closed segments waiting to upload to the remote store
    /// (split evenly over the shards): over it, appends to tiered topics are refused
    /// (KAFKA_STORAGE_ERROR, retriable) until uploads catch up; 0, the default: half
    /// of the data directory's file system.
    remote_upload_backlog_max_bytes: u64 = 0;
    /// POST lag alerts to this Alertmanager (http:// or https://HOST:PORT; its
    /// /api/v2/alerts) [default: none].
    alertmanager_url: String, example = "http://127.0.0.1:9093".into();
    /// PEM file of authorities an https alert sink's certificate may chain to,
    /// besides Mozilla's roots (an internal Alertmanager's CA) [default: none].
    alert_ssl_ca: String, example = "/etc/sluice/alertmanager-ca.pem".into();
    /// How often storage runs its retention pass (Kafka's
    /// log.retention.check.interval.ms is 300000; Sluice checks every minute).
    log_retention_check_interval_ms: u64 = 60_000;
    /// How long the log cleaner rests after a round that found nothing to compact
    /// (Kafka's log.cleaner.backoff.ms); a round that cleaned something is followed by
    /// the next at once, so a compacted topic's closed segments are cleaned within this
    /// of their roll.
    log_cleaner_backoff_ms: u64 = 15_000;
    /// Appends to partitions are refused (KAFKA_STORAGE_ERROR) while the data
    /// directory's free space is below the smaller of this and --disk-min-free-percent
    /// of its size; the space below is the reserve of the metadata journal, checkpoints
    /// and internal topics (0: no minimum).
    disk_min_free_bytes: u64 = 1 << 30;
    /// See --disk-min-free-bytes: the minimum as a percentage of the data directory's
    /// file system (0: no minimum).
    disk_min_free_percent: u8 = 5;
    /// Tests only: a file of storage fault rules (`write eio PATH-PART` per line, see
    /// `sluice_storage::fault`), re-read while the broker runs [default: none].
    fault_rules: PathBuf, example = "faults.txt".into();
    /// Metadata quorum listener, HOST:PORT [default: none; needed with more than one voter
    /// and on a node that joins].
    controller_listen: String, example = "127.0.0.1:9192".into();
    /// The controller voters, `1@HOST:PORT,2@HOST:PORT,...`: those the cluster was born
    /// with, the same on every node; a node not listed joins the quorum as a learner
    /// through them [default: this node alone].
    controller_quorum: String, example = "1@127.0.0.1:9192".into();
    /// This node's roles (process.roles): `broker,controller` (a voter, or one
    /// AddRaftVoter may make a voter), `broker` (never votes) or `controller` (a quorum
    /// member only: no partitions, no Kafka listener) [default: broker,controller if
    /// --controller-quorum lists this node, else broker].
    process_roles: String, example = "broker,controller".into();
    /// A broker whose heartbeats lapse this long is fenced (broker.session.timeout.ms).
    broker_session_timeout_ms: u64 = 9_000;
    /// How often a broker heartbeats to the controller (broker.heartbeat.interval.ms; at
    /// most half the session timeout).
    broker_heartbeat_interval_ms: u64 = 500;
    /// A follower behind the leader this long leaves the ISR (replica.lag.time.max.ms).
    replica_lag_time_max_ms: u64 = 30_000;
    /// How long a follower's fetch may wait at the leader for new records
    /// (replica.fetch.wait.max.ms). A partition that starts following meanwhile does
    /// not wait for it: it interrupts the poll.
    replica_fetch_wait_max_ms: u64 = 200;
    /// Incremental fetch sessions (KIP-227) this broker caches, split evenly over its
    /// shards (max.incremental.fetch.session.cache.slots; 0: none, every fetch is full).
    max_incremental_fetch_session_cache_slots: usize = 1000;
    /// Longest an idle shard sleeps before it checks its io_uring rings again, in ms
    /// (1-1000): a bound on the cost of a lost wake-up (see `sluice_shard::keep_awake`).
    reactor_wake_ms: u64 = 5;
    /// Once this many of a shard's partition files wait for an fdatasync at once, the
    /// rest share one syncfs of the data directory's file system per round (0: never).
    /// Set 0 when that file system also holds other programs' busy files: a syncfs
    /// writes theirs back too.
    shared_sync_min: u64 = 32;
    /// Partition logs per shard whose writes are write-through (O_DSYNC: durable when
    /// they complete, no fdatasync after them); logs opened beyond this many are synced
    /// by fdatasync or shared syncfs rounds (0: none write-through).
    dsync_logs_max: u64 = 32;
    /// Bytes of a chunk of each shard's write-ahead journal, which makes every
    /// flush=always append of up to 4 KiB durable in one sequential write-through
    /// write per round for all of the shard's partitions (segment files are written
    /// behind it and synced at each chunk's checkpoint; larger batches are written and
    /// synced in their segment file); 0: no journal, every partition syncs its own
    /// segment file (fdatasync, shared syncfs rounds or O_DSYNC as set above).
    journal_chunk_bytes: u64 = 134217728;
    /// Log lines: `text` (for people) or `json` (one JSON object per line, for log
    /// shippers). RUST_LOG sets the level (default info).
    log_format: String = "text".into();
    /// Prometheus metrics, /health and /ready over HTTP: HOST:PORT, or `off` [default:
    /// the --listen host, its port + 552 (9092 -> 9644); if that cannot be bound the
    /// broker runs without metrics and logs a warning].
    metrics_listen: String, example = "127.0.0.1:9644".into();
    /// Serve the metrics endpoint (/metrics, /health, /ready, /v1/groups) over https
    /// with the listeners' certificate (--ssl-certificate, --ssl-key; --ssl-ca too).
    /// Clients are not asked for certificates (Prometheus scrapes with the CA only).
    metrics_tls: bool = false;
}

const EXAMPLE_HEADER: &str = "\
# Sluice broker config: every key of `sluice serve --config FILE`, generated from
# src/base/config.rs (`cargo test -p sluice --lib config` checks this file; run it with
# SLUICE_WRITE_EXAMPLE=1 to rewrite it). Each key is its flag with `_` for `-`; flags
# override the file. The keys set below hold their defaults; the commented-out ones
# have no fixed default and show an example value.
";

/// Its argument, typed: lets a default's literal take the setting's type.
fn typed<T>(value: T) -> T {
    value
}

/// A default or example as a TOML value (it renders the example file and the help).
fn toml_value<T: serde::Serialize>(value: T) -> toml::Value {
    toml::Value::try_from(value).expect("a setting's value is a TOML value")
}

/// A flag's help: its doc on one line, then its default if it has a fixed one.
fn help_text(doc: &[&str], default: Option<toml::Value>) -> String {
    let doc = doc.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    let doc = doc.strip_suffix('.').unwrap_or(&doc);
    match default {
        Some(toml::Value::String(s)) => format!("{doc} [default: {s}]"),
        Some(v) => format!("{doc} [default: {v}]"),
        None => doc.to_string(),
    }
}

impl Settings {
    /// Reads a TOML config file; absent keys are `None`, unknown keys are refused.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let parsed = match toml::from_str::<toml::Table>(&text) {
            // `[[alert]]` tables are lag alert rules, read by
            // `BrokerConfig::add_file_alert_rules`.
            Ok(mut t) if t.contains_key("alert") => {
                t.remove("alert");
                toml::Value::Table(t).try_into()
            }
            _ => toml::from_str(&text),
        };
        parsed.map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// A Kafka listener's security protocol (Kafka's SecurityProtocol, with its ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(name: &str) -> Option<SecurityProtocol> {
        Some(match name.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => SecurityProtocol::Plaintext,
            "SSL" => SecurityProtocol::Ssl,
            "SASL_PLAINTEXT" => SecurityProtocol::SaslPlaintext,
            "SASL_SSL" => SecurityProtocol::SaslSsl,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Kafka's id (`SecurityProtocol.id`).
    pub fn id(self) -> i16 {
        match self {
            SecurityProtocol::Plaintext => 0,
            SecurityProtocol::Ssl => 1,
            SecurityProtocol::SaslPlaintext => 2,
            SecurityProtocol::SaslSsl => 3,
        }
    }

    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// One Kafka listener: where it binds, what it speaks, what clients are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Upper case (`PLAINTEXT` for the one --listen makes).
    pub name: String,
    pub protocol: SecurityProtocol,
    pub bind: SocketAddr,
    pub advertised_host: String,
    pub advertised_port: i32,
}

/// `HOST:PORT` (a bracketed IPv6 host too) into its parts; `flag` names the setting.
fn host_port(flag: &str, value: &str) -> Result<(String, u16), ConfigError> {
    let (host, port) = value
        .rsplit_once(':')
        .ok_or_else(|| bad_value(flag, value, "expected HOST:PORT"))?;
    let port: u16 = port
        .parse()
        .map_err(|e| bad_value(flag, value, format!("bad port ({e})")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad_value(flag, value, "expected HOST:PORT"));
    }
    Ok((host.to_string(), port))
}

/// `NAME://REST` entries of a comma-separated list (Kafka's listeners syntax).
fn named_entries<'a>(flag: &str, list: &'a str) -> Result<Vec<(String, &'a str)>, ConfigError> {
    let mut out: Vec<(String, &str)> = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, rest) = entry
            .split_once("://")
            .ok_or_else(|| bad_value(flag, entry, "expected NAME://HOST:PORT"))?;
        let name = name.trim().to_ascii_uppercase();
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(bad_value(
                flag,
                entry,
                "a listener name is letters, digits, _ and -",
            ));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(bad_value(
                flag,
                entry,
                format!("listener {name} is named twice"),
            ));
        }
        out.push((name, rest));
    }
    Ok(out)
}

/// The listeners: --listeners with their protocols, advertised addresses and the
/// inter-broker one first; or the one --listen, --advertised and --security-protocol
/// describe (named after its protocol, as Kafka's default map does).
fn listeners(s: &Resolved, given: &[&str]) -> Result<Vec<Listener>, ConfigError> {
    let Some(list) = s.listeners.as_deref() else {
        for flag in [
            "advertised_listeners",
            "listener_security_protocol_map",
            "inter_broker_listener_name",
        ] {
            if given.contains(&flag) {
                return Err(broken_rule(
                    &format!("--{}", flag.replace('_', "-")),
                    "only used with --listeners",
                ));
            }
        }
        let bind: SocketAddr = s
            .listen
            .parse()
            .map_err(|e| bad_value("--listen", &s.listen, format!("expected IP:PORT ({e})")))?;
        let advertised = s.advertised.clone().unwrap_or_else(|| bind.to_string());
        let (host, port) = host_port("--advertised", &advertised)?;
        let name = s.security_protocol.as_deref().unwrap_or("PLAINTEXT");
        let protocol = SecurityProtocol::parse(name).ok_or_else(|| {
            bad_value(
                "--security-protocol",
                name,
                "expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
            )
        })?;
        return Ok(vec![Listener {
            name: protocol.name().to_string(),
            protocol,
            bind,
            advertised_host: host,
            advertised_port: i32::from(port),
        }]);
    };
    for flag in ["listen", "advertised", "security_protocol"] {
        if given.contains(&flag) {
            return Err(broken_rule(
                &format!("--{}", flag.replace('_', "-")),
                "not with --listeners (give each listener there, its protocol in --listener-security-protocol-map and its address for clients in --advertised-listeners)",
            ));
        }
    }
    let mut map: Vec<(String, SecurityProtocol)> = Vec::new();
    for entry in s
        .listener_security_protocol_map
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let flag = "--listener-security-protocol-map";
        let (name, proto) = entry
            .split_once(':')
            .ok_or_else(|| bad_value(flag, entry, "expected NAME:PROTOCOL"))?;
        let protocol = SecurityProtocol::parse(proto).ok_or_else(|| {
            bad_value(
                flag,
                entry,
                "expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
            )
        })?;
        map.push((name.trim().to_ascii_uppercase(), protocol));
    }
    let advertised = named_entries(
        "--advertised-listeners",
        s.advertised_listeners.as_deref().unwrap_or(""),
    )?;
    let mut out = Vec::new();
    for (name, addr) in named_entries("--listeners", list)? {
        let bind: SocketAddr = addr
            .parse()
            .map_err(|e| bad_value("--listeners", addr, format!("expected IP:PORT ({e})")))?;
        let protocol = map
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
            .or_else(|| SecurityProtocol::parse(&name))
            .ok_or_else(|| {
                bad_value(
                    "--listener-security-protocol-map",
                    s.listener_security_protocol_map.as_deref().unwrap_or(""),
                    format!("listener {name} has no security protocol"),
                )
            })?;
        if out
            .iter()
            .any(|l: &Listener| l.bind.port() == bind.port() && bind.port() != 0)
        {
            return Err(bad_value(
                "--listeners",
                list,
                format!("port {} is used twice", bind.port()),
            ));
        }
        let (host, port) = match advertised.iter().find(|(n, _)| *n == name) {
            Some((_, a)) => host_port("--advertised-listeners", a)?,
            None if bind.ip().is_unspecified() => {
                return Err(bad_value(
                    "--advertised-listeners",
                    s.advertised_listeners.as_deref().unwrap_or("none"),
                    format!("listener {name} binds {bind}: give the address clients use"),
                ))
            }
            None => (bind.ip().to_string(), bind.port()),
        };
        out.push(Listener {
            name,
            protocol,
            bind,
            advertised_host: host,
            advertised_port: i32::from(port),
        });
    }
    if out.is_empty() {
        return Err(bad_value("--listeners", list, "no listener"));
    }
    if let Some((name, _)) = advertised
        .iter()
        .find(|(n, _)| !out.iter().any(|l| l.name == *n))
    {
        return Err(bad_value(
            "--advertised-listeners",
            s.advertised_listeners.as_deref().unwrap_or(""),
            format!("{name} is not one of --listeners"),
        ));
    }
    if let Some(inter) = s.inter_broker_listener_name.as_deref() {
        let inter = inter.trim().to_ascii_uppercase();
        let i = out.iter().position(|l| l.name == inter).ok_or_else(|| {
            bad_value(
                "--inter-broker-listener-name",
                &inter,
                "not one of --listeners",
            )
        })?;
        let l = out.remove(i);
        out.insert(0, l);
    }
    Ok(out)
}

/// The resolved configuration of one broker process.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: i32,
    pub listen: SocketAddr,
    /// Host and port clients are told to connect to (Metadata, DescribeCluster).
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Every Kafka listener, the inter-broker one first (whose address, host and port
    /// are also `listen` and `advertised_*`): one for --listen, or --listeners'.
    pub listeners: Vec<Listener>,
    /// The TLS of the listeners that are SSL or SASL_SSL.
    pub tls: Option<TlsSettings>,
    /// The SASL of the listeners that are SASL_PLAINTEXT or SASL_SSL.
    pub sasl: Option<SaslSettings>,
    /// `--authorizer` with its super users (the SASL bootstrap user among them) and
    /// `--allow-everyone-if-no-acl-found`; `None` when ACLs are not checked.
    pub authorizer: Option<sluice_replication::acl::AuthorizerConfig>,
    /// broker.rack
    pub rack: Option<String>,
    /// The settings given by flag or config file (the others are defaults): Kafka's
    /// STATIC_BROKER_CONFIG source in DescribeConfigs.
    pub given: Vec<&'static str>,
    /// Consumers in a follower's rack are told to fetch from it (KIP-392).
    pub rack_aware_fetch: bool,
    pub data_dir: PathBuf,
    pub cores: usize,
    pub default_partitions: i32,
    pub auto_create_topics: bool,
    pub auto_leader_rebalance_enable: bool,
    pub socket_request_max_bytes: usize,
    /// group.initial.rebalance.delay.ms
    pub group_initial_rebalance_delay_ms: i64,
    /// group.min.session.timeout.ms
    pub group_min_session_timeout_ms: i32,
    /// group.max.session.timeout.ms
    pub group_max_session_timeout_ms: i32,
    /// group.max.size
    pub group_max_size: i32,
    /// group.consumer.session.timeout.ms
    pub group_consumer_session_timeout_ms: i32,
    /// group.consumer.heartbeat.interval.ms
    pub group_consumer_heartbeat_interval_ms: i32,
    /// group.consumer.assignors, parsed.
    pub group_consumer_assignors: Vec<sluice_coordinator::group::assignor::Assignor>,
    /// offsets.retention.minutes
    pub offsets_retention_minutes: i64,
    /// transaction.max.timeout.ms
    pub transaction_max_timeout_ms: i32,
    /// The lag sampler's period.
    pub lag_sample_interval_ms: u64,
    /// The lag evaluation's settings (window, Burrow's min-distance).
    pub lag_eval: sluice_coordinator::lag::LagConfig,
    /// Lag alert rules in order (the first matching a group applies): the config file's
    /// `[[alert]]` tables, then the flags' rule for every group.
    pub alert_rules: Vec<sluice_coordinator::alert::Rule>,
    pub alert_for_ms: u64,
    pub alert_repeat_ms: u64,
    pub alert_webhook: Option<String>,
    /// `--remote-storage` (checked at start-up: see `sluice_tiered::Store::open`).
    pub remote_storage: Option<String>,
    pub remote_storage_threads: usize,
    pub remote_fetch_cache_bytes: u64,
    pub remote_log_manager_task_interval_ms: u64,
    /// 0: half of the data directory's file system.
    pub remote_upload_backlog_max_bytes: u64,
    pub alertmanager_url: Option<String>,
    /// `--alert-ssl-ca`.
    pub alert_ssl_ca: Option<PathBuf>,
    /// log.retention.check.interval.ms: the storage retention pass.
    pub log_retention_check_interval_ms: u64,
    /// log.cleaner.backoff.ms: the compaction loop's rest after an idle round.
    pub log_cleaner_backoff_ms: u64,
    /// The free-space minimum of the data directory: appends are refused below it.
    pub disk_min_free: DiskMinimum,
    /// Tests only: storage fault rules re-read from this file.
    pub fault_rules: Option<PathBuf>,
    /// The metadata quorum's listener (absent: a quorum of this node alone).
    pub controller_listen: Option<SocketAddr>,
    /// The bootstrap voters and their addresses (this node among them unless it joins).
    pub controller_quorum: Vec<(i32, SocketAddr)>,
    /// process.roles has `controller`: this node votes or may be made a voter.
    pub controller_role: bool,
    /// process.roles has `broker`: this node registers, holds partitions and serves
    /// the Kafka API (a controller without it runs only its quorum member).
    pub broker_role: bool,
    /// broker.session.timeout.ms
    pub broker_session_timeout_ms: u64,
    /// broker.heartbeat.interval.ms
    pub broker_heartbeat_interval_ms: u64,
    /// replica.lag.time.max.ms
    pub replica_lag_time_max_ms: u64,
    /// replica.fetch.wait.max.ms
    pub replica_fetch_wait_max_ms: u64,
    /// max.incremental.fetch.session.cache.slots (the whole broker's).
    pub max_incremental_fetch_session_cache_slots: usize,
    /// `--reactor-wake-ms`
    pub reactor_wake_ms: u64,
    /// `--shared-sync-min`
    pub shared_sync_min: u64,
    /// `--dsync-logs-max`
    pub dsync_logs_max: u64,
    /// `--journal-chunk-bytes`
    pub journal_chunk_bytes: u64,
    /// The metrics endpoint's address (`--metrics-listen`).
    pub metrics_listen: MetricsListen,
    /// `--metrics-tls`: the metrics endpoint speaks https (with `tls`'s certificate).
    pub metrics_tls: bool,
}

/// Where the metrics endpoint listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsListen {
    /// `--metrics-listen off`.
    Off,
    /// The default (the Kafka host, port + [`METRICS_PORT_OFFSET`]): a bind failure is
    /// a warning and the broker runs without metrics.
    Default(SocketAddr),
    /// Given by the operator: a bind failure stops start-up.
    Explicit(SocketAddr),
}

/// The default metrics port is the Kafka port plus this: 9092 -> 9644.
pub const METRICS_PORT_OFFSET: u16 = 552;

/// `--metrics-listen` resolved against the Kafka listener.
fn metrics_listen(given: Option<&str>, kafka: SocketAddr) -> Result<MetricsListen, ConfigError> {
    match given.map(str::trim) {
        Some("off") => Ok(MetricsListen::Off),
        Some(a) => a.parse().map(MetricsListen::Explicit).map_err(|e| {
            bad_value(
                "--metrics-listen",
                a,
                format!("expected IP:PORT or off ({e})"),
            )
        }),
        // Port 0 (any free port) stays 0; a port too high for the offset has no default.
        None if kafka.port() == 0 => Ok(MetricsListen::Default(SocketAddr::new(kafka.ip(), 0))),
        None => Ok(match kafka.port().checked_add(METRICS_PORT_OFFSET) {
            Some(p) => MetricsListen::Default(SocketAddr::new(kafka.ip(), p)),
            None => MetricsListen::Off,
        }),
    }
}

impl BrokerConfig {
    /// What clients of listener `name` are told to connect to (the inter-broker
    /// listener's address for `""` or an unknown name).
    pub fn advertised_for(&self, name: &str) -> (&str, i32) {
        let l = self
            .listeners
            .iter()
            .find(|l| *l.name == *name)
            .unwrap_or(&self.listeners[0]);
        (&l.advertised_host, l.advertised_port)
    }

    /// This broker's id ([`Self::node_id`]) as the broker's own structs carry it.
    pub fn broker_id(&self) -> BrokerId {
        BrokerId::new(self.node_id)
    }

    /// Applies the defaults to `settings` (the flags `.or(` the file `)`) and validates
    /// the result; errors name the flag.
    pub fn resolve(settings: Settings, online_cpus: usize) -> Result<BrokerConfig, ConfigError> {
        let settings_given = settings.given();
        let s = settings.with_defaults();
        check_group_settings(&s)?;
        let (controller_listen, controller_quorum, (controller_role, broker_role)) =
            check_cluster_settings(&s)?;
        let listeners = listeners(&s, &settings_given)?;
        let listen = listeners[0].bind;
        let host = listeners[0].advertised_host.clone();
        let port = listeners[0].advertised_port;
        let cores = s.cores.unwrap_or(online_cpus.max(1));
        let rack_aware_fetch = match s.replica_selector.as_str() {
            "rack" => true,
            "leader" => false,
            other => {
                return Err(bad_value(
                    "--replica-selector",
                    other,
                    "expected rack or leader",
                ))
            }
        };
        if s.rack
            .as_deref()
            .is_some_and(|r| r.is_empty() || r.len() > 255)
        {
            return Err(broken_rule("--rack", "must be 1 to 255 characters"));
        }
        if cores == 0 {
            return Err(broken_rule("--cores", "must be at least 1"));
        }
        if s.default_partitions < 1 {
            return Err(broken_rule("--default-partitions", "must be at least 1"));
        }
        if s.socket_request_max_bytes < 1024 {
            return Err(broken_rule(
                "--socket-request-max-bytes",
                "must be at least 1024",
            ));
        }
        // Kafka's lower bound is 1; an upper bound keeps the timer arithmetic finite.
        if !(1..=i64::MAX as u64 / 2).contains(&s.log_retention_check_interval_ms) {
            return Err(bad_value(
                "--log-retention-check-interval-ms",
                s.log_retention_check_interval_ms,
                format!("must be between 1 and {}", i64::MAX as u64 / 2),
            ));
        }
        if !(1..=i64::MAX as u64 / 2).contains(&s.log_cleaner_backoff_ms) {
            return Err(bad_value(
                "--log-cleaner-backoff-ms",
                s.log_cleaner_backoff_ms,
                format!("must be between 1 and {}", i64::MAX as u64 / 2),
            ));
        }
        if !LOG_FORMATS.contains(&s.log_format.as_str()) {
            return Err(bad_value(
                "--log-format",
                &s.log_format,
                "expected text or json",
            ));
        }
        if s.disk_min_free_percent > 100 {
            return Err(bad_value(
                "--disk-min-free-percent",
                s.disk_min_free_percent,
                "must be between 0 and 100",
            ));
        }
        let alert_rules = flag_alert_rule(&s)?.into_iter().collect();
        if s.lag_sample_interval_ms < 10 {
            return Err(broken_rule(
                "--lag-sample-interval-ms",
                "must be at least 10",
            ));
        }
        if !(1..=1000).contains(&s.lag_window) {
            return Err(bad_value(
                "--lag-window",
                s.lag_window,
                "must be between 1 and 1000",
            ));
        }
        let tls = tls_settings(&s, &listeners)?;
        let sasl = sasl_settings(&s, &listeners, std::env::var(SASL_BOOTSTRAP_ENV).ok())?;
        let metrics_listen = match metrics_listen(s.metrics_listen.as_deref(), listen)? {
            // The default address is another listener's port: no default (the Kafka
            // listener wins; --metrics-listen chooses one).
            MetricsListen::Default(a)
                if a.port() != 0
                    && (listeners.iter().any(|l| l.bind.port() == a.port())
                        || controller_listen.is_some_and(|c| c.port() == a.port())) =>
            {
                MetricsListen::Off
            }
            m => m,
        };
        let authorizer = authorizer_settings(&s, sasl.as_ref())?;
        Ok(BrokerConfig {
            node_id: s.node_id,
            listen,
            advertised_host: host,
            advertised_port: port,
            listeners,
            tls,
            sasl,
            authorizer,
            rack: s.rack,
            given: settings_given,
            rack_aware_fetch,
            data_dir: s.data_dir,
            cores,
            default_partitions: s.default_partitions,
            auto_create_topics: s.auto_create_topics,
            auto_leader_rebalance_enable: s.auto_leader_rebalance_enable,
            socket_request_max_bytes: s.socket_request_max_bytes,
            group_initial_rebalance_delay_ms: s.group_initial_rebalance_delay_ms,
            group_min_session_timeout_ms: s.group_min_session_timeout_ms,
            group_max_session_timeout_ms: s.group_max_session_timeout_ms,
            group_max_size: s.group_max_size,
            group_consumer_session_timeout_ms: s.group_consumer_session_timeout_ms,
            group_consumer_heartbeat_interval_ms: s.group_consumer_heartbeat_interval_ms,
            group_consumer_assignors: consumer_assignors(&s.group_consumer_assignors)?,
            offsets_retention_minutes: s.offsets_retention_minutes,
            transaction_max_timeout_ms: s.transaction_max_timeout_ms,
            lag_sample_interval_ms: s.lag_sample_interval_ms,
            lag_eval: sluice_coordinator::lag::LagConfig {
                window: s.lag_window,
                ..Default::default()
            },
            alert_rules,
            alert_for_ms: s.alert_for_ms,
            alert_repeat_ms: s.alert_repeat_ms,
            alert_webhook: s.alert_webhook.clone(),
            remote_storage: s.remote_storage.clone(),
            remote_storage_threads: (s.remote_storage_threads as usize).clamp(1, 64),
            remote_fetch_cache_bytes: s.remote_fetch_cache_bytes,
            remote_log_manager_task_interval_ms: s.remote_log_manager_task_interval_ms.max(10),
            remote_upload_backlog_max_bytes: s.remote_upload_backlog_max_bytes,
            alertmanager_url: s.alertmanager_url.clone(),
            alert_ssl_ca: s.alert_ssl_ca.clone().map(PathBuf::from),
            log_retention_check_interval_ms: s.log_retention_check_interval_ms,
            log_cleaner_backoff_ms: s.log_cleaner_backoff_ms,
            disk_min_free: DiskMinimum {
                bytes: s.disk_min_free_bytes,
                percent: s.disk_min_free_percent,
            },
            fault_rules: s.fault_rules,
            controller_listen,
            controller_quorum,
            controller_role,
            broker_role,
            broker_session_timeout_ms: s.broker_session_timeout_ms,
            broker_heartbeat_interval_ms: s.broker_heartbeat_interval_ms,
            replica_lag_time_max_ms: s.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms: s.replica_fetch_wait_max_ms,
            max_incremental_fetch_session_cache_slots: s.max_incremental_fetch_session_cache_slots,
            reactor_wake_ms: s.reactor_wake_ms,
            shared_sync_min: s.shared_sync_min,
            dsync_logs_max: s.dsync_logs_max,
            journal_chunk_bytes: s.journal_chunk_bytes,
            metrics_listen,
            metrics_tls: s.metrics_tls,
        })
    }
}

/// The files and client-certificate policy of an `SSL` listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub certificate: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub client_auth: sluice_client::tls::ClientAuth,
}

impl TlsSettings {
    /// What the listener serves with (reads and checks the files).
    pub fn server_config(
        &self,
    ) -> Result<std::sync::Arc<rustls::ServerConfig>, sluice_client::tls::TlsError> {
        sluice_client::tls::server_config(
            &self.certificate,
            &self.key,
            Some(&self.ca),
            self.client_auth,
        )
    }

    /// The same certificate, no client certificate asked for: what SASL_SSL listeners
    /// (the SASL login is the principal; as Kafka, KIP-684, `ssl.client.auth` is not
    /// theirs) and the metrics endpoint (`--metrics-tls`) serve with.
    pub fn no_client_auth_config(
        &self,
    ) -> Result<std::sync::Arc<rustls::ServerConfig>, sluice_client::tls::TlsError> {
        sluice_client::tls::server_config(
            &self.certificate,
            &self.key,
            None,
            sluice_client::tls::ClientAuth::None,
        )
    }

    /// The controller port's TLS, both ends (mutual; see
    /// `sluice_client::tls::controller_configs`).
    pub fn controller_configs(
        &self,
    ) -> Result<
        (
            std::sync::Arc<rustls::ServerConfig>,
            std::sync::Arc<rustls::ClientConfig>,
        ),
        sluice_client::tls::TlsError,
    > {
        sluice_client::tls::controller_configs(&self.certificate, &self.key, &self.ca)
    }

    /// What this broker connects to other brokers with: their certificates checked
    /// against the CA file, its own presented whenever a listener asks for one (also
    /// when its own listener asks for none: brokers moved to `required` one at a time
    /// must get it from those not moved yet).
    pub fn peer_config(
        &self,
    ) -> Result<std::sync::Arc<rustls::ClientConfig>, sluice_client::tls::TlsError> {
        let identity = Some((self.certificate.as_path(), self.key.as_path()));
        sluice_client::tls::client_config(&self.ca, identity)
    }
}

/// `--security-protocol` and the `--ssl-*` settings, checked together.
fn tls_settings(s: &Resolved, listeners: &[Listener]) -> Result<Option<TlsSettings>, ConfigError> {
    let given = [
        ("--ssl-certificate", &s.ssl_certificate),
        ("--ssl-key", &s.ssl_key),
        ("--ssl-ca", &s.ssl_ca),
    ];
    match listeners.iter().any(|l| l.protocol.tls()) || s.metrics_tls {
        false => {
            if let Some((flag, _)) = given.iter().find(|(_, v)| v.is_some()) {
                return Err(bad_value(
                    flag,
                    "given",
                    "only a TLS listener uses it (SSL or SASL_SSL), or --metrics-tls",
                ));
            }
            Ok(None)
        }
        true => {
            let auth =
                sluice_client::tls::ClientAuth::parse(&s.ssl_client_auth).ok_or_else(|| {
                    bad_value(
                        "--ssl-client-auth",
                        &s.ssl_client_auth,
                        "expected none, requested or required",
                    )
                })?;
            let need = |flag: &str, v: &Option<String>| {
                v.clone().map(PathBuf::from).ok_or_else(|| {
                    bad_value(
                        flag,
                        "missing",
                        "a TLS listener (SSL or SASL_SSL) needs it, as does --metrics-tls",
                    )
                })
            };
            Ok(Some(TlsSettings {
                certificate: need("--ssl-certificate", &s.ssl_certificate)?,
                key: need("--ssl-key", &s.ssl_key)?,
                // Always: this broker verifies the brokers whose SSL listeners it
                // connects to (the files are read when the broker starts).
                ca: need("--ssl-ca", &s.ssl_ca)?,
                client_auth: auth,
            }))
        }
    }
}

/// The environment variable naming the user a SASL cluster's brokers authenticate to
/// each other as, `name:password` (Redpanda's RP_BOOTSTRAP_USER): each broker creates
/// its SCRAM credentials when the user has none, so the first user exists without a
/// user to create it. Not a flag or file setting: a password does not belong in
/// either.
pub const SASL_BOOTSTRAP_ENV: &str = "SLUICE_SASL_BOOTSTRAP_USER";

/// The SASL side of a `SASL_PLAINTEXT` or `SASL_SSL` listener.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslSettings {
    /// `--sasl-enabled-mechanisms`, in the order given.
    pub mechanisms: Vec<sluice_client::sasl::Mechanism>,
    /// From [`SASL_BOOTSTRAP_ENV`].
    pub bootstrap_user: String,
    pub bootstrap_password: String,
}

impl std::fmt::Debug for SaslSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslSettings")
            .field("mechanisms", &self.mechanisms)
            .field("bootstrap_user", &self.bootstrap_user)
            .field("bootstrap_password", &"<hidden>")
            .finish()
    }
}

impl SaslSettings {
    /// The mechanism this broker authenticates to other brokers with: the first
    /// enabled SCRAM one (the bootstrap user has credentials for both), else PLAIN
    /// (checked against those credentials).
    pub fn peer_mechanism(&self) -> sluice_client::sasl::Mechanism {
        self.mechanisms
            .iter()
            .copied()
            .find(|m| m.is_scram())
            .unwrap_or(sluice_client::sasl::Mechanism::Plain)
    }
}

/// `--authorizer`'s settings: super users parsed as principals (`Type:name`), the SASL
/// bootstrap user added (the other two settings are without effect, and a warning,
/// without `--authorizer`).
fn authorizer_settings(
    s: &Resolved,
    sasl: Option<&SaslSettings>,
) -> Result<Option<sluice_replication::acl::AuthorizerConfig>, ConfigError> {
    let mut super_users = Vec::new();
    for p in s
        .super_users
        .as_deref()
        .unwrap_or("")
        .split(';')
        .map(str::trim)
    {
        if p.is_empty() {
            continue;
        }
        if sluice_replication::acl::parse_principal(p).is_none() {
            return Err(bad_value(
                "--super-users",
                p,
                "expected principals Type:name separated by ';', e.g. User:admin",
            ));
        }
        super_users.push(p.to_string());
    }
    if !s.authorizer {
        if !super_users.is_empty() || s.allow_everyone_if_no_acl_found {
            tracing::warn!("--super-users and --allow-everyone-if-no-acl-found take effect only with --authorizer: every client may do everything");
        }
        return Ok(None);
    }
    if let Some(sasl) = sasl {
        super_users.push(format!("User:{}", sasl.bootstrap_user));
    }
    Ok(Some(sluice_replication::acl::AuthorizerConfig {
        super_users,
        allow_if_no_acl: s.allow_everyone_if_no_acl_found,
    }))
}

/// `--sasl-enabled-mechanisms` and the bootstrap user, for a SASL listener; a SASL
/// setting given to another listener is refused.
fn sasl_settings(
    s: &Resolved,
    listeners: &[Listener],
    bootstrap: Option<String>,
) -> Result<Option<SaslSettings>, ConfigError> {
    let Some(sasl) = listeners.iter().find(|l| l.protocol.sasl()) else {
        return Ok(None);
    };
    // The flag that made it SASL: --security-protocol, or the map of --listeners.
    let (flag, protocol) = match s.listeners {
        Some(_) => (
            "--listener-security-protocol-map",
            format!("{}:{}", sasl.name, sasl.protocol.name()),
        ),
        None => ("--security-protocol", sasl.protocol.name().to_string()),
    };
    let mut mechanisms = Vec::new();
    for name in s.sasl_enabled_mechanisms.split(',').map(str::trim) {
        let m = sluice_client::sasl::Mechanism::parse(name).ok_or_else(|| {
            bad_value(
                "--sasl-enabled-mechanisms",
                name,
                "expected SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN",
            )
        })?;
        if !mechanisms.contains(&m) {
            mechanisms.push(m);
        }
    }
    let Some(bootstrap) = bootstrap else {
        return Err(bad_value(
            flag,
            protocol,
            format!("a SASL listener needs the environment variable {SASL_BOOTSTRAP_ENV}=name:password (the user brokers authenticate to each other as, created if it has no credentials)"),
        ));
    };
    let (user, password) = bootstrap
        .split_once(':')
        .filter(|(u, p)| !u.is_empty() && !p.is_empty())
        .ok_or_else(|| {
            bad_value(
                SASL_BOOTSTRAP_ENV,
                "<hidden>",
                "expected name:password, both non-empty",
            )
        })?;
    Ok(Some(SaslSettings {
        mechanisms,
        bootstrap_user: user.to_string(),
        bootstrap_password: password.to_string(),
    }))
}

/// One `[[alert]]` table of the config file: a lag alert rule for the groups whose id
/// matches `group` (a glob: `*`, `?`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlertRuleFile {
    group: String,
    lag_records: Option<i64>,
    lag_seconds: Option<f64>,
    min_status: Option<String>,
    for_ms: Option<u64>,
    repeat_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct AlertRulesFile {
    #[serde(default)]
    alert: Vec<AlertRuleFile>,
}

fn lag_status(s: &str, what: &str) -> Result<sluice_coordinator::lag::Status, ConfigError> {
    sluice_coordinator::lag::Status::parse(s)
        .ok_or_else(|| bad_value(what, s, "expected WARN, ERR, STOP, STALL or REWIND"))
}

fn alert_rule(
    group: &str,
    records: Option<i64>,
    seconds: Option<f64>,
    status: Option<&str>,
    timing: (u64, u64),
    what: &str,
) -> Result<sluice_coordinator::alert::Rule, ConfigError> {
    if records.is_none() && seconds.is_none() && status.is_none() {
        return Err(bad_entry(
            what,
            "give at least one of lag_records, lag_seconds, min_status",
        ));
    }
    if records.is_some_and(|n| n < 0) || seconds.is_some_and(|s| s.is_nan() || s < 0.0) {
        return Err(bad_entry(what, "thresholds must be at least 0"));
    }
    let min_status = status.map(|s| lag_status(s, what)).transpose()?;
    Ok(sluice_coordinator::alert::Rule {
        group_glob: group.to_string(),
        lag_records: records,
        lag_seconds: seconds,
        min_status,
        for_ms: timing.0.min(i64::MAX as u64 / 2) as i64,
        repeat_ms: timing.1.clamp(1, i64::MAX as u64 / 2) as i64,
    })
}

/// The rule of --alert-lag-records/--alert-lag-seconds/--alert-min-status, for every
/// group (`None` if none is given).
fn flag_alert_rule(s: &Resolved) -> Result<Option<sluice_coordinator::alert::Rule>, ConfigError> {
    if s.alert_lag_records.is_none()
        && s.alert_lag_seconds.is_none()
        && s.alert_min_status.is_none()
    {
        return Ok(None);
    }
    alert_rule(
        "*",
        s.alert_lag_records,
        s.alert_lag_seconds,
        s.alert_min_status.as_deref(),
        (s.alert_for_ms, s.alert_repeat_ms),
        "--alert-lag-records/--alert-lag-seconds/--alert-min-status",
    )
    .map(Some)
}

impl BrokerConfig {
    /// Puts the config file's `[[alert]]` rules before the flags' rule (the first rule
    /// matching a group applies). Unset `for_ms`/`repeat_ms` take the flags' values.
    pub fn add_file_alert_rules(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let file: AlertRulesFile = toml::from_str::<toml::Table>(&text)
            .and_then(|t| {
                let alert = t.get("alert").cloned();
                let mut only = toml::Table::new();
                if let Some(a) = alert {
                    only.insert("alert".into(), a);
                }
                toml::Value::Table(only).try_into()
            })
            .map_err(|source| ConfigError::ParseAlerts {
                path: path.to_path_buf(),
                source,
            })?;
        let mut rules = Vec::new();
        for (i, r) in file.alert.iter().enumerate() {
            let what = format!(
                "{} [[alert]] #{} (group {:?})",
                path.display(),
                i + 1,
                r.group
            );
            rules.push(alert_rule(
                &r.group,
                r.lag_records,
                r.lag_seconds,
                r.min_status.as_deref(),
                (
                    r.for_ms.unwrap_or(self.alert_for_ms),
                    r.repeat_ms.unwrap_or(self.alert_repeat_ms),
                ),
                &what,
            )?);
        }
        rules.append(&mut self.alert_rules);
        self.alert_rules = rules;
        Ok(())
    }
}

/// The free space a data directory keeps: appends are refused below the smaller of
/// `bytes` and `percent` of the file system (either 0: no minimum). The smaller one, so
/// that neither default is absurd on a very large or a very small disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskMinimum {
    pub bytes: u64,
    pub percent: u8,
}

impl DiskMinimum {
    /// The minimum free bytes on a file system of `total` bytes.
    pub fn threshold(&self, total: u64) -> u64 {
        let of_size = (total as u128 * u128::from(self.percent) / 100) as u64;
        self.bytes.min(of_size)
    }
}

/// The values `--log-format` takes.
pub const LOG_FORMATS: [&str; 2] = ["text", "json"];

/// The controller voters: node id and quorum address.
type Voters = Vec<(i32, SocketAddr)>;

/// The metadata quorum and replication settings, validated together: the controller
/// listener and the voters.
/// The controller listener, the bootstrap voters and the roles (controller, broker).
type ClusterSettings = (Option<SocketAddr>, Voters, (bool, bool));

fn check_cluster_settings(s: &Resolved) -> Result<ClusterSettings, ConfigError> {
    let node_id = s.node_id;
    if node_id < 1 {
        return Err(bad_value("--node-id", node_id, "must be at least 1"));
    }
    let listen =
        match &s.controller_listen {
            Some(l) => Some(l.parse::<SocketAddr>().map_err(|e| {
                bad_value("--controller-listen", l, format!("expected IP:PORT ({e})"))
            })?),
            None => None,
        };
    let quorum = match &s.controller_quorum {
        Some(q) => parse_quorum(q)?,
        None => {
            // A quorum of this node alone; the address is never dialled.
            let addr = listen.unwrap_or_else(|| "127.0.0.1:0".parse().expect("address"));
            vec![(node_id, addr)]
        }
    };
    let listed = quorum.iter().any(|(id, _)| *id == node_id);
    let (controller, broker) = match s.process_roles.as_deref().map(str::trim) {
        None => (listed, true),
        Some("broker,controller" | "controller,broker") => (true, true),
        Some("broker") => (false, true),
        Some("controller") => (true, false),
        Some(other) => {
            return Err(bad_value(
                "--process-roles",
                other,
                "expected broker, controller or broker,controller",
            ))
        }
    };
    if !broker && listen.is_none() {
        return Err(broken_rule(
            "--controller-listen",
            "is required on a controller without the broker role",
        ));
    }
    if listed && !controller {
        return Err(broken_rule(
            "--process-roles",
            format!("broker alone, but --controller-quorum lists this node ({node_id}) as a voter"),
        ));
    }
    if (quorum.len() > 1 || !listed) && listen.is_none() {
        return Err(broken_rule(
            "--controller-listen",
            "is required with more than one controller voter, and on a node that joins",
        ));
    }
    if !listed && listen.is_some_and(|l| l.ip().is_unspecified()) {
        return Err(broken_rule(
            "--controller-listen",
            "must be an address the voters can reach on a node that joins (not 0.0.0.0)",
        ));
    }
    let (heartbeat, session) = (s.broker_heartbeat_interval_ms, s.broker_session_timeout_ms);
    if heartbeat == 0 || heartbeat.saturating_mul(2) > session {
        return Err(broken_rule(
            "--broker-heartbeat-interval-ms",
            format!("{heartbeat} must be positive and at most half of --broker-session-timeout-ms {session}"),
        ));
    }
    if s.replica_lag_time_max_ms == 0 {
        return Err(broken_rule("--replica-lag-time-max-ms", "must be positive"));
    }
    if s.reactor_wake_ms == 0 || s.reactor_wake_ms > 1_000 {
        return Err(broken_rule(
            "--reactor-wake-ms",
            "must be between 1 and 1000",
        ));
    }
    if s.replica_fetch_wait_max_ms == 0 || s.replica_fetch_wait_max_ms > 30_000 {
        return Err(broken_rule(
            "--replica-fetch-wait-max-ms",
            "must be between 1 and 30000",
        ));
    }
    Ok((listen, quorum, (controller, broker)))
}

/// group.consumer.assignors: names of server-side assignors, comma-separated.
fn consumer_assignors(
    list: &str,
) -> Result<Vec<sluice_coordinator::group::assignor::Assignor>, ConfigError> {
    use sluice_coordinator::group::assignor::Assignor;
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let a = Assignor::parse(name).ok_or_else(|| {
            bad_value(
                "--group-consumer-assignors",
                list,
                format!("{name} is not an assignor (uniform, range)"),
            )
        })?;
        if !out.contains(&a) {
            out.push(a);
        }
    }
    if out.is_empty() {
        return Err(bad_value(
            "--group-consumer-assignors",
            list,
            "must name at least one assignor (uniform, range)",
        ));
    }
    Ok(out)
}

/// The group coordinator's settings, validated together (min <= max).
fn check_group_settings(s: &Resolved) -> Result<(), ConfigError> {
    if s.group_consumer_heartbeat_interval_ms < 1
        || s.group_consumer_heartbeat_interval_ms >= s.group_consumer_session_timeout_ms
    {
        return Err(broken_rule(
            "--group-consumer-heartbeat-interval-ms",
            format!(
                "{} must be at least 1 and below --group-consumer-session-timeout-ms {}",
                s.group_consumer_heartbeat_interval_ms, s.group_consumer_session_timeout_ms
            ),
        ));
    }
    // Kafka types these as int: the same ranges here.
    if !(0..=i64::from(i32::MAX)).contains(&s.group_initial_rebalance_delay_ms) {
        return Err(bad_value(
            "--group-initial-rebalance-delay-ms",
            s.group_initial_rebalance_delay_ms,
            format!("must be between 0 and {}", i32::MAX),
        ));
    }
    if s.group_min_session_timeout_ms < 1 {
        return Err(bad_value(
            "--group-min-session-timeout-ms",
            s.group_min_session_timeout_ms,
            "must be at least 1",
        ));
    }
    if s.group_max_session_timeout_ms < s.group_min_session_timeout_ms {
        return Err(broken_rule(
            "--group-max-session-timeout-ms",
            format!(
                "{} is below --group-min-session-timeout-ms {}",
                s.group_max_session_timeout_ms, s.group_min_session_timeout_ms
            ),
        ));
    }
    if s.group_max_size < 1 {
        return Err(bad_value(
            "--group-max-size",
            s.group_max_size,
            "must be at least 1",
        ));
    }
    if !(1..=i64::from(i32::MAX)).contains(&s.offsets_retention_minutes) {
        return Err(bad_value(
            "--offsets-retention-minutes",
            s.offsets_retention_minutes,
            format!("must be between 1 and {}", i32::MAX),
        ));
    }
    Ok(())
}

/// Parses `1@host:port,2@host:port,...`.
pub fn parse_quorum(s: &str) -> Result<Vec<(i32, std::net::SocketAddr)>, ConfigError> {
    const FLAG: &str = "--controller-quorum";
    let mut out: Vec<(i32, std::net::SocketAddr)> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('@')
            .ok_or_else(|| bad_entry(FLAG, format!("'{part}' is not ID@HOST:PORT")))?;
        let id: i32 = id
            .parse()
            .map_err(|_| bad_entry(FLAG, format!("bad node id '{id}'")))?;
        if id < 1 {
            return Err(bad_entry(FLAG, format!("node id {id} must be at least 1")));
        }
        let addr: std::net::SocketAddr = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .map_err(|e| bad_entry(FLAG, format!("'{addr}': {e}")))?
            .next()
            .ok_or_else(|| bad_entry(FLAG, format!("'{addr}' resolves to nothing")))?;
        if out.iter().any(|(i, _)| *i == id) {
            return Err(bad_entry(FLAG, format!("node {id} listed twice")));
        }
        out.push((id, addr));
    }
    if out.is_empty() {
        return Err(broken_rule(FLAG, "is empty"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// The settings as `sluice serve` takes them.
    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        settings: Settings,
    }

    fn flags(args: &[&str]) -> Settings {
        let argv = std::iter::once("sluice").chain(args.iter().copied());
        Flags::try_parse_from(argv).unwrap().settings
    }

    fn file(text: &str) -> Settings {
        toml::from_str(text).unwrap()
    }

    const EXAMPLE_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/sluice.toml");

    #[test]
    fn flags_override_the_file() {
        let file = file("listen = \"127.0.0.1:1000\"\ncores = 3\nnode_id = 7");
        let flags = flags(&["--listen", "127.0.0.1:2000"]);
        let c = BrokerConfig::resolve(flags.or(file), 2).unwrap();
        assert_eq!(c.listen.port(), 2000);
        assert_eq!(c.cores, 3);
        assert_eq!(c.node_id, 7);
        assert_eq!(c.advertised_port, 2000);
        assert!(c.auto_create_topics);
        let c = BrokerConfig::resolve(Settings::default(), 2).unwrap();
        assert_eq!((c.listen.port(), c.cores, c.node_id), (9092, 2, 1));
        assert_eq!(c.data_dir, PathBuf::from("./data"));
        assert_eq!(
            c.controller_quorum,
            vec![(1, "127.0.0.1:0".parse().unwrap())]
        );
    }

    #[test]
    fn a_node_outside_the_bootstrap_voters_joins_as_a_broker_unless_told_otherwise() {
        let joiner = |roles: Option<&str>| {
            let mut args = vec![
                "--node-id",
                "4",
                "--controller-quorum",
                "1@127.0.0.1:9192,2@127.0.0.1:9292",
                "--controller-listen",
                "127.0.0.1:9492",
            ];
            if let Some(r) = roles {
                args.extend(["--process-roles", r]);
            }
            BrokerConfig::resolve(flags(&args), 2).unwrap()
        };
        assert!(!joiner(None).controller_role);
        assert!(!joiner(Some("broker")).controller_role);
        assert!(joiner(Some("broker,controller")).controller_role);
        let c = joiner(Some("controller"));
        assert!(c.controller_role && !c.broker_role);
        assert!(
            BrokerConfig::resolve(Settings::default(), 2)
                .unwrap()
                .controller_role
        );
    }

    #[test]
    fn named_listeners_resolve_with_protocols_addresses_and_the_inter_broker_one_first() {
        let c = BrokerConfig::resolve(
            flags(&[
                "--listeners=client://0.0.0.0:9093,INTERNAL://127.0.0.1:9094,PLAINTEXT://127.0.0.1:9095",
                "--advertised-listeners=CLIENT://kafka.example.com:19093",
                "--listener-security-protocol-map=CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT",
                "--inter-broker-listener-name=internal",
            ]),
            2,
        );
        // A SASL listener needs the bootstrap user from the environment.
        let e = c.unwrap_err().to_string();
        assert!(e.contains(SASL_BOOTSTRAP_ENV), "{e}");
        let r = flags(&[
            "--listeners=client://0.0.0.0:9093,INTERNAL://127.0.0.1:9094,PLAINTEXT://127.0.0.1:9095",
            "--advertised-listeners=CLIENT://kafka.example.com:19093",
            "--listener-security-protocol-map=CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT",
            "--inter-broker-listener-name=internal",
        ]);
        let given = r.given();
        let l = listeners(&r.with_defaults(), &given).unwrap();
        let names: Vec<_> = l
            .iter()
            .map(|l| {
                (
                    l.name.as_str(),
                    l.protocol,
                    l.advertised_host.as_str(),
                    l.advertised_port,
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("INTERNAL", SecurityProtocol::Plaintext, "127.0.0.1", 9094),
                (
                    "CLIENT",
                    SecurityProtocol::SaslPlaintext,
                    "kafka.example.com",
                    19093
                ),
                ("PLAINTEXT", SecurityProtocol::Plaintext, "127.0.0.1", 9095),
            ]
        );
        // The default metrics port (the inter-broker port + 552) is another listener's:
        // not used.
        let clash = BrokerConfig::resolve(
            flags(&[
                "--listeners=PLAINTEXT://127.0.0.1:9092,SSL2://127.0.0.1:9644",
                "--listener-security-protocol-map=SSL2:PLAINTEXT",
            ]),
            2,
        )
        .unwrap();
        assert_eq!(clash.metrics_listen, MetricsListen::Off);
        // Without --listeners: one listener named after its protocol.
        let one = BrokerConfig::resolve(flags(&["--listen=127.0.0.1:9500"]), 2).unwrap();
        assert_eq!(one.listeners.len(), 1);
        assert_eq!(
            (
                one.listeners[0].name.as_str(),
                one.listen.port(),
                one.advertised_port
            ),
            ("PLAINTEXT", 9500, 9500)
        );
        // Refused, each with the flag named.
        for (args, flag) in [
            (
                vec!["--listeners=A://127.0.0.1:1"],
                "--listener-security-protocol-map",
            ),
            (
                vec!["--listeners=PLAINTEXT://0.0.0.0:1"],
                "--advertised-listeners",
            ),
            (
                vec![
                    "--listeners=PLAINTEXT://127.0.0.1:1",
                    "--listen=127.0.0.1:2",
                ],
                "--listen",
            ),
            (
                vec!["--listeners=PLAINTEXT://127.0.0.1:1,plaintext://127.0.0.1:2"],
                "--listeners",
            ),
            (
                vec!["--listeners=PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:1"],
                "--listeners",
            ),
            (
                vec![
                    "--listeners=PLAINTEXT://127.0.0.1:1",
                    "--inter-broker-listener-name=X",
                ],
                "--inter-broker-listener-name",
            ),
            (
                vec![
                    "--listeners=PLAINTEXT://127.0.0.1:1",
                    "--advertised-listeners=X://h:1",
                ],
                "--advertised-listeners",
            ),
            (
                vec!["--advertised-listeners=PLAINTEXT://h:1"],
                "--advertised-listeners",
            ),
            (
                vec![
                    "--listeners=A://127.0.0.1:1",
                    "--listener-security-protocol-map=A:TLS",
                ],
                "--listener-security-protocol-map",
            ),
        ] {
            let e = BrokerConfig::resolve(flags(&args), 2)
                .unwrap_err()
                .to_string();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn sasl_listeners_need_the_bootstrap_user_and_known_mechanisms() {
        let resolved = |args: &[&str]| flags(args).with_defaults();
        let sasl = resolved(&["--security-protocol=SASL_SSL"]);
        let s = sasl_settings(
            &sasl,
            &listeners(&sasl, &[]).unwrap(),
            Some("admin:pw:with:colons".into()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.mechanisms,
            vec![
                sluice_client::sasl::Mechanism::ScramSha256,
                sluice_client::sasl::Mechanism::ScramSha512
            ]
        );
        assert_eq!(
            (s.bootstrap_user.as_str(), s.bootstrap_password.as_str()),
            ("admin", "pw:with:colons")
        );
        assert!(
            !format!("{s:?}").contains("pw:with"),
            "the password is not printed"
        );
        let missing = sasl_settings(&sasl, &listeners(&sasl, &[]).unwrap(), None)
            .unwrap_err()
            .to_string();
        assert!(missing.contains(SASL_BOOTSTRAP_ENV), "{missing}");
        for bad in ["admin", ":pw", "admin:"] {
            assert!(
                sasl_settings(&sasl, &listeners(&sasl, &[]).unwrap(), Some(bad.into())).is_err(),
                "{bad}"
            );
        }
        let unknown = resolved(&[
            "--security-protocol=SASL_PLAINTEXT",
            "--sasl-enabled-mechanisms=PLAIN,GSSAPI",
        ]);
        let e = sasl_settings(
            &unknown,
            &listeners(&unknown, &[]).unwrap(),
            Some("a:b".into()),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("GSSAPI"), "{e}");
        // Brokers log in to each other with the first SCRAM mechanism offered, else
        // PLAIN (a PLAIN-only listener refuses SCRAM logins).
        use sluice_client::sasl::Mechanism;
        let only = |m: &str| {
            let r = resolved(&[
                "--security-protocol=SASL_SSL",
                &format!("--sasl-enabled-mechanisms={m}"),
            ]);
            sasl_settings(&r, &listeners(&r, &[]).unwrap(), Some("a:b".into()))
                .unwrap()
                .unwrap()
                .peer_mechanism()
        };
        assert_eq!(only("PLAIN"), Mechanism::Plain);
        assert_eq!(only("PLAIN,SCRAM-SHA-512"), Mechanism::ScramSha512);
        assert_eq!(only("SCRAM-SHA-256,SCRAM-SHA-512"), Mechanism::ScramSha256);
        // Not a SASL listener: no SASL, whatever the environment says.
        let plain = resolved(&["--security-protocol=SSL"]);
        assert_eq!(
            sasl_settings(&plain, &listeners(&plain, &[]).unwrap(), Some("a:b".into())).unwrap(),
            None
        );
    }

    #[test]
    fn every_setting_is_one_flag_and_one_key_with_its_help() {
        let cmd = Flags::command();
        let args: Vec<_> = cmd
            .get_arguments()
            .filter(|a| a.get_id() != "help")
            .collect();
        let ids: Vec<&str> = args.iter().map(|a| a.get_id().as_str()).collect();
        assert_eq!(ids, Settings::KEYS);
        for a in args {
            let key = a.get_id().as_str();
            assert_eq!(a.get_long(), Some(key.replace('_', "-").as_str()));
            let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(
                help.len() > 20 && help.contains("[default: "),
                "--{key}: {help}"
            );
        }
        assert!(flags(&["--auto-create-topics", "false"]).auto_create_topics == Some(false));
        let every = [
            "--node-id=2",
            "--listen=127.0.0.1:1",
            "--advertised=h:1",
            "--security-protocol=SSL",
            "--listeners=A://127.0.0.1:1",
            "--advertised-listeners=A://h:1",
            "--listener-security-protocol-map=A:SSL",
            "--inter-broker-listener-name=A",
            "--sasl-enabled-mechanisms=PLAIN",
            "--authorizer=true",
            "--super-users=User:admin;User:CN=broker",
            "--allow-everyone-if-no-acl-found=true",
            "--ssl-certificate=c.pem",
            "--ssl-key=k.pem",
            "--ssl-ca=ca.pem",
            "--ssl-client-auth=required",
            "--rack=zone-b",
            "--replica-selector=leader",
            "--data-dir=d",
            "--cores=1",
            "--default-partitions=2",
            "--auto-create-topics=false",
            "--auto-leader-rebalance-enable=false",
            "--socket-request-max-bytes=2048",
            "--group-initial-rebalance-delay-ms=1",
            "--group-min-session-timeout-ms=2",
            "--group-max-session-timeout-ms=3",
            "--group-max-size=11",
            "--group-consumer-session-timeout-ms=3000",
            "--group-consumer-heartbeat-interval-ms=300",
            "--group-consumer-assignors=range",
            "--offsets-retention-minutes=4",
            "--transaction-max-timeout-ms=7",
            "--lag-sample-interval-ms=100",
            "--lag-window=5",
            "--alert-lag-records=10",
            "--alert-lag-seconds=2.5",
            "--alert-min-status=WARN",
            "--alert-for-ms=1",
            "--alert-repeat-ms=2",
            "--alert-webhook=http://h/",
            "--remote-storage=file:///r",
            "--remote-storage-threads=3",
            "--remote-fetch-cache-bytes=1024",
            "--remote-log-manager-task-interval-ms=50",
            "--remote-upload-backlog-max-bytes=4096",
            "--alertmanager-url=http://am/",
            "--alert-ssl-ca=am-ca.pem",
            "--log-retention-check-interval-ms=5",
            "--log-cleaner-backoff-ms=6",
            "--disk-min-free-bytes=8",
            "--disk-min-free-percent=9",
            "--fault-rules=f",
            "--controller-listen=127.0.0.1:2",
            "--controller-quorum=2@127.0.0.1:2",
            "--process-roles=broker,controller",
            "--broker-session-timeout-ms=1000",
            "--broker-heartbeat-interval-ms=100",
            "--replica-lag-time-max-ms=6",
            "--replica-fetch-wait-max-ms=10",
            "--max-incremental-fetch-session-cache-slots=4",
            "--reactor-wake-ms=20",
            "--shared-sync-min=0",
            "--dsync-logs-max=3",
            "--journal-chunk-bytes=65536",
            "--log-format=json",
            "--metrics-listen=127.0.0.1:3",
            "--metrics-tls=true",
        ];
        let s = flags(&every);
        // --listeners replaces --listen, --advertised and --security-protocol: every
        // setting but those three resolves, and so does every one but the four named
        // listener settings.
        let c = BrokerConfig::resolve(without_named_listeners(s.clone()), 1).unwrap();
        let named = BrokerConfig::resolve(
            Settings {
                listen: None,
                advertised: None,
                security_protocol: None,
                ..s.clone()
            },
            1,
        )
        .unwrap();
        assert_eq!(
            (named.listeners.len(), named.advertised_host.as_str()),
            (1, "h")
        );
        assert_eq!((c.node_id, c.advertised_host.as_str()), (2, "h"));
        assert!(c.controller_role);
        assert_eq!(c.socket_request_max_bytes, 2048);
        assert!(!c.auto_leader_rebalance_enable);
        assert_eq!(c.replica_lag_time_max_ms, 6);
        assert_eq!(c.replica_fetch_wait_max_ms, 10);
        assert_eq!(c.max_incremental_fetch_session_cache_slots, 4);
        assert_eq!(
            (c.reactor_wake_ms, c.shared_sync_min, c.dsync_logs_max),
            (20, 0, 3)
        );
        assert_eq!(c.journal_chunk_bytes, 65536);
        assert_eq!(c.transaction_max_timeout_ms, 7);
        assert_eq!(c.group_max_size, 11);
        assert_eq!(
            (
                c.group_consumer_session_timeout_ms,
                c.group_consumer_heartbeat_interval_ms,
                c.group_consumer_assignors.clone(),
            ),
            (
                3000,
                300,
                vec![sluice_coordinator::group::assignor::Assignor::Range]
            )
        );
        assert_eq!(
            c.disk_min_free,
            DiskMinimum {
                bytes: 8,
                percent: 9
            }
        );
        assert_eq!(c.fault_rules.as_deref(), Some(Path::new("f")));
        assert_eq!(
            c.tls,
            Some(TlsSettings {
                certificate: "c.pem".into(),
                key: "k.pem".into(),
                ca: "ca.pem".into(),
                client_auth: sluice_client::tls::ClientAuth::Required,
            })
        );
        assert_eq!(
            (c.rack.as_deref(), c.rack_aware_fetch),
            (Some("zone-b"), false)
        );
        assert_eq!((c.lag_sample_interval_ms, c.lag_eval.window), (100, 5));
        assert_eq!(
            (
                c.remote_storage.as_deref(),
                c.remote_storage_threads,
                c.remote_fetch_cache_bytes,
                c.remote_log_manager_task_interval_ms
            ),
            (Some("file:///r"), 3, 1024, 50)
        );
        assert_eq!(c.remote_upload_backlog_max_bytes, 4096);
        let authorizer = c.authorizer.as_ref().expect("--authorizer=true");
        assert_eq!(authorizer.super_users, vec!["User:admin", "User:CN=broker"]);
        assert!(authorizer.allow_if_no_acl);
        let rule = &c.alert_rules[0];
        assert_eq!((rule.lag_records, rule.lag_seconds), (Some(10), Some(2.5)));
        assert_eq!(
            (rule.for_ms, rule.repeat_ms, rule.group_glob.as_str()),
            (1, 2, "*")
        );
        assert_eq!(s.given(), Settings::KEYS);
    }

    #[test]
    fn alert_rules_come_from_flags_and_alert_tables_and_bad_ones_are_refused() {
        let c = BrokerConfig::resolve(Settings::default(), 1).unwrap();
        assert!(c.alert_rules.is_empty());
        let bad = flags(&["--alert-min-status=SOMETIMES"]);
        let e = BrokerConfig::resolve(bad, 1).unwrap_err();
        assert!(e.to_string().contains("SOMETIMES"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        let text = "node_id = 3\n[[alert]]\ngroup = \"pay-*\"\nlag_seconds = 60\n\n[[alert]]\ngroup = \"*\"\nmin_status = \"STALL\"\nrepeat_ms = 7\n";
        std::fs::write(&path, text).unwrap();
        let file = Settings::load(&path).unwrap();
        assert_eq!(file.node_id, Some(3));
        let mut c = BrokerConfig::resolve(flags(&["--alert-lag-records=1"]).or(file), 1).unwrap();
        c.add_file_alert_rules(&path).unwrap();
        let globs: Vec<_> = c
            .alert_rules
            .iter()
            .map(|r| r.group_glob.as_str())
            .collect();
        assert_eq!(globs, ["pay-*", "*", "*"]);
        assert_eq!(c.alert_rules[0].lag_seconds, Some(60.0));
        assert_eq!(c.alert_rules[0].repeat_ms, 300_000);
        assert_eq!(c.alert_rules[1].repeat_ms, 7);
        std::fs::write(&path, "[[alert]]\ngroup = \"x\"\n").unwrap();
        let e = c.add_file_alert_rules(&path).unwrap_err();
        assert!(e.to_string().contains("at least one of"), "{e}");
        std::fs::write(&path, "[[alert]]\ngroup = \"x\"\nlag_record = 5\n").unwrap();
        assert!(c.add_file_alert_rules(&path).is_err());
    }

    #[test]
    fn disk_minimum_is_the_smaller_of_bytes_and_percent_and_percent_is_bounded() {
        let c = BrokerConfig::resolve(Settings::default(), 1).unwrap();
        let gib = 1u64 << 30;
        // Defaults: 1 GiB on a large disk, 5% on a small one.
        assert_eq!(c.disk_min_free.threshold(1000 * gib), gib);
        assert_eq!(c.disk_min_free.threshold(300 << 20), 15 << 20);
        assert_eq!(
            DiskMinimum {
                bytes: 0,
                percent: 5
            }
            .threshold(gib),
            0
        );
        assert_eq!(
            DiskMinimum {
                bytes: gib,
                percent: 0
            }
            .threshold(gib),
            0
        );
        let bad = flags(&["--disk-min-free-percent=101"]);
        let e = BrokerConfig::resolve(bad, 1).unwrap_err();
        assert!(e.to_string().contains("--disk-min-free-percent 101"), "{e}");
    }

    #[test]
    fn group_and_retention_settings_default_to_kafkas_and_come_from_file_or_flags() {
        let c = BrokerConfig::resolve(Settings::default(), 1).unwrap();
        assert_eq!(c.group_initial_rebalance_delay_ms, 3_000);
        assert_eq!(c.group_min_session_timeout_ms, 6_000);
        assert_eq!(c.group_max_session_timeout_ms, 1_800_000);
        assert_eq!(c.offsets_retention_minutes, 10_080);
        assert_eq!(c.group_max_size, i32::MAX);
        assert_eq!(c.log_retention_check_interval_ms, 60_000);
        assert_eq!(c.socket_request_max_bytes, 104_857_600);
        assert_eq!(c.broker_session_timeout_ms, 9_000);
        assert_eq!(c.broker_heartbeat_interval_ms, 500);
        assert_eq!(c.replica_lag_time_max_ms, 30_000);
        let file = file(
            "group_initial_rebalance_delay_ms = 0\n\
             group_min_session_timeout_ms = 1000\n\
             group_max_session_timeout_ms = 20000\n\
             offsets_retention_minutes = 60\n\
             group_max_size = 10\n\
             log_retention_check_interval_ms = 500",
        );
        let e = BrokerConfig::resolve(flags(&["--group-max-size", "0"]), 1).unwrap_err();
        assert!(e.to_string().contains("--group-max-size 0"), "{e}");
        let flags = flags(&[
            "--group-max-session-timeout-ms",
            "30000",
            "--group-max-size",
            "2",
        ]);
        let c = BrokerConfig::resolve(flags.or(file), 1).unwrap();
        assert_eq!(c.group_initial_rebalance_delay_ms, 0);
        assert_eq!(c.group_min_session_timeout_ms, 1_000);
        assert_eq!(c.group_max_session_timeout_ms, 30_000);
        assert_eq!(c.offsets_retention_minutes, 60);
        assert_eq!(c.group_max_size, 2, "the flag wins over the file");
        assert_eq!(c.log_retention_check_interval_ms, 500);
    }

    /// The metrics address: the Kafka host and port + 552 by default, `off`, or an
    /// explicit address; anything else is refused with the flag named.
    #[test]
    fn metrics_listen_defaults_to_the_kafka_port_plus_552() {
        let resolve = |f: &[&str]| {
            BrokerConfig::resolve(flags(f), 1)
                .map(|c| c.metrics_listen)
                .map_err(|e| e.to_string())
        };
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        let default = |a: &str| Ok(MetricsListen::Default(addr(a)));
        assert_eq!(resolve(&[]), default("127.0.0.1:9644"));
        assert_eq!(
            resolve(&["--listen", "10.1.2.3:19092"]),
            default("10.1.2.3:19644")
        );
        let off = Ok(MetricsListen::Off);
        assert_eq!(resolve(&["--listen", "127.0.0.1:65500"]), off);
        assert_eq!(resolve(&["--metrics-listen", "off"]), off);
        assert_eq!(
            resolve(&["--metrics-listen", "0.0.0.0:9100"]),
            Ok(MetricsListen::Explicit(addr("0.0.0.0:9100")))
        );
        let e = resolve(&["--metrics-listen", "localhost"]).unwrap_err();
        assert!(
            e.starts_with("--metrics-listen localhost: expected IP:PORT or off"),
            "{e}"
        );
    }

    #[test]
    fn bad_settings_are_refused_with_the_flag_named() {
        let bad: &[(&[&str], &str)] = &[
            (
                &["--group-initial-rebalance-delay-ms=-1"],
                "--group-initial-rebalance-delay-ms",
            ),
            (
                &["--group-min-session-timeout-ms", "0"],
                "--group-min-session-timeout-ms",
            ),
            (
                &[
                    "--group-min-session-timeout-ms",
                    "10000",
                    "--group-max-session-timeout-ms",
                    "9000",
                ],
                "--group-max-session-timeout-ms",
            ),
            (
                &["--offsets-retention-minutes", "0"],
                "--offsets-retention-minutes",
            ),
            (
                &["--log-retention-check-interval-ms", "0"],
                "--log-retention-check-interval-ms",
            ),
            (&["--node-id", "0"], "--node-id"),
            (&["--listen", "nowhere"], "--listen"),
            (&["--advertised", "nowhere"], "--advertised"),
            (&["--cores", "0"], "--cores"),
            (&["--default-partitions", "0"], "--default-partitions"),
            (
                &["--socket-request-max-bytes", "1023"],
                "--socket-request-max-bytes",
            ),
            (&["--controller-listen", "x"], "--controller-listen"),
            (
                &["--controller-quorum", "1@127.0.0.1:1,1@127.0.0.1:2"],
                "--controller-quorum",
            ),
            // A node that joins needs an address the voters can reach.
            (
                &["--controller-quorum", "2@127.0.0.1:1"],
                "--controller-listen",
            ),
            (
                &[
                    "--controller-quorum",
                    "2@127.0.0.1:1",
                    "--controller-listen",
                    "0.0.0.0:9193",
                ],
                "--controller-listen",
            ),
            (&["--process-roles", "broker"], "--process-roles"),
            (&["--process-roles", "controller"], "--controller-listen"),
            (&["--process-roles", "voter"], "--process-roles"),
            (
                &["--broker-heartbeat-interval-ms", "5000"],
                "--broker-heartbeat-interval-ms",
            ),
            (
                &["--replica-lag-time-max-ms", "0"],
                "--replica-lag-time-max-ms",
            ),
        ];
        for (args, flag) in bad {
            let e = BrokerConfig::resolve(flags(args), 1).unwrap_err();
            assert!(e.to_string().starts_with(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let e = toml::from_str::<Settings>("colour = 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `colour`"), "{e}");
        assert!(toml::from_str::<Settings>("cores = \"two\"").is_err());
        let path = std::env::temp_dir().join(format!("sluice-config-{}.toml", std::process::id()));
        std::fs::write(&path, "node_id = 3\ncolour = 'blue'\n").unwrap();
        let e = Settings::load(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).unwrap();
        assert!(e.starts_with("parsing ") && e.contains("colour"), "{e}");
    }

    /// `deploy/sluice.toml` is the generated example, it holds the defaults, and with its
    /// commented-out examples switched on it sets every key and resolves.
    #[test]
    fn the_example_file_is_complete_and_current() {
        let want = Settings::example_toml();
        if std::env::var_os("SLUICE_WRITE_EXAMPLE").is_some() {
            std::fs::write(EXAMPLE_PATH, &want).unwrap();
        }
        let have = std::fs::read_to_string(EXAMPLE_PATH).unwrap_or_default();
        assert!(
            have == want,
            "{EXAMPLE_PATH} is stale: run `SLUICE_WRITE_EXAMPLE=1 cargo test -p sluice --lib config`"
        );
        assert_eq!(file(&have), Settings::defaults());
        let on: String = have
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(kv)
                    if kv.contains(" = ")
                        && Settings::KEYS.contains(&kv.split(' ').next().unwrap()) =>
                {
                    kv
                }
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let every = file(&on);
        assert_eq!(every.given(), Settings::KEYS);
        BrokerConfig::resolve(without_named_listeners(every), 1).unwrap();
    }

    /// `s` without the settings of named listeners (which exclude --listen and the
    /// other settings of the one listener).
    fn without_named_listeners(s: Settings) -> Settings {
        Settings {
            listeners: None,
            advertised_listeners: None,
            listener_security_protocol_map: None,
            inter_broker_listener_name: None,
            ..s
        }
    }
}
