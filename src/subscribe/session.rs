//! One subscriber connection: read the `SUB` line, then pull from every owner
//! and write what comes back, until the subscriber goes, is refused, or the
//! server shuts down (then: what is ready, the `CLOSING` notice, the close).

use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;

use crate::config::{
    CLOSING_NOTICE_CHUNK_BYTES, STANDING_FETCH_REPLIES_MAX, SUBSCRIBE_REQUEST_SIZE_MAX, SUBSCRIBER_BYTES_PER_PARTITION,
};
use crate::net::socket::{duplicate_for_handover, write_goodbye};
use crate::net::{CloseReason, Connection};
use crate::partition::fetch::{FetchCredit, FetchReply, FetchRequest, FetchWindow, Position};
use crate::protocol::subscribe::{
    write_closing_end, write_closing_entry, write_closing_start, write_offset_out_of_range,
};
use crate::protocol::{PartitionSelector, StartOffset, SubscribeError, parse_subscribe};
use crate::runtime::notify::{Either, first};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;
use crate::shard::subscriptions::DELETION_NOTICE_SLOTS;
use crate::stream::StreamRoute;
use crate::subscribe::overlong::{Overlong, SUBSCRIBE_REQUEST_SKIP_BYTES_MAX};
use crate::subscribe::render::write_replies;

pub(super) struct Cursor {
    pub(super) partition: u32,
    pub(super) position: Position,
    /// The owner a fetch that carries this cursor is out to (it may stand
    /// there); do not send it elsewhere meanwhile.
    pub(super) fetch_owner: Option<u16>,
    /// An owner has answered for it once (its start is checked and known).
    pub(super) resolved: bool,
    /// It is read: always for `SUB`; for a group member, while assigned.
    pub(super) active: bool,
    /// A group member gives it up: no new fetch carries it.
    pub(super) revoking: bool,
}

impl Cursor {
    pub(super) fn new(partition: u32, position: Position, active: bool) -> Cursor {
        Cursor { partition, position, fetch_owner: None, resolved: false, active, revoking: false }
    }

    /// A fetch that carries this cursor is out.
    pub(super) fn in_flight(&self) -> bool {
        self.fetch_owner.is_some()
    }
}

const _: () = assert!(
    std::mem::size_of::<Cursor>() + std::mem::size_of::<(u32, Position)>() + std::mem::size_of::<(u32, u64)>()
        <= SUBSCRIBER_BYTES_PER_PARTITION,
    "the memory formula's per-partition subscriber cost"
);

/// Serves one subscriber connection until it ends or the server closes it
/// (a timeout before `SUB`, shedding at the limit or for lack of file
/// descriptors, the shutdown deadline), or until it moves to another shard:
/// then returns where to, where its reading resumes, and its socket
/// (duplicated; this one closes). `resume` is a `SUB` session another shard
/// handed over: it goes on where it stood, without a request line.
pub async fn run_subscriber(
    shard: &Rc<Shard>,
    mut stream: TcpStream,
    connection: &Connection,
    resume: Option<Resume>,
) -> Option<(Resume, u16, OwnedFd)> {
    let served = async {
        match resume {
            Some(resume) => serve_session(shard, &mut stream, resume).await,
            None => serve_subscriber(shard, &mut stream, connection).await,
        }
    };
    let reason = match first(served, connection.close_requested()).await {
        // No descriptor left to duplicate into: the subscriber is dropped
        // as if it had gone (it resumes from its last line).
        Either::Left(Some((resume, to))) => return duplicate_for_handover(&stream).map(|fd| (resume, to, fd)),
        // A request line that came too late (its slot was taken over) ends
        // the session with the reason set.
        Either::Left(None) => match connection.close_reason() {
            Some(reason @ CloseReason::ShedAtLimit) => reason,
            _ => return None,
        },
        Either::Right(reason) => reason,
    };
    let config = &shard.config();
    let message = match reason {
        CloseReason::RequestTimeout => {
            ShardMetrics::add(&shard.metrics().connections_timed_out_request, 1);
            let timeout_ms = config.subscribe_request_timeout_ms;
            format!("ERR request_timeout: no SUB or GROUP line within {timeout_ms} ms of connecting\n")
        }
        CloseReason::Shed => "ERR shed: the server ran out of file descriptors and closed this connection\n".into(),
        CloseReason::ShedAtLimit => {
            let limit = usize::from(shard.shard_count()) * config.subscribers_per_shard_max;
            format!(
                "ERR shed: the server reached its subscriber limit ({limit}) and closed this connection, the oldest \
                 without a SUB or GROUP line, to admit a newer one\n"
            )
        }
        CloseReason::IdleTimeout | CloseReason::LineTimeout | CloseReason::ShutdownDeadline => return None,
    };
    write_goodbye(&mut stream, message.as_bytes()).await;
    None
}

