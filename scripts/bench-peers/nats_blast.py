#!/usr/bin/env python3
"""Raw NATS protocol load driver for scripts/bench-peers (stdlib only).

Why raw protocol and not a client library: the point is to measure the *server*, the way
DESIGN.md section 6 did it. A client library adds its own per-message cost (and, in Python,
a large one); here every frame is pre-built once and the socket only sees big sendall()s, so
the client side costs the kernel copy and little else, like spate's own load generator.

Modes:
  core       CONNECT, then N x `PUB ev.user42 S\\r\\n<S bytes>\\r\\n` in large writes, then
             PING; timed from the first PUB byte to the PONG. No subscriber: the server parses,
             finds no interest and drops -- NATS core's best case.
  jetstream  CONNECT, create a memory-storage stream over `ev.>` through
             `$JS.API.STREAM.CREATE.<name>` (request/reply on an inbox we SUB to), then the same
             PUB blast (plain PUB, no reply subject, so no per-message ack round trips), then
             poll `$JS.API.STREAM.INFO.<name>` until state.messages == N. Timed from the first
             PUB byte to the poll that saw N. If the count stops growing (the server may drop
             un-acked publishes when overloaded) the run ends after --stall-seconds without
             progress and reports what was actually stored and when the last one landed.

Prints one `RESULT ...` line on stdout (see lib.sh); progress on stderr.
"""
import argparse
import json
import os
import socket
import sys
import time


def log(msg):
    print(f"[nats_blast] {msg}", file=sys.stderr, flush=True)


