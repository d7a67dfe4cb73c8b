//! `sluice-bench`: Sluice's load generator and benchmarks.
//!
//! `produce` (plain, idempotent or transactional), `consume`, `e2e`, `group` and `ctp`
//! (consume-transform-produce, exactly once) speak the Kafka protocol (kafka-protocol
//! crate) to any broker given by `--bootstrap`; `storage` measures the partition log
//! directly;
//! `ceiling` measures the machine (raw O_DIRECT write and loopback TCP bandwidth).
//! Every run prints a table and writes `report.json`, an `.hgrm` percentile file and a
//! latency plot (SVG) into `--report-dir`.

mod ceiling;
mod ctp;
mod group;
mod kafka;
mod load;
mod report;
mod sample;
mod scale;
mod storage_bench;
mod txn;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use glommio::{LocalExecutorBuilder, Placement};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    version,
    about = "Sluice load generator and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Kafka client properties for every connection to the brokers (security.protocol
    /// PLAINTEXT or SSL, ssl.ca.location, ssl.certificate.location, ssl.key.location), as
    /// `sluice`'s admin commands take them.
    #[arg(long, global = true, value_name = "FILE")]
    command_config: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct ReportArgs {
    /// Where report.json, the .hgrm file and the plot go.
    #[arg(long, default_value = "./bench/results")]
    report_dir: PathBuf,
    /// Name for this run's files in the report dir.
    #[arg(long)]
    name: Option<String>,
}

#[derive(Args, Clone)]
struct Common {
    /// Any broker of the cluster (host:port).
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: SocketAddr,
    #[arg(long, default_value = "sluice-bench")]
    topic: String,
    /// Delete the topic (DeleteTopics) once the run is reported, so that a series of
    /// runs (`make bench`) does not fill the disk with data no later run reads.
    #[arg(long)]
    delete_topic: bool,
    #[command(flatten)]
    report: ReportArgs,
}

/// `--delete-topic`: deletes the run's topic, after its report is written.
fn delete_topic_after(common: &Common) {
    if !common.delete_topic {
        return;
    }
    let (bootstrap, topic) = (common.bootstrap, common.topic.clone());
    on_executor("bench-delete", move || async move {
        kafka::Client::connect(bootstrap)
            .await?
            .delete_topic(&topic)
            .await
    })
    .unwrap_or_else(|e| fail(e));
}

#[derive(Args, Clone)]
struct ProduceArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Replication factor of the topic if the run creates it. Above 1, the run first
    /// waits (bounded) until every partition has that many in-sync replicas, fails
    /// if it never does, and reports the replica sets before and after the run.
    #[arg(long, visible_alias = "replication-factor", default_value_t = 1)]
    replication: i16,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 100)]
    record_size: usize,
    /// Records to send in all (or use --duration).
    #[arg(long, conflicts_with = "duration")]
    records: Option<u64>,
    /// Seconds to run.
    #[arg(long)]
    duration: Option<f64>,
    /// Target records/s over all producers (open loop); omit for maximum throughput.
    #[arg(long)]
    rate: Option<f64>,
    /// Target batch size in bytes (per partition).
    #[arg(long, default_value_t = 65536)]
    batch_bytes: usize,
    #[arg(long, default_value_t = 5.0)]
    linger_ms: f64,
    /// 0, 1 or -1 (all).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true)]
    acks: i16,
    #[arg(long, value_enum, default_value_t = load::Keys::None)]
    keys: load::Keys,
    /// Distinct keys for uniform and zipf.
    #[arg(long, default_value_t = 100_000)]
    key_space: u64,
    /// Producer tasks, each with its own connection per broker.
    #[arg(long, default_value_t = 2)]
    producers: usize,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 8)]
    max_in_flight: usize,
    /// Executors (one thread per core) to spread the producers over (produce only);
    /// each has its own connections to every broker.
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// Idempotent producers: each asks for a producer id (InitProducerId) and numbers
    /// its batches per partition, as librdkafka and the Java client do by default.
    #[arg(long)]
    idempotent: bool,
    /// Transactional producers: each takes its own transactional.id (InitProducerId
    /// at its coordinator), adds each partition to the transaction before its first
    /// batch there (AddPartitionsToTxn), sends sequenced transactional batches, and
    /// commits (flush, then EndTxn) once its transaction is --commit-interval-ms old.
    /// Latency stays produce to acknowledgement; commit latency is reported beside it.
    #[arg(long, conflicts_with = "idempotent")]
    transactional: bool,
    /// Age of a transaction at which it is committed (checked between sends).
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// A topic config (NAME=VALUE, repeatable) sent with CreateTopics when the run
    /// creates its topic, e.g. retention.bytes=33554432.
    #[arg(long = "topic-config", value_name = "NAME=VALUE", value_parser = parse_config)]
    topic_config: Vec<(String, String)>,
    /// A process (repeatable; e.g. each broker) whose CPU time over the run (user +
    /// system, all threads) is reported, in all and in microseconds per record
    /// produced: for RF=3, the cluster's CPU per replicated record.
    #[arg(long = "cpu-pid", value_name = "PID")]
    cpu_pids: Vec<u32>,
}

