//! The load generator: open-loop producers, a consumer and an end-to-end run, against
//! any Kafka-protocol broker.
//!
//! Open loop: with `--rate`, record *i* of a producer is due at `start + i / rate`; its
//! latency runs from that due time, not from when it was actually sent, so a stalled
//! broker shows up as latency instead of silently slowing the generator (coordinated
//! omission corrected). Without `--rate` the producers run closed-loop as fast as their
//! in-flight window allows, and latency runs from the moment a record was generated.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use event_listener::Event;
use futures_lite::io::{split, ReadHalf, WriteHalf};
use futures_lite::AsyncWriteExt;
use hdrhistogram::Histogram;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, ProduceRequest, TransactionalId};
use sluice_client::aio::Stream;

use crate::kafka::{self, err, BatchBuilder, Client};
use crate::txn::{self, Txn};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum Keys {
    None,
    Uniform,
    Zipf,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ProduceOpts {
    pub bootstrap: SocketAddr,
    pub topic: String,
    pub partitions: i32,
    pub replication: i16,
    pub record_size: usize,
    pub records: Option<u64>,
    pub duration_s: Option<f64>,
    pub rate: Option<f64>,
    pub batch_bytes: usize,
    pub linger_ms: f64,
    pub acks: i16,
    pub keys: Keys,
    pub key_space: u64,
    pub producers: usize,
    pub max_in_flight: usize,
    /// Sequenced batches of a producer id from InitProducerId.
    pub idempotent: bool,
    /// Sequenced batches inside transactions of a transactional id per producer,
    /// committed every `commit_interval_ms`.
    pub transactional: bool,
    pub commit_interval_ms: u64,
    /// Topic configs (name, value) sent with CreateTopics when the run creates its
    /// topic (e.g. retention.bytes and segment.bytes to bound a soak's disk).
    pub topic_configs: Vec<(String, String)>,
}

/// What a run measured.
pub struct Outcome {
    pub records: u64,
    pub bytes: u64,
    pub errors: u64,
    pub seconds: f64,
    pub produce_latency_us: Histogram<u64>,
    pub e2e_latency_us: Option<Histogram<u64>>,
    /// Transactional runs, per commit: flush of the transaction's produce requests
    /// plus EndTxn (what a client's commitTransaction() waits for), and for `ctp` the
    /// offsets sent to the transaction before them.
    pub commit_latency_us: Option<Histogram<u64>>,
    pub consumed: u64,
    /// Rows over time (`e2e --sample-secs`); empty otherwise.
    pub samples: Vec<crate::sample::Row>,
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Shared counters of a run, updated by every task on the executor.
pub struct Stats {
    pub acked: Cell<u64>,
    pub errors: Cell<u64>,
    pub latency: RefCell<Histogram<u64>>,
    pub commit_latency: RefCell<Histogram<u64>>,
    pub first_error: RefCell<Option<String>>,
    pub progress: Option<indicatif::ProgressBar>,
}

impl Stats {
    pub fn new(progress: Option<indicatif::ProgressBar>) -> Rc<Stats> {
        Rc::new(Stats {
            acked: Cell::new(0),
            errors: Cell::new(0),
            latency: RefCell::new(histogram()),
            commit_latency: RefCell::new(histogram()),
            first_error: RefCell::new(None),
            progress,
        })
    }

    /// What the producers measured, as a run's outcome.
    pub fn outcome(
        &self,
        record_size: usize,
        seconds: f64,
        e2e: Option<Histogram<u64>>,
        consumed: u64,
    ) -> Outcome {
        let records = self.acked.get();
        let commits = self.commit_latency.borrow();
        Outcome {
            records,
            bytes: records * record_size as u64,
            errors: self.errors.get(),
            seconds,
            produce_latency_us: self.latency.borrow().clone(),
            e2e_latency_us: e2e,
            commit_latency_us: (!commits.is_empty()).then(|| commits.clone()),
            consumed,
            samples: Vec::new(),
        }
    }

    fn error(&self, msg: String) {
        self.errors.set(self.errors.get() + 1);
        let mut first = self.first_error.borrow_mut();
        if first.is_none() {
            *first = Some(msg);
        }
    }
}

/// Batches of one Produce request per topic: (topic, [(partition, records, due times
/// of its records)]).
pub type TopicBatches<'a> = Vec<(&'a str, Vec<(i32, Bytes, Vec<u64>)>)>;

/// A request in flight: per batch (partition, due times of its records).
struct InFlight {
    batches: Vec<Vec<u64>>,
}

/// One producer connection: a writer, and a reader task that matches responses (which
/// Kafka returns in request order) to the requests in flight.
pub struct ProducerConn {
    writer: RefCell<Option<WriteHalf<Stream>>>,
    inflight: RefCell<VecDeque<InFlight>>,
    window: Event,
    max_in_flight: usize,
    next_correlation: Cell<i32>,
    version: i16,
    /// A transactional producer's id, which its produce requests must carry.
    transactional_id: Option<TransactionalId>,
    pub closed: Cell<bool>,
}

impl ProducerConn {
    pub async fn open(
        addr: SocketAddr,
        version: i16,
        max_in_flight: usize,
        stats: Rc<Stats>,
        acks: i16,
        transactional_id: Option<&str>,
    ) -> io::Result<Rc<ProducerConn>> {
        // TLS when `--command-config` asks for SSL (the process's peer configuration).
        let stream = sluice_client::aio::connect_stream(addr, None, None)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        let (reader, writer) = split(stream);
        let conn = Rc::new(ProducerConn {
            writer: RefCell::new(Some(writer)),
            inflight: RefCell::new(VecDeque::new()),
            window: Event::new(),
            max_in_flight,
            next_correlation: Cell::new(1),
            version,
            transactional_id: transactional_id.map(|t| TransactionalId(sluice_client::sbs(t))),
            closed: Cell::new(false),
        });
        if acks != 0 {
            glommio::spawn_local(read_produce_responses(conn.clone(), reader, stats)).detach();
        }
        Ok(conn)
    }

    pub async fn wait_window(&self) {
        while self.inflight.borrow().len() >= self.max_in_flight && !self.closed.get() {
            let l = self.window.listen();
            if self.inflight.borrow().len() < self.max_in_flight || self.closed.get() {
                break;
            }
            l.await;
        }
    }

    /// Waits (up to `timeout`) until every request in flight is answered; returns
    /// whether they all were.
    pub async fn wait_drained(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.inflight.borrow().is_empty() && !self.closed.get() && Instant::now() < deadline
        {
            let l = self.window.listen();
            if self.inflight.borrow().is_empty() {
                break;
            }
            futures_lite::future::or(l, glommio::timer::sleep(Duration::from_millis(50))).await;
        }
        self.inflight.borrow().is_empty()
    }

    pub async fn send(
        &self,
        topic: &str,
        acks: i16,
        batches: Vec<(i32, Bytes, Vec<u64>)>,
    ) -> io::Result<()> {
        self.send_topics(acks, vec![(topic, batches)]).await
    }

    /// One Produce request with batches of several topics: per topic, (partition,
    /// records, due times of its records).
    pub async fn send_topics(&self, acks: i16, topics: TopicBatches<'_>) -> io::Result<()> {
        let mut due = Vec::new();
        let mut topic_data = Vec::with_capacity(topics.len());
        for (topic, batches) in topics {
            let mut data = TopicProduceData::default();
            data.name = kafka::topic_name(topic);
            for (partition, records, times) in batches {
                let mut p = PartitionProduceData::default();
                p.index = partition;
                p.records = Some(records);
                data.partition_data.push(p);
                due.push(times);
            }
            topic_data.push(data);
        }
        let mut req = ProduceRequest::default();
        req.acks = acks;
        req.timeout_ms = 30_000;
        req.transactional_id = self.transactional_id.clone();
        req.topic_data = topic_data;
        let corr = self.next_correlation.get();
        self.next_correlation.set(corr + 1);
        let frame = sluice_client::encode_request(kafka::CLIENT_ID, corr, self.version, &req)?;
        if acks != 0 {
            self.inflight
                .borrow_mut()
                .push_back(InFlight { batches: due });
        }
        let mut w = self
            .writer
            .borrow_mut()
            .take()
            .ok_or_else(|| err("connection closed"))?;
        // The flush sends TLS records a full socket left in the session (a no-op for
        // a plain socket).
        let res = match w.write_all(&frame).await {
            Ok(()) => w.flush().await,
            Err(e) => Err(e),
        };
        *self.writer.borrow_mut() = Some(w);
        res
    }
}

/// Longest a commit waits for its transaction's produce requests to be answered.
const FLUSH_MAX: Duration = Duration::from_secs(30);

/// Commits `txn` as a client's commitTransaction() does: waits until every produce
/// request in flight on `conns` is answered (EndTxn must not overtake the batches it
/// commits, and a transaction with a failed produce must not commit at all), then
/// EndTxn. Records the time since the caller began the commit, `start`, in
/// `stats.commit_latency`.
pub async fn flush_and_commit<'a>(
    txn: &mut Txn,
    conns: impl IntoIterator<Item = &'a Rc<ProducerConn>>,
    stats: &Stats,
    start: Instant,
) -> io::Result<()> {
    for c in conns {
        if !c.wait_drained(FLUSH_MAX).await {
            return Err(err(
                "a transaction's produce requests were not all answered",
            ));
        }
    }
    if let Some(e) = stats.first_error.borrow().as_ref() {
        return Err(err(format!("not committing a transaction after: {e}")));
    }
    txn.commit().await?;
    let us = start.elapsed().as_micros() as u64;
    stats.commit_latency.borrow_mut().record(us.max(1)).ok();
    Ok(())
}

