#!/usr/bin/env python3
"""Runs a shell command that ends by starting chat (the README's first command) in a pseudo-terminal, as a
person at a terminal would: waits for chat's prompt, types a line, waits for the answer, then Ctrl-D.

    drive_chat.py DIR COMMAND LOG

DIR: where the command runs (a fresh clone). LOG: everything the command printed. Prints, and appends to
$OUT/quick_start.txt when OUT is set, the seconds from the start to each milestone: packages done
(tools/setup's last line), configured, chat built, chat's prompt, chat's first answer. Exit status 0 when chat
answered and left with status 0. Python 3 standard library only.
"""

import os
import pty
import re
import select
import signal
import sys
import termios
import time

TIMEOUT = float(os.environ.get("QUICK_START_TIMEOUT", "1800"))

MILESTONES = [  # (name, regex on the output so far)
    ("packages", re.compile(r"tools/setup: (all present|installed)")),
    ("configured", re.compile(r"Build files have been written")),
    ("chat built", re.compile(r"Built target chat")),
    ("chat's prompt", re.compile(r"\nyou> ")),
]


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: drive_chat.py DIR COMMAND LOG")
    where, command, log_path = sys.argv[1:]
    t0 = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.chdir(where)
            os.execv("/bin/bash", ["bash", "-c", command])
        finally:
            os._exit(127)
    out = ""
    seen = {}
    log = open(log_path, "w", encoding="utf-8")

    def pump(timeout):
        nonlocal out
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            return True
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            return False
        text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        out += text
        log.write(text)
        log.flush()
        now = time.monotonic() - t0
        for name, rx in MILESTONES:
            if name not in seen and rx.search(out):
                seen[name] = now
        return True

    def wait_for(pattern, start):
        rx = re.compile(pattern)
        deadline = t0 + TIMEOUT
        while not rx.search(out, start):
            if time.monotonic() > deadline or not pump(1.0):
                return None
        return rx.search(out, start)

    def give_up(why):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.stderr.write(f"FAIL: {why}\n---- last output ----\n{out[-3000:]}\n")
        sys.exit(1)

    def type_at_prompt(keys):
        # libedit writes the prompt before it takes the terminal (canonical mode off); keys typed in between go
        # through the line discipline (Ctrl-D there reaches the editor as a NUL). Without libedit it never does.
        deadline = time.monotonic() + 5
        while termios.tcgetattr(fd)[3] & termios.ICANON and time.monotonic() < deadline:
            pump(0.005)
        os.write(fd, keys)

    m = wait_for(r"\nyou> ", 0)
    if not m:
        give_up("chat's prompt never came")
    seen["chat's prompt"] = time.monotonic() - t0
    type_at_prompt(b"Hello! Who are you?\r")
    m = wait_for(r"gemma> ", m.end())
    if not m:
        give_up("no answer began")
    m = wait_for(r"\nyou> ", m.end())  # the answer is complete when the next prompt comes
    if not m:
        give_up("the answer never ended")
    seen["chat's first answer"] = time.monotonic() - t0
    type_at_prompt(b"\x04")
    status = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        p, st = os.waitpid(pid, os.WNOHANG)
        if p:
            status = st
            break
        pump(0.2)
    log.close()
    if status is None or not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        give_up(f"chat did not leave with status 0 on Ctrl-D (status {status})")
    lines = [f"  {name:<20} {seen[name]:7.1f} s" for name, _ in MILESTONES + [("chat's first answer", None)]
             if name in seen]
    report = "quick start (seconds from the command's start):\n" + "\n".join(lines) + "\n"
    print(report, end="")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "quick_start.txt"), "a", encoding="utf-8") as f:
            f.write(report)


if __name__ == "__main__":
    main()
