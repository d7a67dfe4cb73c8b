//! `sluice produce` and `sluice consume`: records from standard input to a topic and
//! from a topic to standard output, as Kafka's console producer and consumer, kcat
//! `-P`/`-C` and `rpk topic produce/consume` do, against any Kafka-protocol broker
//! through [`sluice_client`]: Metadata to find each partition's leader, Produce (v2
//! record batches, one per partition per request), ListOffsets, Fetch, and with a group
//! OffsetFetch and OffsetCommit.
//!
//! A consumer with `--group` reads from the group's committed offsets and commits what
//! it printed, with no group membership (a consumer with assigned partitions, Kafka's
//! `assign()` + `commitSync()`): it does not take part in a group's rebalances.
//!
//! Not built: the producer reads its input to the end before sending (a pipe that never
//! ends sends nothing), and neither side follows a leader that moves while it runs (it
//! stops with the partition's error; run it again).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, Write};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FindCoordinatorRequest, ListOffsetsRequest, MetadataRequest,
    OffsetCommitRequest, OffsetFetchRequest, ProduceRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use sluice_client::blocking::Conn;

use super::topic::open;
use sluice_client::{error_name, sbs, topic_name, Versions};

pub type Res<T> = Result<T, String>;

/// Records per produced batch, and the bytes of keys, values and headers in one (under
/// Kafka's default max.message.bytes, 1 MiB, with room for the records' framing).
const BATCH_RECORDS: usize = 1000;
const BATCH_BYTES: usize = 512 << 10;

/// The size of a record's key, value and headers.
fn payload(r: &Record) -> usize {
    r.key.as_ref().map_or(0, |k| k.len())
        + r.value.as_ref().map_or(0, |v| v.len())
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.as_ref().map_or(0, |v| v.len()))
            .sum::<usize>()
}

/// `records` cut into batches of at most [`BATCH_RECORDS`] records and (unless one
/// record alone is larger) [`BATCH_BYTES`] bytes.
fn batches(records: &mut [Record]) -> Vec<&mut [Record]> {
    let mut out = Vec::new();
    let mut rest = records;
    while !rest.is_empty() {
        let (mut n, mut bytes) = (0, 0);
        while n < rest.len()
            && n < BATCH_RECORDS
            && (n == 0 || bytes + payload(&rest[n]) <= BATCH_BYTES)
        {
            bytes += payload(&rest[n]);
            n += 1;
        }
        let (head, tail) = rest.split_at_mut(n);
        out.push(head);
        rest = tail;
    }
    out
}

/// A topic's partitions and their leaders' addresses.
struct Layout {
    /// Partition -> leader's `host:port` (`None`: no leader now).
    leaders: BTreeMap<i32, Option<String>>,
}

fn layout(bootstrap: &str, topic: &str, create: bool) -> Res<Layout> {
    let (mut c, v) = open(bootstrap)?;
    let version = v.require(ApiKey::Metadata, (4, 12)).map_err(String::from)?;
    let md = c
        .call(
            version,
            &MetadataRequest::default()
                .with_topics(Some(vec![
                    kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(topic_name(topic))),
                ]))
                .with_allow_auto_topic_creation(create),
        )
        .map_err(String::from)?;
    let brokers: HashMap<i32, String> = md
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
        .collect();
    let t = md
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .ok_or_else(|| format!("topic {topic}: not in the metadata"))?;
    if t.error_code != 0 {
        return Err(format!("topic {topic}: {}", error_name(t.error_code)));
    }
    Ok(Layout {
        leaders: t
            .partitions
            .iter()
            .map(|p| (p.partition_index, brokers.get(&p.leader_id.0).cloned()))
            .collect(),
    })
}

/// Kafka's default partitioner for keyed records: murmur2 of the key, positive, modulo
/// the partition count (so keys land where Java and librdkafka clients put them).
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) as i32 % partitions.max(1)
}