async fn read_produce_responses(
    conn: Rc<ProducerConn>,
    mut reader: ReadHalf<Stream>,
    stats: Rc<Stats>,
) {
    loop {
        let frame = match sluice_client::frame::read_frame(&mut reader).await {
            Ok(f) => f,
            Err(e) => {
                if !conn.inflight.borrow().is_empty() {
                    stats.error(format!("produce connection: {e}"));
                }
                break;
            }
        };
        let ack = now_us();
        let Some(entry) = conn.inflight.borrow_mut().pop_front() else {
            stats.error("response without a request".into());
            break;
        };
        let resp = match sluice_client::decode_response::<ProduceRequest>(conn.version, frame) {
            Ok((_, r)) => r,
            Err(e) => {
                stats.error(format!("produce response: {e}"));
                break;
            }
        };
        let mut failed_partitions = Vec::new();
        for t in &resp.responses {
            for p in &t.partition_responses {
                if p.error_code != 0 {
                    failed_partitions.push((p.index, p.error_code));
                }
            }
        }
        let mut acked = 0u64;
        {
            let mut h = stats.latency.borrow_mut();
            for times in &entry.batches {
                for &t in times {
                    h.record(ack.saturating_sub(t).max(1)).ok();
                }
                acked += times.len() as u64;
            }
        }
        if failed_partitions.is_empty() {
            stats.acked.set(stats.acked.get() + acked);
            if let Some(p) = &stats.progress {
                p.inc(acked);
            }
        } else {
            stats.error(format!(
                "produce errors (partition, code): {failed_partitions:?}"
            ));
        }
        conn.window.notify(usize::MAX);
    }
    conn.closed.set(true);
    conn.window.notify(usize::MAX);
}

