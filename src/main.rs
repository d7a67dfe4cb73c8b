//! `sluice`: the broker binary and admin CLI.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sluice", version, about = "Kafka-compatible thread-per-core log broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker.
    Serve,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve => {
            eprintln!("sluice serve: the Kafka API layer is not built yet (issue 3)");
            std::process::exit(2);
        }
    }
}
