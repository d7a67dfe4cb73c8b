//! The object store: a folder (`file:///path`) or an S3 bucket (`s3://bucket/prefix`).
//!
//! Every call blocks; [`crate::pool::Pool`] runs them off the shards. Keys are
//! `/`-separated paths below the store's prefix. A put is all or nothing to a reader:
//! the folder store writes a temporary file and renames it, S3 makes an object visible
//! only once its PUT completes.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

/// What a store call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {0} not found")]
    NotFound(String),
    #[error("object store: {0}")]
    Failed(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Where remote segments live.
pub enum Store {
    Folder { root: PathBuf },
    S3(Box<S3Store>),
}

/// An S3 (or S3-compatible) bucket under a key prefix.
pub struct S3Store {
    bucket: Bucket,
    credentials: Option<Credentials>,
    prefix: String,
    agent: ureq::Agent,
}

/// How long a signed request stays valid (it is sent at once).
const SIGNED_FOR: Duration = Duration::from_secs(600);

impl Store {
    /// Parses `file:///path` or `s3://bucket[/prefix]`. For S3 the endpoint, region and
    /// credentials come from the variables AWS tools read: `AWS_ENDPOINT_URL_S3` or
    /// `AWS_ENDPOINT_URL` (a custom endpoint, addressed path-style as MinIO and moto
    /// expect), `AWS_REGION` or `AWS_DEFAULT_REGION` (default us-east-1),
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
    pub fn open(url: &str) -> Result<Store, String> {
        Self::open_with(url, &|name| {
            std::env::var(name).ok().filter(|v| !v.is_empty())
        })
    }

    /// [`Store::open`] with the environment given.
    pub fn open_with(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Store, String> {
        if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(format!(
                    "{url}: a file:// store needs an absolute path (file:///data/remote)"
                ));
            }
            std::fs::create_dir_all(path)
                .map_err(|e| format!("{url}: cannot create {path}: {e}"))?;
            return Ok(Store::Folder {
                root: PathBuf::from(path),
            });
        }
        let Some(rest) = url.strip_prefix("s3://") else {
            return Err(format!(
                "{url}: the remote store is file:///path or s3://bucket/prefix"
            ));
        };
        let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if name.is_empty() {
            return Err(format!("{url}: no bucket name"));
        }
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let (endpoint, style) = match env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL"))
        {
            Some(e) => (e, UrlStyle::Path),
            None => (
                format!("https://s3.{region}.amazonaws.com"),
                UrlStyle::VirtualHost,
            ),
        };
        let endpoint = endpoint
            .parse()
            .map_err(|e| format!("endpoint {endpoint}: {e}"))?;
        let bucket = Bucket::new(endpoint, style, name.to_string(), region)
            .map_err(|e| format!("{url}: {e}"))?;
        let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(k), Some(s)) => Some(match env("AWS_SESSION_TOKEN") {
                Some(t) => Credentials::new_with_token(k, s, t),
                None => Credentials::new(k, s),
            }),
            _ => None,
        };
        // Idle timeouts per read and write, no deadline for a whole request: a 1 GiB
        // segment's PUT takes as long as the link needs.
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout_read(Duration::from_secs(60))
            .timeout_write(Duration::from_secs(60))
            .build();
        let prefix = prefix.trim_matches('/').to_string();
        Ok(Store::S3(Box::new(S3Store {
            bucket,
            credentials,
            prefix,
            agent,
        })))
    }

    /// Stores `body` under `key`, replacing what was there.
    pub fn put(&self, key: &str, body: &[u8]) -> StoreResult<()> {
        self.put_from(key, body, body.len() as u64).map(|_| ())
    }

    /// Stores the file at `path` under `key` (read as it streams, not held in memory);
    /// its size. A file that is not there is [`StoreError::NotFound`].
    pub fn put_file(&self, key: &str, path: &Path) -> StoreResult<u64> {
        let file = std::fs::File::open(path).map_err(|e| io(key, e))?;
        let len = file.metadata().map_err(|e| io(key, e))?.len();
        self.put_from(key, file.take(len), len)
    }

    /// Stores `len` bytes read from `body` under `key`; the bytes stored.
    fn put_from(&self, key: &str, mut body: impl Read, len: u64) -> StoreResult<u64> {
        match self {
            Store::Folder { root } => {
                let dest = root.join(key);
                let dir = dest.parent().unwrap_or(root);
                std::fs::create_dir_all(dir).map_err(|e| io(key, e))?;
                let tmp = dir.join(format!(".{}.part", file_name(&dest)));
                let mut out = std::fs::File::create(&tmp).map_err(|e| io(key, e))?;
                let copied = std::io::copy(&mut body, &mut out).map_err(|e| io(key, e))?;
                out.sync_data().map_err(|e| io(key, e))?;
                std::fs::rename(&tmp, &dest).map_err(|e| io(key, e))?;
                sync_dir(dir).map_err(|e| io(key, e))?;
                Ok(copied)
            }
            Store::S3(s3) => {
                let url = s3
                    .bucket
                    .put_object(s3.credentials.as_ref(), &s3.key(key))
                    .sign(SIGNED_FOR);
                // S3 takes no chunked upload: the length goes first.
                s3.agent
                    .put(url.as_str())
                    .set("Content-Length", &len.to_string())
                    .send(body)
                    .map_err(|e| http(key, e))?;
                Ok(len)
            }
        }
    }

    /// The bytes of `key`, or `len` of them from `from` (fewer at the object's end).
    pub fn get(&self, key: &str, range: Option<(u64, u64)>) -> StoreResult<Vec<u8>> {
        match self {
            Store::Folder { root } => {
                let path = root.join(key);
                let mut f = std::fs::File::open(&path).map_err(|e| io(key, e))?;
                let mut out = Vec::new();
                match range {
                    None => {
                        f.read_to_end(&mut out).map_err(|e| io(key, e))?;
                    }
                    Some((from, len)) => {
                        use std::io::Seek;
                        f.seek(std::io::SeekFrom::Start(from))
                            .map_err(|e| io(key, e))?;
                        f.take(len).read_to_end(&mut out).map_err(|e| io(key, e))?;
                    }
                }
                Ok(out)
            }
            Store::S3(s3) => {
                let url = s3
                    .bucket
                    .get_object(s3.credentials.as_ref(), &s3.key(key))
                    .sign(SIGNED_FOR);
                let mut req = s3.agent.get(url.as_str());
                if let Some((from, len)) = range {
                    if len == 0 {
                        return Ok(Vec::new());
                    }
                    req = req.set("Range", &format!("bytes={from}-{}", from + len - 1));
                }
                let resp = match req.call() {
                    Ok(r) => r,
                    // A range starting at the object's end.
                    Err(ureq::Error::Status(416, _)) => return Ok(Vec::new()),
                    Err(e) => return Err(http(key, e)),
                };
                let mut out = Vec::new();
                resp.into_reader()
                    .read_to_end(&mut out)
                    .map_err(|e| io(key, e))?;
                Ok(out)
            }
        }
    }

    /// Removes `key`; a key that is not there is not an error.
    pub fn delete(&self, key: &str) -> StoreResult<()> {
        match self {
            Store::Folder { root } => match std::fs::remove_file(root.join(key)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(key, e)),
                _ => Ok(()),
            },
            Store::S3(s3) => {
                let url = s3
                    .bucket
                    .delete_object(s3.credentials.as_ref(), &s3.key(key))
                    .sign(SIGNED_FOR);
                match s3.agent.delete(url.as_str()).call() {
                    Ok(_) | Err(ureq::Error::Status(404, _)) => Ok(()),
                    Err(e) => Err(http(key, e)),
                }
            }
        }
    }

    /// Every key below `prefix` (a folder, ending in `/`) with its size, in key order.
    pub fn list(&self, prefix: &str) -> StoreResult<Vec<(String, u64)>> {
        match self {
            Store::Folder { root } => {
                let mut out = Vec::new();
                list_folder(root, &root.join(prefix), &mut out).map_err(|e| io(prefix, e))?;
                out.sort();
                Ok(out)
            }
            Store::S3(s3) => {
                let mut out = Vec::new();
                let mut token: Option<String> = None;
                loop {
                    let mut action = s3.bucket.list_objects_v2(s3.credentials.as_ref());
                    action.with_prefix(s3.key(prefix));
                    if let Some(t) = &token {
                        action.with_continuation_token(t.clone());
                    }
                    let url = action.sign(SIGNED_FOR);
                    let body = s3
                        .agent
                        .get(url.as_str())
                        .call()
                        .map_err(|e| http(prefix, e))?
                        .into_string()
                        .map_err(|e| io(prefix, e))?;
                    let parsed = rusty_s3::actions::ListObjectsV2::parse_response(&body)
                        .map_err(|e| StoreError::Failed(format!("listing {prefix}: {e}")))?;
                    for c in parsed.contents {
                        let key = c
                            .key
                            .strip_prefix(&s3.prefix)
                            .unwrap_or(&c.key)
                            .trim_start_matches('/');
                        out.push((key.to_string(), c.size.unwrap_or(0)));
                    }
                    match parsed.next_continuation_token {
                        Some(t) => token = Some(t),
                        None => break,
                    }
                }
                out.sort();
                Ok(out)
            }
        }
    }
}

