//! A shard's side of replicated partitions ([`crate::replication::node`]
//! has the design): the records of a batch for a replicated partition are
//! proposed to its Raft group instead of appended, and the partition's log
//! takes what its group committed, delivered by the cluster thread.
//!
//! Nothing here runs for a stream with a replication factor of 1: the
//! applier checks one flag per batch ([`ShardReplication::is_active`]),
//! false unless a replicated stream exists, and the path of every other
//! batch is the one it always was.
//!
//! # Pipelining
//!
//! A commit takes a Raft round trip and two fdatasyncs, so a shard that
//! waited for each batch's commit before taking the next would store one
//! batch per commit. Instead the applier proposes each batch's replicated
//! records as soon as it takes the batch ([`submit`]) and queues the batch;
//! a completer task applies the rest of each queued batch, and returns its
//! credits (which is what `#SYNC` waits for), in arrival order once the
//! batch's proposals are committed. So up to [`INFLIGHT_BATCHES_MAX`]
//! batches per shard are in flight, and one Raft round on the cluster
//! thread (one fdatasync, one message per peer) carries many of them.
//!
//! Order: a key's records go to one partition, hence one group, and a
//! shard proposes a group's records in the order it takes the batches. The
//! cluster thread takes a (shard, group)'s proposals only in their sequence
//! ([`ProposalRequest`]): once one is refused (no leader yet),
//! the later ones in flight are refused too, and the completer, going
//! through the batches in order, proposes each again in turn, the first
//! after [`PROPOSE_RETRY_FIRST_MS`] and longer while refusals go on. The
//! applier also waits while the shard has [`PROPOSALS_OUTSTANDING_MAX`]
//! proposals in flight, so its queue to the cluster thread always has
//! room. The bytes in
//! flight are bounded by the credit windows as before (a batch's credits
//! come back only when it is applied); its replicated records are held
//! twice meanwhile, in the batch's buffer and in the proposal.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::protocol::record::BatchIter;
use crate::replication::GroupId;
use crate::replication::mirror::{MirrorView, READER_NOTE_MS, Reader};
use crate::replication::node::{CommittedRecords, PartitionEnd, ProposalRefused, ProposalRequest, append_committed};
use crate::routing::DataBatch;
use crate::runtime::log;
use crate::runtime::notify::Notify;
use crate::shard::Shard;
use crate::stream::Catalog;

/// How long a refused proposal waits before it is made again, at most, in
/// ms: the first retry comes after [`PROPOSE_RETRY_FIRST_MS`], and each
/// refusal in a row doubles the wait up to this. The completer waits for
/// the proposal at the head of the shard's queue, so a refusal during a
/// leadership move (a few ms) should not hold every batch behind it for
/// the full wait.
pub const PROPOSE_RETRY_MS: u64 = 100;
/// The first wait after a refusal, in ms ([`PROPOSE_RETRY_MS`]).
pub const PROPOSE_RETRY_FIRST_MS: u64 = 5;
/// Batches with replicated records a shard has proposed and not yet
/// applied (module doc, "Pipelining"); the applier waits past it. Their
/// bytes are within the shard's credit windows.
pub const INFLIGHT_BATCHES_MAX: usize = 256;
/// Proposals of the batches in flight per shard: a batch touching many
/// partitions makes one proposal per partition, so the batch bound alone
/// would let 256 batches of 256 partitions queue 65 536 requests. The
/// applier waits past it (unless nothing is in flight, so one batch
/// touching more partitions still goes). The queue to the cluster thread
/// holds twice this per shard ([`proposal_queue_capacity`]), so a
/// proposal is never refused for want of room.
pub const PROPOSALS_OUTSTANDING_MAX: usize = 4096;

/// Bytes of bookkeeping of one queued proposal (the request, its answer
/// channel and the shard's record of it; the records are counted in the
/// credit windows), for the memory formula.
pub const PROPOSAL_REQUEST_BYTES: usize = 256;

