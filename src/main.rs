//! `sluice`: the broker binary. `sluice serve --help` lists the flags.
mod cli;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sluice::base::config::{BrokerConfig, ConfigError, Settings};

#[global_allocator]
static ALLOCATOR: sluice_protocol::alloc::Allocator = sluice_protocol::alloc::Allocator;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Kafka-compatible thread-per-core log broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Kafka client properties for the Kafka connections of `group`, `cluster`, `txn`,
    /// `lag` and `user`, as Kafka's own tools take them: security.protocol (PLAINTEXT,
    /// SSL, SASL_PLAINTEXT or SASL_SSL), ssl.ca.location, ssl.certificate.location,
    /// ssl.key.location, sasl.mechanism, sasl.username, sasl.password (or
    /// sasl.jaas.config).
    #[arg(long, global = true, value_name = "FILE")]
    command_config: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker. Flags override the config file.
    Serve(Box<ServeArgs>),
    /// Consumer groups: list, describe (offsets and lag), reset offsets, delete.
    Group(GroupArgs),
    /// Cluster: brokers, controller, partition leaders and ISRs (`describe`).
    Cluster(crate::cli::cluster::ClusterArgs),
    /// Consumer lag per group and partition (records, age, Burrow status, trend), worst
    /// first, from the brokers' /v1/groups endpoints.
    Lag(crate::cli::lag::LagArgs),
    /// Transactions: list (state, partitions, timeout, age), describe one id.
    Txn(TxnArgs),
    /// SASL/SCRAM users: add (or change a password), remove, list.
    User(UserArgs),
    /// ACLs (as kafka-acls.sh): add, remove, list bindings of principals to operations
    /// on topics, groups, transactional ids and the cluster.
    Acl(AclArgs),
    /// Topics: create, list, describe (partitions, leaders, ISR, configs),
    /// alter-config, add-partitions, delete (as kafka-topics.sh).
    Topic(TopicArgs),
    /// Configs of a topic, broker or group: describe, alter (as kafka-configs.sh).
    Config(ConfigArgs),
    /// Records from standard input, one per line, to a topic (as kcat -P and
    /// kafka-console-producer.sh).
    Produce(ProduceCliArgs),
    /// Records of a topic to standard output (as kcat -C and
    /// kafka-console-consumer.sh).
    Consume(ConsumeCliArgs),
    /// Preflight before a first start: io_uring, O_DIRECT on the data directory, memlock
    /// and open-file limits, free disk, clock sync, free ports. Takes `serve`'s flags;
    /// exits 1 on a blocker.
    Check(Box<ServeArgs>),
}

#[derive(clap::Args)]
struct TxnArgs {
    /// Any broker of the cluster.
    #[arg(long, global = true, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[command(subcommand)]
    command: TxnCommand,
}

#[derive(Subcommand)]
enum TxnCommand {
    /// Every transactional id, with its state, open partitions, timeout and age.
    List,
    /// One transactional id.
    Describe { transactional_id: String },
}

/// `--bootstrap-server` of the topic, config, produce and consume commands.
#[derive(clap::Args)]
struct Bootstrap {
    /// Any broker of the cluster (several: comma-separated).
    #[arg(
        long = "bootstrap-server",
        alias = "bootstrap",
        global = true,
        default_value = "127.0.0.1:9092"
    )]
    bootstrap_server: String,
}

#[derive(clap::Args)]
struct TopicArgs {
    #[command(flatten)]
    bootstrap: Bootstrap,
    #[command(subcommand)]
    command: TopicCommand,
}

