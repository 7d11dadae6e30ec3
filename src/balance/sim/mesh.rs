//! The simulated mesh: frames between simulated shards, each on the FIFO channel of its
//! (from, to) pair, delivered after a seeded random delay.
//!
//! A frame sent at `now` gets a delay of `0..=delay_ms_max` but never overtakes an earlier frame
//! of its channel: it is due at `max(now + delay, due time of the channel's last frame)`, and
//! frames due in the same millisecond leave in the order they were sent. A shard's frames to
//! itself take the same path, as the engine's local batches share the apply queue with the
//! others.
//!
//! Frames wait in a timing wheel with one bucket per millisecond of the delay range. Delivery
//! order is exactly that of a heap keyed by (due time, send sequence), since a bucket is filled
//! in send order, but sending and delivering cost O(1) whatever the number of frames in flight:
//! a migration at 1024 shards puts three thousand of them on the wheel at once.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One frame in flight.
#[derive(Debug)]
pub struct Envelope<F> {
    pub due_ms: u64,
    pub from: u16,
    pub to: u16,
    pub frame: F,
}

/// Every frame in flight between the simulated shards.
#[derive(Debug)]
pub struct Mesh<F> {
    shard_count: u16,
    delay_ms_max: u64,
    rng: StdRng,
    /// Bucket `ms % wheel.len()` holds the frames due at `ms`, in send order.
    wheel: Vec<VecDeque<Envelope<F>>>,
    /// Every frame due before this has been delivered; none is due later than
    /// `cursor_ms + delay_ms_max`.
    cursor_ms: u64,
    /// Per channel `from * shard_count + to`: when its last frame is due. Eight bytes per pair of
    /// shards: 8 MiB at 1024 shards.
    channel_due_ms: Vec<u64>,
    len: usize,
    sent_count: u64,
}

impl<F> Mesh<F> {
    pub fn new(shard_count: u16, delay_ms_max: u64, seed: u64) -> Mesh<F> {
        assert!(shard_count > 0);
        let channel_count = usize::from(shard_count) * usize::from(shard_count);
        let bucket_count = usize::try_from(delay_ms_max + 1).expect("the delay fits in memory");
        Mesh {
            shard_count,
            delay_ms_max,
            rng: StdRng::seed_from_u64(seed),
            wheel: (0..bucket_count).map(|_| VecDeque::new()).collect(),
            cursor_ms: 0,
            channel_due_ms: vec![0; channel_count],
            len: 0,
            sent_count: 0,
        }
    }

    /// Sends `frame` from `from` to `to` at `now_ms`, behind every earlier frame of the channel.
    pub fn send(&mut self, from: u16, to: u16, now_ms: u64, frame: F) {
        assert!(from < self.shard_count && to < self.shard_count);
        self.advance_to(now_ms);
        let delay_ms = self.rng.random_range(0..=self.delay_ms_max);
        let channel = usize::from(from) * usize::from(self.shard_count) + usize::from(to);
        let due_ms = (now_ms + delay_ms).max(self.channel_due_ms[channel]);
        self.channel_due_ms[channel] = due_ms;
        // The channel's last frame was due within the delay range of an earlier send, so the
        // frame lands within the wheel.
        assert!(due_ms <= now_ms + self.delay_ms_max);
        let bucket_index = (due_ms % self.wheel.len() as u64) as usize;
        self.wheel[bucket_index].push_back(Envelope { due_ms, from, to, frame });
        self.len += 1;
        self.sent_count += 1;
    }

    /// Moves the mesh's clock to `now_ms`. Every frame due before it must have been delivered:
    /// a sender at `now_ms` has seen everything due until then.
    fn advance_to(&mut self, now_ms: u64) {
        if self.len == 0 {
            self.cursor_ms = self.cursor_ms.max(now_ms);
            return;
        }
        while self.cursor_ms < now_ms {
            let bucket_index = (self.cursor_ms % self.wheel.len() as u64) as usize;
            assert!(
                self.wheel[bucket_index].is_empty(),
                "a frame due at {} ms undelivered at {now_ms} ms",
                self.cursor_ms
            );
            self.cursor_ms += 1;
        }
    }

    /// The next frame due at or before `until_ms`, if any, advancing the mesh's clock.
    pub fn pop_due(&mut self, until_ms: u64) -> Option<Envelope<F>> {
        if self.len == 0 {
            self.cursor_ms = self.cursor_ms.max(until_ms);
            return None;
        }
        loop {
            let bucket_index = (self.cursor_ms % self.wheel.len() as u64) as usize;
            if let Some(envelope) = self.wheel[bucket_index].pop_front() {
                assert_eq!(envelope.due_ms, self.cursor_ms, "a frame in the wrong bucket");
                self.len -= 1;
                return Some(envelope);
            }
            if self.cursor_ms >= until_ms {
                return None;
            }
            self.cursor_ms += 1;
        }
    }

    /// Frames in flight.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Frames sent so far.
    pub fn sent_count(&self) -> u64 {
        self.sent_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames of one channel arrive in the order sent whatever their random delays, frames of
    /// different channels overtake each other, and every frame is due within the delay range.
    #[test]
    fn channels_are_fifo_and_delays_are_bounded() {
        let mut mesh: Mesh<u64> = Mesh::new(3, 10, 7);
        let mut delivered = Vec::new();
        for now_ms in 0..200 {
            for from in 0..3 {
                let to = ((now_ms + u64::from(from)) % 3) as u16;
                mesh.send(from, to, now_ms, now_ms);
            }
            while let Some(envelope) = mesh.pop_due(now_ms) {
                delivered.push(envelope);
            }
        }
        while let Some(envelope) = mesh.pop_due(u64::MAX) {
            delivered.push(envelope);
        }
        assert!(mesh.is_empty());
        assert_eq!(mesh.sent_count(), 600);
        assert_eq!(delivered.len(), 600);
        let mut last_sent_ms = [[None::<u64>; 3]; 3];
        let mut overtaken = false;
        for pair in delivered.windows(2) {
            assert!(pair[0].due_ms <= pair[1].due_ms, "delivered out of due order");
            overtaken |= pair[1].frame < pair[0].frame;
        }
        for envelope in &delivered {
            let sent_ms = envelope.frame;
            assert!(envelope.due_ms >= sent_ms && envelope.due_ms <= sent_ms + 10, "delay out of range");
            let last = &mut last_sent_ms[usize::from(envelope.from)][usize::from(envelope.to)];
            assert!(last.is_none_or(|last_ms| last_ms <= sent_ms), "a channel reordered");
            *last = Some(sent_ms);
        }
        assert!(overtaken, "delays are random, so some frame overtakes one of another channel");
    }
}