/// Zipf(1.0)-distributed keys over `n`, by inverse-CDF sampling on a precomputed table.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64) -> Zipf {
        let n = n.clamp(1, 1_000_000) as usize;
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += 1.0 / k as f64;
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }

    fn sample(&self, u: f64) -> u64 {
        self.cdf.partition_point(|c| *c < u) as u64
    }
}

/// xorshift64*: a fast, seedable generator for keys.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One producer: its own connection to each leader, accumulators per partition.
async fn producer(
    id: usize,
    opts: Rc<ProduceOpts>,
    leaders: Rc<Vec<(i32, SocketAddr)>>,
    version: i16,
    stats: Rc<Stats>,
) -> io::Result<u64> {
    // A transactional producer's coordinator side, and the commit interval.
    let mut txn = match opts.transactional {
        true => Some(Txn::init(opts.bootstrap, txn::unique_id("sluice-bench")).await?),
        false => None,
    };
    let mut conns: HashMap<SocketAddr, Rc<ProducerConn>> = HashMap::new();
    for (_, addr) in leaders.iter() {
        if !conns.contains_key(addr) {
            let c = ProducerConn::open(
                *addr,
                version,
                opts.max_in_flight,
                stats.clone(),
                opts.acks,
                txn.as_ref().map(Txn::id),
            )
            .await?;
            conns.insert(*addr, c);
        }
    }
    let n_parts = leaders.len();
    let commit_interval = Duration::from_millis(opts.commit_interval_ms);
    // An idempotent or transactional producer's id and epoch, and the next sequence
    // per partition.
    let producer = match &txn {
        Some(t) => Some((t.producer_id, t.epoch)),
        None if opts.idempotent => Some(
            Client::connect(opts.bootstrap)
                .await?
                .init_producer_id(None)
                .await?,
        ),
        None => None,
    };
    let mut next_seq = vec![0i32; n_parts];
    let builder = BatchBuilder::new(opts.record_size);
    let records_per_batch = builder.records_per_batch(opts.batch_bytes);
    let total = opts
        .records
        .map(|r| r / opts.producers as u64 + u64::from((id as u64) < r % opts.producers as u64));
    let rate = opts.rate.map(|r| r / opts.producers as f64);
    // The schedule starts once the connections are open, and a record's due time and
    // the moment it becomes due come from the same reading of the clock. (The due times
    // used to start only here while records fell due from before the connections
    // opened: every latency was understated by that setup time, most with RF=3's three
    // leaders, and the run began with the records due meanwhile in one burst.)
    let (start, start_us) = (Instant::now(), now_us());
    let deadline = opts.duration_s.map(|d| start + Duration::from_secs_f64(d));
    let zipf = (opts.keys == Keys::Zipf).then(|| Zipf::new(opts.key_space));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let mut acc: Vec<(Vec<u64>, Vec<u64>)> =
        (0..n_parts).map(|_| (Vec::new(), Vec::new())).collect();
    let mut generated = 0u64;
    let mut round_robin = id % n_parts;
    let linger_us = (opts.linger_ms * 1000.0) as u64;
    loop {
        let now = Instant::now();
        let finished = total.is_some_and(|t| generated >= t) || deadline.is_some_and(|d| now >= d);
        // How many records are due by now.
        let due = match rate {
            Some(r) => ((now - start).as_secs_f64() * r) as u64,
            None => generated + (records_per_batch * n_parts) as u64,
        };
        let due = total.map_or(due, |t| due.min(t));
        let mut ready: Vec<usize> = Vec::new();
        if !finished {
            let gen_time = now_us();
            while generated < due {
                let key = match opts.keys {
                    Keys::None => None,
                    Keys::Uniform => Some(rng.next() % opts.key_space.max(1)),
                    Keys::Zipf => Some(zipf.as_ref().expect("zipf").sample(rng.unit())),
                };
                let p = match key {
                    Some(k) => kafka::murmur2_partition(&k.to_be_bytes(), n_parts as i32) as usize,
                    None => {
                        // Sticky per batch, like the Java and librdkafka partitioners.
                        if acc[round_robin].0.len() >= records_per_batch {
                            round_robin = (round_robin + 1) % n_parts;
                        }
                        round_robin
                    }
                };
                let t = match rate {
                    Some(r) => start_us + (generated as f64 * 1e6 / r) as u64,
                    None => gen_time,
                };
                acc[p].0.push(t);
                if let Some(k) = key {
                    acc[p].1.push(k);
                }
                if acc[p].0.len() >= records_per_batch {
                    ready.push(p);
                }
                generated += 1;
            }
        }
        // Linger: send partial batches whose oldest record waited long enough, and
        // everything at the end.
        let now_u = now_us();
        for (p, (times, _)) in acc.iter().enumerate() {
            if !times.is_empty()
                && (finished || now_u.saturating_sub(times[0]) >= linger_us)
                && !ready.contains(&p)
            {
                ready.push(p);
            }
        }
        if !ready.is_empty() {
            let mut by_conn: HashMap<SocketAddr, Vec<(i32, Bytes, Vec<u64>)>> = HashMap::new();
            for p in ready {
                let (times, keys) = std::mem::take(&mut acc[p]);
                if times.is_empty() {
                    continue;
                }
                for chunk_start in (0..times.len()).step_by(records_per_batch) {
                    let end = (chunk_start + records_per_batch).min(times.len());
                    let k = (!keys.is_empty()).then(|| &keys[chunk_start..end]);
                    let mut batch = builder.build(&times[chunk_start..end], k);
                    if let Some((pid, epoch)) = producer {
                        batch = kafka::sequenced(&batch, pid, epoch, next_seq[p], txn.is_some());
                        next_seq[p] = next_seq[p].wrapping_add((end - chunk_start) as i32);
                    }
                    let (partition, addr) = leaders[p];
                    by_conn.entry(addr).or_default().push((
                        partition,
                        batch,
                        times[chunk_start..end].to_vec(),
                    ));
                }
            }
            if let Some(t) = txn.as_mut() {
                let added = by_conn
                    .values()
                    .flatten()
                    .map(|(partition, _, _)| *partition);
                t.add_partitions(&opts.topic, added).await?;
            }
            for (addr, batches) in by_conn {
                let conn = &conns[&addr];
                for request in split_by_bytes(batches, REQUEST_BYTES_MAX) {
                    conn.wait_window().await;
                    if conn.closed.get() {
                        return Err(err("producer connection closed by the broker"));
                    }
                    conn.send(&opts.topic, opts.acks, request).await?;
                }
            }
        }
        if let Some(t) = txn.as_mut() {
            if t.due(commit_interval) || (finished && t.is_open()) {
                flush_and_commit(t, conns.values(), &stats, Instant::now()).await?;
            }
        }
        if finished {
            break;
        }
        match rate {
            // Sleep until about a batch is due (bounded by the linger time).
            Some(r) => {
                let until_batch =
                    (records_per_batch as f64 / r).min(opts.linger_ms.max(0.2) / 1000.0);
                glommio::timer::sleep(Duration::from_secs_f64(until_batch.clamp(0.0002, 0.005)))
                    .await;
            }
            None => glommio::yield_if_needed().await,
        }
    }
    if opts.acks == 0 {
        stats.acked.set(stats.acked.get() + generated);
    }
    for c in conns.values() {
        c.wait_drained(Duration::from_secs(60)).await;
    }
    Ok(generated)
}