#[derive(Subcommand)]
enum TopicCommand {
    /// Creates a topic (partitions and replication factor default to the broker's).
    Create {
        topic: String,
        #[arg(long)]
        partitions: Option<i32>,
        #[arg(long)]
        replication_factor: Option<i16>,
        /// Replicas per partition, kafka-topics.sh's form: 1:2:3,2:3:1 (instead of
        /// --partitions and --replication-factor).
        #[arg(long, conflicts_with_all = ["partitions", "replication_factor"])]
        replica_assignment: Option<String>,
        /// A topic config, key=value (repeat for more).
        #[arg(long = "config")]
        configs: Vec<String>,
    },
    /// Every topic with its partition count and replication factor.
    List {
        /// Leave out internal topics (__consumer_offsets, __transaction_state).
        #[arg(long)]
        exclude_internal: bool,
    },
    /// Partitions (leader, replicas, ISR) and configs with their sources, of the topics
    /// named (none: every topic).
    Describe { topics: Vec<String> },
    /// Sets and deletes topic configs (IncrementalAlterConfigs).
    AlterConfig {
        topic: String,
        /// key=value to set (repeat for more).
        #[arg(long = "set")]
        set: Vec<String>,
        /// A key to delete, back to its default (repeat for more).
        #[arg(long = "delete")]
        delete: Vec<String>,
    },
    /// Grows a topic to this many partitions.
    AddPartitions {
        topic: String,
        #[arg(long)]
        partitions: i32,
    },
    /// Deletes topics.
    Delete {
        #[arg(required = true)]
        topics: Vec<String>,
    },
}

#[derive(clap::Args)]
struct ProduceCliArgs {
    topic: String,
    #[command(flatten)]
    bootstrap: Bootstrap,
    /// Every record to this partition [default: keyed records by Kafka's partitioner,
    /// the others in turn].
    #[arg(long)]
    partition: Option<i32>,
    /// Splits each line into key and value at this separator (kcat's -K).
    #[arg(long)]
    key_separator: Option<String>,
    /// A header for every record, key=value (repeat for more).
    #[arg(long = "header")]
    headers: Vec<String>,
    /// all or 1.
    #[arg(long, default_value = "all")]
    acks: String,
}

#[derive(clap::Args)]
struct ConsumeCliArgs {
    topic: String,
    #[command(flatten)]
    bootstrap: Bootstrap,
    /// Only this partition [default: all].
    #[arg(long)]
    partition: Option<i32>,
    /// beginning, end, stored (the group's committed offset) or an offset [default:
    /// stored with --group, else beginning].
    #[arg(long)]
    offset: Option<String>,
    /// Start at the first record at or after this time (ms since the epoch).
    #[arg(long, conflicts_with = "offset")]
    from_timestamp: Option<i64>,
    /// Read from this group's committed offsets and commit what was printed (no group
    /// membership: partitions are assigned, not balanced).
    #[arg(long)]
    group: Option<String>,
    /// read_committed (the default, as librdkafka's) or read_uncommitted.
    #[arg(long, default_value = "read_committed")]
    isolation: String,
    /// Stop after this many records.
    #[arg(long)]
    count: Option<usize>,
    /// Stop at the end of the partitions as they were when reading started (kcat -e).
    #[arg(short = 'e', long)]
    exit: bool,
    /// How each record prints, kcat's -f tokens: %t topic, %p partition, %o offset,
    /// %k key, %s value, %T timestamp, %h headers, \n, \t.
    #[arg(short = 'f', long, default_value = "%s\\n")]
    format: String,
}

#[derive(clap::Args)]
struct ConfigArgs {
    #[command(flatten)]
    bootstrap: Bootstrap,
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Every config of one resource with its source (users and clients: their quotas).
    Describe {
        /// topics, brokers, groups, users or clients (users and clients together name
        /// one quota entity: repeat the pair).
        #[arg(long)]
        entity_type: Vec<String>,
        /// The topic, the broker id ("" for the cluster-wide defaults), the group, the
        /// user or the client id (`<default>`: the default user or client).
        #[arg(long)]
        entity_name: Vec<String>,
    },
    /// Sets and deletes configs of one resource (users and clients: quotas,
    /// producer_byte_rate and consumer_byte_rate).
    Alter {
        #[arg(long)]
        entity_type: Vec<String>,
        #[arg(long)]
        entity_name: Vec<String>,
        /// key=value to set (comma-separated or repeated, as kafka-configs.sh's
        /// --add-config; a list value in brackets: cleanup.policy=[compact,delete]).
        #[arg(long = "add-config")]
        set: Vec<String>,
        /// Keys to delete (comma-separated or repeated).
        #[arg(long = "delete-config", value_delimiter = ',')]
        delete: Vec<String>,
    },
}

