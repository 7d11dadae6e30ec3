//! One shard's start-up, on its own executor: join the mesh, build the
//! [`Shard`], start its long-running tasks, bind the listeners and spawn the
//! network faces on them, then serve the control plane until `Exit`.

use std::rc::Rc;
use std::sync::Arc;

use glommio::channels::channel_mesh::{FullMesh, Receivers};
use glommio::net::TcpListener;

use crate::config::Config;
use crate::ingest::Format;
use crate::net::{Admission, Connections, ShardNet};
use crate::runtime::{log, stage};
use crate::shard::Shard;
use crate::shard::control::{ControlRequest, ShardEvent, ShardFailure, serve_control};
use crate::shard::frame::MeshFrame;
use crate::shard::outbox::Outbox;

/// Everything a shard thread needs; cloned into every executor.
#[derive(Clone)]
pub struct ShardContext {
    pub config: Arc<Config>,
    pub mesh: FullMesh<MeshFrame>,
    /// Control receivers, indexed by shard id (known only after the mesh join).
    pub control: Arc<Vec<flume::Receiver<ControlRequest>>>,
    /// Delivery receivers (the cluster thread's committed records and
    /// catch-up reads), indexed by shard id.
    pub deliveries: Arc<Vec<flume::Receiver<ControlRequest>>>,
    pub events: flume::Sender<ShardEvent>,
    /// The process-wide connection limits, shared by every shard.
    pub admission: Arc<Admission>,
    /// The stream catalog at start.
    pub catalog: Arc<crate::stream::Catalog>,
    /// What the write-ahead logs held at start, for the shards to replay.
    pub wal_replay: Arc<crate::storage::wal::WalReplay>,
    /// Stream changes for the admin thread (the Kafka face's topics).
    pub stream_commands: flume::Sender<crate::admin::StreamCommand>,
    /// Idempotent producers' state, one table for the process (see
    /// `kafka::producers` for why it is shared).
    pub kafka_producers: Arc<crate::kafka::ProducerTable>,
    /// Kafka consumer groups' membership, one table for the process (see
    /// `kafka::groups`).
    pub kafka_groups: Arc<crate::kafka::KafkaGroups>,
    /// Where shards propose the records of replicated partitions (the
    /// cluster thread; `None` for a cluster of one).
    pub proposals: Option<crate::serve::cluster::ShardSenders>,
}

/// The body of one shard's executor.
pub async fn run_shard(context: ShardContext) {
    stage::set(None, "joining the shard mesh");
    let Ok((senders, mut receivers)) = context.mesh.join().await else {
        let _ = context.events.send(ShardEvent::Failed { shard: None, failure: ShardFailure::MeshJoin });
        return;
    };
    let id = u16::try_from(receivers.peer_id()).expect("shard count is bounded by SHARD_COUNT_MAX");
    stage::set(Some(id), "building the shard");
    if context.config.test_stall_start && usize::from(id) + 1 == context.config.shard_count() {
        // --test-stall-start: asleep for good, as the start-up hang seen in CI.
        std::future::pending::<()>().await;
    }
    let outbox = Rc::new(Outbox::new(senders));
    let catalog = crate::stream::Catalog::clone(&context.catalog);
    let shard = Rc::new(Shard::new(id, context.config.clone(), outbox.clone(), catalog));
    if let Some(senders) = &context.proposals {
        shard.set_replication_sender(senders.proposals.clone());
        shard.set_replication_readers(senders.readers.clone());
    }
    stage::set(Some(id), "prefaulting the segment pool and loading consumer groups");
    prefault_and_load_groups(&context.config, &shard);
    if shard.stores_on_disk() {
        crate::shard::commit::set_replay(&shard, context.wal_replay.clone());
        stage::set(Some(id), "opening partitions");
        let opened = open_storage(&shard).await;
        stage::set(Some(id), "waiting for every shard's write-ahead log replay");
        let replayed = crate::shard::commit::finish_replay(&shard, opened.is_err()).await;
        if let Err(failure) = opened {
            let _ = context.events.send(ShardEvent::Failed { shard: Some(id), failure });
            return;
        }
        if replayed.is_err() {
            // Another shard failed: the server does not start, and no log
            // starts a new run over frames not replayed.
            return;
        }
        glommio::spawn_local(crate::shard::commit::run_committer(shard.clone())).detach();
    }
    stage::set(Some(id), "starting tasks and binding listeners");
    spawn_mesh_tasks(&shard, &outbox, &mut receivers);
    spawn_shard_tasks(&shard);
    spawn_test_panic(&context.config, id);
    let net = Rc::new(ShardNet {
        admission: context.admission.clone(),
        connections: Connections::new(&context.config),
        refusals: Rc::default(),
    });
    let sweeping = (net.clone(), shard.clone());
    glommio::spawn_local(async move { sweeping.0.connections.run_sweeper(sweeping.1.lifecycle()).await }).detach();
    match bind_listeners(&context.config) {
        Ok(Listeners { ingest, subscribe, kafka }) => {
            for (listener, format) in ingest {
                let (shard, net) = (shard.clone(), net.clone());
                glommio::spawn_local(crate::ingest::accept_loop(shard, net, listener, format)).detach();
            }
            glommio::spawn_local(adopt_connections(shard.clone(), net.clone())).detach();
            if let Some(listener) = kafka {
                let face = crate::kafka::KafkaFace::new(
                    &context.config,
                    context.stream_commands.clone(),
                    (context.kafka_producers.clone(), context.kafka_groups.clone()),
                );
                let (shard, net) = (shard.clone(), net.clone());
                glommio::spawn_local(crate::kafka::accept_loop(shard, net, listener, face)).detach();
            }
            glommio::spawn_local(crate::subscribe::accept_subscribers(shard.clone(), net, subscribe)).detach();
        }
        Err(failure) => {
            let _ = context.events.send(ShardEvent::Failed { shard: Some(id), failure });
            return;
        }
    }
    let read_only = shard.read_only_reason();
    stage::set(Some(id), stage::STARTED);
    let _ = context.events.send(ShardEvent::Started { shard: id, read_only });
    let (delivering, deliveries) = (shard.clone(), context.deliveries[usize::from(id)].clone());
    let events = context.events.clone();
    glommio::spawn_local(async move { serve_control(&delivering, &deliveries, &events).await }).detach();
    // Control requests (queries, /stats, stream changes) run in a task queue
    // that goes first when a request wakes it (see the vendored glommio's
    // `create_urgent_task_queue`), not behind the batches queued to apply.
    let control_queue = glommio::executor().create_urgent_task_queue("control");
    let control = context.control[usize::from(id)].clone();
    let (events, serving) = (context.events.clone(), shard.clone());
    glommio::spawn_local_into(async move { serve_control(&serving, &control, &events).await }, control_queue)
        .expect("the control task queue was just created")
        .await;
    outbox.close();
}

