//! Subscribers: `SUB <partition|*> <offset|earliest|latest>` on the subscribe
//! port, then `<partition> <offset> <key> <payload>` lines, replay then live
//! tail, in offset order per partition.
//!
//! Subscriptions **pull**. The shard that accepted the subscriber keeps the
//! cursors and sends each owner shard at most one
//! [`FetchRequest`](crate::partition::fetch::FetchRequest) at a time
//! (carrying the cursors of the partitions that owner holds) with a byte
//! budget. The owner answers at once with what its logs have, or parks the
//! request until one of those partitions is appended to
//! ([`crate::partition::fetch`] is the owner's side). Owners reply with
//! records; [`render`] turns them into lines on this shard. So:
//!
//! * a slow subscriber only delays its own next fetch: the log keeps the
//!   events (up to retention), ingest never waits for a subscriber;
//! * memory per subscriber is bounded by `shards * fetch_bytes_max`;
//! * cursors live with the subscription, not with the partition, so a
//!   partition that moves to another shard only changes where the next fetch
//!   goes (an owner that no longer has a partition answers "moved");
//! * a subscriber whose cursor fell behind retention gets one line
//!   `TRUNCATED <partition> <requested-offset> <next-readable-offset>` and the
//!   stream continues from the next readable offset; it never skips silently;
//! * a subscriber is counted against the process-wide limit from accept
//!   ([`crate::net::admission::SubscriberSlots`]), so connections that never
//!   send `SUB` cannot crowd it: one that has not sent its `SUB`/`GROUP` line
//!   within --subscribe-request-timeout-ms is closed, and at the limit a
//!   newcomer takes over the slot of the oldest such connection, on any
//!   shard, which is shed; only subscribers that sent their line are never
//!   shed. A session also waits on its socket, so a subscriber that closes
//!   while idle frees its slot at once;
//! * on shutdown a subscriber gets the replies already fetched for it, then
//!   `CLOSING <partition>:<resume> ...` ([`crate::protocol::subscribe`]), then
//!   the close, all within --shutdown-timeout-ms;
//! * a `SUB` session follows consolidation
//!   ([`crate::shard::consolidation`]): when the process gathers and the
//!   shard serving it keeps no partition (every reply would cross to it and
//!   wake it), it moves to the kept shard between two replies, once every line up to its cursors is
//!   written. Its fetches out are cancelled (what they would have sent is
//!   read again from the cursors), and its socket, slot and cursors go to
//!   the new shard, which goes on reading where it stood: nothing is
//!   skipped or written twice. It stays there when the process spreads
//!   again (a spread comes with a high load, when a move would cost it
//!   most). A group member (`GROUP`) stays where it was accepted (its group
//!   state lives on that shard).

mod member;
mod overlong;
pub mod render;
mod session;

use std::os::fd::OwnedFd;
use std::rc::Rc;

use glommio::net::{TcpListener, TcpStream};

use crate::net::ShardNet;
use crate::net::accept::Acceptor;
use crate::net::admission::{Admit, SubscriberSlot};
use crate::net::socket::{adopt_handed_over, duplicate_for_handover, tune_accepted};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;

/// How long a subscriber waits before asking again for a partition that is
/// moving between owners, in ms.
const FETCH_RETRY_DELAY_MS: u64 = 1;

/// Accepts subscriber connections until shutdown, within the process-wide
/// subscriber limit.
pub async fn accept_subscribers(shard: Rc<Shard>, net: Rc<ShardNet>, listener: TcpListener) {
    let metrics = &shard.metrics();
    let mut acceptor = Acceptor::new(listener, "subscribe", shard.id(), shard.lifecycle(), &net.connections, metrics);
    while let Some(stream) = acceptor.next().await {
        // Best effort: a socket without these options still works.
        let _ = tune_accepted(&stream);
        // A shard that owns no partition while the process is gathered would
        // be woken by every reply for this subscriber: it goes, before its
        // first byte is read, to the shard that owns them.
        if let Some(to) = shard.connection_move_target()
            && let Some(fd) = duplicate_for_handover(&stream)
        {
            drop(stream);
            ShardMetrics::add(&metrics.connections_handed_over, 1);
            shard.hand_over_connection(to, Box::new(Handover { fd }));
            continue;
        }
        admit(&shard, &net, stream);
    }
}

