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

use std::future::Future;
use std::task::Poll;

/// Runs `operation`, submitting its I/O to the kernel right after the poll
/// that queues it instead of at the executor's next pass.
pub async fn submitted<F: Future>(operation: F) -> F::Output {
    let mut operation = std::pin::pin!(operation);
    let mut queued = false;
    std::future::poll_fn(|cx| {
        let polled = operation.as_mut().poll(cx);
        if let Poll::Pending = polled
            && !queued
        {
            queued = true;
            glommio::executor().submit_io();
        }
        polled
    })
    .await
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
                    glommio::spawn_local(async move {
                        let started = Instant::now();
                        let mut byte = [0u8; 1];
                        while started.elapsed() < Duration::from_secs(1) {
                            if reader.read_at(&mut byte, 0).is_ok_and(|read| read == 1) && byte[0] == 0xAB {
                                seen.set(true);
                                break;
                            }
                        }
                    })
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
