//! The cluster thread: one glommio executor, off the shards' CPUs' hot
//! path, that runs the [`Membership`] state machine over the real UDP
//! socket and clock, refreshes this node's load from its shards, and
//! answers the admin thread (`GET /cluster`) and the signal thread (leave).
//! It also runs the internode transport ([`crate::transport`]), whose links
//! follow the membership (a task matches them every [`LINK_SYNC_MS`]).
//! A clustered node runs its Raft groups here too ([`crate::replication::node`]),
//! the cluster's catalog group among them: a task hands its committed
//! entries to the admin thread to apply ([`crate::admin::replicated`]), and
//! [`ClusterRequest::ProposeCatalog`] proposes a change.
//!
//! Four tasks share the membership (`Rc<RefCell<_>>`, never borrowed across
//! an await): one receives datagrams, one sends what the membership queued,
//! one fires foca's timers when they are due, one asks every shard for its
//! stats each [`LOAD_REFRESH_MS`] (the `ControlRequest::Stats` that
//! `/stats` uses) and publishes the summary. A cluster of one (no
//! `--cluster`, no `--join`) has no socket and runs none of these: it reads
//! its shards' load when `GET /cluster` asks, so an idle single node wakes
//! no more than before.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use foca::OwnedNotification;
use glommio::net::UdpSocket;
use glommio::{LocalExecutorBuilder, Placement};

use crate::cluster::identity::MemberId;
use crate::cluster::load::LoadSummary;
use crate::cluster::membership::{DATAGRAM_BYTES_MAX, MemberView, Membership, MembershipCounters};
use crate::replication::host::RAFT_TICK_MS;
use crate::replication::node::{ProposalRequest, ReplicationNode};
use crate::runtime::log;
use crate::runtime::notify::Notify;
use crate::shard::control::ControlRequest;
use crate::transport::{Channel, PeerView, Transport, TransportHandle, TransportSetup};

/// Proposals taken from the shards' queue at once (the queue holds
/// [`crate::serve`]'s 4096); a round follows.
const PROPOSALS_PER_ROUND_MAX: usize = 4096;
/// How often what waits for room in a peer's transport queue is tried
/// again, in ms.
const UNSENT_RECHECK_MS: u64 = 1;
/// Peer messages stepped at once before a round.
const INBOUND_PER_ROUND_MAX: usize = 1024;

/// How often this node's load is refreshed from its shards, in ms.
pub const LOAD_REFRESH_MS: u64 = 500;
/// How long the load refresh waits for a shard's stats, in ms.
const SHARD_STATS_TIMEOUT_MS: u64 = 1000;
/// How long the timer task sleeps when no timer is pending, in ms.
const IDLE_WAIT_MS: u64 = 1000;
/// Requests queued for the cluster thread (the admin thread waits for each
/// answer, the signal thread sends one leave).
pub const REQUESTS_MAX: usize = 16;
/// How long a node leaving on SIGTERM waits for its replicas and
/// leaderships to move to other nodes before it leaves anyway, in ms
/// (README, "Leaving").
pub const LEAVE_HANDOVER_TIMEOUT_MS: u64 = 30_000;
/// How often the leave checks whether the handover is done, in ms.
const HANDOVER_POLL_MS: u64 = 100;
/// How long the leave waits before it concludes that no member is left
/// to hand over to, in ms: a few Raft ticks and gossip rounds.
const HANDOVER_SETTLE_MS: u64 = 1000;
/// How often the transport's links are matched to the membership, in ms.
const LINK_SYNC_MS: u64 = 250;
/// Registered io_uring buffer memory of the cluster executor: it only
/// moves small datagrams.
const CLUSTER_IO_MEMORY_BYTES: usize = 64 * 1024;

/// What the admin thread and the signal thread ask the cluster thread.
pub enum ClusterRequest {
    /// Every member as this node sees it.
    View(flume::Sender<ClusterView>),
    /// Leave the cluster (SIGTERM): hand the replicas over (bounded by
    /// [`LEAVE_HANDOVER_TIMEOUT_MS`]), then foca's leave; the answer comes
    /// once the goodbye is on the wire.
    Leave(flume::Sender<()>),
    /// The stream catalog changed: these are its streams now (the
    /// replicated ones have Raft groups here).
    Streams(Vec<crate::stream::StreamSpec>),
    /// Propose a catalog command to the catalog group (answered once it is
    /// committed, or refused; its apply here comes a moment later).
    ProposeCatalog { command: Vec<u8>, reply: flume::Sender<Result<(), crate::replication::node::ProposalRefused>> },
    /// End the thread (after the shards stopped).
    Exit,
}

