//! `spate sub`: a plain blocking client that prints a subscription.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

use crate::protocol::{SubscriberLine, parse_subscriber_line};

/// `spate sub` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SubArgs {
    /// Subscribe address of the server; several, comma-separated (nodes of
    /// a cluster): the first that answers is used.
    #[arg(long, default_value = "127.0.0.1:9401")]
    pub server: String,
    /// Stream to read.
    #[arg(long, default_value = "default")]
    pub stream: String,
    /// Partition number, or `*` for all.
    #[arg(long, default_value = "*")]
    pub partition: String,
    /// Start offset: a number, `earliest` or `latest` [default: earliest].
    /// With --group: where the group starts in a partition it never
    /// committed, `earliest` or `latest` [default: latest, as Kafka].
    #[arg(long)]
    pub from: Option<String>,
    /// Join this consumer group instead of reading partitions directly:
    /// print what the group assigns to this member and commit what was
    /// printed (after each burst of lines, once stdout has them).
    #[arg(long)]
    pub group: Option<String>,
    /// With --group: a `hold` group (its lag pauses the producers).
    #[arg(long, requires = "group")]
    pub hold: bool,
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
    let (mut stream, _) =
        crate::cli::connect_any(&args.server).map_err(|(server, error)| SubError::Connect { server, error })?;
    if let Some(group) = &args.group {
        return run_member(args, stream, group);
    }
    let from = args.from.as_deref().unwrap_or("earliest");
    writeln!(stream, "SUB {} {} {from}", args.stream, args.partition).map_err(SubError::Send)?;
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

/// Commits, for every partition that moved since the last call, the offset
/// after the last event printed; with `leave`, leaves the group after them.
fn send_commits(
    commits: &mut TcpStream,
    progress: &mut std::collections::BTreeMap<u32, (u64, bool)>,
    leave: bool,
) -> Result<(), SubError> {
    let mut request = String::new();
    for (partition, (next, moved)) in progress.iter_mut().filter(|(_, (_, moved))| *moved) {
        request.push_str(&format!("COMMIT {partition} {next}\n"));
        *moved = false;
    }
    if leave {
        request.push_str("LEAVE\n");
    }
    if !request.is_empty() {
        commits.write_all(request.as_bytes()).map_err(SubError::Send)?;
    }
    Ok(())
}

/// `spate sub --group`: joins, prints events, commits what it printed.
fn run_member(args: &SubArgs, stream: TcpStream, group: &str) -> Result<(), SubError> {
    use crate::protocol::group::{GroupLine, parse_group_line};
    let mut commits = stream.try_clone().map_err(SubError::Send)?;
    let from = args.from.as_deref().unwrap_or("latest");
    let hold = if args.hold { " hold" } else { "" };
    writeln!(commits, "GROUP {} {group} {from}{hold}", args.stream).map_err(SubError::Send)?;
    // A member that sends nothing for the session timeout is cut: ping while
    // idle (each write is one small line, so it never splits a commit).
    let mut pings = commits.try_clone().map_err(SubError::Send)?;
    std::thread::spawn(move || {
        while pings.write_all(b"PING\n").is_ok() {
            std::thread::sleep(std::time::Duration::from_secs(2));
        }
    });
    let mut reader = BufReader::with_capacity(1 << 20, stream);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    // Per partition: the next offset to commit, and whether it moved.
    let mut progress: std::collections::BTreeMap<u32, (u64, bool)> = std::collections::BTreeMap::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(SubError::Read)? == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        match parse_group_line(&line) {
            Ok(GroupLine::Subscriber(SubscriberLine::Event { partition, offset, .. })) => {
                out.write_all(&line).and_then(|()| out.write_all(b"\n")).map_err(SubError::Stdout)?;
                progress.insert(partition, (offset + 1, true));
                printed += 1;
            }
            Ok(GroupLine::Error { reason, .. }) if reason == b"not_assigned" || reason == b"offset_out_of_range" => {
                eprintln!("spate sub: {}", String::from_utf8_lossy(&line));
            }
            Ok(GroupLine::Error { .. }) => {
                let text = line.strip_prefix(b"ERR ").unwrap_or(&line);
                return Err(SubError::Server(String::from_utf8_lossy(text).into()));
            }
            Ok(GroupLine::CommitOk { .. }) => {}
            Ok(GroupLine::Revoked { partitions, .. }) => {
                for partition in partitions.iter() {
                    progress.remove(&partition);
                }
                eprintln!("spate sub: {}", String::from_utf8_lossy(&line));
            }
            _ => eprintln!("spate sub: {}", String::from_utf8_lossy(&line)),
        }
        let done = args.count.is_some_and(|count| printed >= count);
        if reader.buffer().is_empty() || done {
            // Commit only what stdout has.
            out.flush().map_err(SubError::Stdout)?;
            send_commits(&mut commits, &mut progress, done)?;
        }
        if done {
            // Read the answers to the commits until the server closes.
            while reader.read_until(b'\n', &mut line).map_err(SubError::Read)? > 0 {}
            break;
        }
    }
    out.flush().map_err(SubError::Stdout)
}
