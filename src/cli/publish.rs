//! `spate pub`: a plain blocking producer that sends files (or stdin) to a
//! spate listener and reports, per input line, what the server rejected.
//!
//! The input is sent unchanged in large writes (`--write-bytes`, 256 KiB), so
//! the same tool feeds the line, JSON and ILP listeners; `--format` only
//! picks the default address. A file whose last line has no LF gets one, so
//! the next file starts on a line of its own. `--stream S` sends
//! `#STREAM S` first. The connection ends with `#SYNC <token>`: the server
//! answers `OK <line> SYNC <token>` once every earlier event is stored.
//!
//! A reader thread reads the replies while the writer sends, so a server
//! that answers many rejected lines never blocks on a producer that is still
//! writing. The server numbers lines per connection (from 1, every LF-ended
//! line, control lines included); the client counts the lines it sends
//! (including the `#STREAM` line) and maps each `ERR <line> ...` back to its
//! input file and line, printed to stderr as `FILE:LINE: <reason>: <detail>`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Exit status: every line was stored and the final `#SYNC` acknowledged.
pub const EXIT_STORED: i32 = 0;
/// Exit status: the final `#SYNC` was acknowledged, but the server rejected
/// at least one line (each is printed on stderr); every other line is stored.
pub const EXIT_REJECTED: i32 = 1;
/// Exit status: bad command-line usage (clap's own status).
pub const EXIT_USAGE: i32 = 2;
/// Exit status: an input could not be read, the server could not be reached,
/// or the connection ended (or `--timeout-secs` passed) before the final
/// `#SYNC` was acknowledged: how much was stored is unknown.
pub const EXIT_FAILED: i32 = 3;

/// `spate pub --help` text for the exit statuses.
pub const EXIT_STATUS_HELP: &str = "Exit status:
  0  every line was stored: the final #SYNC was acknowledged and nothing was rejected
  1  the final #SYNC was acknowledged but the server rejected some lines (each printed
     on stderr as FILE:LINE: <reason>: <detail>); every other line is stored
  2  bad command-line usage
  3  an input could not be read, the server could not be reached, or the connection
     ended (or --timeout-secs passed) before the final #SYNC was acknowledged:
     how much was stored is unknown";

/// Which listener the input is for: picks the default server address.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `KEY PAYLOAD` lines (default address 127.0.0.1:9400).
    Lines,
    /// JSON lines (default address 127.0.0.1:9403).
    Json,
    /// InfluxDB line protocol (default address 127.0.0.1:9009).
    Ilp,
}

impl Format {
    /// The listener address a local server uses for this format.
    pub fn default_server(self) -> &'static str {
        match self {
            Format::Lines => "127.0.0.1:9400",
            Format::Json => "127.0.0.1:9403",
            Format::Ilp => "127.0.0.1:9009",
        }
    }
}

/// `spate pub` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct PubArgs {
    /// Server address; several, comma-separated (nodes of a cluster): the
    /// first that answers is used [default: by --format: lines
    /// 127.0.0.1:9400, json 127.0.0.1:9403, ilp 127.0.0.1:9009].
    #[arg(long)]
    pub server: Option<String>,
    /// Publish to this stream: sends `#STREAM <name>` before the input.
    #[arg(long)]
    pub stream: Option<String>,
    /// The input's format; lines are sent unchanged, this picks the default server.
    #[arg(long, value_enum, default_value_t = Format::Lines)]
    pub format: Format,
    /// Bytes per socket write (the input is read in chunks of this size).
    #[arg(long, default_value_t = 256 * 1024, value_parser = clap::value_parser!(u32).range(1..=(64 << 20)))]
    pub write_bytes: u32,
    /// Seconds to wait for the final #SYNC's acknowledgement after the last write.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
    /// Input files, sent in order; none (or `-`) reads stdin.
    pub files: Vec<PathBuf>,
}

/// What a successful run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PubReport {
    /// Lines sent, including the `#STREAM` and final `#SYNC` lines.
    pub line_count: u64,
    pub byte_count: u64,
    /// Lines the server answered with `ERR`.
    pub rejected_count: u64,
}

/// Why a run failed before the final `#SYNC` was acknowledged.
#[derive(Debug)]
pub enum PubError {
    Connect {
        server: String,
        error: std::io::Error,
    },
    ReadInput {
        name: String,
        error: std::io::Error,
    },
    Send {
        line_count: u64,
        error: std::io::Error,
    },
    /// The server closed the connection (or it failed) before acknowledging.
    ClosedBeforeSync {
        line_count: u64,
        detail: String,
    },
    Timeout {
        timeout_secs: u64,
    },
}

