//! The load generator's Kafka setup client: the few requests the benchmarks need
//! (metadata, topic creation, leaders, replica sets, offsets) over `sluice-client`'s
//! glommio connection and version negotiation, plus the bench's own record batches.
//! Works against any Kafka-protocol broker. The pipelined produce/consume loops use
//! `sluice-client`'s frame functions directly.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, FindCoordinatorRequest, InitProducerIdRequest, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, TransactionalId,
};
use kafka_protocol::protocol::Request;
use sluice_client::{aio, Versions};

pub use sluice_client::topic_name;

pub const CLIENT_ID: &str = "sluice-bench";

pub fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// The versions this client speaks for each API it uses: (min, max we encode).
pub fn our_range(key: ApiKey) -> (i16, i16) {
    match key {
        // v3 is the first with v2 record batches; v8 is the last before flexible.
        ApiKey::Produce => (3, 8),
        ApiKey::Fetch => (4, 11),
        ApiKey::Metadata => (1, 8),
        ApiKey::ListOffsets => (1, 5),
        ApiKey::CreateTopics => (2, 4),
        // v6 names topics in `topics` (name or id) instead of `topic_names`.
        ApiKey::DeleteTopics => (1, 6),
        ApiKey::InitProducerId => (0, 1),
        // v1 is the first with a key type; v4 batches keys.
        ApiKey::FindCoordinator => (1, 3),
        // v4 and up are broker-to-broker (KIP-890 verification).
        ApiKey::AddPartitionsToTxn => (0, 3),
        ApiKey::AddOffsetsToTxn => (0, 3),
        ApiKey::EndTxn => (0, 3),
        // v3 carries the consumer's group metadata (KIP-447).
        ApiKey::TxnOffsetCommit => (3, 3),
        _ => (0, 0),
    }
}

/// Kafka error codes the bench retries: the coordinator is still loading, has no
/// leader yet (the internal topic was just created), or is finishing the previous
/// transaction's markers (CONCURRENT_TRANSACTIONS). Anything else fails the run.
const RETRIABLE: [i16; 3] = [14, 15, 51];

/// How long a retried coordinator request may keep failing with a [`RETRIABLE`] code.
const RETRY_FOR: Duration = Duration::from_secs(30);

/// Between two tries of a coordinator request: short, because the usual wait is for
/// the markers of the transaction just committed (a few milliseconds).
const RETRY_BACKOFF: Duration = Duration::from_millis(2);

/// Sends `make()` until `code` of its answer is not [`RETRIABLE`] or [`RETRY_FOR`] has
/// passed; fails on any other error code.
pub async fn call_retrying<R: Request>(
    c: &mut Client,
    what: &str,
    make: impl Fn() -> R,
    code: impl Fn(&R::Response) -> i16,
) -> io::Result<R::Response> {
    let key = ApiKey::try_from(R::KEY).map_err(|_| err(format!("{what}: unknown API key")))?;
    let v = c.version(key)?;
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        let r = c.request(&make(), v).await?;
        match code(&r) {
            0 => return Ok(r),
            e if RETRIABLE.contains(&e) && Instant::now() < deadline => {
                glommio::timer::sleep(RETRY_BACKOFF).await
            }
            e => return Err(err(format!("{what}: {}", sluice_client::error_name(e)))),
        }
    }
}

