//! SASL/PLAIN (RFC 4616) and SASL/SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677)
//! as Kafka speaks them, for both ends: the broker's server side ([`parse_plain`],
//! [`ClientFirst`] then [`ServerAwaitingFinal`]) and our clients' side
//! ([`plain_message`], [`ScramClient`] then [`ClientAwaitingFinal`]). Pure: no I/O,
//! the caller carries the messages in SaslAuthenticate requests.
//!
//! The broker stores per user and SCRAM mechanism only a [`ScramCredential`] (salt,
//! iterations, StoredKey, ServerKey), never the password or the salted password, so
//! the store does not let anyone log in as the user. PLAIN is checked against that
//! same credential ([`ScramCredential::verify_password`]), so there is one credential
//! store for all three mechanisms.
//!
//! As in Kafka: no channel binding (gs2 flag `n` only), an authorization id must be
//! the user itself, the `m=` attribute is refused, unknown extensions are ignored, and
//! delegation tokens (`tokenauth=true`) are refused here (Sluice has none). User names
//! may be any UTF-8 (Kafka accepts ASCII only); passwords are used as their UTF-8
//! bytes (no SASLprep, as Kafka). Every message is parsed under [`MESSAGE_BYTES_MAX`];
//! no input makes a parser panic.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::rand::SecureRandom as _;
use ring::{digest, hmac, pbkdf2};

/// A SASL mechanism Sluice speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 3] = [
        Mechanism::Plain,
        Mechanism::ScramSha256,
        Mechanism::ScramSha512,
    ];

    /// Kafka's name for the mechanism (`sasl.mechanism`, SaslHandshake).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism of an exact (case-sensitive) Kafka name.
    pub fn parse(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's ScramMechanism code (DescribeUserScramCredentials,
    /// AlterUserScramCredentials): SCRAM-SHA-256 is 1, SCRAM-SHA-512 2; PLAIN has none.
    pub fn scram_type(self) -> Option<i8> {
        match self {
            Mechanism::Plain => None,
            Mechanism::ScramSha256 => Some(1),
            Mechanism::ScramSha512 => Some(2),
        }
    }

    pub fn from_scram_type(t: i8) -> Option<Mechanism> {
        Mechanism::ALL
            .into_iter()
            .find(|m| m.scram_type() == Some(t))
    }

    pub fn is_scram(self) -> bool {
        self.scram_type().is_some()
    }

    /// The hash functions of a SCRAM mechanism, `None` for PLAIN.
    fn hash(self) -> Option<Hash> {
        match self {
            Mechanism::Plain => None,
            Mechanism::ScramSha256 => Some(Hash {
                digest: &digest::SHA256,
                hmac: hmac::HMAC_SHA256,
                pbkdf2: pbkdf2::PBKDF2_HMAC_SHA256,
                len: 32,
            }),
            Mechanism::ScramSha512 => Some(Hash {
                digest: &digest::SHA512,
                hmac: hmac::HMAC_SHA512,
                pbkdf2: pbkdf2::PBKDF2_HMAC_SHA512,
                len: 64,
            }),
        }
    }

    fn scram_hash(self) -> Hash {
        match self.hash() {
            Some(h) => h,
            None => panic!("{} is not a SCRAM mechanism", self.name()),
        }
    }
}

/// Kafka's bounds on SCRAM iterations (AlterUserScramCredentials refuses others).
pub const ITERATIONS_MIN: i32 = 4096;
pub const ITERATIONS_MAX: i32 = 16384;

/// The longest SASL message parsed here; a longer one is malformed.
pub const MESSAGE_BYTES_MAX: usize = 64 * 1024;

/// Why an exchange failed: a human-readable reason, safe to send to the peer.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct SaslError(pub String);

fn err(reason: impl Into<String>) -> SaslError {
    SaslError(reason.into())
}

/// H, HMAC and Hi of one SCRAM mechanism; `len` is H's output length.
struct Hash {
    digest: &'static digest::Algorithm,
    hmac: hmac::Algorithm,
    pbkdf2: pbkdf2::Algorithm,
    len: usize,
}

impl Hash {
    fn h(&self, data: &[u8]) -> Vec<u8> {
        digest::digest(self.digest, data).as_ref().to_vec()
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(self.hmac, key), data)
            .as_ref()
            .to_vec()
    }
}

/// What the broker stores per user and SCRAM mechanism (never the password or salted password).
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub iterations: i32,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // StoredKey and one overheard exchange give ClientKey: never printed.
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// From a salted password (SaltedPassword = Hi(password, salt, i)), as
    /// AlterUserScramCredentials sends it. Panics if `mechanism` is PLAIN (callers
    /// check [`Mechanism::is_scram`]).
    pub fn from_salted_password(
        mechanism: Mechanism,
        salt: &[u8],
        iterations: i32,
        salted_password: &[u8],
    ) -> ScramCredential {
        let hash = mechanism.scram_hash();
        ScramCredential {
            salt: salt.to_vec(),
            iterations,
            stored_key: hash.h(&hash.hmac(salted_password, b"Client Key")),
            server_key: hash.hmac(salted_password, b"Server Key"),
        }
    }

    /// Panics if `mechanism` is PLAIN or `iterations` is below 1.
    pub fn from_password(
        mechanism: Mechanism,
        password: &str,
        salt: &[u8],
        iterations: i32,
    ) -> ScramCredential {
        let salted = salted_password(mechanism, password.as_bytes(), salt, iterations);
        ScramCredential::from_salted_password(mechanism, salt, iterations, &salted)
    }

    /// With a fresh random 32-byte salt. Panics as [`ScramCredential::from_password`].
    pub fn generate(mechanism: Mechanism, password: &str, iterations: i32) -> ScramCredential {
        ScramCredential::from_password(mechanism, password, &random_bytes(32), iterations)
    }

    /// Does `password` match (SASL/PLAIN checked against a stored SCRAM credential)?
    /// Constant-time comparison of StoredKey. False for PLAIN or a credential whose
    /// iterations are out of Kafka's bounds (the work is bounded by [`ITERATIONS_MAX`]).
    pub fn verify_password(&self, mechanism: Mechanism, password: &str) -> bool {
        if !mechanism.is_scram() || !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&self.iterations) {
            return false;
        }
        let candidate =
            ScramCredential::from_password(mechanism, password, &self.salt, self.iterations);
        ct_eq(&candidate.stored_key, &self.stored_key)
    }
}

