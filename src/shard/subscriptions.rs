//! The subscriber side of fetches on one shard: the inboxes of the
//! subscribers it holds (replies from every owner land there), and the
//! fetches other shards' subscribers parked here as an owner.

use std::cell::{Cell, RefCell};

use ahash::AHashMap;
use glommio::channels::local_channel::LocalSender;

use crate::partition::fetch::{FetchCredit, FetchReply, FetchRequest, ParkedFetches};
use crate::runtime::notify::{Notify, WaitList};

pub use crate::config::limits::DELETION_NOTICE_SLOTS;

/// A subscriber's inbox, and the stream it reads.
struct Inbox {
    sender: LocalSender<FetchReply>,
    stream_id: u32,
    /// The deletion notice was sent (at most one per subscriber).
    told_deleted: bool,
}

pub struct Subscriptions {
    inboxes: RefCell<AHashMap<u64, Inbox>>,
    next_id: Cell<u64>,
    parked: RefCell<ParkedFetches>,
    /// Wakes the fetch servicer: parked fetches may have news.
    parked_notify: Notify,
    /// Peers' reads waiting for records to become readable
    /// ([`crate::shard::gap_read`]): woken with the parked fetches.
    appended: WaitList,
}

impl Subscriptions {
    pub fn new(shard_id: u16) -> Subscriptions {
        Subscriptions {
            inboxes: RefCell::default(),
            // Ids are unique across shards: the shard id in the top bits.
            next_id: Cell::new(u64::from(shard_id) << 48),
            parked: RefCell::default(),
            parked_notify: Notify::default(),
            appended: WaitList::default(),
        }
    }

    /// Registers the inbox of a subscriber (or group member) of stream
    /// `stream_id`; returns its id. The inbox must have
    /// [`DELETION_NOTICE_SLOTS`] beyond what its owners may have in flight.
    pub fn register(&self, sender: LocalSender<FetchReply>, stream_id: u32) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.inboxes.borrow_mut().insert(id, Inbox { sender, stream_id, told_deleted: false });
        id
    }

    /// Stream `stream_id` was deleted: every subscriber of it on this shard
    /// gets a reply naming `partition` deleted, which ends its session with
    /// `ERR stream_deleted` at once, whether or not its fetches would ever
    /// be answered again (on a quiet server they would not).
    pub fn tell_deleted(&self, owner: u16, stream_id: u32, partition: u32) {
        for (&subscription_id, inbox) in self.inboxes.borrow_mut().iter_mut() {
            if inbox.stream_id != stream_id || inbox.told_deleted {
                continue;
            }
            inbox.told_deleted = true;
            let mut reply = FetchReply::empty(subscription_id, owner);
            reply.deleted.push(partition);
            // The slot kept for this notice: it cannot be full.
            if inbox.sender.try_send(reply).is_err() {
                panic!("a subscriber inbox has no slot left for its deletion notice");
            }
        }
    }

    pub fn unregister(&self, subscription_id: u64) {
        self.inboxes.borrow_mut().remove(&subscription_id);
    }

    /// Hands a reply to its subscriber on this shard; a subscriber that went
    /// away drops it.
    pub fn deliver(&self, reply: FetchReply) {
        if let Some(inbox) = self.inboxes.borrow().get(&reply.subscription_id) {
            // Sized for every reply an owner may have in flight (its window,
            // then a final one): a full inbox is a bug, and dropping the
            // reply would lose its events without a word. (After a deletion
            // notice its session is ending: what follows is not read.)
            if inbox.sender.try_send(reply).is_err() && !inbox.told_deleted {
                panic!("a subscriber inbox overflowed: more replies in flight than its owners' windows allow");
            }
        }
    }

    pub fn park(&self, origin: u16, request: FetchRequest) {
        self.parked.borrow_mut().park(origin, request);
    }

    /// Takes one subscriber's parked fetch, to answer it now.
    pub fn take_parked(&self, origin: u16, subscription_id: u64) -> Option<FetchRequest> {
        self.parked.borrow_mut().take(origin, subscription_id)
    }

    pub fn cancel(&self, origin: u16, subscription_id: u64) {
        self.parked.borrow_mut().cancel(origin, subscription_id);
    }

    /// Window came back to a standing fetch parked here.
    pub fn credit(&self, origin: u16, credit: FetchCredit) {
        if self.parked.borrow_mut().credit(origin, credit) {
            // It was waiting for this credit: it may have news already.
            self.parked_notify.notify();
        }
    }

    /// Tells the servicer that parked fetches may have news (after appends,
    /// or when a partition left or arrived).
    pub fn wake_parked(&self) {
        if self.parked.borrow().any_servable() {
            self.parked_notify.notify();
        }
        self.appended.wake_all();
    }

    /// Resolves once `ready()` is true, re-checked whenever parked fetches
    /// may have news (after commit rounds and appends).
    pub fn appended<F: FnMut() -> bool + Unpin>(&self, ready: F) -> crate::runtime::notify::WaitUntil<'_, F> {
        self.appended.wait_until(ready)
    }

    /// The partitions the fetches parked here wait on.
    pub fn parked_partitions(&self, mut each: impl FnMut(u32)) {
        self.parked.borrow().partitions(&mut each);
    }

    /// Waits for [`Subscriptions::wake_parked`], then takes every parked
    /// fetch that may be served.
    pub async fn parked_with_news(&self) -> Vec<(u16, FetchRequest)> {
        self.parked_notify.notified().await;
        self.parked.borrow_mut().take_servable()
    }
}
