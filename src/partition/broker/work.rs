//! Partition work on a partition's home shard: produce (leader appends and the
//! followers' replicated ones, in arrival order), end-transaction markers, reads and
//! long-poll waits, ListOffsets, OffsetForLeaderEpoch and DeleteRecords. Each call
//! runs on the shard that owns the partition's log and replica.

use super::*;
use crate::base::ids::{Offset, ProducerId};
use crate::base::rpc::{
    AbortedTxn, DeleteRecordsItem, EpochEndItem, EpochEndOut, ListOffsetsItem, ListedOffset,
    SegmentTime, WaitItem,
};

impl Broker {
    /// OffsetForLeaderEpoch on this shard's partitions.
    pub fn epoch_end_local(&self, items: Vec<EpochEndItem>) -> Vec<Result<EpochEndOut, ApiError>> {
        items
            .into_iter()
            .map(|it| {
                let (t, p) = (it.topic, it.partition);
                let (current, epoch) = (it.current_leader_epoch, it.leader_epoch);
                // An offline partition has no replica state left here: as Kafka, a
                // storage error, not NOT_LEADER_OR_FOLLOWER.
                let key = TopicPartitionRef::new(&t, p);
                if let Some(o) = self.offline.borrow().get(key.key()) {
                    return Err(offline_error(key, &o.cause));
                }
                let (leader_epoch, end_offset) = self
                    .replica(&t, p)
                    .and_then(|r| r.epoch_end(current, epoch))?;
                Ok(EpochEndOut {
                    leader_epoch,
                    end_offset,
                })
            })
            .collect()
    }

    /// min.insync.replicas of a partition: the topic's setting, else min(2, replicas).
    fn min_insync(&self, topic: &str, partition: i32, tc: &TopicConfig) -> usize {
        let image = self.image();
        let Some(meta) = image.topics.get(topic) else {
            return 1;
        };
        let set = meta.configs.contains_key("min.insync.replicas")
            || image
                .dynamic_broker_config(self.config.broker_id(), "min.insync.replicas")
                .is_some();
        if set {
            return tc.min_insync_replicas.max(1) as usize;
        }
        meta.assignment(partition)
            .map_or(1, |a| a.replicas.len().min(2))
    }