/// SaltedPassword = Hi(password, salt, i): PBKDF2 with the mechanism's HMAC, one
/// hash-length block. Panics if `mechanism` is PLAIN or `iterations` is below 1.
pub fn salted_password(
    mechanism: Mechanism,
    password: &[u8],
    salt: &[u8],
    iterations: i32,
) -> Vec<u8> {
    let hash = mechanism.scram_hash();
    let iterations = u32::try_from(iterations)
        .ok()
        .and_then(std::num::NonZeroU32::new)
        .unwrap_or_else(|| panic!("SCRAM iterations must be positive, not {iterations}"));
    let mut out = vec![0u8; hash.len];
    pbkdf2::derive(hash.pbkdf2, iterations, salt, password, &mut out);
    out
}

/// `n` bytes from the system's secure random generator.
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .expect("the system random generator failed");
    out
}

/// A random nonce of 32 ASCII letters and digits (printable, no ',').
fn random_nonce() -> String {
    const ALNUM: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut nonce = String::with_capacity(32);
    while nonce.len() < 32 {
        // 248 = 4 * 62: rejecting the rest keeps every character equally likely.
        for b in random_bytes(48) {
            if b < 248 && nonce.len() < 32 {
                nonce.push(char::from(ALNUM[usize::from(b % 62)]));
            }
        }
    }
    nonce
}

/// Equal contents, in time independent of where they differ (a length difference is
/// not equal; lengths are not secret).
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// SASL/PLAIN (RFC 4616) message "authzid\0authcid\0passwd". Returns (user, password);
/// a non-empty authzid different from the user is refused ("authorization id must
/// match the user"), as Kafka does.
pub fn parse_plain(message: &[u8]) -> Result<(String, String), SaslError> {
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(err("malformed PLAIN message: too long"));
    }
    let text =
        std::str::from_utf8(message).map_err(|_| err("malformed PLAIN message: not UTF-8"))?;
    let parts: Vec<&str> = text.split('\0').collect();
    let [authzid, user, password] = parts[..] else {
        return Err(err(format!(
            "malformed PLAIN message: expected 3 NUL-separated parts, got {}",
            parts.len()
        )));
    };
    if user.is_empty() {
        return Err(err("malformed PLAIN message: empty user name"));
    }
    if password.is_empty() {
        return Err(err("malformed PLAIN message: empty password"));
    }
    if !authzid.is_empty() && authzid != user {
        return Err(err("authorization id must match the user"));
    }
    Ok((user.to_string(), password.to_string()))
}

/// The SASL/PLAIN message for `user` (no authorization id, as Kafka's client sends).
pub fn plain_message(user: &str, password: &str) -> Vec<u8> {
    format!("\0{user}\0{password}").into_bytes()
}

