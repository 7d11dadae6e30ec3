//! Single-thread wake-up primitives for tasks on one shard.
//!
//! glommio tasks on one executor share a thread, so these need no atomics:
//! a [`Notify`] wakes one waiting task, a [`WaitList`] wakes every task that
//! waits for a condition (credits returning, connections closing).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Wakes one waiter; a notification given while nobody waits is kept.
#[derive(Default)]
pub struct Notify {
    notified: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    pub fn notify(&self) {
        self.notified.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    /// Waits for the next notification and consumes it.
    pub fn notified(&self) -> Notified<'_> {
        Notified { notify: self }
    }
}

pub struct Notified<'a> {
    notify: &'a Notify,
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.notify.notified.replace(false) {
            return Poll::Ready(());
        }
        *self.notify.waker.borrow_mut() = Some(context.waker().clone());
        Poll::Pending
    }
}

/// Tasks waiting for a condition that they re-check after every wake-up.
///
/// Each waiting future holds one slot, registered on its first poll,
/// refreshed (not duplicated) on later polls and freed when it completes or
/// is dropped; so a task that polls a wait many times (a connection racing
/// every read against shutdown) never piles up waker clones.
#[derive(Default)]
pub struct WaitList {
    slots: RefCell<Vec<Option<Waker>>>,
    free: RefCell<Vec<usize>>,
}

impl WaitList {
    pub fn wake_all(&self) {
        let wakers: Vec<Waker> = self.slots.borrow().iter().flatten().cloned().collect();
        for waker in wakers {
            waker.wake();
        }
    }

    /// Resolves once `ready()` returns true; re-checked on every wake-up.
    pub fn wait_until<F: FnMut() -> bool + Unpin>(&self, ready: F) -> WaitUntil<'_, F> {
        WaitUntil { list: self, ready, slot: None }
    }

    /// Waiters registered now.
    #[cfg(test)]
    pub fn waiter_count(&self) -> usize {
        self.slots.borrow().iter().filter(|slot| slot.is_some()).count()
    }

    fn register(&self, slot: &mut Option<usize>, waker: &Waker) {
        let mut slots = self.slots.borrow_mut();
        match *slot {
            Some(index) => match &mut slots[index] {
                Some(current) if current.will_wake(waker) => {}
                entry => *entry = Some(waker.clone()),
            },
            None => {
                let index = self.free.borrow_mut().pop().unwrap_or_else(|| {
                    slots.push(None);
                    slots.len() - 1
                });
                slots[index] = Some(waker.clone());
                *slot = Some(index);
            }
        }
    }

    fn unregister(&self, slot: &mut Option<usize>) {
        if let Some(index) = slot.take() {
            self.slots.borrow_mut()[index] = None;
            self.free.borrow_mut().push(index);
        }
    }
}

/// The future of [`WaitList::wait_until`].
pub struct WaitUntil<'a, F: FnMut() -> bool + Unpin> {
    list: &'a WaitList,
    ready: F,
    slot: Option<usize>,
}

impl<F: FnMut() -> bool + Unpin> Future for WaitUntil<'_, F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if (this.ready)() {
            this.list.unregister(&mut this.slot);
            return Poll::Ready(());
        }
        this.list.register(&mut this.slot, context.waker());
        Poll::Pending
    }
}

impl<F: FnMut() -> bool + Unpin> Drop for WaitUntil<'_, F> {
    fn drop(&mut self) {
        self.list.unregister(&mut self.slot);
    }
}

/// Resolves with the first of two futures to finish (the other is dropped).
pub async fn first<A, B>(a: A, b: B) -> Either<A::Output, B::Output>
where
    A: Future,
    B: Future,
{
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    std::future::poll_fn(|context| {
        if let Poll::Ready(value) = a.as_mut().poll(context) {
            return Poll::Ready(Either::Left(value));
        }
        if let Poll::Ready(value) = b.as_mut().poll(context) {
            return Poll::Ready(Either::Right(value));
        }
        Poll::Pending
    })
    .await
}

pub enum Either<L, R> {
    Left(L),
    Right(R),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A waker that counts its wake-ups.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counting_waker() -> (Arc<CountingWaker>, Waker) {
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (counter.clone(), Waker::from(counter))
    }

    /// A notification given while nobody waits is kept for the next waiter,
    /// and consumed by it.
    #[test]
    fn notify_keeps_one_notification() {
        let notify = Notify::default();
        let (counter, waker) = counting_waker();
        let mut context = Context::from_waker(&waker);
        notify.notify();
        assert!(std::pin::pin!(notify.notified()).poll(&mut context).is_ready());
        let mut waiting = std::pin::pin!(notify.notified());
        assert!(waiting.as_mut().poll(&mut context).is_pending());
        notify.notify();
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        assert!(waiting.as_mut().poll(&mut context).is_ready());
    }

    /// Regression (f2a4dea): a wait polled many times (a connection racing
    /// every read against shutdown) holds one slot, not one per poll, and
    /// frees it when dropped or done.
    #[test]
    fn repeated_polls_do_not_pile_up_wakers() {
        let list = WaitList::default();
        let (counter, waker) = counting_waker();
        let mut context = Context::from_waker(&waker);
        let ready = Cell::new(false);
        {
            let mut waiting = std::pin::pin!(list.wait_until(|| ready.get()));
            for _ in 0..1000 {
                assert!(waiting.as_mut().poll(&mut context).is_pending());
            }
            assert_eq!(list.waiter_count(), 1);
            list.wake_all();
            assert_eq!(counter.0.load(Ordering::Relaxed), 1, "one slot, one wake-up");
            ready.set(true);
            assert!(waiting.as_mut().poll(&mut context).is_ready());
            assert_eq!(list.waiter_count(), 0);
        }
        let mut dropped = Box::pin(list.wait_until(|| false));
        assert!(dropped.as_mut().poll(&mut context).is_pending());
        assert_eq!(list.waiter_count(), 1);
        drop(dropped);
        assert_eq!(list.waiter_count(), 0, "a dropped wait frees its slot");
    }

    /// `first` resolves with whichever future is ready first.
    #[test]
    fn first_takes_the_ready_side() {
        let (_, waker) = counting_waker();
        let mut context = Context::from_waker(&waker);
        let race = std::pin::pin!(first(std::future::pending::<u8>(), std::future::ready(7u16)));
        match race.poll(&mut context) {
            Poll::Ready(Either::Right(7)) => {}
            _ => panic!("the ready side wins"),
        }
    }
}