/// The murmur2 hash Kafka's clients use (seed 0x9747b28c).
pub fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = 0x9747_b28c ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// A record of no producer (no idempotence, no transaction), as the encoder takes it.
pub fn plain_record(offset: i64, timestamp: i64, key: Option<Bytes>, value: Bytes) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp,
        key,
        value: Some(value),
        headers: Default::default(),
    }
}

/// `records` as one v2 batch. A batch's records carry their offsets relative to its
/// first; the encoder keeps records in one batch while offset - sequence stays the
/// same, and a batch without a producer id has base sequence -1.
pub fn encode_batch(records: &mut [Record]) -> Res<Bytes> {
    for (i, r) in records.iter_mut().enumerate() {
        r.offset = i as i64;
        r.sequence = i as i32 - 1;
    }
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("encoding a batch: {e}"))?;
    Ok(buf.freeze())
}

/// What `sluice produce` sends.
pub struct ProduceArgs {
    pub topic: String,
    pub partition: Option<i32>,
    /// Splits each line into key and value at its first occurrence (kcat's `-K`).
    pub key_separator: Option<String>,
    /// Headers given to every record.
    pub headers: Vec<(String, String)>,
    /// Kafka's acks: -1 (all) or 1.
    pub acks: i16,
}

/// Reads lines from `input` until its end and produces one record per line; returns
/// how many were acknowledged.
pub fn produce(bootstrap: &str, args: &ProduceArgs, input: impl BufRead) -> Res<usize> {
    let layout = layout(bootstrap, &args.topic, true)?;
    let count = layout.leaders.len() as i32;
    if let Some(p) = args.partition.filter(|p| !layout.leaders.contains_key(p)) {
        return Err(format!("topic {} has no partition {p}", args.topic));
    }
    let now = sluice::base::util::now_ms();
    let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("reading standard input: {e}"))?;
        let (key, value) = match &args.key_separator {
            Some(sep) => match line.split_once(sep.as_str()) {
                Some((k, v)) => (Some(k.to_string()), v.to_string()),
                None => (None, line),
            },
            None => (None, line),
        };
        let partition = match (args.partition, &key) {
            (Some(p), _) => p,
            (None, Some(k)) => partition_for_key(k.as_bytes(), count),
            (None, None) => i as i32 % count.max(1),
        };
        let mut record = plain_record(0, now, key.map(Bytes::from), Bytes::from(value));
        for (k, v) in &args.headers {
            record.headers.insert(
                StrBytes::from_string(k.clone()),
                Some(Bytes::from(v.clone())),
            );
        }
        by_partition.entry(partition).or_default().push(record);
    }
    let mut conns: HashMap<String, (Conn, Versions)> = HashMap::new();
    let mut acked = 0;
    for (partition, mut records) in by_partition {
        let leader = layout
            .leaders
            .get(&partition)
            .cloned()
            .flatten()
            .ok_or_else(|| format!("{}-{partition}: no leader", args.topic))?;
        if !conns.contains_key(&leader) {
            conns.insert(leader.clone(), open(&leader)?);
        }
        let (c, v) = conns.get_mut(&leader).expect("just opened");
        let version = v.require(ApiKey::Produce, (3, 9)).map_err(String::from)?;
        for chunk in batches(&mut records) {
            let batch = encode_batch(chunk)?;
            let req = ProduceRequest::default()
                .with_acks(args.acks)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(topic_name(&args.topic))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch))])]);
            let r = c.call(version, &req).map_err(String::from)?;
            for p in r.responses.iter().flat_map(|t| &t.partition_responses) {
                if p.error_code != 0 {
                    let why = p.error_message.as_ref().map_or("", |m| m.as_str());
                    return Err(format!(
                        "{}-{partition}: {} {why}",
                        args.topic,
                        error_name(p.error_code)
                    ));
                }
            }
            acked += chunk.len();
        }
    }
    Ok(acked)
}

/// Where `sluice consume` starts in each partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Beginning,
    End,
    Offset(i64),
    /// The first record at or after this time (ms).
    Time(i64),
    /// The group's committed offset, else the beginning.
    Stored,
}

