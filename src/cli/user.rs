//! `sluice user add|remove|list`: SASL/SCRAM users (what Kafka's
//! `kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[password=…]' --entity-type
//! users` and `rpk security user` do), against any Kafka-protocol broker:
//! AlterUserScramCredentials with a salted password made here (the password never
//! leaves this process), DescribeUserScramCredentials to list.

use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest,
};
use sluice_client::blocking::Conn;
use sluice_client::sasl::{self, Mechanism};
use sluice_client::{code_err, sbs};

const CLIENT_ID: &str = "sluice-cli";

/// Why a user command failed; the text is the message printed.
#[derive(Debug, thiserror::Error)]
pub enum UserCliError {
    #[error(transparent)]
    Client(#[from] sluice_client::Error),
    #[error("{0}")]
    Usage(String),
    #[error("reading the password: {0}")]
    Password(std::io::Error),
    #[error("{user}: {message}")]
    Refused { user: String, message: String },
}

pub type Res<T> = Result<T, UserCliError>;

/// The SCRAM mechanisms named (`SCRAM-SHA-256`, `SCRAM-SHA-512`); none: both.
pub fn mechanisms(names: &[String]) -> Res<Vec<Mechanism>> {
    if names.is_empty() {
        return Ok(vec![Mechanism::ScramSha256, Mechanism::ScramSha512]);
    }
    names
        .iter()
        .map(|n| {
            Mechanism::parse(&n.to_ascii_uppercase())
                .filter(|m| m.is_scram())
                .ok_or_else(|| {
                    UserCliError::Usage(format!("--mechanism {n}: SCRAM-SHA-256 or SCRAM-SHA-512"))
                })
        })
        .collect()
}

/// The password: `--password`, else the first line of standard input.
pub fn password(given: Option<String>) -> Res<String> {
    let p = match given {
        Some(p) => p,
        None => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .map_err(UserCliError::Password)?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    if p.is_empty() {
        return Err(UserCliError::Usage("an empty password".into()));
    }
    Ok(p)
}

/// Sends an AlterUserScramCredentials; the first user it refused is the error.
fn alter(c: &mut Conn, req: AlterUserScramCredentialsRequest) -> Res<()> {
    let r = c.call(0, &req)?;
    match r.results.into_iter().find(|x| x.error_code != 0) {
        None => Ok(()),
        Some(x) => Err(UserCliError::Refused {
            user: x.user.to_string(),
            message: x
                .error_message
                .map(|m| m.to_string())
                .unwrap_or_else(|| sluice_client::error_name(x.error_code)),
        }),
    }
}

/// Creates `user` or sets its password, for each mechanism.
pub fn add(
    bootstrap: &str,
    user: &str,
    password: &str,
    mechanisms: &[Mechanism],
    iterations: i32,
) -> Res<()> {
    if !(sasl::ITERATIONS_MIN..=sasl::ITERATIONS_MAX).contains(&iterations) {
        return Err(UserCliError::Usage(format!(
            "--iterations {iterations}: between {} and {}",
            sasl::ITERATIONS_MIN,
            sasl::ITERATIONS_MAX
        )));
    }
    let upsertions = mechanisms
        .iter()
        .map(|m| {
            let salt = sasl::random_bytes(32);
            let salted = sasl::salted_password(*m, password.as_bytes(), &salt, iterations);
            ScramCredentialUpsertion::default()
                .with_name(sbs(user))
                .with_mechanism(m.scram_type().expect("SCRAM mechanisms only"))
                .with_iterations(iterations)
                .with_salt(salt.into())
                .with_salted_password(salted.into())
        })
        .collect();
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    alter(
        &mut c,
        AlterUserScramCredentialsRequest::default().with_upsertions(upsertions),
    )?;
    let names: Vec<&str> = mechanisms.iter().map(|m| m.name()).collect();
    println!("user {user}: {} set", names.join(", "));
    Ok(())
}

/// Removes `user`'s credentials of the mechanisms named (none named: every one it has).
pub fn remove(bootstrap: &str, user: &str, named: &[String]) -> Res<()> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let mechanisms = if named.is_empty() {
        let has = described(&mut c, Some(user))?;
        has.into_iter()
            .flat_map(|(_, ms)| ms)
            .filter_map(|(m, _)| Mechanism::from_scram_type(m))
            .collect()
    } else {
        mechanisms(named)?
    };
    let deletions = mechanisms
        .iter()
        .map(|m| {
            ScramCredentialDeletion::default()
                .with_name(sbs(user))
                .with_mechanism(m.scram_type().expect("SCRAM mechanisms only"))
        })
        .collect();
    alter(
        &mut c,
        AlterUserScramCredentialsRequest::default().with_deletions(deletions),
    )?;
    println!("user {user}: removed");
    Ok(())
}

/// A user with its credentials' (mechanism code, iterations).
type Described = (String, Vec<(i8, i32)>);

/// Users with their credentials.
fn described(c: &mut Conn, user: Option<&str>) -> Res<Vec<Described>> {
    let users = user.map(|u| vec![UserName::default().with_name(sbs(u))]);
    let r = c.call(
        0,
        &DescribeUserScramCredentialsRequest::default().with_users(users),
    )?;
    code_err("DescribeUserScramCredentials", r.error_code)?;
    let mut out = Vec::new();
    for u in r.results {
        if u.error_code != 0 {
            return Err(UserCliError::Refused {
                user: u.user.to_string(),
                message: u
                    .error_message
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| sluice_client::error_name(u.error_code)),
            });
        }
        let infos = u
            .credential_infos
            .iter()
            .map(|i| (i.mechanism, i.iterations))
            .collect();
        out.push((u.user.to_string(), infos));
    }
    Ok(out)
}

/// Every user and its mechanisms, one line each.
pub fn list(bootstrap: &str) -> Res<()> {
    let mut c = Conn::open(bootstrap, CLIENT_ID)?;
    let users = described(&mut c, None)?;
    let width = users.iter().map(|(u, _)| u.len()).max().unwrap_or(4).max(4);
    println!("{:<width$}  MECHANISMS", "USER");
    for (user, infos) in users {
        let ms: Vec<String> = infos
            .iter()
            .map(|(m, i)| {
                let name = Mechanism::from_scram_type(*m).map_or("?", |m| m.name());
                format!("{name} ({i} iterations)")
            })
            .collect();
        println!("{user:<width$}  {}", ms.join(", "));
    }
    Ok(())
}