class Conn:
    """Minimal NATS client: enough protocol to CONNECT, PUB, SUB, PING and read MSG/PONG."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = bytearray()
        info = self._line()
        if not info.startswith(b"INFO "):
            raise SystemExit(f"unexpected greeting: {info[:200]!r}")
        self.info = json.loads(info[5:])
        # verbose=false: no +OK per frame. pedantic=false: no extra subject checks.
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
        self.ping()  # a PONG proves CONNECT was accepted (an -ERR would arrive first)

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise SystemExit("server closed the connection")
        self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return line
            self._fill()

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[: n + 2]  # payload + trailing CRLF
        return data

    def next_op(self):
        """Return ("PONG", None) or ("MSG", (subject, payload)); answer server PINGs."""
        while True:
            line = self._line()
            if line == b"PONG":
                return "PONG", None
            if line == b"PING":
                self.sock.sendall(b"PONG\r\n")
                continue
            if line.startswith(b"MSG "):
                parts = line.split()
                # MSG <subject> <sid> [reply-to] <#bytes>
                return "MSG", (parts[1].decode(), self._exact(int(parts[-1])))
            if line.startswith(b"-ERR"):
                raise SystemExit(f"server error: {line.decode(errors='replace')}")
            if line.startswith(b"+OK") or line.startswith(b"INFO "):
                continue
            raise SystemExit(f"unexpected protocol line: {line[:200]!r}")

    def ping(self):
        self.sock.sendall(b"PING\r\n")
        while self.next_op()[0] != "PONG":
            pass

    def request(self, subject, payload, inbox, timeout=10.0):
        self.sock.sendall(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), inbox.encode(), len(payload), payload))
        self.sock.settimeout(timeout)
        try:
            while True:
                op, arg = self.next_op()
                if op == "MSG" and arg[0] == inbox:
                    return json.loads(arg[1])
        finally:
            self.sock.settimeout(30)


def blast(conn, n, s, write_bytes):
    """Send n pre-built PUB frames in writes of ~write_bytes. Returns (t0, frame_len)."""
    # Printable, varied payload (NATS payloads are length-delimited, any bytes are fine).
    payload = (bytes(range(0x41, 0x5B)) * (s // 26 + 1))[:s]
    frame = b"PUB ev.user42 %d\r\n%s\r\n" % (s, payload)
    per_chunk = max(1, write_bytes // len(frame))
    chunk = frame * per_chunk  # built once, sent many times
    full, rest = divmod(n, per_chunk)
    tail = frame * rest
    view = memoryview(chunk)
    t0 = time.perf_counter()
    for _ in range(full):
        conn.sock.sendall(view)
    if tail:
        conn.sock.sendall(tail)
    return t0, len(frame)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["core", "jetstream"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, required=True)
    ap.add_argument("--payload-bytes", type=int, required=True)
    ap.add_argument("--write-bytes", type=int, default=4 << 20, help="bytes per sendall (default 4 MiB)")
    ap.add_argument("--stream", default="SPATEBENCH")
    ap.add_argument("--poll-interval", type=float, default=0.01)
    ap.add_argument("--stall-seconds", type=float, default=5.0)
    ap.add_argument("--max-seconds", type=float, default=300.0)
    ap.add_argument("--peer", help="name for the RESULT line (default nats-<mode>)")
    a = ap.parse_args()
    n, s = a.events, a.payload_bytes
    peer = a.peer or f"nats-{a.mode}"

    conn = Conn(a.port)
    version = conn.info.get("version", "?")
    inbox_n = 0

    def inbox():
        nonlocal inbox_n
        inbox_n += 1
        return f"_INBOX.spatebench.{inbox_n}"

    if a.mode == "jetstream":
        if not conn.info.get("jetstream"):
            raise SystemExit("server does not advertise JetStream (start it with -js)")
        conn.sock.sendall(b"SUB _INBOX.spatebench.* 1\r\n")
        cfg = {
            "name": a.stream,
            "subjects": ["ev.>"],
            "storage": os.environ.get("JS_STORAGE", "memory"),
            "retention": "limits",
            "discard": "old",
            "num_replicas": 1,
            # Limits far above what the run stores, so none of them ever discards an event.
            "max_msgs": -1,
            "max_bytes": max(1 << 30, 4 * n * (s + 64)),
            "max_msg_size": -1,
            "max_age": 0,
        }
        r = conn.request(f"$JS.API.STREAM.CREATE.{a.stream}", json.dumps(cfg).encode(), inbox())
        if "error" in r:
            raise SystemExit(f"stream create failed: {r['error']}")
        log(f"created {cfg['storage']} stream {a.stream} over ev.> (max_bytes={cfg['max_bytes']})")

    log(f"{peer}: server {version}, sending {n} x {s}-byte PUBs in {a.write_bytes}-byte writes")
    t0, frame_len = blast(conn, n, s, a.write_bytes)
    t_sent = time.perf_counter()

    if a.mode == "core":
        conn.ping()  # the server handles a connection's input in order: PONG => all PUBs parsed
        secs = time.perf_counter() - t0
        stored = n
        note = f"nats-server {version}; 1 conn, no subscriber (parse and drop); timed to PONG"
    else:
        # The PUBs are queued to the stream asynchronously; PONG only means "parsed". Poll.
        conn.ping()
        last_count, t_last, secs = -1, time.perf_counter(), None
        while True:
            st = conn.request(f"$JS.API.STREAM.INFO.{a.stream}", b"", inbox())
            if "error" in st:
                raise SystemExit(f"stream info failed: {st['error']}")
            count = st["state"]["messages"]
            now = time.perf_counter()
            if count != last_count:
                last_count, t_last = count, now
            if count >= n:
                secs = now - t0
                break
            if now - t_last > a.stall_seconds or now - t0 > a.max_seconds:
                secs = t_last - t0  # time until the last event that did get stored
                log(f"stream stopped growing at {count}/{n}; reporting what was stored")
                break
            time.sleep(a.poll_interval)
        stored = last_count
        dropped = n - stored
        note = (f"nats-server {version}; {os.environ.get('JS_STORAGE', 'memory')} stream over ev.>, plain PUB (no acks); "
                f"sent {n}, stored {stored}" + (f", DROPPED {dropped}" if dropped else "")
                + "; timed to STREAM.INFO count")
    log(f"client finished writing after {t_sent - t0:.3f}s; frame {frame_len} bytes")
    eps = stored / secs
    mbps = stored * s / secs / 1e6
    print(f'RESULT peer={peer} events={stored} seconds={secs:.3f} events_per_s={eps:.0f} '
          f'mb_per_s={mbps:.1f} note="{note}"', flush=True)


if __name__ == "__main__":
    main()
