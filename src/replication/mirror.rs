//! Subscribers on a node that holds no replica of a partition: the node
//! mirrors the partition's committed log from a replica into its own
//! partition log, so its subscribers read it there as any other.
//!
//! A replicated partition lives on its replicas only (a stream's
//! replication factor is below the node count, or a join moved the
//! partition's replicas away from this node). A subscriber may still
//! connect to any node, and one that was reading a partition when its
//! node stopped being a replica must not stop receiving it.
//!
//! # How
//!
//! - **Readers.** A shard says which replicated partitions its parked
//!   fetches wait on ([`Reader`], at most once per [`READER_NOTE_MS`] per
//!   partition, and again on every gossip tick while they wait, so at least
//!   once a second). The cluster thread mirrors each such partition of
//!   which this node holds no replica, until no reader has been said for
//!   [`READER_TTL_MS`] (or the node becomes a replica: Raft delivers it
//!   then).
//! - **The long poll.** A mirror asks one replica at a time for the records
//!   from its partition's end on ([`Channel::MirrorRead`]: the group's
//!   leader as last named, then the placement's replicas in turn). The
//!   replica, if it is a voter of the group, reads its partition log on
//!   the shard that owns it: at once when it has records there, else the
//!   read waits on that shard, holding no buffer, until some are readable
//!   or [`MIRROR_WAIT_MS`] passed. It answers with at most
//!   [`MIRROR_CHUNK_BYTES`] of records (at least one) cut at its visible
//!   offset, so only committed records, at the offsets every replica gives
//!   them ([`Channel::MirrorRecords`], a [`Channel::GapRecords`] answer).
//! - **Appending.** The chunk goes to the local shard as a delivery
//!   ([`crate::replication::node::ask_owner`]) at the offset of its first
//!   record: the shard appends only what it lacks, so a chunk that comes
//!   twice, or a mirror that overlaps a Raft delivery once the node is a
//!   replica again, stores nothing twice. The local log is therefore
//!   always a prefix of the committed log, at its offsets; its subscribers
//!   are served by the ordinary fetch path.
//! - **Pace.** After a chunk that was not full the next request waits
//!   [`MIRROR_PACE_MS`], so a busy partition costs at most a couple of
//!   hundred requests a second, each carrying what accumulated; an empty
//!   long poll asks the next replica (the last one may have stopped being
//!   a replica). A failed request (no answer within
//!   [`MIRROR_REQUEST_TIMEOUT_MS`], a refusal) moves to the next replica
//!   after a backoff ([`BACKOFF_MS_MIN`] doubling to [`BACKOFF_MS_MAX`]).
//!
//! # What it costs and what it does not do
//!
//! Mirroring stores the partition on the mirroring node too (it is a
//! cache: retention applies, it is never a replica and never acknowledges
//! anything). A gap the source's retention already deleted is counted,
//! logged and asked of the other replicas, never skipped.
//!
//! # Where `latest` is
//!
//! The local copy of a partition this node holds no replica of ends where
//! its mirror got to, which may be far behind (or nothing, before any
//! subscriber asked for it). So the cluster thread tells every shard, on
//! each Raft tick when it changed, the replicated partitions this node
//! holds no replica of and which of them have a mirror that caught up
//! ([`MirrorView`]: its last answer reached the replica's visible end).
//! A fetch at `latest`, or at an offset past the local copy, on such a
//! partition without a caught-up mirror leaves that cursor unresolved and
//! parks ([`crate::partition::fetch::serve_fetch_with`]), which says it
//! has a reader, so the mirror starts; once the view says caught up the
//! parked fetches are served again and `latest` resolves to the copy's
//! end, then within [`MIRROR_PACE_MS`] and a round trip of the
//! partition's. An offset still past it then is refused as on any node.
//! Until the first view after a start (one Raft tick) the local copy
//! counts as the partition.
//!
//! # Memory
//!
//! A mirror is a few dozen bytes of state; the messages waiting here are
//! at most [`MIRROR_INBOX_MAX`] (within the transport's windows). A node
//! serves at most [`MIRROR_SERVES_MAX`] reads for peers at once; a waiting
//! read holds no buffer, an answered one holds its records twice (the
//! shard's answer and the message), at most a chunk plus one record each;
//! a read that must go to the segment files takes one of the gap reads'
//! places ([`crate::replication::catchup::GAP_SERVES_MAX`]) or is refused.
//! The memory formula's "replication: mirrors" line.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::cluster::NodeId;
use crate::replication::GroupId;
use crate::replication::catchup::{
    ANSWER_HEADER_BYTES, Answer, GAP_SERVES_MAX, GapReadAnswer, OwnerRead, ReadRequest, Status, backoff,
    read_from_owner, send_answer,
};
use crate::replication::node::{ReplicationNode, ask_owner};
use crate::runtime::log;
use crate::runtime::notify::Notify;
use crate::shard::control::ControlRequest;
use crate::transport::{Channel, Inbound};

