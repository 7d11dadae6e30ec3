//! A consumer-group member's connection: `GROUP <stream> <group> ...`, then
//! the partitions its coordinator assigns, read from their owners exactly as
//! a `SUB` subscriber reads them ([`super::session::Session`]), with the
//! member's commits, pings and `LEAVE` read concurrently.
//!
//! The connection is split: a reader handles the member's lines as they
//! come (so a member that is slow to read still commits and stays alive), a
//! writer writes events, `ASSIGNED`/`REVOKED`, commit answers and errors.
//! A revocation completes only once no fetch carrying the partition is out
//! and every line of it fetched so far is written: then `REVOKED` is
//! written and the coordinator told, and only then may the partition go to
//! another member. The session ends when the member closes, leaves, times
//! out (no line within `--group-session-timeout-ms`), is expelled (a
//! revocation not finished within the same time), or the server stops; the
//! coordinator hears of it at once ([`Membership`]'s drop).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;

use super::overlong::Overlong;
use super::session::{Cursor, Outstanding, Registration, Session};
use crate::net::Connection;
use crate::net::socket::write_goodbye;
use crate::partition::fetch::{FetchReply, Position};
use crate::protocol::group::{
    GROUP_REQUEST_SIZE_MAX, GroupError, GroupRequest, JoinRequest, OffsetReset, RequestError, parse_group_request,
    write_assigned, write_commit_ok, write_group_error, write_revoked,
};
use crate::runtime::log;
use crate::runtime::notify::{Either, Notify, first};
use crate::shard::Shard;
use crate::shard::groups::{COMMITS_IN_FLIGHT_MAX, GroupFrame, GroupKey, MemberEvent, MemberInbox};
use crate::shard::metrics::ShardMetrics;

/// Serves a connection whose first line starts with `GROUP`.
pub async fn serve_member(
    shard: &Rc<Shard>,
    stream: &mut TcpStream,
    connection: &Connection,
    line: &[u8],
    rest: Vec<u8>,
) {
    let join = match parse_group_request(line) {
        Ok(GroupRequest::Join(join)) => join,
        Ok(_) => return,
        Err(error) => {
            let mut message = Vec::new();
            write_group_error(&mut message, &GroupError::BadRequest(error));
            write_goodbye(stream, &message).await;
            return;
        }
    };
    let Some(route) = shard.route_for(join.stream.as_bytes()) else {
        let mut message = Vec::new();
        write_group_error(&mut message, &GroupError::UnknownStream { stream: join.stream });
        write_goodbye(stream, &message).await;
        return;
    };
    if shard.stream_is_replicated(route.id) {
        let mut message = Vec::new();
        write_group_error(&mut message, &GroupError::ReplicatedStream { stream: join.stream });
        write_goodbye(stream, &message).await;
        return;
    }
    if !connection.greet_subscriber() {
        return;
    }
    let inbox_capacity = usize::from(shard.shard_count()) + 1 + crate::shard::subscriptions::DELETION_NOTICE_SLOTS;
    let (inbox_sender, inbox) = local_channel::new_bounded(inbox_capacity);
    let registration = Registration::new(shard, inbox_sender, route.id);
    let member = registration.subscription_id;
    let key: GroupKey = (route.id, join.group.to_string());
    let membership = Membership::join(shard, member, key, &join, (route.base, route.partitions));
    let cursors = (0..route.partitions).map(|local| Cursor::new(route.base + local, Position::Latest, false)).collect();
    // Members' fetches do not stand: a revocation must be able to see each
    // fetch come back (one reply per fetch, as before standing fetches).
    let mut session = Session::new(shard, route, member, cursors, None);
    session.unresolved = 0;
    let shared = Shared {
        session: RefCell::new(session),
        report_start: RefCell::new(vec![false; route.partitions as usize]),
        control: RefCell::default(),
        control_notify: Notify::default(),
        last_line: Cell::new(Instant::now()),
        commits_in_flight: Cell::new(0),
        commit_notify: Notify::default(),
        leaving: Cell::new(false),
        membership,
    };
    let (reader, mut writer) = futures_lite::io::split(&mut *stream);
    let session = first(write_loop(&shared, &mut writer, &inbox), read_loop(&shared, reader, rest));
    let ending = match first(session, watchdog(&shared)).await {
        Either::Left(Either::Left(ending)) => ending,
        Either::Left(Either::Right(())) => None,
        Either::Right(last) => Some(last),
    };
    if let Some(last) = ending {
        let mut message = std::mem::take(&mut *shared.control.borrow_mut());
        message.extend_from_slice(&last);
        write_goodbye(stream, &message).await;
    }
    drop(shared);
    drop(registration);
}