/// Room in the queue from the shards to the cluster thread: each
/// outstanding proposal has at most two requests in it at once (the one
/// the cluster thread has not taken yet, and the one proposed again behind
/// a refused earlier proposal of its group).
pub fn proposal_queue_capacity(shards: usize) -> usize {
    2 * shards.max(1) * PROPOSALS_OUTSTANDING_MAX
}

/// The replicated partitions of the catalog, and the way to the cluster
/// thread.
pub struct ShardReplication {
    active: Cell<bool>,
    /// The group of each global partition id that is replicated.
    groups: RefCell<Vec<Option<GroupId>>>,
    proposals: RefCell<Option<flume::Sender<ProposalRequest>>>,
    refusals: log::Episode,
    /// The next proposal's sequence of each group this shard proposed to.
    sequences: RefCell<HashMap<GroupId, u64>>,
    /// Batches waiting for their commits, in arrival order.
    inflight: RefCell<VecDeque<InFlight>>,
    /// Batches submitted and not yet applied (the queue and the one the
    /// completer holds).
    inflight_count: Cell<usize>,
    /// Proposals of the batches in flight ([`PROPOSALS_OUTSTANDING_MAX`]).
    outstanding: Cell<usize>,
    completer_running: Cell<bool>,
    /// Wakes the applier waiting for room in the queue.
    room: Notify,
    /// Where this shard says which replicated partitions its subscribers
    /// wait on (the cluster thread mirrors those of which the node holds
    /// no replica: [`crate::replication::mirror`]).
    readers: RefCell<Option<flume::Sender<Reader>>>,
    /// When each partition's readers were last said, to say it at most
    /// once per [`READER_NOTE_MS`].
    readers_noted: RefCell<HashMap<u32, Instant>>,
    /// The replicated partitions this node holds no replica of, and which
    /// of them are mirrored and caught up, as the cluster thread last said
    /// ([`ShardReplication::awaits_mirror`]).
    mirror_view: RefCell<std::sync::Arc<MirrorView>>,
}

impl Default for ShardReplication {
    fn default() -> ShardReplication {
        ShardReplication {
            active: Cell::new(false),
            groups: RefCell::default(),
            proposals: RefCell::default(),
            refusals: log::Episode::new("replicated proposals refused"),
            sequences: RefCell::default(),
            inflight: RefCell::default(),
            inflight_count: Cell::new(0),
            outstanding: Cell::new(0),
            completer_running: Cell::new(false),
            room: Notify::default(),
            readers: RefCell::default(),
            readers_noted: RefCell::default(),
            mirror_view: RefCell::default(),
        }
    }
}

impl ShardReplication {
    /// Whether any stream is replicated (then batches are looked into).
    #[inline]
    pub fn is_active(&self) -> bool {
        self.active.get()
    }

    /// Where proposals go (the cluster thread), set once at start.
    pub fn set_sender(&self, proposals: flume::Sender<ProposalRequest>) {
        *self.proposals.borrow_mut() = Some(proposals);
    }

    /// Where the partitions subscribers wait on are said, set once at start.
    pub fn set_readers(&self, readers: flume::Sender<Reader>) {
        *self.readers.borrow_mut() = Some(readers);
    }

    /// Subscribers wait on `partitions` here: says so to the cluster
    /// thread for each replicated one, at most once per
    /// [`READER_NOTE_MS`] each (a full queue drops it: said again later).
    pub fn note_readers(&self, partitions: impl FnOnce(&mut dyn FnMut(u32))) {
        if !self.is_active() {
            return;
        }
        let readers = self.readers.borrow();
        let Some(readers) = readers.as_ref() else { return };
        let now = Instant::now();
        let mut noted = self.readers_noted.borrow_mut();
        partitions(&mut |partition| {
            let Some(group) = self.group_of(partition) else { return };
            let due =
                noted.get(&partition).is_none_or(|at| now.duration_since(*at).as_millis() >= READER_NOTE_MS.into());
            if due && readers.try_send(Reader { group, partition }).is_ok() {
                noted.insert(partition, now);
            }
        });
    }

