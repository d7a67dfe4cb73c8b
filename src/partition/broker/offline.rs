//! Offline partitions: a log that failed (an I/O error, a full disk) is taken offline
//! with KAFKA_STORAGE_ERROR for every call, described as such, and reopened (recovery
//! re-reads it) by a background task once its cause may be gone.

use super::*;
use crate::base::rpc::{OfflineLog, OnlineLog};

pub(super) fn offline_error(key: TopicPartitionRef<'_>, cause: &str) -> ApiError {
    ApiError::with(
        ResponseError::KafkaStorageError,
        format!(
            "{key} is offline after an I/O error ({cause}); it reopens by itself once its files can be read again"
        ),
    )
}

impl Broker {
    /// Takes a partition whose log failed offline: its log and replica leave the maps
    /// (every request then answers KAFKA_STORAGE_ERROR with the cause, logged here
    /// once) until [`Self::tend_offline`] has reopened it, re-reading its files.
    pub(super) fn take_offline(&self, key: TopicPartitionRef<'_>, cause: String) -> ApiError {
        let log = self.logs.borrow_mut().remove_entry(key.key());
        let replica = self.replicas.borrow_mut().remove(key.key());
        self.changes.changed(&key.topic.into(), key.partition);
        self.hosting_changed();
        // A partition's log and replica enter and leave the maps together.
        assert_eq!(
            log.is_some(),
            replica.is_some(),
            "{key}: log and replica were not both open"
        );
        let led_in = replica.and_then(|r| r.leader_epoch());
        if let Some((owned, log)) = log {
            tracing::error!(topic = %key.topic, partition = key.partition, error = %cause, "partition offline after an I/O error: its log is closed and reopened (re-read) once its files can be read and written again");
            self.offline.borrow_mut().insert(
                owned,
                Offline {
                    cause: cause.clone(),
                    failed: Some(log),
                    announced: false,
                    led_in,
                    attempts: 0,
                    next_attempt: Instant::now() + OFFLINE_RETRY_FIRST,
                },
            );
        }
        offline_error(key, &cause)
    }

    /// This shard's logs for DescribeLogDirs.
    pub fn describe_logs_local(&self) -> crate::base::rpc::ShardLogs {
        let replicas = self.replicas.borrow();
        let online = self
            .logs
            .borrow()
            .iter()
            .map(|(key, log)| {
                let end = log.log_end_offset();
                let lag = replicas
                    .get(key)
                    .map_or(0, |r| (end - r.high_watermark().get()).max(0));
                OnlineLog {
                    topic: key.topic().to_string(),
                    partition: key.partition(),
                    size_bytes: log.size_bytes(),
                    offset_lag: lag,
                }
            })
            .collect();
        let offline = self
            .offline
            .borrow()
            .iter()
            .map(|(key, o)| OfflineLog {
                topic: key.topic().to_string(),
                partition: key.partition(),
                cause: o.cause.clone(),
            })
            .collect();
        crate::base::rpc::ShardLogs { online, offline }
    }