/// A `SUB` session on its way to another shard: its stream and where each
/// of its partitions resumes (every cursor resolved, every line before it
/// written).
pub struct Resume {
    route: StreamRoute,
    cursors: Vec<(u32, Position)>,
}

async fn serve_subscriber(shard: &Rc<Shard>, stream: &mut TcpStream, connection: &Connection) -> Option<(Resume, u16)> {
    let (request_line, rest) = match first(read_request_line(stream), shard.lifecycle().shutdown_requested()).await {
        Either::Left(Some(read)) => read,
        Either::Left(None) => return None,
        Either::Right(()) => {
            write_goodbye(stream, b"ERR shutting_down: the server is stopping\n").await;
            return None;
        }
    };
    if request_line.starts_with(b"GROUP") {
        super::member::serve_member(shard, stream, connection, &request_line, rest).await;
        return None;
    }
    let resolved = parse_subscribe(&request_line).and_then(|request| {
        let route = shard.route_for(request.stream.as_bytes());
        let route = route.ok_or_else(|| SubscribeError::UnknownStream { stream: request.stream.to_string() })?;
        request.check(route.partitions)?;
        Ok((request, route))
    });
    let (request, route) = match resolved {
        Ok(resolved) => resolved,
        Err(error) => {
            write_goodbye(stream, format!("ERR {error}\n").as_bytes()).await;
            return None;
        }
    };
    if !connection.greet_subscriber() {
        return None;
    }
    let start = match request.start {
        StartOffset::Earliest => Position::Earliest,
        StartOffset::Latest => Position::Latest,
        StartOffset::At(offset) => Position::Requested(offset),
    };
    // Cursors carry global partition ids (what placement and owners know).
    let partitions: Vec<u32> = match request.partitions {
        PartitionSelector::All => (route.base..route.base + route.partitions).collect(),
        PartitionSelector::One(partition) => vec![route.base + partition],
    };
    let cursors = partitions.into_iter().map(|partition| (partition, start)).collect();
    serve_session(shard, stream, Resume { route, cursors }).await
}

/// Reads the partitions of `session.route` from where `session.cursors`
/// stand until the subscriber goes, the server closes it, or it is to move
/// to another shard: then what the next shard needs, and which shard.
async fn serve_session(shard: &Rc<Shard>, stream: &mut TcpStream, session: Resume) -> Option<(Resume, u16)> {
    let Resume { route, cursors } = session;
    // A cursor that stands at an offset was resolved by its owner before
    // (a moved session's are all resolved); a new `SUB`'s are not.
    let cursors: Vec<Cursor> = cursors
        .into_iter()
        .map(|(partition, position)| {
            let mut cursor = Cursor::new(partition, position, true);
            cursor.resolved = matches!(position, Position::At(_));
            cursor
        })
        .collect();
    // Per owner: up to STANDING_FETCH_REPLIES_MAX replies of a standing
    // fetch and the final one that may follow them; and one being written.
    let inbox_capacity =
        usize::from(shard.shard_count()) * (STANDING_FETCH_REPLIES_MAX as usize + 1) + 1 + DELETION_NOTICE_SLOTS;
    let (inbox_sender, inbox) = local_channel::new_bounded(inbox_capacity);
    let registration = Registration::new(shard, inbox_sender, route.id);
    let window = FetchWindow { bytes: shard.config().fetch_bytes_max, replies: STANDING_FETCH_REPLIES_MAX };
    let mut session = Session::new(shard, route, registration.subscription_id, cursors, Some(window));
    session.movable = true;
    let to = session.run(stream, &inbox).await.ok().flatten()?;
    let cursors = session.cursors.iter().map(|cursor| (cursor.partition, cursor.position)).collect();
    // Dropping the registration cancels the fetches out: what they would
    // have sent is read again from the cursors by the next shard.
    drop(registration);
    Some((Resume { route, cursors }, to))
}