/// The most record bytes one Produce request carries (a client's max.request.size,
/// 1 MiB by default). After the generator stalled (a busy machine), the records due at
/// once at a fixed rate could otherwise fill one request past the broker's
/// socket.request.max.bytes (100 MiB), and the broker closes such a connection.
const REQUEST_BYTES_MAX: usize = 1 << 20;

/// `batches` in order, split into requests of at most `max` record bytes (a batch
/// larger than that alone).
fn split_by_bytes(
    batches: Vec<(i32, Bytes, Vec<u64>)>,
    max: usize,
) -> Vec<Vec<(i32, Bytes, Vec<u64>)>> {
    let mut out: Vec<Vec<(i32, Bytes, Vec<u64>)>> = Vec::new();
    let mut bytes = 0;
    for b in batches {
        match out.last_mut() {
            Some(last) if bytes + b.1.len() <= max => {
                bytes += b.1.len();
                last.push(b);
            }
            _ => {
                bytes = b.1.len();
                out.push(vec![b]);
            }
        }
    }
    out
}

/// Sets up the topic and returns a client, the partition leaders and the Produce version.
async fn setup(opts: &ProduceOpts) -> io::Result<(Client, Rc<Vec<(i32, SocketAddr)>>, i16)> {
    let mut client = Client::connect(opts.bootstrap).await?;
    client
        .create_topic_with(
            &opts.topic,
            opts.partitions,
            opts.replication,
            &opts.topic_configs,
        )
        .await?;
    let leaders = client.leaders(&opts.topic).await?;
    if leaders.is_empty() {
        return Err(err("topic has no partitions"));
    }
    let version = client.version(ApiKey::Produce)?;
    Ok((client, Rc::new(leaders), version))
}