impl Start {
    pub fn parse(s: &str) -> Res<Start> {
        match s {
            "beginning" | "earliest" | "start" => Ok(Start::Beginning),
            "end" | "latest" => Ok(Start::End),
            "stored" | "committed" => Ok(Start::Stored),
            n => n
                .parse::<i64>()
                .ok()
                .filter(|o| *o >= 0)
                .map(Start::Offset)
                .ok_or_else(|| format!("--offset {n}: beginning, end, stored or an offset")),
        }
    }
}

/// What `sluice consume` reads and how it prints.
pub struct ConsumeArgs {
    pub topic: String,
    pub partition: Option<i32>,
    pub start: Start,
    pub group: Option<String>,
    pub read_committed: bool,
    /// Stop after this many records.
    pub count: Option<usize>,
    /// Stop at the end offsets the partitions had when reading started.
    pub exit_at_end: bool,
    /// kcat's `-f` tokens: %t %p %o %k %s %T %h, \n and \t.
    pub format: String,
}

/// One record as `format` prints it.
pub fn render(format: &str, topic: &str, partition: i32, r: &Record) -> String {
    let text = |b: &Option<Bytes>| {
        b.as_ref()
            .map_or(String::new(), |b| String::from_utf8_lossy(b).into_owned())
    };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        match c {
            '%' => match chars.next() {
                Some('t') => out.push_str(topic),
                Some('p') => out.push_str(&partition.to_string()),
                Some('o') => out.push_str(&r.offset.to_string()),
                Some('k') => out.push_str(&text(&r.key)),
                Some('s') => out.push_str(&text(&r.value)),
                Some('T') => out.push_str(&r.timestamp.to_string()),
                Some('h') => {
                    let hs: Vec<String> = r
                        .headers
                        .iter()
                        .map(|(k, v)| format!("{}={}", k.as_str(), text(v)))
                        .collect();
                    out.push_str(&hs.join(","));
                }
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            },
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => {
                    out.push('\\');
                    out.push(other);
                }
                None => out.push('\\'),
            },
            c => out.push(c),
        }
    }
    out
}

/// The offsets each partition starts and (with `exit_at_end`) stops at.
fn list_offsets(
    c: &mut Conn,
    v: &Versions,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
    committed: bool,
) -> Res<BTreeMap<i32, i64>> {
    let version = v
        .require(ApiKey::ListOffsets, (2, 8))
        .map_err(String::from)?;
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(i8::from(committed))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(*p)
                            .with_timestamp(timestamp)
                    })
                    .collect(),
            )]);
    let r = c.call(version, &req).map_err(String::from)?;
    let mut out = BTreeMap::new();
    for p in r.topics.iter().flat_map(|t| &t.partitions) {
        if p.error_code != 0 {
            return Err(format!(
                "{topic}-{}: {}",
                p.partition_index,
                error_name(p.error_code)
            ));
        }
        out.insert(p.partition_index, p.offset);
    }
    Ok(out)
}

/// What one partition's fetched bytes gave: the next offset to fetch, how many
/// records were printed, and whether the budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub next: i64,
    pub printed: usize,
    pub budget_spent: bool,
}

