//! TLS for Kafka connections (rustls, ring; no OpenSSL): the configurations a broker's
//! `SSL` listener serves with and its own connections to other brokers use, read from
//! PEM files as Kafka's `ssl.keystore.type=PEM` / `ssl.truststore.type=PEM` give them.
//!
//! The broker's connections to other brokers (replica fetchers, transaction markers,
//! the lag collector) go to their one Kafka listener, so when that listener is `SSL`
//! every such connection is TLS: [`set_peer_tls`] installs the process's client
//! configuration at start (and again when the files are reloaded), and
//! [`crate::aio::Conn::connect`] wraps each connection in it. [`ListenerTls`] holds the
//! listener's configuration, replaced the same way. Peers are verified against the configured authorities and by
//! the address connected to (its IP must be a subject alternative name of the peer's
//! certificate, Kafka's default `ssl.endpoint.identification.algorithm=https`).

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why a TLS configuration could not be built: the file and what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

pub(crate) fn file_err(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Kafka's `ssl.client.auth`: whether a client must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    /// Checked against the authorities if presented; a client without one is let in.
    Requested,
    Required,
}

impl ClientAuth {
    pub fn parse(s: &str) -> Option<ClientAuth> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Some(ClientAuth::None),
            "requested" => Some(ClientAuth::Requested),
            "required" => Some(ClientAuth::Required),
            _ => None,
        }
    }
}

/// The certificates of a PEM file, in order (a chain: the leaf first).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "holds no PEM certificate"));
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, e))
}

/// The authorities of a PEM file as a root store.
pub fn authorities(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certificates(path)? {
        roots.add(c).map_err(|e| file_err(path, e))?;
    }
    Ok(Arc::new(roots))
}

/// ring's provider. rustls 0.23.48 deprecates it for lacking post-quantum key
/// exchange (aws-lc-rs has it, at the cost of building AWS-LC's C sources in every
/// build); Kafka's clients negotiate the classical groups ring offers.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a listener serves with: `cert` (chain) and `key`; client certificates checked
/// against `ca` as `auth` asks (`ca` is needed unless `auth` is [`ClientAuth::None`]).
pub fn server_config(
    cert: &Path,
    key: &Path,
    ca: Option<&Path>,
    auth: ClientAuth,
) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(cert)?;
    let key = private_key(key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match (auth, ca) {
        (ClientAuth::None, _) => builder.with_no_client_auth(),
        (_, None) => {
            return Err(TlsError::Config(
                "client certificates are checked against the authorities of a CA file: none given"
                    .into(),
            ))
        }
        (auth, Some(ca)) => {
            let v = WebPkiClientVerifier::builder_with_provider(authorities(ca)?, provider());
            let v = match auth {
                ClientAuth::Requested => v.allow_unauthenticated(),
                _ => v,
            };
            builder
                .with_client_cert_verifier(v.build().map_err(|e| TlsError::Config(e.to_string()))?)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("{}: {e}", cert.display())))?;
    Ok(Arc::new(config))
}

