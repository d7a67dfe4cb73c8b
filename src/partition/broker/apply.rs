//! Metadata adoption: a new image reaching this shard ([`Broker::apply`]) opens the
//! logs of partitions it now hosts, sets each replica's role and epoch, deletes the
//! logs of deleted topics, and at shutdown closes them all. Shard 0 publishes the
//! images; the other shards wait for a version here.

use super::*;

impl Broker {
    /// Adopts a new metadata image: opens logs of partitions this shard now owns, applies
    /// config changes, and deletes the logs of topics that are gone. New logs open
    /// before the image is published, so a client that sees a topic can use it.
    pub async fn apply(self: &Rc<Self>, image: Arc<MetadataImage>) {
        let Some(_guard) = self.opening_logs().await else {
            return;
        };
        let old = self.image();
        if image.epoch < old.epoch || (image.epoch == old.epoch && !old.cluster_id.is_empty()) {
            return;
        }
        // A topic whose id changed was deleted and re-created: its old logs must go
        // before the new ones open in the same directories. Topics simply removed keep
        // their logs until the new image is published (so no request finds a topic
        // whose log is already gone), and lose them right after.
        let (recreated, removed): (Vec<String>, Vec<String>) = old
            .topics
            .iter()
            .filter(|(name, t)| image.topics.get(*name).is_none_or(|n| n.id != t.id))
            .map(|(name, _)| name.clone())
            .partition(|name| image.topics.contains_key(name));
        self.delete_logs_of(&recreated).await;
        let mut configs = HashMap::with_capacity(image.topics.len());
        let mut to_open: Vec<(Arc<str>, i32, LogConfig)> = Vec::new();
        let me = self.config.node_id;
        for (name, meta) in &image.topics {
            // The topic's own configs over the dynamic broker defaults.
            let effective = crate::base::broker_configs::effective_topic_configs(
                &image,
                BrokerId::new(me),
                &meta.configs,
            );
            let tc = match TopicConfig::parse(&effective) {
                Ok(tc) => tc,
                Err(e) => {
                    tracing::error!(topic = %name, error = %e, "stored topic config does not parse; using defaults");
                    TopicConfig::parse(&BTreeMap::new()).expect("defaults parse")
                }
            };
            let tc = Rc::new(tc);
            configs.insert(name.clone(), tc.clone());
            // The name, shared by the keys of the partitions opened below.
            let mut topic: Option<Arc<str>> = None;
            for p in 0..meta.partitions {
                if self.owner(meta, p) != self.shard {
                    continue;
                }
                let me = self.config.node_id;
                let Some(assignment) = meta.assignment(p) else {
                    continue;
                };
                if !assignment.replicas.contains(&me) {
                    continue;
                }
                let key = TopicPartitionRef::new(name, p);
                if self.offline.borrow().contains_key(key.key()) {
                    continue; // `tend_offline` reopens it
                }
                let existing = self.logs.borrow().get(key.key()).cloned();
                match existing {
                    Some(log) => {
                        if log.config() != tc.log {
                            if let Err(e) = log.set_config(tc.log.clone()) {
                                tracing::error!(topic = %name, partition = p, error = %e, "config change refused");
                            }
                        }
                    }
                    None => {
                        let topic = topic.get_or_insert_with(|| Arc::from(name.as_str()));
                        to_open.push((topic.clone(), p, tc.log.clone()));
                    }
                }
            }
        }
        // New logs open side by side (each creates its directory and files, with their
        // syncs): one at a time, a broker adopting a topic of thousands of partitions
        // (or thousands of topics) waited for each in turn.
        for chunk in to_open.chunks(NEW_LOGS_AT_ONCE) {
            let opens = chunk.iter().map(|(topic, p, config)| async move {
                let dir = format!("{topic}-{p}");
                (topic, *p, self.storage.open_log(&dir, config.clone()).await)
            });
            for (topic, p, opened) in join_all(opens).await {
                match opened {
                    Ok(log) => {
                        tracing::debug!(shard = self.shard.0, topic = %topic, partition = p, "opened log");
                        let replica = Replica::open(topic, p, log.clone(), &self.checkpoints);
                        self.host(TopicPartition::new(topic.clone(), p), replica, log);
                    }
                    Err(e) => {
                        tracing::error!(topic = %topic, partition = p, error = %e, "cannot open log")
                    }
                }
            }
        }
        // Roles follow the committed assignments (leader epochs, ISR).
        if image.registered {
            let fenced = image.fenced_brokers();
            for (key, replica) in self.replicas.borrow().iter() {
                self.adopt_role(&image, &fenced, key.topic(), key.partition(), replica);
            }
        }
        // Replicas a reassignment took off this broker (only once the image is this
        // run's: before, it may be a stale replay that a later entry contradicts).
        let moved_away: Vec<TopicPartition> = if image.registered {
            let assigned = |k: &TopicPartition| {
                let meta = image.topics.get(k.topic());
                let a = meta.and_then(|m| m.assignment(k.partition()));
                a.is_some_and(|a| a.replicas.contains(&me))
            };
            let logs = self.logs.borrow();
            logs.keys()
                .filter(|k| image.topics.contains_key(k.topic()) && !assigned(k))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        if self.tiered.get().is_some() {
            crate::partition::tiered::adopt(&self.replicas(), &image);
        } else if shard_zero_warns_untiered(self.shard.0, &configs) {
            tracing::warn!("topics with remote.storage.enable=true, but this broker has no --remote-storage: it keeps their segments locally (retention deletes none it could not see uploaded) and uploads none while it leads");
        }
        *self.image.borrow_mut() = image;
        *self.topic_configs.borrow_mut() = configs;
        self.delete_logs_of(&removed).await;
        if !moved_away.is_empty() {
            tracing::info!(
                shard = self.shard.0,
                partitions = moved_away.len(),
                "deleting replicas reassigned to other brokers"
            );
            self.delete_logs(moved_away).await;
        }
        self.check_invariants();
    }

    /// Gives a replica the role its committed assignment in `image` says (leader
    /// epoch, ISR, whom to follow).
    /// `fenced`: the image's fenced brokers (`MetadataImage::fenced_brokers`), which
    /// the replica's leader never proposes into the ISR.
    pub(super) fn adopt_role(
        self: &Rc<Self>,
        image: &MetadataImage,
        fenced: &[i32],
        name: &str,
        p: i32,
        replica: &Rc<Replica>,
    ) {
        let Some(a) = image.topics.get(name).and_then(|m| m.assignment(p)) else {
            return;
        };
        let epoch_before = replica.leader_epoch();
        let followed = replica.state().follower().is_some();
        let follow = replica.reconcile(
            self.config.broker_id(),
            a,
            self.config.replica_lag_time_max_ms,
        );
        // Fenced brokers never join an ISR this replica's leader proposes.
        replica.set_ineligible(fenced);
        if replica.leader_epoch() != epoch_before {
            self.each_subscriber(|s| s.leadership_changed(name, p));
        }
        // The fetchers list their partitions again only when one may have come to or left
        // one of them: it starts or stops leading, follows another leader, or stops
        // following (offline: no leader, dropped from the assignment).
        let stopped = followed && replica.state().follower().is_none();
        if replica.leader_epoch() != epoch_before
            || follow.as_ref().is_some_and(|f| f.joined)
            || stopped
        {
            self.hosting_changed();
        }
        if let Some(f) = follow {
            // Pair assertion: the replica follows the leader the assignment it just
            // adopted names, never this broker.
            assert!(
                f.leader.get() == a.leader && f.leader != self.config.broker_id(),
                "{name}-{p}: follows {} but the assignment names leader {}",
                f.leader,
                a.leader
            );
            // A partition that starts following wakes the running fetcher (or starts
            // one); one that already followed needs only a fetcher to be running.
            let start = if f.joined || self.fetchers.wake(f.leader).is_none() {
                self.fetchers.joined(f.leader)
            } else {
                false
            };
            if start {
                self.each_subscriber(|s| s.follow(self, f.leader));
            }
        }
    }

    async fn delete_logs_of(&self, topics: &[String]) {
        if topics.is_empty() {
            return;
        }
        let keys: Vec<TopicPartition> = self
            .logs
            .borrow()
            .keys()
            .filter(|k| topics.iter().any(|t| t == k.topic()))
            .cloned()
            .collect();
        self.delete_logs(keys).await;
    }

    /// Retires the replicas of `keys` and deletes their logs.
    async fn delete_logs(&self, keys: Vec<TopicPartition>) {
        let mut retired = Vec::new();
        let doomed: Vec<Rc<PartitionLog>> = {
            let mut logs = self.logs.borrow_mut();
            let mut replicas = self.replicas.borrow_mut();
            for k in &keys {
                if let Some(r) = replicas.remove(k) {
                    retired.push(r);
                }
                // A session naming it learns that it is gone.
                self.changes.changed(k.topic_arc(), k.partition());
                self.hosting_changed();
            }
            keys.into_iter().filter_map(|k| logs.remove(&k)).collect()
        };
        // No checkpoint round may write into a directory being removed.
        for r in retired {
            r.retire().await;
        }
        for log in doomed {
            if let Err(e) = self.storage.delete_log(&log).await {
                tracing::error!(log = %log.name(), error = %e, "deleting log failed");
            }
        }
    }

    /// Shard 0, once at start, right after every shard adopted the first image of this
    /// run's registration (and before the next image is published, so no shard opens
    /// a log meanwhile): deletes the partition directories the committed metadata
    /// does not give this broker — replicas reassigned away or topics deleted while it
    /// was down. Only directories named like a partition's (`<topic>-<n>`, a valid
    /// topic name) are considered. Returns how many went.
    pub fn remove_stray_logs(&self, image: &MetadataImage) -> usize {
        if !image.registered {
            return 0;
        }
        let me = self.config.node_id;
        let dir = self.storage.dir().to_path_buf();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some((topic, p)) = name.rsplit_once('-') else {
                continue;
            };
            let Ok(p) = p.parse::<i32>() else { continue };
            if p < 0
                || crate::base::topic_config::validate_topic_name(topic).is_err()
                || !e.file_type().is_ok_and(|t| t.is_dir())
            {
                continue;
            }
            let assigned = image
                .topics
                .get(topic)
                .and_then(|m| m.assignment(p))
                .is_some_and(|a| a.replicas.contains(&me));
            if assigned {
                continue;
            }
            match std::fs::remove_dir_all(e.path()) {
                Ok(()) => {
                    removed += 1;
                    tracing::info!(log = %name, "deleted a partition directory the metadata no longer assigns to this broker");
                }
                Err(err) => {
                    tracing::warn!(log = %name, error = %err, "could not delete a stray partition directory")
                }
            }
        }
        removed
    }