/// CPU seconds of `pids` together, or None when one of them cannot be read.
fn cpu_of(pids: &[u32]) -> Option<f64> {
    pids.iter().map(|&p| sample::cpu_seconds(p)).sum()
}

/// Prints and adds to a report's config the CPU `pids` used since `before` (taken
/// with [`cpu_of`] as the run started), in all and per record produced.
fn add_cpu(config: &mut serde_json::Value, pids: &[u32], before: Option<f64>, records: u64) {
    if pids.is_empty() {
        return;
    }
    let Some(secs) = before.zip(cpu_of(pids)).map(|(b, a)| a - b) else {
        fail(format!(
            "--cpu-pid {pids:?}: a process ended or cannot be read"
        ));
    };
    let us = secs * 1e6 / records.max(1) as f64;
    println!("CPU of --cpu-pid over the run: {secs:.2} s, {us:.2} µs per record");
    config["cpu"] = json!({"pids": pids, "seconds": secs, "us_per_record": us});
}

fn parse_config(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not NAME=VALUE")),
    }
}

#[derive(Args, Clone)]
struct E2eArgs {
    #[command(flatten)]
    produce: ProduceArgs,
    /// Every this many seconds, a row of the interval: records produced and consumed,
    /// produce-ack p50/p99/max and end-to-end p99 of that interval, and the RSS, open
    /// descriptors and allocated disk of --watch-pid and --watch-dir (a soak).
    #[arg(long)]
    sample_secs: Option<f64>,
    /// Process to read RSS (/proc/PID/status VmRSS) and open descriptors
    /// (/proc/PID/fd) of at every sample, e.g. the broker.
    #[arg(long, requires = "sample_secs")]
    watch_pid: Option<u32>,
    /// Directory to sum allocated bytes (st_blocks * 512) of at every sample, e.g. the
    /// broker's data directory.
    #[arg(long, requires = "sample_secs")]
    watch_dir: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct CtpArgs {
    /// Any broker of the cluster (host:port).
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: SocketAddr,
    /// Topic read with read_committed (created if missing).
    #[arg(long, default_value = "sluice-bench-ctp-in")]
    input: String,
    /// Topic written transactionally (created if missing).
    #[arg(long, default_value = "sluice-bench-ctp-out")]
    output: String,
    /// Consumer group of the processor; it must be the group's only member.
    #[arg(long, default_value = "sluice-bench-ctp")]
    group: String,
    /// Partitions of both topics.
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Bytes of each record's value (at least 8: the transform reads the send time
    /// the load generator put there).
    #[arg(long, default_value_t = 100)]
    record_size: usize,
    /// Records to produce into the input before the timed phase; 0 processes what the
    /// input already holds (e.g. a topic an earlier scenario wrote).
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Target output batch size in bytes (per partition).
    #[arg(long, default_value_t = 65536)]
    batch_bytes: usize,
    /// Produce requests in flight per output connection.
    #[arg(long, default_value_t = 8)]
    max_in_flight: usize,
    /// Age of a transaction at which its offsets are sent and it is committed (checked
    /// after each fetch).
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    #[command(flatten)]
    report: ReportArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Produce to a topic and report throughput and produce-ack latency.
    Produce(ProduceArgs),
    /// Read a topic from earliest to its end offsets as fast as possible.
    Consume {
        #[command(flatten)]
        common: Common,
        /// Record value size the topic was written with (for MB/s).
        #[arg(long, default_value_t = 100)]
        record_size: usize,
    },
    /// Produce and consume at once; report end-to-end latency too, and with
    /// --sample-secs a row per interval (rates, latency, a watched process's RSS and
    /// descriptors, a directory's disk use).
    E2e(E2eArgs),
    /// Consume-transform-produce, exactly once: read the input with read_committed,
    /// write each record again to the output inside transactions that also commit the
    /// input offsets; report records/s end to end and check the output holds every
    /// input record once.
    Ctp(CtpArgs),
    /// Consumer-group scale: many lightweight members join one group; time to a
    /// stable group with every assignment handed out, to rebalance after a leave and
    /// after a new member joins.
    Group {
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap: SocketAddr,
        #[arg(long, default_value = "sluice-bench-group")]
        topic: String,
        #[arg(long, default_value = "sluice-bench-group")]
        group: String,
        #[arg(long, default_value_t = 1000)]
        members: usize,
        #[arg(long, default_value_t = 1000)]
        partitions: i32,
        #[arg(long, default_value_t = 30_000)]
        session_timeout_ms: i32,
        #[arg(long, default_value_t = 200)]
        heartbeat_ms: u64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 120.0)]
        timeout: f64,
        /// classic (JoinGroup/SyncGroup) or consumer (KIP-848 heartbeats).
        #[arg(long, default_value = "classic", value_parser = ["classic", "consumer"])]
        protocol: String,
        #[arg(long, default_value = "./bench/results")]
        report_dir: PathBuf,
    },
    /// Measure the machine: raw O_DIRECT write and loopback TCP bandwidth.
    Ceiling {
        #[arg(long, default_value = "./bench/results/ceiling-data")]
        dir: PathBuf,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value = "./bench/results")]
        report_dir: PathBuf,
    },
    /// Benchmark the storage engine's append path beside raw O_DIRECT write and
    /// fdatasync ceilings measured in the same directory.
    Storage {
        /// Directory on the disk to measure (files are removed afterwards).
        #[arg(long, default_value = "./bench/results/storage-data")]
        dir: PathBuf,
        /// Seconds per scenario.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Concurrent appenders to the one partition (they share group commits).
        #[arg(long, default_value_t = 8)]
        appenders: usize,
        /// Where report.json goes.
        #[arg(long, default_value = "./bench/results")]
        report_dir: PathBuf,
    },
    /// Many partitions at once: topics <prefix>-0..N of --partitions each; create
    /// them (time to leaders and to a full ISR), one record to every partition,
    /// sustained open-loop produce spread over all of them, or wait until every
    /// partition serves again (after a restart or a broker failure).
    Scale(ScaleArgs),
}

