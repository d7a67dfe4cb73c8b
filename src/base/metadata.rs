//! Cluster metadata as every shard sees it: brokers, topics, their ids, partition
//! assignments (replicas, leader, epochs, ISR) and configs.
//!
//! Every shard holds the current [`MetadataImage`] behind an `Arc` and reads it without
//! asking anyone. The image is built on shard 0 from the metadata quorum's applied
//! state (`quorum_io::image_of`) whenever it changes, and handed to every
//! shard. The per-broker file of earlier versions ([`FileMetadataStore`]) is read once
//! to import its topics into a new quorum.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_replication::cluster::{PartitionState, ScramCredential, CLUSTER_DEFAULT};
use sluice_shard::{ShardId, ShardTable};
use uuid::Uuid;

use crate::base::ids::BrokerId;

/// A registered broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerMeta {
    pub host: String,
    pub port: i32,
    pub fenced: bool,
    /// broker.rack
    pub rack: Option<String>,
    /// Its named listeners' endpoints (name, host, port), if it registered several
    /// (`--listeners`); empty: one listener, `host` and `port`.
    pub endpoints: Vec<(String, String, i32)>,
}

impl BrokerMeta {
    /// Where a client that connected through listener `listener` reaches this broker:
    /// its endpoint of that name, or (a broker with one listener, or the broker's own
    /// calls, `""`) its one address. `None`: it has no listener of that name (Kafka
    /// leaves such a broker out of the answer).
    pub fn endpoint(&self, listener: &str) -> Option<(&str, i32)> {
        if self.endpoints.is_empty() || listener.is_empty() {
            return Some((&self.host, self.port));
        }
        self.endpoints
            .iter()
            .find(|(name, _, _)| name == listener)
            .map(|(_, host, port)| (host.as_str(), *port))
    }
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    /// Kafka's topic id (a UUID), fixed at creation.
    pub id: Uuid,
    pub partitions: i32,
    /// Configs set explicitly; everything else is the default.
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
    /// Per partition: replicas, leader, leader epoch, ISR, partition epoch.
    #[serde(skip)]
    pub assignments: Vec<PartitionState>,
}

impl TopicMeta {
    pub fn assignment(&self, partition: i32) -> Option<&PartitionState> {
        self.assignments.get(usize::try_from(partition).ok()?)
    }

    /// The home shard of `partition` in broker `me`'s process: by the slot of `me`'s
    /// replica, else hashed (see `sluice_shard::ShardTable`).
    pub fn owner(&self, table: &ShardTable, me: BrokerId, partition: i32) -> ShardId {
        match self.assignment(partition).and_then(|a| a.slot_of(me.get())) {
            Some(slot) => table.owner_of_slot(slot),
            None => table.owner(self.id.as_u128(), partition),
        }
    }
}

/// The whole metadata state, immutable once built; a change makes a new image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataImage {
    /// Bumped by every change, so shards can tell newer images from older ones.
    pub epoch: u64,
    pub cluster_id: String,
    #[serde(default)]
    pub topics: BTreeMap<String, TopicMeta>,
    #[serde(skip)]
    pub brokers: BTreeMap<BrokerId, BrokerMeta>,
    /// The metadata quorum's leader, [`BrokerId::NONE`] when unknown.
    #[serde(skip, default = "no_controller")]
    pub controller_id: BrokerId,
    /// This broker's registration (this process) is in the state: only then may it act
    /// on the assignments (before, they may be a stale replay from its own journal).
    #[serde(skip)]
    pub registered: bool,
    /// Dynamic broker configs set at run time, by scope: `CLUSTER_DEFAULT` (-1) for the
    /// cluster-wide defaults, else a broker id.
    #[serde(skip)]
    pub broker_configs: BTreeMap<i32, BTreeMap<String, String>>,
    /// SASL/SCRAM credentials by user and mechanism code (the quorum's, see
    /// `sluice_replication::cluster::ScramCredential`): what SASL listeners check.
    #[serde(skip)]
    pub scram: BTreeMap<String, BTreeMap<i8, ScramCredential>>,
    /// Configs set on consumer groups (Kafka's GROUP resource), by group id.
    #[serde(skip)]
    pub group_configs: BTreeMap<String, BTreeMap<String, String>>,
    /// The quorum's ACL bindings, indexed for the authorizer.
    #[serde(skip)]
    pub acls: std::sync::Arc<sluice_replication::acl::AclIndex>,
    /// The quorum's client quotas, sorted by entity.
    #[serde(skip)]
    pub quotas: std::sync::Arc<Vec<sluice_replication::quota::ClientQuota>>,
    /// Tiered storage: each partition's segments in the object store, by topic.
    #[serde(skip)]
    pub remote: std::sync::Arc<RemoteLogs>,
    /// Object store folders of deleted topics still to be emptied.
    #[serde(skip)]
    pub remote_purge: Vec<String>,
}

