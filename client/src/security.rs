//! A Kafka client properties file (the admin CLIs' and the load generator's
//! `--command-config`, as Kafka's own tools take one): the connection's security, with
//! librdkafka's and the Java client's names.

use std::path::Path;

use crate::sasl::{Credentials, Mechanism};
use crate::tls::{client_config, file_err, TlsError};

/// The keys [`apply_command_config`] knows.
const KNOWN: &str = "security.protocol, ssl.ca.location, ssl.certificate.location, ssl.key.location, sasl.mechanism (or sasl.mechanisms), sasl.username, sasl.password, sasl.jaas.config";

/// Reads `path` and makes this process's broker connections secure as it says:
/// `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL); for SSL and
/// SASL_SSL `ssl.ca.location` (needed), `ssl.certificate.location` and
/// `ssl.key.location`; for SASL `sasl.mechanism` (PLAIN, SCRAM-SHA-256 or
/// SCRAM-SHA-512; librdkafka's `sasl.mechanisms` too) and the user, as
/// `sasl.username` and `sasl.password` or as a Java client's `sasl.jaas.config`
/// (`… required username="…" password="…";`). `#` and `!` start comments. A key it
/// does not know is refused by name, so a setting meant to secure the connection is
/// never ignored.
pub fn apply_command_config(path: &Path) -> Result<(), TlsError> {
    let text = std::fs::read_to_string(path).map_err(|e| file_err(path, e))?;
    let mut protocol = String::from("PLAINTEXT");
    let (mut ca, mut cert, mut key) = (None, None, None);
    let (mut mechanism, mut user, mut password) = (None, None, None);
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        // The line itself is not echoed: it may hold a password.
        let Some((k, v)) = line.split_once('=').or_else(|| line.split_once(':')) else {
            return Err(file_err(
                path,
                format!("line {}: not a key=value line", n + 1),
            ));
        };
        let (k, v) = (k.trim(), v.trim().to_string());
        match k {
            "security.protocol" => protocol = v.to_ascii_uppercase(),
            "ssl.ca.location" => ca = Some(v),
            "ssl.certificate.location" => cert = Some(v),
            "ssl.key.location" => key = Some(v),
            "sasl.mechanism" | "sasl.mechanisms" => mechanism = Some(v),
            "sasl.username" => user = Some(v),
            "sasl.password" => password = Some(v),
            "sasl.jaas.config" => {
                user =
                    Some(jaas_option(&v, "username").ok_or_else(|| {
                        file_err(path, "sasl.jaas.config without username=\"…\"")
                    })?);
                password =
                    Some(jaas_option(&v, "password").ok_or_else(|| {
                        file_err(path, "sasl.jaas.config without password=\"…\"")
                    })?);
            }
            other => {
                return Err(file_err(
                    path,
                    format!("unknown key {other} (known: {KNOWN})"),
                ))
            }
        }
    }
    let (tls, sasl) = match protocol.as_str() {
        "PLAINTEXT" => (false, false),
        "SSL" => (true, false),
        "SASL_PLAINTEXT" => (false, true),
        "SASL_SSL" => (true, true),
        other => {
            return Err(file_err(
                path,
                format!("security.protocol {other}: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
            ))
        }
    };
    if tls {
        let ca = ca.ok_or_else(|| {
            file_err(
                path,
                format!("security.protocol={protocol} needs ssl.ca.location"),
            )
        })?;
        let identity = match (&cert, &key) {
            (Some(c), Some(k)) => Some((Path::new(c), Path::new(k))),
            (None, None) => None,
            _ => {
                return Err(file_err(
                    path,
                    "ssl.certificate.location and ssl.key.location go together",
                ))
            }
        };
        crate::tls::set_peer_tls(client_config(Path::new(&ca), identity)?);
    }
    if sasl {
        // No default: librdkafka's and Java's (GSSAPI) is not built, and guessing PLAIN
        // would send the password itself to a SASL_PLAINTEXT listener.
        let name = mechanism.ok_or_else(|| {
            file_err(
                path,
                format!("security.protocol={protocol} needs sasl.mechanism (SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN)"),
            )
        })?;
        let mechanism = Mechanism::parse(&name.to_ascii_uppercase()).ok_or_else(|| {
            file_err(
                path,
                format!("sasl.mechanism {name}: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
            )
        })?;
        let (Some(user), Some(password)) = (user, password) else {
            return Err(file_err(
                path,
                format!("security.protocol={protocol} needs sasl.username and sasl.password"),
            ));
        };
        crate::sasl::set_peer_sasl(Credentials {
            mechanism,
            user,
            password,
        });
    }
    Ok(())
}

/// The value of `name="…"` in a JAAS login module line.
fn jaas_option(config: &str, name: &str) -> Option<String> {
    let start = config.find(&format!("{name}=\""))? + name.len() + 2;
    let end = start + config[start..].find('"')?;
    Some(config[start..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jaas_lines_give_their_user_and_password() {
        let line = r#"org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="s3cr=t";"#;
        assert_eq!(jaas_option(line, "username").as_deref(), Some("alice"));
        assert_eq!(jaas_option(line, "password").as_deref(), Some("s3cr=t"));
        assert_eq!(jaas_option(line, "token"), None);
    }
}
