//! `spate serve`: checks the machine, starts one executor per shard, the
//! admin thread and the signal handler, and runs the two-phase shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::channel_mesh::MeshBuilder;
use glommio::{LocalExecutorBuilder, LocalExecutorPoolBuilder, Placement, PoolPlacement};

use crate::admin::{AdminServer, AdminState};
use crate::config::Config;
use crate::shard::{ControlRequest, ShardContext, ShardEvent, run_shard};

/// Least locked memory glommio needs per executor.
const MEMLOCK_BYTES_MIN: u64 = 512 * 1024;
/// How long shards get to start.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the server could not start or stopped abnormally.
#[derive(Debug)]
pub enum ServeError {
    Config(crate::config::ConfigError),
    /// The machine cannot run glommio; the text says how to fix it.
    Environment(String),
    AddressInUse {
        name: &'static str,
        address: SocketAddr,
    },
    Start(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(error) => write!(f, "invalid configuration: {error}"),
            ServeError::Environment(text) => write!(f, "{text}"),
            ServeError::AddressInUse { name, address } => write!(
                f,
                "{name} address {address} is already in use (another spate running?); pick another with --{name}"
            ),
            ServeError::Start(text) => write!(f, "failed to start: {text}"),
        }
    }
}

impl std::error::Error for ServeError {}

/// Runs a server until SIGINT or SIGTERM, then drains and returns.
pub fn serve(config: Config) -> Result<(), ServeError> {
    config.validate().map_err(ServeError::Config)?;
    check_memlock()?;
    check_io_uring(&config)?;
    check_addresses(&config)?;
    let config = Arc::new(config);
    let shard_count = config.shard_count();
    let (events_sender, events) = flume::unbounded();
    let (controls, control_receivers): (Vec<_>, Vec<_>) = (0..shard_count).map(|_| flume::bounded(64)).unzip();
    let context = ShardContext {
        config: config.clone(),
        mesh: MeshBuilder::full(shard_count, config.mesh_channel_frames()),
        control: Arc::new(control_receivers),
        events: events_sender.clone(),
    };
    let cpu_count = std::thread::available_parallelism().map(|count| count.get()).unwrap_or(1);
    let placement = if shard_count <= cpu_count {
        PoolPlacement::MaxSpread(shard_count, None)
    } else {
        PoolPlacement::Unbound(shard_count)
    };
    let pool = LocalExecutorPoolBuilder::new(placement)
        .name("spate-shard")
        .io_memory(config.io_memory_bytes)
        .spin_before_park(Duration::from_micros(config.spin_before_park_us))
        .on_all_shards(move || run_shard(context))
        .map_err(|error| ServeError::Start(format!("executor pool: {error}")))?;
    let started = Instant::now();
    let startup = wait_for_start(&events, shard_count);
    let admin = startup.and_then(|()| {
        AdminServer::start(AdminState {
            controls: controls.clone(),
            config: config.clone(),
            memory_bound: config.memory_bound(),
            started,
        })
        .map_err(ServeError::Start)
    });
    let admin = match admin {
        Ok(admin) => admin,
        Err(error) => {
            broadcast(&controls, || ControlRequest::Exit);
            let _ = pool.join_all();
            return Err(error);
        }
    };
    print_banner(&config, shard_count, shard_count <= cpu_count);
    spawn_signal_thread(&controls)?;
    wait_for_drain(&events, shard_count);
    broadcast(&controls, || ControlRequest::Exit);
    for result in pool.join_all() {
        if let Err(error) = result {
            eprintln!("spate: shard ended with an error: {error}");
        }
    }
    admin.stop();
    eprintln!("spate: stopped cleanly after {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

fn broadcast(controls: &[flume::Sender<ControlRequest>], make: impl Fn() -> ControlRequest) {
    for control in controls {
        let _ = control.send(make());
    }
}

fn wait_for_start(events: &flume::Receiver<ShardEvent>, shard_count: usize) -> Result<(), ServeError> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut started = 0;
    while started < shard_count {
        match events.recv_deadline(deadline) {
            Ok(ShardEvent::Started { .. }) => started += 1,
            Ok(ShardEvent::Failed { shard, reason }) => {
                return Err(ServeError::Start(format!("shard {shard}: {reason}")));
            }
            Ok(ShardEvent::Drained { .. }) => {}
            Err(_) => return Err(ServeError::Start(format!("only {started} of {shard_count} shards started in time"))),
        }
    }
    Ok(())
}

/// Waits for the shutdown signal's drain to finish on every shard.
fn wait_for_drain(events: &flume::Receiver<ShardEvent>, shard_count: usize) {
    let mut drained = 0;
    while drained < shard_count {
        match events.recv() {
            Ok(ShardEvent::Drained { .. }) => drained += 1,
            Ok(ShardEvent::Failed { shard, reason }) => eprintln!("spate: shard {shard} failed: {reason}"),
            Ok(ShardEvent::Started { .. }) => {}
            Err(_) => return,
        }
    }
}

fn spawn_signal_thread(controls: &[flume::Sender<ControlRequest>]) -> Result<(), ServeError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|error| ServeError::Start(format!("signal handler: {error}")))?;
    let controls = controls.to_vec();
    std::thread::Builder::new()
        .name("spate-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!("spate: signal {signal}: stopping (no new connections; draining what was read)");
                broadcast(&controls, || ControlRequest::Shutdown);
            }
        })
        .map_err(|error| ServeError::Start(format!("signal thread: {error}")))?;
    Ok(())
}

