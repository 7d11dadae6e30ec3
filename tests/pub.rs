//! `spate pub` end to end: the real binary sends files to a real server.

mod common;

use std::io::Write;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::Server;

/// Writes `count` event lines `user<i % 1000> payload-<i>` to a temp file,
/// with `bad_line` (1-based) replaced by a line starting with a space.
fn write_events(name: &str, count: u64, bad_line: Option<u64>) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("spate-pub-{}-{name}", std::process::id()));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for index in 1..=count {
        if Some(index) == bad_line {
            writeln!(file, " no-key-here").unwrap();
        } else {
            writeln!(file, "user{} payload-{index}", index % 1000).unwrap();
        }
    }
    file.flush().unwrap();
    path
}

fn spate_pub(server: &Server, files: &[&std::path::Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["pub", "--server", &server.ingest.to_string()])
        .args(files)
        .output()
        .expect("run spate pub")
}

/// `events_stored` reaches `expected` (it is updated as batches are applied).
fn wait_for_stored(server: &Server, expected: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stored = server.total("events_stored");
        if stored >= expected || Instant::now() > deadline {
            return stored;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A million lines piped into `spate pub`'s stdin are all stored, and it exits 0.
#[test]
fn pub_stores_a_million_lines_and_exits_zero() {
    let server = Server::start(&[]);
    let path = write_events("million", 1_000_000, None);
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["pub", "--server", &server.ingest.to_string()])
        .stdin(std::fs::File::open(&path).unwrap())
        .output()
        .expect("run spate pub");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "spate pub failed: {stderr}");
    assert!(stderr.contains("0 rejected"), "{stderr}");
    // The final #SYNC was acknowledged, so every event is already applied.
    assert_eq!(server.total("events_stored"), 1_000_000, "{stderr}");
    std::fs::remove_file(path).unwrap();
}

/// A bad line in the middle of the second file is reported with that
/// file's name and line number, every other line is stored, and the exit
/// status is 1 (rejected lines).
#[test]
fn pub_reports_a_rejected_line_by_file_and_line_and_exits_one() {
    let server = Server::start(&[]);
    let first = write_events("first", 1000, None);
    let second = write_events("second", 5000, Some(2500));
    let output = spate_pub(&server, &[&first, &second]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let expected = format!("{}:2500: key_empty", second.display());
    assert!(stderr.contains(&expected), "expected {expected:?} in: {stderr}");
    assert_eq!(stderr.matches("key_empty").count(), 1, "{stderr}");
    assert!(stderr.contains("1 rejected"), "{stderr}");
    assert_eq!(wait_for_stored(&server, 5999), 5999, "{stderr}");
    std::fs::remove_file(first).unwrap();
    std::fs::remove_file(second).unwrap();
}

/// No server listening: exit status 3, with the reason on stderr.
#[test]
fn pub_without_a_server_exits_three() {
    let port = common::free_port();
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["pub", "--server", &format!("127.0.0.1:{port}"), "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&output.stderr).contains("connect"));
}

/// With several `--server` addresses `spate pub` and `spate sub` use the
/// first that answers (a cluster's nodes, one of them down): the events
/// go through the live server and `spate sub` reads them back; with none
/// answering, the error names each address tried.
#[test]
fn pub_and_sub_take_several_servers_and_use_the_first_that_answers() {
    let server = Server::start(&[]);
    let dead = format!("127.0.0.1:{}", common::free_port());
    let path = write_events("several", 500, None);
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["pub", "--server", &format!("{dead},{}", server.ingest)])
        .arg(&path)
        .output()
        .expect("run spate pub");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "spate pub failed: {stderr}");
    assert_eq!(wait_for_stored(&server, 500), 500);
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["sub", "--server", &format!("{dead}, {}", server.subscribe), "--count", "500"])
        .output()
        .expect("run spate sub");
    assert_eq!(output.status.code(), Some(0), "spate sub failed: {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 500);
    let other_dead = format!("127.0.0.1:{}", common::free_port());
    let output = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["pub", "--server", &format!("{dead},{other_dead}"), "/dev/null"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(&dead) && stderr.contains(&other_dead) && stderr.contains("none answered"), "{stderr}");
}
