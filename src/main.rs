//! The `spate` command: parses flags and starts things, nothing else.

use clap::{Parser, Subcommand};

/// mimalloc for the whole process: why, what it measured, and how freed
/// memory goes back to the kernel are in `spate::runtime::memory`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// spate: a thread-per-core event stream engine.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run a server: ingest on 9400, subscribe on 9401, admin HTTP on 127.0.0.1:9402.
    #[command(after_help = spate::config::memory_formula_text())]
    Serve(spate::Config),
    /// Subscribe and print `<partition> <offset> <key> <payload>` lines.
    Sub(spate::cli::sub::SubArgs),
    /// Publish files (or stdin) to a listener, end with #SYNC, and report
    /// each rejected line as FILE:LINE on stderr.
    #[command(after_help = spate::cli::publish::EXIT_STATUS_HELP)]
    Pub(spate::cli::publish::PubArgs),
    /// Create, list or delete named streams (through the admin port).
    Stream(spate::cli::stream::StreamArgs),
    /// Declare, list, delete and query keyed aggregates (through the admin port).
    Aggregate(spate::cli::aggregate::AggregateArgs),
    /// Run the deterministic balancer simulator (same stealing rule as the
    /// server, simulated clock, seeded randomness; the seed is printed), or
    /// with --nodes the cluster replication simulator.
    Simulate(SimulateArgs),
    /// Load generator: drive a server (or start one) and report events/s,
    /// latency percentiles and per-shard balance.
    Bench(spate::bench::BenchArgs),
}

/// The balancer simulator's flags, and the cluster simulator's with `--nodes`.
#[derive(clap::Args)]
struct SimulateArgs {
    #[command(flatten)]
    balance: spate::balance::sim::SimArgs,
    #[command(flatten)]
    cluster: spate::replication::sim::ClusterSimArgs,
}

fn simulate(args: &SimulateArgs) -> Result<(), String> {
    match args.cluster.nodes {
        Some(nodes) => {
            spate::replication::sim::try_run(nodes, &args.cluster, args.balance.seed, args.balance.partitions)
                .map(|report| println!("{report}"))
                .map_err(|error| error.to_string())
        }
        None => spate::balance::sim::try_run(&args.balance)
            .map(|report| println!("{report}"))
            .map_err(|error| error.to_string()),
    }
}

fn main() {
    spate::runtime::memory::configure();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(config) => spate::serve(config).map_err(|error| error.to_string()),
        Command::Sub(args) => spate::cli::sub::run_sub(&args).map_err(|error| error.to_string()),
        Command::Pub(args) => std::process::exit(spate::cli::publish::run_pub(&args)),
        Command::Stream(args) => spate::cli::stream::run_stream(&args),
        Command::Aggregate(args) => spate::cli::aggregate::run_aggregate(&args),
        Command::Bench(args) => spate::bench::run(&args).map(drop).map_err(|error| error.to_string()),
        Command::Simulate(args) => simulate(&args),
    };
    if let Err(error) = result {
        eprintln!("spate: {error}");
        std::process::exit(1);
    }
}
