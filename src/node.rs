//! Starting one broker process: the checks before the shards start, and each shard's
//! life (open storage, join the mesh, adopt the metadata, listen, stop).

use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_shard::{Mesh, MeshBuilders, MeshLimits, RuntimeConfig, ShardId};
use sluice_storage::{Storage, StorageLimits, SystemClock};

use crate::broker::{Broker, ShardLimits, ShardReq, ShardResp};
use crate::config::BrokerConfig;
use crate::controller::Controller;
use crate::metadata::{FileMetadataStore, MetadataImage, MetadataStore};

/// How often each shard checks the stop flag set by the signal handler.
const STOP_POLL: Duration = Duration::from_millis(50);
/// Storage background pass: interval flushes (retention and compaction run every
/// `log_retention_check_interval_ms`).
const FLUSH_CHECK_MS: u64 = 100;

/// Refuses to start when another process holds the port. glommio's listener sets
/// SO_REUSEPORT, so a second broker could otherwise bind the same port silently and
/// steal half the connections. A plain bind (no SO_REUSEPORT) fails if anyone listens.
pub fn check_port_free(config: &BrokerConfig) -> Result<(), String> {
    match std::net::TcpListener::bind(config.listen) {
        Ok(l) => {
            drop(l);
            Ok(())
        }
        Err(e) => Err(format!(
            "cannot listen on {}: {e} (is another broker running?)",
            config.listen
        )),
    }
}

/// glommio's per-thread polled-I/O probe must see a full page (see
/// `sluice_storage::probe`). Shards open storage concurrently on one directory, so the
/// probe file is written once here, before any of them starts.
fn prepare_data_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let probe = dir.join(sluice_storage::probe::PROBE_FILE);
    let page = sluice_storage::file::ALIGN as usize;
    if std::fs::metadata(&probe).map(|m| m.len() as usize).ok() != Some(page) {
        std::fs::write(&probe, vec![0x5au8; page])
            .map_err(|e| format!("writing {}: {e}", probe.display()))?;
    }
    Ok(())
}

/// Runs the broker until `stop` is set. Returns once every shard has stopped.
pub fn run(config: BrokerConfig, stop: Arc<AtomicBool>) -> Result<(), String> {
    check_port_free(&config)?;
    prepare_data_dir(&config.data_dir)?;
    let image = Arc::new(FileMetadataStore::new(&config.data_dir).load()?);
    tracing::info!(
        topics = image.topics.len(),
        cluster_id = %image.cluster_id,
        shards = config.cores,
        "starting"
    );
    let builders: MeshBuilders<ShardReq, ShardResp> =
        MeshBuilders::new(config.cores, MeshLimits::default());
    let ready = Arc::new(AtomicUsize::new(0));
    let runtime = RuntimeConfig::new(config.cores);
    let shards = (0..config.cores)
        .map(|i| {
            let (cfg, builders, image, stop, ready) = (
                config.clone(),
                builders.clone(),
                image.clone(),
                stop.clone(),
                ready.clone(),
            );
            move || async move { run_shard(ShardId(i), cfg, builders, image, stop, ready).await }
        })
        .collect();
    let results = sluice_shard::spawn_shards(&runtime, shards);
    let mut failed = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed.push(format!("shard {i}: {e}")),
            Err(e) => failed.push(format!("shard {i} executor: {e}")),
        }
    }
    if failed.is_empty() {
        tracing::info!("stopped cleanly");
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

async fn run_shard(
    shard: ShardId,
    config: BrokerConfig,
    builders: MeshBuilders<ShardReq, ShardResp>,
    image: Arc<MetadataImage>,
    stop: Arc<AtomicBool>,
    ready: Arc<AtomicUsize>,
) -> Result<(), String> {
    // Storage first: it must be the first DMA-file user on this executor.
    let storage = Storage::open(
        &config.data_dir,
        StorageLimits::default(),
        Rc::new(SystemClock),
    )
    .await
    .map_err(|e| format!("opening storage: {e}"))?;
    storage
        .spawn_background(config.log_retention_check_interval_ms, FLUSH_CHECK_MS)
        .map_err(|e| e.to_string())?;
    let (mesh, receivers) = Mesh::join(shard, config.cores, builders, MeshLimits::default())
        .await
        .map_err(|e| e.to_string())?;
    let controller =
        (shard.0 == 0).then(|| {
            Controller::new(
                Box::new(FileMetadataStore::new(&config.data_dir)) as Box<dyn MetadataStore>
            )
        });
    let limits = ShardLimits {
        request_bytes_max: (config.socket_request_max_bytes as u64).max(256 << 20),
        // One largest frame always fits, so no single request can wait forever.
        connection_request_bytes_max: (config.socket_request_max_bytes as u64).max(64 << 20),
        connection_inflight_max: 128,
        connections_max: 10_000,
    };
    let listen = config.listen;
    let broker = Rc::new(Broker::new(
        config,
        mesh.clone(),
        storage,
        limits,
        controller,
    ));
    let b = broker.clone();
    mesh.serve(
        receivers,
        Rc::new(move |_from, req| Box::pin(b.clone().handle_shard_request(req))),
    );
    broker.apply(image).await;
    let listener = crate::server::bind(listen).map_err(|e| format!("binding {listen}: {e}"))?;
    let server = glommio::spawn_local(crate::server::serve(broker.clone(), listener));
    if ready.fetch_add(1, Ordering::SeqCst) + 1 == broker.table.shard_count() {
        tracing::info!(%listen, "sluice ready: Kafka API on {listen} (try: kcat -b {listen} -L)");
    }
    while !stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(STOP_POLL).await;
    }
    drop(server.cancel());
    broker.close_all().await;
    tracing::info!(%shard, "shard stopped");
    Ok(())
}