/// What a client connects with: peers verified against `ca`; `identity` (certificate
/// chain and key files) presented when a listener asks for one.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let verifier = WebPkiServerVerifier::builder_with_provider(authorities(ca)?, provider())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_webpki_verifier(verifier);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| TlsError::Config(format!("{}: {e}", cert.display())))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// What an https client (the alert sinks, `sluice lag`) connects with: servers
/// verified by name against Mozilla's roots (webpki-roots) and, when given, the
/// authorities in `extra_ca` (an internal Alertmanager's).
pub fn https_config(extra_ca: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = extra_ca {
        for c in certificates(path)? {
            roots.add(c).map_err(|e| file_err(path, e))?;
        }
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Checks a server's certificate chain against the authorities, not its name: the
/// controller port's peers are known by address only (`--controller-quorum` resolves
/// them), and what the port needs is that both ends hold a certificate of the cluster's
/// CA (the server requires one from the client, too).
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The controller port's TLS, both ends (see [`ChainOnly`]): the server requires a
/// client certificate from `ca`, the client presents `cert` and checks the server's
/// chain against `ca`.
pub fn controller_configs(
    cert: &Path,
    key: &Path,
    ca: &Path,
) -> Result<(Arc<ServerConfig>, Arc<ClientConfig>), TlsError> {
    let server = server_config(cert, key, Some(ca), ClientAuth::Required)?;
    let provider = provider();
    let verifier = Arc::new(ChainOnly {
        roots: authorities(ca)?,
        provider: provider.clone(),
    });
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(certificates(cert)?, private_key(key)?)
        .map_err(|e| TlsError::Config(format!("{}: {e}", cert.display())))?;
    Ok((server, Arc::new(client)))
}

type ControllerTls = (Arc<ServerConfig>, Arc<ClientConfig>);

static CONTROLLER_TLS: RwLock<Option<ControllerTls>> = RwLock::new(None);

/// Makes this process's controller port TLS with mutual authentication (its listener
/// and its connections to the other controllers), from [`controller_configs`]; set
/// again when the files are reloaded.
pub fn set_controller_tls(configs: ControllerTls) {
    *CONTROLLER_TLS.write().unwrap_or_else(|e| e.into_inner()) = Some(configs);
}

/// What [`set_controller_tls`] set.
pub fn controller_tls() -> Option<ControllerTls> {
    CONTROLLER_TLS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

static PEER_TLS: RwLock<Option<Arc<ClientConfig>>> = RwLock::new(None);

/// Makes every later [`crate::aio::Conn`] and [`crate::blocking::Conn`] of this process
/// TLS with `config` (a broker whose listener is `SSL`, at start and whenever its files
/// are reloaded; an admin CLI given `--command-config`). Connections open already keep
/// theirs.
pub fn set_peer_tls(config: Arc<ClientConfig>) {
    *PEER_TLS.write().unwrap_or_else(|e| e.into_inner()) = Some(config);
}

/// The process's TLS client configuration, if set.
pub fn peer_tls() -> Option<Arc<ClientConfig>> {
    PEER_TLS.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A listener's TLS configuration, replaceable while the broker runs (certificates
/// rotated on disk): each accepted connection handshakes with the configuration
/// current when it arrived; connections open already keep theirs.
pub struct ListenerTls(RwLock<Arc<ServerConfig>>);

impl ListenerTls {
    pub fn new(config: Arc<ServerConfig>) -> Arc<ListenerTls> {
        Arc::new(ListenerTls(RwLock::new(config)))
    }

    pub fn current(&self) -> Arc<ServerConfig> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn replace(&self, config: Arc<ServerConfig>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = config;
    }
}

/// The subject of a certificate as Kafka's default principal mapping spells it (Java's
/// `X500Principal.getName()`, RFC 2253): the last RDN first, `TYPE=value` joined by
/// `,` (several attributes of one RDN by `+`), RFC 2253's special characters escaped;
/// an attribute type without a keyword as its dotted OID with the value as `#` and the
/// hex of its DER encoding. `None` if the certificate does not parse.
pub fn subject_of(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    let rdns: Vec<String> = cert
        .subject()
        .iter()
        .map(|rdn| {
            rdn.iter()
                .map(|a| {
                    let oid = a.attr_type().to_id_string();
                    match (short_name(&oid), a.as_str()) {
                        (Some(keyword), Ok(text)) => format!("{keyword}={}", escape_rfc2253(text)),
                        (keyword, _) => {
                            let hex: String = value_der(a.attr_value())
                                .iter()
                                .map(|b| format!("{b:02x}"))
                                .collect();
                            format!("{}=#{hex}", keyword.unwrap_or(&oid))
                        }
                    }
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    Some(rdns.into_iter().rev().collect::<Vec<_>>().join(","))
}

/// The DER encoding of an attribute value (identifier, length, content).
fn value_der(value: &x509_parser::der_parser::asn1_rs::Any<'_>) -> Vec<u8> {
    let header = &value.header;
    let mut out = match header.raw_tag() {
        Some(raw) => raw.to_vec(),
        None => {
            let class = header.class() as u8;
            let tag = header.tag().0;
            vec![(class << 6) | (u8::from(header.constructed()) << 5) | (tag.min(30) as u8)]
        }
    };
    let len = value.data.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(value.data);
    out
}

/// RFC 2253's keywords (those Java's RFC 2253 output uses).
fn short_name(oid: &str) -> Option<&'static str> {
    Some(match oid {
        "2.5.4.3" => "CN",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "STREET",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "0.9.2342.19200300.100.1.25" => "DC",
        "0.9.2342.19200300.100.1.1" => "UID",
        _ => return None,
    })
}

/// A value as Java writes it in RFC 2253 form: each of `,=+<>#;"\\` escaped with a
/// backslash, and every leading and trailing space too.
fn escape_rfc2253(value: &str) -> String {
    let chars: Vec<char> = value.chars().collect();
    let lead = chars.iter().take_while(|c| **c == ' ').count();
    let trail = chars.iter().rev().take_while(|c| **c == ' ').count();
    let mut out = String::with_capacity(value.len() + 4);
    for (i, c) in chars.iter().enumerate() {
        let edge_space = *c == ' ' && (i < lead || i >= chars.len() - trail);
        if edge_space || matches!(c, ',' | '=' | '+' | '<' | '>' | '#' | ';' | '"' | '\\') {
            out.push('\\');
        }
        out.push(*c);
    }
    out
}

/// The name a peer's certificate must hold for `host` (an IP literal or a DNS name).
pub fn server_name(host: &str) -> Result<rustls_pki_types::ServerName<'static>, TlsError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls_pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| TlsError::Config(format!("{host}: not a host name for TLS ({e})")))
}

/// The fuzz target `tls_handshake` (and `make test`'s replay of its corpus): what a
/// peer sends before it is authenticated. The first byte picks the path: 0, the bytes
/// after the next are what a client sends a listener requiring client certificates
/// (records fed to a rustls server session with the broker's own configuration, in
/// chunks the second byte sizes); otherwise the rest is a certificate whose subject the broker turns into a
/// principal ([`subject_of`]). Any input must be refused or accepted: never a panic,
/// an abort or an unbounded allocation.
pub fn fuzz_handshake(data: &[u8]) {
    let _ = handshake_answers(data);
}

/// [`fuzz_handshake`]'s body: true if the server session wrote anything back (a
/// ServerHello or an alert).
fn handshake_answers(data: &[u8]) -> bool {
    let Some((&path, rest)) = data.split_first() else {
        return false;
    };
    if path != 0 {
        let _ = subject_of(&CertificateDer::from(rest.to_vec()));
        return false;
    }
    static CONFIG: std::sync::OnceLock<Arc<ServerConfig>> = std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        server_config(
            &dir.join("fuzz-broker.pem"),
            &dir.join("fuzz-broker.key"),
            Some(&dir.join("fuzz-broker.pem")),
            ClientAuth::Required,
        )
        .expect("client/testdata holds the fuzz certificate and key")
    });
    let Ok(mut conn) = rustls::ServerConnection::new(config.clone()) else {
        return false;
    };
    let (chunk, mut input) = match rest.split_first() {
        Some((&c, more)) => (usize::from(c).max(1), more),
        None => return false,
    };
    let mut sink = Vec::new();
    let mut answered = false;
    while !input.is_empty() {
        let n = chunk.min(input.len());
        let mut piece = &input[..n];
        input = &input[n..];
        while !piece.is_empty() {
            match conn.read_tls(&mut piece) {
                Ok(0) | Err(_) => return answered,
                Ok(_) => {}
            }
            if conn.process_new_packets().is_err() {
                // The alert is written, as the broker's session would.
                return conn.write_tls(&mut sink).is_ok_and(|n| n > 0) || answered;
            }
            while conn.wants_write() {
                sink.clear();
                match conn.write_tls(&mut sink) {
                    Ok(n) => answered |= n > 0,
                    Err(_) => return answered,
                }
            }
        }
    }
    let _ = peer_subject(&conn);
    answered
}

/// The principal path a completed handshake takes (the presented leaf's subject).
fn peer_subject(conn: &rustls::ServerConnection) -> Option<String> {
    conn.peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(subject_of)
}

#[cfg(test)]
mod subject_tests {
    use super::escape_rfc2253;

    #[test]
    fn fuzz_corpus_replays_without_panics() {
        let inputs = crate::fuzz_replay_inputs("tls_handshake", 3);
        // The seeds reach the handshake: a real ClientHello gets a ServerHello.
        let seeds =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/tls_handshake");
        for hello in ["client-hello-12", "client-hello-13"] {
            let seed = std::fs::read(seeds.join(hello)).unwrap();
            assert!(super::handshake_answers(&seed), "{hello} got no answer");
        }
        for input in &inputs {
            super::fuzz_handshake(input);
        }
    }

    #[test]
    fn values_are_escaped_as_java_does() {
        assert_eq!(escape_rfc2253("alice"), "alice");
        assert_eq!(escape_rfc2253("Smith, John"), "Smith\\, John");
        assert_eq!(
            escape_rfc2253("a=b+c#d;e<f>g\"h\\i"),
            "a\\=b\\+c\\#d\\;e\\<f\\>g\\\"h\\\\i"
        );
        assert_eq!(escape_rfc2253("  x y  "), "\\ \\ x y\\ \\ ");
    }
}
