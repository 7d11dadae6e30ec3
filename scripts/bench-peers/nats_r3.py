#!/usr/bin/env python3
"""NATS JetStream R3 load driver for scripts/bench-replication (stdlib only, raw protocol).

Three nats-server processes run clustered on loopback (started by nats-r3.sh); this creates a
file-storage stream over `ev.>` with num_replicas 3 and publishes to it with acknowledgements:
every PUB carries a reply subject, and JetStream answers it once the message is stored by the
stream's Raft group (a quorum of the three servers: the R3 equivalent of spate's committed by a
majority). Each of C connections keeps between B and 2B messages in flight (it sends a batch of
B pre-built PUB frames, and another each time B acknowledgements arrived), so the publisher never
waits for one message at a time. Publishing stops after --seconds; the acknowledgements still in
flight are awaited, and the rate is acknowledged messages / time until the last acknowledgement.
An acknowledgement with an error counts as not stored (and is reported).

Prints one `RESULT ...` line on stdout (see lib.sh); progress on stderr.
"""
import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nats_blast import Conn, log  # noqa: E402


def create_stream(port, name, s, timeout_s):
    """Creates the R3 file stream, retrying while the cluster elects its meta leader."""
    conn = Conn(port)
    conn.sock.sendall(b"SUB _INBOX.r3create.* 1\r\n")
    cfg = {
        "name": name,
        "subjects": ["ev.>"],
        "storage": "file",
        "num_replicas": 3,
        "retention": "limits",
        "discard": "old",
        "max_msgs": -1,
        "max_bytes": 8 << 30,
        "max_msg_size": -1,
        "max_age": 0,
    }
    deadline = time.time() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            reply = conn.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(cfg).encode(), f"_INBOX.r3create.{attempt}", 5)
        except OSError as error:  # socket.timeout included: no meta leader yet
            reply = {"error": str(error)}
        if "error" not in reply:
            log(f"created R3 file stream {name} (leader {reply.get('cluster', {}).get('leader')})")
            return
        if time.time() > deadline:
            raise SystemExit(f"stream create failed: {reply['error']}")
        time.sleep(0.5)


def publish(port, index, s, batch, seconds, results):
    conn = Conn(port)
    inbox = f"_INBOX.r3pub.{index}"
    conn.sock.sendall(b"SUB %s 1\r\n" % inbox.encode())
    conn.ping()
    payload = (bytes(range(0x41, 0x5B)) * (s // 26 + 1))[:s]
    frame = b"PUB ev.user%d %s %d\r\n%s\r\n" % (index, inbox.encode(), s, payload)
    chunk = frame * batch
    sent = acked = errors = 0
    started = time.perf_counter()
    stop_at = started + seconds
    conn.sock.sendall(chunk + chunk)
    sent += 2 * batch
    last_ack = started
    since_batch = 0
    while acked + errors < sent:
        op, arg = conn.next_op()
        if op != "MSG" or arg[0] != inbox:
            continue
        if b'"error"' in arg[1]:
            errors += 1
        else:
            acked += 1
        last_ack = time.perf_counter()
        since_batch += 1
        if since_batch == batch:
            since_batch = 0
            if last_ack < stop_at:
                conn.sock.sendall(chunk)
                sent += batch
    results[index] = (acked, errors, started, last_ack)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ports", required=True, help="client ports of the three servers, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--payload-bytes", type=int, default=64)
    ap.add_argument("--stream", default="SPATER3")
    a = ap.parse_args()
    ports = [int(port) for port in a.ports.split(",")]
    create_stream(ports[0], a.stream, a.payload_bytes, 60)
    results = [None] * a.connections
    threads = [
        threading.Thread(target=publish, args=(ports[0], i, a.payload_bytes, a.batch, a.seconds, results))
        for i in range(a.connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(result is None for result in results):
        raise SystemExit("a publisher failed")
    acked = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    secs = max(r[3] for r in results) - min(r[2] for r in results)
    rate = acked / secs if secs > 0 else 0
    note = (f"3 nats-server clustered, R3 file stream, {a.connections} conns to the first server, "
            f"{a.batch}-{2 * a.batch} acked PUBs in flight each; {errors} error acks")
    print(f"RESULT peer=nats-jetstream-r3 events={acked} seconds={secs:.3f} events_per_s={rate:.0f} "
          f"mb_per_s={rate * a.payload_bytes / 1e6:.1f} note=\"{note}\"")


if __name__ == "__main__":
    main()
