//! Records a replica's partition lacks before its group's compaction point,
//! fetched from a peer's partition log ([`crate::replication::node`],
//! "Compaction and snapshots").
//!
//! A replica that installs a Raft snapshot (it was down while the others
//! compacted, or it joined a compacted group) learns the partition offset
//! after the snapshot's point, but not the records before it: they are in
//! no Raft entry any more, only in the other replicas' partition logs. Its
//! delivery finds the partition ending before that offset (the gap) and
//! opens a fetch here; this module then reads the missing records
//! `[partition end, snapshot offset)` from a peer, in chunks, and hands
//! each chunk to the local shard as a delivery ([`CommittedRecords`]) with
//! the offset its first record takes, so the records keep their offsets
//! (identical on every replica) and a chunk that arrives twice appends
//! nothing twice. Once the partition reaches the snapshot's offset the gap
//! is closed and the normal delivery of committed entries goes on.
//!
//! # The exchange
//!
//! - The fetching node sends [`Channel::GapRead`] (group, request id, from
//!   offset, below offset) to one replica: the group's leader first, then
//!   the other voters and learners in turn. At most [`GAP_FETCHES_MAX`]
//!   groups fetch at once, each with one request outstanding.
//! - The peer reads its partition's log on the shard that owns it
//!   ([`GapRead`], answered by [`crate::shard::gap_read`]): at most
//!   [`GAP_CHUNK_BYTES_MAX`] of records (but at least one), from the tail
//!   cache or the segment files, never past its visible offset or `below`.
//!   At most [`GAP_SERVES_MAX`] such reads run at once on a node; a request
//!   past that is answered "unavailable" at once.
//! - It answers [`Channel::GapRecords`]: the records and the offset of the
//!   first, or that its log no longer has `from` (retention deleted it:
//!   logged once per episode and counted as
//!   `spate_raft_gap_peer_lacked_total`), or that it cannot serve now.
//! - A request with no answer within [`GAP_REQUEST_TIMEOUT_MS`] (the peer
//!   died, the message was lost), or a negative answer, moves on to the
//!   next replica after a backoff ([`GAP_BACKOFF_MS_MIN`] doubling to
//!   [`GAP_BACKOFF_MS_MAX`]); fetching goes on until the gap closes or the
//!   group is no longer held here.
//!
//! # Memory
//!
//! Every buffer is bounded: the messages waiting for this module
//! ([`GAP_INBOX_MAX`], each within the transport's window); per read being
//! served, one disk read ([`crate::shard::gap_read::DISK_READ_BYTES_MAX`])
//! and three copies of a chunk (the records read from the files, the
//! shard's answer, the reply's payload; each at most a transport frame);
//! and the chunk being appended here (a slice of its message, held while
//! its shard appends it; counted as two frames, an upper bound): the
//! memory formula's "replication: gap fetches" line ([`GAP_MEMORY_BYTES`]).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::cluster::NodeId;
use crate::config::TRANSPORT_FRAME_BYTES_MAX;
use crate::replication::GroupId;
use crate::replication::node::ReplicationNode;
use crate::runtime::log;
use crate::runtime::notify::Notify;
use crate::shard::control::ControlRequest;
use crate::transport::{Channel, Inbound};

/// Bytes of records in one [`Channel::GapRecords`] answer (at least one
/// record however large, so it is at most this plus one record, which fits
/// a transport frame as every proposal does).
pub const GAP_CHUNK_BYTES_MAX: usize = 1 << 20;
/// Groups fetching records for a gap at once; the others wait their turn.
pub const GAP_FETCHES_MAX: usize = 2;
/// Reads for peers' gaps a node serves at once.
pub const GAP_SERVES_MAX: usize = 2;
/// Gap messages (requests and answers) waiting for this module; past it a
/// message is dropped (its sender times out and asks again).
pub const GAP_INBOX_MAX: usize = 64;
/// How long a request may wait for its answer before the next replica is
/// asked, in ms.
pub const GAP_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// The backoff after a failed request, doubling per failure up to
/// [`GAP_BACKOFF_MS_MAX`], in ms.
pub const GAP_BACKOFF_MS_MIN: u64 = 100;
pub const GAP_BACKOFF_MS_MAX: u64 = 5_000;
/// How often open fetches are looked at without any message, in ms (a
/// node with none sleeps until a message or the delivery wakes it).
const GAP_TICK_MS: u64 = 100;
/// How long a peer's read may take on its shard, in ms.
const GAP_READ_TIMEOUT_MS: u64 = 5_000;