/// The quota entity types of `sluice config --entity-type` when every one given is
/// users or clients.
fn quota_entity(types: &[String]) -> Option<Vec<&'static str>> {
    types
        .iter()
        .map(|t| crate::cli::quota::entity_type(t))
        .collect()
}

/// The one `--entity-type`/`--entity-name` pair a config resource takes.
fn one_resource<'a>(
    types: &'a [String],
    names: &'a [String],
) -> Result<(&'a str, &'a str), String> {
    match (types, names) {
        ([t], [n]) => Ok((t, n)),
        _ => Err("give one --entity-type and one --entity-name".into()),
    }
}

#[derive(clap::Args)]
struct UserArgs {
    /// Any broker of the cluster.
    #[arg(long, global = true, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[command(subcommand)]
    command: UserCommand,
}

#[derive(Subcommand)]
enum UserCommand {
    /// Creates a user, or sets its password: SCRAM credentials salted here (the
    /// password is read from the first line of standard input unless --password).
    Add {
        user: String,
        #[arg(long)]
        password: Option<String>,
        /// SCRAM-SHA-256 or SCRAM-SHA-512 (repeat for both) [default: both].
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
        #[arg(long, default_value_t = 4096)]
        iterations: i32,
    },
    /// Removes a user's credentials (of the mechanisms named, else all).
    Remove {
        user: String,
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
    },
    /// Every user with its mechanisms and iterations.
    List,
}

#[derive(clap::Args)]
struct AclArgs {
    #[command(flatten)]
    bootstrap: Bootstrap,
    #[command(subcommand)]
    command: AclCommand,
}

/// The resources, principals, operations and hosts an acl command names.
#[derive(clap::Args)]
struct AclSelection {
    /// A topic (repeatable; `*` is every topic).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// A consumer group (repeatable; `*` is every group).
    #[arg(long = "group")]
    groups: Vec<String>,
    /// A transactional id (repeatable).
    #[arg(long = "transactional-id")]
    transactional_ids: Vec<String>,
    /// The cluster resource.
    #[arg(long)]
    cluster: bool,
    /// literal or prefixed (add, remove: literal by default); list and remove also take
    /// any and match (match: every binding that applies to the named resource).
    #[arg(long = "resource-pattern-type")]
    pattern: Option<String>,
    /// A principal allowed, `Type:name` (User:alice; User:* is everyone; repeatable).
    #[arg(long = "allow-principal")]
    allow_principals: Vec<String>,
    /// A principal denied (repeatable; a DENY beats every ALLOW).
    #[arg(long = "deny-principal")]
    deny_principals: Vec<String>,
    /// Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs,
    /// AlterConfigs, IdempotentWrite or All (repeatable).
    #[arg(long = "operation")]
    operations: Vec<String>,
    /// A client address the binding applies to (repeatable) [add's default: `*`].
    #[arg(long = "host")]
    hosts: Vec<String>,
}

impl AclSelection {
    fn selection(self) -> crate::cli::acl::Selection {
        crate::cli::acl::Selection {
            topics: self.topics,
            groups: self.groups,
            transactional_ids: self.transactional_ids,
            cluster: self.cluster,
            pattern: self.pattern,
            allow_principals: self.allow_principals,
            deny_principals: self.deny_principals,
            operations: self.operations,
            hosts: self.hosts,
        }
    }
}

#[derive(Subcommand)]
enum AclCommand {
    /// Adds a binding per resource, principal, host and operation named.
    Add(AclSelection),
    /// Removes the bindings the flags match (flags left out match anything).
    Remove(AclSelection),
    /// Lists the bindings the flags match (none given: every binding).
    List(AclSelection),
}

