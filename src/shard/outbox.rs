//! Non-blocking sends into the channel mesh, and to this shard itself.
//!
//! [`Outbox::send`] is the one way a shard sends a frame, whoever the peer:
//! a frame for this shard goes on a loopback queue that the shard's
//! loopback task hands to the same frame handler as the mesh receivers do
//! ([`Outbox::next_loopback`]), so no caller tells "this shard" apart from
//! "another shard", and a frame is never handled inside the call that sent
//! it (no re-entrancy into whatever state the sender holds borrowed).
//!
//! Tasks that handle incoming frames must never wait on an outgoing send:
//! two shards each blocked sending to the other while neither receives is
//! the cyclic `send_to` deadlock of glommio issue #555. So every send goes
//! through [`Outbox::send`], which tries the ring and, when it is full, queues
//! the frame locally for a per-peer drainer task that does the awaiting. The
//! queue keeps FIFO order per peer, and its length is bounded by the credit
//! scheme (data batches by credit slots, grants by batches received, fetches
//! by subscribers); `mesh_overflow_frames` counts how often it is used.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use glommio::channels::channel_mesh::Senders;

use crate::runtime::notify::Notify;
use crate::shard::frame::MeshFrame;
use crate::shard::metrics::ShardMetrics;

struct PeerQueue {
    queued: RefCell<VecDeque<MeshFrame>>,
    /// The drainer holds a frame it is awaiting a send for; later frames must
    /// queue behind it.
    draining: Cell<bool>,
    notify: Notify,
}

pub struct Outbox {
    senders: Senders<MeshFrame>,
    peers: Vec<PeerQueue>,
    /// This shard's id (its mesh peer id).
    me: u16,
    /// Frames this shard sent itself, FIFO. Bounded as the mesh queues are:
    /// by the credits, fetches and grants of this shard's own sources and
    /// subscribers.
    loopback: RefCell<VecDeque<MeshFrame>>,
    loopback_notify: Notify,
}

impl Outbox {
    pub fn new(senders: Senders<MeshFrame>) -> Outbox {
        let peers = (0..senders.nr_consumers())
            .map(|_| PeerQueue { queued: RefCell::default(), draining: Cell::new(false), notify: Notify::default() })
            .collect();
        let me = u16::try_from(senders.peer_id()).expect("shard count is bounded by SHARD_COUNT_MAX");
        Outbox { senders, peers, me, loopback: RefCell::default(), loopback_notify: Notify::default() }
    }

    /// Sends a frame to `peer` (this shard included) without waiting.
    pub fn send(&self, peer: u16, frame: MeshFrame, metrics: &ShardMetrics) {
        if peer == self.me {
            self.loopback.borrow_mut().push_back(frame);
            self.loopback_notify.notify();
            return;
        }
        let counter = match &frame {
            MeshFrame::Data(_) => &metrics.mesh_frames_data,
            MeshFrame::Credit(_) => &metrics.mesh_frames_credit,
            MeshFrame::Fetch(_) | MeshFrame::FetchCredit(_) | MeshFrame::FetchWake { .. } => &metrics.mesh_frames_fetch,
            MeshFrame::FetchReply(_) => &metrics.mesh_frames_fetch_reply,
            _ => &metrics.mesh_frames_other,
        };
        ShardMetrics::add(counter, 1);
        let queue = &self.peers[usize::from(peer)];
        if !queue.draining.get() && queue.queued.borrow().is_empty() {
            match self.senders.try_send_to(usize::from(peer), frame) {
                Ok(()) => return,
                Err(glommio::GlommioError::WouldBlock(glommio::ResourceType::Channel(frame))) => {
                    queue.queued.borrow_mut().push_back(frame);
                }
                // The peer is gone (shutting down): nothing will read it.
                Err(_) => return,
            }
        } else {
            queue.queued.borrow_mut().push_back(frame);
        }
        ShardMetrics::add(&metrics.mesh_overflow_frames, 1);
        queue.notify.notify();
    }