impl std::fmt::Display for PubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PubError::Connect { server, error } => write!(f, "connect {server}: {error}"),
            PubError::ReadInput { name, error } => write!(f, "read {name}: {error}"),
            PubError::Send { line_count, error } => {
                write!(f, "send failed after {line_count} lines: {error}; how much was stored is unknown")
            }
            PubError::ClosedBeforeSync { line_count, detail } => write!(
                f,
                "the server closed the connection before acknowledging the final #SYNC ({line_count} lines sent): {detail}"
            ),
            PubError::Timeout { timeout_secs } => {
                write!(
                    f,
                    "no acknowledgement of the final #SYNC within {timeout_secs} s; how much was stored is unknown"
                )
            }
        }
    }
}

impl std::error::Error for PubError {}

/// Runs `spate pub` and returns its exit status (see [`EXIT_STATUS_HELP`]).
pub fn run_pub(args: &PubArgs) -> i32 {
    let started = Instant::now();
    match publish(args) {
        Ok(report) => {
            eprintln!(
                "spate pub: {} lines ({} bytes) sent in {:.2} s, {} rejected, final #SYNC acknowledged",
                report.line_count,
                report.byte_count,
                started.elapsed().as_secs_f64(),
                report.rejected_count
            );
            if report.rejected_count == 0 { EXIT_STORED } else { EXIT_REJECTED }
        }
        Err(error) => {
            eprintln!("spate pub: {error}");
            EXIT_FAILED
        }
    }
}

/// Where each input starts in the connection's line numbering.
#[derive(Debug, Default)]
struct LineMap {
    /// `(first connection line, input name)`, in sending order.
    inputs: Vec<(u64, String)>,
    stream_line: Option<u64>,
}

impl LineMap {
    /// `FILE:LINE` for a connection line number.
    fn describe(&self, line_number: u64) -> String {
        if self.stream_line == Some(line_number) {
            return "#STREAM line".to_string();
        }
        let index = self.inputs.partition_point(|(first, _)| *first <= line_number);
        match index.checked_sub(1).map(|index| &self.inputs[index]) {
            Some((first, name)) => format!("{name}:{}", line_number - first + 1),
            None => format!("connection line {line_number}"),
        }
    }
}

/// Sends everything and waits for the final acknowledgement.
pub fn publish(args: &PubArgs) -> Result<PubReport, PubError> {
    let servers = args.server.clone().unwrap_or_else(|| args.format.default_server().to_string());
    let (stream, server) =
        crate::cli::connect_any(&servers).map_err(|(server, error)| PubError::Connect { server, error })?;
    let token = format!("spate-pub-{}-{}", std::process::id(), nanos_since_epoch());
    let line_map = Arc::new(Mutex::new(LineMap::default()));
    let (done_sender, done) = mpsc::channel();
    let reader_stream = stream.try_clone().map_err(|error| PubError::Connect { server, error })?;
    let reader = {
        let (line_map, token) = (line_map.clone(), token.clone());
        std::thread::spawn(move || {
            let outcome = read_replies(reader_stream, &line_map, &token);
            let _ = done_sender.send(outcome);
        })
    };
    let mut sender = Sender { stream, line_count: 0, byte_count: 0 };
    let sent = send_all(args, &mut sender, &line_map, &token);
    let reply = match sent {
        // The server may have closed first: its reason is in the replies.
        Err(PubError::Send { .. }) => done.recv_timeout(Duration::from_secs(5)).ok(),
        Err(error) => return Err(error),
        Ok(()) => done.recv_timeout(Duration::from_secs(args.timeout_secs)).ok(),
    };
    let report_line_count = sender.line_count;
    let _ = sender.stream.shutdown(Shutdown::Both);
    let _ = reader.join();
    match (sent, reply) {
        (Ok(()), Some(Ok(rejected_count))) => {
            Ok(PubReport { line_count: report_line_count, byte_count: sender.byte_count, rejected_count })
        }
        (_, Some(Err(detail))) => Err(PubError::ClosedBeforeSync { line_count: report_line_count, detail }),
        (Err(error), _) => Err(error),
        (Ok(()), None) => Err(PubError::Timeout { timeout_secs: args.timeout_secs }),
    }
}

fn nanos_since_epoch() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos())
}

/// The socket and what was written to it.
struct Sender {
    stream: TcpStream,
    line_count: u64,
    byte_count: u64,
}

impl Sender {
    fn send(&mut self, bytes: &[u8]) -> Result<(), PubError> {
        self.stream.write_all(bytes).map_err(|error| PubError::Send { line_count: self.line_count, error })?;
        self.line_count += memchr::memchr_iter(b'\n', bytes).count() as u64;
        self.byte_count += bytes.len() as u64;
        Ok(())
    }
}

