//! `--start-server`: runs this same binary as `spate serve` on free loopback
//! ports, waits until `/stats` answers, and stops it with SIGTERM (the clean
//! two-phase shutdown) at the end. Dropping a [`ServerProcess`] that was not
//! stopped kills it, so a failed run never leaves a server behind. The
//! server's stderr goes to a file in the temp directory, removed after a
//! clean stop and kept (and shown) after a failure.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::bench::BenchError;
use crate::bench::stats::AdminClient;

/// How long a started server may take to answer `/stats`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it may take to stop after SIGTERM before it is killed.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of the server's log shown when it fails.
const LOG_TAIL_BYTES: usize = 4096;

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targets {
    pub ingest: String,
    pub subscribe: String,
    pub admin: String,
    /// The Kafka listener, when the server has one the bench knows of.
    pub kafka: Option<String>,
}

/// A running `spate serve` child.
pub struct ServerProcess {
    child: Option<Child>,
    /// A temporary data directory this process made (removed on drop).
    data_dir: Option<PathBuf>,
    pub targets: Targets,
    pub log_path: PathBuf,
    /// The exact command line, for the report.
    pub command_line: String,
}

/// `N` distinct free loopback ports. Every listener is held until all are
/// chosen: a port picked and released at once could be handed out again by
/// the next pick (a CI run got the same port for ingest and subscribe, and
/// the server's `SO_REUSEPORT` listeners shared it).
fn free_loopback_ports<const N: usize>() -> Result<[u16; N], BenchError> {
    let io_error = |source| BenchError::Io { what: "find a free loopback port", source };
    let listeners =
        (0..N).map(|_| TcpListener::bind("127.0.0.1:0").map_err(io_error)).collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr().map_err(io_error)?.port();
    }
    Ok(ports)
}

impl ServerProcess {
    /// Starts `<this binary> serve --shards <shards> --ingest ... <extra_args>`,
    /// with a Kafka listener on a free port if `kafka`.
    pub fn start(shard_count: usize, extra_args: &[String], kafka: bool) -> Result<ServerProcess, BenchError> {
        let program = std::env::current_exe().map_err(|source| BenchError::Io { what: "find own binary", source })?;
        let [ingest, subscribe, admin, kafka_port] = free_loopback_ports()?;
        let targets = Targets {
            ingest: format!("127.0.0.1:{ingest}"),
            subscribe: format!("127.0.0.1:{subscribe}"),
            admin: format!("127.0.0.1:{admin}"),
            kafka: kafka.then(|| format!("127.0.0.1:{kafka_port}")),
        };
        let mut args: Vec<String> = vec!["serve".into(), "--shards".into(), shard_count.to_string()];
        for (flag, addr) in
            [("--ingest", &targets.ingest), ("--subscribe", &targets.subscribe), ("--admin", &targets.admin)]
        {
            args.extend([flag.to_string(), addr.clone()]);
        }
        if let Some(kafka) = &targets.kafka {
            args.extend(["--ingest-kafka".to_string(), kafka.clone()]);
        }
        // The other ingest listeners are off unless asked for: their default
        // ports would collide between servers started side by side.
        for flag in ["--ingest-json", "--ingest-ilp", "--ingest-kafka"] {
            if (flag != "--ingest-kafka" || targets.kafka.is_none())
                && !extra_args.iter().any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")))
            {
                args.extend([flag.to_string(), "off".to_string()]);
            }
        }
        args.extend(extra_args.iter().cloned());
        let data_dir = std::env::temp_dir().join(format!("spate-bench-data-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data_dir);
        args.extend(["--data-dir".to_string(), data_dir.display().to_string()]);
        let log_path = std::env::temp_dir().join(format!("spate-bench-server-{}.log", std::process::id()));
        let log =
            std::fs::File::create(&log_path).map_err(|source| BenchError::Io { what: "create server log", source })?;
        let child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|source| BenchError::Io { what: "spawn spate serve", source })?;
        let command_line = std::iter::once(program.display().to_string()).chain(args).collect::<Vec<_>>().join(" ");
        let mut server =
            ServerProcess { child: Some(child), data_dir: Some(data_dir), targets, log_path, command_line };
        server.wait_ready()?;
        Ok(server)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn wait_ready(&mut self) -> Result<(), BenchError> {
        let admin = AdminClient::new(&self.targets.admin);
        let started = Instant::now();
        while started.elapsed() < READY_TIMEOUT {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(BenchError::ServerExited { status: status.to_string(), log_tail: self.log_tail() });
            }
            if admin.stats().is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(BenchError::ServerNotReady { waited_s: READY_TIMEOUT.as_secs(), log_tail: self.log_tail() })
    }

    /// The end of the server's stderr.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let mut start = text.len().saturating_sub(LOG_TAIL_BYTES);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_owned()
    }

    /// SIGTERM, then wait for the clean exit (kill after [`STOP_TIMEOUT`]).
    pub fn stop(mut self) -> Result<ExitStatus, BenchError> {
        let Some(mut child) = self.child.take() else {
            return Err(BenchError::ServerExited { status: "already exited".into(), log_tail: self.log_tail() });
        };
        let pid = libc::pid_t::try_from(child.id()).expect("pids fit in pid_t");
        // SAFETY: kill(2) on our own child, which has not been waited for, so
        // the pid cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    // A clean stop leaves nothing to read; a failed one keeps its log.
                    if status.success() {
                        let _ = std::fs::remove_file(&self.log_path);
                    }
                    return Ok(status);
                }
                Ok(None) if started.elapsed() < STOP_TIMEOUT => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(BenchError::ServerStopTimeout {
                        waited_s: STOP_TIMEOUT.as_secs(),
                        log_tail: self.log_tail(),
                    });
                }
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(data_dir) = self.data_dir.take() {
            let _ = std::fs::remove_dir_all(data_dir);
        }
    }
}
