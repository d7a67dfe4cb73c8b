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

/// Binds the endpoint and starts its thread. `Ok(None)`: off, or the default address
/// could not be bound (logged). An explicit address that cannot be bound is an error.
pub fn start(listen: MetricsListen, registry: Arc<Registry>) -> Result<Option<SocketAddr>, String> {
    let (addr, explicit) = match listen {
        MetricsListen::Off => return Ok(None),
        MetricsListen::Default(a) => (a, false),
        MetricsListen::Explicit(a) => (a, true),
    };
    let server = match tiny_http::Server::http(addr) {
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
    let bound = server.server_addr().to_ip().unwrap_or(addr);
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || serve(server, registry))
        .map_err(|e| format!("starting the metrics thread: {e}"))?;
    Ok(Some(bound))
}

/// The HTTP thread: one request at a time (a scrape is cheap; Prometheus scrapes rarely).
fn serve(server: tiny_http::Server, registry: Arc<Registry>) {
    for request in server.incoming_requests() {
        let url = request.url().to_string();
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let req = HttpRequest {
            method: request.method().as_str().to_ascii_uppercase(),
            path: path.to_string(),
            query: query.to_string(),
        };
        let resp = registry.route(&req);
        let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], resp.content_type)
            .expect("a valid header");
        let out = tiny_http::Response::from_data(resp.body)
            .with_status_code(resp.status)
            .with_header(header);
        if let Err(e) = request.respond(out) {
            tracing::debug!(error = %e, "metrics response not sent");
        }
    }
}
