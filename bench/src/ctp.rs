//! `sluice-bench ctp`: consume-transform-produce, exactly once, as a Java
//! `KafkaConsumer` with a transactional `KafkaProducer` (or a Kafka Streams task with
//! exactly_once_v2) runs it. One processor, the only member of its consumer group,
//! reads every partition of the input topic with isolation_level=read_committed,
//! re-encodes each record into a new batch for the same partition of the output topic
//! (the transform: every record is decoded and written again), produces the batches
//! inside a transaction, and about every `commit_interval_ms` sends its input
//! positions to the transaction (AddOffsetsToTxn + TxnOffsetCommit with its group
//! metadata) and commits (EndTxn).
//!
//! The timed phase runs from the first fetch until the commit that covers the last
//! input record is answered; records/s is input records over that time. Afterwards a
//! read_committed count of what the run added to the output must equal the input
//! records it processed: each exactly once, none lost, none twice.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, FetchResponse};

use crate::group;
use crate::kafka::{self, err, BatchBuilder, Client};
use crate::load::{self, Keys, Outcome, ProduceOpts, ProducerConn, Stats};
use crate::txn::{GroupMeta, Txn};

#[derive(Debug, Clone, serde::Serialize)]
pub struct CtpOpts {
    pub bootstrap: SocketAddr,
    pub input: String,
    pub output: String,
    pub group: String,
    /// Of both topics: input partition p goes to output partition p.
    pub partitions: i32,
    /// Bytes of each record's value, in the input as in the output.
    pub record_size: usize,
    /// Records produced into the input (acks=all, not timed) before the timed phase;
    /// 0 uses what the input already holds.
    pub prefill: u64,
    pub batch_bytes: usize,
    pub max_in_flight: usize,
    pub commit_interval_ms: u64,
}

/// Kafka's consumer default `max.partition.fetch.bytes`.
const PARTITION_FETCH_BYTES: i32 = 1 << 20;

/// The processor's group session; it heartbeats at commits, at most every second.
const SESSION_TIMEOUT_MS: i32 = 30_000;
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// Writes `opts.prefill` records into the input with the plain producers.
async fn prefill(opts: &CtpOpts) -> io::Result<()> {
    let fill = ProduceOpts {
        bootstrap: opts.bootstrap,
        topic: opts.input.clone(),
        partitions: opts.partitions,
        replication: 1,
        record_size: opts.record_size,
        records: Some(opts.prefill),
        duration_s: None,
        rate: None,
        batch_bytes: opts.batch_bytes,
        linger_ms: 5.0,
        acks: -1,
        keys: Keys::None,
        key_space: 1,
        producers: 2,
        max_in_flight: opts.max_in_flight,
        idempotent: false,
        transactional: false,
        commit_interval_ms: opts.commit_interval_ms,
        topic_configs: Vec::new(),
    };
    let out = load::produce(fill, None).await?;
    if out.errors > 0 || out.records != opts.prefill {
        return Err(err(format!(
            "prefilling {}: {} of {} records acknowledged, {} errors",
            opts.input, out.records, opts.prefill, out.errors
        )));
    }
    println!(
        "prefilled {} with {} records ({:.0} records/s, not timed)",
        opts.input,
        out.records,
        out.records as f64 / out.seconds.max(1e-9)
    );
    Ok(())
}

/// The processor's side of one fetch: the output batches it makes, by output leader.
type OutputBatches = HashMap<SocketAddr, Vec<(i32, Bytes, Vec<u64>)>>;