/// `batch` (one uncompressed v2 batch from [`BatchBuilder`]) as a batch of producer
/// `pid` at `epoch` starting at sequence `base_seq`, inside the producer's transaction
/// if `transactional`, with its CRC recomputed.
pub fn sequenced(batch: &Bytes, pid: i64, epoch: i16, base_seq: i32, transactional: bool) -> Bytes {
    let mut b = batch.to_vec();
    if transactional {
        // Attribute bit 4: the batch belongs to its producer's open transaction.
        b[22] |= 0x10;
    }
    b[43..51].copy_from_slice(&pid.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&base_seq.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

/// A connection for setup requests, one at a time.
pub struct Client {
    conn: aio::Conn,
    versions: Versions,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> io::Result<Client> {
        let mut conn = aio::Conn::connect(addr, CLIENT_ID, None).await?;
        let versions = conn.api_versions().await?;
        Ok(Client { conn, versions })
    }

    /// The highest version both sides speak.
    pub fn version(&self, key: ApiKey) -> io::Result<i16> {
        Ok(self.versions.require(key, our_range(key))?)
    }

    pub async fn request<R: Request>(&mut self, req: &R, version: i16) -> io::Result<R::Response> {
        Ok(self.conn.call(version, req).await?)
    }

    /// The address of the coordinator of `key`: a group's (`key_type` 0) or a
    /// transactional id's (1). The first lookup of either kind creates the internal
    /// topic, whose leader may take a moment: that is retried.
    pub async fn coordinator(&mut self, key: &str, key_type: i8) -> io::Result<SocketAddr> {
        let make = || {
            FindCoordinatorRequest::default()
                .with_key(sluice_client::sbs(key))
                .with_key_type(key_type)
        };
        let r = call_retrying(self, "FindCoordinator", make, |r| r.error_code).await?;
        Ok(sluice_client::aio::resolve(&r.host, r.port).await?)
    }

    /// A producer id and epoch from InitProducerId: a fresh idempotent producer without
    /// `transactional_id`; with one (sent to its coordinator), the id's producer with
    /// its epoch bumped, which fences any earlier instance and aborts its transaction.
    pub async fn init_producer_id(
        &mut self,
        transactional_id: Option<&str>,
    ) -> io::Result<(i64, i16)> {
        let make = || {
            InitProducerIdRequest::default()
                .with_transactional_id(
                    transactional_id.map(|t| TransactionalId(sluice_client::sbs(t))),
                )
                .with_transaction_timeout_ms(60_000)
        };
        let r = call_retrying(self, "InitProducerId", make, |r| r.error_code).await?;
        Ok((r.producer_id.0, r.producer_epoch))
    }

    pub async fn metadata(&mut self, topic: Option<&str>) -> io::Result<MetadataResponse> {
        let v = self.version(ApiKey::Metadata)?;
        let mut req = MetadataRequest::default();
        req.topics = topic.map(|t| {
            let mut mt =
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default();
            mt.name = Some(topic_name(t));
            vec![mt]
        });
        req.allow_auto_topic_creation = false;
        self.request(&req, v).await
    }

    /// Creates `topic` with `partitions` (replication factor 1 unless given); an
    /// existing topic is fine.
    pub async fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        replication: i16,
    ) -> io::Result<()> {
        self.create_topic_with(topic, partitions, replication, &[])
            .await
    }

    /// `create_topic` with topic configs (name, value). A topic that already exists
    /// keeps its own configs: a warning says so when some were asked for.
    pub async fn create_topic_with(
        &mut self,
        topic: &str,
        partitions: i32,
        replication: i16,
        configs: &[(String, String)],
    ) -> io::Result<()> {
        use kafka_protocol::messages::create_topics_request::{
            CreatableTopic, CreatableTopicConfig,
        };
        let v = self.version(ApiKey::CreateTopics)?;
        let mut t = CreatableTopic::default();
        t.name = topic_name(topic);
        t.num_partitions = partitions;
        t.replication_factor = replication;
        t.configs = configs
            .iter()
            .map(|(k, val)| {
                let mut c = CreatableTopicConfig::default();
                c.name = sluice_client::sbs(k);
                c.value = Some(sluice_client::sbs(val));
                c
            })
            .collect();
        let mut req = CreateTopicsRequest::default();
        req.topics = vec![t];
        req.timeout_ms = 30_000;
        let resp: CreateTopicsResponse = self.request(&req, v).await?;
        for t in resp.topics {
            // 36 = TOPIC_ALREADY_EXISTS
            if t.error_code != 0 && t.error_code != 36 {
                return Err(err(format!(
                    "CreateTopics {topic}: error code {}{}",
                    t.error_code,
                    t.error_message
                        .as_ref()
                        .map(|m| format!(" ({})", m.as_str()))
                        .unwrap_or_default()
                )));
            }
            if t.error_code == 36 && !configs.is_empty() {
                eprintln!("sluice-bench: topic {topic} exists already; its configs stay as they are, not {configs:?}");
            }
        }
        Ok(())
    }

    /// Deletes `topic` (DeleteTopics); a topic that is gone already is no error.
    pub async fn delete_topic(&mut self, topic: &str) -> io::Result<()> {
        use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
        let v = self.version(ApiKey::DeleteTopics)?;
        let mut req = DeleteTopicsRequest::default();
        if v >= 6 {
            req.topics = vec![DeleteTopicState::default().with_name(Some(topic_name(topic)))];
        } else {
            req.topic_names = vec![topic_name(topic)];
        }
        req.timeout_ms = 30_000;
        let resp: DeleteTopicsResponse = self.request(&req, v).await?;
        for r in resp.responses {
            // 3 = UNKNOWN_TOPIC_OR_PARTITION
            if r.error_code != 0 && r.error_code != 3 {
                return Err(err(format!(
                    "DeleteTopics {topic}: error code {}",
                    r.error_code
                )));
            }
        }
        Ok(())
    }

    /// Leader broker address of every partition of `topic`, waiting (bounded) for the
    /// topic to have leaders.
    pub async fn leaders(&mut self, topic: &str) -> io::Result<Vec<(i32, SocketAddr)>> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let md = self.metadata(Some(topic)).await?;
            let brokers: HashMap<BrokerId, SocketAddr> = md
                .brokers
                .iter()
                .filter_map(|b| {
                    let host = if b.host.as_str() == "localhost" {
                        "127.0.0.1"
                    } else {
                        b.host.as_str()
                    };
                    format!("{host}:{}", b.port)
                        .parse()
                        .ok()
                        .map(|a| (b.node_id, a))
                })
                .collect();
            let mut out = Vec::new();
            let mut ok = !md.topics.is_empty();
            for t in &md.topics {
                if t.error_code != 0 || t.partitions.is_empty() {
                    ok = false;
                }
                for p in &t.partitions {
                    match brokers.get(&p.leader_id) {
                        Some(a) if p.error_code == 0 => out.push((p.partition_index, *a)),
                        _ => ok = false,
                    }
                }
            }
            if ok {
                out.sort_by_key(|(p, _)| *p);
                return Ok(out);
            }
            if std::time::Instant::now() > deadline {
                return Err(err(format!("topic {topic} has no leaders after 30 s")));
            }
            glommio::timer::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Replicas and in-sync replicas of every partition of `topic` as the broker's
    /// Metadata reports them: `(partition, replicas, isr)`, sorted by partition.
    pub async fn replica_sets(
        &mut self,
        topic: &str,
    ) -> io::Result<Vec<(i32, Vec<i32>, Vec<i32>)>> {
        let md = self.metadata(Some(topic)).await?;
        let mut out = Vec::new();
        for t in &md.topics {
            if t.error_code != 0 {
                return Err(err(format!(
                    "Metadata {topic}: error code {}",
                    t.error_code
                )));
            }
            for p in &t.partitions {
                let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
                out.push((p.partition_index, ids(&p.replica_nodes), ids(&p.isr_nodes)));
            }
        }
        out.sort_by_key(|(p, _, _)| *p);
        Ok(out)
    }

    /// Waits (bounded by `timeout`) until every partition of `topic` has `want`
    /// replicas, all of them in sync, and returns the replica sets it saw then.
    pub async fn wait_in_sync(
        &mut self,
        topic: &str,
        want: usize,
        timeout: std::time::Duration,
    ) -> io::Result<Vec<(i32, Vec<i32>, Vec<i32>)>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            // A topic just created may not be in this broker's metadata yet.
            let sets = match self.replica_sets(topic).await {
                Ok(sets) => sets,
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                Err(_) => Vec::new(),
            };
            let short: Vec<String> = sets
                .iter()
                .filter(|(_, r, isr)| r.len() != want || isr.len() != want)
                .map(|(p, r, isr)| format!("partition {p}: replicas {r:?}, isr {isr:?}"))
                .collect();
            if !sets.is_empty() && short.is_empty() {
                return Ok(sets);
            }
            if std::time::Instant::now() > deadline {
                return Err(err(format!(
                    "topic {topic}: not every partition has {want} in-sync replicas after {:.0} s: {}",
                    timeout.as_secs_f64(),
                    if sets.is_empty() { "no partitions".to_string() } else { short.join("; ") }
                )));
            }
            glommio::timer::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// The offset of every partition at `timestamp` (-1 latest, -2 earliest).
    pub async fn list_offsets(
        &mut self,
        topic: &str,
        partitions: &[i32],
        timestamp: i64,
    ) -> io::Result<HashMap<i32, i64>> {
        let v = self.version(ApiKey::ListOffsets)?;
        let mut t = kafka_protocol::messages::list_offsets_request::ListOffsetsTopic::default();
        t.name = topic_name(topic);
        t.partitions = partitions
            .iter()
            .map(|p| {
                let mut lp =
                    kafka_protocol::messages::list_offsets_request::ListOffsetsPartition::default();
                lp.partition_index = *p;
                lp.timestamp = timestamp;
                lp.current_leader_epoch = -1;
                lp
            })
            .collect();
        let mut req = ListOffsetsRequest::default();
        req.replica_id = BrokerId(-1);
        req.topics = vec![t];
        let resp: ListOffsetsResponse = self.request(&req, v).await?;
        let mut out = HashMap::new();
        for t in resp.topics {
            for p in t.partitions {
                if p.error_code != 0 {
                    return Err(err(format!(
                        "ListOffsets partition {}: error {}",
                        p.partition_index, p.error_code
                    )));
                }
                out.insert(p.partition_index, p.offset);
            }
        }
        Ok(out)
    }
}

pub use sluice_storage::batch::{get_varint, put_varint};

/// Builds uncompressed v2 record batches quickly: records of a fixed value size whose
/// first 8 bytes carry the record's intended send time in microseconds (for
/// end-to-end latency), with optional keys.
pub struct BatchBuilder {
    value_bytes: usize,
    filler: Vec<u8>,
}

impl BatchBuilder {
    pub fn new(value_bytes: usize) -> BatchBuilder {
        BatchBuilder {
            value_bytes,
            filler: vec![b'x'; value_bytes],
        }
    }

    /// About the bytes one record takes in a batch: its value and up to 24 bytes of
    /// length, attributes, deltas, key and header count.
    fn record_bytes(&self) -> usize {
        self.value_bytes + 24
    }

    /// How many records fill a batch of about `batch_bytes` (at least one).
    pub fn records_per_batch(&self, batch_bytes: usize) -> usize {
        (batch_bytes / self.record_bytes()).max(1)
    }

    /// One batch of records with send times `send_us` and keys `keys` (if any).
    pub fn build(&self, send_us: &[u64], keys: Option<&[u64]>) -> Bytes {
        let n = send_us.len();
        let per_record = self.record_bytes();
        let mut out = BytesMut::with_capacity(61 + n * per_record);
        let base_ts = (send_us[0] / 1000) as i64;
        let max_ts = (send_us[n - 1] / 1000) as i64;
        out.put_i64(0); // base offset
        out.put_i32(0); // length, patched
        out.put_i32(-1); // leader epoch
        out.put_i8(2);
        out.put_u32(0); // crc, patched
        out.put_i16(0); // attributes
        out.put_i32(n as i32 - 1);
        out.put_i64(base_ts);
        out.put_i64(max_ts);
        out.put_i64(-1); // producer id
        out.put_i16(-1);
        out.put_i32(-1);
        out.put_i32(n as i32);
        let mut rec = BytesMut::with_capacity(per_record);
        for i in 0..n {
            rec.clear();
            rec.put_u8(0);
            put_varint(&mut rec, (send_us[i] / 1000) as i64 - base_ts);
            put_varint(&mut rec, i as i64);
            match keys {
                Some(k) => {
                    put_varint(&mut rec, 8);
                    rec.put_u64(k[i]);
                }
                None => put_varint(&mut rec, -1),
            }
            put_varint(&mut rec, self.value_bytes as i64);
            if self.value_bytes >= 8 {
                rec.put_u64(send_us[i]);
                rec.put_slice(&self.filler[8..]);
            } else {
                rec.put_slice(&self.filler);
            }
            put_varint(&mut rec, 0); // headers
            put_varint(&mut out, rec.len() as i64);
            out.put_slice(&rec);
        }
        let len = out.len() as i32 - 12;
        out[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c::crc32c(&out[21..]);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        out.freeze()
    }
}

/// Walks the batches of a fetched record set: (records, bytes, send times of records
/// when `want_times`). Stops at a partial trailing batch (brokers may cut one).
pub fn walk_batches(mut buf: &[u8], want_times: bool, times: &mut Vec<u64>) -> (u64, u64, i64) {
    let mut records = 0u64;
    let mut bytes = 0u64;
    let mut next_offset = -1i64;
    while buf.len() >= 61 {
        let total = 12 + i32::from_be_bytes(buf[8..12].try_into().expect("4 bytes")) as usize;
        if total < 61 || total > buf.len() {
            break;
        }
        let batch = &buf[..total];
        let base = i64::from_be_bytes(batch[0..8].try_into().expect("8 bytes"));
        let last_delta = i32::from_be_bytes(batch[23..27].try_into().expect("4 bytes"));
        let count = i32::from_be_bytes(batch[57..61].try_into().expect("4 bytes"));
        let attributes = i16::from_be_bytes(batch[21..23].try_into().expect("2 bytes"));
        let control = attributes & 0x20 != 0;
        if !control {
            records += count.max(0) as u64;
            if want_times && attributes & 0x07 == 0 {
                collect_times(&batch[61..], count, times);
            }
        }
        bytes += total as u64;
        next_offset = base + i64::from(last_delta) + 1;
        buf = &buf[total..];
    }
    (records, bytes, next_offset)
}

fn collect_times(mut recs: &[u8], count: i32, times: &mut Vec<u64>) {
    for _ in 0..count {
        let Some(len) = get_varint(&mut recs) else {
            return;
        };
        let len = len as usize;
        if len > recs.len() {
            return;
        }
        let mut r = &recs[..len];
        recs = &recs[len..];
        r = &r[1..];
        let (Some(_), Some(_)) = (get_varint(&mut r), get_varint(&mut r)) else {
            return;
        };
        let Some(klen) = get_varint(&mut r) else {
            return;
        };
        if klen > 0 {
            r = &r[klen as usize..];
        }
        let Some(vlen) = get_varint(&mut r) else {
            return;
        };
        if vlen >= 8 && r.len() >= 8 {
            times.push(r.get_u64());
        }
    }
}

/// Kafka's default partitioner: murmur2 of the key, positive, modulo partitions.
pub fn murmur2_partition(key: &[u8], partitions: i32) -> i32 {
    let seed: u32 = 0x9747_b28c;
    let m: u32 = 0x5bd1_e995;
    let r = 24;
    let len = key.len();
    let mut h: u32 = seed ^ len as u32;
    let mut chunks = key.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(m);
        k ^= k >> r;
        k = k.wrapping_mul(m);
        h = h.wrapping_mul(m);
        h ^= k;
    }
    let rest = chunks.remainder();
    match rest.len() {
        3 => {
            h ^= u32::from(rest[2]) << 16;
            h ^= u32::from(rest[1]) << 8;
            h ^= u32::from(rest[0]);
            h = h.wrapping_mul(m);
        }
        2 => {
            h ^= u32::from(rest[1]) << 8;
            h ^= u32::from(rest[0]);
            h = h.wrapping_mul(m);
        }
        1 => {
            h ^= u32::from(rest[0]);
            h = h.wrapping_mul(m);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(m);
    h ^= h >> 15;
    ((h & 0x7fff_ffff) % partitions as u32) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_batches_are_valid_and_carry_send_times() {
        let b = BatchBuilder::new(100);
        let batch = b.build(&[1_000_000, 1_000_500, 1_002_000], Some(&[1, 2, 3]));
        let h = sluice_storage::batch::validate(&batch, true).expect("valid batch");
        assert_eq!(h.record_count, 3);
        assert_eq!((h.base_timestamp, h.max_timestamp), (1000, 1002));
        let mut times = Vec::new();
        let (n, bytes, next) = walk_batches(&batch, true, &mut times);
        assert_eq!((n, bytes as usize, next), (3, batch.len(), 3));
        assert_eq!(times, vec![1_000_000, 1_000_500, 1_002_000]);
    }

    #[test]
    fn sequenced_batches_carry_the_producer_and_stay_valid() {
        let b = BatchBuilder::new(10);
        let batch = b.build(&[1_000_000, 1_000_500], None);
        let s = sequenced(&batch, 42, 3, 7, false);
        let h = sluice_storage::batch::validate(&s, true).expect("valid batch");
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (42, 3, 7)
        );
        assert!(!h.is_transactional());
        let t = sequenced(&batch, 42, 3, 7, true);
        let h = sluice_storage::batch::validate(&t, true).expect("valid batch");
        assert!(h.is_transactional() && !h.is_control());
    }

    #[test]
    fn murmur2_matches_kafka_reference_values() {
        // Values from Kafka's Utils.murmur2 tests, as partition = toPositive(h) % 1e9.
        assert_eq!(
            murmur2_partition(b"21", i32::MAX),
            (-973932308i32 as u32 & 0x7fff_ffff) as i32
        );
        assert_eq!(
            murmur2_partition(b"foobar", i32::MAX),
            (-790332482i32 as u32 & 0x7fff_ffff) as i32
        );
    }
}