#[derive(clap::Args)]
struct GroupArgs {
    /// Any broker of the cluster.
    #[arg(long, global = true, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[command(subcommand)]
    command: GroupCommand,
}

#[derive(Subcommand)]
enum GroupCommand {
    /// Every group, with its state.
    List,
    /// Per partition: committed offset, log end offset, lag, owning member.
    Describe { group: String },
    /// Moves a group's committed offsets (the group must have no members).
    ResetOffsets {
        #[arg(long)]
        group: String,
        #[arg(long)]
        topic: String,
        #[arg(long, conflicts_with_all = ["to_latest", "to_offset"])]
        to_earliest: bool,
        #[arg(long, conflicts_with = "to_offset")]
        to_latest: bool,
        #[arg(long)]
        to_offset: Option<i64>,
    },
    /// Deletes a group with no members and its committed offsets.
    Delete { group: String },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML config file (keys: the flag names with `_` for `-`; every key: deploy/sluice.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

/// Starts logging: `text` for people (colours on a terminal) or `json`, one object per
/// line for log shippers. RUST_LOG sets the filter (default `info`); its levels can be
/// changed while the broker runs (BROKER_LOGGER, see `sluice::observe::loggers`).
fn init_logging(format: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|d| tracing_subscriber::EnvFilter::try_new(d).is_ok())
        .unwrap_or_else(|| "info".to_string());
    let registry =
        tracing_subscriber::registry().with(sluice::observe::loggers::install(&directives));
    let layer = tracing_subscriber::fmt::layer().with_thread_names(true);
    if format == "json" {
        registry.with(layer.json().with_current_span(false)).init();
    } else {
        registry
            .with(layer.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())))
            .init();
    }
}

/// Why `sluice serve` or `sluice check` stopped; the text is the message printed after
/// the command's name.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("installing signal handler: {0}")]
    Signal(std::io::Error),
    /// `sluice check` could not write its report.
    #[error(transparent)]
    Report(std::io::Error),
    /// The broker failed to start or stopped on an error.
    #[error(transparent)]
    Node(sluice::node::NodeError),
}

/// `sluice check`'s settings: the flags over the config file.
fn settings_of(args: ServeArgs) -> Result<Settings, ConfigError> {
    let file = match &args.config {
        Some(p) => Settings::load(p)?,
        None => Settings::default(),
    };
    Ok(args.settings.or(file))
}

/// Tells glibc's allocator to keep what a shard frees for its next round instead of
/// handing it back to the kernel at once. A fetch or produce round over thousands of
/// partitions allocates one boxed future per partition and frees them all together;
/// with glibc's defaults (a heap top over 128 KiB trimmed on free, allocations over
/// 128 KiB, rising with use, mapped and unmapped each time) every round grew the heap
/// again and the kernel zeroed fresh pages for it: with three brokers at 10,000
/// partitions (RF=3, 30k records/s) a tenth of the CPU went to clearing pages, and
/// p50/p99 were about twice what they are with these limits (one run each; noisy).
/// Freed memory kept this way is bounded by the trim threshold (128 MiB) per arena;
/// allocations of 32 MiB or more are still mapped and returned when freed.
fn keep_freed_memory() {
    // SAFETY: mallopt only changes allocator tunables; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
    }
}