/// How often a shard says a partition has readers, at most, in ms.
pub const READER_NOTE_MS: u64 = 1_000;
/// How long a mirror lasts after its partition's readers were last said,
/// in ms: well past a shard's slowest gossip tick, which says them again.
pub const READER_TTL_MS: u64 = 20_000;
const _: () = assert!(READER_TTL_MS >= 4 * crate::shard::balancer::GOSSIP_IDLE_INTERVAL_MS);
/// Readers said by the shards and not yet taken by the cluster thread;
/// past it one is dropped (said again a second later).
pub const READERS_QUEUE_MAX: usize = 1024;
/// Bytes of records in one answer (at least one record however large).
pub const MIRROR_CHUNK_BYTES: usize = 64 << 10;
/// How long a replica holds a read that finds nothing yet, in ms.
pub const MIRROR_WAIT_MS: u64 = 1_000;
/// How long a request may go unanswered, in ms: the wait, the read and the
/// way back.
pub const MIRROR_REQUEST_TIMEOUT_MS: u64 = MIRROR_WAIT_MS + 4_000;
/// Reads a node serves for peers' mirrors at once.
pub const MIRROR_SERVES_MAX: usize = 32;
/// Mirror messages waiting for the cluster thread; past it one is dropped
/// (its sender times out and asks again).
pub const MIRROR_INBOX_MAX: usize = 256;
/// The wait after a chunk that was not full, in ms.
pub const MIRROR_PACE_MS: u64 = 5;
/// The backoff after a failed request, doubling up to the maximum, in ms.
pub const BACKOFF_MS_MIN: u64 = 20;
pub const BACKOFF_MS_MAX: u64 = 2_000;
/// The least wait between two looks at the mirrors without any message,
/// in ms (they are looked at when the soonest of them is due: a request
/// to send or to give up on, a mirror no longer wanted).
const MIRROR_TICK_MS_MIN: u64 = 1;

/// The most the reads served for peers' mirrors hold at once, with records
/// of at most `record_bytes_max` (`--line-size-max`).
pub fn memory_bytes(record_bytes_max: usize) -> usize {
    MIRROR_SERVES_MAX * 2 * (MIRROR_CHUNK_BYTES + record_bytes_max + ANSWER_HEADER_BYTES)
}

/// What every shard knows of the mirrors (module doc, "Where `latest`
/// is"): the replicated partitions (global ids) this node holds no replica
/// of, and those of them whose mirror has caught up with a replica; both
/// sorted. At most 8 bytes per partition, in one copy the shards share and
/// one the cluster thread keeps to compare (the memory formula's
/// per-partition terms are kibibytes and more).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MirrorView {
    pub unheld: Vec<u32>,
    pub caught_up: Vec<u32>,
}

impl MirrorView {
    /// Whether this node holds no replica of `partition` and has no mirror
    /// of it caught up: its local copy may end before the partition.
    pub fn awaits(&self, partition: u32) -> bool {
        self.unheld.binary_search(&partition).is_ok() && self.caught_up.binary_search(&partition).is_err()
    }
}

/// The view of this node's mirrors as of now ([`MirrorView`]).
pub fn view(state: &ReplicationNode) -> MirrorView {
    let unheld = state.unheld_partitions();
    let mut caught_up: Vec<u32> =
        state.mirrors.mirrors.values().filter(|mirror| mirror.caught_up).map(|mirror| mirror.partition).collect();
    caught_up.sort_unstable();
    MirrorView { unheld, caught_up }
}

/// A shard's subscribers wait on `partition`, of the replicated `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reader {
    pub group: GroupId,
    /// The global partition id.
    pub partition: u32,
}

/// The mirror counters (`/metrics`, `GET /cluster`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MirrorStats {
    /// Partitions mirrored now.
    pub open: u64,
    /// Records fetched from replicas and appended here, and their bytes.
    pub records: u64,
    pub bytes: u64,
    /// Requests sent; those that failed (timed out, refused, unreachable).
    pub requests: u64,
    pub request_failures: u64,
    /// Answers that the replica's log no longer has the records.
    pub peer_lacked: u64,
    /// Reads served for peers' mirrors.
    pub reads_served: u64,
}