/// Before the shard serves anything: writes its share of the segment pool
/// (so `/stats` answers once every shard's pool is written) and, on disk,
/// loads the consumer groups' committed offsets.
fn prefault_and_load_groups(config: &Config, shard: &Shard) {
    if config.log_prefault_bytes > 0 {
        let segment_bytes = match config.storage {
            crate::config::Storage::Memory => config.segment_bytes(),
            crate::config::Storage::Disk => config.tail_cache_segment_bytes(),
        };
        crate::partition::log::prefault_segment_pool(config.log_prefault_bytes, segment_bytes);
    }
    if config.storage == crate::config::Storage::Disk {
        let (stored, problems) = crate::group::store::load_all(&config.data_dir);
        if shard.id() == 0 {
            for problem in problems {
                log::warn!("skipping a consumer group's offsets file: {problem}");
            }
        }
        shard.load_groups(stored);
    }
}

/// One task per peer hands its frames to the shard and one drains the
/// outbox to it; the loopback task does both for the shard's frames to
/// itself.
fn spawn_mesh_tasks(shard: &Rc<Shard>, outbox: &Rc<Outbox>, receivers: &mut Receivers<MeshFrame>) {
    for (peer, stream) in receivers.streams() {
        let peer = u16::try_from(peer).expect("shard count is bounded by SHARD_COUNT_MAX");
        let receiving = shard.clone();
        glommio::spawn_local(async move {
            while let Some(frame) = stream.recv().await {
                receiving.handle_frame(peer, frame);
            }
        })
        .detach();
        glommio::spawn_local(outbox.clone().drain(peer)).detach();
    }
    let looping = shard.clone();
    glommio::spawn_local(async move { looping.run_loopback().await }).detach();
}

/// `--test-panic-after-ms`: the last shard panics on purpose (the tests of
/// the fail-fast panic policy).
fn spawn_test_panic(config: &Config, id: u16) {
    if let Some(after_ms) = config.test_panic_after_ms
        && usize::from(id) + 1 == config.shard_count()
    {
        glommio::spawn_local(async move {
            glommio::timer::sleep(std::time::Duration::from_millis(after_ms)).await;
            panic!("--test-panic-after-ms {after_ms}: shard {id} panics on purpose");
        })
        .detach();
    }
}

