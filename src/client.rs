//! `spate sub`: a plain blocking client that prints a subscription.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

/// `spate sub` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SubArgs {
    /// Subscribe address of the server.
    #[arg(long, default_value = "127.0.0.1:9401")]
    pub server: String,
    /// Partition number, or `*` for all.
    #[arg(long, default_value = "*")]
    pub partition: String,
    /// Start offset: a number, `earliest` or `latest`.
    #[arg(long, default_value = "earliest")]
    pub from: String,
    /// Stop after printing this many event lines.
    #[arg(long)]
    pub count: Option<u64>,
}

/// Connects, subscribes and copies event lines to stdout. `ERR` from the
/// server becomes an error; `TRUNCATED` notices go to stderr.
pub fn run_sub(args: &SubArgs) -> Result<(), String> {
    let mut stream = TcpStream::connect(&args.server).map_err(|error| format!("connect {}: {error}", args.server))?;
    writeln!(stream, "SUB {} {}", args.partition, args.from).map_err(|error| format!("send SUB: {error}"))?;
    let reader = BufReader::with_capacity(1 << 20, stream);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    for line in reader.split(b'\n') {
        let line = line.map_err(|error| format!("read: {error}"))?;
        if line.starts_with(b"ERR ") {
            return Err(String::from_utf8_lossy(&line).into_owned());
        }
        if line.starts_with(b"TRUNCATED ") {
            eprintln!("spate sub: {}", String::from_utf8_lossy(&line));
            continue;
        }
        out.write_all(&line).and_then(|()| out.write_all(b"\n")).map_err(|error| format!("stdout: {error}"))?;
        printed += 1;
        if args.count.is_some_and(|count| printed >= count) {
            break;
        }
    }
    out.flush().map_err(|error| format!("stdout: {error}"))
}