struct Mirror {
    /// The global partition id.
    partition: u32,
    /// Where the local partition ends, once learnt.
    end_offset: Option<u64>,
    wanted_until: Instant,
    failures: u32,
    /// Which source to ask next (an index into the sources).
    turn: usize,
    outstanding: Option<(u64, NodeId, Instant)>,
    next_at: Instant,
    /// The last answer reached the replica's visible end (a chunk that was
    /// not full, or a long poll that found nothing new): the local copy
    /// ends where the partition does, give or take the pace.
    caught_up: bool,
}

/// The mirrors of a node and the reads it serves for its peers' mirrors.
pub struct Mirrors {
    mirrors: HashMap<GroupId, Mirror>,
    inbox: VecDeque<Inbound>,
    serving: Rc<Cell<usize>>,
    next_request: u64,
    /// When the soonest mirror is due (`None`: no mirror is open).
    next_due: Option<Instant>,
    stats: MirrorStats,
    lacked: log::Episode,
}

impl Default for Mirrors {
    fn default() -> Mirrors {
        Mirrors {
            mirrors: HashMap::new(),
            inbox: VecDeque::new(),
            serving: Rc::new(Cell::new(0)),
            next_request: 1,
            next_due: None,
            stats: MirrorStats::default(),
            lacked: log::Episode::new("replicas lacking the records a mirror asked for"),
        }
    }
}

impl Mirrors {
    /// A [`Channel::MirrorRead`] or [`Channel::MirrorRecords`] from a peer,
    /// for [`run`]; dropped past [`MIRROR_INBOX_MAX`].
    pub fn receive(&mut self, inbound: Inbound) {
        if self.inbox.len() < MIRROR_INBOX_MAX {
            self.inbox.push_back(inbound);
        }
    }

    pub fn stats(&self) -> MirrorStats {
        MirrorStats { open: self.mirrors.len() as u64, ..self.stats }
    }

    /// A failed request: the next source after the backoff.
    fn failed(&mut self, group: GroupId, now: Instant) {
        self.stats.request_failures += 1;
        let Some(mirror) = self.mirrors.get_mut(&group) else { return };
        mirror.outstanding = None;
        mirror.turn += 1;
        mirror.failures = mirror.failures.saturating_add(1);
        mirror.next_at = now + backoff(mirror.failures, BACKOFF_MS_MIN, BACKOFF_MS_MAX);
    }
}

/// A reader said by a shard: mirror its partition unless this node holds
/// a replica of it.
fn note(state: &mut ReplicationNode, reader: Reader, now: Instant) {
    if state.holds(reader.group) || state.partition_of(reader.group) != Some(reader.partition) {
        return;
    }
    let wanted_until = now + Duration::from_millis(READER_TTL_MS);
    let mirror = state.mirrors.mirrors.entry(reader.group).or_insert_with(|| {
        log::info!(
            "replication: partition {} has a subscriber here and no replica on this node: mirroring it from its replicas",
            reader.partition
        );
        Mirror {
            partition: reader.partition,
            end_offset: None,
            wanted_until,
            failures: 0,
            turn: 0,
            outstanding: None,
            next_at: now,
            caught_up: false,
        }
    });
    mirror.wanted_until = wanted_until;
}

