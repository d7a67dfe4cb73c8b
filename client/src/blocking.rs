//! The blocking transport, for the admin CLIs: one `std::net::TcpStream` per broker
//! (TLS over it when `--command-config` asks for SSL, a SASL login first when it asks
//! for SASL), one request at a time, connect
//! and read bounded by timeouts. Never use it on a glommio shard.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use std::io::Write;

use kafka_protocol::messages::ApiVersionsRequest;
use kafka_protocol::protocol::Request;

use crate::error::{Error, Result};
use crate::frame::{decode_answer, encode_request, read_frame_blocking};
use crate::versions::Versions;

/// How long connecting (per resolved address) and each response may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A blocking connection's socket: plain, or TLS when the process's peers speak it
/// ([`crate::tls::set_peer_tls`]: the admin CLIs' `--command-config`).
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl std::io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// `s`, connected to `addr` (`host:port`), in TLS when the process's peers speak it,
/// its handshake done (so a refused one reads as such); why not otherwise.
fn secure(addr: &str, s: TcpStream) -> std::result::Result<Stream, String> {
    let Some(config) = crate::tls::peer_tls() else {
        return Ok(Stream::Plain(s));
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let name = crate::tls::server_name(host).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(config, name).map_err(|e| format!("TLS: {e}"))?;
    let mut tls = rustls::StreamOwned::new(conn, s);
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .map_err(|e| format!("TLS: {e}"))?;
    }
    Ok(Stream::Tls(Box::new(tls)))
}

/// One blocking connection.
pub struct Conn {
    s: Stream,
    client_id: &'static str,
    correlation: i32,
}

impl Conn {
    /// Connects to `addr` (`host:port`, or several separated by commas as Kafka's
    /// bootstrap lists are, tried in order; bounded by a timeout per resolved address)
    /// or says why it could not.
    pub fn open(addr: &str, client_id: &'static str) -> Result<Conn> {
        let mut last = None;
        for one in addr.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            match Conn::open_one(one, client_id) {
                Ok(c) => return Ok(c),
                // A refused login is the answer, not a reason to try another broker.
                Err(e @ Error::Authentication(_)) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Unreachable {
            addr: addr.to_string(),
            reason: "no address".into(),
        }))
    }

    fn open_one(addr: &str, client_id: &'static str) -> Result<Conn> {
        let unreachable = |reason: String| Error::Unreachable {
            addr: addr.to_string(),
            reason,
        };
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
                    // A refused handshake tries the next address, as a refused connect.
                    match secure(addr, s) {
                        Ok(s) => {
                            let mut conn = Conn {
                                s,
                                client_id,
                                correlation: 0,
                            };
                            // A refused login is the answer, not a reason to try
                            // another address.
                            if let Some(c) = crate::sasl::peer_sasl() {
                                conn.login(&c)?;
                            }
                            return Ok(conn);
                        }
                        Err(e) => last = e,
                    }
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(unreachable(last))
    }

    /// Authenticates with SASL ([`crate::login`]).
    fn login(&mut self, c: &crate::sasl::Credentials) -> Result<()> {
        use crate::login;
        let r = self.call(login::HANDSHAKE_VERSION, &login::handshake(c))?;
        login::check_handshake(c, &r)?;
        let mut state = crate::sasl::Login::new(c);
        let mut answer = None;
        while let Some(req) = login::next(&mut state, c, answer.as_ref())? {
            answer = Some(self.call(login::AUTHENTICATE_VERSION, &req)?);
        }
        Ok(())
    }

    /// How long a call waits for its answer from now on (a request the broker answers
    /// only once something happened, as AddRaftVoter).
    pub fn set_read_timeout(&mut self, timeout: std::time::Duration) {
        self.s.tcp().set_read_timeout(Some(timeout)).ok();
    }

    /// Sends `req` at `version` and decodes the response.
    pub fn call<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response> {
        self.correlation = self.correlation.wrapping_add(1);
        let frame = encode_request(self.client_id, self.correlation, version, req)?;
        self.s.write_all(&frame)?;
        let resp = read_frame_blocking(&mut self.s)?;
        decode_answer::<R>(self.correlation, version, resp)
    }

    /// The broker's supported version range per API key (ApiVersions v0, which every
    /// broker answers).
    pub fn api_versions(&mut self) -> Result<Versions> {
        let r = self.call(0, &ApiVersionsRequest::default())?;
        Versions::from_response(&r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_broker_is_named() {
        // Port 1 on loopback: nothing listens there.
        let e = Conn::open("127.0.0.1:1", "t").err().unwrap().to_string();
        assert!(e.starts_with("cannot reach broker at 127.0.0.1:1: "), "{e}");
        let e = Conn::open("not an address", "t").err().unwrap().to_string();
        assert!(
            e.starts_with("cannot reach broker at not an address: "),
            "{e}"
        );
    }
}
