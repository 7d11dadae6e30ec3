//! Reproduces an executor that parks with work pending and nothing to wake
//! it (src/vendor/README.md, "Known issue"). One executor runs the pattern
//! of a shard's write-ahead log with a zero-filler ahead of it: a writer
//! that writes 20-44 KiB, fdatasyncs and sleeps 200 µs, 1000 times (with a
//! 4 KiB "checkpoint" write and fdatasync to a second file every 50
//! rounds), and a filler that writes 256 KiB chunks of zeros ahead of the
//! writer in the same file, fdatasyncs, and waits to be notified. It prints
//! `done <elapsed>` and exits 0; a run that hangs is the bug (the caller's
//! timeout ends it). With `WATCHDOG=1` a 3 s timer runs beside them: then
//! no run hangs, but a hung stretch shows as a run seconds longer.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use glommio::io::{DmaFile, OpenOptions};
use glommio::{LocalExecutorBuilder, Placement};

/// Wakes one waiter; a notification given while nobody waits is kept.
#[derive(Default)]
struct Notify {
    notified: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Notify {
    fn notify(&self) {
        self.notified.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

struct Notified<'a>(&'a Notify);

impl Future for Notified<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.0.notified.replace(false) {
            return Poll::Ready(());
        }
        *self.0.waker.borrow_mut() = Some(context.waker().clone());
        Poll::Pending
    }
}

const CHUNK_BYTES: u64 = 256 << 10;

/// Writes zeros in front of the writer's issued end, then waits for it to move.
async fn fill_ahead(file: Rc<DmaFile>, notify: Rc<Notify>, issued: Rc<Cell<u64>>) {
    let mut zeros = file.alloc_dma_buffer(CHUNK_BYTES as usize);
    zeros.as_bytes_mut().fill(0);
    let zeros = Rc::new(zeros);
    let mut allocated = 0u64;
    loop {
        let mut filled = false;
        while allocated < issued.get() + (1 << 20) {
            let from = allocated.max(issued.get().div_ceil(4096) * 4096 + CHUNK_BYTES);
            file.write_rc_at(zeros.clone(), from).await.expect("zero-fill write");
            allocated = from + CHUNK_BYTES;
            filled = true;
        }
        if filled {
            file.fdatasync().await.expect("zero-fill fdatasync");
        }
        Notified(&notify).await;
    }
}

fn main() {
    let watchdog = std::env::var("WATCHDOG").is_ok();
    let executor = LocalExecutorBuilder::new(Placement::Unbound).io_memory(512 << 10).make().expect("executor");
    executor.run(async move {
        let dir = std::env::temp_dir().join(format!("glommio-wakeup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true);
        let file = Rc::new(options.dma_open(dir.join("log")).await.expect("open log"));
        let checkpoint = options.dma_open(dir.join("checkpoint")).await.expect("open checkpoint");
        let (notify, issued) = (Rc::new(Notify::default()), Rc::new(Cell::new(0u64)));
        glommio::spawn_local(fill_ahead(file.clone(), notify.clone(), issued.clone())).detach();
        if watchdog {
            glommio::spawn_local(async {
                loop {
                    glommio::timer::sleep(Duration::from_secs(3)).await;
                    eprintln!("watchdog");
                }
            })
            .detach();
        }
        let started = Instant::now();
        let mut position = 0u64;
        for round in 0..1000u64 {
            let len = 20480 + (round % 7) * 4096;
            let mut buffer = file.alloc_dma_buffer(len as usize);
            buffer.as_bytes_mut().fill(1);
            let at = position / 4096 * 4096;
            issued.set(at + len);
            file.write_rc_at(Rc::new(buffer), at).await.expect("write");
            position = at + len - 1000;
            notify.notify();
            file.fdatasync().await.expect("fdatasync");
            if round % 50 == 25 {
                let mut block = checkpoint.alloc_dma_buffer(4096);
                block.as_bytes_mut().fill(2);
                checkpoint.write_at(block, 0).await.expect("checkpoint write");
                checkpoint.fdatasync().await.expect("checkpoint fdatasync");
            }
            glommio::timer::sleep(Duration::from_micros(200)).await;
        }
        std::fs::remove_dir_all(&dir).expect("remove scratch dir");
        println!("done {:?}", started.elapsed());
    });
}