#[derive(Args, Clone)]
struct ScaleArgs {
    /// Any broker of the cluster (host:port).
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: SocketAddr,
    /// Topics are named <prefix>-0 .. <prefix>-(topics-1).
    #[arg(long, default_value = "scale")]
    prefix: String,
    #[arg(long, default_value_t = 100)]
    topics: usize,
    /// Partitions per topic.
    #[arg(long, default_value_t = 100)]
    partitions: i32,
    #[arg(long, visible_alias = "replication-factor", default_value_t = 1)]
    replication: i16,
    /// What to do, in order (comma-separated): create, one, sustain, verify.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "create,one,sustain"
    )]
    phases: Vec<scale::Phase>,
    #[arg(long, default_value_t = 100)]
    record_size: usize,
    /// Records/s of the sustain phase, over all partitions.
    #[arg(long, default_value_t = 100_000.0)]
    rate: f64,
    /// Seconds of the sustain phase.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// 0, 1 or -1 (all).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    acks: i16,
    /// Requests in flight per connection (sustain).
    #[arg(long, default_value_t = 8)]
    max_in_flight: usize,
    /// verify: wait until no partition is led by this broker id.
    #[arg(long)]
    avoid_leader: Option<i32>,
    /// verify: wait until every partition has this many in-sync replicas.
    #[arg(long, default_value_t = 0)]
    want_isr: usize,
    /// verify: wait until every partition's log end is at least this.
    #[arg(long, default_value_t = 0)]
    min_offset: i64,
    /// verify: measure from this Unix time in ms (e.g. a broker's start) instead of
    /// the run's start.
    #[arg(long)]
    since_unix_ms: Option<u64>,
    /// Bound of each wait, in seconds.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
    #[command(flatten)]
    report: ReportArgs,
}

