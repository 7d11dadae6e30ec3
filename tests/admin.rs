//! The admin face and the CLI: metrics pass promtool, JSON endpoints agree
//! with what was sent, flags are documented, and SIGTERM drains cleanly.

mod common;

use std::process::Command;

use common::Server;

/// `promtool` (Debian's prometheus package; `scripts/test` installs it).
fn promtool() -> String {
    let path = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let found = Command::new(&path).arg("--version").output().is_ok_and(|output| output.status.success());
    assert!(found, "promtool not found: run scripts/test (it installs Debian's prometheus package) or set PROMTOOL");
    path
}

/// GET /metrics is valid Prometheus text: `promtool check metrics` accepts it
/// (including its lint rules) after real traffic, and the counters are there.
#[test]
fn metrics_pass_promtool() {
    let promtool = promtool();
    let server = Server::start(&["--shards", "2"]);
    let mut producer = server.producer();
    producer.send(b"a 1\nb 2\n bad\n");
    producer.sync();
    let metrics = server.get("/metrics");
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    check.stdin.take().unwrap().write_all(metrics.as_bytes()).unwrap();
    let output = check.wait_with_output().unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool rejected /metrics:\n{report}\n---\n{metrics}");
    assert!(report.trim().is_empty(), "promtool lint findings:\n{report}");
    let stored: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("spate_events_stored_total{"))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(stored, 2.0);
    assert!(metrics.contains("spate_lines_rejected_total{shard=\"0\",reason=\"key_empty\"}"));
}

/// /partitions lists every partition once with its owner, epoch and next
/// offset; owners are spread evenly at start.
#[test]
fn partitions_table_is_complete() {
    // The initial placement is under test, not a gather at low load.
    let server = Server::start(&["--shards", "4", "--partitions", "64", "--consolidate", "off"]);
    let mut producer = server.producer();
    for index in 0..1000 {
        producer.send(format!("key{index} x\n").as_bytes());
    }
    producer.sync();
    let table: serde_json::Value = serde_json::from_str(&server.get("/partitions")).unwrap();
    let partitions = table["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 64);
    let mut owned = [0; 4];
    for (index, partition) in partitions.iter().enumerate() {
        assert_eq!(partition["partition"], index as u64);
        assert_eq!(partition["epoch"], 0);
        owned[partition["owner"].as_u64().unwrap() as usize] += 1;
    }
    assert_eq!(owned, [16; 4]);
    let offsets: u64 = partitions.iter().map(|p| p["next_offset"].as_u64().unwrap()).sum();
    assert_eq!(offsets, 1000);
    let stats = server.stats();
    for shard in stats["shards"].as_array().unwrap() {
        assert_eq!(shard["partitions_owned"], 16);
    }
}

/// `spate serve --help` documents every flag.
#[test]
fn serve_help_lists_every_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_spate")).args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--shards",
        "--partitions",
        "--ingest",
        "--ingest-json",
        "--ingest-ilp",
        "--json-key",
        "--json-stream",
        "--ilp-stream",
        "--key-size-max",
        "--storage",
        "--fsync",
        "--data-dir",
        "--partitions-max",
        "--subscribe",
        "--admin",
        "--line-size-max",
        "--read-buffer-bytes",
        "--connections-per-shard-max",
        "--batch-bytes",
        "--batch-flush-us",
        "--credit-window-bytes",
        "--retention-bytes",
        "--subscribers-per-shard-max",
        "--fetch-bytes-max",
        "--apply-delay-ns-per-event",
    ] {
        assert!(help.contains(flag), "{flag} missing from serve --help:\n{help}");
    }
}

/// SIGTERM stops the server cleanly (exit 0) after draining: events a
/// producer wrote just before are all stored, so a restart-free check via
/// /stats right before the signal agrees with what was sent.
#[test]
fn sigterm_drains_and_exits_cleanly() {
    let server = Server::start(&["--shards", "2"]);
    let mut producer = server.producer();
    for index in 0..50_000 {
        producer.send(format!("k{} {index}\n", index % 10).as_bytes());
    }
    producer.sync();
    assert_eq!(server.total("events_stored"), 50_000);
    let log_path = server.log_path.clone();
    let status = server.terminate();
    assert!(status.success(), "exit status {status}");
    let log = std::fs::read_to_string(log_path).unwrap();
    assert!(log.contains("stopped cleanly"), "{log}");
}