/// Writes `#STREAM`, every input, then the final `#SYNC`.
fn send_all(args: &PubArgs, sender: &mut Sender, line_map: &Mutex<LineMap>, token: &str) -> Result<(), PubError> {
    if let Some(name) = &args.stream {
        line_map.lock().expect("line map lock").stream_line = Some(sender.line_count + 1);
        sender.send(format!("#STREAM {name}\n").as_bytes())?;
    }
    let mut buffer = vec![0u8; args.write_bytes as usize];
    let stdin_only = [PathBuf::from("-")];
    let files = if args.files.is_empty() { &stdin_only[..] } else { &args.files[..] };
    for path in files {
        let name = if path.as_os_str() == "-" { "<stdin>".to_string() } else { path.display().to_string() };
        let mut input: Box<dyn Read> = if path.as_os_str() == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            let file = std::fs::File::open(path).map_err(|error| PubError::ReadInput { name: name.clone(), error })?;
            Box::new(file)
        };
        line_map.lock().expect("line map lock").inputs.push((sender.line_count + 1, name.clone()));
        send_input(&mut input, &name, &mut buffer, sender)?;
    }
    sender.send(format!("#SYNC {token}\n").as_bytes())
}

/// Copies one input in full-buffer writes; adds an LF if its last line has none.
fn send_input(input: &mut dyn Read, name: &str, buffer: &mut [u8], sender: &mut Sender) -> Result<(), PubError> {
    let mut last_byte = b'\n';
    loop {
        let filled = fill(input, buffer).map_err(|error| PubError::ReadInput { name: name.to_string(), error })?;
        if filled == 0 {
            break;
        }
        sender.send(&buffer[..filled])?;
        last_byte = buffer[filled - 1];
        if filled < buffer.len() {
            break;
        }
    }
    if last_byte != b'\n' {
        sender.send(b"\n")?;
    }
    Ok(())
}

/// Reads until `buffer` is full or the input ends; returns the bytes read.
fn fill(input: &mut dyn Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match input.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// Reads replies until `OK <n> SYNC <token>`: prints every `ERR` with its
/// input position and returns how many there were, or why the connection
/// ended first.
fn read_replies(stream: TcpStream, line_map: &Mutex<LineMap>, token: &str) -> Result<u64, String> {
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut reply = Vec::new();
    let mut rejected_count = 0u64;
    let mut last_error = String::from("no reply");
    loop {
        reply.clear();
        match reader.read_until(b'\n', &mut reply) {
            Ok(0) => return Err(last_error),
            Ok(_) => {}
            Err(error) => return Err(format!("reading replies: {error}")),
        }
        let text = String::from_utf8_lossy(&reply);
        let text = text.trim_end_matches(['\n', '\r']);
        let mut words = text.splitn(3, ' ');
        let (kind, number, rest) = (words.next(), words.next(), words.next().unwrap_or(""));
        let line_number = number.and_then(|number| number.parse::<u64>().ok());
        match (kind, line_number) {
            (Some("OK"), Some(_)) if rest.strip_prefix("SYNC ") == Some(token) => return Ok(rejected_count),
            (Some("ERR"), Some(0)) => {
                eprintln!("spate pub: server: {rest}");
                last_error = rest.to_string();
            }
            (Some("ERR"), Some(line_number)) => {
                rejected_count += 1;
                let position = line_map.lock().expect("line map lock").describe(line_number);
                eprintln!("spate pub: {position}: {rest}");
                last_error = format!("{position}: {rest}");
            }
            // Replies to the input's own #SYNC/#PING lines.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connection line numbers map back to the input and its own line,
    /// counting the #STREAM line.
    #[test]
    fn line_numbers_map_back_to_inputs() {
        let map = LineMap { inputs: vec![(2, "a.txt".into()), (5, "b.txt".into())], stream_line: Some(1) };
        assert_eq!(map.describe(1), "#STREAM line");
        assert_eq!(map.describe(2), "a.txt:1");
        assert_eq!(map.describe(4), "a.txt:3");
        assert_eq!(map.describe(5), "b.txt:1");
        assert_eq!(map.describe(900), "b.txt:896");
        let empty = LineMap::default();
        assert_eq!(empty.describe(3), "connection line 3");
    }

    /// Inputs are sent in full buffers, and a missing final LF is added.
    #[test]
    fn inputs_are_sent_whole_with_a_final_newline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let receiver = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut received = Vec::new();
            socket.read_to_end(&mut received).unwrap();
            received
        });
        let mut sender = Sender { stream: TcpStream::connect(address).unwrap(), line_count: 0, byte_count: 0 };
        let mut buffer = vec![0u8; 4];
        send_input(&mut &b"k1 a\nk2 b"[..], "x", &mut buffer, &mut sender).unwrap();
        send_input(&mut &b"k3\n"[..], "y", &mut buffer, &mut sender).unwrap();
        assert_eq!((sender.line_count, sender.byte_count), (3, 13));
        drop(sender);
        assert_eq!(receiver.join().unwrap(), b"k1 a\nk2 b\nk3\n");
    }
}
