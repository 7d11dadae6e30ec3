//! One subscriber connection: read the `SUB` line, then pull from every owner
//! and write what comes back.

use std::rc::Rc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;

use crate::config::SUBSCRIBE_REQUEST_SIZE_MAX;
use crate::partition::fetch::{FetchReply, FetchRequest, Position};
use crate::protocol::{PartitionSelector, StartOffset, parse_subscribe};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;
use crate::shard::notify::{Either, first};

struct Cursor {
    partition: u32,
    position: Position,
    /// A fetch that carries this cursor is out; do not send it elsewhere.
    in_flight: bool,
}

/// Serves one subscriber until it disconnects or the server shuts down.
pub async fn serve_subscriber(shard: Rc<Shard>, mut stream: TcpStream) {
    let metrics = &shard.metrics;
    if metrics.subscribers_open.get() as usize >= shard.config.subscribers_per_shard_max {
        ShardMetrics::add(&metrics.subscribers_refused, 1);
        let message = format!(
            "ERR subscriber_limit: this shard already serves {} subscribers\n",
            shard.config.subscribers_per_shard_max
        );
        let _ = stream.write_all(message.as_bytes()).await;
        return;
    }
    let Some(request_line) = read_request_line(&mut stream).await else { return };
    let request = match parse_subscribe(&request_line, shard.config.partitions) {
        Ok(request) => request,
        Err(error) => {
            let _ = stream.write_all(format!("ERR {error}\n").as_bytes()).await;
            return;
        }
    };
    let start = match request.start {
        StartOffset::Earliest => Position::Earliest,
        StartOffset::Latest => Position::Latest,
        StartOffset::At(offset) => Position::At(offset),
    };
    let partitions: Vec<u32> = match request.partitions {
        PartitionSelector::All => (0..shard.config.partitions).collect(),
        PartitionSelector::One(partition) => vec![partition],
    };
    let cursors = partitions.into_iter().map(|partition| Cursor { partition, position: start, in_flight: false });
    ShardMetrics::add(&metrics.subscribers_open, 1);
    let (inbox_sender, inbox) = local_channel::new_bounded(usize::from(shard.shard_count) + 1);
    let subscription_id = shard.subscriptions.register(inbox_sender);
    let mut session = Session {
        shard: &shard,
        subscription_id,
        cursors: cursors.collect(),
        outstanding: vec![Outstanding::None; usize::from(shard.shard_count)],
        rotation: 0,
    };
    let _ = session.run(&mut stream, &inbox).await;
    shard.unregister_subscription(subscription_id);
    metrics.subscribers_open.set(metrics.subscribers_open.get() - 1);
}

async fn read_request_line(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        let count = stream.read(&mut chunk).await.ok()?;
        if count == 0 {
            return None;
        }
        request.extend_from_slice(&chunk[..count]);
        if let Some(end) = memchr::memchr(b'\n', &request) {
            // Bytes after the request line are ignored: the protocol is one line.
            request.truncate(end);
            return Some(request);
        }
        if request.len() > SUBSCRIBE_REQUEST_SIZE_MAX {
            let message = format!("ERR bad_request: request line longer than {SUBSCRIBE_REQUEST_SIZE_MAX} bytes\n");
            let _ = stream.write_all(message.as_bytes()).await;
            return None;
        }
    }
}

/// A subscription's fetch to one owner.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outstanding {
    None,
    Out,
    /// Out, and asked to come back early: a cursor for that owner is waiting
    /// to be fetched (its partition moved there after the fetch left).
    Woken,
}

struct Session<'a> {
    shard: &'a Rc<Shard>,
    subscription_id: u64,
    cursors: Vec<Cursor>,
    /// Per owner: whether a fetch to it is out.
    outstanding: Vec<Outstanding>,
    /// Where the next fetch starts in `cursors`, so a large budget is shared
    /// fairly among partitions over time.
    rotation: usize,
}

impl Session<'_> {
    async fn run(
        &mut self,
        stream: &mut TcpStream,
        inbox: &local_channel::LocalReceiver<FetchReply>,
    ) -> std::io::Result<()> {
        loop {
            self.send_fetches();
            let reply = match first(inbox.recv(), self.shard.lifecycle.shutdown_requested()).await {
                Either::Left(Some(reply)) => reply,
                Either::Left(None) | Either::Right(()) => return Ok(()),
            };
            self.apply_reply(&reply);
            if !reply.data.is_empty() {
                stream.write_all(&reply.data).await?;
                let metrics = &self.shard.metrics;
                ShardMetrics::add(&metrics.events_delivered, reply.event_count);
                ShardMetrics::add(&metrics.bytes_delivered, reply.data.len() as u64);
                ShardMetrics::add(&metrics.truncation_notices, reply.truncation_count);
            }
        }
    }

    /// Sends one fetch to every owner that has none out and holds cursors
    /// that are not in flight. An owner whose fetch is out (it may be parked
    /// there until new events arrive) and that now holds a cursor the fetch
    /// does not carry is asked to answer early, so the cursor is not stuck
    /// behind a fetch that may wait forever.
    fn send_fetches(&mut self) {
        let placement = self.shard.placement.borrow();
        let mut requests: Vec<Option<FetchRequest>> = (0..self.outstanding.len()).map(|_| None).collect();
        let cursor_count = self.cursors.len();
        self.rotation = (self.rotation + 1) % cursor_count;
        for step in 0..cursor_count {
            let cursor = &mut self.cursors[(self.rotation + step) % cursor_count];
            let owner = usize::from(placement.owner(cursor.partition));
            if cursor.in_flight {
                continue;
            }
            if self.outstanding[owner] != Outstanding::None {
                if self.outstanding[owner] == Outstanding::Out {
                    self.outstanding[owner] = Outstanding::Woken;
                    self.shard.send_fetch_wake(owner as u16, self.subscription_id);
                }
                continue;
            }
            cursor.in_flight = true;
            requests[owner]
                .get_or_insert_with(|| FetchRequest {
                    subscription_id: self.subscription_id,
                    cursors: Vec::new(),
                    bytes_max: self.shard.config.fetch_bytes_max,
                })
                .cursors
                .push((cursor.partition, cursor.position));
        }
        drop(placement);
        for (owner, request) in requests.into_iter().enumerate() {
            if let Some(request) = request {
                self.outstanding[owner] = Outstanding::Out;
                self.shard.send_fetch(owner as u16, request);
            }
        }
    }

    fn cursor_mut(&mut self, partition: u32) -> &mut Cursor {
        let index = if self.cursors.len() == 1 { 0 } else { partition as usize };
        let cursor = &mut self.cursors[index];
        assert_eq!(cursor.partition, partition, "reply for a partition this subscription does not read");
        cursor
    }

    fn apply_reply(&mut self, reply: &FetchReply) {
        self.outstanding[usize::from(reply.owner)] = Outstanding::None;
        for &(partition, offset) in &reply.cursors {
            let cursor = self.cursor_mut(partition);
            debug_assert!(cursor.in_flight);
            if let Position::At(previous) = cursor.position {
                debug_assert!(offset >= previous, "cursor went back on partition {partition}");
            }
            cursor.position = Position::At(offset);
            cursor.in_flight = false;
        }
        for &partition in reply.moved.iter().chain(&reply.waiting) {
            // Moved: the next fetch goes to its new owner. Waiting: it is
            // being installed there; the next fetch goes there again.
            self.cursor_mut(partition).in_flight = false;
        }
    }
}
