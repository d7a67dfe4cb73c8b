//! `sluice`: the broker binary. `sluice serve --help` lists the flags.
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sluice::config::{BrokerConfig, FileConfig};

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
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker. Flags override the config file.
    Serve(ServeArgs),
    /// Consumer groups: list, describe (offsets and lag), reset offsets, delete.
    Group(GroupArgs),
    /// Cluster: brokers, controller, partition leaders and ISRs (`describe`).
    Cluster(sluice::cluster_cli::ClusterArgs),
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
    /// TOML config file (keys: the flag names with `_` for `-`).
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    node_id: Option<i32>,
    /// Kafka listener address [default: 127.0.0.1:9092].
    #[arg(long)]
    listen: Option<String>,
    /// HOST:PORT clients are told to use [default: the listen address].
    #[arg(long)]
    advertised: Option<String>,
    /// [default: ./data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Shards (executor threads, one per core) [default: every online CPU].
    #[arg(long)]
    cores: Option<usize>,
    /// Partitions of auto-created topics [default: 1].
    #[arg(long)]
    default_partitions: Option<i32>,
    /// Create unknown topics on Metadata/Produce [default: true].
    #[arg(long)]
    auto_create_topics: Option<bool>,
    /// How long a new group waits for more members before its first generation
    /// [default: 3000].
    #[arg(long)]
    group_initial_rebalance_delay_ms: Option<i64>,
    /// Smallest session timeout a member may ask for [default: 6000].
    #[arg(long)]
    group_min_session_timeout_ms: Option<i32>,
    /// Largest session timeout a member may ask for [default: 1800000].
    #[arg(long)]
    group_max_session_timeout_ms: Option<i32>,
    /// Committed offsets of an empty group expire after this long [default: 10080].
    #[arg(long)]
    offsets_retention_minutes: Option<i64>,
    /// How often storage runs its retention and compaction pass [default: 60000].
    #[arg(long)]
    log_retention_check_interval_ms: Option<u64>,
    /// Metadata quorum listener, HOST:PORT (needed with more than one voter).
    #[arg(long)]
    controller_listen: Option<String>,
    /// The controller voters, `1@HOST:PORT,2@HOST:PORT,...` [default: this node alone].
    #[arg(long)]
    controller_quorum: Option<String>,
    /// A broker whose heartbeats lapse this long is fenced [default: 9000].
    #[arg(long)]
    broker_session_timeout_ms: Option<u64>,
    /// How often a broker heartbeats to the controller [default: 500].
    #[arg(long)]
    broker_heartbeat_interval_ms: Option<u64>,
    /// A follower behind the leader this long leaves the ISR [default: 30000].
    #[arg(long)]
    replica_lag_time_max_ms: Option<u64>,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_thread_names(true)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    // A broken invariant stops the whole process (panic = "abort"); say where first.
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        tracing::error!(thread = thread.name().unwrap_or("?"), "fatal: {info}");
        eprintln!(
            "sluice: fatal in thread {}: {info}",
            thread.name().unwrap_or("?")
        );
    }));
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => args,
        Command::Group(g) => {
            if let Err(e) = group(g) {
                eprintln!("sluice group: {e}");
                std::process::exit(1);
            }
            return;
        }
        Command::Cluster(c) => {
            if let Err(e) = sluice::cluster_cli::run(c) {
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

fn serve(args: ServeArgs) -> Result<(), String> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let flags = FileConfig {
        node_id: args.node_id,
        listen: args.listen,
        advertised: args.advertised,
        data_dir: args.data_dir,
        cores: args.cores,
        default_partitions: args.default_partitions,
        auto_create_topics: args.auto_create_topics,
        socket_request_max_bytes: None,
        group_initial_rebalance_delay_ms: args.group_initial_rebalance_delay_ms,
        group_min_session_timeout_ms: args.group_min_session_timeout_ms,
        group_max_session_timeout_ms: args.group_max_session_timeout_ms,
        offsets_retention_minutes: args.offsets_retention_minutes,
        log_retention_check_interval_ms: args.log_retention_check_interval_ms,
        controller_listen: args.controller_listen,
        controller_quorum: args.controller_quorum,
        broker_session_timeout_ms: args.broker_session_timeout_ms,
        broker_heartbeat_interval_ms: args.broker_heartbeat_interval_ms,
        replica_lag_time_max_ms: args.replica_lag_time_max_ms,
    };
    let config = BrokerConfig::resolve(file, flags, sluice_shard::runtime::online_cpus().len())?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| format!("installing signal handler: {e}"))?;
    }
    sluice::node::run(config, stop)
}

fn group(g: GroupArgs) -> Result<(), String> {
    use sluice::group_cli::{self, ResetTo};
    let b = &g.bootstrap;
    match g.command {
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
                _ => return Err("one of --to-earliest, --to-latest, --to-offset N".into()),
            };
            group_cli::reset_offsets(b, &group, &topic, to)
        }
    }
}