/// The memory the gap fetches of a node may hold: per read served, a disk
/// read and three chunks (each at most a transport frame); the chunk being
/// appended, counted as two frames. (The messages waiting are within the
/// transport's windows, counted there.)
pub const GAP_MEMORY_BYTES: usize = GAP_SERVES_MAX
    * (crate::shard::gap_read::DISK_READ_BYTES_MAX + 3 * TRANSPORT_FRAME_BYTES_MAX)
    + 2 * TRANSPORT_FRAME_BYTES_MAX;

const _: () = assert!(GAP_CHUNK_BYTES_MAX + ANSWER_HEADER_BYTES <= TRANSPORT_FRAME_BYTES_MAX);

/// A shard's read of a partition's log for a peer's gap: the records from
/// `from_offset` on, below `below`, at most `bytes_max` of them (at least
/// one when there is one).
pub struct GapRead {
    /// The global partition id.
    pub partition: u32,
    pub from_offset: u64,
    pub below: u64,
    pub bytes_max: usize,
    /// How long the shard may wait, in ms, for a record at `from_offset`
    /// to become readable when there is none yet (a mirror's long poll,
    /// [`crate::replication::mirror`]); 0 answers at once.
    pub wait_ms: u64,
    /// Whether the read may go to the segment files; if not, a read that
    /// needs them is answered [`GapReadAnswer::NeedsFiles`].
    pub files: bool,
    pub reply: flume::Sender<GapReadAnswer>,
}

/// A shard's answer to a [`GapRead`].
#[derive(Debug, PartialEq, Eq)]
pub enum GapReadAnswer {
    /// The shard does not own the partition.
    NotOwned,
    /// The log starts after `from_offset` (retention deleted it).
    Lacks { earliest: u64 },
    /// Records in log format, back to back, the first at `from_offset`;
    /// none when the log has nothing readable there yet.
    Records { record_count: u32, records: Vec<u8> },
    /// The records at `from_offset` are only in the segment files, and the
    /// read was not allowed there ([`GapRead::files`]).
    NeedsFiles,
}

/// The gap fetch counters (`/metrics`, `GET /cluster`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GapStats {
    /// Records fetched from peers and appended for gaps.
    pub records_fetched: u64,
    /// Their bytes (log format).
    pub bytes_fetched: u64,
    /// Answers that the peer's log no longer has the records (retention).
    pub peer_lacked: u64,
    /// Requests that failed otherwise: timed out, unavailable, unreachable.
    pub request_failures: u64,
    /// Gaps closed by fetching.
    pub gaps_closed: u64,
    /// Reads served for peers' gaps.
    pub reads_served: u64,
}

/// One group's fetch.
struct Fetch {
    /// The global partition id.
    partition: u32,
    /// Where the local partition ends, as last learnt.
    end_offset: u64,
    /// The offset the partition must reach: the group's compaction point.
    needed: u64,
    /// Failures in a row: the backoff's exponent.
    failures: u32,
    /// Which replica to ask next (an index into the group's replicas).
    turn: usize,
    outstanding: Option<Outstanding>,
    retry_at: Instant,
}

struct Outstanding {
    id: u64,
    peer: NodeId,
    since: Instant,
}

