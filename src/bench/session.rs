//! The server a bench drives, for the whole of a run or a sweep: spate
//! started by the bench (`--start-server`), spate already running, or
//! nats-server (`--target nats`, always already running). A [`Session`] knows
//! its addresses, its admin client (spate only), and the pid whose
//! `/proc/<pid>/stat` gives the server's CPU time, with where that pid came
//! from, so a report never shows a CPU figure it cannot stand behind.

use crate::bench::args::{BenchArgs, Target};
use crate::bench::server::{ServerProcess, Targets};
use crate::bench::stats::AdminClient;
use crate::bench::{BenchError, procstat};

/// The server of a run.
pub struct Session {
    pub target: Target,
    /// Where producers and the subscriber connect (for NATS, both are the NATS address).
    pub targets: Targets,
    /// spate's admin port; `None` for NATS.
    pub admin: Option<AdminClient>,
    pub server: Option<ServerProcess>,
    /// Whose CPU time is the server's.
    pub server_pid: Option<u32>,
    /// How `server_pid` was found: `started`, `--server-pid`, `listener of ADDR`.
    pub server_pid_source: Option<String>,
    /// What the server calls itself: NATS's `INFO` version, filled in by the
    /// first subscriber handshake.
    pub server_version: Option<String>,
}

impl Session {
    /// Starts or finds the server `args` name.
    pub fn open(args: &BenchArgs) -> Result<Session, BenchError> {
        let server = match (args.target, args.start_server) {
            (Target::Spate | Target::Kafka, true) => Some(ServerProcess::start(
                args.server_shards,
                &args.server_command_args(),
                args.target == Target::Kafka,
            )?),
            _ => None,
        };
        let mut targets = match (&server, args.target) {
            (Some(server), _) => server.targets.clone(),
            (None, Target::Spate) => Targets {
                ingest: args.ingest.clone(),
                subscribe: args.subscribe.clone(),
                admin: args.admin.clone(),
                kafka: None,
            },
            (None, Target::Nats) => {
                Targets { ingest: args.nats.clone(), subscribe: args.nats.clone(), admin: String::new(), kafka: None }
            }
            (None, Target::Kafka) => Targets {
                ingest: args.ingest.clone(),
                subscribe: args.subscribe.clone(),
                admin: args.admin.clone(),
                kafka: Some(args.kafka.clone()),
            },
        };
        // Kafka producers connect to the Kafka listener; the subscriber and
        // /stats are spate's as for lines.
        if args.target == Target::Kafka
            && let Some(kafka) = targets.kafka.clone()
        {
            targets.ingest = kafka;
        }
        let admin = (args.target != Target::Nats).then(|| AdminClient::new(&targets.admin));
        let (server_pid, server_pid_source) = match (&server, args.server_pid) {
            (Some(server), _) => (server.pid(), Some("started by the bench".to_string())),
            (None, Some(pid)) => (Some(pid), Some("--server-pid".to_string())),
            (None, None) => match procstat::listener_pid(&targets.ingest) {
                Some(pid) => (Some(pid), Some(format!("the process listening on {}", targets.ingest))),
                None => (None, None),
            },
        };
        if let Some(pid) = server_pid
            && procstat::process_cpu_seconds(pid).is_none()
        {
            return Err(BenchError::Invalid {
                flag: "--server-pid",
                value: pid.to_string(),
                reason: "no such process (or /proc/<pid>/stat is unreadable)",
            });
        }
        if server_pid.is_none() {
            eprintln!("spate bench: warning: no server pid (give --server-pid): the server's CPU will not be measured");
        }
        Ok(Session { target: args.target, targets, admin, server, server_pid, server_pid_source, server_version: None })
    }

    /// CPU seconds the server has used so far.
    pub fn server_cpu_seconds(&self) -> Option<f64> {
        procstat::process_cpu_seconds(self.server_pid?)
    }

    /// The server's name for tables: `spate 0.1.0` or `nats-server 2.9.10`.
    pub fn server_name(&self) -> String {
        match self.target {
            Target::Spate => format!("spate {}", env!("CARGO_PKG_VERSION")),
            Target::Kafka => format!("spate {} (Kafka listener)", env!("CARGO_PKG_VERSION")),
            Target::Nats => format!("nats-server {}", self.server_version.as_deref().unwrap_or("(version unknown)")),
        }
    }

    /// Stops a started server (SIGTERM, clean exit).
    pub fn close(self) -> Result<(), BenchError> {
        if let Some(server) = self.server {
            let status = server.stop()?;
            if !status.success() {
                eprintln!("spate bench: warning: the started server exited with {status}");
            }
        }
        Ok(())
    }

    /// The started server's log, to show after a failure.
    pub fn log_tail(&self) -> Option<String> {
        self.server.as_ref().map(|server| format!("({}):\n{}", server.log_path.display(), server.log_tail()))
    }
}
