//! `sluice-bench`: Sluice's load generator and benchmarks.
//!
//! `sluice-bench storage` measures the partition log against the machine's own disk
//! ceilings. (The Kafka-protocol load generator — produce, consume, e2e — comes with
//! the benchmark issue.)

mod storage_bench;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use glommio::{LocalExecutorBuilder, Placement};

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    version,
    about = "Sluice load generator and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmark the storage engine's append path beside raw O_DIRECT write and
    /// fdatasync ceilings measured in the same directory.
    Storage {
        /// Directory on the disk to measure (files are removed afterwards).
        #[arg(long, default_value = "./bench/results/storage-data")]
        dir: PathBuf,
        /// Seconds per scenario.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
        /// Concurrent appenders to the one partition (they share group commits).
        #[arg(long, default_value_t = 8)]
        appenders: usize,
        /// Where report.json goes.
        #[arg(long, default_value = "./bench/results")]
        report_dir: PathBuf,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    match Cli::parse().command {
        Command::Storage {
            dir,
            seconds,
            appenders,
            report_dir,
        } => {
            if appenders == 0 || seconds <= 0.0 {
                eprintln!("sluice-bench storage: --appenders and --seconds must be positive");
                std::process::exit(2);
            }
            let opts = storage_bench::Options {
                dir: dir.clone(),
                seconds,
                appenders,
            };
            let (rows, report) = LocalExecutorBuilder::new(Placement::Unbound)
                .io_memory(64 << 20)
                .name("bench-storage")
                .spawn(move || storage_bench::run(opts))
                .expect("executor")
                .join()
                .expect("benchmark thread");
            storage_bench::print_table(&rows);
            std::fs::create_dir_all(&report_dir).expect("report dir");
            let path = report_dir.join("storage-report.json");
            std::fs::write(&path, serde_json::to_string_pretty(&report).expect("json"))
                .expect("write report");
            let _ = std::fs::remove_dir_all(&dir);
            println!("report: {}", path.display());
        }
    }
}