/// A second server on the same port fails with a clear message instead of
/// silently sharing the port (glommio binds with SO_REUSEPORT).
#[test]
fn second_server_on_same_port_is_refused() {
    let server = Server::start(&["--shards", "1"]);
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["serve", "--shards", "1", "--ingest", &server.ingest.to_string()])
        .args(["--subscribe", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--ingest-kafka", "off"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(error.contains("already in use"), "{error}");
}

/// A port where another program's connection is in TIME_WAIT (its socket
/// bound with only SO_REUSEADDR, as most are) is free to listen on: spate
/// binds its shard listeners with SO_REUSEADDR as well as SO_REUSEPORT.
/// With SO_REUSEPORT alone the bind failed with "Address already in use"
/// for a minute (a CI run: a test server's port taken up by the next test
/// binary).
#[test]
fn a_port_with_a_connection_in_time_wait_can_be_listened_on() {
    let addresses = common::Addresses::free();
    {
        // The listener closes its side first, so the TIME_WAIT is on its
        // port (std binds with SO_REUSEADDR and without SO_REUSEPORT).
        let listener = common::listen(addresses.ingest);
        let client = std::net::TcpStream::connect(addresses.ingest).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        drop(accepted);
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(client);
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let port = addresses.ingest.port();
    let states = Command::new("ss").args(["-Htan", &format!("sport = :{port}")]).output();
    if let Ok(output) = states {
        let states = String::from_utf8_lossy(&output.stdout);
        assert!(states.contains("TIME-WAIT"), "no TIME_WAIT on port {port} to test with: {states}");
    }
    let server = Server::start_on(addresses, &["--shards", "2"]);
    let mut producer = server.producer();
    producer.send(b"k one\n");
    producer.sync();
    assert_eq!(server.total("events_stored"), 1);
}

/// `spate sub` prints a subscription and stops after --count events.
#[test]
fn sub_command_prints_events() {
    let server = Server::start(&["--shards", "2"]);
    let mut producer = server.producer();
    producer.send(b"alpha one\nbeta two\n");
    producer.sync();
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["sub", "--server", &server.subscribe.to_string(), "--count", "2"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut lines: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.splitn(4, ' ').collect();
            format!("{} {}", fields[2], fields[3])
        })
        .collect();
    lines.sort();
    assert_eq!(lines, ["alpha one", "beta two"]);
}

/// The nice value of each thread of `server` whose name starts with
/// `prefix` (field 19 of `/proc/PID/task/TID/stat`).
fn thread_nice_values(server: &Server, prefix: &str) -> Vec<i64> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap();
    let mut values = Vec::new();
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name start at field 3 (the state).
        let after_name = stat.rsplit(')').next().unwrap_or_default();
        values.push(after_name.split_whitespace().nth(19 - 3).unwrap().parse().unwrap());
    }
    values
}

/// `--control-nice` sets the admin thread's nice value and no other
/// thread's: 5 (raising it needs no privilege), then the default -10 where
/// the test may lower it (as root; otherwise the server logs that it could
/// not, which is checked instead).
#[test]
fn the_admin_thread_alone_runs_at_the_control_nice_value() {
    let server = Server::start(&["--shards", "2", "--control-nice", "5"]);
    assert_eq!(thread_nice_values(&server, "spate-admin"), vec![5], "{}", server.threads());
    let shards = thread_nice_values(&server, "spate-shard");
    assert!(!shards.is_empty() && shards.iter().all(|&nice| nice == 0), "shard threads: {shards:?}");
    drop(server);

    let server = Server::start(&["--shards", "2"]);
    let admin = thread_nice_values(&server, "spate-admin");
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(admin, vec![-10]);
    } else {
        assert_eq!(admin, vec![0]);
        assert!(server.log().contains("the admin thread keeps the process's priority"), "{}", server.log());
    }
}