/// A subscription registered with the shard; dropping it (also when the
/// session is cut) unregisters it and cancels its parked fetches.
pub(super) struct Registration<'a> {
    shard: &'a Shard,
    pub(super) subscription_id: u64,
}

impl<'a> Registration<'a> {
    pub(super) fn new(
        shard: &'a Shard,
        inbox: local_channel::LocalSender<FetchReply>,
        stream_id: u32,
    ) -> Registration<'a> {
        ShardMetrics::add(&shard.metrics().subscribers_open, 1);
        Registration { shard, subscription_id: shard.subscriptions().register(inbox, stream_id) }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.shard.unregister_subscription(self.subscription_id);
        let gauge = &self.shard.metrics().subscribers_open;
        gauge.set(gauge.get() - 1);
    }
}

/// Reads the first line; returns it (without LF) and any bytes after it. A
/// line past [`SUBSCRIBE_REQUEST_SIZE_MAX`] is read on to its end (at most
/// [`SUBSCRIBE_REQUEST_SKIP_BYTES_MAX`]) so that the refusal names its size.
async fn read_request_line(stream: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut request = Vec::new();
    let mut chunk = [0u8; 256];
    loop {
        let count = stream.read(&mut chunk).await.ok()?;
        if count == 0 {
            return None;
        }
        request.extend_from_slice(&chunk[..count]);
        if let Some(end) = memchr::memchr(b'\n', &request) {
            // A SUB subscriber sends nothing more that matters; a group
            // member's next lines (commits, pings) are kept.
            let rest = request.split_off(end + 1);
            request.truncate(end);
            return Some((request, rest));
        }
        if request.len() > SUBSCRIBE_REQUEST_SIZE_MAX {
            let limit = SUBSCRIBE_REQUEST_SIZE_MAX;
            let size =
                match super::overlong::skip_overlong(stream, request.len(), SUBSCRIBE_REQUEST_SKIP_BYTES_MAX).await {
                    Overlong::Measured { line_size, .. } => format!("{line_size} bytes"),
                    Overlong::Unfinished { line_size_min } => {
                        format!("at least {line_size_min} bytes (its end was not read)")
                    }
                    Overlong::Closed => return None,
                };
            let message = format!("ERR bad_request: request line of {size}, limit {limit}\n");
            write_goodbye(stream, message.as_bytes()).await;
            return None;
        }
    }
}

/// A subscription's fetch to one owner.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Outstanding {
    None,
    Out,
    /// Out, and asked to come back early: a cursor for that owner is waiting
    /// to be fetched (its partition moved there after the fetch left).
    Woken,
}

pub(super) struct Session<'a> {
    /// The global id of the stream's partition 0: lines a subscriber reads
    /// carry `global - base`.
    pub(super) base: u32,
    /// The stream it reads (every fetch names it).
    pub(super) stream_id: u32,
    pub(super) shard: &'a Rc<Shard>,
    pub(super) subscription_id: u64,
    pub(super) cursors: Vec<Cursor>,
    /// Cursors no owner has answered for yet. Until it is zero nothing is
    /// written, so a request past a partition's end is refused before any
    /// event line.
    pub(super) unresolved: usize,
    /// Per owner: whether a fetch to it is out.
    pub(super) outstanding: Vec<Outstanding>,
    /// Where the next fetch starts in `cursors`, so a large budget is shared
    /// fairly among partitions over time.
    pub(super) rotation: usize,
    /// Replies applied but not yet written (while cursors are unresolved).
    /// Their records are within each owner's window, and the lines being
    /// written within one more budget: the (S + 1) fetch budgets of the
    /// formula.
    pub(super) held: Vec<FetchReply>,
    /// The window each fetch offers its owner to stand with (`None`: one
    /// reply per fetch, as group members read).
    pub(super) window: Option<FetchWindow>,
    /// Per owner: what its standing fetch has sent and this session has
    /// written out since the window was last given back.
    pub(super) used: Vec<FetchWindow>,
    /// Lines rendered from replies, being written; kept (empty) between
    /// writes so rendering allocates nothing ([`super::render`]).
    pub(super) out: Vec<u8>,
    /// A `SUB` session may move to another shard (module doc of
    /// [`crate::subscribe`]); a group member stays.
    pub(super) movable: bool,
}