/// Opens (and recovers) the files of the partitions this shard owns, and
/// says what recovery cut.
async fn open_storage(shard: &Rc<Shard>) -> Result<(), ShardFailure> {
    let started = std::time::Instant::now();
    let reports = shard.open_partitions().await.map_err(|error| ShardFailure::Storage { error })?;
    let mut cut_count = 0;
    for report in &reports {
        crate::shard::metrics::ShardMetrics::add(&shard.metrics().wal_replayed_frames, report.replayed_frames as u64);
        let Some((path, recovery)) = &report.recovery else { continue };
        // Zeros after the last frame are the normal end of a segment.
        if recovery.outcome.stop.is_clean() {
            continue;
        }
        cut_count += 1;
        crate::shard::metrics::ShardMetrics::add(&shard.metrics().recovery_truncations, 1);
        crate::shard::metrics::ShardMetrics::add(&shard.metrics().recovery_discarded_bytes, recovery.discarded_bytes);
        let deferred = if report.deferred.is_some() { "; the cut waits for disk space" } else { "" };
        log::info!(
            shard = shard.id(),
            "recovered {}: kept {} bytes (offsets up to {}), dropped {} bytes after them ({:?}{deferred})",
            path.display(),
            recovery.outcome.cursor.position,
            recovery.outcome.cursor.next_offset,
            recovery.discarded_bytes,
            recovery.outcome.stop,
        );
    }
    log::info!(
        shard = shard.id(),
        "opened {} partitions on disk in {:.2}s ({} tails cut)",
        reports.len(),
        started.elapsed().as_secs_f64(),
        cut_count
    );
    Ok(())
}

/// Serves the connections other shards hand over to this one while the
/// process is gathered ([`crate::shard::consolidation`]): each face takes
/// its own kind.
async fn adopt_connections(shard: Rc<Shard>, net: Rc<ShardNet>) {
    loop {
        let adoption = shard.next_adoption().await;
        let unknown = crate::ingest::adopt(&shard, &net, adoption)
            .or_else(|adoption| crate::subscribe::adopt(&shard, &net, adoption));
        debug_assert!(unknown.is_ok(), "a connection handed over by a face that cannot adopt it");
    }
}

/// The shard's own loops: flusher, applier, balancer, fetch servicer.
fn spawn_shard_tasks(shard: &Rc<Shard>) {
    let flusher = shard.clone();
    glommio::spawn_local(async move { flusher.ingress().run_flusher().await }).detach();
    let applier = shard.clone();
    glommio::spawn_local(async move { applier.run_applier().await }).detach();
    crate::shard::aggregates::spawn_tasks(shard);
    let balancer = shard.clone();
    glommio::spawn_local(async move { balancer.run_balancer().await }).detach();
    let mover = shard.clone();
    glommio::spawn_local(async move { mover.run_consolidation().await }).detach();
    let servicer = shard.clone();
    glommio::spawn_local(async move { servicer.run_fetch_servicer().await }).detach();
    let writer = shard.clone();
    glommio::spawn_local(async move { writer.run_offset_writer().await }).detach();
    let checker = shard.clone();
    glommio::spawn_local(async move { checker.run_hold_checker().await }).detach();
}

/// A shard's listening sockets: one per ingest format that is on, and the
/// subscribe port.
struct Listeners {
    ingest: Vec<(TcpListener, Format)>,
    subscribe: TcpListener,
    kafka: Option<TcpListener>,
}

/// Backlog of each shard's listening sockets.
const LISTEN_BACKLOG: i32 = 1024;

/// A listening socket on `address` for this shard, as glommio's
/// `TcpListener::bind` makes one (`SO_REUSEPORT`: every shard listens on
/// the same port and the kernel spreads the connections), plus
/// `SO_REUSEADDR`: without it a connection in TIME_WAIT on the port that
/// another program's socket left (one bound with only `SO_REUSEADDR`, as
/// most are) fails the bind with "Address already in use" for a minute,
/// although no one listens there (seen in CI: a test server's port reused
/// by the next test binary).
fn listen(address: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&address.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    // SAFETY: the descriptor is a bound, listening TCP socket that nothing
    // else owns: `into_raw_fd` gave up socket2's ownership of it.
    Ok(unsafe { TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

fn bind_listeners(config: &Config) -> Result<Listeners, ShardFailure> {
    let bind =
        |name: &'static str, address| listen(address).map_err(|error| ShardFailure::Bind { name, address, error });
    let formats = [
        ("ingest", Some(config.ingest), Format::Lines),
        ("ingest-json", config.ingest_json.0, Format::Json),
        ("ingest-ilp", config.ingest_ilp.0, Format::Ilp),
    ];
    let mut ingest = Vec::new();
    for (name, address, format) in formats {
        if let Some(address) = address {
            ingest.push((bind(name, address)?, format));
        }
    }
    let kafka = match config.ingest_kafka.0 {
        Some(address) => Some(bind("ingest-kafka", address)?),
        None => None,
    };
    Ok(Listeners { ingest, subscribe: bind("subscribe", config.subscribe)?, kafka })
}