/// A snapshot of the membership for `GET /cluster` and `/metrics`.
#[derive(Clone, Debug)]
pub struct ClusterView {
    /// Whether this node gossips (has a cluster address) at all.
    pub enabled: bool,
    pub members: Vec<MemberView>,
    pub counters: MembershipCounters,
    /// The membership clock now: a load's age is `now - received_at`.
    pub now: Duration,
    /// The transport's link to every peer (empty for a cluster of one).
    pub peers: Vec<PeerView>,
    /// Every Raft group this node holds.
    pub groups: Vec<crate::replication::node::GroupView>,
    /// The Raft store and its compaction (default without replication).
    pub replication: crate::replication::node::ReplicationStats,
}

/// What the cluster thread starts from.
pub struct ClusterSetup {
    pub identity: MemberId,
    /// The bound cluster socket (`None`: a cluster of one).
    pub socket: Option<std::net::UdpSocket>,
    pub join: Vec<SocketAddr>,
    pub controls: Vec<flume::Sender<ControlRequest>>,
    /// The internode transport's listener and knobs (`None`: a cluster of
    /// one, which links to nobody).
    pub transport: Option<TransportSetup>,
    /// The Raft store and the shards' proposals (with the transport only).
    pub replication: Option<ReplicationSetup>,
}

/// What the replication of a clustered node starts from
/// ([`crate::replication::node`]).
pub struct ReplicationSetup {
    pub store: crate::replication::file_store::FileLogStore,
    pub proposals: flume::Receiver<crate::replication::node::ProposalRequest>,
    /// The replicated partitions the shards' subscribers wait on.
    pub readers: flume::Receiver<crate::replication::mirror::Reader>,
    /// The catalog's streams at start.
    pub streams: Vec<crate::stream::StreamSpec>,
    /// The last catalog-log entry the catalog applied (its `replicated_index`).
    pub catalog_applied: u64,
    /// Where committed catalog entries go to be applied (the admin thread).
    pub catalog_entries: flume::Sender<crate::replication::node::CatalogEntries>,
    /// Each shard's delivery queue (committed records and catch-up reads),
    /// by shard id: apart from the control queues, so a wave of deliveries
    /// never keeps an admin request or a load refresh out.
    pub deliveries: Vec<flume::Sender<ControlRequest>>,
}

/// The running cluster thread.
pub struct ClusterHandle {
    requests: flume::Sender<ClusterRequest>,
    /// How shards will send to other nodes (replication, forwarding).
    #[allow(dead_code)]
    transport: Option<TransportHandle>,
    thread: Option<glommio::ExecutorJoinHandle<()>>,
}

impl ClusterHandle {
    /// Starts the cluster thread (its own executor, unpinned).
    pub fn start(setup: ClusterSetup) -> Result<ClusterHandle, glommio::GlommioError<()>> {
        let (requests, receiver) = flume::bounded(REQUESTS_MAX);
        let transport = setup.transport.as_ref().map(|transport| transport.handle.clone());
        let thread = LocalExecutorBuilder::new(Placement::Unbound)
            .name("spate-cluster")
            .io_memory(CLUSTER_IO_MEMORY_BYTES)
            .spawn(move || run(setup, receiver))?;
        Ok(ClusterHandle { requests, transport, thread: Some(thread) })
    }

    /// Where to send [`ClusterRequest`]s.
    pub fn requests(&self) -> flume::Sender<ClusterRequest> {
        self.requests.clone()
    }

    /// Ends the thread and waits for it.
    pub fn stop(mut self) {
        let _ = self.requests.send(ClusterRequest::Exit);
        if let Some(thread) = self.thread.take()
            && let Err(error) = thread.join()
        {
            log::error!("the cluster thread ended with an error: {error}");
        }
    }
}