/// Takes one partition's fetched `records` from `position`: hands every record at or
/// past it to `print` (skipping control records and, `read_committed`, those of the
/// `aborted` transactions: (first offset, producer id)) until `budget` records are
/// printed. The position moves by whole batches, as Kafka's consumer does (a batch's
/// last offset comes from its header: compaction can leave a batch whose last records,
/// or all of them, are gone); a batch cut at the fetch's size limit is fetched again
/// next time. A batch that is corrupt or of the old message formats is an error, not a
/// reason to fetch the same bytes forever.
pub fn take(
    records: &Bytes,
    position: i64,
    aborted: &[(i64, i64)],
    read_committed: bool,
    budget: Option<usize>,
    mut print: impl FnMut(&Record) -> Res<()>,
) -> Res<Taken> {
    let mut buf = records.clone();
    let mut next = position;
    let mut printed = 0usize;
    let mut pending: Vec<(i64, i64)> = aborted.to_vec();
    pending.sort();
    let mut active: HashSet<i64> = HashSet::new();
    let spent = |printed: usize| budget.is_some_and(|n| printed >= n);
    while buf.len() >= 12 {
        let base = i64::from_be_bytes(buf[..8].try_into().expect("8 bytes"));
        let length = i32::from_be_bytes(buf[8..12].try_into().expect("4 bytes"));
        let total = 12
            + usize::try_from(length)
                .map_err(|_| format!("a batch of length {length} at offset {base}"))?;
        if buf.len() < total {
            break;
        }
        let batch = buf.split_to(total);
        if total < 61 {
            return Err(format!("a corrupt batch at offset {base} ({total} bytes)"));
        }
        if batch[16] != 2 {
            return Err(format!(
                "offset {base} is in message format v{} (an old client's message set), which sluice consume does not read",
                batch[16]
            ));
        }
        let last_delta = i32::from_be_bytes(batch[23..27].try_into().expect("4 bytes"));
        let batch_end = base + i64::from(last_delta) + 1;
        if batch_end <= next {
            continue;
        }
        let decompress = |data: &mut Bytes, c: Compression| {
            use sluice_storage::codec::{self, Codec, Lz4Framing};
            let codec = Codec::from_id(c as u8)
                .ok_or_else(|| std::io::Error::other("unknown compression"))?;
            let plain = codec::decompress(codec, data, Lz4Framing::Standard)
                .map_err(std::io::Error::other)?;
            Ok(Bytes::from(plain))
        };
        let mut b = batch.clone();
        let set = RecordBatchDecoder::decode_with_custom_compression(&mut b, Some(decompress))
            .map_err(|e| format!("an undecodable batch at offset {base}: {e}"))?;
        for r in set.records {
            if r.offset < next {
                continue;
            }
            while pending.first().is_some_and(|(first, _)| *first <= r.offset) {
                active.insert(pending.remove(0).1);
            }
            if r.control {
                active.remove(&r.producer_id);
                next = r.offset + 1;
                continue;
            }
            if read_committed && r.transactional && active.contains(&r.producer_id) {
                next = r.offset + 1;
                continue;
            }
            if spent(printed) {
                return Ok(Taken {
                    next,
                    printed,
                    budget_spent: true,
                });
            }
            print(&r)?;
            printed += 1;
            next = r.offset + 1;
        }
        next = next.max(batch_end);
    }
    Ok(Taken {
        next,
        printed,
        budget_spent: spent(printed),
    })
}