/// The member as its coordinator knows it: joined on creation, left on drop
/// (whatever ends the session, the cut at the shutdown deadline included).
struct Membership<'a> {
    shard: &'a Rc<Shard>,
    member: u64,
    key: GroupKey,
    coordinator: u16,
    inbox: Rc<MemberInbox>,
}

impl<'a> Membership<'a> {
    fn join(
        shard: &'a Rc<Shard>,
        member: u64,
        key: GroupKey,
        join: &JoinRequest<'_>,
        (base, partitions): (u32, u32),
    ) -> Membership<'a> {
        let inbox = shard.groups().register_member(member);
        let gauge = &shard.metrics().group_members;
        gauge.set(gauge.get() + 1);
        let coordinator = shard.group_coordinator(&key);
        let frame = GroupFrame::Join {
            member,
            key: key.clone(),
            stream: join.stream.to_string(),
            base,
            partitions,
            reset: join.reset,
            hold: join.hold,
        };
        shard.send_group(coordinator, frame);
        Membership { shard, member, key, coordinator, inbox }
    }

    fn send(&self, frame: GroupFrame) {
        self.shard.send_group(self.coordinator, frame);
    }
}

impl Drop for Membership<'_> {
    fn drop(&mut self) {
        self.shard.groups().unregister_member(self.member);
        let gauge = &self.shard.metrics().group_members;
        gauge.set(gauge.get() - 1);
        self.send(GroupFrame::Leave { member: self.member, key: self.key.clone() });
    }
}

/// What the reader and the writer share. Borrows are never held across an
/// `.await`.
struct Shared<'a> {
    session: RefCell<Session<'a>>,
    /// Per partition: its start came from the member's reset (the group
    /// never committed it); tell the coordinator where that resolved.
    report_start: RefCell<Vec<bool>>,
    /// Lines for the writer to send (commit errors).
    control: RefCell<Vec<u8>>,
    control_notify: Notify,
    last_line: Cell<Instant>,
    commits_in_flight: Cell<usize>,
    commit_notify: Notify,
    leaving: Cell<bool>,
    membership: Membership<'a>,
}

impl Shared<'_> {
    fn push_error(&self, error: &GroupError<'_>) {
        write_group_error(&mut self.control.borrow_mut(), error);
        self.control_notify.notify();
    }

    /// Handles one line from the member.
    fn on_line(&self, line: &[u8]) {
        self.last_line.set(Instant::now());
        match parse_group_request(line) {
            Ok(GroupRequest::Commit { partition, next_offset }) => {
                if let Err(error) = self.check_commit(partition, next_offset) {
                    ShardMetrics::add(&self.membership.shard.metrics().group_commits_refused, 1);
                    self.push_error(&error);
                    return;
                }
                self.commits_in_flight.set(self.commits_in_flight.get() + 1);
                let key = self.membership.key.clone();
                self.membership.send(GroupFrame::Commit {
                    member: self.membership.member,
                    key,
                    partition,
                    next_offset,
                });
            }
            Ok(GroupRequest::Ping) => {}
            Ok(GroupRequest::Leave) => {
                self.leaving.set(true);
                self.control_notify.notify();
            }
            Ok(GroupRequest::Join(_)) => self.push_error(&GroupError::AlreadyJoined),
            Err(error) => self.push_error(&GroupError::BadRequest(error)),
        }
    }

    /// A commit is taken for a partition this member holds (up to its
    /// `REVOKED` line), up to the offsets it was sent.
    fn check_commit(&self, partition: u32, next_offset: u64) -> Result<(), GroupError<'static>> {
        let session = self.session.borrow();
        let partition_count = session.cursors.len() as u32;
        let Some(cursor) = session.cursors.get(partition as usize) else {
            return Err(GroupError::PartitionOutOfRange { partition, partition_count });
        };
        if !cursor.active {
            return Err(GroupError::NotAssigned { partition });
        }
        let sent = match cursor.position {
            Position::At(offset) | Position::Resume(offset) | Position::Requested(offset) => offset,
            Position::Earliest | Position::Latest => 0,
        };
        if next_offset > sent {
            return Err(GroupError::OffsetOutOfRange { partition, next_offset, partition_end: sent });
        }
        Ok(())
    }
}