/// Shared by the cluster thread's tasks.
struct Node {
    membership: RefCell<Membership>,
    socket: Option<UdpSocket>,
    transport: Option<Rc<Transport>>,
    started: Instant,
    /// Wakes the sender: datagrams were queued.
    outbox_ready: Notify,
    /// Wakes the timer task: a timer may now be due sooner.
    timers_changed: Notify,
    /// The Raft groups (a clustered node only).
    replication: Option<RefCell<ReplicationNode>>,
    /// Wakes the delivery task: commits may have advanced.
    delivery_due: Notify,
    /// Wakes the round task: messages or proposals came in.
    round_due: Notify,
    /// Wakes the flush task: something waits for room in a peer's queue.
    flush_due: Notify,
    /// Wakes the tick task of a node that had no group: one may exist now.
    replication_wake: Notify,
    /// Wakes the gap fetches: a gap message came from a peer.
    catchup_due: Notify,
    /// Wakes the mirrors: a mirror message came from a peer.
    mirror_due: Notify,
    /// Wakes the sync task: `Ready`s wait for the Raft log's sync.
    sync_due: Notify,
    /// Wakes the catalog's apply: its commit may have advanced.
    catalog_due: Notify,
}

impl Node {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// After any call into the membership but the timer task's own: wake
    /// the sender and the timer task, and log what changed.
    fn after_interaction(&self) {
        self.timers_changed.notify();
        self.after_timers();
    }

    /// After the timer task fired timers: wake the sender, log what changed
    /// (waking the timer task itself would make it spin).
    fn after_timers(&self) {
        self.outbox_ready.notify();
        loop {
            let Some(notification) = self.membership.borrow_mut().take_notification() else { break };
            log_notification(notification);
        }
    }

    fn view(&self) -> ClusterView {
        let membership = self.membership.borrow();
        ClusterView {
            enabled: self.socket.is_some(),
            members: membership.members(),
            counters: membership.counters(),
            now: self.now(),
            peers: self.transport.as_ref().map(|transport| transport.peers()).unwrap_or_default(),
            groups: self.replication.as_ref().map(|replication| replication.borrow().views()).unwrap_or_default(),
            replication: self.replication.as_ref().map(|replication| replication.borrow().stats()).unwrap_or_default(),
        }
    }
}

async fn run(setup: ClusterSetup, requests: flume::Receiver<ClusterRequest>) {
    // SAFETY: the descriptor comes from a std socket we own and give up here.
    let socket = setup.socket.map(|socket| unsafe {
        <UdpSocket as std::os::fd::FromRawFd>::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(socket))
    });
    let seed = rand::random::<u64>();
    let node_id = setup.identity.node_id;
    let transport = setup.transport.map(Transport::start);
    let (replication, proposals, catalog_entries, deliveries) = match (setup.replication, &transport) {
        (Some(replication), Some(transport)) => {
            let mut state = ReplicationNode::new(node_id, replication.store, transport.handle());
            state.set_streams(&replication.streams);
            state.set_catalog(replication.catalog_applied, setup.join.is_empty());
            let ReplicationSetup { proposals, readers, catalog_entries, deliveries, .. } = replication;
            (Some(RefCell::new(state)), Some((proposals, readers)), Some(catalog_entries), deliveries)
        }
        _ => (None, None, None, Vec::new()),
    };
    let node = Rc::new(Node {
        membership: RefCell::new(Membership::new(setup.identity, seed)),
        socket,
        transport,
        started: Instant::now(),
        outbox_ready: Notify::default(),
        timers_changed: Notify::default(),
        replication,
        delivery_due: Notify::default(),
        round_due: Notify::default(),
        flush_due: Notify::default(),
        replication_wake: Notify::default(),
        catchup_due: Notify::default(),
        mirror_due: Notify::default(),
        sync_due: Notify::default(),
        catalog_due: Notify::default(),
    });
    if node.socket.is_some() {
        glommio::spawn_local(receive_datagrams(node.clone())).detach();
        glommio::spawn_local(send_datagrams(node.clone())).detach();
        glommio::spawn_local(fire_timers(node.clone())).detach();
        glommio::spawn_local(refresh_load(node.clone(), setup.controls.clone())).detach();
        glommio::spawn_local(sync_links(node.clone())).detach();
        if let Some((proposals, readers)) = proposals {
            glommio::spawn_local(replication_ticks(node.clone(), setup.controls.clone())).detach();
            glommio::spawn_local(replication_inbox(node.clone())).detach();
            glommio::spawn_local(replication_proposals(node.clone(), proposals)).detach();
            glommio::spawn_local(replication_rounds(node.clone())).detach();
            glommio::spawn_local(replication_syncs(node.clone())).detach();
            glommio::spawn_local(replication_flush(node.clone())).detach();
            glommio::spawn_local(replication_delivery(node.clone(), deliveries.clone())).detach();
            glommio::spawn_local(replication_catchup(node.clone(), deliveries.clone())).detach();
            glommio::spawn_local(replication_mirrors(node.clone(), deliveries, readers)).detach();
            if let Some(catalog_entries) = catalog_entries {
                glommio::spawn_local(replication_catalog(node.clone(), catalog_entries)).detach();
            }
        }
        node.membership.borrow_mut().join(node.now(), &setup.join);
        node.after_interaction();
    }
    serve_requests(&node, &setup.controls, requests).await;
}