/// How often a consumer with `--group` commits what it printed (and once more at the
/// end, on an error and on SIGINT/SIGTERM), as Kafka's auto-commit interval.
const COMMIT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads records and writes them to `out` as `args.format` says, until the end (`-e`),
/// the count, or `stop`; returns how many. With a group, what was printed is committed
/// every few seconds and when reading ends, however it ends.
pub fn consume(
    bootstrap: &str,
    args: &ConsumeArgs,
    out: &mut impl Write,
    stop: &std::sync::atomic::AtomicBool,
) -> Res<usize> {
    let layout = layout(bootstrap, &args.topic, false)?;
    let partitions: Vec<i32> = match args.partition {
        Some(p) if layout.leaders.contains_key(&p) => vec![p],
        Some(p) => return Err(format!("topic {} has no partition {p}", args.topic)),
        None => layout.leaders.keys().copied().collect(),
    };
    // Per leader: the partitions it leads.
    let mut leaders: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for p in &partitions {
        let l = layout.leaders[p]
            .clone()
            .ok_or_else(|| format!("{}-{p}: no leader", args.topic))?;
        leaders.entry(l).or_default().push(*p);
    }
    let mut conns: BTreeMap<String, (Conn, Versions)> = BTreeMap::new();
    let mut position: BTreeMap<i32, i64> = BTreeMap::new();
    let mut end: BTreeMap<i32, i64> = BTreeMap::new();
    let committed = match (&args.group, args.start) {
        (Some(g), Start::Stored) => group_offsets(bootstrap, g, &args.topic, &partitions)?,
        (None, Start::Stored) => return Err("--offset stored needs --group".into()),
        _ => BTreeMap::new(),
    };
    for (leader, ps) in &leaders {
        let (mut c, v) = open(leader)?;
        let earliest = list_offsets(&mut c, &v, &args.topic, ps, -2, args.read_committed)?;
        let latest = list_offsets(&mut c, &v, &args.topic, ps, -1, args.read_committed)?;
        let at_time = match args.start {
            Start::Time(t) => list_offsets(&mut c, &v, &args.topic, ps, t, args.read_committed)?,
            _ => BTreeMap::new(),
        };
        for p in ps {
            let start = match args.start {
                Start::Beginning => earliest[p],
                Start::End => latest[p],
                Start::Offset(o) => o.clamp(earliest[p], latest[p]),
                Start::Time(_) => match at_time.get(p) {
                    Some(o) if *o >= 0 => *o,
                    _ => latest[p],
                },
                // A committed offset outside the log is reset to its start, as a
                // consumer's auto.offset.reset=earliest does.
                Start::Stored => committed
                    .get(p)
                    .copied()
                    .filter(|o| (earliest[p]..=latest[p]).contains(o))
                    .unwrap_or(earliest[p]),
            };
            position.insert(*p, start);
            end.insert(*p, latest[p]);
        }
        conns.insert(leader.clone(), (c, v));
    }
    let mut printed = 0usize;
    let mut last_commit = std::time::Instant::now();
    let result = (|| -> Res<()> {
        'reading: loop {
            let at_end = args.exit_at_end && position.iter().all(|(p, o)| *o >= end[p]);
            if at_end
                || args.count.is_some_and(|n| printed >= n)
                || stop.load(std::sync::atomic::Ordering::SeqCst)
            {
                break;
            }
            for (leader, ps) in &leaders {
                let (c, v) = conns.get_mut(leader).expect("opened above");
                let version = v.require(ApiKey::Fetch, (4, 11)).map_err(String::from)?;
                let wanted: Vec<i32> = ps
                    .iter()
                    .copied()
                    .filter(|p| !(args.exit_at_end && position[p] >= end[p]))
                    .collect();
                if wanted.is_empty() {
                    continue;
                }
                let req = FetchRequest::default()
                    .with_replica_id(BrokerId(-1))
                    .with_max_wait_ms(500)
                    .with_min_bytes(1)
                    .with_max_bytes(8 << 20)
                    .with_isolation_level(i8::from(args.read_committed))
                    .with_session_epoch(-1)
                    .with_topics(vec![FetchTopic::default()
                        .with_topic(topic_name(&args.topic))
                        .with_partitions(
                            wanted
                                .iter()
                                .map(|p| {
                                    FetchPartition::default()
                                        .with_partition(*p)
                                        .with_fetch_offset(position[p])
                                        .with_partition_max_bytes(1 << 20)
                                })
                                .collect(),
                        )]);
                let r = c.call(version, &req).map_err(String::from)?;
                if r.error_code != 0 {
                    return Err(format!("fetch: {}", error_name(r.error_code)));
                }
                for part in r.responses.iter().flat_map(|t| &t.partitions) {
                    let p = part.partition_index;
                    if part.error_code != 0 {
                        return Err(format!(
                            "{}-{p}: {}",
                            args.topic,
                            error_name(part.error_code)
                        ));
                    }
                    let aborted: Vec<(i64, i64)> = part
                        .aborted_transactions
                        .iter()
                        .flatten()
                        .map(|a| (a.first_offset, a.producer_id.0))
                        .collect();
                    let records = part.records.clone().unwrap_or_default();
                    let budget = args.count.map(|n| n.saturating_sub(printed));
                    let taken = take(
                        &records,
                        position[&p],
                        &aborted,
                        args.read_committed,
                        budget,
                        |rec| {
                            out.write_all(render(&args.format, &args.topic, p, rec).as_bytes())
                                .map_err(|e| format!("writing: {e}"))
                        },
                    )?;
                    printed += taken.printed;
                    position.insert(p, taken.next);
                    if taken.budget_spent {
                        break 'reading;
                    }
                }
            }
            out.flush().map_err(|e| format!("writing: {e}"))?;
            if let Some(g) = &args.group {
                if last_commit.elapsed() >= COMMIT_EVERY {
                    commit(bootstrap, g, &args.topic, &position)?;
                    last_commit = std::time::Instant::now();
                }
            }
        }
        out.flush().map_err(|e| format!("writing: {e}"))
    })();
    if let Some(g) = &args.group {
        let committed = commit(bootstrap, g, &args.topic, &position);
        result?;
        committed?;
    } else {
        result?;
    }
    Ok(printed)
}

