//! The glommio transport, for the broker's replica fetcher and the load generator: one
//! connection, one request at a time, each call optionally bounded by a timeout (a
//! half-open connection must not hold a fetcher forever). Nothing here blocks the
//! reactor: the socket is glommio's, and [`resolve`] sends a host name that is not an
//! IP literal to glommio's blocking-thread pool. When the process's peers speak TLS
//! ([`crate::tls::set_peer_tls`]), every connection is wrapped in it; when they speak
//! SASL ([`crate::sasl::set_peer_sasl`]), every connection logs in first.

use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use kafka_protocol::messages::ApiVersionsRequest;
use kafka_protocol::protocol::Request;

use crate::error::{Error, Result};
use crate::frame::{decode_answer, encode_request, read_frame};
use crate::versions::Versions;

/// The first address of `host:port`. An IP literal is parsed in place; a name is
/// resolved off the reactor.
pub async fn resolve(host: &str, port: i32) -> Result<SocketAddr> {
    let addr = format!("{host}:{port}");
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    let name = addr.clone();
    let found = glommio::executor()
        .spawn_blocking(move || name.to_socket_addrs().map(|mut a| a.next()))
        .await;
    match found {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(Error::Unreachable {
            addr,
            reason: "resolves to nothing".into(),
        }),
        Err(e) => Err(Error::Unreachable {
            addr,
            reason: e.to_string(),
        }),
    }
}

/// A connection's socket: plain, or TLS when the process's peers speak it
/// ([`crate::tls::set_peer_tls`]).
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<futures_rustls::client::TlsStream<TcpStream>>),
}

impl futures_lite::AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl futures_lite::AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_close(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

/// One glommio connection to a broker.
pub struct Conn {
    stream: Stream,
    client_id: &'static str,
    correlation: i32,
    call_timeout: Option<Duration>,
}

/// Connects to `addr` (bounded by `connect_timeout` if given) with no delay, TLS when
/// the process's peers speak it, then logged in with SASL when they do
/// ([`crate::sasl::set_peer_sasl`]): what [`Conn`] and the load generator's pipelined
/// connections talk over. Over TLS the peer's certificate must name `host` (a DNS name
/// or an IP literal, as advertised) or, without one, `addr`'s IP.
pub async fn connect_stream(
    addr: SocketAddr,
    host: Option<&str>,
    connect_timeout: Option<Duration>,
) -> Result<Stream> {
    let mut stream = secure_stream(addr, host, connect_timeout).await?;
    if let Some(c) = crate::sasl::peer_sasl() {
        let login = login(&mut stream, &c);
        match connect_timeout {
            Some(t) => {
                futures_lite::future::or(login, async move {
                    glommio::timer::sleep(t).await;
                    Err(Error::Authentication("timed out".into()))
                })
                .await?
            }
            None => login.await?,
        }
    }
    Ok(stream)
}

/// Authenticates a new connection with SASL ([`crate::login`]).
async fn login(stream: &mut Stream, c: &crate::sasl::Credentials) -> Result<()> {
    use crate::login;
    let mut correlation = 0;
    let r = exchange(
        stream,
        "sluice-login",
        &mut correlation,
        login::HANDSHAKE_VERSION,
        &login::handshake(c),
    )
    .await?;
    login::check_handshake(c, &r)?;
    let mut state = crate::sasl::Login::new(c);
    let mut answer = None;
    while let Some(req) = login::next(&mut state, c, answer.as_ref())? {
        let v = login::AUTHENTICATE_VERSION;
        answer = Some(exchange(stream, "sluice-login", &mut correlation, v, &req).await?);
    }
    Ok(())
}

/// Sends `req` and reads the response that answers it.
async fn exchange<R: Request>(
    stream: &mut Stream,
    client_id: &'static str,
    correlation: &mut i32,
    version: i16,
    req: &R,
) -> Result<R::Response> {
    *correlation = correlation.wrapping_add(1);
    let frame = encode_request(client_id, *correlation, version, req)?;
    stream.write_all(&frame).await?;
    // TLS: records a full socket left in the session go out now (see `Stream`); a
    // plain socket's flush is a no-op.
    stream.flush().await?;
    let resp = read_frame(stream).await?;
    decode_answer::<R>(*correlation, version, resp)
}

/// [`connect_stream`] up to the end of the TLS handshake.
async fn secure_stream(
    addr: SocketAddr,
    host: Option<&str>,
    connect_timeout: Option<Duration>,
) -> Result<Stream> {
    let stream = match connect_timeout {
        Some(t) => TcpStream::connect_timeout(addr, t).await,
        None => TcpStream::connect(addr).await,
    }
    .map_err(|e| Error::Unreachable {
        addr: addr.to_string(),
        reason: e.to_string(),
    })?;
    stream.set_nodelay(true).map_err(|e| Error::Io(e.into()))?;
    Ok(match crate::tls::peer_tls() {
        None => Stream::Plain(stream),
        Some(config) => {
            let name = match host {
                Some(h) => crate::tls::server_name(h).map_err(|e| Error::Unreachable {
                    addr: addr.to_string(),
                    reason: e.to_string(),
                })?,
                None => rustls_pki_types::ServerName::IpAddress(addr.ip().into()),
            };
            let handshake = futures_rustls::TlsConnector::from(config).connect(name, stream);
            let tls = match connect_timeout {
                Some(t) => {
                    futures_lite::future::or(handshake, async move {
                        glommio::timer::sleep(t).await;
                        Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "TLS handshake timed out",
                        ))
                    })
                    .await
                }
                None => handshake.await,
            }
            .map_err(|e| Error::Unreachable {
                addr: addr.to_string(),
                reason: format!("TLS: {e}"),
            })?;
            Stream::Tls(Box::new(tls))
        }
    })
}