/// The processor: its input positions, its transaction and its output connections.
struct Processor {
    opts: CtpOpts,
    txn: Txn,
    /// The group coordinator, for TxnOffsetCommit and heartbeats.
    group_coordinator: Client,
    meta: GroupMeta,
    /// Next input offset per partition, and the input's end offsets at the start.
    positions: BTreeMap<i32, i64>,
    ends: HashMap<i32, i64>,
    /// Positions as of the last commit.
    committed: BTreeMap<i32, i64>,
    output_leaders: HashMap<i32, SocketAddr>,
    conns: HashMap<SocketAddr, Rc<ProducerConn>>,
    next_seq: HashMap<i32, i32>,
    builder: BatchBuilder,
    records_per_batch: usize,
    stats: Rc<Stats>,
    /// Input records read (and transformed) so far.
    input_records: u64,
    /// Per fetch in the open transaction: when it arrived and its record count.
    uncommitted: Vec<(u64, u64)>,
    /// Fetch arrival to the answer of the commit that covers the record.
    fetch_to_commit_us: hdrhistogram::Histogram<u64>,
    last_heartbeat: Instant,
}

impl Processor {
    fn done(&self) -> bool {
        self.positions.iter().all(|(p, o)| *o >= self.ends[p])
    }

    /// The transform: input records of output partition `partition` (their send times,
    /// from their values) as sequenced transactional batches of new records.
    fn transform(
        &mut self,
        partition: i32,
        times: &[u64],
        fetched_us: u64,
        out: &mut OutputBatches,
    ) {
        let addr = self.output_leaders[&partition];
        for chunk in times.chunks(self.records_per_batch) {
            let seq = self.next_seq.entry(partition).or_insert(0);
            let batch = kafka::sequenced(
                &self.builder.build(chunk, None),
                self.txn.producer_id,
                self.txn.epoch,
                *seq,
                true,
            );
            *seq = seq.wrapping_add(chunk.len() as i32);
            out.entry(addr)
                .or_default()
                .push((partition, batch, vec![fetched_us; chunk.len()]));
        }
    }

    /// The next read_committed fetch of those of `fetcher`'s partitions not yet at
    /// their end, sent now and answered in the background while the previous answer
    /// is transformed and produced (a Java consumer prefetches the same way). None
    /// once they are all at their end.
    fn prefetch(&self, mut fetcher: Fetcher) -> Option<Pending> {
        let due: Vec<(i32, i64)> = fetcher
            .partitions
            .iter()
            .filter(|p| self.positions[p] < self.ends[p])
            .map(|p| (*p, self.positions[p]))
            .collect();
        if due.is_empty() {
            return None;
        }
        let req = load::fetch_request(
            &self.opts.input,
            due,
            load::READ_COMMITTED,
            PARTITION_FETCH_BYTES,
        );
        Some(glommio::spawn_local(async move {
            let v = fetcher.client.version(ApiKey::Fetch)?;
            let resp = fetcher.client.request(&req, v).await?;
            Ok((fetcher, resp))
        }))
    }

    /// Takes a fetch answer: advances the positions past it, and returns the send
    /// times of its records per partition, the input of the transform.
    fn take(&mut self, resp: &FetchResponse) -> io::Result<Vec<(i32, Vec<u64>)>> {
        if resp.error_code != 0 {
            return Err(err(format!(
                "fetch: {}",
                sluice_client::error_name(resp.error_code)
            )));
        }
        let mut input = Vec::new();
        for t in &resp.responses {
            for p in &t.partitions {
                let Some(recs) = load::fetched_records(p)? else {
                    continue;
                };
                let mut times = Vec::new();
                let (n, _, next) = kafka::walk_batches(recs, true, &mut times);
                if next > 0 {
                    self.positions.insert(p.partition_index, next);
                }
                if times.len() as u64 != n {
                    return Err(err(
                        "input records must be uncompressed, with values of at least 8 bytes",
                    ));
                }
                if n > 0 {
                    input.push((p.partition_index, times));
                }
            }
        }
        Ok(input)
    }