async fn serve_requests(
    node: &Rc<Node>,
    controls: &[flume::Sender<ControlRequest>],
    requests: flume::Receiver<ClusterRequest>,
) {
    while let Ok(request) = requests.recv_async().await {
        match request {
            ClusterRequest::View(reply) => {
                if node.socket.is_none() {
                    publish_load(node, controls).await;
                }
                let _ = reply.send(node.view());
            }
            // Its own task: `GET /cluster` keeps answering during the handover.
            ClusterRequest::Leave(reply) => {
                glommio::spawn_local(leave(node.clone(), reply)).detach();
            }
            ClusterRequest::Streams(streams) => {
                if let Some(replication) = &node.replication {
                    replication.borrow_mut().set_streams(&streams);
                    node.replication_wake.notify();
                }
            }
            ClusterRequest::ProposeCatalog { command, reply } => match &node.replication {
                Some(replication) => {
                    replication.borrow_mut().propose_catalog(bytes::Bytes::from(command), reply);
                    node.round_due.notify();
                    node.replication_wake.notify();
                }
                None => {
                    let _ = reply.send(Err(crate::replication::node::ProposalRefused::NotAReplica));
                }
            },
            ClusterRequest::Exit => return,
        }
    }
}

/// Leaves on SIGTERM: says it is leaving, so every node's placement stops
/// counting it and the groups' leaders move its replicas and leaderships
/// away; waits (at most [`LEAVE_HANDOVER_TIMEOUT_MS`]) until it holds no
/// replica any more; then foca's leave, whose goodbye is on the wire
/// before the answer.
async fn leave(node: Rc<Node>, reply: flume::Sender<()>) {
    node.membership.borrow_mut().announce_leaving(node.now());
    node.after_interaction();
    if let Some(replication) = node.replication.as_ref().filter(|replication| replication.borrow().is_active()) {
        let started = Instant::now();
        loop {
            let (held, others) = {
                let replication = replication.borrow();
                (replication.replicas_held(), replication.live_members())
            };
            if held == 0 {
                log::info!("cluster: every replica of this node handed over in {} ms", started.elapsed().as_millis());
                break;
            }
            // Every other member leaving too (a whole cluster stopped) or
            // gone: nobody to hand over to. After a moment, so the gossip
            // of this node's own leaving and the others' has been applied.
            if others == 0 && started.elapsed() >= Duration::from_millis(HANDOVER_SETTLE_MS) {
                log::warn!(
                    "cluster: no other live member to hand {held} groups over to (the others are leaving or \
                     gone): leaving without a handover"
                );
                break;
            }
            if started.elapsed() >= Duration::from_millis(LEAVE_HANDOVER_TIMEOUT_MS) {
                log::warn!(
                    "cluster: gave up waiting for the handover after {LEAVE_HANDOVER_TIMEOUT_MS} ms: {held} groups \
                     still have a replica here; leaving anyway (their other replicas elect a leader where this \
                     node led, and placement replaces this replica once the node is seen gone)"
                );
                break;
            }
            glommio::timer::sleep(Duration::from_millis(HANDOVER_POLL_MS)).await;
        }
    }
    node.membership.borrow_mut().leave(node.now());
    node.after_interaction();
    flush(&node).await;
    let _ = reply.send(());
}