/// Remote segments by topic and partition (the quorum's `ClusterState::remote`). Each
/// partition's log is shared with the image before while it did not change
/// (`quorum_io::image_of`), so a new image copies one pointer a partition, not its
/// segments.
pub type RemoteLogs =
    BTreeMap<String, BTreeMap<i32, std::sync::Arc<sluice_replication::cluster::RemoteLog>>>;

/// An image read back from the old per-broker file knows no controller.
fn no_controller() -> BrokerId {
    BrokerId::NONE
}

/// A SCRAM credential (the client crate's, which checks logins) as the quorum stores it.
pub fn stored_credential(c: sluice_client::sasl::ScramCredential) -> ScramCredential {
    ScramCredential {
        salt: c.salt,
        iterations: c.iterations,
        stored_key: c.stored_key,
        server_key: c.server_key,
    }
}

impl MetadataImage {
    /// `user`'s SCRAM credential of mechanism `m`, as logins are checked against it.
    pub fn scram_credential(
        &self,
        user: &str,
        m: sluice_client::sasl::Mechanism,
    ) -> Option<sluice_client::sasl::ScramCredential> {
        let c = self.scram.get(user)?.get(&m.scram_type()?)?;
        Some(sluice_client::sasl::ScramCredential {
            salt: c.salt.clone(),
            iterations: c.iterations,
            stored_key: c.stored_key.clone(),
            server_key: c.server_key.clone(),
        })
    }

    /// True when a broker (`me`) can answer clients completely from this image: its
    /// own registration is in it, unfenced, and a controller is known.
    /// The controller clients are told of: the quorum's leader if it is a broker, else
    /// (a controller without the broker role leads) `me`, which takes their admin
    /// requests and proposes them to the quorum, as KRaft brokers name a broker.
    pub fn controller_for_clients(&self, me: BrokerId) -> BrokerId {
        if self.controller_id.is_some() && !self.brokers.contains_key(&self.controller_id) {
            me
        } else {
            self.controller_id
        }
    }

    pub fn complete_for(&self, me: BrokerId) -> bool {
        self.registered
            && self.controller_id.is_some()
            && self.brokers.get(&me).is_some_and(|b| !b.fenced)
    }

    pub fn new_cluster() -> MetadataImage {
        MetadataImage {
            epoch: 0,
            cluster_id: new_cluster_id(),
            topics: BTreeMap::new(),
            brokers: BTreeMap::new(),
            controller_id: BrokerId::NONE,
            registered: false,
            broker_configs: BTreeMap::new(),
            scram: BTreeMap::new(),
            group_configs: BTreeMap::new(),
            acls: Default::default(),
            quotas: Default::default(),
            remote: Default::default(),
            remote_purge: Vec::new(),
        }
    }

    /// The dynamic broker config `name` in effect on broker `me`: its own value, else
    /// the cluster-wide default (Kafka's precedence), with the scope it came from.
    pub fn dynamic_broker_config(&self, me: BrokerId, name: &str) -> Option<(&str, DynamicScope)> {
        let own = self.broker_configs.get(&me.get()).and_then(|c| c.get(name));
        if let Some(v) = own {
            return Some((v, DynamicScope::Broker));
        }
        let default = self.broker_configs.get(&CLUSTER_DEFAULT)?.get(name)?;
        Some((default, DynamicScope::ClusterDefault))
    }

    /// The ids of the brokers this image says are fenced.
    pub fn fenced_brokers(&self) -> Vec<i32> {
        let fenced = self.brokers.iter().filter(|(_, b)| b.fenced);
        fenced.map(|(id, _)| id.get()).collect()
    }

    pub fn topic_by_id(&self, id: Uuid) -> Option<(&String, &TopicMeta)> {
        self.topics.iter().find(|(_, t)| t.id == id)
    }

