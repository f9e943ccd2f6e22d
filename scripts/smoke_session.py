#!/usr/bin/env python3
"""Smoke test of a rozd binary as a separate process (e.g. the arm64 build
under qemu-aarch64-static): start it on a free loopback port with a given
configuration, wait for READY=1 on a NOTIFY_SOCKET (no sleeps), check
/healthz and /v1/status, run tests/python/session_client.py against it (a
real roz.v1 session with a client tool round trip), then SIGTERM it and
expect STOPPING=1 and exit status 0.

Usage: smoke_session.py --config BASE.toml [--expect-version V] -- COMMAND...
  COMMAND is how to run rozd, e.g.
  qemu-aarch64-static -L /usr/aarch64-linux-gnu ./usr/bin/rozd

BASE.toml must contain the line `listen = "127.0.0.1:8080"`; the copy that
rozd runs with listens on 127.0.0.1:0 and keeps its store in a temporary
directory. Exit status 0 on success, 1 on any failure (with rozd's output).
"""

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_SECS = 60.0  # qemu starts a binary slower than native
STOP_TIMEOUT_SECS = 30.0
CLIENT_TIMEOUT_SECS = 60.0


class Failure(Exception):
    pass


def log(text):
    print(f"smoke: {text}", flush=True)


def recv_until(sock, child, deadline, predicate, what):
    """Receives notify datagrams until predicate(lines) holds; fails when the
    deadline passes or the child exits first (watched through a pidfd)."""
    seen = []
    pidfd = os.pidfd_open(child.pid)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failure(f"no {what} within the timeout; notifications so far: {seen}")
            readable, _, _ = select.select([sock, pidfd], [], [], left)
            if sock in readable:
                data = sock.recv(4096)
            elif pidfd in readable:
                raise Failure(f"rozd exited with status {child.wait()} before {what}; notifications: {seen}")
            else:
                continue
            lines = data.decode("utf-8", "replace").splitlines()
            seen.extend(lines)
            result = predicate(lines)
            if result is not None:
                return result
    finally:
        os.close(pidfd)


def http_get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, json.loads(response.read().decode())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--expect-version")
    parser.add_argument("--python", default=sys.executable, help="python with grpcio for the client")
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()

    base = Path(args.config).read_text()
    listen_line = 'listen = "127.0.0.1:8080"'
    if listen_line not in base:
        raise Failure(f"{args.config} has no line {listen_line!r} to replace")

    with tempfile.TemporaryDirectory(prefix="rozd-smoke-") as tmp:
        tmp = Path(tmp)
        config = tmp / "rozd.toml"
        config.write_text(
            base.replace(listen_line, 'listen = "127.0.0.1:0"')
            + f"\n[store]\npath = {json.dumps(str(tmp / 'rozd.db'))}\n"
        )
        notify_path = tmp / "notify.sock"
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(notify_path))
        output = open(tmp / "rozd.log", "w+b")
        env = dict(os.environ, NOTIFY_SOCKET=str(notify_path))
        for var in ("ROZD_CONFIG", "RUST_LOG", "JOURNAL_STREAM", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(var, None)
        command = args.command + ["run", "--config", str(config)]
        log(f"starting: {' '.join(command)}")
        started = time.monotonic()
        child = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
        )
        ok = False
        try:

            def ready(lines):
                if "READY=1" not in lines:
                    return None
                for line in lines:
                    if line.startswith("STATUS=serving roz.v1 on "):
                        return line.removeprefix("STATUS=serving roz.v1 on ")
                raise Failure(f"READY=1 without a STATUS naming the address: {lines}")

            addr = recv_until(notify, child, started + READY_TIMEOUT_SECS, ready, "READY=1")
            log(f"READY=1 after {time.monotonic() - started:.1f} s, serving on {addr}")

            status, body = http_get_json(f"http://{addr}/healthz")
            if status != 200 or body != {"status": "ok"}:
                raise Failure(f"/healthz answered {status} {body}")
            status, body = http_get_json(f"http://{addr}/v1/status")
            if status != 200:
                raise Failure(f"/v1/status answered {status} {body}")
            log(
                "status: host_id={} version={} sensors={} actuators={}".format(
                    body.get("host_id"),
                    body.get("version"),
                    body.get("sensors"),
                    body.get("actuators"),
                )
            )
            if args.expect_version and body.get("version") != args.expect_version:
                raise Failure(f"version {body.get('version')!r}, expected {args.expect_version!r}")

            client = REPO / "tests" / "python" / "session_client.py"
            log(f"session client: {client.relative_to(REPO)} {addr}")
            done = subprocess.run(
                [args.python, str(client), addr], timeout=CLIENT_TIMEOUT_SECS
            )
            if done.returncode != 0:
                raise Failure(f"session_client.py exited {done.returncode}")

            child.send_signal(signal.SIGTERM)
            recv_until(
                notify,
                child,
                time.monotonic() + STOP_TIMEOUT_SECS,
                lambda lines: True if "STOPPING=1" in lines else None,
                "STOPPING=1 after SIGTERM",
            )
            try:
                code = child.wait(timeout=STOP_TIMEOUT_SECS)
            except subprocess.TimeoutExpired:
                raise Failure(f"still running {STOP_TIMEOUT_SECS:.0f} s after SIGTERM")
            if code != 0:
                raise Failure(f"exited {code} after SIGTERM, expected 0")
            log(f"SIGTERM: STOPPING=1, exit 0; whole run {time.monotonic() - started:.1f} s")
            ok = True
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            if not ok:
                output.seek(0)
                text = output.read().decode("utf-8", "replace")
                print(f"smoke: rozd output (exit {child.returncode}):\n{text}", file=sys.stderr)
            output.close()
            notify.close()


if __name__ == "__main__":
    try:
        main()
    except Failure as error:
        print(f"smoke: FAIL: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Exception as error:  # an unexpected answer is a failure too, not a crash
        print(f"smoke: FAIL: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        sys.exit(1)