async fn run_producers(
    opts: Rc<ProduceOpts>,
    leaders: Rc<Vec<(i32, SocketAddr)>>,
    version: i16,
    stats: Rc<Stats>,
) -> io::Result<f64> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..opts.producers {
        tasks.push(glommio::spawn_local(producer(
            id,
            opts.clone(),
            leaders.clone(),
            version,
            stats.clone(),
        )));
    }
    for t in tasks {
        t.await?;
    }
    Ok(start.elapsed().as_secs_f64())
}

pub async fn produce(
    opts: ProduceOpts,
    progress: Option<indicatif::ProgressBar>,
) -> io::Result<Outcome> {
    let (_client, leaders, version) = setup(&opts).await?;
    let stats = Stats::new(progress);
    let opts = Rc::new(opts);
    let seconds = run_producers(opts.clone(), leaders, version, stats.clone()).await?;
    if let Some(e) = stats.first_error.borrow().as_ref() {
        eprintln!("first error: {e}");
    }
    Ok(stats.outcome(opts.record_size, seconds, None, 0))
}

/// Fetch isolation levels.
pub const READ_UNCOMMITTED: i8 = 0;
pub const READ_COMMITTED: i8 = 1;

/// A consumer's Fetch of `topic` at `offsets` (partition, next offset), long-polling
/// up to 100 ms for data, at most `partition_max_bytes` per partition.
pub fn fetch_request(
    topic: &str,
    offsets: impl IntoIterator<Item = (i32, i64)>,
    isolation_level: i8,
    partition_max_bytes: i32,
) -> FetchRequest {
    let mut t = FetchTopic::default();
    t.topic = kafka::topic_name(topic);
    t.partitions = offsets
        .into_iter()
        .map(|(p, o)| {
            let mut fp = FetchPartition::default();
            fp.partition = p;
            fp.fetch_offset = o;
            fp.current_leader_epoch = -1;
            fp.log_start_offset = -1;
            fp.last_fetched_epoch = -1;
            fp.partition_max_bytes = partition_max_bytes;
            fp
        })
        .collect();
    let mut req = FetchRequest::default();
    req.replica_id = BrokerId(-1);
    req.max_wait_ms = 100;
    req.min_bytes = 1;
    req.max_bytes = 64 << 20;
    req.isolation_level = isolation_level;
    req.session_epoch = -1;
    req.topics = vec![t];
    req
}