    /// Gives every partition that `previous` (the image published before this one)
    /// already had, same topic id, the slots it had there; returns how many differed.
    ///
    /// A partition's owning shard follows its slots, and must not change while the
    /// process runs (one shard has its log open). Slots are fixed when a partition is
    /// created, but voters whose states were restored from snapshots of different
    /// format versions can disagree on them, and a snapshot installed from such a
    /// leader would then change them here; so the first slots published stay.
    pub fn keep_slots_of(&mut self, previous: &MetadataImage) -> usize {
        let mut differed = 0;
        for (name, t) in &mut self.topics {
            let Some(old) = previous.topics.get(name).filter(|o| o.id == t.id) else {
                continue;
            };
            for (i, (new, old)) in t.assignments.iter_mut().zip(&old.assignments).enumerate() {
                // A reassignment changes the replica set: each replica that was
                // published keeps its slot, a new one has its own. A partition
                // published without slots stays without (its replicas here hash); one
                // published with them keeps them even if the state now has none (a
                // replica new to it then takes the partition's index: any value that
                // stays put will do, as only this broker's own slot matters here).
                let kept: Vec<u64> = if new.replicas == old.replicas || old.slots.is_empty() {
                    old.slots.clone()
                } else {
                    let fallback = |j: usize| new.slots.get(j).copied().unwrap_or(i as u64);
                    let each = new.replicas.iter().enumerate();
                    each.map(|(j, b)| old.slot_of(*b).unwrap_or_else(|| fallback(j)))
                        .collect()
                };
                if new.slots != kept {
                    new.slots = kept;
                    differed += 1;
                }
            }
        }
        differed
    }
}

/// Where a dynamic broker config was set (Kafka's DYNAMIC_BROKER_CONFIG and
/// DYNAMIC_DEFAULT_BROKER_CONFIG sources).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamicScope {
    Broker,
    ClusterDefault,
}

/// A 22-character cluster id like Kafka's (URL-safe base64 of a UUID).
pub fn new_cluster_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let v = Uuid::new_v4().as_u128();
    (0..22)
        .map(|i| ALPHABET[((v >> (i * 6)) & 63) as usize] as char)
        .collect()
}

