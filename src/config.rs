//! Broker configuration: a TOML file, overridden by command-line flags.
//!
//! Every key of the file has the name of its flag with `_` for `-`:
//!
//! ```toml
//! node_id = 1
//! listen = "127.0.0.1:9092"
//! advertised = "127.0.0.1:9092"   # default: the listen address
//! data_dir = "./data"
//! cores = 2                       # default: every online CPU
//! default_partitions = 1
//! auto_create_topics = true
//! socket_request_max_bytes = 104857600
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Kafka's `socket.request.max.bytes` default: 100 MiB.
pub const SOCKET_REQUEST_MAX_BYTES: usize = 100 * 1024 * 1024;

/// The file form: every field optional, so flags and defaults fill the gaps.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub node_id: Option<i32>,
    pub listen: Option<String>,
    pub advertised: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub cores: Option<usize>,
    pub default_partitions: Option<i32>,
    pub auto_create_topics: Option<bool>,
    pub socket_request_max_bytes: Option<usize>,
}

impl FileConfig {
    pub fn load(path: &std::path::Path) -> Result<FileConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
    }
}

/// The resolved configuration of one broker process.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: i32,
    pub listen: SocketAddr,
    /// Host and port clients are told to connect to (Metadata, DescribeCluster).
    pub advertised_host: String,
    pub advertised_port: i32,
    pub data_dir: PathBuf,
    pub cores: usize,
    pub default_partitions: i32,
    pub auto_create_topics: bool,
    pub socket_request_max_bytes: usize,
}

impl BrokerConfig {
    /// Resolves flags (`flags`, the same shape as the file) over the file over defaults.
    pub fn resolve(
        file: FileConfig,
        flags: FileConfig,
        online_cpus: usize,
    ) -> Result<BrokerConfig, String> {
        let pick = |f: Option<String>, c: Option<String>| f.or(c);
        let listen_s = pick(flags.listen, file.listen).unwrap_or_else(|| "127.0.0.1:9092".into());
        let listen: SocketAddr = listen_s
            .parse()
            .map_err(|e| format!("--listen {listen_s}: expected IP:PORT ({e})"))?;
        let advertised =
            pick(flags.advertised, file.advertised).unwrap_or_else(|| listen.to_string());
        let (host, port) = advertised
            .rsplit_once(':')
            .ok_or_else(|| format!("--advertised {advertised}: expected HOST:PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|e| format!("--advertised {advertised}: bad port ({e})"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let cores = flags.cores.or(file.cores).unwrap_or(online_cpus.max(1));
        if cores == 0 {
            return Err("--cores must be at least 1".into());
        }
        let default_partitions = flags
            .default_partitions
            .or(file.default_partitions)
            .unwrap_or(1);
        if default_partitions < 1 {
            return Err("--default-partitions must be at least 1".into());
        }
        let socket_request_max_bytes = flags
            .socket_request_max_bytes
            .or(file.socket_request_max_bytes)
            .unwrap_or(SOCKET_REQUEST_MAX_BYTES);
        if socket_request_max_bytes < 1024 {
            return Err("socket_request_max_bytes must be at least 1024".into());
        }
        Ok(BrokerConfig {
            node_id: flags.node_id.or(file.node_id).unwrap_or(1),
            listen,
            advertised_host: host,
            advertised_port: i32::from(port),
            data_dir: flags
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./data")),
            cores,
            default_partitions,
            auto_create_topics: flags
                .auto_create_topics
                .or(file.auto_create_topics)
                .unwrap_or(true),
            socket_request_max_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file() {
        let file: FileConfig =
            toml::from_str("listen = \"127.0.0.1:1000\"\ncores = 3\nnode_id = 7").unwrap();
        let flags = FileConfig {
            listen: Some("127.0.0.1:2000".into()),
            ..Default::default()
        };
        let c = BrokerConfig::resolve(file, flags, 2).unwrap();
        assert_eq!(c.listen.port(), 2000);
        assert_eq!(c.cores, 3);
        assert_eq!(c.node_id, 7);
        assert_eq!(c.advertised_port, 2000);
        assert!(c.auto_create_topics);
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        assert!(toml::from_str::<FileConfig>("colour = 1").is_err());
    }
}