fn main() {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        keep_freed_memory();
    }
    // `serve` logs in the format its flags or file ask for; the rest log as text.
    if !matches!(cli.command, Command::Serve(_)) {
        init_logging("text");
        // The admin commands end quietly when their reader goes away, as Unix tools
        // do (`sluice cluster describe | grep -q ...`): Rust ignores SIGPIPE, so a
        // print to the closed pipe panicked, and panics abort. `serve` keeps ignoring
        // it (its sockets report EPIPE as an error instead).
        // SAFETY: restoring a signal's default disposition before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // A broken invariant stops the whole process (panic = "abort"); say where first.
    std::panic::set_hook(Box::new(|info| {
        if sluice_shard::runtime::is_orphaned_blocking_result(info) {
            // An operation of a shard that has stopped finished late: its result has
            // no one to go to, and the process is on its way out. Park this glommio
            // thread instead of aborting the clean stop.
            tracing::info!("a blocking operation finished after its shard stopped");
            loop {
                std::thread::park();
            }
        }
        let thread = std::thread::current();
        tracing::error!(thread = thread.name().unwrap_or("?"), "fatal: {info}");
        eprintln!(
            "sluice: fatal in thread {}: {info}",
            thread.name().unwrap_or("?")
        );
        // Whatever the build profile says: `make test` runs the e2e brokers from profile
        // `unit`, which unwinds (the cargo test harness needs it), and an unwound shard
        // thread would leave the rest of the process serving without it.
        std::process::abort();
    }));
    if let Some(path) = &cli.command_config {
        let name = match &cli.command {
            Command::Group(_)
            | Command::Cluster(_)
            | Command::Txn(_)
            | Command::Lag(_)
            | Command::User(_)
            | Command::Acl(_)
            | Command::Topic(_)
            | Command::Config(_)
            | Command::Produce(_)
            | Command::Consume(_) => None,
            Command::Serve(_) => Some("serve"),
            Command::Check(_) => Some("check"),
        };
        if let Some(name) = name {
            eprintln!("sluice {name}: --command-config is for the admin commands (their Kafka connections)");
            std::process::exit(2);
        }
        match sluice_client::security::apply_command_config(path) {
            Ok(()) => {}
            Err(e) => {
                eprintln!("sluice: --command-config {e}");
                std::process::exit(2);
            }
        }
    }
    let args = match cli.command {
        Command::Serve(args) => *args,
        Command::Check(args) => {
            let ok = settings_of(*args)
                .and_then(|s| BrokerConfig::resolve(s, sluice_shard::runtime::online_cpus().len()))
                .map_err(CliError::from)
                .and_then(|config| {
                    let findings = crate::cli::check::run(&config);
                    crate::cli::check::report(&findings, &mut std::io::stdout().lock())
                        .map_err(CliError::Report)
                });
            match ok {
                Ok(true) => return,
                Ok(false) => std::process::exit(1),
                Err(e) => {
                    eprintln!("sluice check: {e}");
                    std::process::exit(2);
                }
            }
        }
        Command::Group(g) => {
            if let Err(e) = group(g) {
                eprintln!("sluice group: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Txn(t) => {
            let r = match t.command {
                TxnCommand::List => crate::cli::txn::list(&t.bootstrap),
                TxnCommand::Describe { transactional_id } => {
                    crate::cli::txn::describe(&t.bootstrap, &transactional_id)
                }
            };
            if let Err(e) = r {
                eprintln!("sluice txn: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::User(u) => {
            use crate::cli::user;
            let r = match u.command {
                UserCommand::Add {
                    user: name,
                    password,
                    mechanisms,
                    iterations,
                } => user::mechanisms(&mechanisms).and_then(|ms| {
                    let p = user::password(password)?;
                    user::add(&u.bootstrap, &name, &p, &ms, iterations)
                }),
                UserCommand::Remove {
                    user: name,
                    mechanisms,
                } => user::remove(&u.bootstrap, &name, &mechanisms),
                UserCommand::List => user::list(&u.bootstrap),
            };
            if let Err(e) = r {
                eprintln!("sluice user: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Acl(a) => {
            use crate::cli::acl;
            let bootstrap = &a.bootstrap.bootstrap_server;
            let r = match a.command {
                AclCommand::Add(s) => acl::add(bootstrap, &s.selection()),
                AclCommand::Remove(s) => acl::remove(bootstrap, &s.selection()),
                AclCommand::List(s) => acl::list(bootstrap, &s.selection()),
            };
            if let Err(e) = r {
                eprintln!("sluice acl: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Topic(t) => {
            use crate::cli::topic;
            let bs = &t.bootstrap.bootstrap_server;
            let r = match t.command {
                TopicCommand::Create {
                    topic: name,
                    partitions,
                    replication_factor,
                    replica_assignment,
                    configs,
                } => topic::pairs(&configs).and_then(|configs| {
                    let lists = replica_assignment
                        .as_deref()
                        .map(topic::assignment)
                        .transpose()?;
                    topic::create(bs, &name, partitions, replication_factor, lists, &configs)
                }),
                TopicCommand::List { exclude_internal } => topic::describe_topics(bs, &[], false)
                    .map(|mut ts| {
                        ts.retain(|t| !(exclude_internal && t.internal));
                        print!("{}", topic::render_list(&ts));
                    }),
                TopicCommand::Describe { topics } => topic::describe_topics(bs, &topics, true)
                    .and_then(|ts| {
                        print!("{}", topic::render_topics(&ts));
                        match ts.iter().find(|t| t.error != 0) {
                            Some(t) => Err(format!(
                                "topic {}: {}",
                                t.name,
                                sluice_client::error_name(t.error)
                            )),
                            None => Ok(()),
                        }
                    }),
                TopicCommand::AlterConfig {
                    topic: name,
                    set,
                    delete,
                } => topic::pairs(&set).and_then(|set| {
                    topic::config_alter(bs, topic::RESOURCE_TOPIC, &name, &set, &delete)
                }),
                TopicCommand::AddPartitions {
                    topic: name,
                    partitions,
                } => topic::add_partitions(bs, &name, partitions),
                TopicCommand::Delete { topics } => topic::delete(bs, &topics),
            };
            if let Err(e) = r {
                eprintln!("sluice topic: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Produce(a) => {
            use crate::cli::{console, topic};
            let r = topic::pairs(&a.headers).and_then(|headers| {
                let acks = match a.acks.as_str() {
                    "all" | "-1" => -1,
                    "1" => 1,
                    other => return Err(format!("--acks {other}: all or 1")),
                };
                let args = console::ProduceArgs {
                    topic: a.topic.clone(),
                    partition: a.partition,
                    key_separator: a.key_separator.clone(),
                    headers: headers.into_iter().collect(),
                    acks,
                };
                console::produce(
                    &a.bootstrap.bootstrap_server,
                    &args,
                    std::io::stdin().lock(),
                )
            });
            match r {
                Ok(n) => eprintln!("sluice produce: {n} records acknowledged"),
                Err(e) => {
                    eprintln!("sluice produce: {e}");
                    std::process::exit(1);
                }
            }
            return;
        }
        Command::Consume(a) => {
            use crate::cli::console;
            let start = match (&a.offset, a.from_timestamp, &a.group) {
                (Some(o), _, _) => console::Start::parse(o),
                (None, Some(t), _) => Ok(console::Start::Time(t)),
                (None, None, Some(_)) => Ok(console::Start::Stored),
                (None, None, None) => Ok(console::Start::Beginning),
            };
            let read_committed = match a.isolation.as_str() {
                "read_committed" => Ok(true),
                "read_uncommitted" => Ok(false),
                other => Err(format!(
                    "--isolation {other}: read_committed or read_uncommitted"
                )),
            };
            let r = start.and_then(|start| {
                let args = console::ConsumeArgs {
                    topic: a.topic.clone(),
                    partition: a.partition,
                    start,
                    group: a.group.clone(),
                    read_committed: read_committed?,
                    count: a.count,
                    exit_at_end: a.exit,
                    format: a.format.clone(),
                };
                // SIGINT/SIGTERM end the reading (committing what was printed).
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                    let _ = signal_hook::flag::register(sig, stop.clone());
                }
                console::consume(
                    &a.bootstrap.bootstrap_server,
                    &args,
                    &mut std::io::stdout().lock(),
                    &stop,
                )
            });
            if let Err(e) = r {
                eprintln!("sluice consume: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Config(cfg) => {
            use crate::cli::topic;
            let bs = &cfg.bootstrap.bootstrap_server;
            let r = match cfg.command {
                ConfigCommand::Describe {
                    entity_type,
                    entity_name,
                } => match quota_entity(&entity_type) {
                    Some(types) => crate::cli::quota::describe(bs, &types, &entity_name),
                    None => one_resource(&entity_type, &entity_name).and_then(|(t, n)| {
                        topic::entity_type(t).and_then(|t| topic::config_describe(bs, t, n))
                    }),
                },
                ConfigCommand::Alter {
                    entity_type,
                    entity_name,
                    set,
                    delete,
                } => {
                    let items: Vec<String> =
                        set.iter().flat_map(|s| topic::config_items(s)).collect();
                    topic::pairs(&items).and_then(|set| match quota_entity(&entity_type) {
                        Some(types) => {
                            crate::cli::quota::alter(bs, &types, &entity_name, &set, &delete)
                        }
                        None => one_resource(&entity_type, &entity_name).and_then(|(t, n)| {
                            topic::entity_type(t)
                                .and_then(|t| topic::config_alter(bs, t, n, &set, &delete))
                        }),
                    })
                }
            };
            if let Err(e) = r {
                eprintln!("sluice config: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Lag(l) => {
            if let Err(e) = crate::cli::lag::run(&l) {
                eprintln!("sluice lag: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Cluster(c) => {
            if let Err(e) = crate::cli::cluster::run(c) {
                eprintln!("sluice cluster: {e}");
                std::process::exit(1);
            }
            return;
        }
    };
    if let Err(e) = serve(args) {
        eprintln!("sluice serve: {e}");
        std::process::exit(1);
    }
}

fn serve(args: ServeArgs) -> Result<(), CliError> {
    let file = match &args.config {
        Some(p) => Settings::load(p)?,
        None => Settings::default(),
    };
    let settings = args.settings.or(file);
    // `serve` starts logging here: the format comes from its flags or file.
    let format = settings.log_format.as_deref().unwrap_or("text");
    if !sluice::base::config::LOG_FORMATS.contains(&format) {
        return Err(ConfigError::Value {
            flag: "--log-format".into(),
            value: format.into(),
            why: "expected text or json".into(),
        }
        .into());
    }
    init_logging(format);
    let mut config = BrokerConfig::resolve(settings, sluice_shard::runtime::online_cpus().len())?;
    if let Some(p) = &args.config {
        config.add_file_alert_rules(p)?;
    }
    sluice::base::host::raise_limits();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(CliError::Signal)?;
    }
    sluice::node::run(config, stop).map_err(CliError::Node)
}

/// Why a `sluice group` command failed.
#[derive(Debug, thiserror::Error)]
enum GroupError {
    #[error(transparent)]
    Cli(#[from] crate::cli::group::GroupCliError),
    #[error("one of --to-earliest, --to-latest, --to-offset N")]
    NoResetTarget,
}

fn group(g: GroupArgs) -> Result<(), GroupError> {
    use crate::cli::group::{self as group_cli, ResetTo};
    let b = &g.bootstrap;
    let done = match g.command {
        GroupCommand::List => group_cli::list(b),
        GroupCommand::Describe { group } => group_cli::describe(b, &group),
        GroupCommand::Delete { group } => group_cli::delete(b, &group),
        GroupCommand::ResetOffsets {
            group,
            topic,
            to_earliest,
            to_latest,
            to_offset,
        } => {
            let to = match (to_earliest, to_latest, to_offset) {
                (true, _, _) => ResetTo::Earliest,
                (_, true, _) => ResetTo::Latest,
                (_, _, Some(n)) => ResetTo::Offset(n),
                _ => return Err(GroupError::NoResetTarget),
            };
            group_cli::reset_offsets(b, &group, &topic, to)
        }
    };
    Ok(done?)
}