    /// Runs now and then on every shard: takes partitions whose log failed (in a
    /// request or in the background) offline, tells the layers above once (in a cluster
    /// they move its leadership to a healthy in-sync replica), and tries to reopen
    /// offline partitions with backoff. Reopening runs recovery, so nothing is served
    /// from a file whose state after the error was not read back.
    pub async fn tend_offline(self: &Rc<Self>) {
        let failed: Vec<(TopicPartition, String)> = self
            .logs
            .borrow()
            .iter()
            .filter_map(|(k, l)| l.failure().map(|c| (k.clone(), c)))
            .collect();
        for (key, cause) in failed {
            self.take_offline(key.as_ref(), cause);
        }
        let unannounced: Vec<TopicPartition> = self
            .offline
            .borrow_mut()
            .iter_mut()
            .filter_map(|(k, o)| (!std::mem::replace(&mut o.announced, true)).then(|| k.clone()))
            .collect();
        for key in &unannounced {
            self.each_subscriber(|s| s.partition_offline(self, key.topic(), key.partition()));
        }
        let due: Vec<TopicPartition> = self
            .offline
            .borrow()
            .iter()
            .filter(|(_, o)| o.next_attempt <= Instant::now())
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.reopen(&key).await;
        }
    }

    /// Serialises what opens or closes logs on this shard (image changes, reopening
    /// offline partitions, shutdown); None once the shard is closing.
    pub(super) async fn opening_logs(&self) -> Option<glommio::sync::Permit<'_>> {
        let permit = self
            .apply_lock
            .acquire_permit(1)
            .await
            .expect("apply lock never closes");
        (!self.closing.get()).then_some(permit)
    }

    /// One attempt to bring an offline partition back.
    async fn reopen(self: &Rc<Self>, key: &TopicPartition) {
        let Some(_guard) = self.opening_logs().await else {
            return;
        };
        let failed = match self.offline.borrow_mut().get_mut(key) {
            Some(o) => o.failed.take(),
            None => return,
        };
        if let Some(log) = failed {
            // Its files' state is unknown: close without trusting what it holds (an
            // error here is the failure itself again).
            let _ = log.close().await;
        }
        let image = self.image();
        let (name, p) = (key.topic(), key.partition());
        let owned = image
            .topics
            .get(name)
            .filter(|m| (0..m.partitions).contains(&p) && self.owner(m, p) == self.shard)
            .and_then(|m| m.assignment(p))
            .is_some_and(|a| a.replicas.contains(&self.config.node_id));
        if !owned {
            // Deleted or moved while offline: nothing to bring back.
            self.offline.borrow_mut().remove(key);
            return;
        }
        let led_in = self.offline.borrow().get(key).and_then(|o| o.led_in);
        let same_leadership = led_in.is_some_and(|e| {
            image.topics[name].assignment(p).is_some_and(|a| {
                a.leader == self.config.node_id && a.leader_epoch <= e.get() && a.replicas.len() > 1
            })
        });
        if same_leadership {
            // Not back as leader in the epoch the log failed in (see `Offline::led_in`):
            // wait for the controller's new epoch, and ask for it again (the first
            // proposal may have found no controller in time), with backoff.
            let mut offline = self.offline.borrow_mut();
            let o = offline.get_mut(key).expect("still offline");
            o.attempts += 1;
            let wait = OFFLINE_RETRY_FIRST * 2u32.pow(o.attempts.min(5));
            o.next_attempt = Instant::now() + wait.min(OFFLINE_RETRY_MAX);
            o.announced = false;
            return;
        }
        let effective = crate::base::broker_configs::effective_topic_configs(
            &image,
            self.config.broker_id(),
            &image.topics[name].configs,
        );
        let tc = TopicConfig::parse(&effective)
            .unwrap_or_else(|_| TopicConfig::parse(&BTreeMap::new()).expect("defaults parse"));
        let dir_name = format!("{name}-{p}");
        // Recovery only reads: first prove the directory takes a durable write again,
        // or a disk that still fails writes would bring the partition back to fail it.
        let probe = self.storage.dir().join(&dir_name).join(".probe");
        let reopened = match sluice_storage::file::write_atomic(&probe, b"probe").await {
            Ok(()) => {
                let _ = sluice_storage::file::remove(&probe).await;
                self.storage.open_log(&dir_name, tc.log.clone()).await
            }
            Err(e) => Err(e),
        };
        match reopened {
            Ok(log) => {
                let replica = Replica::open(name, p, log.clone(), &self.checkpoints);
                self.host(key.clone(), replica.clone(), log);
                self.offline.borrow_mut().remove(key);
                tracing::warn!(topic = %name, partition = p, "partition back online: its log reopened and recovered");
                if image.registered {
                    self.adopt_role(&image, &image.fenced_brokers(), name, p, &replica);
                }
            }
            Err(e) => {
                let mut offline = self.offline.borrow_mut();
                let o = offline.get_mut(key).expect("still offline");
                o.attempts += 1;
                let wait = OFFLINE_RETRY_FIRST * 2u32.pow(o.attempts.min(5));
                o.next_attempt = Instant::now() + wait.min(OFFLINE_RETRY_MAX);
                tracing::warn!(topic = %name, partition = p, error = %e, retry_in = ?wait.min(OFFLINE_RETRY_MAX), "offline partition does not reopen yet");
            }
        }
    }
}