impl S3Store {
    fn key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        }
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn list_folder(root: &Path, dir: &Path, out: &mut Vec<(String, u64)>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let meta = entry.metadata()?;
        if meta.is_dir() {
            list_folder(root, &path, out)?;
        } else if !file_name(&path).starts_with('.') {
            let key = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            out.push((key, meta.len()));
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

fn io(key: &str, e: std::io::Error) -> StoreError {
    if e.kind() == std::io::ErrorKind::NotFound {
        StoreError::NotFound(key.to_string())
    } else {
        StoreError::Failed(format!("{key}: {e}"))
    }
}

fn http(key: &str, e: ureq::Error) -> StoreError {
    match e {
        ureq::Error::Status(404, _) => StoreError::NotFound(key.to_string()),
        ureq::Error::Status(code, resp) => {
            let body = resp.into_string().unwrap_or_default();
            let body: String = body.chars().take(300).collect();
            StoreError::Failed(format!("{key}: HTTP {code}: {body}"))
        }
        ureq::Error::Transport(t) => StoreError::Failed(format!("{key}: {t}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_store_puts_gets_ranges_lists_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let s = Store::open(&url).unwrap();
        s.put("t-1/0/a.log", b"hello world").unwrap();
        s.put("t-1/0/b.index", b"xy").unwrap();
        s.put("t-1/1/c.log", b"z").unwrap();
        let src = dir.path().join("source");
        std::fs::write(&src, b"file body").unwrap();
        assert_eq!(s.put_file("t-2/0/f.log", &src).unwrap(), 9);
        assert_eq!(s.get("t-2/0/f.log", None).unwrap(), b"file body");
        assert!(matches!(
            s.put_file("t-2/0/g.log", &dir.path().join("none")),
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(s.get("t-1/0/a.log", None).unwrap(), b"hello world");
        assert_eq!(s.get("t-1/0/a.log", Some((6, 100))).unwrap(), b"world");
        assert_eq!(s.get("t-1/0/a.log", Some((2, 3))).unwrap(), b"llo");
        assert!(matches!(
            s.get("t-1/0/none", None),
            Err(StoreError::NotFound(_))
        ));
        let listed = s.list("t-1/0/").unwrap();
        assert_eq!(
            listed,
            vec![("t-1/0/a.log".into(), 11), ("t-1/0/b.index".into(), 2)]
        );
        s.delete("t-1/0/a.log").unwrap();
        s.delete("t-1/0/a.log").unwrap();
        assert_eq!(s.list("t-1/").unwrap().len(), 2);
    }

    #[test]
    fn urls_are_checked() {
        let none = |_: &str| None;
        assert!(Store::open_with("file://relative", &none).is_err());
        assert!(Store::open_with("http://x", &none).is_err());
        assert!(Store::open_with("s3://", &none).is_err());
        assert!(Store::open_with("s3://bucket/some/prefix", &none).is_ok());
        let env = |k: &str| (k == "AWS_ENDPOINT_URL").then(|| "not a url".to_string());
        assert!(Store::open_with("s3://bucket", &env).is_err());
    }
}
