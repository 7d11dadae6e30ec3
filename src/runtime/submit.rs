//! File I/O handed to the kernel as soon as it is asked for.
//!
//! glommio queues a file read or write in its own submission queue and
//! hands the queue to io_uring at the next pass of the executor loop, which
//! comes only once every runnable task has run (or the preempt timer fired,
//! 100 ms by default). On a shard that is also applying a burst of batches
//! (credits just came back), a commit round's segment writes waited there
//! for 20 – 40 ms while the disk had nothing to do (README, Benchmarks,
//! "Writes handed to the kernel at once"). [`submitted`] wraps such an
//! operation: after its first poll has queued the request, it submits the
//! queue at once (one `io_uring_enter` for whatever is queued by then; a
//! patch of the vendored glommio, `src/vendor/README.md`).
//!
//! # One `io_uring_enter` per batch
//!
//! A commit round queues a write per partition (and a write-behind per
//! full buffer) in one synchronous stretch. Submitted one by one, that was
//! about 15 600 `io_uring_enter`s a second per shard under disk ingest, and
//! each was a point where the kernel could hand the core to another thread:
//! a submission wakes the block layer's worker, which preempts the shard,
//! and the shard then waits out another runnable thread's slice (measured
//! 2026-12-08 with `perf sched` and `getrusage` around each submission: of
//! the submissions that took 0.3 ms or more, 730 of 738 were preempted, not
//! blocked; they took up to 15 ms while using 0.05 ms of CPU, and they were
//! what 548 of 839 control requests that waited over 1 ms were waiting
//! behind). Inside a [`Batch`], [`submitted`] only notes that something is
//! queued; the batch's end submits it all with one call.

use std::cell::Cell;
use std::future::Future;
use std::task::Poll;

thread_local! {
    /// How many [`Batch`]es of this thread are open.
    static BATCHES_OPEN: Cell<u32> = const { Cell::new(0) };
    /// Whether an operation queued inside them waits for the last to end.
    static QUEUED_IN_BATCH: Cell<bool> = const { Cell::new(false) };
}

/// Runs `operation`, submitting its I/O to the kernel right after the poll
/// that queues it instead of at the executor's next pass (or, inside a
/// [`Batch`], when the batch ends).
pub async fn submitted<F: Future>(operation: F) -> F::Output {
    let mut operation = std::pin::pin!(operation);
    let mut queued = false;
    std::future::poll_fn(|cx| {
        let polled = operation.as_mut().poll(cx);
        if let Poll::Pending = polled
            && !queued
        {
            queued = true;
            if BATCHES_OPEN.get() > 0 {
                QUEUED_IN_BATCH.set(true);
            } else {
                glommio::executor().submit_io();
            }
        }
        polled
    })
    .await
}

/// While one is open, [`submitted`] operations of this thread wait to be
/// handed to the kernel together when the last open batch is dropped.
///
/// Hold one over a synchronous stretch only, never across an `.await`:
/// another task running meanwhile would see its I/O wait for this batch.
#[must_use = "the batch submits when it is dropped"]
pub struct Batch {
    /// Per thread: not `Send`.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Batch {
    pub fn start() -> Batch {
        BATCHES_OPEN.set(BATCHES_OPEN.get() + 1);
        Batch { _thread: std::marker::PhantomData }
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        let open = BATCHES_OPEN.get() - 1;
        BATCHES_OPEN.set(open);
        if open == 0 && QUEUED_IN_BATCH.replace(false) {
            glommio::executor().submit_io();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::os::unix::fs::FileExt;
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use glommio::io::DmaFile;

    use super::submitted;
    use crate::storage::segment::tests::{run, scratch_dir};

    /// Writes one block while another task of the same executor spins for
    /// up to a second without yielding, reading the file with plain
    /// `pread`s: returns whether the spinner saw the block on disk, which it
    /// can only if the write went to the kernel before the executor's pass
    /// ended.
    fn seen_while_busy(name: &str, submit: bool) -> bool {
        let dir = scratch_dir(name);
        let path = dir.join("block");
        let seen = run({
            let path = path.clone();
            async move {
                let file = Rc::new(DmaFile::create(&path).await.expect("create"));
                let reader = std::fs::File::open(&path).expect("open for reading");
                let seen = Rc::new(Cell::new(false));
                let writer = {
                    let file = file.clone();
                    glommio::spawn_local(async move {
                        let mut buffer = file.alloc_dma_buffer(4096);
                        buffer.as_bytes_mut().fill(0xAB);
                        let write = file.write_at(buffer, 0);
                        if submit { submitted(write).await } else { write.await }.expect("write");
                    })
                };
                let spinner = {
                    let seen = seen.clone();
                    glommio::spawn_local(async move { seen.set(block_seen(&reader, Duration::from_secs(1))) })
                };
                spinner.await;
                writer.await;
                file.close_rc().await.expect("close");
                seen.get()
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
        seen
    }

    /// Polls `reader` (plain `pread`s, never yielding) for up to `within`
    /// for the block the tests write.
    fn block_seen(reader: &std::fs::File, within: Duration) -> bool {
        let started = Instant::now();
        let mut byte = [0u8; 1];
        while started.elapsed() < within {
            if reader.read_at(&mut byte, 0).is_ok_and(|read| read == 1) && byte[0] == 0xAB {
                return true;
            }
        }
        false
    }

    /// Inside a batch a submitted write waits for the batch to end, then
    /// goes to the kernel without the executor's pass ending.
    #[test]
    fn a_batch_submits_its_writes_when_it_ends() {
        let dir = scratch_dir("submit-batch");
        let path = dir.join("block");
        let (before, after) = run({
            let path = path.clone();
            async move {
                let file = Rc::new(DmaFile::create(&path).await.expect("create"));
                let reader = std::fs::File::open(&path).expect("open for reading");
                let batch = super::Batch::start();
                let writer = {
                    let file = file.clone();
                    // Runs up to its write as it is spawned.
                    glommio::spawn_local(async move {
                        let mut buffer = file.alloc_dma_buffer(4096);
                        buffer.as_bytes_mut().fill(0xAB);
                        submitted(file.write_at(buffer, 0)).await.expect("write");
                    })
                };
                let before = block_seen(&reader, Duration::from_millis(200));
                drop(batch);
                let after = block_seen(&reader, Duration::from_secs(1));
                writer.await;
                file.close_rc().await.expect("close");
                (before, after)
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!before, "the write went to the kernel before its batch ended");
        assert!(after, "the batch's end did not submit the write");
    }

    #[test]
    fn a_submitted_write_reaches_the_disk_while_the_executor_is_busy() {
        assert!(seen_while_busy("submit-on", true), "the write waited for the executor's pass to end");
    }

    /// The reason for `submitted`: without it the same write is not handed
    /// to the kernel until the spinning task yields. (If glommio ever
    /// submits at once by itself, this fails and `submitted` can go.)
    #[test]
    fn an_unsubmitted_write_waits_for_the_executor_pass() {
        assert!(!seen_while_busy("submit-off", false), "glommio now submits file writes at once");
    }
}
