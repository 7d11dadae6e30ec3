//! The patched glommio park path (src/vendor/README.md): shards park and are
//! woken without the `membarrier` syscall, and no wake-up is lost.
//!
//! The server runs under a seccomp filter that kills the process the moment
//! anything in it calls `membarrier(2)`; glommio 0.9.0 unpatched calls it on
//! every park, so against it these tests die with SIGSYS.
#![cfg(target_arch = "x86_64")]

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, Subscriber};

/// Installs a seccomp filter that kills the whole process on `membarrier`
/// and allows every other system call. Runs in the forked child before
/// `exec` (the filter survives it, with `no_new_privs`).
fn kill_on_membarrier() -> std::io::Result<()> {
    let statement = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let nr_offset = 0; // offsetof(struct seccomp_data, nr)
    let mut filter = [
        statement(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, nr_offset),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_membarrier as u32,
        },
        statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        statement(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_mut_ptr() };
    // SAFETY: prctl with integer arguments, then with a pointer to a filter
    // program that lives across the call (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &program as *const libc::sock_fprog) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn under_filter(command: &mut Command) {
    // SAFETY: the hook only calls prctl, which is async-signal-safe.
    unsafe { command.pre_exec(kill_on_membarrier) };
}

/// The filter works: a process that calls `membarrier` under it is killed
/// with SIGSYS (so a server that survives it never called it).
#[test]
fn the_filter_kills_a_membarrier_caller() {
    let mut command = Command::new("true");
    // SAFETY: prctl and a raw syscall in the forked child, both
    // async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            kill_on_membarrier()?;
            libc::syscall(libc::SYS_membarrier, 0, 0);
            Ok(())
        })
    };
    let status = command.status().expect("run true");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGSYS), "membarrier under the filter must kill: {status:?}");
}

/// Paced bursts (the shards park between them and are woken by the socket
/// and by each other across the mesh) all reach a subscriber, in order,
/// from a server that may not call `membarrier`; it then stops cleanly.
#[test]
fn shards_park_and_wake_without_membarrier() {
    const BURSTS: usize = 400;
    const EVENTS_PER_BURST: usize = 25;
    let server = Server::start_prepared(&["--shards", "2", "--storage", "memory"], under_filter);
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * latest");
    let started = Instant::now();
    while server.total("subscribers_open") == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the subscriber never registered");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut producer = server.producer();
    for burst in 0..BURSTS {
        for event in 0..EVENTS_PER_BURST {
            // Keys spread over both shards' partitions.
            producer.send(format!("key{event} {burst}\n").as_bytes());
        }
        producer.flush();
        // Long enough for both shards to run out of work and park.
        std::thread::sleep(Duration::from_micros(500));
    }
    producer.sync();
    let delivered = subscriber.take(BURSTS * EVENTS_PER_BURST);
    for event in 0..EVENTS_PER_BURST {
        let key = format!("key{event}");
        let bursts: Vec<usize> = delivered
            .iter()
            .filter(|delivered| delivered.key == key.as_bytes())
            .map(|delivered| String::from_utf8_lossy(&delivered.payload).parse().unwrap())
            .collect();
        assert_eq!(bursts, (0..BURSTS).collect::<Vec<_>>(), "{key}: every burst, in order");
    }
    let status = server.terminate();
    assert!(status.success(), "the server must exit cleanly (SIGSYS means it called membarrier): {status:?}");
}

/// Each thread of process `pid`: its name, the CPU time it has run so far
/// (nanoseconds, from `/proc/PID/task/TID/schedstat`, exact where the
/// `stat` ticks are 10 ms grains) and its context switches (voluntary and
/// not).
fn threads(pid: u32) -> std::collections::BTreeMap<u32, (String, u64, u64)> {
    let mut threads = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return threads };
    for task in tasks.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else { continue };
        let path = task.path();
        let (Ok(schedstat), Ok(status)) =
            (std::fs::read_to_string(path.join("schedstat")), std::fs::read_to_string(path.join("status")))
        else {
            continue;
        };
        let ran_ns = schedstat.split_whitespace().next().and_then(|ns| ns.parse().ok()).unwrap_or(0);
        let switches = status
            .lines()
            .filter(|line| line.contains("ctxt_switches"))
            .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default().trim().to_string();
        threads.insert(tid, (name, ran_ns, switches));
    }
    threads
}