/// The gap fetches of a node and the reads it serves for its peers.
pub struct Catchup {
    fetches: HashMap<GroupId, Fetch>,
    /// Groups with a gap waiting for a free fetch slot, oldest first.
    waiting: VecDeque<(GroupId, u32, u64, u64)>,
    inbox: VecDeque<Inbound>,
    /// Reads being served for peers (shared with their tasks).
    serving: Rc<Cell<usize>>,
    next_request: u64,
    pub stats: GapStats,
    lacked: log::Episode,
}

impl Default for Catchup {
    fn default() -> Catchup {
        Catchup {
            fetches: HashMap::new(),
            waiting: VecDeque::new(),
            inbox: VecDeque::new(),
            serving: Rc::new(Cell::new(0)),
            next_request: 1,
            stats: GapStats::default(),
            lacked: log::Episode::new("peers lacking the records of a gap"),
        }
    }
}

impl Catchup {
    /// The partition of `group` ends at `end_offset`, before its group's
    /// compaction point `needed`: fetch the records in between (the
    /// delivery found it; module doc).
    pub fn open(&mut self, group: GroupId, partition: u32, end_offset: u64, needed: u64) {
        if let Some(fetch) = self.fetches.get_mut(&group) {
            fetch.end_offset = fetch.end_offset.max(end_offset);
            fetch.needed = needed;
            return;
        }
        if let Some(waiting) = self.waiting.iter_mut().find(|waiting| waiting.0 == group) {
            *waiting = (group, partition, end_offset, needed);
            return;
        }
        // At most one entry per group this node holds.
        self.waiting.push_back((group, partition, end_offset, needed));
    }

    /// The gap of `group` is closed (the delivery found the partition at
    /// or past the compaction point).
    pub fn close(&mut self, group: GroupId) {
        self.fetches.remove(&group);
        self.waiting.retain(|waiting| waiting.0 != group);
    }

    /// A [`Channel::GapRead`] or [`Channel::GapRecords`] from a peer, for
    /// [`run`]; dropped past [`GAP_INBOX_MAX`] (its sender asks again).
    pub fn receive(&mut self, inbound: Inbound) {
        if self.inbox.len() < GAP_INBOX_MAX {
            self.inbox.push_back(inbound);
        }
    }

    /// The reads being served for peers' gaps: a mirror's read that needs
    /// the segment files takes one of their [`GAP_SERVES_MAX`] places
    /// ([`crate::replication::mirror`]).
    pub(crate) fn serving(&self) -> Rc<Cell<usize>> {
        self.serving.clone()
    }

    /// Groups whose partition waits for a gap's records now.
    pub fn open_count(&self) -> usize {
        self.fetches.len() + self.waiting.len()
    }

    /// Takes the next request id.
    fn request_id(&mut self) -> u64 {
        let id = self.next_request;
        self.next_request += 1;
        id
    }

    /// A request of `group` failed: the next replica is asked after the
    /// backoff.
    fn failed(&mut self, group: GroupId) {
        self.stats.request_failures += 1;
        let Some(fetch) = self.fetches.get_mut(&group) else { return };
        fetch.outstanding = None;
        fetch.turn += 1;
        fetch.failures = fetch.failures.saturating_add(1);
        fetch.retry_at = Instant::now() + backoff(fetch.failures, GAP_BACKOFF_MS_MIN, GAP_BACKOFF_MS_MAX);
    }
}

/// A [`Channel::GapRead`]'s payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadRequest {
    pub group: GroupId,
    pub id: u64,
    pub from_offset: u64,
    pub below: u64,
}

const REQUEST_BYTES: usize = 32;

impl ReadRequest {
    pub fn encode(&self) -> Bytes {
        let mut payload = Vec::with_capacity(REQUEST_BYTES);
        payload.extend_from_slice(&self.group.stream_id.to_le_bytes());
        payload.extend_from_slice(&self.group.partition.to_le_bytes());
        payload.extend_from_slice(&self.id.to_le_bytes());
        payload.extend_from_slice(&self.from_offset.to_le_bytes());
        payload.extend_from_slice(&self.below.to_le_bytes());
        Bytes::from(payload)
    }