/// What a subscriber session waited for.
// One on the stack per wait; boxing the reply would allocate per reply.
#[allow(clippy::large_enum_variant)]
enum Wake {
    Reply(Option<FetchReply>),
    Shutdown,
    /// The subscriber sent bytes (ignored) or closed (`Ok(0)` or an error).
    Read(std::io::Result<usize>),
}

impl<'a> Session<'a> {
    pub(super) fn new(
        shard: &'a Rc<Shard>,
        stream: crate::stream::StreamRoute,
        subscription_id: u64,
        cursors: Vec<Cursor>,
        window: Option<FetchWindow>,
    ) -> Session<'a> {
        let shard_count = usize::from(shard.shard_count());
        Session {
            shard,
            base: stream.base,
            stream_id: stream.id,
            subscription_id,
            unresolved: cursors.iter().filter(|cursor| !cursor.resolved).count(),
            cursors,
            outstanding: vec![Outstanding::None; shard_count],
            rotation: 0,
            held: Vec::new(),
            window,
            used: vec![FetchWindow::default(); shard_count],
            out: Vec::new(),
            movable: false,
        }
    }
}

impl Session<'_> {
    /// Serves the session; `Ok(Some(shard))` when it is to move there (every
    /// line before its cursors written, none held).
    async fn run(
        &mut self,
        stream: &mut TcpStream,
        inbox: &local_channel::LocalReceiver<FetchReply>,
    ) -> std::io::Result<Option<u16>> {
        let mut ignored = [0u8; 512];
        loop {
            // Replies from this shard's own partitions can arrive within the
            // same poll: never run past the task's time slice on them.
            glommio::yield_if_needed().await;
            if let Some(to) = self.move_target() {
                return Ok(Some(to));
            }
            self.send_fetches();
            let shutdown = self.shard.lifecycle().shutdown_requested();
            let wake = match first(inbox.recv(), first(shutdown, stream.read(&mut ignored))).await {
                Either::Left(reply) => Wake::Reply(reply),
                Either::Right(Either::Left(())) => Wake::Shutdown,
                Either::Right(Either::Right(read)) => Wake::Read(read),
            };
            match wake {
                Wake::Reply(None) | Wake::Read(Ok(0) | Err(_)) => return Ok(None),
                Wake::Read(Ok(_)) => {}
                Wake::Shutdown => return self.close(stream, inbox).await.map(|()| None),
                Wake::Reply(Some(reply)) => {
                    let Some(in_flight_between_owners) = self.apply_ready(stream, inbox, Some(reply)).await else {
                        return Ok(None);
                    };
                    self.write_held(stream, false).await?;
                    self.give_back_windows();
                    if in_flight_between_owners {
                        // A partition is moving: ask again shortly, not at
                        // once. The owner may be this shard, which answers
                        // within the same poll, so asking at once spins
                        // without ever yielding and starves the very tasks
                        // that finish the move (a livelock seen with 4
                        // shards on 2 CPUs).
                        let delay = Duration::from_millis(super::FETCH_RETRY_DELAY_MS);
                        let _ = first(glommio::timer::sleep(delay), self.shard.lifecycle().shutdown_requested()).await;
                    }
                }
            }
        }
    }

    /// The shard this `SUB` session should move to now, if any: the process
    /// is gathered and this shard keeps no partition, so every reply would
    /// cross to it and wake it. Only between replies: every cursor resolved
    /// and every line before it written. A session does not move back when
    /// the process spreads again (producers do): a spread comes with a high
    /// load, when a move costs the subscriber most, and a subscriber on a
    /// kept shard is woken by half the replies at most.
    fn move_target(&self) -> Option<u16> {
        if !self.movable || self.unresolved > 0 || !self.held.is_empty() {
            return None;
        }
        self.shard.connection_move_target()
    }

    /// The server is shutting down: write the replies already here, then the
    /// `CLOSING` notice with every partition's resume position.
    async fn close(
        &mut self,
        stream: &mut TcpStream,
        inbox: &local_channel::LocalReceiver<FetchReply>,
    ) -> std::io::Result<()> {
        if self.apply_ready(stream, inbox, None).await.is_none() {
            return Ok(());
        }
        self.write_held(stream, true).await?;
        let mut notice = Vec::with_capacity(CLOSING_NOTICE_CHUNK_BYTES + 64);
        write_closing_start(&mut notice);
        for cursor in &self.cursors {
            let resume = match cursor.position {
                Position::At(offset) | Position::Requested(offset) | Position::Resume(offset) => {
                    StartOffset::At(offset)
                }
                Position::Earliest => StartOffset::Earliest,
                Position::Latest => StartOffset::Latest,
            };
            write_closing_entry(&mut notice, cursor.partition - self.base, resume);
            if notice.len() >= CLOSING_NOTICE_CHUNK_BYTES {
                stream.write_all(&notice).await?;
                notice.clear();
            }
        }
        write_closing_end(&mut notice);
        stream.write_all(&notice).await?;
        stream.flush().await?;
        ShardMetrics::add(&self.shard.metrics().closing_notices, 1);
        Ok(())
    }

    /// Applies `first`, then every reply already in the inbox, so that
    /// they leave in one write (every write wakes the subscriber's reader).
    /// Returns whether a partition is moving between owners, or `None` when
    /// a reply was refused (the goodbye is written; the session ends).
    async fn apply_ready(
        &mut self,
        stream: &mut TcpStream,
        inbox: &local_channel::LocalReceiver<FetchReply>,
        first: Option<FetchReply>,
    ) -> Option<bool> {
        let mut in_flight_between_owners = false;
        let mut next = first;
        if next.is_none() {
            next = futures_lite::future::poll_once(inbox.recv()).await.flatten();
        }
        while let Some(reply) = next {
            if self.refuse_out_of_range(stream, &reply).await {
                return None;
            }
            in_flight_between_owners |= !reply.moved.is_empty() || !reply.waiting.is_empty();
            self.apply_reply(reply);
            next = futures_lite::future::poll_once(inbox.recv()).await.flatten();
        }
        Some(in_flight_between_owners)
    }

    /// Ends the subscription if an owner found its requested offset past a
    /// partition's end, or its stream deleted; returns whether it did.
    async fn refuse_out_of_range(&self, stream: &mut TcpStream, reply: &FetchReply) -> bool {
        if !reply.deleted.is_empty() {
            write_goodbye(stream, b"ERR stream_deleted: the stream of this subscription was deleted\n").await;
            return true;
        }
        let Some(&(partition, next_offset)) = reply.out_of_range.first() else { return false };
        ShardMetrics::add(&self.shard.metrics().subscribe_offsets_out_of_range, 1);
        let mut message = Vec::new();
        write_offset_out_of_range(&mut message, partition - self.base, next_offset);
        write_goodbye(stream, &message).await;
        true
    }

    /// Writes the held replies once every cursor is resolved (or `force`).
    pub(super) async fn write_held<W: futures_lite::AsyncWrite + Unpin>(
        &mut self,
        stream: &mut W,
        force: bool,
    ) -> std::io::Result<()> {
        if self.unresolved > 0 && !force {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        for reply in &held {
            let owner = usize::from(reply.owner);
            if reply.standing && self.outstanding[owner] != Outstanding::None {
                self.used[owner].bytes += reply.records.size_bytes();
                self.used[owner].replies += 1;
            }
        }
        let chunk_bytes = self.shard.config().fetch_bytes_max;
        write_replies(stream, &mut self.out, held, self.base, chunk_bytes, self.shard.metrics()).await
    }

    /// Sends one fetch to every owner that has none out and holds cursors
    /// that are not in flight. An owner whose fetch is out (it may be parked
    /// there until new events arrive) and that now holds a cursor the fetch
    /// does not carry is asked to answer early, so the cursor is not stuck
    /// behind a fetch that may wait forever.
    pub(super) fn send_fetches(&mut self) {
        let mut requests: Vec<Option<FetchRequest>> = (0..self.outstanding.len()).map(|_| None).collect();
        let cursor_count = self.cursors.len();
        self.rotation = (self.rotation + 1) % cursor_count;
        // While some cursor is unresolved (a partition arriving at its
        // owner, a mirror catching up), nothing is written: the resolved
        // ones wait too, so the held replies stay within one round of
        // fetches however long that takes.
        let resolving = self.unresolved > 0;
        for step in 0..cursor_count {
            let cursor = &mut self.cursors[(self.rotation + step) % cursor_count];
            let owner = usize::from(self.shard.owner_of(cursor.partition));
            if cursor.in_flight() || !cursor.active || cursor.revoking || (resolving && cursor.resolved) {
                continue;
            }
            if self.outstanding[owner] != Outstanding::None {
                if self.outstanding[owner] == Outstanding::Out {
                    self.outstanding[owner] = Outstanding::Woken;
                    self.shard.send_fetch_wake(owner as u16, self.subscription_id);
                }
                continue;
            }
            cursor.fetch_owner = Some(owner as u16);
            requests[owner]
                .get_or_insert_with(|| FetchRequest {
                    subscription_id: self.subscription_id,
                    stream_id: self.stream_id,
                    cursors: Vec::new(),
                    bytes_max: self.shard.config().fetch_bytes_max,
                    window: self.window,
                })
                .cursors
                .push((cursor.partition, cursor.position));
        }
        for (owner, request) in requests.into_iter().enumerate() {
            if let Some(request) = request {
                self.outstanding[owner] = Outstanding::Out;
                self.used[owner] = FetchWindow::default();
                self.shard.send_fetch(owner as u16, request);
            }
        }
    }

    /// Gives each standing fetch back the window its written-out replies
    /// used, once that is half of it (so a subscriber that keeps up sends
    /// one credit per half window, not one request per reply).
    pub(super) fn give_back_windows(&mut self) {
        let Some(window) = self.window else { return };
        for owner in 0..self.used.len() {
            let used = self.used[owner];
            let half_used = used.bytes * 2 >= window.bytes || used.replies * 2 >= window.replies;
            if self.outstanding[owner] == Outstanding::None || !half_used {
                continue;
            }
            self.used[owner] = FetchWindow::default();
            let credit = FetchCredit { subscription_id: self.subscription_id, returned: used };
            self.shard.send_fetch_credit(owner as u16, credit);
        }
    }

    pub(super) fn cursor_mut(&mut self, partition: u32) -> &mut Cursor {
        let index = if self.cursors.len() == 1 { 0 } else { (partition - self.base) as usize };
        let cursor = &mut self.cursors[index];
        assert_eq!(cursor.partition, partition, "reply for a partition this subscription does not read");
        cursor
    }

    /// Moves the cursors a reply answers and holds the reply for writing.
    /// The last reply of a fetch (not standing) frees every cursor the fetch
    /// carried, those it names and the others (on a standing fetch a reply
    /// names only the cursors that moved on; a partition that moved away or
    /// is still arriving gets its next fetch from the next `send_fetches`).
    pub(super) fn apply_reply(&mut self, reply: FetchReply) {
        let owner = reply.owner;
        for &(partition, offset) in &reply.cursors {
            let cursor = self.cursor_mut(partition);
            debug_assert_eq!(cursor.fetch_owner, Some(owner));
            if let Position::At(previous) | Position::Requested(previous) = cursor.position {
                debug_assert!(offset >= previous, "cursor went back on partition {partition}");
            }
            cursor.position = Position::At(offset);
            let newly_resolved = !std::mem::replace(&mut cursor.resolved, true);
            self.unresolved = self.unresolved.saturating_sub(usize::from(newly_resolved));
        }
        if reply.standing && self.outstanding[usize::from(owner)] == Outstanding::Woken {
            // The wake-up found the fetch out of its parking spot (being
            // served): it stands again now, so ask again.
            self.outstanding[usize::from(owner)] = Outstanding::Out;
        }
        if !reply.standing {
            self.outstanding[usize::from(owner)] = Outstanding::None;
            self.used[usize::from(owner)] = FetchWindow::default();
            for cursor in self.cursors.iter_mut().filter(|cursor| cursor.fetch_owner == Some(owner)) {
                cursor.fetch_owner = None;
            }
        }
        self.held.push(reply);
    }
}