/// Why a [`MetadataStore`] could not load or store an image.
#[derive(Debug, thiserror::Error)]
pub enum MetadataStoreError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Decode {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("encoding the metadata image: {0}")]
    Encode(#[from] toml::ser::Error),
    /// Writing, syncing or renaming the new file (or syncing its directory).
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where metadata lives between restarts.
pub trait MetadataStore {
    /// The last stored image, or a fresh cluster if there is none.
    fn load(&self) -> Result<MetadataImage, MetadataStoreError>;
    /// Makes `image` durable before returning.
    fn store(&self, image: &MetadataImage) -> Result<(), MetadataStoreError>;
}

/// `<data>/sluice-metadata.toml`, replaced atomically (write, fsync, rename, fsync dir).
pub struct FileMetadataStore {
    path: PathBuf,
}

pub const METADATA_FILE: &str = "sluice-metadata.toml";

impl FileMetadataStore {
    pub fn new(data_dir: &Path) -> FileMetadataStore {
        FileMetadataStore {
            path: data_dir.join(METADATA_FILE),
        }
    }
}

impl MetadataStore for FileMetadataStore {
    fn load(&self) -> Result<MetadataImage, MetadataStoreError> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => toml::from_str(&text).map_err(|source| MetadataStoreError::Decode {
                path: self.path.clone(),
                source,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let image = MetadataImage::new_cluster();
                self.store(&image)?;
                Ok(image)
            }
            Err(source) => Err(MetadataStoreError::Read {
                path: self.path.clone(),
                source,
            }),
        }
    }

    // Blocking file I/O: this runs only on metadata changes (admin requests and topic
    // auto-creation), a few small writes, never on the produce/fetch path.
    fn store(&self, image: &MetadataImage) -> Result<(), MetadataStoreError> {
        use std::io::Write;
        let text = toml::to_string(image)?;
        let tmp = self.path.with_extension("toml.tmp");
        let err = |source: std::io::Error| MetadataStoreError::Write {
            path: tmp.clone(),
            source,
        };
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(text.as_bytes()).map_err(err)?;
        f.sync_data().map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|source| MetadataStoreError::Write {
                    path: dir.to_path_buf(),
                    source,
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileMetadataStore::new(dir.path());
        let mut image = store.load().unwrap();
        assert_eq!(image.cluster_id.len(), 22);
        image.epoch = 3;
        image.topics.insert(
            "orders".into(),
            TopicMeta {
                id: Uuid::new_v4(),
                partitions: 8,
                configs: [("retention.ms".to_string(), "1000".to_string())].into(),
                assignments: Vec::new(),
            },
        );
        store.store(&image).unwrap();
        let back = FileMetadataStore::new(dir.path()).load().unwrap();
        assert_eq!(back.topics, image.topics);
        assert_eq!(back.cluster_id, image.cluster_id);
    }

    fn assigned(replicas: &[i32], slots: &[u64]) -> PartitionState {
        PartitionState {
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
            leader: replicas[0],
            leader_epoch: 0,
            partition_epoch: 0,
            slots: slots.to_vec(),
        }
    }

    fn topic(id: u128, assignments: Vec<PartitionState>) -> TopicMeta {
        TopicMeta {
            id: Uuid::from_u128(id),
            partitions: assignments.len() as i32,
            configs: BTreeMap::new(),
            assignments,
        }
    }

    #[test]
    fn a_partition_is_owned_by_its_slot_here_else_by_hash() {
        let table = ShardTable::new(2);
        let id = 0xfeed_u128;
        let t = topic(
            id,
            vec![
                assigned(&[1, 2], &[7, 0]),
                assigned(&[2, 1], &[1, 8]),
                assigned(&[1], &[]),
            ],
        );
        // Broker 1: slots 7 and 8 -> shards 1 and 0; broker 2: slots 0 and 1.
        let owners = |me| -> Vec<ShardId> {
            (0..2)
                .map(|p| t.owner(&table, BrokerId::new(me), p))
                .collect()
        };
        assert_eq!(owners(1), vec![ShardId(1), ShardId(0)]);
        assert_eq!(owners(2), vec![ShardId(0), ShardId(1)]);
        // Not hosted here, no slots (an old partition), or no such partition: hashed.
        for (me, p) in [(3, 0), (1, 2), (1, 5)] {
            let owner = t.owner(&table, BrokerId::new(me), p);
            assert_eq!(owner, table.owner(id, p), "{me} {p}");
        }
    }

    #[test]
    fn published_slots_never_change() {
        let mut previous = MetadataImage::new_cluster();
        previous
            .topics
            .insert("a".into(), topic(1, vec![assigned(&[1], &[])]));
        previous
            .topics
            .insert("b".into(), topic(2, vec![assigned(&[1], &[4])]));
        let mut next = previous.clone();
        // A state restored differently: slots for `a`, other ones for `b`, and a new
        // partition of `b`; `c` is new, and `a` was re-created under another id in `d`.
        next.topics
            .insert("a".into(), topic(1, vec![assigned(&[1], &[0])]));
        next.topics.insert(
            "b".into(),
            topic(2, vec![assigned(&[1], &[9]), assigned(&[1], &[10])]),
        );
        next.topics
            .insert("c".into(), topic(3, vec![assigned(&[1], &[11])]));
        let recreated = topic(4, vec![assigned(&[1], &[12])]);
        previous
            .topics
            .insert("d".into(), topic(5, vec![assigned(&[1], &[3])]));
        next.topics.insert("d".into(), recreated.clone());
        assert_eq!(next.keep_slots_of(&previous), 2);
        let slots = |name: &str| -> Vec<Vec<u64>> {
            next.topics[name]
                .assignments
                .iter()
                .map(|a| a.slots.clone())
                .collect()
        };
        assert_eq!(slots("a"), vec![Vec::<u64>::new()]);
        assert_eq!(slots("b"), vec![vec![4], vec![10]]);
        assert_eq!(slots("c"), vec![vec![11]]);
        assert_eq!(next.topics["d"], recreated);
        // A reassignment moved "b"-0 from [1] to [2, 1]: broker 1 keeps its published
        // slot, broker 2's new replica has the slot the state gave it.
        let mut moved = next.clone();
        moved.topics.get_mut("b").unwrap().assignments[0] = assigned(&[2, 1], &[5, 9]);
        assert_eq!(moved.keep_slots_of(&next), 1);
        assert_eq!(moved.topics["b"].assignments[0].slots, vec![5, 4]);
        // States of mixed snapshot formats: published without slots stays without;
        // published with them keeps them when the state has none.
        let mut slotless = moved.clone();
        slotless.topics.get_mut("a").unwrap().assignments[0] = assigned(&[2, 1], &[3, 3]);
        slotless.topics.get_mut("b").unwrap().assignments[0] = assigned(&[1, 3], &[]);
        assert_eq!(slotless.keep_slots_of(&moved), 2);
        assert!(slotless.topics["a"].assignments[0].slots.is_empty());
        assert_eq!(slotless.topics["b"].assignments[0].slots, vec![4, 0]);
    }

    #[test]
    fn a_file_that_is_not_an_image_is_a_decode_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(METADATA_FILE), "epoch = \"x\"").unwrap();
        let e = FileMetadataStore::new(dir.path()).load().unwrap_err();
        assert!(
            matches!(&e, MetadataStoreError::Decode { path, .. } if path.ends_with(METADATA_FILE)),
            "{e:?}"
        );
    }
}