    /// Re-reads which partitions are replicated, after a catalog change.
    pub fn refresh(&self, catalog: &Catalog, partitions_max: u32) {
        let replicated: Vec<_> = catalog.streams().iter().filter(|spec| spec.is_replicated()).collect();
        let mut groups = self.groups.borrow_mut();
        groups.clear();
        if !replicated.is_empty() {
            groups.resize(partitions_max as usize, None);
            for spec in replicated {
                for local in 0..spec.partitions {
                    if let Some(slot) = groups.get_mut(spec.global(local) as usize) {
                        *slot = Some(GroupId { stream_id: spec.group_stream_id(), partition: local });
                    }
                }
            }
        }
        self.active.set(!groups.is_empty());
        self.readers_noted
            .borrow_mut()
            .retain(|partition, _| groups.get(*partition as usize).is_some_and(Option::is_some));
    }

    /// Batches proposed and not yet applied.
    pub fn inflight_batches(&self) -> usize {
        self.inflight_count.get()
    }

    fn next_sequence(&self, group: GroupId) -> u64 {
        let mut sequences = self.sequences.borrow_mut();
        let next = sequences.entry(group).or_insert(0);
        let sequence = *next;
        *next += 1;
        sequence
    }

    /// Whether `partition` (global id) is replicated, this node holds no
    /// replica of it, and its mirror has not caught up with the replicas:
    /// its local copy's end is not the partition's, so `latest` and
    /// offsets past the copy wait ([`crate::partition::fetch::serve_fetch_with`]).
    #[inline]
    pub fn awaits_mirror(&self, partition: u32) -> bool {
        self.is_active() && self.mirror_view.borrow().awaits(partition)
    }

    /// The cluster thread's word on the partitions held and mirrored here
    /// ([`crate::replication::mirror::MirrorView`]).
    pub fn set_mirror_view(&self, view: std::sync::Arc<MirrorView>) {
        *self.mirror_view.borrow_mut() = view;
    }

    fn group_of(&self, partition: u32) -> Option<GroupId> {
        self.groups.borrow().get(partition as usize).copied().flatten()
    }
}

/// One partition's records of a batch, to propose.
struct Proposal {
    group: GroupId,
    /// Its place in the (shard, group)'s order ([`ProposalRequest`]).
    sequence: u64,
    records: Bytes,
    record_count: u32,
}

/// A proposal handed to the cluster thread, and where its answer comes.
struct Sent {
    proposal: Proposal,
    answer: Option<flume::Receiver<Result<(), ProposalRefused>>>,
}

/// A batch whose replicated records are proposed: the rest of it is
/// applied (and its credits returned) once every proposal is committed.
struct InFlight {
    source: u16,
    batch: DataBatch,
    sent: Vec<Sent>,
}

/// Where a batch goes when replication is active (module doc,
/// "Pipelining"): its replicated records are proposed at once, and the
/// batch joins the shard's in-flight queue, whose completer applies the
/// rest of each batch in arrival order once its proposals are committed.
/// A batch with nothing to replicate, arriving while nothing is in flight,
/// is applied at once as on a node without replication. Waits while
/// [`INFLIGHT_BATCHES_MAX`] batches are in flight.
pub async fn submit(shard: &Rc<Shard>, source: u16, mut batch: DataBatch) {
    let replication = &shard.replication;
    let proposals = take_replicated(replication, &mut batch);
    if proposals.is_empty() && replication.inflight_count.get() == 0 {
        shard.apply_local(source, batch).await;
        return;
    }
    while replication.inflight_count.get() >= INFLIGHT_BATCHES_MAX
        || (replication.inflight_count.get() > 0
            && replication.outstanding.get() + proposals.len() > PROPOSALS_OUTSTANDING_MAX)
    {
        replication.room.notified().await;
    }
    replication.outstanding.set(replication.outstanding.get() + proposals.len());
    let sender = replication.proposals.borrow().clone();
    let sent = match sender {
        Some(sender) => proposals
            .into_iter()
            .map(|proposal| {
                let answer = send(shard.id, &sender, &proposal, false);
                Sent { proposal, answer }
            })
            .collect(),
        None => {
            log::error!(shard = shard.id, "records of a replicated partition on a node without a cluster: dropped");
            Vec::new()
        }
    };
    replication.inflight.borrow_mut().push_back(InFlight { source, batch, sent });
    replication.inflight_count.set(replication.inflight_count.get() + 1);
    if !replication.completer_running.replace(true) {
        let shard = shard.clone();
        glommio::spawn_local(async move { complete(shard).await }).detach();
    }
}

