//! The HTTP endpoint: the built-in routes (/metrics, /health, /ready), then the added
//! ones (e.g. the lag board's /v1/groups), and the thread that serves them on
//! `--metrics-listen`. Cut apart because it is the only part that does I/O: the
//! registry and the page it serves are plain data and text.

use std::net::SocketAddr;
use std::sync::Arc;

use super::{MetricsListen, Registry};

impl Registry {
    /// Answers one request: the built-in routes, then the added ones, else 404.
    pub fn route(&self, req: &HttpRequest) -> HttpResponse {
        if req.method != "GET" && req.method != "HEAD" {
            return HttpResponse::text(405, "method not allowed\n");
        }
        match req.path.as_str() {
            "/metrics" => {
                return HttpResponse {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8".into(),
                    body: self.render().into_bytes(),
                }
            }
            "/health" => return HttpResponse::text(200, "ok\n"),
            "/ready" => {
                return if self.ready() {
                    HttpResponse::text(200, "ready\n")
                } else {
                    HttpResponse::text(
                        503,
                        "not ready: not yet registered and unfenced, or not serving the Kafka port\n",
                    )
                }
            }
            _ => {}
        }
        for r in self.routes.read().unwrap_or_else(|e| e.into_inner()).iter() {
            if let Some(resp) = r(req) {
                return resp;
            }
        }
        HttpResponse::text(404, "not found (try /metrics, /health, /ready)\n")
    }
}

/// An HTTP request as routes see it.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: String,
    /// The path without the query, e.g. "/v1/groups/my-group" (not percent-decoded).
    pub path: String,
    /// The query string without '?' ("" when none).
    pub query: String,
}

impl HttpRequest {
    /// The value of query parameter `key` (not percent-decoded), if present.
    pub fn query_param(&self, key: &str) -> Option<&str> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == key).then_some(v)
        })
    }
}

/// An HTTP response a route returns.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(status: u16, body: impl Into<String>) -> HttpResponse {
        HttpResponse {
            status,
            content_type: "text/plain; charset=utf-8".into(),
            body: body.into().into_bytes(),
        }
    }

    pub fn json(status: u16, body: impl Into<String>) -> HttpResponse {
        HttpResponse {
            status,
            content_type: "application/json".into(),
            body: body.into().into_bytes(),
        }
    }
}

/// Connections served at once; more are closed at once (a scrape is cheap, and a
/// client that holds a connection open must not keep the others out).
const CONNECTIONS_MAX: usize = 32;

/// How long a connection may last, all of it: the TLS handshake, the request, the
/// answer (a client trickling bytes must not hold a slot past it).
const CONNECTION_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest request head read (request line and headers).
const HEAD_MAX: usize = 16 << 10;

/// Binds the endpoint and starts its thread; with `tls`, it speaks https (the
/// configuration current when a connection is accepted: the files may be reloaded).
/// `Ok(None)`: off, or the default address could not be bound (logged). An explicit
/// address that cannot be bound is an error.
pub fn start(
    listen: MetricsListen,
    registry: Arc<Registry>,
    tls: Option<Arc<sluice_client::tls::ListenerTls>>,
) -> Result<Option<SocketAddr>, String> {
    let (addr, explicit) = match listen {
        MetricsListen::Off => return Ok(None),
        MetricsListen::Default(a) => (a, false),
        MetricsListen::Explicit(a) => (a, true),
    };
    let listener = match std::net::TcpListener::bind(addr) {
        Ok(s) => s,
        Err(e) if explicit => {
            return Err(format!(
                "cannot serve metrics on --metrics-listen {addr}: {e}"
            ))
        }
        Err(e) => {
            tracing::warn!(%addr, error = %e, "cannot serve metrics on the default address; running without a metrics endpoint (set --metrics-listen HOST:PORT or off)");
            return Ok(None);
        }
    };
    let bound = listener.local_addr().unwrap_or(addr);
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || accept(listener, registry, tls))
        .map_err(|e| format!("starting the metrics thread: {e}"))?;
    Ok(Some(bound))
}

/// The accepting thread: each connection gets a thread of its own, at most
/// [`CONNECTIONS_MAX`] at once.
fn accept(
    listener: std::net::TcpListener,
    registry: Arc<Registry>,
    tls: Option<Arc<sluice_client::tls::ListenerTls>>,
) {
    let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "metrics accept failed");
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        use std::sync::atomic::Ordering;
        if open.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
            open.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (registry, config, open) = (
            registry.clone(),
            tls.as_ref().map(|t| t.current()),
            open.clone(),
        );
        let slot = Slot(open.clone());
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                let _slot = slot;
                if let Err(e) = connection(stream, &registry, config) {
                    tracing::debug!(error = %e, "metrics connection ended");
                }
            });
        if let Err(e) = spawned {
            // The closure (and its slot) was dropped: the count is given back.
            tracing::debug!(error = %e, "no thread for a metrics connection");
        }
    }
}

/// One connection's place among [`CONNECTIONS_MAX`], given back when dropped.
struct Slot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A socket whose every read and write waits at most until one deadline.
struct Deadline {
    stream: std::net::TcpStream,
    until: std::time::Instant,
}

impl Deadline {
    fn arm(&self) -> std::io::Result<()> {
        let left = self
            .until
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "metrics connection past its deadline",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.set_write_timeout(Some(left))
    }
}

impl std::io::Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.arm()?;
        self.stream.read(buf)
    }
}

impl std::io::Write for Deadline {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.arm()?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// One request and its answer, then the connection is closed (`Connection: close`:
/// scrapes are seconds apart, and no state is kept between requests), all within
/// [`CONNECTION_MAX`].
fn connection(
    stream: std::net::TcpStream,
    registry: &Registry,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<()> {
    let mut stream = Deadline {
        stream,
        until: std::time::Instant::now() + CONNECTION_MAX,
    };
    match tls {
        None => exchange(&mut stream, registry),
        Some(config) => {
            let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
            let mut tls = rustls::StreamOwned::new(conn, stream);
            exchange(&mut tls, registry)?;
            // The end of the answer is also the end of the TLS session.
            tls.conn.send_close_notify();
            std::io::Write::flush(&mut tls)
        }
    }
}

fn exchange(
    s: &mut (impl std::io::Read + std::io::Write),
    registry: &Registry,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > HEAD_MAX {
            return answer(
                s,
                false,
                &HttpResponse::text(431, "request head too large\n"),
            );
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return answer(s, false, &HttpResponse::text(400, "bad request line\n"));
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return answer(s, false, &HttpResponse::text(400, "bad request line\n"));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let req = HttpRequest {
        method: method.to_ascii_uppercase(),
        path: path.to_string(),
        query: query.to_string(),
    };
    let resp = registry.route(&req);
    answer(s, req.method == "HEAD", &resp)
}

fn answer(
    s: &mut impl std::io::Write,
    head_only: bool,
    resp: &HttpResponse,
) -> std::io::Result<()> {
    let reason = match resp.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        resp.status,
        resp.content_type,
        resp.body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(&resp.body);
    }
    s.write_all(&out)?;
    s.flush()
}