/// Reads the member's lines until it closes (then the session ends).
async fn read_loop<R: futures_lite::AsyncRead + Unpin>(shared: &Shared<'_>, mut reader: R, mut buffer: Vec<u8>) {
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(end) = memchr::memchr(b'\n', &buffer) {
            shared.on_line(&buffer[..end]);
            buffer.drain(..=end);
            while shared.commits_in_flight.get() >= COMMITS_IN_FLIGHT_MAX {
                shared.commit_notify.notified().await;
            }
        }
        if buffer.len() > GROUP_REQUEST_SIZE_MAX {
            // Drop the rest of the overlong line, measuring it for the ERR
            // (the session timeout bounds a line that never ends).
            match super::overlong::skip_overlong(&mut reader, buffer.len(), usize::MAX).await {
                Overlong::Measured { line_size, rest } => {
                    shared.push_error(&GroupError::BadRequest(RequestError::TooLong { line_size }));
                    buffer = rest;
                }
                Overlong::Unfinished { .. } | Overlong::Closed => return,
            }
            continue;
        }
        if shared.leaving.get() {
            // The writer answers what is in flight, then ends the session.
            return futures_lite::future::pending().await;
        }
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(count) => buffer.extend_from_slice(&chunk[..count]),
        }
    }
}

/// What the writer waited for.
// One on the stack per wait; boxing the reply would allocate per reply.
#[allow(clippy::large_enum_variant)]
enum Wake {
    Reply(Option<FetchReply>),
    Member,
    Shutdown,
    Control,
}

/// Writes what the member gets until the session ends; returns the last
/// lines to write (an `ERR` that ends it), if any.
async fn write_loop<W: futures_lite::AsyncWrite + Unpin>(
    shared: &Shared<'_>,
    writer: &mut W,
    inbox: &local_channel::LocalReceiver<FetchReply>,
) -> Option<Vec<u8>> {
    // Revocations not yet finished, in the order they came.
    let mut revocations: Vec<(u64, Vec<u32>)> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    loop {
        glommio::yield_if_needed().await;
        if let Some((_, partitions)) = revocations.first()
            && revocation_ready(shared, partitions)
        {
            let (generation, partitions) = revocations.remove(0);
            finish_revocation(shared, writer, &mut out, generation, partitions).await.ok()?;
            continue;
        }
        shared.session.borrow_mut().send_fetches();
        let control = std::mem::take(&mut *shared.control.borrow_mut());
        if !control.is_empty() {
            writer.write_all(&control).await.ok()?;
        }
        if shared.leaving.get() && shared.commits_in_flight.get() == 0 {
            let _ = writer.flush().await;
            return None;
        }
        match wait_for_wake(shared, inbox).await {
            Wake::Reply(None) => return None,
            Wake::Reply(Some(reply)) => {
                if !reply.deleted.is_empty() {
                    let _ = writer.write_all(b"ERR stream_deleted: the stream of this group was deleted\n").await;
                    return None;
                }
                on_reply(shared, writer, reply).await.ok()?;
            }
            Wake::Member => {
                while let Some(event) = shared.membership.inbox.pop() {
                    if let Some(last) = on_member_event(shared, event, &mut out, &mut revocations) {
                        return Some(last);
                    }
                }
                if !out.is_empty() {
                    writer.write_all(&out).await.ok()?;
                    out.clear();
                }
            }
            Wake::Shutdown => {
                // What was fetched goes out; the member resumes from its
                // commits on another connection.
                let _ = write_replies(shared, writer).await;
                let _ = writer.flush().await;
                return None;
            }
            Wake::Control => {}
        }
    }
}

/// Waits for what the writer acts on next.
async fn wait_for_wake(shared: &Shared<'_>, inbox: &local_channel::LocalReceiver<FetchReply>) -> Wake {
    let member = shared.membership.inbox.wait();
    let shutdown = shared.membership.shard.lifecycle().shutdown_requested();
    let control = shared.control_notify.notified();
    match first(inbox.recv(), first(member, first(shutdown, control))).await {
        Either::Left(reply) => Wake::Reply(reply),
        Either::Right(Either::Left(())) => Wake::Member,
        Either::Right(Either::Right(Either::Left(()))) => Wake::Shutdown,
        Either::Right(Either::Right(Either::Right(()))) => Wake::Control,
    }
}