    /// The answer to this request (a [`Channel::GapRecords`], also what a
    /// [`Channel::MirrorRecords`] carries) from what the shard's read gave:
    /// "unavailable" when it gave nothing usable (`None`: no shard answered).
    pub fn answer(&self, read: Option<&GapReadAnswer>) -> Bytes {
        let (status, earliest, record_count, records) = match read {
            Some(GapReadAnswer::Records { record_count, records }) => (Status::Records, 0, *record_count, &records[..]),
            Some(GapReadAnswer::Lacks { earliest }) => (Status::Lacks, *earliest, 0, &[][..]),
            Some(GapReadAnswer::NotOwned | GapReadAnswer::NeedsFiles) | None => (Status::Unavailable, 0, 0, &[][..]),
        };
        let answer = Answer {
            group: self.group,
            id: self.id,
            status,
            first_offset: self.from_offset,
            earliest,
            record_count,
            records,
        };
        answer.encode()
    }

    pub fn decode(payload: &[u8]) -> Option<ReadRequest> {
        let group = GroupId { stream_id: u32_at(payload, 0)?, partition: u32_at(payload, 4)? };
        Some(ReadRequest {
            group,
            id: u64_at(payload, 8)?,
            from_offset: u64_at(payload, 16)?,
            below: u64_at(payload, 24)?,
        })
    }
}

/// What a [`Channel::GapRecords`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// Records follow (none: the peer has nothing there yet).
    Records = 0,
    /// The peer's log starts at `earliest`, after the requested offset.
    Lacks = 1,
    /// The peer cannot serve now (no such partition, busy, its shard did
    /// not answer).
    Unavailable = 2,
}

/// A [`Channel::GapRecords`]'s header: group, request id, status, first
/// offset, earliest, record count; the records follow.
pub(crate) const ANSWER_HEADER_BYTES: usize = 37;

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Answer<'a> {
    pub group: GroupId,
    pub id: u64,
    pub status: Status,
    pub first_offset: u64,
    pub earliest: u64,
    pub record_count: u32,
    pub records: &'a [u8],
}

impl Answer<'_> {
    pub fn encode(&self) -> Bytes {
        let mut payload = Vec::with_capacity(ANSWER_HEADER_BYTES + self.records.len());
        payload.extend_from_slice(&self.group.stream_id.to_le_bytes());
        payload.extend_from_slice(&self.group.partition.to_le_bytes());
        payload.extend_from_slice(&self.id.to_le_bytes());
        payload.push(self.status as u8);
        payload.extend_from_slice(&self.first_offset.to_le_bytes());
        payload.extend_from_slice(&self.earliest.to_le_bytes());
        payload.extend_from_slice(&self.record_count.to_le_bytes());
        payload.extend_from_slice(self.records);
        Bytes::from(payload)
    }

    pub fn decode(payload: &[u8]) -> Option<Answer<'_>> {
        let status = match *payload.get(16)? {
            0 => Status::Records,
            1 => Status::Lacks,
            2 => Status::Unavailable,
            _ => return None,
        };
        Some(Answer {
            group: GroupId { stream_id: u32_at(payload, 0)?, partition: u32_at(payload, 4)? },
            id: u64_at(payload, 8)?,
            status,
            first_offset: u64_at(payload, 17)?,
            earliest: u64_at(payload, 25)?,
            record_count: u32_at(payload, 33)?,
            records: payload.get(ANSWER_HEADER_BYTES..)?,
        })
    }
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Runs the gap fetches and serves the peers' reads: woken by `due` (a gap
/// message came, or the delivery found a gap) and every [`GAP_TICK_MS`]
/// while a fetch is open, so an idle node does not wake for it;
/// `delivery_due` is notified once a gap closes, so the delivery goes on
/// at once.
pub async fn run(
    node: &RefCell<ReplicationNode>,
    controls: &[flume::Sender<ControlRequest>],
    due: &Notify,
    delivery_due: &Notify,
) {
    loop {
        if node.borrow().catchup.open_count() > 0 {
            let tick = glommio::timer::sleep(Duration::from_millis(GAP_TICK_MS));
            futures_lite::future::or(due.notified(), tick).await;
        } else {
            due.notified().await;
        }
        loop {
            let Some(inbound) = node.borrow_mut().catchup.inbox.pop_front() else { break };
            let closed = match Channel::from_u8(inbound.channel) {
                Some(Channel::GapRead) => {
                    serve(node, controls, &inbound);
                    false
                }
                Some(Channel::GapRecords) => receive_records(node, controls, &inbound).await,
                _ => false,
            };
            if closed {
                delivery_due.notify();
            }
        }
        start_requests(&mut node.borrow_mut());
    }
}

