//! Log levels changed while the broker runs: Kafka's BROKER_LOGGER config resource
//! (type 8), which `kafka-configs.sh --entity-type broker-loggers` describes and
//! alters through DescribeConfigs and IncrementalAlterConfigs.
//!
//! A logger is `root` (the level of every target no other directive names) or a
//! tracing target: one of the crates the broker logs from ([`CRATES`]) or a module
//! path under one (`sluice::cluster::fetcher`). The process's filter is the directives it
//! started with (`RUST_LOG`, default `info`) with the levels set here laid over them;
//! it is swapped in place (tracing-subscriber's reload layer), so every shard's next
//! event sees it. As in Kafka, the levels are this process's only: not persisted, not
//! shared with other brokers, gone at a restart.
//!
//! Levels are log4j's names, as Kafka's tools send them: ALL, TRACE, DEBUG, INFO, WARN,
//! ERROR, FATAL (ERROR here) and OFF. SET gives a logger a level; DELETE removes what
//! SET gave it (the start-up directives apply again; root's cannot be removed, as in
//! Kafka); APPEND and SUBTRACT are refused.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use kafka_protocol::error::ResponseError;
use sluice_protocol::ApiError;
use tracing_subscriber::{reload, EnvFilter, Registry};

use crate::base::rpc::{AlterConfigOp, ConfigOp};

pub const ROOT: &str = "root";

/// The crates the broker's events come from: the loggers listed beside root.
pub const CRATES: &[&str] = &[
    "glommio",
    "sluice",
    "sluice_coordinator",
    "sluice_protocol",
    "sluice_replication",
    "sluice_shard",
    "sluice_storage",
];

/// A logger's level, as [`Levels`] keeps it (tracing's names; `off` included).
type Level = &'static str;

/// The start-up directives and the levels set since, from which the filter is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Levels {
    /// The start-up default (a bare level directive), if any.
    root: Option<Level>,
    /// The start-up `target=level` directives.
    targets: BTreeMap<String, Level>,
    /// Start-up directives kept as written (span or field filters).
    other: Vec<String>,
    /// Set here: root's level, and per logger.
    set_root: Option<Level>,
    set: BTreeMap<String, Level>,
}

/// A log4j level name (as Kafka's tools send it) as tracing's.
fn level(log4j: &str) -> Option<Level> {
    Some(match log4j.to_ascii_uppercase().as_str() {
        "ALL" | "TRACE" => "trace",
        "DEBUG" => "debug",
        "INFO" => "info",
        "WARN" => "warn",
        "ERROR" | "FATAL" => "error",
        "OFF" => "off",
        _ => return None,
    })
}

fn invalid_config(message: String) -> ApiError {
    ApiError::with(ResponseError::InvalidConfig, message)
}

impl Levels {
    /// Reads start-up directives (`RUST_LOG`'s comma-separated form).
    pub fn parse(directives: &str) -> Levels {
        let mut l = Levels {
            root: None,
            targets: BTreeMap::new(),
            other: Vec::new(),
            set_root: None,
            set: BTreeMap::new(),
        };
        for d in directives
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
        {
            match d.split_once('=') {
                None if level(d).is_some() => l.root = level(d),
                Some((target, lvl)) if !target.contains(['[', '{']) && level(lvl).is_some() => {
                    l.targets
                        .insert(target.to_string(), level(lvl).expect("checked"));
                }
                _ => l.other.push(d.to_string()),
            }
        }
        l
    }