/// The completer: applies the in-flight batches in order, each once its
/// proposals are committed; ends when none is left (the next
/// [`submit`] starts it again).
async fn complete(shard: Rc<Shard>) {
    let replication = &shard.replication;
    loop {
        let next = replication.inflight.borrow_mut().pop_front();
        let Some(mut inflight) = next else {
            replication.completer_running.set(false);
            return;
        };
        await_commits(&shard, &mut inflight.sent).await;
        shard.apply_local(inflight.source, inflight.batch).await;
        replication.inflight_count.set(replication.inflight_count.get() - 1);
        replication.outstanding.set(replication.outstanding.get() - inflight.sent.len());
        replication.room.notify();
    }
}

/// Waits until every proposal of a batch is committed, proposing again
/// (with the same sequence, so in order) those refused.
async fn await_commits(shard: &Rc<Shard>, sent: &mut [Sent]) {
    for item in sent {
        let mut retry_ms = PROPOSE_RETRY_FIRST_MS;
        // Once it timed out, it and the later ones may have been taken: it
        // is sent with resync from then on, whatever refuses it next (a
        // held group, no leader), and the later ones are not sent again.
        let mut timed_out = false;
        loop {
            let refused = match item.answer.take() {
                Some(answer) => match answer.recv_async().await {
                    Ok(Ok(())) => break,
                    Ok(Err(refused)) => refused,
                    // The cluster thread dropped it unanswered: taken or not.
                    Err(_) => ProposalRefused::TimedOut,
                },
                // The queue to the cluster thread was full: it has room for
                // every outstanding proposal twice, so only a cluster thread
                // that stopped taking them gets here.
                None => ProposalRefused::NotQueued,
            };
            // Out of order: every earlier proposal of the group is committed
            // (the completer goes in order), so the cluster thread expects
            // this one unless a later one was taken after a timeout; taken
            // again at once whatever it expects (resync), it cannot spin.
            // The others wait a moment.
            let out_of_order = refused == ProposalRefused::OutOfOrder;
            if out_of_order {
                crate::shard::metrics::ShardMetrics::add(&shard.metrics.replication_refusals, 1);
            } else {
                note_refusal(shard, item.proposal.group, refused);
                glommio::timer::sleep(Duration::from_millis(retry_ms)).await;
                retry_ms = (retry_ms * 2).min(PROPOSE_RETRY_MS);
            }
            let Some(sender) = shard.replication.proposals.borrow().clone() else { continue };
            timed_out |= refused == ProposalRefused::TimedOut;
            item.answer = send(shard.id, &sender, &item.proposal, timed_out || out_of_order);
            if !timed_out {
                resend_queued(shard, item.proposal.group, &sender);
            }
        }
    }
}

/// Proposes again, right behind a refused proposal of `group` proposed
/// again, every later one of the group in the queue: the cluster thread
/// refused them all (out of order), and waiting for each in turn would
/// take one commit round trip per batch. Not after a timeout, where later
/// ones may have been taken.
fn resend_queued(shard: &Rc<Shard>, group: GroupId, sender: &flume::Sender<ProposalRequest>) {
    let mut inflight = shard.replication.inflight.borrow_mut();
    for queued in inflight.iter_mut() {
        for item in queued.sent.iter_mut().filter(|item| item.proposal.group == group) {
            item.answer = send(shard.id, sender, &item.proposal, false);
        }
    }
}