/// Takes in a fetch reply and writes what it brought.
async fn on_reply<W: futures_lite::AsyncWrite + Unpin>(
    shared: &Shared<'_>,
    writer: &mut W,
    reply: FetchReply,
) -> std::io::Result<()> {
    let in_flight_between_owners = !reply.moved.is_empty() || !reply.waiting.is_empty();
    report_starts(shared, &reply);
    shared.session.borrow_mut().apply_reply(reply);
    write_replies(shared, writer).await?;
    if in_flight_between_owners {
        // As for SUB: ask again shortly, not at once.
        let delay = Duration::from_millis(super::FETCH_RETRY_DELAY_MS);
        let shutdown = shared.membership.shard.lifecycle().shutdown_requested();
        let _ = first(glommio::timer::sleep(delay), shutdown).await;
    }
    Ok(())
}

/// Ends a revocation whose partitions have nothing in flight: writes what
/// was fetched for them, then `REVOKED`, stops their cursors and tells the
/// coordinator.
async fn finish_revocation<W: futures_lite::AsyncWrite + Unpin>(
    shared: &Shared<'_>,
    writer: &mut W,
    out: &mut Vec<u8>,
    generation: u64,
    partitions: Vec<u32>,
) -> std::io::Result<()> {
    write_replies(shared, writer).await?;
    write_revoked(out, generation, &partitions);
    {
        let mut session = shared.session.borrow_mut();
        for &local in &partitions {
            let cursor = &mut session.cursors[local as usize];
            cursor.active = false;
            cursor.revoking = false;
        }
    }
    writer.write_all(out).await?;
    out.clear();
    let key = shared.membership.key.clone();
    shared.membership.send(GroupFrame::RevokeDone { member: shared.membership.member, key, partitions });
    Ok(())
}

/// Ends the session when the member has sent no line for the session
/// timeout or its coordinator expelled it, even while the writer is stuck on a member that does not read
/// (its partitions must not be held by a process that stopped). Returns the
/// last line.
async fn watchdog(shared: &Shared<'_>) -> Vec<u8> {
    let shard = shared.membership.shard;
    let session_timeout_ms = shard.config().group_session_timeout_ms;
    let timeout = Duration::from_millis(session_timeout_ms);
    loop {
        let idle = shared.last_line.get().elapsed();
        if idle >= timeout {
            ShardMetrics::add(&shard.metrics().group_members_expelled, 1);
            let mut last = Vec::new();
            write_group_error(&mut last, &GroupError::SessionTimeout { session_timeout_ms });
            return last;
        }
        let sleep = glommio::timer::sleep(timeout - idle + Duration::from_millis(1));
        if let Either::Right(()) = first(sleep, shared.membership.inbox.expelled()).await {
            let mut last = Vec::new();
            write_group_error(&mut last, &GroupError::RevokeTimeout { revoke_timeout_ms: session_timeout_ms });
            return last;
        }
    }
}

/// A revocation can finish once no fetch carrying its partitions is out.
fn revocation_ready(shared: &Shared<'_>, partitions: &[u32]) -> bool {
    let session = shared.session.borrow();
    partitions.iter().all(|&local| !session.cursors[local as usize].in_flight())
}

/// Writes the replies applied so far.
async fn write_replies<W: futures_lite::AsyncWrite + Unpin>(
    shared: &Shared<'_>,
    writer: &mut W,
) -> std::io::Result<()> {
    let (replies, mut out, base) = {
        let mut session = shared.session.borrow_mut();
        (std::mem::take(&mut session.held), std::mem::take(&mut session.out), session.base)
    };
    let shard = shared.membership.shard;
    let chunk_bytes = shard.config().fetch_bytes_max;
    let written = super::render::write_replies(writer, &mut out, replies, base, chunk_bytes, shard.metrics()).await;
    shared.session.borrow_mut().out = out;
    written
}

