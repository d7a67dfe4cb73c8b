//! `sluice-bench scale`: many partitions at once (issue 14's benchmark).
//!
//! The run works on `--topics` topics named `<prefix>-<i>` of `--partitions` each and
//! does the phases asked for, in order:
//! - `create`: one CreateTopics request for all of them; then the time until the
//!   Metadata lists every partition with a leader (and, above replication factor 1,
//!   with every replica in sync);
//! - `one`: one record to every partition (acks as given), one Produce request per
//!   leader and chunk of partitions: the time until all are acknowledged;
//! - `sustain`: open-loop produce at `--rate` records/s spread evenly over every
//!   partition (round robin, a request per leader every millisecond, as a client with
//!   `linger.ms=1` sends), with produce-ack latency from each record's due time;
//! - `verify`: waits (bounded by `--timeout`) until every partition has a leader
//!   (other than `--avoid-leader`), `--want-isr` in-sync replicas, and answers
//!   ListOffsets at its leader with a log end of at least `--min-offset`. Measured from
//!   `--since-unix-ms` (the script passes a broker's start time: restart to serving).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, ListOffsetsRequest, MetadataRequest, ProduceRequest,
};
use serde::Serialize;

use crate::kafka::{err, topic_name, BatchBuilder, Client};
use crate::load::{self, ProducerConn, Stats, TopicBatches};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum Phase {
    Create,
    One,
    Sustain,
    Verify,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScaleOpts {
    pub bootstrap: SocketAddr,
    pub prefix: String,
    pub topics: usize,
    pub partitions: i32,
    pub replication: i16,
    pub phases: Vec<Phase>,
    pub record_size: usize,
    pub rate: f64,
    pub duration_s: f64,
    pub acks: i16,
    pub max_in_flight: usize,
    pub avoid_leader: Option<i32>,
    pub want_isr: usize,
    pub min_offset: i64,
    pub since_unix_ms: Option<u64>,
    pub timeout_s: f64,
}

/// What a run measured; a phase not run leaves its fields out.
#[derive(Debug, Default, Serialize)]
pub struct ScaleResult {
    pub partitions: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_request_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_to_leaders_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_to_in_sync_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_record_each_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sustain: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify_ms: Option<f64>,
    /// Leaders per broker when the run ended.
    pub leaders_per_broker: HashMap<i32, usize>,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// One partition as the Metadata shows it.
#[derive(Clone)]
struct Part {
    topic: Rc<str>,
    partition: i32,
    leader: i32,
    isr: usize,
}

/// Every partition of the run's topics and the brokers' addresses.
struct Layout {
    parts: Vec<Part>,
    brokers: HashMap<i32, SocketAddr>,
}

impl Layout {
    /// Whether every partition of every topic is listed with a live leader (not
    /// `avoid`) and at least `want_isr` in-sync replicas.
    fn ready(&self, opts: &ScaleOpts) -> Result<(), String> {
        let want = opts.topics * opts.partitions as usize;
        if self.parts.len() != want {
            return Err(format!("{} of {want} partitions listed", self.parts.len()));
        }
        let short = self
            .parts
            .iter()
            .filter(|p| {
                !self.brokers.contains_key(&p.leader)
                    || Some(p.leader) == opts.avoid_leader
                    || p.isr < opts.want_isr
            })
            .count();
        match short {
            0 => Ok(()),
            n => Err(format!("{n} partitions without a leader or a full ISR")),
        }
    }

    fn by_leader(&self) -> HashMap<i32, Vec<usize>> {
        let mut out: HashMap<i32, Vec<usize>> = HashMap::new();
        for (i, p) in self.parts.iter().enumerate() {
            out.entry(p.leader).or_default().push(i);
        }
        out
    }
}

fn topic_names(opts: &ScaleOpts) -> Vec<String> {
    (0..opts.topics)
        .map(|i| format!("{}-{i}", opts.prefix))
        .collect()
}

async fn layout(client: &mut Client, names: &[String]) -> io::Result<Layout> {
    let v = client.version(ApiKey::Metadata)?;
    let mut req = MetadataRequest::default();
    req.topics = Some(
        names
            .iter()
            .map(|n| {
                let mut t =
                    kafka_protocol::messages::metadata_request::MetadataRequestTopic::default();
                t.name = Some(topic_name(n));
                t
            })
            .collect(),
    );
    req.allow_auto_topic_creation = false;
    let md = client.request(&req, v).await?;
    let mut brokers = HashMap::new();
    for b in &md.brokers {
        let host = if b.host.as_str() == "localhost" {
            "127.0.0.1"
        } else {
            b.host.as_str()
        };
        if let Ok(a) = format!("{host}:{}", b.port).parse() {
            brokers.insert(b.node_id.0, a);
        }
    }
    let mut parts = Vec::new();
    for t in &md.topics {
        if t.error_code != 0 {
            continue;
        }
        let Some(name) = &t.name else { continue };
        let name: Rc<str> = Rc::from(name.as_str());
        for p in &t.partitions {
            parts.push(Part {
                topic: name.clone(),
                partition: p.partition_index,
                leader: if p.error_code == 0 { p.leader_id.0 } else { -1 },
                isr: p.isr_nodes.len(),
            });
        }
    }
    parts.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(Layout { parts, brokers })
}

/// Polls the layout until it is ready or `deadline` passes.
async fn wait_layout(
    client: &mut Client,
    opts: &ScaleOpts,
    names: &[String],
    deadline: Instant,
) -> io::Result<Layout> {
    loop {
        let l = layout(client, names).await?;
        match l.ready(opts) {
            Ok(()) => return Ok(l),
            Err(why) if Instant::now() > deadline => {
                return Err(err(format!(
                    "not ready after {:.0} s: {why}",
                    opts.timeout_s
                )))
            }
            Err(_) => glommio::timer::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

async fn create(client: &mut Client, opts: &ScaleOpts, names: &[String]) -> io::Result<f64> {
    let v = client.version(ApiKey::CreateTopics)?;
    let mut req = CreateTopicsRequest::default();
    req.timeout_ms = (opts.timeout_s * 1000.0) as i32;
    req.topics = names
        .iter()
        .map(|n| {
            let mut t = CreatableTopic::default();
            t.name = topic_name(n);
            t.num_partitions = opts.partitions;
            t.replication_factor = opts.replication;
            t
        })
        .collect();
    let start = Instant::now();
    let resp = client.request(&req, v).await?;
    let took = ms(start);
    for t in resp.topics {
        // 36 = TOPIC_ALREADY_EXISTS
        if t.error_code != 0 && t.error_code != 36 {
            return Err(err(format!(
                "CreateTopics {}: {}",
                t.name.as_str(),
                sluice_client::error_name(t.error_code)
            )));
        }
    }
    Ok(took)
}

/// Partitions per Produce request of the `one` phase.
const ONE_CHUNK: usize = 1000;

/// The largest batch the sustain phase sends (librdkafka's `batch.size` default), below
/// a topic's default `max.message.bytes` (1 MiB).
const BATCH_BYTES_MAX: usize = 1_000_000;

/// A produce request for `idx` (indexes into `parts`), each with its batch.
fn produce_request(parts: &[Part], batches: Vec<(usize, Bytes)>, acks: i16) -> ProduceRequest {
    let mut topics: Vec<TopicProduceData> = Vec::new();
    for (i, records) in batches {
        let p = &parts[i];
        if topics.last().is_none_or(|t| t.name.as_str() != &*p.topic) {
            let mut t = TopicProduceData::default();
            t.name = topic_name(&p.topic);
            topics.push(t);
        }
        let mut d = PartitionProduceData::default();
        d.index = p.partition;
        d.records = Some(records);
        topics.last_mut().expect("pushed").partition_data.push(d);
    }
    let mut req = ProduceRequest::default();
    req.acks = acks;
    req.timeout_ms = 30_000;
    req.topic_data = topics;
    req
}

/// Codes a leader may answer for a partition it does not know yet: the Metadata the
/// layout came from can list a new topic (its ISR full from the start) a moment before
/// the leader has applied it, and clients retry them (UNKNOWN_TOPIC_OR_PARTITION,
/// LEADER_NOT_AVAILABLE).
const ONE_RETRIABLE: [i16; 2] = [3, 5];
/// How long [`one_each`] retries a partition answered with an [`ONE_RETRIABLE`] code,
/// and the pause between tries.
const ONE_RETRY_FOR: Duration = Duration::from_secs(10);
const ONE_RETRY_PAUSE: Duration = Duration::from_millis(5);

/// One record to every partition; returns the errors (partition, code). A partition
/// answered with a [`ONE_RETRIABLE`] code is sent again (bounded by [`ONE_RETRY_FOR`]),
/// as a client would: the time measured includes it.
async fn one_each(l: &Layout, opts: &ScaleOpts) -> io::Result<Vec<String>> {
    let builder = BatchBuilder::new(opts.record_size);
    let mut failed = Vec::new();
    for (leader, idx) in l.by_leader() {
        let addr = l.brokers[&leader];
        let mut c = Client::connect(addr).await?;
        let v = c.version(ApiKey::Produce)?;
        for chunk in idx.chunks(ONE_CHUNK) {
            let at: HashMap<(&str, i32), usize> = chunk
                .iter()
                .map(|&i| ((&*l.parts[i].topic, l.parts[i].partition), i))
                .collect();
            let give_up = Instant::now() + ONE_RETRY_FOR;
            let mut todo = chunk.to_vec();
            while !todo.is_empty() {
                let now = load::now_us();
                let batches = todo
                    .iter()
                    .map(|&i| (i, builder.build(&[now], None)))
                    .collect();
                let resp = c
                    .request(&produce_request(&l.parts, batches, opts.acks), v)
                    .await?;
                let mut again = Vec::new();
                for t in &resp.responses {
                    for p in &t.partition_responses {
                        let code = p.error_code;
                        let i = at.get(&(t.name.as_str(), p.index));
                        match i {
                            _ if code == 0 => {}
                            Some(&i)
                                if ONE_RETRIABLE.contains(&code) && Instant::now() < give_up =>
                            {
                                again.push(i)
                            }
                            _ => failed.push(format!(
                                "{}-{}: {}",
                                t.name.as_str(),
                                p.index,
                                sluice_client::error_name(code)
                            )),
                        }
                    }
                }
                // Kept in layout order: the request groups consecutive partitions by topic.
                again.sort_unstable();
                todo = again;
                if !todo.is_empty() {
                    glommio::timer::sleep(ONE_RETRY_PAUSE).await;
                }
            }
        }
    }
    Ok(failed)
}

/// Open-loop produce at `opts.rate` spread round robin over every partition.
async fn sustain(l: &Layout, opts: &ScaleOpts) -> io::Result<serde_json::Value> {
    let stats = Stats::new(None);
    let mut conns: HashMap<i32, Rc<ProducerConn>> = HashMap::new();
    let mut version = None;
    for &leader in l.by_leader().keys() {
        let addr = l.brokers[&leader];
        let v = match version {
            Some(v) => v,
            None => *version.insert(Client::connect(addr).await?.version(ApiKey::Produce)?),
        };
        let c =
            ProducerConn::open(addr, v, opts.max_in_flight, stats.clone(), opts.acks, None).await?;
        conns.insert(leader, c);
    }
    let builder = BatchBuilder::new(opts.record_size);
    let per_batch = builder.records_per_batch(BATCH_BYTES_MAX);
    let n = l.parts.len();
    let start = Instant::now();
    let start_us = load::now_us();
    let end = start + Duration::from_secs_f64(opts.duration_s);
    let mut generated = 0u64;
    let mut cursor = 0usize;
    loop {
        let now = Instant::now();
        let finished = now >= end;
        let due_until = if finished { end } else { now };
        let due = ((due_until - start).as_secs_f64() * opts.rate) as u64;
        // Due times of the new records per partition, in round-robin order: what fell
        // due while the in-flight window was full goes out together (batched per
        // partition, as a client's accumulator does), but at most 32 MiB of it per
        // turn (a broker far behind got everything due since in one request, past its
        // 100 MiB frame limit). The rest go out next turn, timed from when they fell due.
        let mut fresh: HashMap<usize, Vec<u64>> = HashMap::new();
        // And at most BATCH_BYTES_MAX per partition (records go round-robin), as a
        // client's batch.size: Produce v3+ takes one batch per partition, and what fell
        // due during a stall of the in-flight window was one batch over
        // max.message.bytes (MESSAGE_TOO_LARGE at 1M records/s over 8 partitions after
        // a stall of ~80 ms).
        let turn = ((32 << 20) / opts.record_size.max(1)).min(per_batch * n);
        let turn_max = generated + turn.max(n) as u64;
        while generated < due.min(turn_max) {
            let t = start_us + (generated as f64 * 1e6 / opts.rate) as u64;
            fresh.entry(cursor).or_default().push(t);
            cursor = (cursor + 1) % n;
            generated += 1;
        }
        let mut per_leader: HashMap<i32, Vec<(usize, Vec<u64>)>> = HashMap::new();
        for (i, times) in fresh {
            per_leader
                .entry(l.parts[i].leader)
                .or_default()
                .push((i, times));
        }
        for (leader, mut batch) in per_leader {
            batch.sort_unstable_by_key(|(i, _)| *i);
            // One request per leader; per topic, in partition order.
            let mut topics: TopicBatches<'_> = Vec::new();
            for (i, times) in batch {
                let p = &l.parts[i];
                if topics.last().is_none_or(|(t, _)| *t != &*p.topic) {
                    topics.push((&p.topic, Vec::new()));
                }
                let records = builder.build(&times, None);
                topics
                    .last_mut()
                    .expect("pushed")
                    .1
                    .push((p.partition, records, times));
            }
            let conn = &conns[&leader];
            conn.wait_window().await;
            if conn.closed.get() {
                return Err(err("producer connection closed by the broker"));
            }
            conn.send_topics(opts.acks, topics).await?;
        }
        if finished && generated >= due {
            break;
        }
        if generated >= due {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    }
    for c in conns.values() {
        c.wait_drained(Duration::from_secs(60)).await;
    }
    let seconds = start.elapsed().as_secs_f64();
    let out = stats.outcome(opts.record_size, seconds, None, 0);
    let mut j = serde_json::json!({
        "records": out.records,
        "records_per_sec": out.records as f64 / seconds,
        "errors": out.errors,
        "seconds": seconds,
        "latency_ms": crate::report::latency_ms(&out.produce_latency_us),
    });
    if let Some(e) = stats.first_error.borrow().as_ref() {
        j["first_error"] = serde_json::json!(e.chars().take(300).collect::<String>());
    }
    Ok(j)
}

/// Whether every partition answers ListOffsets (latest) at its leader with a log end
/// of at least `min_offset`; the first shortfall otherwise.
async fn readable(l: &Layout, min_offset: i64) -> io::Result<Result<(), String>> {
    for (leader, idx) in l.by_leader() {
        let mut c = match Client::connect(l.brokers[&leader]).await {
            Ok(c) => c,
            Err(e) => return Ok(Err(format!("broker {leader}: {e}"))),
        };
        let v = c.version(ApiKey::ListOffsets)?;
        for chunk in idx.chunks(ONE_CHUNK) {
            let mut topics: Vec<ListOffsetsTopic> = Vec::new();
            for &i in chunk {
                let p = &l.parts[i];
                if topics.last().is_none_or(|t| t.name.as_str() != &*p.topic) {
                    let mut t = ListOffsetsTopic::default();
                    t.name = topic_name(&p.topic);
                    topics.push(t);
                }
                let mut lp = ListOffsetsPartition::default();
                lp.partition_index = p.partition;
                lp.timestamp = -1;
                lp.current_leader_epoch = -1;
                topics.last_mut().expect("pushed").partitions.push(lp);
            }
            let mut req = ListOffsetsRequest::default();
            req.replica_id = BrokerId(-1);
            req.topics = topics;
            let resp = c.request(&req, v).await?;
            for t in &resp.topics {
                for p in &t.partitions {
                    if p.error_code != 0 || p.offset < min_offset {
                        return Ok(Err(format!(
                            "{}-{}: {} offset {}",
                            t.name.as_str(),
                            p.partition_index,
                            sluice_client::error_name(p.error_code),
                            p.offset
                        )));
                    }
                }
            }
        }
    }
    Ok(Ok(()))
}

async fn verify(opts: &ScaleOpts, names: &[String]) -> io::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(opts.timeout_s);
    let mut last = String::new();
    loop {
        // A restarting broker refuses connections until it serves.
        if let Ok(mut c) = Client::connect(opts.bootstrap).await {
            match wait_layout(&mut c, opts, names, Instant::now()).await {
                Ok(l) => match readable(&l, opts.min_offset).await {
                    Ok(Ok(())) => break,
                    Ok(Err(why)) => last = why,
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "not serving every partition after {:.0} s: {last}",
                opts.timeout_s
            )));
        }
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
    let now = load::now_us() / 1000;
    Ok(now.saturating_sub(opts.since_unix_ms.unwrap_or(now)) as f64)
}

pub async fn run(opts: ScaleOpts) -> io::Result<ScaleResult> {
    let names = topic_names(&opts);
    let mut r = ScaleResult {
        partitions: opts.topics * opts.partitions as usize,
        ..ScaleResult::default()
    };
    let run_start = Instant::now();
    let mut verify_opts = opts.clone();
    if verify_opts.since_unix_ms.is_none() {
        verify_opts.since_unix_ms = Some(load::now_us() / 1000);
    }
    let deadline = || Instant::now() + Duration::from_secs_f64(opts.timeout_s);
    let mut l = None;
    for phase in &opts.phases {
        match phase {
            Phase::Create => {
                let mut c = Client::connect(opts.bootstrap).await?;
                let start = Instant::now();
                r.create_request_ms = Some(create(&mut c, &opts, &names).await?);
                let leaders = ScaleOpts {
                    want_isr: 0,
                    ..opts.clone()
                };
                wait_layout(&mut c, &leaders, &names, deadline()).await?;
                r.create_to_leaders_ms = Some(ms(start));
                if opts.replication > 1 {
                    let in_sync = ScaleOpts {
                        want_isr: opts.replication as usize,
                        ..opts.clone()
                    };
                    l = Some(wait_layout(&mut c, &in_sync, &names, deadline()).await?);
                    r.create_to_in_sync_ms = Some(ms(start));
                }
            }
            Phase::One => {
                let layout = current(&opts, &names, &mut l).await?;
                let start = Instant::now();
                let failed = one_each(layout, &opts).await?;
                r.one_record_each_ms = Some(ms(start));
                r.errors += failed.len() as u64;
                if let Some(f) = failed.first() {
                    r.first_error
                        .get_or_insert(format!("{} failed, first {f}", failed.len()));
                }
            }
            Phase::Sustain => {
                let layout = current(&opts, &names, &mut l).await?;
                let s = sustain(layout, &opts).await?;
                r.errors += s["errors"].as_u64().unwrap_or(0);
                if let Some(e) = s.get("first_error").and_then(|e| e.as_str()) {
                    r.first_error.get_or_insert(e.to_string());
                }
                r.sustain = Some(s);
            }
            Phase::Verify => {
                r.verify_ms = Some(verify(&verify_opts, &names).await?);
                l = None;
            }
        }
    }
    let mut c = Client::connect(opts.bootstrap).await?;
    for p in layout(&mut c, &names).await?.parts {
        *r.leaders_per_broker.entry(p.leader).or_default() += 1;
    }
    tracing::debug!(
        seconds = run_start.elapsed().as_secs_f64(),
        "scale run done"
    );
    Ok(r)
}

/// The layout as the Metadata shows it now (kept until a phase may change it).
async fn current<'a>(
    opts: &ScaleOpts,
    names: &[String],
    l: &'a mut Option<Layout>,
) -> io::Result<&'a Layout> {
    if l.is_none() {
        let mut c = Client::connect(opts.bootstrap).await?;
        let leaders = ScaleOpts {
            want_isr: 0,
            ..opts.clone()
        };
        let deadline = Instant::now() + Duration::from_secs_f64(opts.timeout_s);
        *l = Some(wait_layout(&mut c, &leaders, names, deadline).await?);
    }
    Ok(l.as_ref().expect("set"))
}