    /// The filter directives: the start-up ones with the levels set here over them.
    pub fn directives(&self) -> String {
        let mut targets = self.targets.clone();
        targets.extend(self.set.iter().map(|(t, l)| (t.clone(), *l)));
        let root = self.set_root.or(self.root);
        root.map(str::to_string)
            .into_iter()
            .chain(targets.iter().map(|(t, l)| format!("{t}={l}")))
            .chain(self.other.iter().cloned())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// root's level (OFF when the start-up directives gave no default, as tracing's
    /// filter then logs nothing else).
    fn root_level(&self) -> Level {
        self.set_root.or(self.root).unwrap_or("off")
    }

    /// A logger's effective level: the most specific directive naming it or a module
    /// path above it, else root's.
    fn effective(&self, logger: &str) -> Level {
        let names = |t: &str| logger == t || logger.starts_with(&format!("{t}::"));
        let best = |m: &BTreeMap<String, Level>| {
            m.iter()
                .filter(|(t, _)| names(t))
                .max_by_key(|(t, _)| t.len())
                .map(|(t, l)| (t.len(), *l))
        };
        match (best(&self.set), best(&self.targets)) {
            (Some(s), Some(t)) => Some(if s.0 >= t.0 { s.1 } else { t.1 }),
            (s, t) => s.or(t).map(|(_, l)| l),
        }
        .unwrap_or_else(|| self.root_level())
    }

    /// Every logger with its level, log4j's names: root, the crates, and the targets
    /// the directives name.
    pub fn describe(&self) -> Vec<(String, String)> {
        let mut names: Vec<String> = CRATES.iter().map(|c| c.to_string()).collect();
        names.extend(self.targets.keys().cloned());
        names.extend(self.set.keys().cloned());
        names.sort();
        names.dedup();
        std::iter::once((ROOT.to_string(), self.root_level()))
            .chain(names.into_iter().map(|n| {
                let l = self.effective(&n);
                (n, l)
            }))
            .map(|(n, l)| (n, l.to_ascii_uppercase()))
            .collect()
    }

    /// Applies IncrementalAlterConfigs operations (name, operation, value), all or
    /// none: the first that cannot be applied refuses the lot.
    pub fn alter(&mut self, ops: &[ConfigOp]) -> Result<(), ApiError> {
        let mut next = self.clone();
        for ConfigOp {
            name: logger,
            op,
            value,
        } in ops
        {
            let known = logger == ROOT
                || CRATES
                    .iter()
                    .any(|c| logger == c || logger.starts_with(&format!("{c}::")))
                || self.targets.contains_key(logger);
            if !known {
                return Err(invalid_config(format!("Logger {logger} does not exist!")));
            }
            match *op {
                AlterConfigOp::Set => {
                    let value = value.as_deref().unwrap_or_default();
                    let l = level(value).ok_or_else(|| {
                        invalid_config(format!(
                            "Cannot set the log level of {logger} to {value} as it is not a supported log level. Valid log4j levels are ALL, TRACE, DEBUG, INFO, WARN, ERROR, FATAL, OFF"
                        ))
                    })?;
                    if logger == ROOT {
                        next.set_root = Some(l);
                    } else {
                        next.set.insert(logger.clone(), l);
                    }
                }
                AlterConfigOp::Delete if logger == ROOT => {
                    return Err(invalid_config(
                        "Removing the log level of the root logger is not allowed".into(),
                    ))
                }
                AlterConfigOp::Delete => {
                    next.set.remove(logger);
                }
                AlterConfigOp::Append | AlterConfigOp::Subtract => {
                    return Err(not_for_loggers(&format!("{op:?}").to_uppercase()))
                }
            }
        }
        *self = next;
        Ok(())
    }
}

/// The process's levels and the handle that swaps its filter.
struct Installed {
    levels: Mutex<Levels>,
    handle: reload::Handle<EnvFilter, Registry>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// The filter layer for the process's subscriber, from start-up `directives`; its
/// levels can then be described and altered here. Called once, at start.
pub fn install(directives: &str) -> reload::Layer<EnvFilter, Registry> {
    let (layer, handle) = reload::Layer::new(EnvFilter::new(directives));
    let installed = Installed {
        levels: Mutex::new(Levels::parse(directives)),
        handle,
    };
    assert!(
        INSTALLED.set(installed).is_ok(),
        "the log filter is installed once"
    );
    layer
}

fn installed() -> Result<&'static Installed, ApiError> {
    INSTALLED.get().ok_or_else(|| {
        ApiError::with(
            ResponseError::InvalidRequest,
            "this process's log levels cannot be changed",
        )
    })
}

/// Every logger with its level (log4j's names).
pub fn describe() -> Result<Vec<(String, String)>, ApiError> {
    let i = installed()?;
    let levels = i.levels.lock().unwrap_or_else(|p| p.into_inner());
    Ok(levels.describe())
}

/// Applies `ops`, all or none; `validate_only` checks them and changes nothing.
/// The refusal of an operation BROKER_LOGGER resources do not take (APPEND, SUBTRACT,
/// or a code Kafka does not define), named as the request named it.
pub fn not_for_loggers(op: &str) -> ApiError {
    ApiError::with(
        ResponseError::InvalidRequest,
        format!("Operation {op} is not allowed for the BROKER_LOGGER resource"),
    )
}

pub fn alter(ops: &[ConfigOp], validate_only: bool) -> Result<(), ApiError> {
    let i = installed()?;
    let mut levels = i.levels.lock().unwrap_or_else(|p| p.into_inner());
    let mut next = levels.clone();
    next.alter(ops)?;
    if validate_only {
        return Ok(());
    }
    let filter = EnvFilter::try_new(next.directives())
        .map_err(|e| invalid_config(format!("the new log filter does not parse: {e}")))?;
    i.handle
        .reload(filter)
        .map_err(|e| invalid_config(format!("the log filter was not replaced: {e}")))?;
    *levels = next;
    tracing::info!(filter = %levels.directives(), "log levels changed (BROKER_LOGGER)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(logger: &str, value: &str) -> ConfigOp {
        ConfigOp::new(logger, AlterConfigOp::Set, Some(value))
    }

    fn level_of(l: &Levels, logger: &str) -> String {
        l.describe()
            .into_iter()
            .find(|(n, _)| n == logger)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    #[test]
    fn levels_set_over_the_start_up_directives_and_removed_again() {
        let mut l = Levels::parse("info,sluice_storage=debug,sluice[conn]=trace");
        assert_eq!(level_of(&l, ROOT), "INFO");
        assert_eq!(level_of(&l, "sluice_storage"), "DEBUG");
        assert_eq!(level_of(&l, "sluice"), "INFO");
        l.alter(&[set("sluice::serve::server", "debug"), set(ROOT, "WARN")])
            .unwrap();
        assert_eq!(
            l.directives(),
            "warn,sluice::serve::server=debug,sluice_storage=debug,sluice[conn]=trace"
        );
        assert_eq!(level_of(&l, "sluice::serve::server"), "DEBUG");
        assert_eq!(level_of(&l, "sluice"), "WARN");
        assert!(EnvFilter::try_new(l.directives()).is_ok());
        // A set level beats the start-up one for the same target; DELETE restores it.
        l.alter(&[set("sluice_storage", "FATAL")]).unwrap();
        assert_eq!(level_of(&l, "sluice_storage"), "ERROR");
        l.alter(&[ConfigOp::new("sluice_storage", AlterConfigOp::Delete, None)])
            .unwrap();
        assert_eq!(level_of(&l, "sluice_storage"), "DEBUG");
    }

    #[test]
    fn unknown_loggers_bad_levels_root_removal_and_appends_are_refused_whole() {
        let mut l = Levels::parse("info");
        let before = l.clone();
        let code = |r: Result<(), ApiError>| r.unwrap_err().code;
        assert_eq!(
            code(l.alter(&[set("sluice", "DEBUG"), set("kafka.server", "DEBUG")])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(l.alter(&[set("sluice", "LOUD")])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(l.alter(&[ConfigOp::new(ROOT, AlterConfigOp::Delete, None)])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            code(l.alter(&[ConfigOp::new(
                "sluice",
                AlterConfigOp::Append,
                Some("DEBUG")
            )])),
            ResponseError::InvalidRequest
        );
        assert_eq!(l, before, "nothing of a refused request is applied");
        // No default among the start-up directives: root is OFF, as the filter is.
        assert_eq!(level_of(&Levels::parse("sluice=debug"), ROOT), "OFF");
    }
}