    /// Transforms the records of one fetch and produces them inside the open
    /// transaction (adding their output partitions to it first).
    async fn produce(&mut self, input: Vec<(i32, Vec<u64>)>, fetched_us: u64) -> io::Result<()> {
        let mut out = OutputBatches::new();
        for (partition, times) in &input {
            self.transform(*partition, times, fetched_us, &mut out);
            let n = times.len() as u64;
            self.uncommitted.push((fetched_us, n));
            self.input_records += n;
        }
        let partitions = out.values().flatten().map(|(p, _, _)| *p);
        self.txn
            .add_partitions(&self.opts.output, partitions)
            .await?;
        for (addr, batches) in out {
            let conn = &self.conns[&addr];
            conn.wait_window().await;
            if conn.closed.get() {
                return Err(err("producer connection closed by the broker"));
            }
            conn.send(&self.opts.output, -1, batches).await?;
        }
        Ok(())
    }

    /// `send_offsets_to_transaction` with the current positions, then commit; the
    /// records of the transaction become visible to read_committed consumers here.
    /// Its latency covers both, the time the processor spends committing.
    async fn commit(&mut self) -> io::Result<()> {
        let start = Instant::now();
        self.txn
            .send_offsets(
                &mut self.group_coordinator,
                &self.meta,
                &self.opts.input,
                &self.positions,
            )
            .await?;
        load::flush_and_commit(&mut self.txn, self.conns.values(), &self.stats, start).await?;
        let committed_us = load::now_us();
        for (fetched_us, n) in self.uncommitted.drain(..) {
            let us = committed_us.saturating_sub(fetched_us).max(1);
            self.fetch_to_commit_us.record_n(us, n).ok();
        }
        self.committed = self.positions.clone();
        if self.last_heartbeat.elapsed() >= HEARTBEAT_EVERY {
            let m = &self.meta;
            let code = group::heartbeat(
                &mut self.group_coordinator,
                &m.group,
                m.generation,
                &m.member_id,
            )
            .await?;
            if code != 0 {
                return Err(err(format!(
                    "group {}: heartbeat: {} (the processor lost its membership)",
                    m.group,
                    sluice_client::error_name(code)
                )));
            }
            self.last_heartbeat = Instant::now();
        }
        Ok(())
    }
}

/// A fetch connection to the leader of `partitions` of the input.
struct Fetcher {
    client: Client,
    partitions: Vec<i32>,
}

/// A fetch in flight, which hands its connection back with the answer.
type Pending = glommio::Task<io::Result<(Fetcher, FetchResponse)>>;

/// Input partitions grouped by leader, each group with its own fetch connection.
async fn fetchers(leaders: &[(i32, SocketAddr)]) -> io::Result<Vec<Fetcher>> {
    let mut out = Vec::new();
    for (addr, partitions) in load::by_leader(leaders) {
        let client = Client::connect(addr).await?;
        out.push(Fetcher { client, partitions });
    }
    Ok(out)
}

/// Counts the records of `topic` from `starts` to its current end offsets as a
/// read_committed consumer sees them.
async fn count_committed(
    topic: &str,
    leaders: &[(i32, SocketAddr)],
    starts: &HashMap<i32, i64>,
) -> io::Result<u64> {
    let ends = load::leader_offsets(leaders, topic, -1).await?;
    let mut records = 0;
    for (addr, ps) in load::by_leader(leaders) {
        let reading = load::Reading {
            topic: topic.to_string(),
            offsets: ps.iter().map(|p| (*p, starts[p])).collect(),
            ends: Some(ps.iter().map(|p| (*p, ends[p])).collect()),
            isolation_level: load::READ_COMMITTED,
        };
        let stop = Rc::new(std::cell::Cell::new(false));
        let (n, _) = load::fetch_loop(addr, reading, stop, None, None).await?;
        records += n;
    }
    Ok(records)
}

