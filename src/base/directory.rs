//! The data directory's identity, Kafka's `meta.properties`: written when the
//! directory is formatted (the first start on it), read on every start after.
//!
//! `directory.id` (KIP-858) is how the controller tells a broker that comes back on
//! the directory it ran on from one that comes back on an empty or different one
//! (wiped, a replaced disk): the broker records it with the metadata quorum before
//! it registers, and a different one makes its replicas count as holding nothing
//! (`sluice_replication::cluster::Command::RecordDirectory`). `node.id` guards the
//! other way round: a directory formatted for one node is refused by another.

use std::path::{Path, PathBuf};

/// The file, in the data directory.
pub const META_FILE: &str = "meta.properties";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryIdentity {
    /// 22 characters of URL-safe base64, as Kafka's directory ids.
    pub id: String,
    /// The file was written by this start (a new or wiped directory, or one of a
    /// build before directory ids).
    pub formatted_now: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {what}", path.display())]
    Malformed { path: PathBuf, what: String },
    #[error("{} was formatted for node {found}, not node {node}: start node {found} on it, or give node {node} a directory of its own", path.display())]
    OtherNode {
        path: PathBuf,
        found: i32,
        node: i32,
    },
}

/// Reads the directory's identity, formatting it (writing the file, synced) if it has
/// none.
pub fn identify(dir: &Path, node: i32) -> Result<DirectoryIdentity, DirectoryError> {
    let path = dir.join(META_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let (found, id) = parse(&text).map_err(|what| DirectoryError::Malformed {
                path: path.clone(),
                what,
            })?;
            if found != node {
                return Err(DirectoryError::OtherNode { path, found, node });
            }
            Ok(DirectoryIdentity {
                id,
                formatted_now: false,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = crate::base::metadata::new_cluster_id();
            let text = format!("# written by sluice when the directory was formatted\nversion=1\nnode.id={node}\ndirectory.id={id}\n");
            write_synced(dir, &path, &text).map_err(|source| DirectoryError::Write {
                path: path.clone(),
                source,
            })?;
            Ok(DirectoryIdentity {
                id,
                formatted_now: true,
            })
        }
        Err(source) => Err(DirectoryError::Read { path, source }),
    }
}

/// `node.id` and `directory.id` of a `meta.properties` text.
fn parse(text: &str) -> Result<(i32, String), String> {
    let mut node = None;
    let mut id = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        match line.split_once('=') {
            Some(("node.id", v)) => {
                node = Some(
                    v.trim()
                        .parse::<i32>()
                        .map_err(|_| format!("node.id {v:?} is not a number"))?,
                )
            }
            Some(("directory.id", v)) if !v.trim().is_empty() => id = Some(v.trim().to_string()),
            _ => {}
        }
    }
    match (node, id) {
        (Some(n), Some(d)) => Ok((n, d)),
        _ => Err("needs node.id and directory.id".into()),
    }
}

/// Writes `text` to a temporary file, syncs it, renames it to `path`, syncs `dir`.
fn write_synced(dir: &Path, path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_formatted_once_and_keeps_its_id_and_node() {
        let dir = tempfile::tempdir().unwrap();
        let first = identify(dir.path(), 3).unwrap();
        assert!(first.formatted_now);
        assert_eq!(first.id.len(), 22);
        let again = identify(dir.path(), 3).unwrap();
        assert_eq!(
            (again.id.clone(), again.formatted_now),
            (first.id.clone(), false)
        );
        let e = identify(dir.path(), 4).unwrap_err();
        assert!(
            matches!(
                e,
                DirectoryError::OtherNode {
                    found: 3,
                    node: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("formatted for node 3"), "{e}");
        // Wiped: a new identity.
        std::fs::remove_file(dir.path().join(META_FILE)).unwrap();
        let wiped = identify(dir.path(), 3).unwrap();
        assert!(wiped.formatted_now && wiped.id != first.id);
        std::fs::write(dir.path().join(META_FILE), "version=1\nnode.id=x\n").unwrap();
        assert!(matches!(
            identify(dir.path(), 3),
            Err(DirectoryError::Malformed { .. })
        ));
    }
}
