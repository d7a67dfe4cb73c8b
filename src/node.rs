//! Starting one broker process: the checks before the shards start, and each shard's
//! life (open storage, join the mesh, adopt the metadata, listen, stop).

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_shard::{Mesh, MeshBuilders, MeshLimits, RuntimeConfig, ShardId};
use sluice_storage::{DescriptorPool, Storage, StorageLimits, SystemClock};

use crate::base::config::BrokerConfig;
use crate::base::metadata::{FileMetadataStore, MetadataStore};
use crate::base::rpc::{Answered, ShardReq};
use crate::cluster::controller::Controller;
use crate::cluster::quorum_io::{QuorumConfig, QuorumNode};
use crate::coord::group::shard::GroupShell;
use crate::partition::broker::{Broker, ShardLimits};
use crate::serve::dispatch::ShardServer;

/// Why the broker did not start, or stopped on an error; `sluice serve` prints it.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A listen address held by another process, or the data directory locked by
    /// another broker.
    #[error(transparent)]
    Host(#[from] crate::base::host::HostError),
    #[error("creating {}: {source}", path.display())]
    CreateDataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Directory(#[from] crate::base::directory::DirectoryError),
    #[error("writing {}: {source}", path.display())]
    WriteProbe {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The metrics endpoint asked for cannot be served (the metrics module's words).
    #[error("{0}")]
    Metrics(String),
    /// The alert sink did not start (the lag module's words).
    #[error("{0}")]
    Alerts(String),
    /// The SSL listener's certificate, key or authorities could not be used.
    #[error("TLS: {0}")]
    Tls(#[from] sluice_client::tls::TlsError),
    /// `--remote-storage` names no usable object store.
    #[error("--remote-storage: {0}")]
    RemoteStorage(String),
    /// Every shard that failed, in shard order.
    #[error("{}", join_failures(.0))]
    Shards(Vec<ShardFailure>),
}

/// One shard that failed to start or to run.
#[derive(Debug, thiserror::Error)]
pub enum ShardFailure {
    #[error("shard {shard}: {error}")]
    Failed { shard: usize, error: ShardError },
    /// Its executor could not be built or did not finish.
    #[error("shard {shard} executor: {error}")]
    Executor { shard: usize, error: std::io::Error },
}

fn join_failures(failures: &[ShardFailure]) -> String {
    let texts: Vec<String> = failures.iter().map(ToString::to_string).collect();
    texts.join("; ")
}

/// Why one shard did not start (or could not serve).
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("opening storage: {0}")]
    OpenStorage(sluice_storage::Error),
    #[error("starting the storage background pass: {0}")]
    StorageBackground(sluice_storage::Error),
    #[error("joining the shard mesh: {0}")]
    Mesh(sluice_shard::MeshError),
    /// Shard 0's voter of the metadata quorum did not start.
    #[error(transparent)]
    Quorum(#[from] crate::cluster::quorum_io::QuorumIoError),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// How often each shard checks the stop flag set by the signal handler.
const STOP_POLL: Duration = Duration::from_millis(50);
/// Storage background pass: interval flushes (retention and compaction run every
/// `log_retention_check_interval_ms`).
const FLUSH_CHECK_MS: u64 = 100;

/// Refuses to start when another process holds the Kafka or controller port, after
/// waiting a bounded time for one a crashed predecessor still holds (see
/// [`crate::base::host::wait_port_free`]).
pub fn check_port_free(config: &BrokerConfig) -> Result<(), NodeError> {
    use crate::base::host::{wait_port_free, PORT_WAIT_MAX};
    for l in &config.listeners {
        wait_port_free(l.bind, "the Kafka listener", PORT_WAIT_MAX)?;
    }
    if let Some(c) = config.controller_listen {
        wait_port_free(c, "the controller listener", PORT_WAIT_MAX)?;
    }
    Ok(())
}

/// glommio's per-thread polled-I/O probe must see a full page (see
/// `sluice_storage::probe`). Shards open storage concurrently on one directory, so the
/// probe file is written once here, before any of them starts.
fn prepare_data_dir(dir: &Path) -> Result<(), NodeError> {
    std::fs::create_dir_all(dir).map_err(|source| NodeError::CreateDataDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let probe = dir.join(sluice_storage::probe::PROBE_FILE);
    let page = sluice_storage::file::ALIGN as usize;
    if std::fs::metadata(&probe).map(|m| m.len() as usize).ok() != Some(page) {
        std::fs::write(&probe, vec![0x5au8; page]).map_err(|source| NodeError::WriteProbe {
            path: probe,
            source,
        })?;
    }
    Ok(())
}

/// Runs the broker until `stop` is set. Returns once every shard has stopped.
pub fn run(config: BrokerConfig, stop: Arc<AtomicBool>) -> Result<(), NodeError> {
    check_port_free(&config)?;
    prepare_data_dir(&config.data_dir)?;
    // Held until the process exits (the kernel drops it then, even on SIGKILL).
    let _lock =
        crate::base::host::lock_data_dir(&config.data_dir, crate::base::host::PORT_WAIT_MAX)?;
    let directory = crate::base::directory::identify(&config.data_dir, config.node_id)?;
    tracing::info!(
        directory_id = %directory.id,
        formatted_now = directory.formatted_now,
        "data directory"
    );
    tracing::info!(
        node = config.node_id,
        voters = config.controller_quorum.len(),
        shards = config.cores,
        "starting"
    );
    // A TLS listener: its configuration read once (a bad file stops the start here);
    // with a TLS inter-broker listener, this process's connections to other brokers
    // are TLS as theirs are.
    let inter_broker = config.listeners[0].protocol;
    if config.authorizer.is_some() && !inter_broker.sasl() {
        // Brokers log in to each other only over SASL; otherwise they call as their
        // certificate's subject (SSL) or User:ANONYMOUS, which need CLUSTER_ACTION.
        tracing::warn!(
            listener = %config.listeners[0].name,
            "with --authorizer and an inter-broker listener without SASL, brokers (and this broker's lag collector) call as their certificate subject (User:CN=...) or User:ANONYMOUS: list that principal in --super-users, or replication, transaction markers and lag sampling are refused"
        );
    }
    let ssl = config
        .listeners
        .iter()
        .any(|l| l.protocol == crate::base::config::SecurityProtocol::Ssl);
    if config
        .tls
        .as_ref()
        .is_some_and(|t| t.client_auth != sluice_client::tls::ClientAuth::None)
        && !ssl
    {
        tracing::warn!("--ssl-client-auth applies to SSL listeners only (as Kafka's ssl.client.auth, KIP-684): this broker has none, so no client certificate is asked for");
    }
    if config.metrics_listen == crate::observe::metrics::MetricsListen::Off
        && !config.given.contains(&"metrics_listen")
    {
        tracing::warn!("no metrics endpoint: its default address (the Kafka port + 552) is another listener's port or past 65535; set --metrics-listen HOST:PORT");
    }
    // SASL_SSL listeners and the metrics endpoint's https (`--metrics-tls`): the same
    // certificate, no client certificates asked for.
    let sasl_ssl = config
        .listeners
        .iter()
        .any(|l| l.protocol == crate::base::config::SecurityProtocol::SaslSsl);
    let open_tls = match &config.tls {
        Some(t) if sasl_ssl || config.metrics_tls => Some(sluice_client::tls::ListenerTls::new(
            t.no_client_auth_config()?,
        )),
        _ => None,
    };
    let metrics_tls = open_tls.clone().filter(|_| config.metrics_tls);
    let tls = match &config.tls {
        Some(t) => {
            // Stamped before they are read: a change meanwhile is reloaded.
            let stamp = tls_files_stamp(t);
            let server = sluice_client::tls::ListenerTls::new(t.server_config()?);
            if inter_broker.tls() {
                sluice_client::tls::set_peer_tls(t.peer_config()?);
                // The controller port too, with mutual authentication: a node without
                // a certificate of the cluster's CA cannot speak to the metadata quorum.
                sluice_client::tls::set_controller_tls(t.controller_configs()?);
            }
            watch_tls_files(
                t.clone(),
                stamp,
                server.clone(),
                open_tls.clone(),
                inter_broker.tls(),
                stop.clone(),
            );
            Some(server)
        }
        None => None,
    };
    // A SASL inter-broker listener: this process's connections to other brokers log in
    // as the bootstrap user.
    if let Some(sasl) = config.sasl.as_ref().filter(|_| inter_broker.sasl()) {
        sluice_client::sasl::set_peer_sasl(sluice_client::sasl::Credentials {
            mechanism: sasl.peer_mechanism(),
            user: sasl.bootstrap_user.clone(),
            password: sasl.bootstrap_password.clone(),
        });
    }
    let descriptors = descriptor_budget(config.cores);
    let registry = Arc::new(crate::observe::metrics::Registry::new(
        config.node_id,
        config.cores,
    ));
    let metrics_addr = crate::observe::metrics::start(
        config.metrics_listen,
        registry.clone(),
        metrics_tls.clone(),
    )
    .map_err(NodeError::Metrics)?;
    let lag = crate::observe::lag::install(&config, &registry).map_err(NodeError::Alerts)?;
    if let Some(addr) = metrics_addr {
        let scheme = if metrics_tls.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(%addr, "metrics on {scheme}://{addr}/metrics (health: /health, readiness: /ready)");
    }
    let remote = match &config.remote_storage {
        Some(url) => {
            let opened = crate::partition::tiered::open_store(url, config.remote_storage_threads)
                .map_err(NodeError::RemoteStorage)?;
            tracing::info!(url, "tiered storage on");
            Some(opened)
        }
        None => None,
    };
    let builders: MeshBuilders<ShardReq, Answered> =
        MeshBuilders::new(config.cores, mesh_limits(&descriptors, config.cores));
    let ready = Arc::new(AtomicUsize::new(0));
    let handed_over = Arc::new(AtomicBool::new(false));
    let mut runtime = RuntimeConfig::new(config.cores);
    runtime.pin = sluice_shard::runtime::pin_shards(config.cores);
    runtime.wake_period = std::time::Duration::from_millis(config.reactor_wake_ms);
    let shards = (0..config.cores)
        .map(|i| {
            let (cfg, builders, stop, ready) = (
                config.clone(),
                builders.clone(),
                stop.clone(),
                ready.clone(),
            );
            let shared = Shared {
                descriptors: descriptors.clone(),
                registry: registry.clone(),
                lag: lag.clone(),
                handed_over: handed_over.clone(),
                directory: directory.id.clone(),
                tls: tls.clone(),
                open_tls: open_tls.clone(),
                remote: remote.clone(),
            };
            move || async move { run_shard(ShardId(i), cfg, builders, shared, stop, ready).await }
        })
        .collect();
    let results = sluice_shard::spawn_shards(&runtime, shards);
    let mut failed = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(error)) => failed.push(ShardFailure::Failed { shard: i, error }),
            Err(error) => failed.push(ShardFailure::Executor { shard: i, error }),
        }
    }
    if failed.is_empty() {
        tracing::info!("stopped cleanly");
        Ok(())
    } else {
        Err(NodeError::Shards(failed))
    }
}

/// How the process's open-file limit (RLIMIT_NOFILE, the soft limit as raised at
/// start) is split:
///
/// - a reserve of a twentieth of the limit (at least 1,024) for the metadata quorum,
///   the executors' rings and channels, the metrics listener, short-lived files, and
///   logs given back to the pool a moment before their close returns; half of it, split
///   between the shards (16 to 256 each), bounds the checkpoints and snapshots a shard
///   writes at once (`StorageLimits::atomic_writes_max`);
/// - per shard, read handles of closed segments: an eighth of the rest split between
///   the shards, at most 1,024 (`StorageLimits::open_segment_files_max`);
/// - of what is left, each shard's own share of client connections (a quarter, split
///   evenly: [`Descriptors::connections_max`]) and of active logs (a tenth: logs whose
///   active segment's `.log` is open, one descriptor each, indexes held in memory:
///   `StorageLimits::active_logs_max`), which nobody else can take; so sockets always
///   have descriptors however many partitions are busy;
/// - the rest in one [`DescriptorPool`] shared by every shard's connections and logs:
///   a shard past its own share takes from it, so 10,000 busy partitions on one shard
///   (or 10,000 connections) fit. With the pool empty a log first closes the least
///   recently appended idle log of its shard (slower opens, never a failed append) and
///   a new connection waits in the listen backlog (never accepted and then reset).
///
/// With this machine's limit of 20,000 and 2 shards: per shard 1,024 read handles,
/// 2,116 own connections and 846 own active logs, and a pool of 11,004; so up to
/// 12,696 active logs, or 15,236 connections, in all.
pub fn descriptor_budget(shards: usize) -> Descriptors {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(1 << 24) as usize
    } else {
        1024
    };
    let budget = split_descriptors(limit, shards);
    tracing::info!(
        open_files_limit = limit,
        per_shard_connections = budget.connections_max,
        per_shard_active_logs = budget.storage.active_logs_max,
        per_shard_read_handles = budget.storage.open_segment_files_max,
        shared = budget.pool.capacity(),
        "descriptor budget"
    );
    budget
}

/// The mesh's limits: a shard handles as many remote requests at once as the other
/// shards' connections can park there. A JoinGroup waits on the group's coordinator
/// shard until the join phase ends, so with 10,000 members over 2 shards some 5,000
/// joins wait on one shard at once; with the default 4,096 the rest queued unhandled,
/// the phase ended without them and the group never became stable.
fn mesh_limits(d: &Descriptors, shards: usize) -> MeshLimits {
    let parked = d
        .connections_max
        .saturating_mul(shards as u64)
        .saturating_add(d.pool.capacity() as u64);
    MeshLimits {
        inflight_max: MeshLimits::default().inflight_max.max(parked),
        ..MeshLimits::default()
    }
}

/// A shard's descriptor budget (see [`descriptor_budget`]).
#[derive(Debug, Clone)]
pub struct Descriptors {
    pub storage: StorageLimits,
    /// Open client connections per shard, its own share.
    pub connections_max: u64,
    /// What the shards' connections and active logs share beyond their own shares.
    pub pool: Arc<DescriptorPool>,
}

fn split_descriptors(limit: usize, shards: usize) -> Descriptors {
    let shards = shards.max(1);
    let reserve = (limit / 20).max(1024);
    let rest = limit.saturating_sub(reserve);
    let read = (rest / 8 / shards).clamp(16, 1024);
    let rest = rest.saturating_sub(read * shards);
    let connections = (rest / 4 / shards).max(64);
    // One descriptor per active log: its active segment's `.log`.
    let active = (rest / 10 / shards).max(16);
    let pool = rest.saturating_sub((connections + active) * shards);
    Descriptors {
        storage: StorageLimits {
            open_segment_files_max: read,
            active_logs_max: active,
            atomic_writes_max: (reserve / 2 / shards).clamp(16, 256) as u64,
            ..StorageLimits::default()
        },
        connections_max: connections as u64,
        pool: DescriptorPool::new(pool),
    }
}

/// What every shard gets from start-up besides its config: its descriptor budget
/// (storage and connections), the metrics registry and the lag board (both read by the
/// HTTP thread).
struct Shared {
    descriptors: Descriptors,
    registry: Arc<crate::observe::metrics::Registry>,
    lag: Arc<crate::observe::lag::LagBoard>,
    /// Set by shard 0 once a stop's controlled shutdown is over (the leaderships moved,
    /// or there was nothing to move); the other shards serve until then.
    handed_over: Arc<AtomicBool>,
    /// The data directory's id (`crate::base::directory`).
    directory: String,
    /// The TLS of SSL listeners (client certificates as --ssl-client-auth says).
    tls: Option<Arc<sluice_client::tls::ListenerTls>>,
    /// The TLS of SASL_SSL listeners (no client certificate asked for).
    open_tls: Option<Arc<sluice_client::tls::ListenerTls>>,
    /// Tiered storage's object store and its threads (`--remote-storage`).
    remote: Option<(Arc<sluice_tiered::Store>, crate::partition::tiered::Pools)>,
}

/// What tells a file changed: modification time (s, ns) and inode (a file replaced by
/// a rename is a new inode); `None` while it cannot be read.
type FileStamp = Option<(i64, i64, u64)>;

/// Creates the bootstrap user's SCRAM credentials (both mechanisms) where it has
/// none, retrying until the quorum takes the command; an existing credential is kept
/// (`only_if_absent`), so a password changed later stays changed.
async fn bootstrap_sasl_user(
    broker: std::rc::Weak<Broker>,
    sasl: crate::base::config::SaslSettings,
) {
    use sluice_client::sasl::{Mechanism, ScramCredential, ITERATIONS_MIN};
    use sluice_replication::cluster::{Command, ScramChange};
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(b) = broker.upgrade() else { return };
        let image = b.image();
        let have = image.scram.get(&sasl.bootstrap_user);
        let changes: Vec<ScramChange> = [Mechanism::ScramSha256, Mechanism::ScramSha512]
            .into_iter()
            .filter_map(|m| {
                let code = m.scram_type()?;
                if have.is_some_and(|h| h.contains_key(&code)) {
                    return None;
                }
                let c = ScramCredential::generate(m, &sasl.bootstrap_password, ITERATIONS_MIN);
                Some(ScramChange {
                    user: sasl.bootstrap_user.clone(),
                    mechanism: code,
                    credential: Some(crate::base::metadata::stored_credential(c)),
                    only_if_absent: true,
                })
            })
            .collect();
        if changes.is_empty() {
            // The user exists: the password this broker logs in to the others with
            // must still be its password (it may have been changed in the cluster).
            let stored = [Mechanism::ScramSha256, Mechanism::ScramSha512]
                .into_iter()
                .find_map(|m| Some((m, image.scram_credential(&sasl.bootstrap_user, m)?)));
            if let Some((m, cred)) = stored {
                let password = sasl.bootstrap_password.clone();
                let ok = glommio::executor()
                    .spawn_blocking(move || cred.verify_password(m, &password))
                    .await;
                if !ok {
                    tracing::error!(
                        user = sasl.bootstrap_user,
                        "the password in SLUICE_SASL_BOOTSTRAP_USER is not the bootstrap user's password in the cluster (changed since?): this broker cannot log in to the other brokers; give it the current one"
                    );
                }
            }
            return;
        }
        match b
            .control(crate::base::rpc::Propose(Command::AlterScramCredentials {
                changes,
            }))
            .await
        {
            Ok(Ok(_)) => {
                tracing::info!(
                    user = sasl.bootstrap_user,
                    "SASL bootstrap user has its SCRAM credentials"
                );
                return;
            }
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(error = %e, "creating the SASL bootstrap user's credentials failed; retrying")
            }
        }
        drop(b);
        glommio::timer::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// The stamps of the certificate, key and CA files.
fn tls_files_stamp(t: &crate::base::config::TlsSettings) -> Vec<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    [&t.certificate, &t.key, &t.ca]
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| (m.mtime(), m.mtime_nsec(), m.ino()))
                .ok()
        })
        .collect()
}

