#!/usr/bin/env python3
"""A fake microcontroller for docs/guides/first-hardware.md: a serial device
without hardware, on a pseudo-terminal, speaking the guide's line protocol.

    python3 examples/fake_mcu.py /tmp/rozd-mcu

makes /tmp/rozd-mcu a serial port rozd can open (set `path` of the guide's
[[serial]] to it) and, on it:

- prints `T=<temperature> I=<current>` ten times a second (`--hz`); the
  current follows the motor: 0.05 A at rest, about 0.9 A more at full duty;
- takes `M <duty>` (-1 to 1) and answers `OK` at once; anything else gets
  `ERR <why>`.

Type a fault on its standard input (one word, then Enter) to see what rozd
does about it:

    overcurrent   the current reads 3.5 A (the guide's critical_max is 3.0)
    silent        no more telemetry (the sensor goes stale)
    noreply       commands are no longer answered (they fail: tool_timeout)
    ok            back to normal
    quit          exit (the port disappears: rozd says disconnected)

It prints what rozd sends (`<- M 0.4`) and what it answers (`-> OK`), and
only the Python standard library is needed. Linux and macOS.
"""

import argparse
import os
import select
import signal
import sys
import termios
import time
import tty

FAULTS = ("overcurrent", "silent", "noreply", "ok", "quit")


def open_port(link):
    """A pseudo-terminal in raw mode, its device linked at `link`."""
    master, slave = os.openpty()
    for fd in (master, slave):
        tty.setraw(fd)
        attrs = termios.tcgetattr(fd)
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    if os.path.islink(link):
        os.unlink(link)
    elif os.path.exists(link):
        sys.exit(f"fake_mcu: {link} exists and is not a link; choose another path")
    os.symlink(os.ttyname(slave), link)
    # The device end stays open here too, so that rozd closing and opening
    # it again (a restart) never ends the link. Nothing here ever waits for
    # rozd: while nobody reads, telemetry that does not fit is dropped.
    os.set_blocking(master, False)
    return master, slave


def send(master, text):
    try:
        os.write(master, text.encode())
    except (BlockingIOError, OSError):
        pass


def say(text):
    print(text, flush=True)


def main():
    parser = argparse.ArgumentParser(description="A fake microcontroller on a pseudo-terminal.")
    parser.add_argument("link", help="the serial port to create, e.g. /tmp/rozd-mcu")
    parser.add_argument("--hz", type=float, default=10.0, help="telemetry lines a second (default 10)")
    args = parser.parse_args()

    master, _slave = open_port(args.link)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    motor, fault = 0.0, "ok"
    period = 1.0 / args.hz if args.hz > 0 else None
    next_line = time.monotonic()
    pending = b""
    typing, typed = True, b""
    say(f"fake MCU on {args.link} (type one of: {', '.join(FAULTS)})")
    try:
        while True:
            timeout = None if period is None else max(0.0, next_line - time.monotonic())
            watched = [master, sys.stdin] if typing else [master]
            ready, _, _ = select.select(watched, [], [], timeout)
            if sys.stdin in ready:
                # Read from the descriptor itself: a buffered readline could
                # keep a second line where select() never sees it.
                chunk = os.read(sys.stdin.fileno(), 1024)
                if not chunk:  # stdin closed (run in the background): keep being the device
                    typing = False
                typed += chunk
                while b"\n" in typed or (not chunk and typed):
                    line, _, typed = typed.partition(b"\n")
                    word = line.decode(errors="replace").strip().lower()
                    if word == "quit":
                        return
                    if word in FAULTS:
                        fault = word
                        say(f"fault: {fault}")
                    elif word:
                        say(f"unknown fault {word!r}; one of: {', '.join(FAULTS)}")
            if master in ready:
                try:
                    pending += os.read(master, 1024)
                except (BlockingIOError, OSError):
                    pass
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    command = line.decode(errors="replace").strip()
                    if not command:
                        continue
                    say(f"<- {command}")
                    if fault == "noreply":
                        continue
                    parts = command.split()
                    if len(parts) == 2 and parts[0] == "M":
                        try:
                            duty = float(parts[1])
                        except ValueError:
                            answer = "ERR not a number"
                        else:
                            if -1.0 <= duty <= 1.0:
                                motor, answer = duty, "OK"
                            else:
                                answer = "ERR out of range"
                    else:
                        answer = "ERR unknown command"
                    send(master, answer + "\n")
                    say(f"-> {answer}")
            if period is not None and time.monotonic() >= next_line:
                next_line += period
                if fault != "silent":
                    current = 3.5 if fault == "overcurrent" else 0.05 + 0.9 * abs(motor)
                    send(master, f"T=21.5 I={current:.2f}\n")
    finally:
        if os.path.islink(args.link):
            os.unlink(args.link)


if __name__ == "__main__":
    main()