pub async fn run(opts: CtpOpts, progress: Option<indicatif::ProgressBar>) -> io::Result<Outcome> {
    let mut admin = Client::connect(opts.bootstrap).await?;
    for topic in [&opts.input, &opts.output] {
        admin.create_topic(topic, opts.partitions, 1).await?;
    }
    if opts.prefill > 0 {
        prefill(&opts).await?;
    }
    let inputs = admin.leaders(&opts.input).await?;
    let outputs = admin.leaders(&opts.output).await?;
    if outputs
        .iter()
        .map(|(p, _)| p)
        .ne(inputs.iter().map(|(p, _)| p))
    {
        return Err(err(format!(
            "{} and {} must have the same partitions",
            opts.input, opts.output
        )));
    }
    let (starts, ends) = load::offset_range(&inputs, &opts.input, progress.as_ref()).await?;
    let output_starts = load::leader_offsets(&outputs, &opts.output, -1).await?;
    let coordinator = admin.coordinator(&opts.group, 0).await?;
    let mut group_coordinator = Client::connect(coordinator).await?;
    let (generation, member_id) = group::join_alone(
        &mut group_coordinator,
        &opts.group,
        &opts.input,
        opts.partitions,
        SESSION_TIMEOUT_MS,
    )
    .await?;
    // A stable transactional id per group, as a restarted processor reuses its own:
    // it fences whatever an earlier run left open.
    let txn = Txn::init(opts.bootstrap, format!("sluice-bench-ctp-{}", opts.group)).await?;
    let stats = Stats::new(progress);
    let version = admin.version(ApiKey::Produce)?;
    let mut conns = HashMap::new();
    for (_, addr) in &outputs {
        if !conns.contains_key(addr) {
            let c = ProducerConn::open(
                *addr,
                version,
                opts.max_in_flight,
                stats.clone(),
                -1,
                Some(txn.id()),
            )
            .await?;
            conns.insert(*addr, c);
        }
    }
    let fetchers = fetchers(&inputs).await?;
    let positions: BTreeMap<i32, i64> = starts.iter().map(|(p, o)| (*p, *o)).collect();
    let builder = BatchBuilder::new(opts.record_size);
    let mut proc = Processor {
        meta: GroupMeta {
            group: opts.group.clone(),
            generation,
            member_id,
        },
        records_per_batch: builder.records_per_batch(opts.batch_bytes),
        builder,
        opts,
        txn,
        group_coordinator,
        committed: positions.clone(),
        positions,
        ends,
        output_leaders: outputs.iter().copied().collect(),
        conns,
        next_seq: HashMap::new(),
        stats: stats.clone(),
        input_records: 0,
        uncommitted: Vec::new(),
        fetch_to_commit_us: load::histogram(),
        last_heartbeat: Instant::now(),
    };
    let interval = Duration::from_millis(proc.opts.commit_interval_ms);
    let start = Instant::now();
    let mut pending: Vec<Pending> = fetchers
        .into_iter()
        .filter_map(|f| proc.prefetch(f))
        .collect();
    loop {
        for fetch in std::mem::take(&mut pending) {
            let (fetcher, resp) = fetch.await?;
            let fetched_us = load::now_us();
            let input = proc.take(&resp)?;
            pending.extend(proc.prefetch(fetcher));
            proc.produce(input, fetched_us).await?;
        }
        let done = proc.done();
        if proc.positions != proc.committed && (done || proc.txn.due(interval)) {
            proc.commit().await?;
        }
        if done && proc.positions == proc.committed {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let m = &proc.meta;
    group::leave(&mut proc.group_coordinator, &m.group, &m.member_id).await?;
    let processed = proc.input_records;
    let output = count_committed(&proc.opts.output, &outputs, &output_starts).await?;
    if output != processed || stats.acked.get() != processed {
        return Err(err(format!(
            "exactly-once check failed: {processed} input records processed, {output} in the committed output"
        )));
    }
    println!(
        "exactly-once check: {processed} input records, {output} committed output records (read_committed)"
    );
    let e2e = Some(proc.fetch_to_commit_us.clone());
    Ok(stats.outcome(proc.opts.record_size, seconds, e2e, output))
}
