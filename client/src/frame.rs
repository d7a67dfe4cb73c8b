//! The frame layer both transports share: a request encoded with its header into one
//! size-prefixed buffer, a response frame decoded with its header, and a frame read
//! (async or blocking) under [`FRAME_BYTES_MAX`]. The load generator's pipelined loops
//! call these directly.

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

use crate::error::{Error, Result};

/// Largest response frame accepted.
pub const FRAME_BYTES_MAX: usize = 256 << 20;

/// Encodes a size-prefixed request frame: the request header at the version `R` needs
/// at `version` (client id `client_id`), then `req`.
pub fn encode_request<R: Request>(
    client_id: &'static str,
    correlation_id: i32,
    version: i16,
    req: &R,
) -> Result<BytesMut> {
    let mut header = RequestHeader::default();
    header.request_api_key = R::KEY;
    header.request_api_version = version;
    header.correlation_id = correlation_id;
    header.client_id = Some(StrBytes::from_static_str(client_id));
    let hv = R::header_version(version);
    let size =
        header.compute_size(hv).map_err(codec)? + req.compute_size(version).map_err(codec)?;
    let mut buf = BytesMut::with_capacity(4 + size);
    buf.put_i32(size as i32);
    header.encode(&mut buf, hv).map_err(codec)?;
    req.encode(&mut buf, version).map_err(codec)?;
    Ok(buf)
}

/// Decodes a response frame (without its size prefix) to a request `R` sent at
/// `version`: its correlation id and body.
pub fn decode_response<R: Request>(version: i16, mut frame: Bytes) -> Result<(i32, R::Response)> {
    let hv = <R::Response as HeaderVersion>::header_version(version);
    let header = ResponseHeader::decode(&mut frame, hv)
        .map_err(|e| Error::Codec(format!("response header: {e}")))?;
    let body = R::Response::decode(&mut frame, version)
        .map_err(|e| Error::Codec(format!("response body: {e}")))?;
    Ok((header.correlation_id, body))
}

fn codec(e: impl std::fmt::Display) -> Error {
    Error::Codec(e.to_string())
}

/// The body length a size prefix announces, if acceptable.
fn body_len(prefix: [u8; 4]) -> Result<usize> {
    let len = i32::from_be_bytes(prefix);
    if !(4..=FRAME_BYTES_MAX as i64).contains(&i64::from(len)) {
        return Err(Error::FrameLength(len));
    }
    Ok(len as usize)
}

/// Reads one size-prefixed frame and returns it without its prefix.
pub async fn read_frame<S: futures_lite::AsyncRead + Unpin>(s: &mut S) -> Result<Bytes> {
    use futures_lite::AsyncReadExt;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let mut buf = vec![0u8; body_len(len)?];
    s.read_exact(&mut buf).await?;
    Ok(Bytes::from(buf))
}

/// [`read_frame`] for a blocking reader.
pub fn read_frame_blocking<S: io::Read>(s: &mut S) -> Result<Bytes> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut buf = vec![0u8; body_len(len)?];
    s.read_exact(&mut buf)?;
    Ok(Bytes::from(buf))
}

/// Decodes a response frame to `R` and checks it answers `correlation`.
pub fn decode_answer<R: Request>(
    correlation: i32,
    version: i16,
    frame: Bytes,
) -> Result<R::Response> {
    let (got, body) = decode_response::<R>(version, frame)?;
    if got != correlation {
        return Err(Error::Correlation {
            got,
            expected: correlation,
        });
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, ApiVersionsResponse};

    #[test]
    fn frames_round_trip_and_bad_lengths_are_refused() {
        let req = ApiVersionsRequest::default();
        let f = encode_request("t", 7, 3, &req).unwrap();
        let size = i32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!(size, f.len() - 4);
        let mut body = Bytes::copy_from_slice(&f[4..]);
        let h = RequestHeader::decode(&mut body, ApiVersionsRequest::header_version(3)).unwrap();
        assert_eq!((h.correlation_id, h.request_api_version), (7, 3));
        assert_eq!(h.client_id.as_deref(), Some("t"));

        // A response: header (correlation id; v0 header for ApiVersions) then body.
        let mut resp = BytesMut::new();
        resp.put_i32(0);
        ResponseHeader::default()
            .with_correlation_id(7)
            .encode(&mut resp, 0)
            .unwrap();
        ApiVersionsResponse::default().encode(&mut resp, 3).unwrap();
        let n = (resp.len() - 4) as i32;
        resp[..4].copy_from_slice(&n.to_be_bytes());
        let frame = read_frame_blocking(&mut &resp[..]).unwrap();
        let r = decode_answer::<ApiVersionsRequest>(7, 3, frame.clone()).unwrap();
        assert_eq!(r.error_code, 0);
        assert!(matches!(
            decode_answer::<ApiVersionsRequest>(8, 3, frame),
            Err(Error::Correlation {
                got: 7,
                expected: 8
            })
        ));

        let huge = ((FRAME_BYTES_MAX + 1) as i32).to_be_bytes();
        let e = read_frame_blocking(&mut &huge[..]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("bad response frame length {}", FRAME_BYTES_MAX + 1)
        );
        let neg = (-1i32).to_be_bytes();
        assert!(matches!(
            read_frame_blocking(&mut &neg[..]),
            Err(Error::FrameLength(-1))
        ));
    }
}