/// Serves a peer's [`Channel::GapRead`] in a task of its own (at most
/// [`GAP_SERVES_MAX`] at once; past it the peer is told at once).
fn serve(node: &RefCell<ReplicationNode>, controls: &[flume::Sender<ControlRequest>], inbound: &Inbound) {
    let Some(request) = ReadRequest::decode(&inbound.payload) else { return };
    let mut state = node.borrow_mut();
    let partition = state.partition_of(request.group);
    let transport = state.transport_handle();
    let serving = state.catchup.serving.clone();
    let peer = inbound.from;
    let Some(partition) = partition.filter(|_| serving.get() < GAP_SERVES_MAX) else {
        // Lost: the peer times out and asks again.
        let _ = transport.try_send(peer, Channel::GapRecords, request.answer(None));
        return;
    };
    state.catchup.stats.reads_served += 1;
    drop(state);
    serving.set(serving.get() + 1);
    let controls = controls.to_vec();
    glommio::spawn_local(async move {
        let read = OwnerRead { partition, request, bytes_max: GAP_CHUNK_BYTES_MAX, wait_ms: 0, files: true };
        let answer = read_from_owner(&controls, read).await;
        let payload = request.answer(answer.as_ref());
        drop(answer);
        send_answer(&transport, peer, Channel::GapRecords, payload, GAP_REQUEST_TIMEOUT_MS).await;
        serving.set(serving.get() - 1);
    })
    .detach();
}

/// Sends a peer the answer to its read, waiting for room in its queue
/// (its backpressure) at most `limit_ms`: past it the peer asks again.
pub(crate) async fn send_answer(
    transport: &crate::transport::TransportHandle,
    peer: NodeId,
    channel: Channel,
    payload: Bytes,
    limit_ms: u64,
) {
    let send = async { transport.send(peer, channel, payload).await.is_ok() };
    let timeout = async {
        glommio::timer::sleep(Duration::from_millis(limit_ms)).await;
        false
    };
    futures_lite::future::or(send, timeout).await;
}

/// The wait after `failures` failed requests in a row: `min_ms` doubling
/// per failure, at most `max_ms`.
pub(crate) fn backoff(failures: u32, min_ms: u64, max_ms: u64) -> Duration {
    Duration::from_millis(min_ms.saturating_mul(1 << failures.min(16)).min(max_ms))
}

/// A read of a peer's request on the shard owning the partition.
#[derive(Clone, Copy)]
pub(crate) struct OwnerRead {
    /// The global partition id.
    pub partition: u32,
    pub request: ReadRequest,
    pub bytes_max: usize,
    pub wait_ms: u64,
    pub files: bool,
}