/// A fetched partition's records, or its error. The bench's producers never abort a
/// transaction, so a read_committed answer naming aborted transactions means data the
/// bench would count although no consumer may see it: that fails the run rather than
/// being filtered.
pub fn fetched_records(p: &PartitionData) -> io::Result<Option<&Bytes>> {
    if p.error_code != 0 {
        return Err(err(format!(
            "fetch partition {}: {}",
            p.partition_index,
            sluice_client::error_name(p.error_code)
        )));
    }
    if p.aborted_transactions
        .as_ref()
        .is_some_and(|a| !a.is_empty())
    {
        return Err(err(format!(
            "fetch partition {}: aborted transactions {:?} in a run that aborts none",
            p.partition_index, p.aborted_transactions
        )));
    }
    Ok(p.records.as_ref())
}

/// What a fetch loop reads: partitions of `topic` from `offsets` (partition, first
/// offset) up to `ends` if given, at `isolation_level`.
pub struct Reading {
    pub topic: String,
    pub offsets: HashMap<i32, i64>,
    pub ends: Option<HashMap<i32, i64>>,
    pub isolation_level: i8,
}

/// Fetches `reading` from `addr` until every partition reaches its end (or, without
/// ends, until `stop` is set). Returns records and bytes.
pub async fn fetch_loop(
    addr: SocketAddr,
    reading: Reading,
    stop: Rc<Cell<bool>>,
    e2e: Option<Rc<RefCell<Histogram<u64>>>>,
    progress: Option<indicatif::ProgressBar>,
) -> io::Result<(u64, u64)> {
    let Reading {
        topic,
        mut offsets,
        ends,
        isolation_level,
    } = reading;
    let mut client = Client::connect(addr).await?;
    let version = client.version(ApiKey::Fetch)?;
    let mut records = 0u64;
    let mut bytes = 0u64;
    let mut times = Vec::new();
    loop {
        if let Some(ends) = &ends {
            if offsets.iter().all(|(p, o)| *o >= ends[p]) {
                break;
            }
        }
        if stop.get() {
            break;
        }
        let due = offsets
            .iter()
            .filter(|(p, o)| ends.as_ref().is_none_or(|e| **o < e[p]))
            .map(|(p, o)| (*p, *o));
        let req = fetch_request(&topic, due, isolation_level, 8 << 20);
        let resp = client.request(&req, version).await?;
        if resp.error_code != 0 {
            return Err(err(format!("fetch error {}", resp.error_code)));
        }
        let arrived = now_us();
        for t in resp.responses {
            for p in t.partitions {
                let Some(recs) = fetched_records(&p)? else {
                    continue;
                };
                times.clear();
                let (n, b, next) = kafka::walk_batches(recs, e2e.is_some(), &mut times);
                records += n;
                bytes += b;
                if let Some(pb) = &progress {
                    pb.inc(n);
                }
                if next > 0 {
                    offsets.insert(p.partition_index, next);
                }
                if let Some(h) = &e2e {
                    let mut h = h.borrow_mut();
                    for &t in &times {
                        h.record(arrived.saturating_sub(t).max(1)).ok();
                    }
                }
            }
        }
    }
    Ok((records, bytes))
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ConsumeOpts {
    pub bootstrap: SocketAddr,
    pub topic: String,
    pub record_size: usize,
}

/// The partitions of `leaders` (partition, leader) grouped by leader.
pub fn by_leader(leaders: &[(i32, SocketAddr)]) -> HashMap<SocketAddr, Vec<i32>> {
    let mut by_addr: HashMap<SocketAddr, Vec<i32>> = HashMap::new();
    for (p, a) in leaders {
        by_addr.entry(*a).or_default().push(*p);
    }
    by_addr
}

/// The offset at `timestamp` (-1 latest, -2 earliest) of every partition of `topic`
/// in `leaders`, each asked of its leader: a broker answers ListOffsets only for the
/// partitions it leads.
pub async fn leader_offsets(
    leaders: &[(i32, SocketAddr)],
    topic: &str,
    timestamp: i64,
) -> io::Result<HashMap<i32, i64>> {
    let mut out = HashMap::new();
    for (addr, parts) in by_leader(leaders) {
        let mut client = Client::connect(addr).await?;
        // A leader just elected answers OFFSET_NOT_AVAILABLE (78, retriable) until its
        // high watermark reaches its epoch's start: ask again for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        let offsets = loop {
            match client.list_offsets(topic, &parts, timestamp).await {
                Err(e) if e.to_string().ends_with("error 78") && Instant::now() < deadline => {
                    glommio::timer::sleep(Duration::from_millis(50)).await;
                }
                r => break r?,
            }
        };
        out.extend(offsets);
    }
    Ok(out)
}

