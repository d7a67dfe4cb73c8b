//! The admin CLIs' Kafka client plumbing (`sluice group`, `sluice cluster`): one
//! blocking connection per broker, requests and responses through `kafka-protocol`'s
//! codecs, ApiVersions negotiation, and Kafka error codes turned into messages.
//! Nothing here runs inside the broker.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

pub type Res<T> = Result<T, String>;

/// How long connecting and each response may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(30);

pub fn sbs(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The name of a Kafka error code (`NotEnoughReplicas`), or `error N` for unknown codes.
pub fn error_name(code: i16) -> String {
    use kafka_protocol::error::ResponseError;
    match ResponseError::try_from_code(code) {
        Some(ResponseError::Unknown(_)) | None => format!("error {code}"),
        Some(e) => format!("{e:?}"),
    }
}

/// `Err("what: ErrorName")` unless `code` is 0.
pub fn code_err(what: &str, code: i16) -> Res<()> {
    if code == 0 {
        return Ok(());
    }
    Err(format!("{what}: {}", error_name(code)))
}

/// One blocking connection.
pub struct Conn {
    s: TcpStream,
    correlation: i32,
}

impl Conn {
    /// Connects (bounded by a timeout per resolved address) or says why it could not.
    pub fn open(addr: &str) -> Res<Conn> {
        let unreachable = |e: String| format!("cannot reach broker at {addr}: {e}");
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| unreachable(e.to_string()))?
            .collect();
        let mut last = String::from("no address");
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    s.set_read_timeout(Some(READ_TIMEOUT)).ok();
                    s.set_nodelay(true).ok();
                    return Ok(Conn { s, correlation: 0 });
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(unreachable(last))
    }

    /// Sends `req` at `version` and decodes the response.
    pub fn call<R: Request>(&mut self, version: i16, req: &R) -> Res<R::Response> {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(sbs("sluice-cli")));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        header
            .encode(&mut buf, R::header_version(version))
            .map_err(|e| e.to_string())?;
        req.encode(&mut buf, version).map_err(|e| e.to_string())?;
        let size = (buf.len() - 4) as i32;
        buf[..4].copy_from_slice(&size.to_be_bytes());
        self.s.write_all(&buf).map_err(|e| e.to_string())?;
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len).map_err(|e| e.to_string())?;
        let len = i32::from_be_bytes(len);
        if !(4..=(256 << 20)).contains(&len) {
            return Err(format!("bad response frame length {len}"));
        }
        let mut body = vec![0u8; len as usize];
        self.s.read_exact(&mut body).map_err(|e| e.to_string())?;
        let mut body = Bytes::from(body);
        let hv = <R::Response as HeaderVersion>::header_version(version);
        ResponseHeader::decode(&mut body, hv).map_err(|e| e.to_string())?;
        R::Response::decode(&mut body, version).map_err(|e| e.to_string())
    }

    /// The broker's supported version range per API key (ApiVersions v0, which every
    /// broker answers).
    pub fn api_versions(&mut self) -> Res<Versions> {
        let r = self.call(0, &ApiVersionsRequest::default())?;
        code_err("ApiVersions", r.error_code)?;
        Ok(Versions(
            r.api_keys
                .iter()
                .map(|k| (k.api_key, (k.min_version, k.max_version)))
                .collect(),
        ))
    }
}

/// What a broker said it supports.
#[derive(Debug, Clone, Default)]
pub struct Versions(pub BTreeMap<i16, (i16, i16)>);

impl Versions {
    /// The highest version of `key` in both the broker's range and `ours` (inclusive),
    /// or `None` when they do not overlap.
    pub fn pick(&self, key: ApiKey, ours: (i16, i16)) -> Option<i16> {
        let (min, max) = *self.0.get(&(key as i16))?;
        let v = max.min(ours.1);
        (v >= min.max(ours.0)).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_takes_the_highest_common_version() {
        let v = Versions(
            [
                (ApiKey::Metadata as i16, (0, 12)),
                (ApiKey::DescribeCluster as i16, (0, 0)),
            ]
            .into_iter()
            .collect(),
        );
        assert_eq!(v.pick(ApiKey::Metadata, (1, 9)), Some(9));
        assert_eq!(v.pick(ApiKey::DescribeCluster, (0, 1)), Some(0));
        assert_eq!(v.pick(ApiKey::DescribeCluster, (1, 1)), None);
        assert_eq!(v.pick(ApiKey::Produce, (3, 9)), None);
    }

    #[test]
    fn unreachable_broker_is_named() {
        // Port 1 on loopback: nothing listens there.
        let e = Conn::open("127.0.0.1:1").err().unwrap();
        assert!(e.starts_with("cannot reach broker at 127.0.0.1:1: "), "{e}");
        let e = Conn::open("not an address").err().unwrap();
        assert!(
            e.starts_with("cannot reach broker at not an address: "),
            "{e}"
        );
    }

    #[test]
    fn error_codes_have_names() {
        assert_eq!(error_name(19), "NotEnoughReplicas");
        assert_eq!(error_name(-12345), "error -12345");
        assert!(code_err("x", 0).is_ok());
        assert_eq!(
            code_err("Produce", 19).unwrap_err(),
            "Produce: NotEnoughReplicas"
        );
    }
}
