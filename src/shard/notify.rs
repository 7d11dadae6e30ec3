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
#[derive(Default)]
pub struct WaitList {
    wakers: RefCell<Vec<Waker>>,
}

impl WaitList {
    pub fn wake_all(&self) {
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for waker in wakers {
            waker.wake();
        }
    }

    pub fn waiter_count(&self) -> usize {
        self.wakers.borrow().len()
    }

    /// Resolves once `ready()` returns true; re-checked on every wake-up.
    pub async fn wait_until(&self, mut ready: impl FnMut() -> bool) {
        std::future::poll_fn(|context| {
            if ready() {
                return Poll::Ready(());
            }
            self.wakers.borrow_mut().push(context.waker().clone());
            Poll::Pending
        })
        .await
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