async fn receive_datagrams(node: Rc<Node>) {
    let Some(socket) = node.socket.as_ref() else { return };
    // One byte more than accepted, so an oversized datagram shows as such.
    let mut buffer = vec![0u8; DATAGRAM_BYTES_MAX + 1];
    let errors = log::Episode::new("cluster receive errors");
    loop {
        match socket.recv_from(&mut buffer).await {
            Ok((size, _from)) => {
                node.membership.borrow_mut().handle_datagram(node.now(), &buffer[..size]);
                node.after_interaction();
            }
            Err(error) => {
                errors.occur(Instant::now(), log::Level::Warn, log::Scope::process(), format_args!("{error}"));
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

async fn send_datagrams(node: Rc<Node>) {
    loop {
        node.outbox_ready.notified().await;
        flush(&node).await;
    }
}

/// Sends every queued datagram; a failed send is a lost datagram, which
/// SWIM's retries and suspicion absorb.
async fn flush(node: &Node) {
    let Some(socket) = node.socket.as_ref() else { return };
    loop {
        let Some((to, data)) = node.membership.borrow_mut().take_datagram() else { return };
        let _ = socket.send_to(&data, to).await;
    }
}

async fn fire_timers(node: Rc<Node>) {
    loop {
        let next = node.membership.borrow().next_timer_at();
        let idle = Duration::from_millis(IDLE_WAIT_MS);
        let wait = next.map_or(idle, |at| at.saturating_sub(node.now()).min(idle));
        futures_lite::future::or(glommio::timer::sleep(wait), node.timers_changed.notified()).await;
        node.membership.borrow_mut().fire_due_timers(node.now());
        node.after_timers();
    }
}

/// Keeps the transport's links matched to the membership: a link per
/// member that has not left.
async fn sync_links(node: Rc<Node>) {
    let Some(transport) = node.transport.clone() else { return };
    loop {
        let members = node.membership.borrow().members();
        transport.sync_members(&members);
        glommio::timer::sleep(Duration::from_millis(LINK_SYNC_MS)).await;
    }
}

/// Ticks the Raft groups every [`RAFT_TICK_MS`] (only while there is a
/// replicated stream or a group: an idle node's cluster thread does not
/// wake for them), after giving them the live members and creating the
/// groups this node should start.
async fn replication_ticks(node: Rc<Node>, controls: Vec<flume::Sender<ControlRequest>>) {
    let Some(replication) = &node.replication else { return };
    // The mirror view the shards have (module doc of replication::mirror,
    // "Where `latest` is"); sent again when it changes.
    let mut told: Option<std::sync::Arc<crate::replication::mirror::MirrorView>> = None;
    loop {
        if !replication.borrow().is_active() {
            // No replicated stream and no group: sleep until one comes.
            node.replication_wake.notified().await;
            continue;
        }
        glommio::timer::sleep(Duration::from_millis(RAFT_TICK_MS)).await;
        let members = node.membership.borrow().members();
        let mut state = replication.borrow_mut();
        state.set_members(&members);
        state.bootstrap_groups();
        state.host.tick();
        state.expire_proposals();
        state.retry_proposals();
        let view = crate::replication::mirror::view(&state);
        drop(state);
        if told.as_deref() != Some(&view) {
            let shared = std::sync::Arc::new(view);
            let sent =
                controls.iter().all(|control| control.try_send(ControlRequest::MirrorView(shared.clone())).is_ok());
            // A shard whose queue was full hears it at the next tick.
            told = sent.then_some(shared);
        }
        // The rounds task runs the round (one at a time: its sync is off
        // the thread, replication_round).
        node.round_due.notify();
    }
}

/// Steps the Raft batches and forwarded proposals peers send: everything
/// that arrived, then one round for all of it.
async fn replication_inbox(node: Rc<Node>) {
    let (Some(replication), Some(transport)) = (&node.replication, node.transport.clone()) else { return };
    loop {
        let mut next = Some(transport.next_replication().await);
        let mut state = replication.borrow_mut();
        for _ in 0..INBOUND_PER_ROUND_MAX {
            let Some(inbound) = next.take().or_else(|| transport.try_next_replication()) else { break };
            match Channel::from_u8(inbound.channel) {
                Some(Channel::Raft) => state.receive(&inbound.payload),
                Some(Channel::Propose) => state.propose_forwarded(inbound.from, &inbound.payload, false, false),
                Some(Channel::ProposeAfterRefusal) => {
                    state.propose_forwarded(inbound.from, &inbound.payload, true, false)
                }
                Some(Channel::ProposeRetry) => state.propose_forwarded(inbound.from, &inbound.payload, false, true),
                Some(Channel::ProposeAck) => state.receive_propose_ack(&inbound.payload),
                Some(Channel::ProposeRefused) => state.receive_propose_refused(&inbound.payload),
                Some(Channel::GapRead | Channel::GapRecords) => {
                    state.catchup.receive(inbound);
                    node.catchup_due.notify();
                }
                Some(Channel::MirrorRead | Channel::MirrorRecords) => {
                    state.mirrors.receive(inbound);
                    node.mirror_due.notify();
                }
                _ => {}
            }
        }
        drop(state);
        node.round_due.notify();
        node.replication_wake.notify();
    }
}

/// Takes the shards' proposals, every one queued, before one round.
async fn replication_proposals(node: Rc<Node>, proposals: flume::Receiver<ProposalRequest>) {
    let Some(replication) = &node.replication else { return };
    while let Ok(request) = proposals.recv_async().await {
        let queued = std::iter::once(request).chain(proposals.try_iter().take(PROPOSALS_PER_ROUND_MAX));
        replication.borrow_mut().propose_queued(queued);
        node.round_due.notify();
    }
}

/// Runs the first half of a Raft round whenever messages or proposals
/// came in or a sync completed ([`ReplicationNode::round_unsynced`]): it
/// ships what may leave before a sync and answers what is committed, and
/// runs while an earlier round's sync is under way, so a message that
/// arrives during a sync waits for it only if its answer needs it.
async fn replication_rounds(node: Rc<Node>) {
    let Some(replication) = &node.replication else { return };
    loop {
        node.round_due.notified().await;
        // Lets the inbox and the proposals task take everything queued.
        futures_lite::future::yield_now().await;
        replication.borrow_mut().round_unsynced();
        node.delivery_due.notify();
        node.sync_due.notify();
        node.catalog_due.notify();
        if replication.borrow().has_unsent() {
            node.flush_due.notify();
        }
    }
}

/// Syncs the Raft log for the `Ready`s the rounds left waiting, one sync
/// at a time, each on glommio's blocking thread (the write and the
/// fdatasync), then runs the round's second half: the messages that
/// waited for it leave, and the next first half hands out what the sync
/// let commit. One sync covers every group and every round since the last.
async fn replication_syncs(node: Rc<Node>) {
    let Some(replication) = &node.replication else { return };
    loop {
        node.sync_due.notified().await;
        let Some((job, covered)) = replication.borrow_mut().take_sync() else { continue };
        if let Some(job) = job {
            let result = glommio::executor().spawn_blocking(move || job.run()).await;
            replication.borrow().finish_sync(result);
        }
        replication.borrow_mut().round_synced(covered);
        node.delivery_due.notify();
        node.round_due.notify();
        if replication.borrow().has_unsent() {
            node.flush_due.notify();
        }
    }
}

/// Moves what waits for a full transport queue into it as room comes,
/// checking every [`UNSENT_RECHECK_MS`] while anything waits.
async fn replication_flush(node: Rc<Node>) {
    let Some(replication) = &node.replication else { return };
    loop {
        node.flush_due.notified().await;
        while replication.borrow_mut().flush_unsent() {
            glommio::timer::sleep(Duration::from_millis(UNSENT_RECHECK_MS)).await;
        }
    }
}

/// Delivers committed records to the shards whenever commits may have
/// advanced.
async fn replication_delivery(node: Rc<Node>, controls: Vec<flume::Sender<ControlRequest>>) {
    let Some(replication) = &node.replication else { return };
    loop {
        node.delivery_due.notified().await;
        crate::replication::node::deliver(replication, &controls).await;
        // A gap found: its fetch starts (module doc of `catchup`).
        if replication.borrow().catchup.open_count() > 0 {
            node.catchup_due.notify();
        }
    }
}

/// How long the catalog's apply waits before it tries an entry the admin
/// thread could not apply yet (a full disk, a shard that did not answer), in ms.
const CATALOG_RETRY_MS: u64 = 500;

/// Hands the committed catalog entries this node's catalog lacks to the
/// admin thread, which applies them in order ([`crate::admin::replicated`]),
/// whenever a round may have advanced the catalog's commit. Its own task:
/// applying a create or a delete waits for every shard, which must never
/// hold up the partitions' deliveries.
async fn replication_catalog(node: Rc<Node>, entries: flume::Sender<crate::replication::node::CatalogEntries>) {
    let Some(replication) = &node.replication else { return };
    loop {
        node.catalog_due.notified().await;
        loop {
            let Some((due, through)) = replication.borrow().catalog_due() else { break };
            let (reply, answer) = flume::bounded(1);
            let request = crate::replication::node::CatalogEntries { entries: due, through, reply };
            if entries.send_async(request).await.is_err() {
                return;
            }
            let Ok(applied) = answer.recv_async().await else { return };
            replication.borrow_mut().catalog_applied(applied);
            if applied < through {
                glommio::timer::sleep(Duration::from_millis(CATALOG_RETRY_MS)).await;
            }
        }
    }
}

/// Fetches the records of partitions behind their group's compaction
/// point from peers, and serves the peers' reads
/// ([`crate::replication::catchup`]).
async fn replication_catchup(node: Rc<Node>, controls: Vec<flume::Sender<ControlRequest>>) {
    let Some(replication) = &node.replication else { return };
    crate::replication::catchup::run(replication, &controls, &node.catchup_due, &node.delivery_due).await;
}

/// Mirrors the partitions subscribers here read and no replica here holds,
/// and serves the peers' mirror reads ([`crate::replication::mirror`]).
async fn replication_mirrors(
    node: Rc<Node>,
    controls: Vec<flume::Sender<ControlRequest>>,
    readers: flume::Receiver<crate::replication::mirror::Reader>,
) {
    let Some(replication) = &node.replication else { return };
    crate::replication::mirror::run(replication, &controls, readers, &node.mirror_due).await;
}

async fn refresh_load(node: Rc<Node>, controls: Vec<flume::Sender<ControlRequest>>) {
    loop {
        publish_load(&node, &controls).await;
        glommio::timer::sleep(Duration::from_millis(LOAD_REFRESH_MS)).await;
    }
}

/// Reads the shards' load and publishes it (when it changed).
async fn publish_load(node: &Node, controls: &[flume::Sender<ControlRequest>]) {
    if let Some(stats) = shard_stats(controls).await {
        node.membership.borrow_mut().publish_load(node.now(), LoadSummary::of(&stats));
        node.after_interaction();
    }
}

/// Every shard's stats, or `None` when one is busy or gone (the next round
/// tries again).
async fn shard_stats(controls: &[flume::Sender<ControlRequest>]) -> Option<Vec<crate::shard::metrics::ShardStats>> {
    let receivers: Vec<_> = controls
        .iter()
        .map(|control| {
            let (sender, receiver) = flume::bounded(1);
            control.try_send(ControlRequest::Stats(sender)).ok().map(|()| receiver)
        })
        .collect::<Option<_>>()?;
    let mut stats = Vec::with_capacity(receivers.len());
    for receiver in receivers {
        let timeout = async {
            glommio::timer::sleep(Duration::from_millis(SHARD_STATS_TIMEOUT_MS)).await;
            None
        };
        stats.push(futures_lite::future::or(async { receiver.recv_async().await.ok() }, timeout).await?);
    }
    Some(stats)
}

fn log_notification(notification: OwnedNotification<MemberId>) {
    match notification {
        OwnedNotification::MemberUp(member) => log::info!("cluster: member {member:?} is up"),
        OwnedNotification::MemberDown(member) => log::info!("cluster: member {member:?} is down"),
        OwnedNotification::Rename(before, after) => {
            log::info!("cluster: member {before:?} is now {after:?} (restarted)")
        }
        OwnedNotification::Active => log::info!("cluster: joined (another member knows this node)"),
        OwnedNotification::Idle => log::warn!("cluster: no other member is alive"),
        OwnedNotification::Defunct => log::warn!("cluster: this node was declared down"),
        OwnedNotification::Rejoin(member) => {
            log::warn!("cluster: this node was declared down while alive; rejoined as {member:?}")
        }
    }
}