/// The group's coordinator connection.
fn coordinator(bootstrap: &str, group: &str) -> Res<(Conn, Versions)> {
    let (mut c, v) = open(bootstrap)?;
    let version = v
        .require(ApiKey::FindCoordinator, (1, 3))
        .map_err(String::from)?;
    let r = c
        .call(
            version,
            &FindCoordinatorRequest::default().with_key(sbs(group)),
        )
        .map_err(String::from)?;
    if r.error_code != 0 {
        return Err(format!("group {group}: {}", error_name(r.error_code)));
    }
    open(&format!("{}:{}", r.host, r.port))
}

fn group_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Res<BTreeMap<i32, i64>> {
    let (mut c, v) = coordinator(bootstrap, group)?;
    let version = v
        .require(ApiKey::OffsetFetch, (1, 7))
        .map_err(String::from)?;
    let r = c
        .call(
            version,
            &OffsetFetchRequest::default()
                .with_group_id(sbs(group).into())
                .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                    .with_name(topic_name(topic))
                    .with_partition_indexes(partitions.to_vec())])),
        )
        .map_err(String::from)?;
    if r.error_code != 0 {
        return Err(format!("group {group}: {}", error_name(r.error_code)));
    }
    Ok(r.topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.partition_index, p.committed_offset))
        .collect())
}