/// RFC 5802's saslname: ',' as "=2C", '=' as "=3D".
pub fn escape_name(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

/// The user name of a saslname: "=2C" and "=3D" decoded; any other '=', a NUL or an
/// empty name is malformed.
pub fn unescape_name(saslname: &str) -> Result<String, SaslError> {
    if saslname.is_empty() {
        return Err(err("empty user name"));
    }
    let mut out = String::with_capacity(saslname.len());
    let mut rest = saslname;
    while let Some(i) = rest.find(['=', ',', '\0']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("=2C") {
            out.push(',');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("=3D") {
            out.push('=');
            rest = after;
        } else {
            return Err(err("bad escape in user name"));
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The text of a message under the size limit, or why not (`what` names the message).
fn message_text<'a>(what: &str, message: &'a [u8]) -> Result<&'a str, SaslError> {
    if message.is_empty() {
        return Err(malformed(what, "empty"));
    }
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(malformed(what, "too long"));
    }
    std::str::from_utf8(message).map_err(|_| malformed(what, "not UTF-8"))
}

fn malformed(what: &str, reason: impl std::fmt::Display) -> SaslError {
    err(format!("malformed {what} message: {reason}"))
}

/// RFC 5802's printable: %x21-7E except ','; non-empty.
fn printable(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// An attribute `<name>=<value>` with the given one-letter name: its value.
fn attr(part: &str, name: char) -> Option<&str> {
    part.strip_prefix(name)?.strip_prefix('=')
}

/// An extension attribute (`<letters>=<value>`, value non-empty): its name and value.
fn extension(part: &str) -> Option<(&str, &str)> {
    let (key, value) = part.split_once('=')?;
    let ok = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphabetic()) && !value.is_empty();
    ok.then_some((key, value))
}

/// Base64 (standard alphabet, padded, canonical), or why not.
fn base64_value(what: &str, field: &str, value: &str) -> Result<Vec<u8>, SaslError> {
    STANDARD
        .decode(value)
        .map_err(|_| malformed(what, format!("{field} is not base64")))
}

/// Server side, step 1: a parsed client-first message.
pub struct ClientFirst {
    pub user: String,
    mechanism: Mechanism,
    /// The gs2 header as sent ("n,," or "n,a=<authzid>,"), which client-final's
    /// channel binding must carry.
    gs2_header: String,
    client_nonce: String,
    /// client-first-message-bare as sent, the start of AuthMessage.
    bare: String,
}

impl ClientFirst {
    /// Parses a client-first message of a SCRAM `mechanism` (a PLAIN mechanism refuses
    /// every message).
    pub fn parse(mechanism: Mechanism, message: &[u8]) -> Result<ClientFirst, SaslError> {
        const WHAT: &str = "client-first";
        if !mechanism.is_scram() {
            return Err(err(format!(
                "{} is not a SCRAM mechanism",
                mechanism.name()
            )));
        }
        let text = message_text(WHAT, message)?;
        // gs2-header = gs2-cbind-flag "," [ authzid ] ","
        let (flag, rest) = text
            .split_once(',')
            .ok_or_else(|| malformed(WHAT, "no gs2 header"))?;
        match flag {
            "n" => {}
            "y" => return Err(err("channel binding is not supported")),
            f if f.starts_with("p=") => return Err(err("channel binding is not supported")),
            _ => return Err(malformed(WHAT, "bad channel binding flag")),
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or_else(|| malformed(WHAT, "no gs2 header"))?;
        let gs2_len = flag.len() + authzid.len() + 2;
        let authzid = match authzid {
            "" => None,
            a => {
                let name = attr(a, 'a').ok_or_else(|| malformed(WHAT, "bad authorization id"))?;
                Some(unescape_name(name).map_err(|e| malformed(WHAT, e))?)
            }
        };

        let mut parts = bare.split(',');
        let first = parts.next().unwrap_or("");
        if first.starts_with("m=") {
            return Err(err("mandatory extensions (m=) are not supported"));
        }
        let saslname = attr(first, 'n').ok_or_else(|| malformed(WHAT, "no user name"))?;
        let user = unescape_name(saslname).map_err(|e| malformed(WHAT, e))?;
        let client_nonce = parts
            .next()
            .and_then(|p| attr(p, 'r'))
            .ok_or_else(|| malformed(WHAT, "no nonce"))?;
        if !printable(client_nonce) {
            return Err(malformed(WHAT, "bad nonce"));
        }
        for part in parts {
            let (key, value) = extension(part).ok_or_else(|| malformed(WHAT, "bad extension"))?;
            if key == "tokenauth" && value.eq_ignore_ascii_case("true") {
                return Err(err("delegation tokens are not supported"));
            }
        }
        if let Some(authzid) = authzid {
            if authzid != user {
                return Err(err("authorization id must match the user"));
            }
        }
        Ok(ClientFirst {
            user,
            mechanism,
            gs2_header: text[..gs2_len].to_string(),
            client_nonce: client_nonce.to_string(),
            bare: bare.to_string(),
        })
    }

    /// Answers with the user's stored credential: returns the server-first message and
    /// the state awaiting client-final. (A caller with no credential for the user
    /// answers with a made-up one, so that the exchange fails only at the proof.)
    pub fn respond(self, credential: &ScramCredential) -> (Vec<u8>, ServerAwaitingFinal) {
        let server_nonce = random_nonce();
        self.respond_with_nonce(credential, &server_nonce)
    }

    fn respond_with_nonce(
        self,
        credential: &ScramCredential,
        server_nonce: &str,
    ) -> (Vec<u8>, ServerAwaitingFinal) {
        let nonce = format!("{}{server_nonce}", self.client_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            STANDARD.encode(&credential.salt),
            credential.iterations
        );
        let state = ServerAwaitingFinal {
            mechanism: self.mechanism,
            user: self.user,
            channel_binding: STANDARD.encode(self.gs2_header.as_bytes()),
            client_nonce_len: self.client_nonce.len(),
            nonce,
            auth_prefix: format!("{},{server_first}", self.bare),
            stored_key: credential.stored_key.clone(),
            server_key: credential.server_key.clone(),
        };
        (server_first.into_bytes(), state)
    }
}

/// Server side, step 2: awaiting client-final.
pub struct ServerAwaitingFinal {
    mechanism: Mechanism,
    user: String,
    /// base64 of the gs2 header, client-final's `c=`.
    channel_binding: String,
    /// Client nonce + server nonce.
    nonce: String,
    /// The client nonce's length (in bytes; it is printable ASCII).
    client_nonce_len: usize,
    /// client-first-message-bare "," server-first-message.
    auth_prefix: String,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl ServerAwaitingFinal {
    /// Checks client-final (channel binding, nonce, proof); returns the server-final
    /// message ("v=...") on success.
    pub fn finish(self, client_final: &[u8]) -> Result<Vec<u8>, SaslError> {
        const WHAT: &str = "client-final";
        let text = message_text(WHAT, client_final)?;
        let (without_proof, proof) = text
            .rsplit_once(',')
            .ok_or_else(|| malformed(WHAT, "no proof"))?;
        let proof = attr(proof, 'p').ok_or_else(|| malformed(WHAT, "no proof"))?;
        let mut parts = without_proof.split(',');
        let channel_binding = parts
            .next()
            .and_then(|p| attr(p, 'c'))
            .ok_or_else(|| malformed(WHAT, "no channel binding"))?;
        let nonce = parts
            .next()
            .and_then(|p| attr(p, 'r'))
            .ok_or_else(|| malformed(WHAT, "no nonce"))?;
        for part in parts {
            extension(part).ok_or_else(|| malformed(WHAT, "bad extension"))?;
        }
        let proof = base64_value(WHAT, "proof", proof)?;
        if channel_binding != self.channel_binding {
            return Err(err("channel binding does not match the gs2 header"));
        }
        // The nonce the server sent, or librdkafka's: its own nonce in front of the
        // server's whole nonce (which already starts with it), which Kafka brokers
        // before CVE-2024-56128's fix accepted by checking only the end. Nothing else.
        let doubled = format!("{}{}", &self.nonce[..self.client_nonce_len], self.nonce);
        if nonce != self.nonce && nonce != doubled {
            return Err(err("nonce does not match"));
        }
        let hash = self.mechanism.scram_hash();
        let auth_message = format!("{},{without_proof}", self.auth_prefix);
        let client_signature = hash.hmac(&self.stored_key, auth_message.as_bytes());
        if proof.len() != hash.len {
            return Err(err("invalid proof"));
        }
        let client_key = xor(&proof, &client_signature);
        if !ct_eq(&hash.h(&client_key), &self.stored_key) {
            return Err(err("invalid proof"));
        }
        let server_signature = hash.hmac(&self.server_key, auth_message.as_bytes());
        Ok(format!("v={}", STANDARD.encode(server_signature)).into_bytes())
    }

    pub fn user(&self) -> &str {
        &self.user
    }
}

/// The gs2 header our clients send: no channel binding, no authorization id.
const CLIENT_GS2_HEADER: &str = "n,,";

/// Client side, step 1: client-first sent, awaiting server-first.
pub struct ScramClient {
    mechanism: Mechanism,
    password: String,
    client_nonce: String,
    /// client-first-message-bare as sent.
    bare: String,
}

impl ScramClient {
    /// Returns the client and its client-first message. Panics if mechanism is PLAIN.
    pub fn start(mechanism: Mechanism, user: &str, password: &str) -> (ScramClient, Vec<u8>) {
        ScramClient::with_nonce(mechanism, user, password, &random_nonce())
    }

    fn with_nonce(
        mechanism: Mechanism,
        user: &str,
        password: &str,
        client_nonce: &str,
    ) -> (ScramClient, Vec<u8>) {
        assert!(
            mechanism.is_scram(),
            "{} is not a SCRAM mechanism",
            mechanism.name()
        );
        let bare = format!("n={},r={client_nonce}", escape_name(user));
        let first = format!("{CLIENT_GS2_HEADER}{bare}").into_bytes();
        let client = ScramClient {
            mechanism,
            password: password.to_string(),
            client_nonce: client_nonce.to_string(),
            bare,
        };
        (client, first)
    }

    /// From server-first: the client-final message and the state that checks
    /// server-final. Iterations outside [`ITERATIONS_MIN`]..=[`ITERATIONS_MAX`] are
    /// refused (Kafka's brokers store no others; a larger count would only cost us time).
    pub fn respond(self, server_first: &[u8]) -> Result<(Vec<u8>, ClientAwaitingFinal), SaslError> {
        const WHAT: &str = "server-first";
        let text = message_text(WHAT, server_first)?;
        let mut parts = text.split(',');
        let first = parts.next().unwrap_or("");
        if first.starts_with("m=") {
            return Err(err("mandatory extensions (m=) are not supported"));
        }
        let nonce = attr(first, 'r').ok_or_else(|| malformed(WHAT, "no nonce"))?;
        let salt = parts
            .next()
            .and_then(|p| attr(p, 's'))
            .ok_or_else(|| malformed(WHAT, "no salt"))?;
        let iterations = parts
            .next()
            .and_then(|p| attr(p, 'i'))
            .ok_or_else(|| malformed(WHAT, "no iteration count"))?;
        for part in parts {
            extension(part).ok_or_else(|| malformed(WHAT, "bad extension"))?;
        }
        if !printable(nonce) {
            return Err(malformed(WHAT, "bad nonce"));
        }
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(err("server nonce does not extend the client nonce"));
        }
        let salt = base64_value(WHAT, "salt", salt)?;
        if salt.is_empty() {
            return Err(malformed(WHAT, "empty salt"));
        }
        // Digits only: `parse` would also take a sign.
        let iterations: i32 = Some(iterations)
            .filter(|i| i.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| malformed(WHAT, "bad iteration count"))?;
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
            return Err(err(format!(
                "iteration count {iterations} is outside {ITERATIONS_MIN}..={ITERATIONS_MAX}"
            )));
        }

        let hash = self.mechanism.scram_hash();
        let salted = salted_password(self.mechanism, self.password.as_bytes(), &salt, iterations);
        let client_key = hash.hmac(&salted, b"Client Key");
        let stored_key = hash.h(&client_key);
        let server_key = hash.hmac(&salted, b"Server Key");
        let without_proof = format!(
            "c={},r={nonce}",
            STANDARD.encode(CLIENT_GS2_HEADER.as_bytes())
        );
        let auth_message = format!("{},{text},{without_proof}", self.bare);
        let client_signature = hash.hmac(&stored_key, auth_message.as_bytes());
        let proof = xor(&client_key, &client_signature);
        let client_final = format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes();
        let server_signature = hash.hmac(&server_key, auth_message.as_bytes());
        Ok((client_final, ClientAwaitingFinal { server_signature }))
    }
}

/// Client side, step 2: client-final sent, awaiting server-final.
pub struct ClientAwaitingFinal {
    server_signature: Vec<u8>,
}

impl ClientAwaitingFinal {
    /// Checks the server's signature ("v=..."); "e=..." is an error carrying the
    /// server's reason.
    pub fn verify(self, server_final: &[u8]) -> Result<(), SaslError> {
        const WHAT: &str = "server-final";
        let text = message_text(WHAT, server_final)?;
        if let Some(reason) = attr(text, 'e') {
            return Err(err(format!("server refused: {reason}")));
        }
        let mut parts = text.split(',');
        let signature = parts
            .next()
            .and_then(|p| attr(p, 'v'))
            .ok_or_else(|| malformed(WHAT, "no signature"))?;
        for part in parts {
            extension(part).ok_or_else(|| malformed(WHAT, "bad extension"))?;
        }
        let signature = base64_value(WHAT, "signature", signature)?;
        if !ct_eq(&signature, &self.server_signature) {
            return Err(err("invalid server signature"));
        }
        Ok(())
    }
}

/// A client's SASL settings (librdkafka's `sasl.mechanism`, `sasl.username`,
/// `sasl.password`).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub mechanism: Mechanism,
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("mechanism", &self.mechanism)
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// The client side of one authentication, without I/O: [`Login::step`] gives each
/// token to send (in SaslAuthenticate requests), from the server's answer to the one
/// before.
pub struct Login(LoginState);

enum LoginState {
    Start(Credentials),
    /// PLAIN sent: the server's (empty) answer means success.
    PlainSent,
    ScramFirstSent(ScramClient),
    ScramFinalSent(ClientAwaitingFinal),
    Done,
}

impl Login {
    pub fn new(credentials: &Credentials) -> Login {
        Login(LoginState::Start(credentials.clone()))
    }

    /// The next token to send, given the server's answer to the last one (`None`
    /// before the first); `Ok(None)`: authenticated (for SCRAM, the server proved it
    /// holds the credential).
    pub fn step(&mut self, answer: Option<&[u8]>) -> Result<Option<Vec<u8>>, SaslError> {
        let out_of_order = || SaslError("SASL exchange out of order".into());
        match (std::mem::replace(&mut self.0, LoginState::Done), answer) {
            (LoginState::Start(c), None) if c.mechanism == Mechanism::Plain => {
                self.0 = LoginState::PlainSent;
                Ok(Some(plain_message(&c.user, &c.password)))
            }
            (LoginState::Start(c), None) => {
                let (client, first) = ScramClient::start(c.mechanism, &c.user, &c.password);
                self.0 = LoginState::ScramFirstSent(client);
                Ok(Some(first))
            }
            (LoginState::PlainSent, Some(_)) => Ok(None),
            (LoginState::ScramFirstSent(client), Some(server_first)) => {
                let (last, check) = client.respond(server_first)?;
                self.0 = LoginState::ScramFinalSent(check);
                Ok(Some(last))
            }
            (LoginState::ScramFinalSent(check), Some(server_final)) => {
                check.verify(server_final)?;
                Ok(None)
            }
            _ => Err(out_of_order()),
        }
    }
}

/// The SASL credentials this process's connections to brokers authenticate with (a
/// broker's to its peers, a CLI's from `--command-config`); none: no SASL.
static PEER_SASL: std::sync::RwLock<Option<Credentials>> = std::sync::RwLock::new(None);

/// Makes every later [`crate::aio::Conn`] and [`crate::blocking::Conn`] (and
/// [`crate::aio::connect_stream`]) of this process authenticate with `credentials`.
pub fn set_peer_sasl(credentials: Credentials) {
    *PEER_SASL.write().unwrap_or_else(|e| e.into_inner()) = Some(credentials);
}

/// What [`set_peer_sasl`] set.
pub fn peer_sasl() -> Option<Credentials> {
    PEER_SASL.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Fuzzing entry point (`fuzz/fuzz_targets/sasl_exchange.rs`, and the corpus replay in
/// this crate's tests): `data` played as every message a peer can send — a PLAIN
/// message, a SCRAM client-first (then, split at the first NUL, a client-final to the
/// server that answered it), a server-first and a server-final to a client. Any input
/// must be refused or accepted, never panic.
pub fn fuzz_exchange(data: &[u8]) {
    let _ = parse_plain(data);
    let (first, last) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, data),
    };
    let credential = ScramCredential::from_salted_password(
        Mechanism::ScramSha256,
        b"fuzz-salt",
        ITERATIONS_MIN,
        &[7; 32],
    );
    for m in [Mechanism::ScramSha256, Mechanism::ScramSha512] {
        if let Ok(parsed) = ClientFirst::parse(m, first) {
            let (_, waiting) = parsed.respond(&credential);
            let _ = waiting.finish(last);
        }
        let (client, _) = ScramClient::start(m, "u", "p");
        if let Ok((_, check)) = client.respond(first) {
            let _ = check.verify(last);
        }
    }
    let mut login = Login::new(&Credentials {
        mechanism: Mechanism::Plain,
        user: "u".into(),
        password: "p".into(),
    });
    let _ = login.step(None);
    let _ = login.step(Some(data));
    let _ = login.step(Some(data));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SASL fuzz corpus (fuzz/seeds/sasl_exchange, and fuzz/corpus/sasl_exchange
    /// after a `make fuzz` run) and generated inputs replay without a panic.
    #[test]
    fn fuzz_corpus_replays_without_panics() {
        let inputs = crate::fuzz_replay_inputs("sasl_exchange", 4);
        for input in &inputs {
            fuzz_exchange(input);
        }
    }

    #[test]
    fn logins_drive_plain_and_scram_against_the_server_side() {
        for m in [Mechanism::ScramSha256, Mechanism::ScramSha512] {
            let stored = ScramCredential::generate(m, "secret", ITERATIONS_MIN);
            for (password, ok) in [("secret", true), ("guess", false)] {
                let mut login = Login::new(&Credentials {
                    mechanism: m,
                    user: "u".into(),
                    password: password.into(),
                });
                let first = login.step(None).unwrap().unwrap();
                let parsed = ClientFirst::parse(m, &first).unwrap();
                assert_eq!(parsed.user, "u");
                let (server_first, waiting) = parsed.respond(&stored);
                let last = login.step(Some(&server_first)).unwrap().unwrap();
                match waiting.finish(&last) {
                    Ok(server_final) => {
                        assert!(ok);
                        assert_eq!(login.step(Some(&server_final)), Ok(None));
                    }
                    Err(_) => assert!(!ok),
                }
            }
        }
        let mut plain = Login::new(&Credentials {
            mechanism: Mechanism::Plain,
            user: "u".into(),
            password: "p".into(),
        });
        let msg = plain.step(None).unwrap().unwrap();
        assert_eq!(parse_plain(&msg).unwrap(), ("u".into(), "p".into()));
        assert_eq!(plain.step(Some(b"")), Ok(None));
        // Anything after the end is out of order.
        assert!(plain.step(Some(b"")).is_err());
    }

    const RFC_SERVER_FIRST: &str =
        "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
         p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    const SCRAMS: [Mechanism; 2] = [Mechanism::ScramSha256, Mechanism::ScramSha512];

    /// A full exchange: the server's state after server-first and the client's client-final.
    fn exchange(
        m: Mechanism,
        user: &str,
        password: &str,
        credential: &ScramCredential,
    ) -> (ServerAwaitingFinal, Vec<u8>, ClientAwaitingFinal) {
        let (client, first) = ScramClient::start(m, user, password);
        let parsed = ClientFirst::parse(m, &first).unwrap();
        assert_eq!(parsed.user, user);
        let (server_first, server) = parsed.respond(credential);
        let (client_final, client) = client.respond(&server_first).unwrap();
        (server, client_final, client)
    }

    #[test]
    fn rfc7677_example() {
        let m = Mechanism::ScramSha256;
        let (client, first) = ScramClient::with_nonce(m, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let (client_final, client) = client.respond(RFC_SERVER_FIRST.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(client_final).unwrap(), RFC_CLIENT_FINAL);
        client.verify(RFC_SERVER_FINAL.as_bytes()).unwrap();

        // The server side, with the RFC's server nonce and a credential from the password.
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = ScramCredential::from_password(m, "pencil", &salt, 4096);
        let parsed = ClientFirst::parse(m, &first).unwrap();
        let (server_first, server) =
            parsed.respond_with_nonce(&credential, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0");
        assert_eq!(String::from_utf8(server_first).unwrap(), RFC_SERVER_FIRST);
        assert_eq!(server.user(), "user");
        let server_final = server.finish(RFC_CLIENT_FINAL.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(server_final).unwrap(), RFC_SERVER_FINAL);
    }

    #[test]
    fn round_trips_and_failures() {
        for m in SCRAMS {
            let credential = ScramCredential::generate(m, "secret", ITERATIONS_MIN);
            assert_eq!(credential.salt.len(), 32);
            assert_eq!(credential.stored_key.len(), m.scram_hash().len);

            // Success: both sides agree.
            let (server, client_final, client) = exchange(m, "alice", "secret", &credential);
            assert_eq!(server.user(), "alice");
            let server_final = server.finish(&client_final).unwrap();
            assert!(server_final.starts_with(b"v="));
            client.verify(&server_final).unwrap();

            // A wrong password fails at the server.
            let (server, client_final, _) = exchange(m, "alice", "wrong", &credential);
            assert_eq!(
                server.finish(&client_final),
                Err(SaslError("invalid proof".into()))
            );

            // A tampered server-final fails at the client, and so does an "e=".
            let (server, client_final, client) = exchange(m, "alice", "secret", &credential);
            let mut server_final = server.finish(&client_final).unwrap();
            let i = server_final.len() / 2;
            server_final[i] = if server_final[i] == b'A' { b'B' } else { b'A' };
            assert!(client.verify(&server_final).is_err());
            let (_, _, client) = exchange(m, "alice", "secret", &credential);
            let e = client.verify(b"e=invalid-proof").unwrap_err();
            assert!(e.0.contains("invalid-proof"), "{e}");

            // A signature from another exchange (a replayed server-final) fails.
            let (server, client_final, _) = exchange(m, "alice", "secret", &credential);
            let old_final = server.finish(&client_final).unwrap();
            let (_, _, client) = exchange(m, "alice", "secret", &credential);
            assert!(client.verify(&old_final).is_err());

            // A client-final replayed into another exchange fails (other server nonce).
            let (server, client_final, _) = exchange(m, "alice", "secret", &credential);
            server.finish(&client_final).unwrap();
            let (server, _, _) = exchange(m, "alice", "secret", &credential);
            assert!(server.finish(&client_final).is_err());

            // With fixed nonces the same exchange can be replayed: untouched it succeeds,
            // a modified nonce or channel binding fails.
            let good = String::from_utf8(fixed_exchange(m, &credential).1).unwrap();
            let (server, _) = fixed_exchange(m, &credential);
            server.finish(good.as_bytes()).unwrap();
            let bad_nonce = good.replacen(",r=", ",r=x", 1);
            let bad_binding = good.replacen("c=biws", "c=eSws", 1);
            for bad in [bad_nonce, bad_binding] {
                assert_ne!(bad, good);
                let (server, _) = fixed_exchange(m, &credential);
                assert!(server.finish(bad.as_bytes()).is_err(), "{bad}");
            }
        }
    }

    /// An exchange with fixed nonces: the server's state and the client-final.
    fn fixed_exchange(
        m: Mechanism,
        credential: &ScramCredential,
    ) -> (ServerAwaitingFinal, Vec<u8>) {
        let (client, first) = ScramClient::with_nonce(m, "alice", "secret", "clientnonce");
        let parsed = ClientFirst::parse(m, &first).unwrap();
        let (server_first, server) = parsed.respond_with_nonce(credential, "servernonce");
        let (client_final, _) = client.respond(&server_first).unwrap();
        (server, client_final)
    }

    #[test]
    fn channel_binding_must_carry_the_authzid_sent() {
        let m = Mechanism::ScramSha256;
        let credential = ScramCredential::generate(m, "pw", ITERATIONS_MIN);
        let (client, first) = ScramClient::start(m, "bob", "pw");
        let first = String::from_utf8(first).unwrap();
        let with_authzid = first.replacen("n,,", "n,a=bob,", 1);
        let parsed = ClientFirst::parse(m, with_authzid.as_bytes()).unwrap();
        let (server_first, server) = parsed.respond(&credential);
        // Our client's c=biws ("n,,") differs from the header the server saw.
        let (client_final, _) = client.respond(&server_first).unwrap();
        assert!(server.finish(&client_final).is_err());
        // Other authzids, channel binding flags and m= are refused.
        for bad in [
            first.replacen("n,,", "n,a=eve,", 1),
            first.replacen("n,,", "y,,", 1),
            first.replacen("n,,", "p=tls-unique,,", 1),
            first.replacen("n,,", "n,,m=x,", 1),
            format!("{first},tokenauth=true"),
            format!("{first},tokenauth=TRUE"),
        ] {
            assert!(ClientFirst::parse(m, bad.as_bytes()).is_err(), "{bad}");
        }
        let e = ClientFirst::parse(m, format!("{first},tokenauth=true").as_bytes())
            .err()
            .unwrap();
        assert_eq!(e.0, "delegation tokens are not supported");
        // Unknown extensions are ignored.
        assert!(
            ClientFirst::parse(m, format!("{first},foo=bar,tokenauth=false").as_bytes()).is_ok()
        );
        // PLAIN has no SCRAM exchange.
        assert!(ClientFirst::parse(Mechanism::Plain, first.as_bytes()).is_err());
    }

    #[test]
    fn plain_messages_and_verify_password() {
        assert_eq!(
            parse_plain(b"\0alice\0secret"),
            Ok(("alice".into(), "secret".into()))
        );
        assert_eq!(
            parse_plain(b"alice\0alice\0secret"),
            Ok(("alice".into(), "secret".into()))
        );
        assert_eq!(
            parse_plain(b"eve\0alice\0secret"),
            Err(SaslError("authorization id must match the user".into()))
        );
        for bad in [
            &b""[..],
            b"alice",
            b"\0alice",
            b"\0alice\0secret\0x",
            b"\0\0secret",
            b"\0alice\0",
            b"\0al\xffice\0secret",
        ] {
            assert!(parse_plain(bad).is_err(), "{bad:?}");
        }
        let msg = plain_message("bob", "p\u{e4}ss");
        assert_eq!(parse_plain(&msg), Ok(("bob".into(), "p\u{e4}ss".into())));

        for m in SCRAMS {
            let credential = ScramCredential::generate(m, "secret", ITERATIONS_MIN);
            assert!(credential.verify_password(m, "secret"));
            assert!(!credential.verify_password(m, "Secret"));
            assert!(!credential.verify_password(m, ""));
            let other = if m == Mechanism::ScramSha256 {
                Mechanism::ScramSha512
            } else {
                Mechanism::ScramSha256
            };
            assert!(!credential.verify_password(other, "secret"));
            assert!(!credential.verify_password(Mechanism::Plain, "secret"));
        }
    }

    #[test]
    fn names_with_commas_and_equals_round_trip() {
        assert_eq!(escape_name("a,b=c"), "a=2Cb=3Dc");
        for name in ["a,b", "=", "x=2C", ",,==", "user=3D,"] {
            assert_eq!(unescape_name(&escape_name(name)).unwrap(), name);
            for m in SCRAMS {
                let credential = ScramCredential::generate(m, "pw", ITERATIONS_MIN);
                let (server, client_final, client) = exchange(m, name, "pw", &credential);
                assert_eq!(server.user(), name);
                client
                    .verify(&server.finish(&client_final).unwrap())
                    .unwrap();
            }
        }
        for bad in [
            "", "a=", "a=2", "a=2c", "a=3d", "a=41", "a=3Db=", "a\0b", "=",
        ] {
            assert!(unescape_name(bad).is_err(), "{bad}");
            let first = format!("n,,n={bad},r=abcdef");
            assert!(ClientFirst::parse(Mechanism::ScramSha256, first.as_bytes()).is_err());
        }
        assert!(ClientFirst::parse(Mechanism::ScramSha256, b"n,a=x=2,n=x,r=abc").is_err());
    }

    /// Deterministic pseudo-random bytes (xorshift), for the garbage inputs.
    fn garbage(seed: &mut u64, len: usize) -> Vec<u8> {
        (0..len)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                (*seed >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn garbage_is_refused_without_panics() {
        let m = Mechanism::ScramSha256;
        let credential = ScramCredential::generate(m, "pw", ITERATIONS_MIN);
        let mut inputs: Vec<Vec<u8>> = vec![
            Vec::new(),
            b",".to_vec(),
            b",,,,".to_vec(),
            b"n,,".to_vec(),
            b"n,,n=,r=".to_vec(),
            b"n,,n=u,r=,".to_vec(),
            b"=".to_vec(),
            b"r=,s=,i=".to_vec(),
            b"r=x,s=AAAA,i=99999999999999999999".to_vec(),
            b"r=x,s=AAAA,i=-1".to_vec(),
            b"c=,r=,p=".to_vec(),
            b"c=biws,r=x,p=!!".to_vec(),
            b"v=".to_vec(),
            b"\xff\xfe\xfd".to_vec(),
            b"n,,n=\xc3\x28,r=abc".to_vec(),
            vec![b'a'; MESSAGE_BYTES_MAX + 1],
        ];
        let mut big = b"n,,n=u,r=".to_vec();
        big.extend(std::iter::repeat_n(b'x', MESSAGE_BYTES_MAX));
        inputs.push(big);
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for len in 0..300 {
            inputs.push(garbage(&mut seed, len));
            // Printable garbage with the separators the parsers look for.
            let mut text = garbage(&mut seed, len);
            for b in &mut text {
                *b = b"nrcpsvie=,aAZ09+/"[usize::from(*b) % 17];
            }
            inputs.push(text);
        }
        for input in &inputs {
            assert!(ClientFirst::parse(m, input).is_err(), "{input:?}");
            let (client, _) = ScramClient::start(m, "u", "pw");
            assert!(client.respond(input).is_err(), "{input:?}");
            let (_, server) = ClientFirst::parse(m, b"n,,n=u,r=abc")
                .unwrap()
                .respond(&credential);
            assert!(server.finish(input).is_err(), "{input:?}");
            let (server, client_final, client) = exchange(m, "u", "pw", &credential);
            assert!(client.verify(input).is_err(), "{input:?}");
            server.finish(&client_final).unwrap();
            let _ = parse_plain(input);
        }
        // A corrupt stored credential (wrong key lengths) fails the proof, no panic.
        let broken = ScramCredential {
            stored_key: vec![1, 2, 3],
            ..credential.clone()
        };
        let (server, client_final, _) = exchange(m, "u", "pw", &broken);
        assert!(server.finish(&client_final).is_err());
    }

    #[test]
    fn mechanisms_and_credentials() {
        for m in Mechanism::ALL {
            assert_eq!(Mechanism::parse(m.name()), Some(m));
            assert_eq!(m.is_scram(), m != Mechanism::Plain);
            if let Some(t) = m.scram_type() {
                assert_eq!(Mechanism::from_scram_type(t), Some(m));
            }
        }
        assert_eq!(Mechanism::ScramSha256.scram_type(), Some(1));
        assert_eq!(Mechanism::ScramSha512.scram_type(), Some(2));
        assert_eq!(Mechanism::Plain.scram_type(), None);
        assert_eq!(Mechanism::from_scram_type(0), None);
        assert_eq!(Mechanism::from_scram_type(3), None);
        assert_eq!(Mechanism::parse("scram-sha-256"), None);
        assert_eq!(Mechanism::parse("GSSAPI"), None);

        for m in SCRAMS {
            let salt = random_bytes(16);
            let salted = salted_password(m, b"pw", &salt, 4096);
            assert_eq!(salted.len(), m.scram_hash().len);
            let a = ScramCredential::from_salted_password(m, &salt, 4096, &salted);
            let b = ScramCredential::from_password(m, "pw", &salt, 4096);
            assert_eq!(a, b);
            assert_ne!(a, ScramCredential::from_password(m, "pw2", &salt, 4096));
            assert_ne!(a.stored_key, a.server_key);
        }
        // RFC 7677's salted password determines the example's keys.
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let c = ScramCredential::from_password(Mechanism::ScramSha256, "pencil", &salt, 4096);
        assert!(c.verify_password(Mechanism::ScramSha256, "pencil"));
        assert_ne!(random_bytes(32), random_bytes(32));
        let nonce = random_nonce();
        assert!(printable(&nonce) && nonce.len() >= 16);
    }
}