/// Reads a peer's records on the shard owning the partition, trying every
/// shard (it may have moved); `None` when none answered.
pub(crate) async fn read_from_owner(
    controls: &[flume::Sender<ControlRequest>],
    read: OwnerRead,
) -> Option<GapReadAnswer> {
    for control in controls {
        let (reply, answer) = flume::bounded(1);
        let request = GapRead {
            partition: read.partition,
            from_offset: read.request.from_offset,
            below: read.request.below,
            bytes_max: read.bytes_max,
            wait_ms: read.wait_ms,
            files: read.files,
            reply,
        };
        control.send_async(ControlRequest::GapRead(request)).await.ok()?;
        let timeout = async {
            glommio::timer::sleep(Duration::from_millis(GAP_READ_TIMEOUT_MS + read.wait_ms)).await;
            Err(flume::RecvError::Disconnected)
        };
        match futures_lite::future::or(answer.recv_async(), timeout).await {
            Ok(GapReadAnswer::NotOwned) | Err(_) => continue,
            Ok(answer) => return Some(answer),
        }
    }
    None
}

/// A peer's [`Channel::GapRecords`]: appends its records to the local
/// partition; returns whether the gap closed.
async fn receive_records(
    node: &RefCell<ReplicationNode>,
    controls: &[flume::Sender<ControlRequest>],
    inbound: &Inbound,
) -> bool {
    let Some(answer) = Answer::decode(&inbound.payload) else { return false };
    let group = answer.group;
    let partition = {
        let mut state = node.borrow_mut();
        let catchup = &mut state.catchup;
        let Some(fetch) = catchup.fetches.get(&group) else { return false };
        if fetch.outstanding.as_ref().is_none_or(|outstanding| outstanding.id != answer.id) {
            return false; // A late answer to a request given up on.
        }
        let partition = fetch.partition;
        match answer.status {
            Status::Records if answer.record_count > 0 => {}
            Status::Lacks => {
                let peer = inbound.from;
                catchup.stats.peer_lacked += 1;
                catchup.lacked.occur(
                    Instant::now(),
                    log::Level::Warn,
                    log::Scope::process(),
                    format_args!(
                        "replication: partition {partition} needs records from offset {} on from a peer, but node \
                         {peer}'s log of it starts at {} (retention deleted them); asking the other replicas",
                        answer.first_offset, answer.earliest
                    ),
                );
                catchup.failed(group);
                return false;
            }
            _ => {
                catchup.failed(group);
                return false;
            }
        }
        partition
    };
    // The chunk's records as they came, no copy (the delivery takes Bytes).
    let records = inbound.payload.slice(ANSWER_HEADER_BYTES..);
    let bytes = records.len() as u64;
    let end = crate::replication::node::ask_owner(node, controls, group, partition, answer.first_offset, records).await;
    let mut state = node.borrow_mut();
    let needed = state.gap_needed(group);
    let catchup = &mut state.catchup;
    let Some(fetch) = catchup.fetches.get_mut(&group) else { return false };
    fetch.outstanding = None;
    let Some(end) = end else {
        catchup.failed(group);
        return false;
    };
    catchup.stats.records_fetched += u64::from(answer.record_count);
    catchup.stats.bytes_fetched += bytes;
    fetch.end_offset = end.end_offset;
    fetch.failures = 0;
    if let Some(needed) = needed {
        fetch.needed = needed;
    }
    if needed.is_some_and(|needed| end.end_offset < needed) {
        return false;
    }
    catchup.stats.gaps_closed += 1;
    catchup.close(group);
    state.gap_filled(group);
    log::info!(
        "replication: partition {partition} fetched the records of its gap from peers, up to offset {}",
        end.end_offset
    );
    true
}