/// Tells the coordinator where partitions the group never committed
/// started (their first reply resolved `earliest`/`latest`).
fn report_starts(shared: &Shared<'_>, reply: &FetchReply) {
    let base = shared.session.borrow().base;
    for &(partition, committed, end, resumed) in &reply.resumed_past_end {
        let shard = shared.session.borrow().shard.clone();
        ShardMetrics::add(&shard.metrics().group_offsets_past_end, 1);
        let (stream_id, group) = &shared.membership.key;
        log::warn!(
            shard = shard.id(),
            "group {group} of stream id {stream_id}: committed offset {committed} of partition {} is past its end \
             {end}: the log lost events the group had read; reading resumes at {resumed}, where this run opened \
             the partition",
            partition - base
        );
    }
    let mut report_start = shared.report_start.borrow_mut();
    for &(partition, _) in &reply.cursors {
        let local = partition - base;
        if std::mem::take(&mut report_start[local as usize]) {
            // Where reading started: the first event's offset, or the
            // cursor's when the reply has none.
            let offset = reply.records.first_offset_of(partition).unwrap_or_else(|| {
                reply.cursors.iter().find(|(p, _)| *p == partition).map_or(0, |(_, offset)| *offset)
            });
            let key = shared.membership.key.clone();
            shared.membership.send(GroupFrame::CommitStart { key, partition: local, offset });
        }
    }
}

/// Starts the cursors of newly assigned partitions where the group said
/// (a committed offset, or the reset policy).
fn start_cursors(shared: &Shared<'_>, partitions: &[u32], starts: Vec<crate::group::Start>) {
    let mut session = shared.session.borrow_mut();
    let mut report_start = shared.report_start.borrow_mut();
    for (&local, start) in partitions.iter().zip(starts) {
        let cursor = &mut session.cursors[local as usize];
        if cursor.active {
            continue;
        }
        cursor.active = true;
        cursor.revoking = false;
        cursor.resolved = false;
        cursor.position = match start {
            crate::group::Start::Committed(offset) => Position::Resume(offset),
            crate::group::Start::Reset(OffsetReset::Earliest) => Position::Earliest,
            crate::group::Start::Reset(OffsetReset::Latest) => Position::Latest,
        };
        report_start[local as usize] = matches!(start, crate::group::Start::Reset(_));
    }
}

/// Marks revoked partitions' cursors and has every fetch parked at an owner
/// that may carry them answered, so the revocation can finish.
fn begin_revocation(shared: &Shared<'_>, partitions: &[u32]) {
    let mut session = shared.session.borrow_mut();
    for &local in partitions {
        session.cursors[local as usize].revoking = true;
    }
    let owners: Vec<u16> = partitions
        .iter()
        .filter(|&&local| session.cursors[local as usize].in_flight())
        .map(|&local| session.shard.owner_of(session.base + local))
        .collect();
    for owner in owners {
        if session.outstanding[usize::from(owner)] == Outstanding::Out {
            session.outstanding[usize::from(owner)] = Outstanding::Woken;
            session.shard.send_fetch_wake(owner, session.subscription_id);
        }
    }
}

/// Applies one event from the coordinator; returns the last lines to write
/// when it ends the session.
fn on_member_event(
    shared: &Shared<'_>,
    event: MemberEvent,
    out: &mut Vec<u8>,
    revocations: &mut Vec<(u64, Vec<u32>)>,
) -> Option<Vec<u8>> {
    match event {
        MemberEvent::Assigned { generation, partitions, starts } => {
            write_assigned(out, generation, &partitions);
            start_cursors(shared, &partitions, starts);
        }
        MemberEvent::Revoke { generation, partitions } => {
            begin_revocation(shared, &partitions);
            revocations.push((generation, partitions));
        }
        MemberEvent::CommitOk { partition, next_offset } => {
            write_commit_ok(out, partition, next_offset);
            shared.commits_in_flight.set(shared.commits_in_flight.get().saturating_sub(1));
            shared.commit_notify.notify();
        }
        MemberEvent::CommitRefused { partition } => {
            write_group_error(out, &GroupError::NotAssigned { partition });
            shared.commits_in_flight.set(shared.commits_in_flight.get().saturating_sub(1));
            shared.commit_notify.notify();
        }
        MemberEvent::Refused(message) => {
            let mut last = std::mem::take(out);
            last.extend_from_slice(b"ERR ");
            last.extend_from_slice(message.as_bytes());
            last.push(b'\n');
            return Some(last);
        }
        MemberEvent::Expelled => {
            let revoke_timeout_ms = shared.membership.shard.config().group_session_timeout_ms;
            let mut last = std::mem::take(out);
            write_group_error(&mut last, &GroupError::RevokeTimeout { revoke_timeout_ms });
            return Some(last);
        }
    }
    None
}