/// Commits `position` for `group` without membership (generation -1, no member id).
fn commit(bootstrap: &str, group: &str, topic: &str, position: &BTreeMap<i32, i64>) -> Res<()> {
    let (mut c, v) = coordinator(bootstrap, group)?;
    let version = v
        .require(ApiKey::OffsetCommit, (2, 8))
        .map_err(String::from)?;
    let r = c
        .call(
            version,
            &OffsetCommitRequest::default()
                .with_group_id(sbs(group).into())
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(topic_name(topic))
                    .with_partitions(
                        position
                            .iter()
                            .map(|(p, o)| {
                                OffsetCommitRequestPartition::default()
                                    .with_partition_index(*p)
                                    .with_committed_offset(*o)
                            })
                            .collect(),
                    )]),
        )
        .map_err(String::from)?;
    for p in r.topics.iter().flat_map(|t| &t.partitions) {
        if p.error_code != 0 {
            return Err(format!(
                "committing {topic}-{} for {group}: {}",
                p.partition_index,
                error_name(p.error_code)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn produced_batches_are_bounded_by_records_and_bytes() {
        let big = |n: usize| -> Vec<Record> {
            let b = batch(0, &vec!["x"; n]);
            let mut buf = b.clone();
            let mut recs = RecordBatchDecoder::decode(&mut buf).unwrap().records;
            for r in &mut recs {
                r.value = Some(Bytes::from(vec![b'v'; 100 << 10]));
            }
            recs
        };
        let mut recs = big(12);
        let sizes: Vec<usize> = batches(&mut recs).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, vec![5, 5, 2]);
        let mut small = RecordBatchDecoder::decode(&mut batch(0, &vec!["x"; 2500]))
            .unwrap()
            .records;
        let sizes: Vec<usize> = batches(&mut small).iter().map(|c| c.len()).collect();
        assert_eq!(sizes, vec![1000, 1000, 500]);
    }

    #[test]
    fn keys_land_where_kafkas_default_partitioner_puts_them() {
        // Values from Kafka's own partitioner tests (Utils.murmur2).
        assert_eq!(murmur2(b"21"), (-973932308i32) as u32);
        assert_eq!(murmur2(b"foobar"), (-790332482i32) as u32);
        assert_eq!(murmur2(b"a-little-bit-long-string"), (-985981536i32) as u32);
        assert_eq!(murmur2(b""), 275646681);
        for p in [1, 3, 7] {
            assert!((0..p).contains(&partition_for_key(b"anything", p)));
        }
    }

    /// A batch of `values` at `base` (offsets base.., a v2 batch as a producer sends).
    fn batch(base: i64, values: &[&str]) -> Bytes {
        let mut records: Vec<Record> = values
            .iter()
            .map(|v| plain_record(0, 1, None, Bytes::from(v.to_string())))
            .collect();
        let b = encode_batch(&mut records).unwrap();
        let mut out = BytesMut::from(&b[..]);
        out[..8].copy_from_slice(&base.to_be_bytes());
        out.freeze()
    }

    fn collect(records: &Bytes, position: i64, budget: Option<usize>) -> (Taken, Vec<String>) {
        let mut seen = Vec::new();
        let t = take(records, position, &[], false, budget, |r| {
            seen.push(String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap());
            Ok(())
        })
        .unwrap();
        (t, seen)
    }

    #[test]
    fn positions_move_by_whole_batches_and_stop_at_the_budget() {
        let mut two = BytesMut::from(&batch(0, &["a", "b", "c"])[..]);
        two.extend_from_slice(&batch(3, &["d", "e"]));
        let two = two.freeze();
        let (t, seen) = collect(&two, 0, None);
        assert_eq!((t.next, t.printed, t.budget_spent), (5, 5, false));
        assert_eq!(seen, ["a", "b", "c", "d", "e"]);
        // From inside the first batch.
        assert_eq!(collect(&two, 2, None).1, ["c", "d", "e"]);
        // A budget ending inside the second batch leaves the position at the first
        // record not printed, whatever batches follow.
        let (t, seen) = collect(&two, 0, Some(4));
        assert_eq!((t.next, t.printed, t.budget_spent), (4, 4, true));
        assert_eq!(seen, ["a", "b", "c", "d"]);
        let (t, _) = collect(&two, 0, Some(3));
        assert_eq!((t.next, t.budget_spent), (3, true));
        // A batch cut at the fetch's size limit: what came before counts, the rest is
        // fetched again.
        let cut = two.slice(..two.len() - 5);
        let (t, seen) = collect(&cut, 0, None);
        assert_eq!((t.next, seen.len()), (3, 3));
        // A batch whose last records were compacted away still moves past its last
        // offset (the header's last offset delta).
        let mut gap = BytesMut::from(&batch(10, &["x", "y", "z"])[..]);
        gap[23..27].copy_from_slice(&5i32.to_be_bytes());
        let crc = crc32c::crc32c(&gap[21..]);
        gap[17..21].copy_from_slice(&crc.to_be_bytes());
        let (t, _) = collect(&gap.freeze(), 10, None);
        assert_eq!(t.next, 16);
        // Corrupt bytes and old message formats are errors, not a loop.
        let mut bad = BytesMut::from(&batch(0, &["a"])[..]);
        bad[16] = 1;
        assert!(take(&bad.freeze(), 0, &[], false, None, |_| Ok(())).is_err());
    }

    #[test]
    fn formats_print_as_kcats() {
        let mut r = plain_record(
            42,
            1000,
            Some(Bytes::from_static(b"k")),
            Bytes::from_static(b"v"),
        );
        r.headers.insert(
            StrBytes::from_static_str("h"),
            Some(Bytes::from_static(b"1")),
        );
        assert_eq!(
            render("%t/%p@%o %k=%s %T [%h] 100%%\\n", "t", 3, &r),
            "t/3@42 k=v 1000 [h=1] 100%\n"
        );
        assert_eq!(render("%s\\n", "t", 0, &r), "v\n");
        assert_eq!(Start::parse("beginning"), Ok(Start::Beginning));
        assert_eq!(Start::parse("17"), Ok(Start::Offset(17)));
        assert!(Start::parse("-3").is_err());
    }
}