/// Runs the mirrors and serves the peers' mirror reads: woken by a reader,
/// by `due` (a mirror message came) and every [`MIRROR_TICK_MS`] while a
/// mirror is open, so a node without one does not wake for it.
pub async fn run(
    node: &RefCell<ReplicationNode>,
    controls: &[flume::Sender<ControlRequest>],
    readers: flume::Receiver<Reader>,
    due: &Notify,
) {
    loop {
        let reader = async {
            match readers.recv_async().await {
                Ok(reader) => Some(reader),
                // The shards are gone (shutdown): messages only.
                Err(_) => std::future::pending().await,
            }
        };
        let message = async {
            due.notified().await;
            None
        };
        let due_at = node.borrow().mirrors.next_due;
        let first = match due_at {
            None => futures_lite::future::or(reader, message).await,
            Some(due_at) => {
                let wait =
                    due_at.saturating_duration_since(Instant::now()).max(Duration::from_millis(MIRROR_TICK_MS_MIN));
                let tick = async {
                    glommio::timer::sleep(wait).await;
                    None
                };
                futures_lite::future::or(futures_lite::future::or(reader, message), tick).await
            }
        };
        let now = Instant::now();
        {
            let mut state = node.borrow_mut();
            for reader in first.into_iter().chain(readers.try_iter()) {
                note(&mut state, reader, now);
            }
        }
        loop {
            let Some(inbound) = node.borrow_mut().mirrors.inbox.pop_front() else { break };
            match Channel::from_u8(inbound.channel) {
                Some(Channel::MirrorRead) => serve(node, controls, &inbound),
                Some(Channel::MirrorRecords) => receive_records(node, controls, &inbound).await,
                _ => {}
            }
        }
        // A new mirror first learns where its partition ends here.
        let unknown: Vec<(GroupId, u32)> = node
            .borrow()
            .mirrors
            .mirrors
            .iter()
            .filter(|(_, mirror)| mirror.end_offset.is_none())
            .map(|(group, mirror)| (*group, mirror.partition))
            .collect();
        for (group, partition) in unknown {
            let end = ask_owner(node, controls, group, partition, 0, Bytes::new()).await;
            if let (Some(end), Some(mirror)) = (end, node.borrow_mut().mirrors.mirrors.get_mut(&group)) {
                mirror.end_offset = Some(end.end_offset);
            }
        }
        start_requests(&mut node.borrow_mut());
    }
}

/// Drops the mirrors no longer wanted (or held here now), gives up the
/// requests that timed out, and sends the next request of every mirror
/// that is due.
fn start_requests(state: &mut ReplicationNode) {
    let now = Instant::now();
    send_requests(state, now);
    state.mirrors.next_due = state
        .mirrors
        .mirrors
        .values()
        .map(|mirror| match mirror.outstanding {
            Some((_, _, since)) => since + Duration::from_millis(MIRROR_REQUEST_TIMEOUT_MS),
            // Its shard did not say where the partition ends: again soon.
            None if mirror.end_offset.is_none() => now + Duration::from_millis(BACKOFF_MS_MIN),
            None => mirror.next_at.min(mirror.wanted_until),
        })
        .min();
}

fn send_requests(state: &mut ReplicationNode, now: Instant) {
    let groups: Vec<GroupId> = state.mirrors.mirrors.keys().copied().collect();
    for group in groups {
        let held = state.holds(group);
        let Some(mirror) = state.mirrors.mirrors.get(&group) else { continue };
        let idle = mirror.wanted_until <= now && mirror.outstanding.is_none();
        if held || idle || state.partition_of(group) != Some(mirror.partition) {
            let why = if held { "this node holds a replica of it now" } else { "no subscriber reads it here" };
            log::info!("replication: partition {} is no longer mirrored: {why}", mirror.partition);
            state.mirrors.mirrors.remove(&group);
            continue;
        }
        let Some(from_offset) = mirror.end_offset else { continue };
        if let Some((_, peer, since)) = mirror.outstanding {
            if now.duration_since(since) >= Duration::from_millis(MIRROR_REQUEST_TIMEOUT_MS) {
                log::info!(
                    "replication: a mirror read of partition {} from node {peer} had no answer within \
                     {MIRROR_REQUEST_TIMEOUT_MS} ms; asking the next replica",
                    mirror.partition
                );
                state.mirrors.failed(group, now);
            }
            continue;
        }
        if now < mirror.next_at {
            continue;
        }
        let turn = mirror.turn;
        let sources = state.mirror_sources(group);
        let Some(peer) = (!sources.is_empty()).then(|| sources[turn % sources.len()]) else {
            // No live replica known yet.
            state.mirrors.failed(group, now);
            continue;
        };
        let id = state.mirrors.next_request;
        state.mirrors.next_request += 1;
        let request = ReadRequest { group, id, from_offset, below: u64::MAX };
        state.mirrors.stats.requests += 1;
        if state.transport_handle().try_send(peer, Channel::MirrorRead, request.encode()).is_err() {
            state.mirrors.failed(group, now);
            continue;
        }
        if let Some(mirror) = state.mirrors.mirrors.get_mut(&group) {
            mirror.outstanding = Some((id, peer, now));
        }
    }
}