    /// Appends `records` to a partition this shard leads as acks=all would.
    pub async fn append_replicated(
        &self,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> Result<(), ApiError> {
        let item = ProduceItem {
            topic: topic.into(),
            partition,
            records,
            transactional_id: None,
        };
        self.produce_inner(-1, Duration::from_secs(5), item, true)
            .await
            .map(|_| ())
    }

    /// The first pass of a client's produce on a partition: the batches judged against
    /// the partition's producer state and given their offsets (the next append's turn
    /// released), not yet durable nor acknowledged; [`Self::produce_durable`] and
    /// [`Self::produce_acked`] complete it. A shard's part of a Produce request stages
    /// every partition first, so that one wait for the last journaled write makes the
    /// others durable at their first poll (see
    /// `crate::serve::dispatch::ShardServer::produce`).
    pub async fn produce_stage(
        &self,
        acks: i16,
        timeout: Duration,
        item: ProduceItem,
    ) -> Result<StagedProduce, ApiError> {
        self.produce_start(acks, timeout, item, false).await
    }

    /// `trusted`: the broker's own coordinators write (their transactional batches carry
    /// no sequence), appended without the producer checks.
    async fn produce_inner(
        &self,
        acks: i16,
        timeout: Duration,
        item: ProduceItem,
        trusted: bool,
    ) -> Result<Appended, ApiError> {
        let staged = self.produce_start(acks, timeout, item, trusted).await?;
        let durable = self.produce_durable(staged).await?;
        self.produce_acked(durable).await
    }

    async fn produce_start(
        &self,
        acks: i16,
        timeout: Duration,
        item: ProduceItem,
        trusted: bool,
    ) -> Result<StagedProduce, ApiError> {
        let deadline = Instant::now() + timeout;
        let (log, tc) = self.log(&item.topic, item.partition)?;
        let replica = self.replica(&item.topic, item.partition)?;
        // Taken before the first await, so turns follow the order requests arrived in.
        let turn = replica.append_turn();
        turn.wait().await;
        let mut turn = Some(turn);
        let min_insync = self.min_insync(&item.topic, item.partition, &tc);
        let epoch = if acks == -1 {
            replica.check_min_isr(min_insync)?
        } else {
            replica.leader_epoch().ok_or_else(|| {
                ApiError::with(
                    ResponseError::NotLeaderOrFollower,
                    "this broker is not the leader of the partition",
                )
            })?
        };
        // The epoch's checkpoint entry is durable before its first batch (immediate
        // unless the epoch just began); a failed checkpoint fails the partition.
        replica.epochs_durable().await?;
        // The coordinators' own writes (offsets, transaction state) use the reserve.
        if !trusted {
            self.disk.admit(item.records.len())?;
            if tc.log.remote_storage {
                if let Some(t) = self.tiered() {
                    t.admit()?;
                }
            }
        }
        let batches = batch::split_batches(&item.records)
            .map_err(|e| error::from_storage(&sluice_storage::Error::Batch(e)))?;
        if batches.is_empty() {
            return Err(ApiError::with(
                ResponseError::CorruptMessage,
                "produce request holds no record batch",
            ));
        }
        let (max, limit) = match trusted {
            true => (INTERNAL_BATCH_BYTES_MAX, "the internal batch limit"),
            false => (tc.log.max_message_bytes, "max.message.bytes"),
        };
        if let Some((_, r)) = batches.iter().find(|(_, r)| r.len() > max) {
            return Err(ApiError::with(
                ResponseError::MessageTooLarge,
                format!("batch of {} bytes is larger than {limit} {max}", r.len()),
            ));
        }
        // Per-record rules (KIP-467) fail the whole write before any batch is appended.
        // The coordinators' own writes are trusted.
        if !trusted {
            let bytes = batches.iter().map(|(_, r)| &item.records[r.clone()]);
            let rules = crate::base::record_rules::Rules {
                compacted: tc.log.cleanup_compact,
                create_time: tc.log.timestamp_type == sluice_storage::TimestampType::CreateTime,
                before_max_ms: tc.timestamp_before_max_ms,
                after_max_ms: tc.timestamp_after_max_ms,
                now_ms: crate::base::util::now_ms(),
            };
            crate::base::record_rules::check(&item.topic, item.partition, &rules, bytes)?;
        }
        // The topic's compression.type: a batch with another codec is recompressed
        // (CPU bounded by max.message.bytes per batch; the reactor may run others
        // between batches).
        let mut stored = Vec::with_capacity(batches.len());
        for (_, range) in batches {
            let sent = item.records.slice(range);
            let recompressed = match trusted {
                true => None,
                false => crate::base::record_rules::stored_form(
                    &item.topic,
                    item.partition,
                    tc.compression,
                    tc.compression_levels,
                    &sent,
                )?,
            };
            match recompressed {
                Some(b) if b.len() > max => {
                    return Err(ApiError::with(
                        ResponseError::MessageTooLarge,
                        format!(
                            "batch recompressed with compression.type is {} bytes, larger than max.message.bytes {max}",
                            b.len()
                        ),
                    ))
                }
                Some(b) => {
                    stored.push(Bytes::from(b));
                    glommio::yield_if_needed().await;
                }
                None => stored.push(sent),
            }
        }
        let mut first: Option<sluice_storage::AppendInfo> = None;
        let mut last_offset = 0;
        let gap_deadline = Instant::now() + timeout.min(SEQUENCE_GAP_WAIT);
        let mut writes = Vec::with_capacity(stored.len());
        for batch in &stored {
            let info = if trusted {
                log.append_bounded(batch, epoch.get(), INTERNAL_BATCH_BYTES_MAX)
                    .await
                    .map_err(|e| error::from_storage(&e))?
            } else {
                let started = Instant::now();
                let (info, staged) =
                    append_in_sequence(&log, &replica, batch, epoch.get(), gap_deadline, &mut turn)
                        .await?;
                writes.extend(staged.map(|s| (started, s)));
                let m = self.shard_metrics();
                crate::observe::metrics::ShardMetrics::add(
                    &m.records_in,
                    info.record_count.max(0) as u64,
                );
                info
            };
            last_offset = info.last_offset;
            first.get_or_insert(info);
        }
        // Offsets assigned: the next request's appends may go, and join the write in
        // flight's successor while this request waits for its own (group commit).
        drop(turn);
        Ok(StagedProduce {
            log,
            replica,
            epoch,
            writes,
            first: first.expect("at least one batch"),
            last_offset,
            min_insync,
            acks,
            deadline,
        })
    }

    /// The second pass of a produce: waits until the staged batches are written and as
    /// durable as the topic's flush policy asks.
    pub async fn produce_durable(
        &self,
        mut staged: StagedProduce,
    ) -> Result<StagedProduce, ApiError> {
        for (started, write) in std::mem::take(&mut staged.writes) {
            staged
                .log
                .written(write)
                .await
                .map_err(|e| error::from_storage(&e))?;
            self.shard_metrics()
                .append_latency
                .record(started.elapsed());
        }
        // "Acknowledged means on disk": wait for the topic's flush policy (fdatasync by
        // default) before answering or counting it replicated. acks=0 flushes too: only
        // durable data is replicated and becomes visible below the high watermark.
        // Refused if leadership moved meanwhile (the append will be truncated away).
        staged.replica.flush(staged.epoch).await?;
        Ok(staged)
    }

    /// The last step of a produce, once durable: acks=all waits (until the request's
    /// deadline, counted from the stage) for the high watermark to cover the batches.
    pub async fn produce_acked(&self, durable: StagedProduce) -> Result<Appended, ApiError> {
        let StagedProduce {
            replica,
            epoch,
            first,
            last_offset,
            min_insync,
            acks,
            deadline,
            ..
        } = durable;
        if acks == -1 {
            let left = deadline.saturating_duration_since(Instant::now());
            replica
                .wait_acked(Offset::new(last_offset).next(), epoch, min_insync, left)
                .await?;
        }
        // Pair assertion: what an acknowledged produce reports was appended in this
        // leader's epoch, and acks=all returned only once the high watermark covered it.
        let base_offset = Offset::new(first.base_offset);
        assert!(
            base_offset <= Offset::new(last_offset)
                && (acks != -1 || replica.high_watermark() > Offset::new(last_offset)),
            "{}-{}: appended [{base_offset}, {last_offset}] acks={acks}, high watermark {}",
            replica.topic,
            replica.partition,
            replica.high_watermark()
        );
        Ok(Appended {
            base_offset,
            log_append_time_ms: first.log_append_time_ms,
            log_start_offset: replica.log_start(),
        })
    }

    /// Writes a transaction marker on a partition this broker leads (WriteTxnMarkers
    /// from a transaction coordinator) and waits until the in-sync replicas have it,
    /// as Kafka appends markers with acks=all.
    pub async fn write_marker_local(
        &self,
        it: &crate::base::rpc::MarkerItem,
    ) -> Result<(), ApiError> {
        let (log, tc) = self.log(&it.topic, it.partition)?;
        let replica = self.replica(&it.topic, it.partition)?;
        let min_insync = self.min_insync(&it.topic, it.partition, &tc);
        let epoch = replica.check_min_isr(min_insync)?;
        replica.epochs_durable().await?;
        let judged = log
            .append_marker(
                it.producer_id.get(),
                it.producer_epoch,
                it.commit,
                it.coordinator_epoch,
                epoch.get(),
            )
            .await
            .map_err(|e| error::from_storage(&e))?;
        // Producers verifying their first transactional batch here look at this.
        replica.markers.set(replica.markers.get() + 1);
        let last_offset = match judged {
            sluice_storage::Judged::Appended(info) => info.last_offset,
            sluice_storage::Judged::Duplicate(meta) => meta.last_offset,
            sluice_storage::Judged::Refused(e) => return Err(error::from_txn(&e)),
        };
        replica.appended.notify(usize::MAX);
        replica.flush(epoch).await?;
        replica
            .wait_acked(
                Offset::new(last_offset).next(),
                epoch,
                min_insync,
                Duration::from_secs(10),
            )
            .await?;
        // Pair assertion: a marker is answered once the high watermark covers it.
        assert!(
            replica.high_watermark() > Offset::new(last_offset),
            "{}-{}: marker at {last_offset} acknowledged below the high watermark {}",
            it.topic,
            it.partition,
            replica.high_watermark()
        );
        Ok(())
    }

    pub async fn read_local(self: &Rc<Self>, item: ReadItem) -> ReadOut {
        match self.read_start(item) {
            Ok(out) => out,
            Err(pending) => self.read_finish(pending).await,
        }
    }

    /// The part of a read that needs no disk: the answer (an error, nothing new, or
    /// records from the tail cache), or the read to finish with [`Self::read_finish`].
    /// A follower's fetch reads thousands of partitions per shard call, almost all from
    /// the tail cache: only the rest get a future.
    pub fn read_start(self: &Rc<Self>, item: ReadItem) -> Result<ReadOut, PendingRead> {
        let failed = |e: ApiError| ReadOut {
            error: Some(e),
            high_watermark: Offset::NONE,
            last_stable_offset: Offset::NONE,
            log_start_offset: Offset::NONE,
            ..Default::default()
        };
        // One lookup: a partition with a replica here has its log open (`apply` and
        // `take_offline` add and remove the two together). A follower's fetch reads
        // every partition of its session, thousands per fetch at scale, so `log`'s
        // lookups (image, topic, log, config) are left to the partitions that fail.
        let replica = match self.replica(&item.topic, item.partition) {
            Ok(r) => r,
            Err(e) => {
                return Ok(failed(
                    self.log(&item.topic, item.partition).err().unwrap_or(e),
                ))
            }
        };
        let log = replica.log.clone();
        if let Some(cause) = log.failure() {
            let key = TopicPartitionRef::new(&item.topic, item.partition);
            return Ok(failed(self.take_offline(key, cause)));
        }
        let (bound, hw, alter) =
            match replica.fetch_bound(item.replica_id, item.current_leader_epoch, item.offset) {
                Ok(x) => x,
                // The log start tells a follower below it where to resume.
                Err(e) => {
                    let log_start = if item.replica_id.get() < 0 {
                        replica.client_log_start()
                    } else {
                        replica.log_start()
                    };
                    return Ok(ReadOut {
                        log_start_offset: log_start,
                        ..failed(e)
                    });
                }
            };
        if let Some(alter) = alter {
            self.each_subscriber(|s| s.propose_isr(self, &replica, alter.clone()));
        }
        // Kafka's last stable offset: below the first offset of any open transaction.
        let lso = log
            .first_unstable_offset()
            .map_or(hw, |u| Offset::new(u).min(hw));
        let bound = if item.read_committed {
            bound.min(lso)
        } else {
            bound
        };
        // Tiered storage: a consumer below the local log start reads the object store.
        let consumer = item.replica_id.get() < 0;
        let log_start = replica.log_start();
        if consumer && item.offset < log_start {
            if let Some(tiered) = self.tiered() {
                if item.offset.get() >= replica.remote_start.get() {
                    return Err(PendingRead {
                        replica,
                        item,
                        bound,
                        hw,
                        lso,
                        remote: Some(tiered),
                    });
                }
            }
        }
        // Nothing new to read (most partitions of a fetch session most of the time):
        // what the read would answer, without it. Below the log start the read answers
        // OFFSET_OUT_OF_RANGE.
        if item.offset == bound && item.offset >= log_start {
            return Ok(ReadOut {
                error: None,
                high_watermark: hw,
                last_stable_offset: lso,
                log_start_offset: if consumer {
                    replica.client_log_start()
                } else {
                    log_start
                },
                records: Bytes::new(),
                aborted: Vec::new(),
            });
        }
        let pending = PendingRead {
            replica,
            item,
            bound,
            hw,
            lso,
            remote: None,
        };
        match pending.replica.log.read_cached(
            pending.item.offset.get(),
            pending.item.max_bytes.max(1),
            Some(bound.get()),
        ) {
            Some(r) => Ok(pending.answer(r)),
            None => Err(pending),
        }
    }

    /// The rest of a read [`Self::read_start`] could not answer: from the segment files.
    pub async fn read_finish(&self, pending: PendingRead) -> ReadOut {
        if let Some(tiered) = &pending.remote {
            return pending.answer_remote(tiered, self.image()).await;
        }
        let r = pending
            .replica
            .log
            .read(
                pending.item.offset.get(),
                pending.item.max_bytes.max(1),
                Some(pending.bound.get()),
            )
            .await;
        pending.answer(r)
    }

    /// Waits until any partition's visible end (log end for a follower, high
    /// watermark for a consumer) passes its offset, or the timeout (see
    /// [`crate::base::util::wait_any`]: no progress between the check and the wait is missed).
    pub async fn wait_local(
        &self,
        items: Vec<WaitItem>,
        timeout: Duration,
        follower: bool,
        read_committed: bool,
    ) -> bool {
        let replicas: Vec<_> = items
            .iter()
            .filter_map(|it| Some((self.replica(&it.topic, it.partition).ok()?, it.offset)))
            .collect();
        let mut conditions: Vec<crate::base::util::Condition<'_>> = Vec::new();
        for (r, offset) in &replicas {
            if follower {
                // Woken by the append itself, not its write (see `Replica::fetch_bound`),
                // and by `progress`, which also fires when the role changes.
                for event in [r.log.append_event(), &r.progress] {
                    conditions.push((event, Box::new(move || r.log_end() > *offset)));
                }
                continue;
            }
            let holds: Box<dyn Fn() -> bool> = Box::new(move || {
                let visible = if read_committed {
                    // The last stable offset moves only with a marker, whose
                    // replication moves the high watermark: `progress` fires.
                    let hw = r.high_watermark();
                    r.log
                        .first_unstable_offset()
                        .map_or(hw, |u| Offset::new(u).min(hw))
                } else {
                    r.high_watermark()
                };
                visible > *offset
            });
            conditions.push((&r.progress, holds));
        }
        crate::base::util::wait_any(conditions, timeout).await
    }

    pub async fn list_offset_local(
        &self,
        item: ListOffsetsItem,
        read_committed: bool,
    ) -> Result<ListedOffset, ApiError> {
        let ListOffsetsItem {
            topic,
            partition,
            timestamp: ts,
            current_leader_epoch,
        } = item;
        let (log, _) = self.log(&topic, partition)?;
        let replica = self.replica(&topic, partition)?;
        let (offset, timestamp) = self
            .list_offset_of(&log, &replica, ts, current_leader_epoch, read_committed)
            .await?;
        // Kafka answers the leader epoch of the record found (`epochForOffset`, a
        // batch's epoch), and the current one for "latest".
        let leader_epoch = match (ts, offset) {
            (_, Offset::NONE) => LeaderEpoch::NONE,
            (-1, _) => replica.leader_epoch().unwrap_or(LeaderEpoch::NONE),
            _ => replica.epoch_of(offset),
        };
        Ok(ListedOffset {
            offset,
            timestamp,
            leader_epoch,
        })
    }

    /// [`Self::list_offset_local`]'s offset and timestamp.
    async fn list_offset_of(
        &self,
        log: &Rc<PartitionLog>,
        replica: &Rc<Replica>,
        ts: i64,
        current_leader_epoch: LeaderEpoch,
        read_committed: bool,
    ) -> Result<(Offset, i64), ApiError> {
        let (_, hw, _) = replica.fetch_bound(BrokerId::NONE, current_leader_epoch, Offset::ZERO)?;
        // A new leader's high watermark below its epoch's start is older than what the
        // previous leader answered: "latest", and a lookup it hides, would go back.
        let lagging = replica.high_watermark_lags_epoch_start().then(|| {
            ApiError::with(
                ResponseError::OffsetNotAvailable,
                format!("the high watermark {hw} lags the start of this leader's epoch"),
            )
        });
        // read_committed: "latest" is the last stable offset.
        let hw = if read_committed {
            log.first_unstable_offset()
                .map_or(hw, |u| Offset::new(u).min(hw))
        } else {
            hw
        };
        match ts {
            // Earliest: the remote start with tiered storage; earliest-local (-4, v8)
            // what this broker's files hold.
            -2 => Ok((replica.client_log_start(), -1)),
            -4 => Ok((replica.log_start(), -1)),
            // Latest tiered (-5, v9): the last offset in the object store, -1 if none.
            -5 => {
                let image = self.image();
                let end =
                    crate::partition::tiered::remote_log(&image, &replica.topic, replica.partition)
                        .and_then(|l| l.end_offset());
                Ok((end.map_or(Offset::NONE, |e| Offset::new(e - 1)), -1))
            }
            // Latest is the high watermark.
            -1 => lagging.map_or(Ok((hw, -1)), Err),
            // Max-timestamp (KIP-734): the first record with the largest timestamp, if
            // it is below the high watermark, as the search by timestamp below.
            -3 => match log.max_timestamp() {
                -1 => lagging.map_or(Ok((Offset::NONE, -1)), Err),
                max => self.offset_at_timestamp(log, max, hw, lagging).await,
            },
            ts if ts < 0 => Err(ApiError::with(
                ResponseError::InvalidRequest,
                format!("bad timestamp {ts}"),
            )),
            ts => {
                // Tiered storage: the remote segments below the local log come first.
                if let Some(tiered) = self.tiered() {
                    let found = crate::partition::tiered::offset_for_timestamp(
                        &tiered,
                        self.image(),
                        replica,
                        ts,
                    )
                    .await?;
                    if let Some((o, t)) = found {
                        return Ok((Offset::new(o), t));
                    }
                }
                self.offset_at_timestamp(log, ts, hw, lagging).await
            }
        }
    }

    /// ListOffsets v0's view of a partition's log (see [`crate::base::rpc::SegmentTimes`]),
    /// as Kafka builds it: a leader answers (any replica if not `leader_only`).
    pub fn offsets_before_local(
        &self,
        topic: &str,
        partition: i32,
        leader_only: bool,
    ) -> Result<crate::base::rpc::SegmentTimes, ApiError> {
        let (log, _) = self.log(topic, partition)?;
        let replica = self.replica(topic, partition)?;
        let high_watermark =
            match replica.fetch_bound(BrokerId::NONE, LeaderEpoch::NONE, Offset::ZERO) {
                Ok((_, hw, _)) => Some(hw),
                Err(e) if leader_only => return Err(e),
                Err(_) => None,
            };
        let start = log.log_start_offset();
        let segments = log.segment_times();
        let mut offset_times: Vec<SegmentTime> = segments
            .iter()
            .map(|&(base, _, modified)| SegmentTime {
                offset: Offset::new(base.max(start)),
                time_ms: modified,
            })
            .collect();
        if segments.last().is_some_and(|&(_, size, _)| size > 0) {
            offset_times.push(SegmentTime {
                offset: replica.log_end(),
                time_ms: crate::base::util::now_ms(),
            });
        }
        Ok(crate::base::rpc::SegmentTimes {
            offset_times,
            high_watermark,
        })
    }

    /// The first record at or after timestamp `ts` below `hw`; else `lagging` (the
    /// answer while a new leader's high watermark lags its epoch, see
    /// [`Replica::high_watermark_lags_epoch_start`]) or (-1, -1).
    async fn offset_at_timestamp(
        &self,
        log: &PartitionLog,
        ts: i64,
        hw: Offset,
        lagging: Option<ApiError>,
    ) -> Result<(Offset, i64), ApiError> {
        match log.offset_for_timestamp(ts).await {
            Ok(Some((o, t))) if Offset::new(o) < hw => Ok((Offset::new(o), t)),
            Ok(Some(_)) | Ok(None) => lagging.map_or(Ok((Offset::NONE, -1)), Err),
            Err(e) => Err(error::from_storage(&e)),
        }
    }

    pub async fn delete_records_local(&self, item: DeleteRecordsItem) -> Result<Offset, ApiError> {
        let DeleteRecordsItem {
            topic,
            partition,
            before_offset: offset,
        } = item;
        let (log, _) = self.log(&topic, partition)?;
        let (_, end, _) = self.replica(&topic, partition)?.fetch_bound(
            BrokerId::NONE,
            LeaderEpoch::NONE,
            Offset::ZERO,
        )?;
        // As Kafka (`Partition.deleteRecordsOnLeader`): only a log whose cleanup.policy
        // deletes may lose records on request (a compacted-only log, such as the group
        // offsets', keeps its latest record per key).
        if !log.config().cleanup_delete {
            return Err(ApiError::with(
                ResponseError::PolicyViolation,
                format!("Records of partition {topic}-{partition} can not be deleted due to the configured policy"),
            ));
        }
        let offset = if offset == Offset::NONE { end } else { offset };
        if !offset.is_some() || offset > end {
            return Err(ApiError::with(
                ResponseError::OffsetOutOfRange,
                format!("offset {offset} is beyond the high watermark {end}"),
            ));
        }
        let local = log
            .delete_records_before(offset.get())
            .await
            .map(Offset::new)
            .map_err(|e| error::from_storage(&e))?;
        // Tiered storage: the remote log starts there too; the objects of segments
        // wholly below it go with the leader's next sweep (`crate::cluster::tiering`).
        let replica = self.replica(&topic, partition)?;
        if let (Some(tiered), true) = (self.tiered(), replica.remote_start.get() < offset.get()) {
            self.delete_remote_records(&tiered, &topic, partition, offset.get())
                .await?;
        }
        Ok(local.min(replica.client_log_start()).max(offset))
    }

    /// DeleteRecords on a tiered partition: the remote log starts at `offset` (the
    /// quorum's record first), then the objects of the segments wholly below it go.
    async fn delete_remote_records(
        &self,
        tiered: &crate::partition::tiered::Tiered,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(), ApiError> {
        let image = self.image();
        let prefix = match image.topics.get(topic) {
            Some(meta) => crate::partition::tiered::partition_prefix(topic, &meta.id, partition),
            None => return Err(ApiError::new(ResponseError::UnknownTopicOrPartition)),
        };
        let gone: Vec<_> = crate::partition::tiered::remote_log(&image, topic, partition)
            .map(|l| {
                l.segments
                    .iter()
                    .filter(|s| s.last_offset < offset)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        drop(image);
        let cut = sluice_replication::cluster::Command::DeleteRemoteSegments {
            topic: topic.to_string(),
            partition,
            below: offset,
        };
        match self.control(crate::base::rpc::Propose(cut)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) | Err(e) => return Err(e),
        }
        for s in &gone {
            tiered
                .reader
                .forget(&crate::partition::tiered::segment_ref(&prefix, s));
            crate::partition::tiered::delete_objects(tiered, &prefix, s.base_offset, s.id).await;
        }
        Ok(())
    }

    /// Waits (bounded by `deadline`) for a partition of any item to have data past the
    /// given offset. True if one did.
    pub async fn wait_for_data(
        &self,
        items: Vec<(ShardId, WaitItem)>,
        deadline: Instant,
        follower: bool,
        read_committed: bool,
    ) -> bool {
        let timeout = deadline.saturating_duration_since(Instant::now());
        if timeout.is_zero() || items.is_empty() {
            return false;
        }
        let mut groups: BTreeMap<ShardId, Vec<WaitItem>> = BTreeMap::new();
        for (s, it) in items {
            groups.entry(s).or_default().push(it);
        }
        let calls = groups
            .into_iter()
            .map(|(s, items)| async move {
                let wait = Wait {
                    items,
                    timeout,
                    follower,
                    read_committed,
                };
                matches!(self.call(s, wait).await, Ok(true))
            })
            .collect();
        any_true(calls).await
    }
}

/// A produce's batches with their offsets, waiting to be durable and acknowledged
/// ([`Broker::produce_stage`], [`Broker::produce_durable`], [`Broker::produce_acked`]).
pub struct StagedProduce {
    log: Rc<PartitionLog>,
    replica: Rc<Replica>,
    epoch: LeaderEpoch,
    writes: Vec<(Instant, sluice_storage::Staged)>,
    first: sluice_storage::AppendInfo,
    last_offset: i64,
    min_insync: usize,
    acks: i16,
    /// When acks=all stops waiting: the request's timeout from its stage.
    deadline: Instant,
}

impl StagedProduce {
    /// True if every batch went through the shard's journal (see
    /// [`crate::base::util::last_first`]).
    pub fn journaled(&self) -> bool {
        sluice_storage::Staged::all_journaled(self.writes.iter().map(|(_, s)| s))
    }
}

/// Appends one batch of a produce request through the partition's producer state: a
/// retry of a batch already in the log answers with that batch's offsets; a batch that
/// is ahead of its producer's sequence waits (until `deadline`) for the ones before it,
/// without its append `turn` (see [`Replica::append_turn`]).
async fn append_in_sequence(
    log: &PartitionLog,
    replica: &Replica,
    batch: &Bytes,
    epoch: i32,
    deadline: Instant,
    turn: &mut Option<crate::base::util::Turn>,
) -> Result<(sluice_storage::AppendInfo, Option<sluice_storage::Staged>), ApiError> {
    use sluice_storage::producer::SequenceError;
    use sluice_storage::Judged;
    // Listened for only once a try finds the batch ahead, then tried again before
    // waiting, so an append between the try and the wait is seen (a listener per
    // append was an allocation each at 10,000 partitions).
    let mut appended = None;
    loop {
        let err = match log.append_judged_staged(batch.clone(), epoch).await {
            Ok((Judged::Appended(info), staged)) => {
                replica.appended.notify(usize::MAX);
                return Ok((info, staged));
            }
            Ok((Judged::Refused(e), _)) => return Err(error::from_txn(&e)),
            Ok((Judged::Duplicate(meta), _)) => {
                let info = sluice_storage::AppendInfo {
                    base_offset: meta.first_offset,
                    last_offset: meta.last_offset,
                    // Kafka answers a duplicate without a log-append time.
                    log_append_time_ms: -1,
                    record_count: (meta.last_offset - meta.first_offset + 1) as i32,
                };
                return Ok((info, None));
            }
            Err(e) => e,
        };
        let ahead = matches!(
            &err,
            sluice_storage::Error::Sequence(SequenceError::OutOfOrder { first_seq, last_seq, .. })
                if *last_seq >= 0 && *first_seq > *last_seq
        );
        let left = deadline.saturating_duration_since(Instant::now());
        if !ahead || left.is_zero() {
            return Err(error::from_storage(&err));
        }
        let Some(appended) = appended.take() else {
            appended = Some(replica.appended.listen());
            continue;
        };
        // A batch ahead of its sequence has its place by sequence, not by arrival: it
        // gives up its turn so that the batches before it (from another connection,
        // after a reconnect) can append.
        turn.take();
        let woke = futures_lite::future::or(
            async {
                appended.await;
                true
            },
            async {
                glommio::timer::sleep(left).await;
                false
            },
        )
        .await;
        if !woke {
            return Err(error::from_storage(&err));
        }
    }
}

/// How long a Fetch waits for a partition's read from tiered storage's object store
/// before answering it without records (Kafka's `remote.fetch.max.wait.ms` default).
pub const REMOTE_FETCH_MAX_WAIT: Duration = Duration::from_millis(500);

/// A read that must go to the segment files (see [`Broker::read_start`]).
pub struct PendingRead {
    replica: Rc<Replica>,
    item: ReadItem,
    bound: Offset,
    hw: Offset,
    lso: Offset,
    /// Below the local log start: read from tiered storage's object store.
    remote: Option<Rc<crate::partition::tiered::Tiered>>,
}

impl PendingRead {
    /// The log start to answer: the local one to a replica (it fetches only what is
    /// local), the one clients see (tiered storage's remote start) to a consumer.
    fn log_start(&self, local: Offset) -> Offset {
        if self.item.replica_id.get() < 0 {
            local.min(Offset::new(self.replica.remote_start.get()))
        } else {
            local
        }
    }

    /// The answer from the remote segment holding the offset.
    /// The read runs as a task of its own and the answer waits for it at most
    /// [`REMOTE_FETCH_MAX_WAIT`] (Kafka's `remote.fetch.max.wait.ms` default): a slow
    /// store does not hold up the other partitions of the Fetch. Past that the
    /// partition is answered without records (the client asks again) while the read
    /// goes on and leaves its chunks in the cache for the next ask.
    async fn answer_remote(
        &self,
        tiered: &Rc<crate::partition::tiered::Tiered>,
        image: Arc<MetadataImage>,
    ) -> ReadOut {
        let item = &self.item;
        let (t, replica) = (tiered.clone(), self.replica.clone());
        let (offset, max_bytes, bound, committed) = (
            item.offset.get(),
            item.max_bytes.max(1),
            self.bound.get(),
            item.read_committed,
        );
        let task = glommio::spawn_local(async move {
            crate::partition::tiered::read(&t, image, &replica, offset, max_bytes, bound, committed)
                .await
        })
        .detach();
        let waited = futures_lite::future::or(task, async {
            glommio::timer::sleep(REMOTE_FETCH_MAX_WAIT).await;
            None
        })
        .await;
        let base = ReadOut {
            error: None,
            high_watermark: self.hw,
            last_stable_offset: self.lso,
            log_start_offset: self.replica.client_log_start(),
            ..Default::default()
        };
        let Some(r) = waited else {
            return base;
        };
        match r {
            Ok((records, aborted)) => ReadOut {
                records,
                aborted: aborted
                    .into_iter()
                    .map(|(producer_id, first_offset)| AbortedTxn {
                        producer_id: ProducerId::new(producer_id),
                        first_offset: Offset::new(first_offset),
                    })
                    .collect(),
                ..base
            },
            Err(e) => ReadOut {
                error: Some(e),
                ..base
            },
        }
    }

    /// The answer from the log's read.
    fn answer(&self, r: Result<sluice_storage::log::ReadResult, sluice_storage::Error>) -> ReadOut {
        let (item, log) = (&self.item, &self.replica.log);
        match r {
            Ok(r) => {
                let aborted = if item.read_committed && !r.records.is_empty() {
                    log.aborted_transactions(item.offset.get(), r.next_offset)
                        .into_iter()
                        .map(|(producer_id, first_offset)| AbortedTxn {
                            producer_id: ProducerId::new(producer_id),
                            first_offset: Offset::new(first_offset),
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                ReadOut {
                    error: None,
                    high_watermark: self.hw,
                    last_stable_offset: self.lso,
                    log_start_offset: self.log_start(Offset::new(r.log_start_offset)),
                    records: r.records,
                    aborted,
                }
            }
            Err(e) => ReadOut {
                error: Some(error::from_storage(&e)),
                high_watermark: self.hw,
                last_stable_offset: self.lso,
                log_start_offset: self.log_start(self.replica.log_start()),
                ..Default::default()
            },
        }
    }
}