/// The earliest and the latest offset of every partition of `topic` in `leaders`; the
/// progress bar's length becomes the offsets between them (records, for a topic of
/// plain batches).
pub async fn offset_range(
    leaders: &[(i32, SocketAddr)],
    topic: &str,
    progress: Option<&indicatif::ProgressBar>,
) -> io::Result<(HashMap<i32, i64>, HashMap<i32, i64>)> {
    let starts = leader_offsets(leaders, topic, -2).await?;
    let ends = leader_offsets(leaders, topic, -1).await?;
    if let Some(pb) = progress {
        pb.set_length(
            leaders
                .iter()
                .map(|(p, _)| (ends[p] - starts[p]).max(0) as u64)
                .sum(),
        );
    }
    Ok((starts, ends))
}

/// Reads the whole topic from its earliest offsets to the end offsets it had at start.
pub async fn consume(
    opts: ConsumeOpts,
    progress: Option<indicatif::ProgressBar>,
) -> io::Result<Outcome> {
    let mut client = Client::connect(opts.bootstrap).await?;
    let leaders = client.leaders(&opts.topic).await?;
    let (starts, ends) = offset_range(&leaders, &opts.topic, progress.as_ref()).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    let stop = Rc::new(Cell::new(false));
    for (addr, ps) in by_leader(&leaders) {
        let offs: HashMap<i32, i64> = ps.iter().map(|p| (*p, starts[p])).collect();
        let e: HashMap<i32, i64> = ps.iter().map(|p| (*p, ends[p])).collect();
        let reading = Reading {
            topic: opts.topic.clone(),
            offsets: offs,
            ends: Some(e),
            isolation_level: READ_UNCOMMITTED,
        };
        tasks.push(glommio::spawn_local(fetch_loop(
            addr,
            reading,
            stop.clone(),
            None,
            progress.clone(),
        )));
    }
    let (mut records, mut bytes) = (0, 0);
    for t in tasks {
        let (r, b) = t.await?;
        records += r;
        bytes += b;
    }
    let seconds = start.elapsed().as_secs_f64();
    let _ = bytes;
    Ok(Outcome {
        records,
        bytes: records * opts.record_size as u64,
        errors: 0,
        seconds,
        produce_latency_us: histogram(),
        e2e_latency_us: None,
        commit_latency_us: None,
        consumed: records,
        samples: Vec::new(),
    })
}