/// A replica's [`Channel::MirrorRecords`]: appends its records to the local
/// partition.
async fn receive_records(
    node: &RefCell<ReplicationNode>,
    controls: &[flume::Sender<ControlRequest>],
    inbound: &Inbound,
) {
    let Some(answer) = Answer::decode(&inbound.payload) else { return };
    let group = answer.group;
    let now = Instant::now();
    let partition = {
        let mut state = node.borrow_mut();
        let mirrors = &mut state.mirrors;
        let Some(mirror) = mirrors.mirrors.get_mut(&group) else { return };
        if mirror.outstanding.is_none_or(|(id, _, _)| id != answer.id) {
            return; // A late answer to a request given up on.
        }
        match answer.status {
            Status::Records if answer.record_count > 0 => mirror.partition,
            Status::Records => {
                // Nothing within the wait: ask again, the next replica (the
                // one asked may no longer be one).
                mirror.outstanding = None;
                mirror.turn += 1;
                mirror.failures = 0;
                mirror.next_at = now;
                mirror.caught_up = true;
                return;
            }
            Status::Lacks => {
                let partition = mirror.partition;
                mirrors.stats.peer_lacked += 1;
                mirrors.lacked.occur(
                    now,
                    log::Level::Warn,
                    log::Scope::process(),
                    format_args!(
                        "replication: the mirror of partition {partition} needs records from offset {} on, but \
                         node {}'s log of it starts at {} (retention deleted them); asking the other replicas",
                        answer.first_offset, inbound.from, answer.earliest
                    ),
                );
                mirrors.failed(group, now);
                return;
            }
            Status::Unavailable => {
                mirrors.failed(group, now);
                return;
            }
        }
    };
    let records = inbound.payload.slice(ANSWER_HEADER_BYTES..);
    let (bytes, full) = (records.len() as u64, records.len() >= MIRROR_CHUNK_BYTES);
    let end = ask_owner(node, controls, group, partition, answer.first_offset, records).await;
    let mut state = node.borrow_mut();
    let mirrors = &mut state.mirrors;
    let Some(mirror) = mirrors.mirrors.get_mut(&group) else { return };
    let Some(end) = end else {
        mirrors.failed(group, now);
        return;
    };
    mirror.outstanding = None;
    mirror.end_offset = Some(end.end_offset);
    mirror.failures = 0;
    mirror.caught_up = !full;
    mirror.next_at = if full { now } else { now + Duration::from_millis(MIRROR_PACE_MS) };
    mirrors.stats.records += u64::from(answer.record_count);
    mirrors.stats.bytes += bytes;
}

/// Serves a peer's [`Channel::MirrorRead`] in a task of its own, if this
/// node is a voter of the group (at most [`MIRROR_SERVES_MAX`] at once;
/// otherwise the peer is told at once and asks another replica).
fn serve(node: &RefCell<ReplicationNode>, controls: &[flume::Sender<ControlRequest>], inbound: &Inbound) {
    let Some(request) = ReadRequest::decode(&inbound.payload) else { return };
    let mut state = node.borrow_mut();
    let serving = state.mirrors.serving.clone();
    let partition = state.partition_of(request.group).filter(|_| state.is_voter(request.group));
    let transport = state.transport_handle();
    let peer = inbound.from;
    let Some(partition) = partition.filter(|_| serving.get() < MIRROR_SERVES_MAX) else {
        // Lost: the peer times out and asks again.
        let _ = transport.try_send(peer, Channel::MirrorRecords, request.answer(None));
        return;
    };
    state.mirrors.stats.reads_served += 1;
    let files = state.catchup.serving();
    drop(state);
    serving.set(serving.get() + 1);
    let controls = controls.to_vec();
    glommio::spawn_local(async move {
        let read =
            OwnerRead { partition, request, bytes_max: MIRROR_CHUNK_BYTES, wait_ms: MIRROR_WAIT_MS, files: false };
        let mut answer = read_from_owner(&controls, read).await;
        // A mirror far behind reads the segment files: in a gap read's place.
        if matches!(answer, Some(GapReadAnswer::NeedsFiles)) && files.get() < GAP_SERVES_MAX {
            files.set(files.get() + 1);
            answer = read_from_owner(&controls, OwnerRead { wait_ms: 0, files: true, ..read }).await;
            files.set(files.get() - 1);
        }
        let payload = request.answer(answer.as_ref());
        drop(answer);
        send_answer(&transport, peer, Channel::MirrorRecords, payload, MIRROR_REQUEST_TIMEOUT_MS).await;
        serving.set(serving.get() - 1);
    })
    .detach();
}