fn on_executor<T: Send + 'static, F: std::future::Future<Output = T> + 'static>(
    name: &str,
    f: impl FnOnce() -> F + Send + 'static,
) -> T {
    sluice_shard::run_unpinned(name, 64 << 20, f)
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("sluice-bench: {msg}");
    std::process::exit(1)
}

fn progress_bar(len: Option<u64>, show: bool) -> Option<indicatif::ProgressBar> {
    if !show {
        return None;
    }
    let pb = indicatif::ProgressBar::new(len.unwrap_or(0));
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {pos}/{len} records ({per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    Some(pb)
}

fn produce_opts(a: &ProduceArgs) -> load::ProduceOpts {
    if a.records.is_none() && a.duration.is_none() {
        fail("give --records or --duration");
    }
    if a.producers == 0 || a.max_in_flight == 0 || a.partitions <= 0 || a.record_size == 0 {
        fail("--producers, --max-in-flight, --partitions and --record-size must be positive");
    }
    if ![0, 1, -1].contains(&a.acks) {
        fail("--acks must be 0, 1 or -1");
    }
    // Kafka clients refuse idempotence and transactions without acks=all: a batch
    // acknowledged by the leader alone may be lost, and its sequence with it.
    if (a.idempotent || a.transactional) && a.acks != -1 {
        fail("--idempotent and --transactional need --acks -1");
    }
    load::ProduceOpts {
        bootstrap: a.common.bootstrap,
        topic: a.common.topic.clone(),
        partitions: a.partitions,
        replication: a.replication,
        record_size: a.record_size,
        records: a.records,
        duration_s: a.duration,
        rate: a.rate,
        batch_bytes: a.batch_bytes,
        linger_ms: a.linger_ms,
        acks: a.acks,
        keys: a.keys,
        key_space: a.key_space,
        producers: a.producers,
        max_in_flight: a.max_in_flight,
        idempotent: a.idempotent,
        transactional: a.transactional,
        commit_interval_ms: a.commit_interval_ms,
        topic_configs: a.topic_config.clone(),
    }
}

fn write_reports(args: &ReportArgs, kind: &str, config: serde_json::Value, out: &load::Outcome) {
    let name = args.name.clone().unwrap_or_else(|| kind.to_string());
    let dir = &args.report_dir;
    std::fs::create_dir_all(dir).unwrap_or_else(|e| fail(format!("report dir: {e}")));
    let records_per_sec = out.records as f64 / out.seconds.max(1e-9);
    let mb_per_sec = out.bytes as f64 / out.seconds.max(1e-9) / 1e6;
    let mut hists: Vec<(&str, &hdrhistogram::Histogram<u64>)> = Vec::new();
    if !out.produce_latency_us.is_empty() {
        hists.push(("produce-ack", &out.produce_latency_us));
    }
    if let Some(h) = &out.e2e_latency_us {
        hists.push(("end-to-end", h));
    }
    if let Some(h) = &out.commit_latency_us {
        hists.push(("commit", h));
    }
    report::print_summary(&name, records_per_sec, mb_per_sec, &hists);
    if out.errors > 0 {
        println!("errors: {}", out.errors);
    }
    let main_hist = hists.first().map(|(_, h)| *h);
    let mut report = json!({
        "kind": kind,
        "name": name,
        "records_per_sec": records_per_sec,
        "mb_per_sec": mb_per_sec,
        "records": out.records,
        "consumed": out.consumed,
        "errors": out.errors,
        "seconds": out.seconds,
        "latency_ms": main_hist.map(report::latency_ms),
        "config": config,
        "environment": report::environment(),
    });
    if let Some(h) = &out.e2e_latency_us {
        report["e2e_latency_ms"] = report::latency_ms(h);
    }
    if let Some(h) = &out.commit_latency_us {
        report["commit_latency_ms"] = report::latency_ms(h);
        report["transactions"] = json!(h.len());
    }
    if !out.samples.is_empty() {
        println!("over time (each row: the interval ending at that second):");
        sample::print_table(&out.samples);
        report["samples"] = json!(out.samples);
    }
    for (label, h) in &hists {
        let p = dir.join(format!("{name}-{label}.hgrm"));
        report::write_hgrm(&p, h).unwrap_or_else(|e| fail(format!("{}: {e}", p.display())));
    }
    if !hists.is_empty() {
        let p = dir.join(format!("{name}-latency.svg"));
        if let Err(e) = report::write_plot(&p, &format!("{name}: latency by percentile"), &hists) {
            eprintln!("plot {}: {e}", p.display());
        }
    }
    let p = dir.join(format!("{name}-report.json"));
    std::fs::write(&p, serde_json::to_string_pretty(&report).expect("json"))
        .unwrap_or_else(|e| fail(format!("{}: {e}", p.display())));
    println!("report: {}", p.display());
}

/// Runs the producers on `cores` executors, each with its share of the producers,
/// records and rate, and merges what they measured.
fn produce_on_cores(
    opts: &load::ProduceOpts,
    cores: usize,
    pb: Option<indicatif::ProgressBar>,
) -> load::Outcome {
    let cores = cores.min(opts.producers);
    let mut threads = Vec::new();
    for i in 0..cores {
        let mut o = opts.clone();
        let share = |n: u64| n / cores as u64 + u64::from((i as u64) < n % cores as u64);
        o.producers = share(opts.producers as u64) as usize;
        o.records = opts.records.map(share);
        o.rate = opts.rate.map(|r| r / cores as f64);
        let pb = pb.clone();
        let handle = LocalExecutorBuilder::new(Placement::Unbound)
            .io_memory(64 << 20)
            .name(&format!("bench-produce-{i}"))
            .spawn(move || async move {
                sluice_shard::keep_awake(sluice_shard::WAKE_PERIOD);
                load::produce(o, pb).await
            })
            .unwrap_or_else(|e| fail(format!("executor: {e}")));
        threads.push(handle);
    }
    let mut merged: Option<load::Outcome> = None;
    for t in threads {
        let out = t
            .join()
            .unwrap_or_else(|_| fail("producer thread panicked"))
            .unwrap_or_else(|e| fail(e));
        merged = Some(match merged {
            None => out,
            Some(mut m) => {
                m.records += out.records;
                m.bytes += out.bytes;
                m.errors += out.errors;
                m.seconds = m.seconds.max(out.seconds);
                m.produce_latency_us.add(&out.produce_latency_us).ok();
                m.commit_latency_us = match (m.commit_latency_us, out.commit_latency_us) {
                    (Some(mut a), Some(b)) => {
                        a.add(&b).ok();
                        Some(a)
                    }
                    (a, b) => a.or(b),
                };
                m
            }
        });
    }
    merged.unwrap_or_else(|| fail("no producers"))
}

/// The replica sets of every partition as JSON, and whether each has `want` replicas
/// all in sync.
fn replica_json(sets: &[(i32, Vec<i32>, Vec<i32>)], want: usize) -> (serde_json::Value, bool) {
    let all = !sets.is_empty()
        && sets
            .iter()
            .all(|(_, r, isr)| r.len() == want && isr.len() == want);
    let list = sets
        .iter()
        .map(|(p, r, isr)| json!({"partition": p, "replicas": r, "isr": isr}))
        .collect::<Vec<_>>();
    (json!(list), all)
}

/// Before a replicated run (replication factor above 1): creates the topic and waits
/// up to 30 s until every partition reports that many in-sync replicas in the
/// Metadata, so that the run never measures a topic that is still under-replicated.
fn replicas_before(opts: &load::ProduceOpts) -> Option<serde_json::Value> {
    if opts.replication <= 1 {
        return None;
    }
    let o = opts.clone();
    let sets = on_executor("bench-isr", move || async move {
        let mut c = kafka::Client::connect(o.bootstrap).await?;
        c.create_topic_with(&o.topic, o.partitions, o.replication, &o.topic_configs)
            .await?;
        c.wait_in_sync(&o.topic, o.replication as usize, Duration::from_secs(30))
            .await
    })
    .unwrap_or_else(|e| fail(e));
    let want = opts.replication as usize;
    if sets.iter().any(|(_, r, _)| r.len() != want) || sets.len() != opts.partitions as usize {
        fail(format!("topic {}: replica sets {sets:?} do not match --partitions {} --replication {want} (an older topic of that name?)", opts.topic, opts.partitions));
    }
    println!(
        "topic {}: {} partitions, each with {want} replicas all in sync (ISR {}) before the run",
        opts.topic,
        sets.len(),
        sets.iter()
            .map(|(p, _, isr)| format!("{p}:{isr:?}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    Some(replica_json(&sets, want).0)
}

/// After a replicated run: the replica sets again, and whether every partition still
/// had all its replicas in sync (an ISR that shrank mid-run measured something else).
fn replicas_after(opts: &load::ProduceOpts) -> Option<(serde_json::Value, bool)> {
    if opts.replication <= 1 {
        return None;
    }
    let o = opts.clone();
    let sets = on_executor("bench-isr", move || async move {
        let mut c = kafka::Client::connect(o.bootstrap).await?;
        c.replica_sets(&o.topic).await
    })
    .unwrap_or_else(|e| fail(e));
    let (j, all) = replica_json(&sets, opts.replication as usize);
    if !all {
        eprintln!("sluice-bench: an ISR shrank during the run: {sets:?}");
    }
    Some((j, all))
}

/// Adds the replica checks to a report's config.
fn add_replicas(
    config: &mut serde_json::Value,
    before: Option<serde_json::Value>,
    after: &Option<(serde_json::Value, bool)>,
) {
    if let Some(b) = before {
        config["replicas_before"] = b;
    }
    if let Some((a, all)) = after {
        config["replicas_after"] = a.clone();
        config["all_in_sync_after"] = json!(all);
    }
}

fn write_json(dir: &Path, file: &str, value: &serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| fail(format!("report dir: {e}")));
    let path = dir.join(file);
    std::fs::write(&path, serde_json::to_string_pretty(value).expect("json"))
        .unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
    println!("report: {}", path.display());
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let cli = Cli::parse();
    if let Some(path) = &cli.command_config {
        match sluice_client::security::apply_command_config(path) {
            Ok(()) => {}
            Err(e) => {
                eprintln!("sluice-bench: --command-config {e}");
                std::process::exit(2);
            }
        }
    }
    match cli.command {
        Command::Produce(a) => {
            let opts = produce_opts(&a);
            let before = replicas_before(&opts);
            let show =
                a.duration.is_some_and(|d| d > 3.0) || a.records.is_some_and(|r| r > 2_000_000);
            let pb = progress_bar(a.records, show);
            let cpu_before = cpu_of(&a.cpu_pids);
            let out = produce_on_cores(&opts, a.cores.max(1), pb);
            let mut config = serde_json::to_value(&opts).expect("config");
            add_cpu(&mut config, &a.cpu_pids, cpu_before, out.records);
            let after = replicas_after(&opts);
            config["cores"] = json!(a.cores.max(1));
            add_replicas(&mut config, before, &after);
            write_reports(&a.common.report, "produce", config, &out);
            delete_topic_after(&a.common);
            if out.errors > 0 || after.is_some_and(|(_, all)| !all) {
                std::process::exit(1);
            }
        }
        Command::E2e(e) => {
            let a = &e.produce;
            let opts = produce_opts(a);
            let sampling = e.sample_secs.map(|every_s| {
                if every_s.is_nan() || every_s <= 0.0 {
                    fail("--sample-secs must be positive");
                }
                sample::SampleOpts {
                    every_s,
                    pid: e.watch_pid,
                    dir: e.watch_dir.clone(),
                }
            });
            let before = replicas_before(&opts);
            // A sampled run prints its rows at the end instead of a progress bar.
            let show = a.duration.is_some_and(|d| d > 3.0) && sampling.is_none();
            let pb = progress_bar(a.records, show);
            let (o, s) = (opts.clone(), sampling.clone());
            let cpu_before = cpu_of(&a.cpu_pids);
            let out = on_executor("bench-e2e", move || load::e2e(o, pb.clone(), s))
                .unwrap_or_else(|e| fail(e));
            let mut config = serde_json::to_value(&opts).expect("config");
            add_cpu(&mut config, &a.cpu_pids, cpu_before, out.records);
            let after = replicas_after(&opts);
            if let Some(s) = &sampling {
                config["sampling"] = json!(s);
            }
            add_replicas(&mut config, before, &after);
            write_reports(&a.common.report, "e2e", config, &out);
            delete_topic_after(&a.common);
            if out.errors > 0 || after.is_some_and(|(_, all)| !all) {
                std::process::exit(1);
            }
        }
        Command::Ctp(a) => {
            if a.record_size < 8 || a.partitions <= 0 || a.max_in_flight == 0 {
                fail("--record-size must be at least 8, --partitions and --max-in-flight positive");
            }
            let opts = ctp::CtpOpts {
                bootstrap: a.bootstrap,
                input: a.input,
                output: a.output,
                group: a.group,
                partitions: a.partitions,
                record_size: a.record_size,
                prefill: a.records,
                batch_bytes: a.batch_bytes,
                max_in_flight: a.max_in_flight,
                commit_interval_ms: a.commit_interval_ms,
            };
            let o = opts.clone();
            let pb = progress_bar(None, true);
            let out = on_executor("bench-ctp", move || ctp::run(o, pb.clone()))
                .unwrap_or_else(|e| fail(e));
            let config = serde_json::to_value(&opts).expect("config");
            write_reports(&a.report, "ctp", config, &out);
            if out.errors > 0 {
                std::process::exit(1);
            }
        }
        Command::Consume {
            common,
            record_size,
        } => {
            let opts = load::ConsumeOpts {
                bootstrap: common.bootstrap,
                topic: common.topic.clone(),
                record_size,
            };
            let o = opts.clone();
            let pb = progress_bar(None, true);
            let out = on_executor("bench-consume", move || load::consume(o, pb.clone()))
                .unwrap_or_else(|e| fail(e));
            write_reports(
                &common.report,
                "consume",
                serde_json::to_value(&opts).expect("config"),
                &out,
            );
            delete_topic_after(&common);
        }
        Command::Group {
            bootstrap,
            topic,
            group,
            members,
            partitions,
            session_timeout_ms,
            heartbeat_ms,
            timeout,
            protocol,
            report_dir,
        } => {
            // The classic protocol's report keeps its name (the summary reads both).
            let report_name = if protocol == "classic" {
                "group-report.json".to_string()
            } else {
                format!("group-{protocol}-report.json")
            };
            let opts = group::GroupOpts {
                protocol,
                bootstrap,
                topic,
                group,
                members,
                partitions,
                session_timeout_ms,
                heartbeat_ms,
                timeout_s: timeout,
            };
            let o = opts.clone();
            let r = on_executor("bench-group", move || group::run(o)).unwrap_or_else(|e| fail(e));
            println!(
                "group ({} protocol): {} members, {} partitions: all stable with assignments {:.0} ms after the first join (generation/epoch {}); rebalance after one leave {:.0} ms (generation/epoch {}), {} other members stopped consuming (longest {:.0} ms); after one new member's join {:.0} ms (generation/epoch {}), {} other members stopped (longest {:.0} ms); connecting took {:.0} ms",
                opts.protocol, opts.members, opts.partitions, r.join_ms, r.join_generation, r.rebalance_after_leave_ms, r.rebalance_generation, r.leave_paused_members, r.leave_max_pause_ms, r.rebalance_after_join_ms, r.rebalance_after_join_generation, r.join_paused_members, r.join_max_pause_ms, r.connect_ms
            );
            write_json(
                &report_dir,
                &report_name,
                &json!({
                    "config": opts,
                    "result": r,
                    "environment": report::environment(),
                }),
            );
        }
        Command::Ceiling {
            dir,
            seconds,
            report_dir,
        } => {
            let d = dir.clone();
            let c = on_executor("bench-ceiling", move || ceiling::measure(d, seconds));
            let _ = std::fs::remove_dir_all(&dir);
            println!(
                "machine ceilings: O_DIRECT sequential write {:.0} MB/s, loopback TCP {:.0} MB/s",
                c.odirect_write_mb_per_sec, c.loopback_mb_per_sec
            );
            write_json(
                &report_dir,
                "ceiling-report.json",
                &json!({
                    "odirect_write_mb_per_sec": c.odirect_write_mb_per_sec,
                    "loopback_tcp_mb_per_sec": c.loopback_mb_per_sec,
                    "environment": report::environment(),
                }),
            );
        }
        Command::Scale(a) => {
            let opts = scale::ScaleOpts {
                bootstrap: a.bootstrap,
                prefix: a.prefix,
                topics: a.topics,
                partitions: a.partitions,
                replication: a.replication,
                phases: a.phases,
                record_size: a.record_size.max(8),
                rate: a.rate,
                duration_s: a.duration,
                acks: a.acks,
                max_in_flight: a.max_in_flight.max(1),
                avoid_leader: a.avoid_leader,
                want_isr: a.want_isr,
                min_offset: a.min_offset,
                since_unix_ms: a.since_unix_ms,
                timeout_s: a.timeout,
            };
            if opts.topics == 0 || opts.partitions <= 0 || opts.rate <= 0.0 {
                fail("--topics, --partitions and --rate must be positive");
            }
            let o = opts.clone();
            let r = on_executor("bench-scale", move || scale::run(o)).unwrap_or_else(|e| fail(e));
            let name = a.report.name.clone().unwrap_or_else(|| "scale".to_string());
            println!("{name}: {}", serde_json::to_string(&r).expect("json"));
            write_json(
                &a.report.report_dir,
                &format!("{name}-scale.json"),
                &json!({
                    "config": opts,
                    "result": r,
                    "environment": report::environment(),
                }),
            );
            if r.errors > 0 {
                std::process::exit(1);
            }
        }
        Command::Storage {
            dir,
            seconds,
            appenders,
            report_dir,
        } => {
            if appenders == 0 || seconds <= 0.0 {
                fail("--appenders and --seconds must be positive");
            }
            let opts = storage_bench::Options {
                dir: dir.clone(),
                seconds,
                appenders,
            };
            let (rows, mut report) = on_executor("bench-storage", move || storage_bench::run(opts));
            storage_bench::print_table(&rows);
            report["environment"] = report::environment();
            let _ = std::fs::remove_dir_all(&dir);
            write_json(&report_dir, "storage-report.json", &report);
        }
    }
}