/// How often the TLS files are looked at for a change.
const TLS_FILES_CHECK: Duration = Duration::from_secs(1);

/// Reloads the SSL listener's certificate, key and CA file, and this broker's TLS
/// configuration for its connections to other brokers, on SIGHUP and whenever one of
/// the files changes (a new modification time or inode: certificates rotated by a tool
/// that replaces them). New connections use the new files; open ones keep
/// theirs. Files that do not load (a half-written pair, a bad PEM) leave the old
/// configuration in place, with a warning, until they change again. A thread of its
/// own: it reads files with blocking calls and touches no shard.
fn watch_tls_files(
    settings: crate::base::config::TlsSettings,
    mut seen: Vec<FileStamp>,
    listener: Arc<sluice_client::tls::ListenerTls>,
    open: Option<Arc<sluice_client::tls::ListenerTls>>,
    peer: bool,
    stop: Arc<AtomicBool>,
) {
    let hup = Arc::new(AtomicBool::new(false));
    if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone()) {
        tracing::warn!(error = %e, "SIGHUP cannot reload the TLS files; file changes still do");
    }
    let files = settings;
    let spawned = std::thread::Builder::new()
        .name("tls-files".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(TLS_FILES_CHECK);
                let now = tls_files_stamp(&files);
                let signalled = hup.swap(false, Ordering::SeqCst);
                if now == seen && !signalled {
                    continue;
                }
                seen = now;
                let why = if signalled { "SIGHUP" } else { "a file changed" };
                let loaded = files.server_config().and_then(|s| {
                    Ok((
                        s,
                        files.peer_config()?,
                        files.controller_configs()?,
                        files.no_client_auth_config()?,
                    ))
                });
                match loaded {
                    Ok((server, peer_tls, controller, open_config)) => {
                        listener.replace(server);
                        if let Some(o) = &open {
                            o.replace(open_config);
                        }
                        if peer {
                            sluice_client::tls::set_peer_tls(peer_tls);
                            sluice_client::tls::set_controller_tls(controller);
                        }
                        tracing::info!(why, certificate = %files.certificate.display(), "TLS files reloaded: new connections use them");
                    }
                    Err(e) => {
                        tracing::warn!(why, error = %e, "TLS files could not be reloaded; the listener keeps the ones it has");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread to reload the TLS files: they are read at start only");
    }
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn run_shard(
    shard: ShardId,
    config: BrokerConfig,
    builders: MeshBuilders<ShardReq, Answered>,
    shared: Shared,
    stop: Arc<AtomicBool>,
    ready: Arc<AtomicUsize>,
) -> Result<(), ShardError> {
    let Shared {
        descriptors,
        registry,
        lag,
        handed_over,
        directory,
        tls,
        open_tls,
        remote,
    } = shared;
    // However shard 0 ends, the other shards do not wait for its hand-over after that.
    let _handed_over_on_exit = (shard.0 == 0).then(|| SetOnDrop(handed_over.clone()));
    let mesh_limits = mesh_limits(&descriptors, config.cores);
    // Storage first: it must be the first DMA-file user on this executor.
    let limits = StorageLimits {
        shared_sync_min: config.shared_sync_min,
        dsync_logs_max: config.dsync_logs_max,
        journal_chunk_bytes: config.journal_chunk_bytes,
        shard: shard.0,
        shards: config.cores,
        ..descriptors.storage
    };
    let storage = Storage::open(&config.data_dir, limits, Rc::new(SystemClock))
        .await
        .map_err(ShardError::OpenStorage)?;
    storage.share_descriptors(descriptors.pool.clone());
    storage
        .spawn_background(
            config.log_retention_check_interval_ms,
            config.log_cleaner_backoff_ms,
            FLUSH_CHECK_MS,
        )
        .map_err(ShardError::StorageBackground)?;
    let (mesh, receivers) = Mesh::join(shard, config.cores, builders, mesh_limits)
        .await
        .map_err(ShardError::Mesh)?;
    // Shard 0 runs this broker's voter of the metadata quorum.
    let quorum = if shard.0 == 0 {
        let advertised = (config.advertised_host.clone(), config.advertised_port);
        Some(QuorumNode::start(QuorumConfig {
            node_id: config.node_id,
            voters: config.controller_quorum.clone(),
            listen: config.controller_listen,
            controller: config.controller_role,
            broker: config.broker_role,
            dir: config.data_dir.join(METADATA_DIR),
            tick: RAFT_TICK,
            heartbeat_interval: Duration::from_millis(config.broker_heartbeat_interval_ms),
            session_timeout: Duration::from_millis(config.broker_session_timeout_ms),
            host: advertised.0,
            port: advertised.1,
            rack: config.rack.clone(),
            // Named listeners (even one) are registered by name; one --listen listener
            // registers as before (answered under any listener name).
            endpoints: match config.given.contains(&"listeners") {
                false => Vec::new(),
                true => config
                    .listeners
                    .iter()
                    .map(|l| sluice_replication::cluster::Endpoint {
                        listener: l.name.clone(),
                        host: l.advertised_host.clone(),
                        port: l.advertised_port,
                        security_protocol: l.protocol.id(),
                    })
                    .collect(),
            },
            directory: directory.clone(),
            auto_leader_rebalance: config.auto_leader_rebalance_enable,
        })?)
    } else {
        None
    };
    let controller = quorum.clone().map(Controller::new);
    let limits = ShardLimits {
        request_bytes_max: (config.socket_request_max_bytes as u64).max(256 << 20),
        // One largest frame always fits, so no single request can wait forever.
        connection_request_bytes_max: (config.socket_request_max_bytes as u64).max(64 << 20),
        connection_inflight_max: 128,
        connections_max: descriptors.connections_max,
    };
    let listen = config.listen;
    let broker = Rc::new(Broker::new(config, mesh.clone(), storage, limits, registry));
    // The layers above the partition host subscribe to its events; the shard's server
    // owns them and answers every cross-shard call.
    let replication = Rc::new(crate::cluster::fetcher::Replication::default());
    let alters = replication.alters();
    broker.subscribe(replication);
    let groups = GroupShell::start(&broker);
    crate::coord::group::lag::start(&broker, &groups, lag);
    let txns = crate::coord::txn::TxnShell::start(&broker);
    let server = Rc::new(ShardServer {
        broker: broker.clone(),
        controller,
        groups,
        txns: txns.clone(),
    });
    mesh.serve(
        receivers,
        Rc::new(move |_from, req| {
            let server = server.clone();
            Box::pin(async move { crate::base::rpc::serve(&*server, req).await })
        }),
    );
    glommio::spawn_local(crate::cluster::fetcher::isr_checker(
        Rc::downgrade(&broker),
        alters,
    ))
    .detach();
    if let Some((store, pools)) = remote {
        broker.set_tiered(crate::partition::tiered::Tiered::new(
            store,
            &pools,
            broker.config.remote_fetch_cache_bytes,
        ));
        glommio::spawn_local(crate::cluster::tiering::run(
            Rc::downgrade(&broker),
            Duration::from_millis(broker.config.remote_log_manager_task_interval_ms),
        ))
        .detach();
    }
    // Space preallocated ahead of segment writes stays out of the reserve.
    sluice_storage::file::keep_free_when_preallocating(broker.disk.threshold());
    glommio::spawn_local(crate::partition::disk::DiskWatch::run(Rc::downgrade(
        &broker.disk,
    )))
    .detach();
    glommio::spawn_local(offline_tender(Rc::downgrade(&broker))).detach();
    let listening = Rc::new(std::cell::Cell::new(false));
    glommio::spawn_local(metrics_publisher(
        Rc::downgrade(&broker),
        Rc::downgrade(&txns),
        quorum.clone(),
        listening.clone(),
    ))
    .detach();
    if let (0, Some(path)) = (shard.0, broker.config.fault_rules.clone()) {
        glommio::spawn_local(fault_rules_watcher(path)).detach();
    }
    if !broker.config.broker_role {
        // A controller without the broker role: its quorum member (on shard 0) is all
        // it runs; no registration, no partitions, no Kafka listener.
        if shard.0 == 0 {
            tracing::info!(
                controller = ?broker.config.controller_listen,
                "sluice ready: a controller only (metadata quorum member, no Kafka API)"
            );
            crate::base::host::notify("READY=1\nSTATUS=controller only");
        }
        while !stop.load(Ordering::SeqCst) {
            glommio::timer::sleep(STOP_POLL).await;
        }
        if let Some(q) = &quorum {
            q.step_down(Duration::from_secs(1)).await;
        }
        handed_over.store(true, Ordering::SeqCst);
        broker.close_all().await;
        tracing::info!(%shard, "shard stopped");
        return Ok(());
    }
    if let Some(q) = &quorum {
        glommio::spawn_local(publisher(Rc::downgrade(&broker), q.clone())).detach();
        // Serve once this broker is registered (a single node: at once; a cluster: once
        // a quorum has formed).
        while !q.registered() {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            glommio::timer::sleep(STOP_POLL).await;
        }
        import_legacy_metadata(&broker, q).await;
        if let Some(sasl) = broker.config.sasl.clone() {
            glommio::spawn_local(bootstrap_sasl_user(Rc::downgrade(&broker), sasl)).detach();
        }
    }
    // Every shard listens only once its own image can answer a client completely: this
    // broker registered and unfenced in it, a controller known (as Kafka opens its
    // listeners only once the broker is unfenced). Before, shards other than 0 answered
    // Metadata from their first image, with no brokers and no controller, which
    // librdkafka rejects as a partial answer and backs off from for seconds.
    // On a SASL listener, also once the bootstrap user exists (a broker could not
    // authenticate to this one before).
    let ready_to_serve = |image: &crate::base::metadata::MetadataImage| {
        image.complete_for(broker.config.broker_id())
            && broker
                .config
                .sasl
                .as_ref()
                .is_none_or(|s| image.scram.contains_key(&s.bootstrap_user))
    };
    while !ready_to_serve(&broker.image()) {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        glommio::timer::sleep(STOP_POLL).await;
    }
    // How the restart went: a clean stop leaves every log a record that lets it open
    // without recovery.
    let (clean, recovered) = broker.storage.logs_opened();
    tracing::info!(%shard, clean, recovered, "logs opened: {clean} clean, {recovered} recovered");
    // Every listener, its connections counted together against the shard's budget.
    let slots = crate::serve::server::connection_slots(&broker);
    let mut servers = Vec::new();
    for l in &broker.config.listeners {
        let socket = crate::serve::server::bind(l.bind).map_err(|source| ShardError::Bind {
            addr: l.bind,
            source,
        })?;
        let ctx = Rc::new(crate::serve::server::ListenerCtx {
            name: Rc::from(l.name.as_str()),
            protocol: l.protocol,
            tls: match l.protocol {
                crate::base::config::SecurityProtocol::SaslSsl => open_tls.clone(),
                _ => tls.clone(),
            },
        });
        servers.push(glommio::spawn_local(crate::serve::server::serve(
            broker.clone(),
            socket,
            ctx,
            slots.clone(),
        )));
    }
    listening.set(true);
    broker.metrics.set_serving(shard.0, true);
    if ready.fetch_add(1, Ordering::SeqCst) + 1 == broker.table.shard_count() {
        let others: Vec<String> = broker.config.listeners[1..]
            .iter()
            .map(|l| format!("{}://{}", l.name, l.bind))
            .collect();
        if others.is_empty() {
            tracing::info!(%listen, "sluice ready: Kafka API on {listen} (try: kcat -b {listen} -L)");
        } else {
            let others = others.join(", ");
            tracing::info!(%listen, %others, "sluice ready: Kafka API on {listen} (inter-broker listener) and {others}");
        }
        // systemd's Type=notify: the unit is started once every shard serves.
        crate::base::host::notify(&format!("READY=1\nSTATUS=serving Kafka on {listen}"));
    }
    while !stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(STOP_POLL).await;
    }
    if shard.0 == 0 {
        crate::base::host::notify("STOPPING=1\nSTATUS=stopping");
    }
    // Controlled shutdown: every shard keeps serving (answering NOT_LEADER_OR_FOLLOWER
    // once its partitions moved, so clients find the new leaders at once) until shard 0
    // has the quorum move this broker's leaderships and every shard adopted that.
    let hand_over_max = Duration::from_millis(broker.config.broker_session_timeout_ms);
    match &quorum {
        Some(q) => {
            let started = Instant::now();
            if let Some(version) = q.controlled_shutdown(hand_over_max).await {
                let left = hand_over_max.saturating_sub(started.elapsed());
                let adopted = futures_lite::future::or(
                    async {
                        broker.wait_published(version).await;
                        true
                    },
                    async {
                        glommio::timer::sleep(left).await;
                        false
                    },
                )
                .await;
                // Partitions the adopted image still names this broker leader of (every
                // shard's, unlike its own replicas): none once the hand-over is done.
                let me = broker.config.node_id;
                let led = broker
                    .image()
                    .topics
                    .values()
                    .flat_map(|t| t.assignments.iter())
                    .filter(|a| a.leader == me)
                    .count();
                tracing::info!(
                    adopted,
                    led_here = led,
                    ms = started.elapsed().as_millis() as u64,
                    "controlled shutdown: leaderships moved to other in-sync replicas"
                );
            }
            handed_over.store(true, Ordering::SeqCst);
        }
        None => {
            let started = Instant::now();
            while !handed_over.load(Ordering::SeqCst) && started.elapsed() < hand_over_max * 2 {
                glommio::timer::sleep(STOP_POLL).await;
            }
        }
    }
    listening.set(false);
    broker.metrics.set_serving(shard.0, false);
    for server in servers {
        drop(server.cancel());
    }
    broker.close_all().await;
    tracing::info!(%shard, "shard stopped");
    Ok(())
}

/// How often a shard looks for failed logs and retries offline ones.
const OFFLINE_CHECK: Duration = Duration::from_millis(250);

/// Every shard: takes partitions with failed logs offline and reopens them (see
/// `Broker::tend_offline`).
async fn offline_tender(broker: std::rc::Weak<Broker>) {
    loop {
        glommio::timer::sleep(OFFLINE_CHECK).await;
        let Some(b) = broker.upgrade() else { return };
        b.tend_offline().await;
    }
}

/// Every shard: publishes its partitions' state to the metrics endpoint and whether it
/// serves (listening, with an image in which this broker is registered and unfenced),
/// once a `SNAPSHOT_INTERVAL`. Shard 0 adds the broker-wide facts.
async fn metrics_publisher(
    broker: std::rc::Weak<Broker>,
    txns: std::rc::Weak<crate::coord::txn::TxnShell>,
    quorum: Option<Rc<QuorumNode>>,
    listening: Rc<std::cell::Cell<bool>>,
) {
    loop {
        {
            let (Some(b), Some(txns)) = (broker.upgrade(), txns.upgrade()) else {
                return;
            };
            let image = b.image();
            let serving = listening.get() && image.complete_for(b.config.broker_id());
            b.metrics.set_serving(b.shard.0, serving);
            let (partitions, producer_ids) = b.partition_stats();
            let node = quorum.as_ref().map(|q| {
                let space = b.disk.space();
                let (raft_term, active_controller) = q.raft_status();
                crate::observe::metrics::NodeSnapshot {
                    active_controller,
                    controller_id: image.controller_id.get(),
                    raft_term,
                    raft_leader: q.leader_id(),
                    metadata_epoch: image.epoch,
                    brokers: image.brokers.len(),
                    fenced_brokers: image.brokers.values().filter(|b| b.fenced).count(),
                    disk_free_bytes: space.free,
                    disk_total_bytes: space.total,
                    disk_min_free_bytes: b.disk.threshold(),
                }
            });
            b.metrics.publish(
                b.shard.0,
                crate::observe::metrics::ShardSnapshot {
                    partitions,
                    producer_ids,
                    disk_appends_refused: b.disk.refused(),
                    disk_low: b.disk.low(),
                    open_transactions: txns.open_transactions(),
                    node,
                    storage: crate::observe::metrics::StorageStat {
                        active_logs: b.storage.active_logs() as u64,
                        active_logs_max: b.storage.active_logs_allowed() as u64,
                        reactivations: b.storage.reactivations(),
                        preallocated_unwritten_bytes: b.storage.preallocated_unwritten_bytes(),
                        preallocated_bytes_max: b.storage.limits().preallocated_bytes_max,
                        index_memory_bytes: b.storage.index_memory(),
                        index_memory_max: b.storage.limits().index_memory_max,
                    },
                    tiered: b.tiered().map(|t| t.snapshot()),
                },
            );
        }
        glommio::timer::sleep(crate::observe::metrics::SNAPSHOT_INTERVAL).await;
    }
}

/// Tests only (`--fault-rules FILE`): arms the storage fault rules the file holds,
/// re-reading it when it changes (absent: none). Shard 0 runs it; the rules are
/// process-wide.
async fn fault_rules_watcher(path: PathBuf) {
    tracing::warn!(path = %path.display(), "storage fault injection is enabled (a test-only flag)");
    let mut seen: Option<String> = None;
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if seen.as_deref() != Some(text.as_str()) {
            match sluice_storage::fault::parse_rules(&text) {
                Ok(rules) => {
                    tracing::warn!(rules = ?rules, "storage fault rules armed");
                    sluice_storage::fault::set_rules(rules);
                }
                Err(e) => {
                    tracing::error!(path = %path.display(), error = %e, "bad fault rules file")
                }
            }
            seen = Some(text);
        }
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
}

/// The quorum's journal directory under the data directory.
pub const METADATA_DIR: &str = "__cluster_metadata";
/// One raft tick: heartbeats every 2, elections after 10-20.
const RAFT_TICK: Duration = Duration::from_millis(100);

/// Shard 0: turns every change of the quorum state (or of its leader) into a new image
/// and hands it to every shard. A partition keeps the replica slots of the image that
/// first published it (`MetadataImage::keep_slots_of`): its owning shard never moves.
async fn publisher(broker: std::rc::Weak<Broker>, quorum: Rc<QuorumNode>) {
    let mut seen = u64::MAX;
    let mut epoch = 0u64;
    let mut last: Option<Arc<crate::base::metadata::MetadataImage>> = None;
    let mut strays_checked = false;
    loop {
        let listener = quorum.changed.listen();
        let count = quorum.change_count();
        if count == seen {
            listener.await;
            continue;
        }
        seen = count;
        let Some(b) = broker.upgrade() else { return };
        epoch += 1;
        let (mut image, version) = quorum.with_state(|s| {
            (
                crate::cluster::quorum_io::image_of(
                    s,
                    last.as_deref(),
                    quorum.leader_id(),
                    epoch,
                    quorum.incarnation_known(),
                ),
                s.version,
            )
        });
        let kept = last.as_ref().map_or(0, |l| image.keep_slots_of(l));
        if kept > 0 {
            tracing::warn!(
                partitions = kept,
                "the metadata state has other replica slots for partitions already published (a snapshot from a voter restored from an older snapshot format); keeping the published ones"
            );
        }
        let image = Arc::new(image);
        last = Some(image.clone());
        crate::cluster::controller::publish(&b, image.clone()).await;
        // Once per run, the first image this broker may act on (its registration is
        // in it) and no other being adopted meanwhile: directories of replicas it no
        // longer holds go.
        if image.registered && !strays_checked {
            strays_checked = true;
            let removed = b.remove_stray_logs(&image);
            if removed > 0 {
                tracing::info!(removed, "deleted stray partition directories");
            }
        }
        b.set_published(version);
    }
}

/// A data directory of an earlier single-node version keeps its topics in
/// `sluice-metadata.toml`: a new single-voter quorum imports them once (same ids,
/// same cluster id) and renames the file.
async fn import_legacy_metadata(broker: &Rc<Broker>, quorum: &Rc<QuorumNode>) {
    use sluice_replication::cluster::Command;
    let path = broker
        .config
        .data_dir
        .join(crate::base::metadata::METADATA_FILE);
    if !path.exists() || broker.config.controller_quorum.len() != 1 {
        return;
    }
    let old = match FileMetadataStore::new(&broker.config.data_dir).load() {
        Ok(i) => i,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the old metadata file; not importing it");
            return;
        }
    };
    let me = broker.config.node_id;
    let mut cmds = vec![Command::Init {
        cluster_id: old.cluster_id.clone(),
    }];
    for (name, t) in &old.topics {
        if quorum.with_state(|s| s.topics.contains_key(name)) {
            continue;
        }
        cmds.push(Command::CreateTopic {
            name: name.clone(),
            id: *t.id.as_bytes(),
            configs: t.configs.clone(),
            assignments: (0..t.partitions).map(|_| vec![me]).collect(),
        });
    }
    for cmd in cmds {
        if let Err(e) = quorum.propose(cmd, Duration::from_secs(10)).await {
            tracing::error!(error = %e, "importing the old metadata file failed; will retry at next start");
            return;
        }
    }
    let done = path.with_extension("toml.imported");
    match std::fs::rename(&path, &done) {
        Ok(()) => tracing::info!(
            topics = old.topics.len(),
            "imported topics from {}",
            path.display()
        ),
        Err(e) => tracing::error!(error = %e, "renaming {}", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::split_descriptors;

    #[test]
    fn descriptor_budget_fits_the_limit_and_leaves_a_reserve() {
        for (limit, shards) in [
            (20_000, 2),
            (20_000, 1),
            (4_096, 2),
            (1 << 20, 8),
            (1024, 4),
        ] {
            let d = split_descriptors(limit, shards);
            let per_shard = d.connections_max as usize
                + d.storage.open_segment_files_max
                + d.storage.active_logs_max;
            let reserve = (limit / 20).max(1024);
            // The small files written at once live in the reserve, half of it at most.
            assert!(d.storage.atomic_writes_max as usize * shards <= reserve / 2);
            if limit >= 4_096 {
                assert!(
                    per_shard * shards + d.pool.capacity() + reserve <= limit,
                    "{limit}/{shards}: {d:?}"
                );
            }
        }
        // This machine: 10,000 busy partitions fit one broker of 2 shards, and so do
        // 10,000 client connections (the kernel's SO_REUSEPORT spread is not exactly
        // even, so the pool makes up one shard's excess).
        let d = split_descriptors(20_000, 2);
        assert_eq!(d.storage.open_segment_files_max, 1_024);
        assert_eq!(d.connections_max, 2_116);
        assert_eq!(d.storage.active_logs_max, 846);
        assert_eq!(d.pool.capacity(), 11_004);
        assert_eq!(d.storage.atomic_writes_max, 256);
        assert!(2 * d.storage.active_logs_max + d.pool.capacity() >= 10_000);
        assert!(2 * d.connections_max as usize + d.pool.capacity() >= 10_000);
        // One-core brokers (three on this machine) hold 10,000 replicas each.
        let d = split_descriptors(20_000, 1);
        assert!(d.storage.active_logs_max + d.pool.capacity() >= 10_000);
    }
}