impl Conn {
    /// Connects to `addr` (bounded by `connect_timeout` if given), with no delay.
    pub async fn connect(
        addr: SocketAddr,
        client_id: &'static str,
        connect_timeout: Option<Duration>,
    ) -> Result<Conn> {
        Ok(Conn {
            stream: connect_stream(addr, None, connect_timeout).await?,
            client_id,
            correlation: 0,
            call_timeout: None,
        })
    }

    /// Connects to a broker by its advertised `host` and `port` ([`resolve`]d off the
    /// reactor); over TLS its certificate must name `host`.
    pub async fn connect_to(
        host: &str,
        port: i32,
        client_id: &'static str,
        connect_timeout: Option<Duration>,
    ) -> Result<Conn> {
        let addr = resolve(host, port).await?;
        Ok(Conn {
            stream: connect_stream(addr, Some(host), connect_timeout).await?,
            client_id,
            correlation: 0,
            call_timeout: None,
        })
    }

    /// Bounds every later [`Conn::call`] by `limit`.
    pub fn with_call_timeout(mut self, limit: Duration) -> Conn {
        self.call_timeout = Some(limit);
        self
    }

    /// Sends `req` at `version` and decodes the response that answers it, within the
    /// call timeout if one is set.
    pub async fn call<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response> {
        match self.call_timeout {
            None => self.call_inner(version, req).await,
            Some(limit) => {
                futures_lite::future::or(self.call_inner(version, req), async move {
                    glommio::timer::sleep(limit).await;
                    Err(Error::Timeout(limit))
                })
                .await
            }
        }
    }

    async fn call_inner<R: Request>(&mut self, version: i16, req: &R) -> Result<R::Response> {
        exchange(
            &mut self.stream,
            self.client_id,
            &mut self.correlation,
            version,
            req,
        )
        .await
    }

    /// The broker's supported version range per API key (ApiVersions v0).
    pub async fn api_versions(&mut self) -> Result<Versions> {
        let r = self.call(0, &ApiVersionsRequest::default()).await?;
        Versions::from_response(&r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_literals_and_names_off_the_reactor() {
        sluice_shard::run_unpinned("aio-test", 1 << 20, || async {
            assert_eq!(
                resolve("127.0.0.1", 9092).await.unwrap(),
                "127.0.0.1:9092".parse().unwrap()
            );
            let a = resolve("localhost", 9092).await.unwrap();
            assert_eq!(a.port(), 9092);
            let e = Conn::connect("127.0.0.1:1".parse().unwrap(), "t", None)
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(e.starts_with("cannot reach broker at 127.0.0.1:1: "), "{e}");
        });
    }
}