fn print_banner(config: &Config, shard_count: usize, pinned: bool) {
    let bound = config.memory_bound();
    eprintln!(
        "spate: {shard_count} shards ({}), {} partitions; ingest {}, subscribe {}, admin http://{}",
        if pinned { "pinned" } else { "unpinned: more shards than CPUs" },
        config.partitions,
        config.ingest,
        config.subscribe,
        config.admin
    );
    eprintln!(
        "spate: memory bound {} MiB (worst case with every connection holding a max-size line: {} MiB)",
        bound.total >> 20,
        bound.total_worst_case >> 20
    );
}

fn check_memlock() -> Result<(), ServeError> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    if status == 0 && limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur < MEMLOCK_BYTES_MIN {
        return Err(ServeError::Environment(format!(
            "locked memory limit is {} KiB; glommio (io_uring) needs at least {} KiB per process.\n\
             fix: `ulimit -l {}` in this shell (as root, or raise the hard limit in \
             /etc/security/limits.conf), or LimitMEMLOCK=infinity in the systemd unit",
            limit.rlim_cur / 1024,
            MEMLOCK_BYTES_MIN / 1024,
            64 * 1024
        )));
    }
    Ok(())
}

/// Creates (and drops) one executor, so a kernel without io_uring fails here
/// with a message instead of inside a shard thread.
fn check_io_uring(config: &Config) -> Result<(), ServeError> {
    let executor = LocalExecutorBuilder::new(Placement::Unbound).io_memory(config.io_memory_bytes).make();
    match executor {
        Ok(_) => Ok(()),
        Err(error) => Err(ServeError::Environment(format!(
            "cannot start a glommio executor: {error}\n\
             spate needs Linux 5.8+ with io_uring enabled and at least 512 KiB of locked memory.\n\
             fix: check `sysctl kernel.io_uring_disabled` (must be 0), that no seccomp profile \
             (e.g. a container runtime's) blocks io_uring_setup, and `ulimit -l`"
        ))),
    }
}

/// glommio binds with SO_REUSEPORT, so a second server on a busy port would
/// silently share it. Probe each address with a plain bind first.
fn check_addresses(config: &Config) -> Result<(), ServeError> {
    let addresses = [("ingest", config.ingest), ("subscribe", config.subscribe), ("admin", config.admin)];
    for (name, address) in addresses {
        if let Err(error) = std::net::TcpListener::bind(address) {
            if error.kind() == std::io::ErrorKind::AddrInUse {
                return Err(ServeError::AddressInUse { name, address });
            }
            return Err(ServeError::Start(format!("bind {name} {address}: {error}")));
        }
    }
    Ok(())
}
