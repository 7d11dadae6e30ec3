//! A shard's side of replicated partitions ([`crate::replication::node`]
//! has the design): the records of a batch for a replicated partition are
//! proposed to its Raft group instead of appended, and the partition's log
//! takes what its group committed, delivered by the cluster thread.
//!
//! Nothing here runs for a stream with a replication factor of 1: the
//! applier checks one flag per batch ([`ShardReplication::is_active`]),
//! false unless a replicated stream exists, and the path of every other
//! batch is the one it always was.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::protocol::record::BatchIter;
use crate::replication::GroupId;
use crate::replication::node::{CommittedRecords, ProposalRefused, ProposalRequest, append_committed};
use crate::routing::DataBatch;
use crate::runtime::log;
use crate::shard::Shard;
use crate::stream::Catalog;

/// How long a refused proposal waits before it is made again, in ms.
pub const PROPOSE_RETRY_MS: u64 = 100;

/// The replicated partitions of the catalog, and the way to the cluster
/// thread.
pub struct ShardReplication {
    active: Cell<bool>,
    /// The group of each global partition id that is replicated.
    groups: RefCell<Vec<Option<GroupId>>>,
    proposals: RefCell<Option<flume::Sender<ProposalRequest>>>,
    refusals: log::Episode,
}

impl Default for ShardReplication {
    fn default() -> ShardReplication {
        ShardReplication {
            active: Cell::new(false),
            groups: RefCell::default(),
            proposals: RefCell::default(),
            refusals: log::Episode::new("replicated proposals refused"),
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
    }

    fn group_of(&self, partition: u32) -> Option<GroupId> {
        self.groups.borrow().get(partition as usize).copied().flatten()
    }
}

/// One partition's records of a batch, to propose.
struct Proposal {
    group: GroupId,
    records: Vec<u8>,
    record_count: u32,
}

/// Takes the records of replicated partitions out of `batch` (counting
/// their bytes so its credit grant still returns all it took) and waits
/// until each partition's records are committed.
pub async fn replicate_from(shard: &Rc<Shard>, batch: &mut DataBatch) {
    let proposals = take_replicated(&shard.replication, batch);
    if proposals.is_empty() {
        return;
    }
    // All in flight at once, then each waited for (and retried) in turn.
    let Some(sender) = shard.replication.proposals.borrow().clone() else {
        log::error!(shard = shard.id, "records of a replicated partition on a node without a cluster: dropped");
        return;
    };
    let answers: Vec<_> = proposals.iter().map(|proposal| send(&sender, proposal)).collect();
    for (proposal, answer) in proposals.iter().zip(answers) {
        let mut answer = answer;
        loop {
            let refused = match answer {
                Some(answer) => match answer.recv_async().await {
                    Ok(Ok(())) => break,
                    Ok(Err(refused)) => refused,
                    Err(_) => ProposalRefused::NoLeader,
                },
                None => ProposalRefused::NoLeader,
            };
            note_refusal(shard, proposal.group, refused);
            glommio::timer::sleep(Duration::from_millis(PROPOSE_RETRY_MS)).await;
            answer = send(&sender, proposal);
        }
    }
}

/// Hands a proposal to the cluster thread; the answer comes on the receiver.
fn send(
    sender: &flume::Sender<ProposalRequest>,
    proposal: &Proposal,
) -> Option<flume::Receiver<Result<(), ProposalRefused>>> {
    let (reply, answer) = flume::bounded(1);
    let request = ProposalRequest {
        group: proposal.group,
        records: proposal.records.clone(),
        record_count: proposal.record_count,
        reply,
    };
    sender.try_send(request).ok().map(|()| answer)
}

/// Moves the records of replicated partitions out of `batch`, keeping the
/// others in place and in order.
fn take_replicated(replication: &ShardReplication, batch: &mut DataBatch) -> Vec<Proposal> {
    let mut proposals: Vec<Proposal> = Vec::new();
    let mut kept = Vec::new();
    let mut moved_bytes = 0;
    for (partition, record) in BatchIter::new(&batch.bytes) {
        let Some(group) = replication.group_of(partition) else {
            kept.extend_from_slice(&partition.to_le_bytes());
            kept.extend_from_slice(record.log_record);
            continue;
        };
        moved_bytes += 4 + record.log_record.len();
        let index = match proposals.iter().position(|proposal| proposal.group == group) {
            Some(index) => index,
            None => {
                proposals.push(Proposal { group, records: Vec::new(), record_count: 0 });
                proposals.len() - 1
            }
        };
        proposals[index].records.extend_from_slice(record.log_record);
        proposals[index].record_count += 1;
    }
    if !proposals.is_empty() {
        batch.bytes.clear();
        batch.bytes.extend_from_slice(&kept);
        batch.replicated_bytes += moved_bytes;
        batch.event_count =
            batch.event_count.saturating_sub(proposals.iter().map(|proposal| proposal.record_count).sum());
    }
    proposals
}

fn note_refusal(shard: &Shard, group: GroupId, refused: ProposalRefused) {
    shard.replication.refusals.occur(
        Instant::now(),
        log::Level::Warn,
        log::Scope::shard(shard.id()),
        format_args!(
            "replication: records for partition {} of group stream {:08x} wait: {refused} (retrying every {PROPOSE_RETRY_MS} ms)",
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
        let partition_id = committed.partition;
        append_committed(&committed, end_offset, |record| {
            partitions.append(partition_id, record);
        })
    };
    match &shard.committer {
        Some(committer) => committer.wake(),
        None => shard.subscriptions.wake_parked(),
    }
    let _ = committed.reply.send(Some(end));
}