/// Gives free fetch slots to waiting gaps, gives up requests that timed
/// out, and sends the next request of every fetch that has none.
fn start_requests(state: &mut ReplicationNode) {
    let now = Instant::now();
    while state.catchup.fetches.len() < GAP_FETCHES_MAX
        && let Some((group, partition, end_offset, needed)) = state.catchup.waiting.pop_front()
    {
        let fetch = Fetch { partition, end_offset, needed, failures: 0, turn: 0, outstanding: None, retry_at: now };
        state.catchup.fetches.insert(group, fetch);
    }
    let groups: Vec<GroupId> = state.catchup.fetches.keys().copied().collect();
    for group in groups {
        let sources = state.gap_sources(group);
        let Some(fetch) = state.catchup.fetches.get(&group) else { continue };
        if sources.is_empty() {
            // No longer held here (its gap with it), or no other replica
            // known yet.
            if state.host.status(group).is_none() {
                state.catchup.close(group);
                state.gap_filled(group);
            }
            continue;
        }
        if let Some(outstanding) = &fetch.outstanding {
            if now.duration_since(outstanding.since) >= Duration::from_millis(GAP_REQUEST_TIMEOUT_MS) {
                log::info!(
                    "replication: a gap read of partition {} from node {} had no answer within {GAP_REQUEST_TIMEOUT_MS} ms; asking the next replica",
                    fetch.partition,
                    outstanding.peer
                );
                state.catchup.failed(group);
            }
            continue;
        }
        if now < fetch.retry_at {
            continue;
        }
        let peer = sources[fetch.turn % sources.len()];
        let (from_offset, below) = (fetch.end_offset, fetch.needed);
        let id = state.catchup.request_id();
        let request = ReadRequest { group, id, from_offset, below };
        if state.transport_handle().try_send(peer, Channel::GapRead, request.encode()).is_err() {
            state.catchup.failed(group);
            continue;
        }
        if let Some(fetch) = state.catchup.fetches.get_mut(&group) {
            fetch.outstanding = Some(Outstanding { id, peer, since: now });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read request and an answer read back as they were written, and a
    /// short or unknown payload is refused, never a panic.
    #[test]
    fn messages_round_trip_and_bad_ones_are_refused() {
        let group = GroupId { stream_id: 0xdead_beef, partition: 7 };
        let request = ReadRequest { group, id: 42, from_offset: 1000, below: 5000 };
        let encoded = request.encode();
        assert_eq!(encoded.len(), REQUEST_BYTES);
        assert_eq!(ReadRequest::decode(&encoded), Some(request));
        assert_eq!(ReadRequest::decode(&encoded[..REQUEST_BYTES - 1]), None);
        let answer = Answer {
            group,
            id: 42,
            status: Status::Lacks,
            first_offset: 1000,
            earliest: 3000,
            record_count: 2,
            records: b"abc",
        };
        let encoded = answer.encode();
        assert_eq!(encoded.len(), ANSWER_HEADER_BYTES + 3);
        assert_eq!(Answer::decode(&encoded), Some(answer));
        assert_eq!(Answer::decode(&encoded[..ANSWER_HEADER_BYTES - 1]), None);
        let mut unknown = encoded.to_vec();
        unknown[16] = 9;
        assert_eq!(Answer::decode(&unknown), None);
    }

    /// A failed request moves to the next replica and backs off, doubling
    /// up to the bound; a gap reopened while fetching keeps one fetch.
    #[test]
    fn failures_rotate_and_back_off_within_the_bound() {
        let group = GroupId { stream_id: 1, partition: 0 };
        let mut catchup = Catchup::default();
        catchup.open(group, 3, 10, 100);
        catchup.open(group, 3, 12, 100);
        assert_eq!(catchup.open_count(), 1, "one entry per group");
        let (_, partition, end, needed) = catchup.waiting[0];
        let now = Instant::now();
        let fetch =
            Fetch { partition, end_offset: end, needed, failures: 0, turn: 0, outstanding: None, retry_at: now };
        catchup.waiting.clear();
        catchup.fetches.insert(group, fetch);
        for _ in 0..40 {
            catchup.failed(group);
        }
        let fetch = &catchup.fetches[&group];
        assert_eq!(fetch.turn, 40);
        let wait = fetch.retry_at.duration_since(now);
        assert!(wait <= Duration::from_millis(GAP_BACKOFF_MS_MAX + 100), "{wait:?}");
        assert!(wait >= Duration::from_millis(GAP_BACKOFF_MS_MAX), "{wait:?}");
        catchup.close(group);
        assert_eq!(catchup.open_count(), 0);
    }
}