/// Produces (open loop if `--rate`) while a consumer reads from the end; end-to-end
/// latency is consume time minus each record's due time (carried in its value). With
/// `sampling`, also a row per interval (crate::sample) in the outcome's `samples`.
pub async fn e2e(
    opts: ProduceOpts,
    progress: Option<indicatif::ProgressBar>,
    sampling: Option<crate::sample::SampleOpts>,
) -> io::Result<Outcome> {
    if opts.record_size < 8 {
        return Err(err(
            "e2e needs --record-size of at least 8 bytes (the send time)",
        ));
    }
    let (_client, leaders, version) = setup(&opts).await?;
    let starts = leader_offsets(&leaders, &opts.topic, -1).await?;
    let stats = Stats::new(progress);
    let e2e_hist = Rc::new(RefCell::new(histogram()));
    let stop = Rc::new(Cell::new(false));
    let mut consumers = Vec::new();
    for (addr, ps) in by_leader(&leaders) {
        let offs: HashMap<i32, i64> = ps.iter().map(|p| (*p, starts[p])).collect();
        let reading = Reading {
            topic: opts.topic.clone(),
            offsets: offs,
            ends: None,
            isolation_level: READ_UNCOMMITTED,
        };
        consumers.push(glommio::spawn_local(fetch_loop(
            addr,
            reading,
            stop.clone(),
            Some(e2e_hist.clone()),
            None,
        )));
    }
    let opts = Rc::new(opts);
    let sample_stop = Rc::new(Cell::new(false));
    let sampler = sampling.map(|s| {
        let start = Instant::now();
        let watcher = crate::sample::Watcher::start(&s, start, opts.duration_s);
        let rows = glommio::spawn_local(crate::sample::sample_loop(
            s.every_s,
            start,
            opts.duration_s,
            stats.clone(),
            e2e_hist.clone(),
            sample_stop.clone(),
        ));
        (watcher, rows)
    });
    let seconds = run_producers(opts.clone(), leaders, version, stats.clone()).await?;
    sample_stop.set(true);
    let samples = match sampler {
        Some((watcher, rows)) => {
            let rows = rows.await;
            crate::sample::join(rows, watcher.finish())
        }
        None => Vec::new(),
    };
    // Let the consumer catch up with what was acknowledged (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    while (e2e_hist.borrow().len()) < stats.acked.get() && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
    stop.set(true);
    let mut consumed = 0;
    for c in consumers {
        consumed += c.await?.0;
    }
    let e2e_latency = e2e_hist.borrow().clone();
    let mut out = stats.outcome(opts.record_size, seconds, Some(e2e_latency), consumed);
    out.samples = samples;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_stay_within_the_byte_limit_and_keep_every_batch_in_order() {
        let batch = |p: i32, n: usize| (p, Bytes::from(vec![0u8; n]), vec![p as u64]);
        let batches = vec![
            batch(0, 400),
            batch(1, 400),
            batch(2, 300),
            batch(3, 2000),
            batch(4, 1),
        ];
        let requests = split_by_bytes(batches, 1000);
        let sizes: Vec<Vec<usize>> = requests
            .iter()
            .map(|r| r.iter().map(|b| b.1.len()).collect())
            .collect();
        // A batch over the limit goes alone; nothing is dropped or reordered.
        assert_eq!(sizes, vec![vec![400, 400], vec![300], vec![2000], vec![1]]);
        let order: Vec<i32> = requests.iter().flatten().map(|b| b.0).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
        assert!(split_by_bytes(Vec::new(), 1000).is_empty());
    }
}