    /// Shard 0: every shard runs an image of state `version` or newer.
    pub fn set_published(&self, version: u64) {
        if version > self.published_version.get() {
            self.published_version.set(version);
        }
        self.published.notify(usize::MAX);
    }

    /// Shard 0: waits until the image of quorum state `version` is on every shard.
    pub async fn wait_published(&self, version: u64) {
        loop {
            let listener = self.published.listen();
            if self.published_version.get() >= version {
                return;
            }
            listener.await;
        }
    }

    /// Closes every log of this shard (clean shutdown).
    pub async fn close_all(&self) {
        // No image change may (re)open a log while or after they close: a second
        // instance of a partition's log would recover its directory under the closing
        // one (found by the e2e health check: "closing log failed ... No such file").
        let _guard = self
            .apply_lock
            .acquire_permit(1)
            .await
            .expect("apply lock never closes");
        self.closing.set(true);
        let replicas: Vec<Rc<Replica>> =
            self.replicas.borrow_mut().drain().map(|(_, r)| r).collect();
        self.hosting_changed();
        for r in replicas {
            r.retire().await;
        }
        let logs: Vec<Rc<PartitionLog>> = self.logs.borrow_mut().drain().map(|(_, l)| l).collect();
        let count = logs.len();
        let started = Instant::now();
        // In rounds with one file-system sync each, not several syncs per log: 10,000
        // logs closed one by one (or 32 at once) took 20-70 s here.
        let report = self.storage.close_logs(logs).await;
        for (log, error) in &report.failed {
            tracing::error!(log = %log, error = %error, "closing log failed");
        }
        // Every log synced: the journal holds nothing they lack (a failure keeps it
        // for the next start's replay).
        if report.failed.is_empty() {
            if let Err(e) = self.storage.stop_journal().await {
                tracing::error!(error = %e, "removing the shard journal after a clean close failed; the next start replays it");
            }
        }
        tracing::info!(
            shard = self.shard.0,
            logs = count,
            marked_clean = report.marked_clean,
            unchanged = report.unchanged,
            failed = report.failed.len(),
            fs_syncs = report.fs_syncs,
            begin_ms = report.begin.as_millis() as u64,
            write_ms = report.write.as_millis() as u64,
            sync_ms = report.sync.as_millis() as u64,
            records_ms = report.records.as_millis() as u64,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "logs closed"
        );
    }
}

/// True once per process, on shard 0, when a topic is tiered and this broker has no
/// object store (every broker of a cluster with tiered topics needs one).
fn shard_zero_warns_untiered(shard: usize, configs: &HashMap<String, Rc<TopicConfig>>) -> bool {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    shard == 0
        && configs.values().any(|c| c.log.remote_storage)
        && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
}