    /// The next frame this shard sent itself; waits for one.
    pub async fn next_loopback(&self) -> MeshFrame {
        loop {
            if let Some(frame) = self.loopback.borrow_mut().pop_front() {
                return frame;
            }
            self.loopback_notify.notified().await;
        }
    }

    /// Shards in the mesh, this one included.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Frames queued behind full rings, over all peers, and on the loopback.
    pub fn queued_frames(&self) -> usize {
        self.peers.iter().map(|queue| queue.queued.borrow().len()).sum::<usize>() + self.loopback.borrow().len()
    }

    /// The drainer for one peer: awaits ring space for queued frames.
    pub async fn drain(self: Rc<Self>, peer: u16) {
        let queue = &self.peers[usize::from(peer)];
        loop {
            queue.notify.notified().await;
            loop {
                let Some(frame) = queue.queued.borrow_mut().pop_front() else { break };
                queue.draining.set(true);
                let sent = self.senders.send_to(usize::from(peer), frame).await;
                queue.draining.set(false);
                if sent.is_err() {
                    queue.queued.borrow_mut().clear();
                    return;
                }
            }
        }
    }

    pub fn close(&self) {
        self.senders.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::CreditGrant;
    use glommio::channels::channel_mesh::MeshBuilder;
    use glommio::{LocalExecutorPoolBuilder, PoolPlacement};

    fn grant(sequence: u64) -> MeshFrame {
        MeshFrame::Credit(CreditGrant {
            sequence,
            batch_count: 1,
            credit_bytes: 0,
            recycled: Vec::new(),
            more_recycled: Vec::new(),
            sync: false,
            grant_now: false,
            offset_asks: None,
        })
    }

    /// Sends never wait: past a full ring they queue, the drainer delivers
    /// them, and the peer receives every frame in send order.
    #[test]
    fn full_rings_queue_in_order_and_drain() {
        const FRAME_COUNT: u64 = 200;
        let mesh = MeshBuilder::full(2, 4);
        // The receiver starts only once every frame was handed to the
        // outbox, so the ring of 4 must overflow (a fast receiver could
        // otherwise keep up and the test would prove nothing).
        let all_sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pool = LocalExecutorPoolBuilder::new(PoolPlacement::Unbound(2))
            .on_all_shards(move || {
                let all_sent = all_sent.clone();
                async move {
                    let (senders, mut receivers) = mesh.join().await.expect("join");
                    let me = receivers.peer_id();
                    let outbox = Rc::new(Outbox::new(senders));
                    if me == 0 {
                        let metrics = ShardMetrics::default();
                        glommio::spawn_local(outbox.clone().drain(1)).detach();
                        for sequence in 1..=FRAME_COUNT {
                            outbox.send(1, grant(sequence), &metrics);
                        }
                        all_sent.store(true, std::sync::atomic::Ordering::Release);
                        assert!(metrics.mesh_overflow_frames.get() > 0, "a ring of 4 overflowed");
                        while outbox.queued_frames() > 0 {
                            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                        }
                        Vec::new()
                    } else {
                        while !all_sent.load(std::sync::atomic::Ordering::Acquire) {
                            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                        }
                        let mut seen = Vec::new();
                        for (_, stream) in receivers.streams() {
                            while let Some(MeshFrame::Credit(grant)) = stream.recv().await {
                                seen.push(grant.sequence);
                                if seen.len() as u64 == FRAME_COUNT {
                                    break;
                                }
                            }
                        }
                        seen
                    }
                }
            })
            .expect("pool");
        let results: Vec<Vec<u64>> = pool.join_all().into_iter().map(|result| result.expect("shard")).collect();
        let received = results.into_iter().find(|seen| !seen.is_empty()).expect("the receiver saw frames");
        assert_eq!(received, (1..=FRAME_COUNT).collect::<Vec<_>>());
    }
}