/// Hands a proposal to the cluster thread; the answer comes on the receiver.
fn send(
    shard_id: u16,
    sender: &flume::Sender<ProposalRequest>,
    proposal: &Proposal,
    resync: bool,
) -> Option<flume::Receiver<Result<(), ProposalRefused>>> {
    let (reply, answer) = flume::bounded(1);
    let request = ProposalRequest {
        group: proposal.group,
        shard: shard_id,
        sequence: proposal.sequence,
        resync,
        records: proposal.records.clone(),
        record_count: proposal.record_count,
        reply,
    };
    sender.try_send(request).ok().map(|()| answer)
}

/// Moves the records of replicated partitions out of `batch`, keeping the
/// others in place and in order.
fn take_replicated(replication: &ShardReplication, batch: &mut DataBatch) -> Vec<Proposal> {
    let mut taken: Vec<(GroupId, Vec<u8>, u32)> = Vec::new();
    let mut kept = Vec::new();
    let mut moved_bytes = 0;
    for (partition, record) in BatchIter::new(&batch.bytes) {
        let Some(group) = replication.group_of(partition) else {
            kept.extend_from_slice(&partition.to_le_bytes());
            kept.extend_from_slice(record.log_record);
            continue;
        };
        moved_bytes += 4 + record.log_record.len();
        let index = match taken.iter().position(|(taken_group, _, _)| *taken_group == group) {
            Some(index) => index,
            None => {
                taken.push((group, Vec::new(), 0));
                taken.len() - 1
            }
        };
        taken[index].1.extend_from_slice(record.log_record);
        taken[index].2 += 1;
    }
    let proposals: Vec<Proposal> = taken
        .into_iter()
        .map(|(group, records, record_count)| Proposal {
            group,
            sequence: replication.next_sequence(group),
            records: Bytes::from(records),
            record_count,
        })
        .collect();
    if !proposals.is_empty() {
        // The kept records move up: offset asks (by position) no longer
        // name them, and the moved ones get offsets from their Raft group.
        // So the batch answers none (a Kafka Produce answers -1).
        batch.offset_asks = None;
        batch.bytes.clear();
        batch.bytes.extend_from_slice(&kept);
        batch.replicated_bytes += moved_bytes;
        batch.event_count =
            batch.event_count.saturating_sub(proposals.iter().map(|proposal| proposal.record_count).sum());
    }
    proposals
}

fn note_refusal(shard: &Shard, group: GroupId, refused: ProposalRefused) {
    crate::shard::metrics::ShardMetrics::add(&shard.metrics.replication_refusals, 1);
    shard.replication.refusals.occur(
        Instant::now(),
        log::Level::Warn,
        log::Scope::shard(shard.id()),
        format_args!(
            "replication: records for partition {} of group stream {:08x} wait: {refused} (retrying within {PROPOSE_RETRY_MS} ms)",
            group.partition, group.stream_id
        ),
    );
}

/// Appends what a group committed to its partition, if this shard owns it
/// ([`CommittedRecords`]), and lets readers see it after the commit round.
pub fn apply_committed(shard: &Rc<Shard>, committed: CommittedRecords) {
    let end = {
        let mut partitions = shard.partitions.borrow_mut();
        let Some(partition) = partitions.get(committed.partition) else {
            let _ = committed.reply.send(None);
            return;
        };
        let end_offset = partition.log.next_offset();
        // Visible = what survives a kill -9 under the fsync policy
        // ([`PartitionEnd::durable_offset`]); before this append.
        let durable_offset = partition.log.visible_offset();
        let partition_id = committed.partition;
        let end_offset = append_committed(&committed, end_offset, |record| {
            partitions.append(partition_id, record);
        });
        PartitionEnd { end_offset, durable_offset }
    };
    match &shard.committer {
        Some(committer) => committer.wake(),
        None => shard.subscriptions.wake_parked(),
    }
    let _ = committed.reply.send(Some(end));
}
