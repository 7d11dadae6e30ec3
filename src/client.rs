//! `spate sub`: a plain blocking client that prints a subscription.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use crate::protocol::{SubscriberLine, parse_subscriber_line};

/// `spate sub` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SubArgs {
    /// Subscribe address of the server.
    #[arg(long, default_value = "127.0.0.1:9401")]
    pub server: String,
    /// Stream to read.
    #[arg(long, default_value = "default")]
    pub stream: String,
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

/// Why `spate sub` stopped with an error.
#[derive(Debug)]
pub enum SubError {
    Connect {
        server: String,
        error: std::io::Error,
    },
    Send(std::io::Error),
    Read(std::io::Error),
    /// The server answered `ERR ...`.
    Server(String),
    Stdout(std::io::Error),
}

impl std::fmt::Display for SubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubError::Connect { server, error } => write!(f, "connect {server}: {error}"),
            SubError::Send(error) => write!(f, "send SUB: {error}"),
            SubError::Read(error) => write!(f, "read: {error}"),
            SubError::Server(text) => write!(f, "server: ERR {text}"),
            SubError::Stdout(error) => write!(f, "stdout: {error}"),
        }
    }
}

impl std::error::Error for SubError {}

/// Connects, subscribes and copies event lines to stdout. `ERR` from the
/// server becomes an error; `TRUNCATED` notices and the shutdown's `CLOSING`
/// notice (where each partition stands) go to stderr.
pub fn run_sub(args: &SubArgs) -> Result<(), SubError> {
    let mut stream =
        TcpStream::connect(&args.server).map_err(|error| SubError::Connect { server: args.server.clone(), error })?;
    writeln!(stream, "SUB {} {} {}", args.stream, args.partition, args.from).map_err(SubError::Send)?;
    let reader = BufReader::with_capacity(1 << 20, stream);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    for line in reader.split(b'\n') {
        let line = line.map_err(SubError::Read)?;
        match parse_subscriber_line(&line) {
            Ok(SubscriberLine::Error { .. } | SubscriberLine::OffsetOutOfRange { .. }) => {
                let text = line.strip_prefix(b"ERR ").unwrap_or(&line);
                return Err(SubError::Server(String::from_utf8_lossy(text).into()));
            }
            Ok(SubscriberLine::Closing { .. }) => {
                // The server is stopping: say where to resume, and stop.
                eprintln!("spate sub: {}", String::from_utf8_lossy(&line));
                break;
            }
            Ok(SubscriberLine::Truncated { .. }) | Err(_) => {
                eprintln!("spate sub: {}", String::from_utf8_lossy(&line));
                continue;
            }
            Ok(SubscriberLine::Event { .. }) => {}
        }
        out.write_all(&line).and_then(|()| out.write_all(b"\n")).map_err(SubError::Stdout)?;
        printed += 1;
        if args.count.is_some_and(|count| printed >= count) {
            break;
        }
    }
    out.flush().map_err(SubError::Stdout)
}