/// Asserts the server at `pid` is asleep over `window`: at most 3 % of a
/// core and 50 context switches a second. Gossip and each shard's
/// connection sweeper wake a shard about once a second when nothing moves,
/// the admin and cluster threads a few times (4 - 8 a second in all here);
/// a shard that spins, or a timer that ticks ten times a second for
/// nothing, shows far more. A failure names each thread's share, so it says
/// which one did not sleep.
fn assert_idle(pid: u32, window: Duration, when: &str) {
    let before = threads(pid);
    std::thread::sleep(window);
    let after = threads(pid);
    let mut report = String::new();
    let (mut ran_ns, mut switches) = (0u64, 0u64);
    for (tid, (name, ran_after, switches_after)) in &after {
        let (ran_before, switches_before) = before.get(tid).map_or((0, 0), |(_, ran, switches)| (*ran, *switches));
        let (ran, switched) = (ran_after.saturating_sub(ran_before), switches_after.saturating_sub(switches_before));
        ran_ns += ran;
        switches += switched;
        report += &format!("\n  {name} ({tid}): {:.2} ms, {switched} switches", ran as f64 / 1e6);
    }
    let core_share = ran_ns as f64 / 1e9 / window.as_secs_f64();
    let switches_per_s = switches as f64 / window.as_secs_f64();
    assert!(
        core_share <= 0.03,
        "{when}: an idle server used {:.1} % of a core over {window:?}:{report}",
        core_share * 100.0
    );
    assert!(switches_per_s <= 50.0, "{when}: an idle server switched {switches_per_s:.0} times a second:{report}");
    eprintln!("{when}: {:.2} % of a core, {switches_per_s:.0} switches a second:{report}", core_share * 100.0);
}

/// An idle server sleeps, before any traffic and after a burst of it: the
/// patched reactor keeps its timers armed across passes of the executor
/// loop (src/vendor/README.md), and none of them may keep a shard awake
/// or wake it over and over once the events stop.
#[test]
fn an_idle_server_sleeps_before_and_after_traffic() {
    let server = Server::start(&["--shards", "2", "--storage", "memory"]);
    let pid = server.pid();
    std::thread::sleep(Duration::from_secs(1));
    assert_idle(pid, Duration::from_secs(3), "before traffic");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * latest");
    while server.total("subscribers_open") == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut producer = server.producer();
    for burst in 0..200 {
        for event in 0..50 {
            producer.send(format!("key{event} {burst}\n").as_bytes());
        }
        producer.flush();
        std::thread::sleep(Duration::from_millis(2));
    }
    producer.sync();
    assert_eq!(subscriber.take(200 * 50).len(), 200 * 50);
    // Gossip slows to its idle pace once every shard's average rate is
    // below 1 event/s (about 7 s after this traffic, a 500 ms half-life).
    let started = Instant::now();
    let busiest = |stats: serde_json::Value| {
        let shards = stats["shards"].as_array().cloned().unwrap_or_default();
        shards.iter().filter_map(|shard| shard["load_events_per_s"].as_f64()).fold(0.0, f64::max)
    };
    while busiest(server.stats()) >= 1.0 {
        assert!(started.elapsed() < Duration::from_secs(30), "the load average never fell below 1 event/s");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1));
    assert_idle(pid, Duration::from_secs(3), "after traffic, with a producer and a subscriber connected");
    drop(producer);
    drop(subscriber);
    let status = server.terminate();
    assert!(status.success(), "the server must exit cleanly: {status:?}");
}