/// A subscribe connection handed over to another shard before it read
/// anything: only its socket (duplicated; the old shard's copy is closed).
struct Handover {
    fd: OwnedFd,
}

/// A `SUB` session moving to the kept shard while it reads (the process
/// gathered): its socket (duplicated; the old shard's copy is closed), its
/// process-wide slot, and where it resumes.
struct LiveHandover {
    fd: OwnedFd,
    slot: SubscriberSlot,
    resume: session::Resume,
}

/// Serves `adoption` if it is a subscribe connection another shard handed
/// over; gives it back otherwise.
pub fn adopt(
    shard: &Rc<Shard>,
    net: &Rc<ShardNet>,
    adoption: Box<dyn std::any::Any + Send>,
) -> Result<(), Box<dyn std::any::Any + Send>> {
    let adoption = match adoption.downcast::<LiveHandover>() {
        Ok(live) => {
            let LiveHandover { fd, slot, resume } = *live;
            ShardMetrics::add(&shard.metrics().connections_adopted, 1);
            serve(shard, net, adopt_handed_over(fd), slot, Some(resume));
            return Ok(());
        }
        Err(adoption) => adoption,
    };
    let handover = adoption.downcast::<Handover>()?;
    ShardMetrics::add(&shard.metrics().connections_adopted, 1);
    admit(shard, net, adopt_handed_over(handover.fd));
    Ok(())
}

/// Admits a subscribe connection within the process-wide limit and serves it.
fn admit(shard: &Rc<Shard>, net: &Rc<ShardNet>, stream: TcpStream) {
    let metrics = &shard.metrics();
    let slot = match net.admission.subscribers.try_admit() {
        Admit::Free(slot) => slot,
        Admit::TakenOver(slot) => {
            // The shed connection closes now if it is on this shard, or
            // at its own shard's next sweep.
            ShardMetrics::add(&metrics.subscribers_shed, 1);
            net.connections.close_taken_over();
            slot
        }
        Admit::Full => {
            ShardMetrics::add(&metrics.subscribers_refused, 1);
            let limit = net.admission.subscribers.max();
            let message = format!("ERR subscriber_limit: the server already has {limit} subscribers\n");
            net.refusals.refuse(stream, message);
            return;
        }
    };
    serve(shard, net, stream, slot, None);
}

/// Serves a subscribe connection holding `slot` (a moved `SUB` session's
/// `resume` goes on where it stood), and hands it over to another shard
/// when it is to move.
fn serve(
    shard: &Rc<Shard>,
    net: &Rc<ShardNet>,
    stream: TcpStream,
    slot: SubscriberSlot,
    resume: Option<session::Resume>,
) {
    shard.lifecycle().session_opened();
    let moved = resume.is_some();
    let connection = net.connections.register_subscriber(slot);
    if moved {
        // It sent its request line on its first shard: never shed or timed
        // out before one (the slot is active already).
        connection.greet_subscriber();
    }
    let shard = shard.clone();
    glommio::spawn_local(async move {
        let moving = session::run_subscriber(&shard, stream, &connection, resume).await;
        // The slot goes with a moving session; otherwise dropping the
        // connection frees it, or lets it be taken over again if this
        // connection was shed from it.
        let moving = moving.and_then(|moving| Some((moving, connection.take_subscriber_slot()?)));
        drop(connection);
        shard.lifecycle().session_closed();
        if let Some(((resume, to, fd), slot)) = moving {
            ShardMetrics::add(&shard.metrics().connections_handed_over, 1);
            shard.hand_over_connection(to, Box::new(LiveHandover { fd, slot, resume }));
        }
    })
    .detach();
}
