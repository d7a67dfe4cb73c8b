//! `sluice-sim`: runs the deterministic replication simulation over many seeds.
//!
//! ```text
//! sluice-sim --seeds N [--start S] [--steps K] [--brokers B] [--partitions P]
//! sluice-sim --seed S [-v] [--steps K] ...          replay one seed (with a trace)
//!            [--break-kip497] [--break-truncation] [--break-fsync] [--break-reopen] [--break-tail-sync] [--break-fence]
//!                                      deliberate bugs, to see the invariants catch them
//! ```
//! Prints a summary; on a violation prints the failing seed and exits 1.

use std::process::ExitCode;
use std::time::Instant;

use sluice_replication::sim::{self, Config, Stats};

fn usage() -> ExitCode {
    eprintln!(
        "usage: sluice-sim (--seeds N [--start S] | --seed S [-v]) [--steps K] [--brokers 3..5] \
         [--partitions P] [--break-kip497] [--break-truncation] [--break-fsync] [--break-reopen] [--break-tail-sync] [--break-fence]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut cfg = Config::default();
    let (mut seeds, mut start, mut one, mut verbose) = (1000u64, 1u64, None, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Option<u64> {
            let v = args.next().and_then(|v| v.parse().ok());
            if v.is_none() {
                eprintln!("{name} needs a number");
            }
            v
        };
        match a.as_str() {
            "--seeds" => match num("--seeds") {
                Some(v) => seeds = v,
                None => return usage(),
            },
            "--start" => match num("--start") {
                Some(v) => start = v,
                None => return usage(),
            },
            "--seed" => match num("--seed") {
                Some(v) => one = Some(v),
                None => return usage(),
            },
            "--steps" => match num("--steps") {
                Some(v) => cfg.steps = v,
                None => return usage(),
            },
            "--brokers" => match num("--brokers") {
                Some(v @ 3..=5) => cfg.brokers = v as usize,
                _ => return usage(),
            },
            "--partitions" => match num("--partitions") {
                Some(v @ 1..=64) => cfg.partitions = v as usize,
                _ => return usage(),
            },
            "--break-kip497" => cfg.knobs.ignore_pending_isr = true,
            "--break-truncation" => cfg.knobs.skip_truncation = true,
            "--break-fsync" => cfg.knobs.fetch_unsynced = true,
            "--break-reopen" => cfg.knobs.reopen_in_same_epoch = true,
            "--break-tail-sync" => cfg.knobs.no_tail_sync = true,
            "--break-fence" => cfg.knobs.unfenced_leader_appends = true,
            "-v" | "--verbose" => verbose = true,
            _ => return usage(),
        }
    }
    // Release builds abort on panic: say which seed and step before dying.
    let replay_flags = flags(&cfg);
    std::panic::set_hook(Box::new(move |info| {
        let (seed, step) = sim::current_seed_and_step();
        println!("FAILED seed {seed} step {step}: {info}");
        println!("replay: sluice-sim --seed {seed} -v {replay_flags}");
    }));
    if let Some(seed) = one {
        cfg.trace = verbose;
        let mut trace = String::new();
        let r = sim::run(seed, &cfg, &mut trace);
        // Ignore a closed pipe (`| head`).
        let _ = std::io::Write::write_all(&mut std::io::stdout(), trace.as_bytes());
        return match r {
            Ok(s) => {
                summary(1, &s, 0.0);
                ExitCode::SUCCESS
            }
            Err(v) => {
                println!("FAILED {v}");
                println!("replay: sluice-sim --seed {seed} -v {}", flags(&cfg));
                ExitCode::from(1)
            }
        };
    }
    let t0 = Instant::now();
    let mut total = Stats::default();
    for seed in start..start + seeds {
        let mut trace = String::new();
        match sim::run(seed, &cfg, &mut trace) {
            Ok(s) => total.add(&s),
            Err(v) => {
                println!("FAILED {v}");
                println!("replay: sluice-sim --seed {seed} -v {}", flags(&cfg));
                return ExitCode::from(1);
            }
        }
    }
    summary(seeds, &total, t0.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn flags(cfg: &Config) -> String {
    let mut f = format!(
        "--steps {} --brokers {} --partitions {}",
        cfg.steps, cfg.brokers, cfg.partitions
    );
    if cfg.knobs.ignore_pending_isr {
        f.push_str(" --break-kip497");
    }
    if cfg.knobs.skip_truncation {
        f.push_str(" --break-truncation");
    }
    if cfg.knobs.fetch_unsynced {
        f.push_str(" --break-fsync");
    }
    if cfg.knobs.reopen_in_same_epoch {
        f.push_str(" --break-reopen");
    }
    if cfg.knobs.no_tail_sync {
        f.push_str(" --break-tail-sync");
    }
    if cfg.knobs.unfenced_leader_appends {
        f.push_str(" --break-fence");
    }
    f
}

fn summary(seeds: u64, s: &Stats, secs: f64) {
    println!(
        "seeds {seeds}  steps {}  produced {}  acked {}  refused {}  leader changes {}  crashes {}  \
         log failures {}  isolations {}  fenced {}  isr changes {} ({} batches)  truncated records {} (extra KIP-279 rounds {})  tail syncs {}  late appends {}",
        s.steps,
        s.produced,
        s.acked,
        s.refused,
        s.leader_changes,
        s.crashes,
        s.log_failures,
        s.isolations,
        s.fenced,
        s.isr_changes,
        s.alter_batches,
        s.truncated_records,
        s.truncation_extra_rounds,
        s.tail_syncs,
        s.late_appends
    );
    if secs > 0.0 {
        println!("{secs:.1} s, {:.0} seeds/s", seeds as f64 / secs);
    }
}
