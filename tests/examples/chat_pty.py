#!/usr/bin/env python3
"""Drives examples/chat through a pseudo-terminal, as a person at a terminal would (ctest: example.chat_pty).

    chat_pty.py PATH_TO_CHAT

1. Conversation: two turns, /stats (numbers), /system, /think on and off, an unknown command, /reset, one
   more turn (the session re-prefilled: 0 tokens reused), /stats, /quit -> exit status 0.
2. Ctrl-C during a long answer stops that answer (" [stopped]"), the program goes on (/stats answers);
   Ctrl-C at the prompt discards the line typed so far and does not leave (the next command runs alone).
3. Ctrl-D on an empty line leaves with exit status 0 (with line editing: Ctrl-D on a line with text does not).
4. Line editing and history (chat built with libedit, which `chat --help` says): a typo fixed with the arrow
   keys, the previous line recalled with the up arrow, Ctrl-A / Ctrl-E / Ctrl-U.
Runs the bundled tiny model on the CPU backend. Python 3 standard library only (pty, os, select).
"""

import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time

TIMEOUT = float(os.environ.get("CHAT_PTY_TIMEOUT", "120"))  # seconds per expected output (sanitizers are slow)
EDITING = False  # chat has line editing (libedit); set by main() from chat --help


class Chat:
    def __init__(self, exe, *flags):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: chat on the terminal's slave side
            try:
                os.execv(exe, [exe, "--cpu", *flags])
            finally:
                os._exit(127)
        self.out = ""  # everything read so far (\r\n turned into \n)
        self.pos = 0  # what expect() has consumed

    def read_some(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal (exited)
            data = b""
        if not data:
            raise EOFError
        self.out += data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        return True

    def expect(self, pattern, timeout=TIMEOUT):
        """Waits for a regex in the output after what was consumed; returns the match and consumes to its end."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.out, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail(f"timed out waiting for {pattern!r}")
            try:
                self.read_some(left)
            except EOFError:
                m = rx.search(self.out, self.pos)
                if m:
                    self.pos = m.end()
                    return m
                self.fail(f"chat exited while waiting for {pattern!r}")

    def send(self, text, at_prompt=True):
        """Types text. at_prompt: chat waits at its prompt; with line editing, first wait until the editor has
        the terminal (canonical mode off). libedit writes the prompt before it switches modes, and keys typed in
        between are taken by the terminal's line discipline (Ctrl-D there becomes a NUL byte for the editor)."""
        if at_prompt and EDITING:
            deadline = time.monotonic() + TIMEOUT
            while termios.tcgetattr(self.fd)[3] & termios.ICANON:
                if time.monotonic() > deadline:
                    self.fail("the line editor never took the terminal")
                time.sleep(0.005)
        os.write(self.fd, text.encode())

    def line(self, text):
        self.send(text + "\n")

    def wait_exit(self, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                try:
                    while self.read_some(0.1):
                        pass
                except EOFError:
                    pass
                os.close(self.fd)
                return status
            try:
                self.read_some(0.1)
            except EOFError:
                time.sleep(0.05)
        self.fail("chat did not exit")

    def alive(self):
        pid, _ = os.waitpid(self.pid, os.WNOHANG)
        return pid == 0

    def fail(self, why):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.stderr.write(f"FAIL: {why}\n---- chat output so far ----\n{self.out}\n---- end ----\n")
        sys.exit(1)


def check(cond, why, chat):
    if not cond:
        chat.fail(why)


def exited_ok(status):
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


PROMPT = r"\nyou> "
NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def stats(chat):
    """Sends /stats and returns its numbers."""
    chat.line("/stats")
    ttft = float(chat.expect(r"time to first token\s+" + NUMBER + " ms").group(1))
    m = chat.expect(r"prefill\s+" + NUMBER + r" tok/s \(([0-9]+) new tokens; ([0-9]+) reused")
    prefill, new, reused = float(m.group(1)), int(m.group(2)), int(m.group(3))
    decode = float(chat.expect(r"decode\s+" + NUMBER + " tok/s").group(1))
    used = int(chat.expect(r"context\s+([0-9]+) of [0-9]+ tokens").group(1))
    chat.expect(PROMPT)
    return ttft, prefill, new, reused, decode, used


def conversation(exe):
    chat = Chat(exe, "--max-tokens", "24", "--seed", "5")
    chat.expect(r"chat: .*cpu backend")
    chat.expect(r"random weights")  # the tiny model says what it is
    chat.expect(PROMPT)
    chat.line("/stats")
    chat.expect(r"\(no answer yet\)")
    chat.expect(PROMPT)

    chat.line("Hello there!")
    chat.expect(r"gemma> ")
    chat.expect(PROMPT)
    chat.line("How are you today?")
    chat.expect(r"gemma> ")
    chat.expect(PROMPT)
    ttft, prefill, new, reused, decode, used = stats(chat)
    check(ttft > 0 and prefill > 0 and new > 0, "stats after two turns: TTFT and prefill must be > 0", chat)
    check(used > new, "the session holds both turns", chat)

    chat.line("/system You are a terse assistant.")
    chat.expect(r"\(system prompt set\)")
    chat.line("/think on")
    chat.expect(r"\(thinking on\)")
    chat.line("/think off")
    chat.expect(r"\(thinking off\)")
    chat.line("/frobnicate")
    chat.expect(r"unknown command '/frobnicate'")
    chat.line("/reset")
    chat.expect(r"\(conversation reset\)")
    chat.expect(PROMPT)
    chat.line("One more turn, please.")
    chat.expect(r"gemma> ")
    chat.expect(PROMPT)
    ttft, prefill, new, reused, decode, used = stats(chat)
    check(reused == 0, "after /reset the session is prefilled from the start (0 reused)", chat)
    check(ttft > 0 and prefill > 0, "stats after /reset", chat)
    chat.line("/quit")
    status = chat.wait_exit()
    check(exited_ok(status), f"/quit: exit status {status}", chat)


def ctrl_c(exe):
    # A long answer (end-of-turn tokens ignored) that Ctrl-C cuts short.
    chat = Chat(exe, "--ignore-eos", "--max-tokens", "4000", "--max-context", "4096")
    chat.expect(PROMPT)
    chat.line("Tell me a very long story.")
    chat.expect(r"gemma> ")
    chat.read_some(TIMEOUT)  # the answer has begun
    chat.send("\x03", at_prompt=False)  # the terminal's interrupt character: SIGINT to chat
    m = chat.expect(r" \[stopped\]\n")
    answer = chat.out[: m.start()].rsplit("gemma> ", 1)[1]
    check(len(answer) > 0, "some of the answer was printed before Ctrl-C", chat)
    chat.expect(PROMPT)
    chat.line("/stats")
    m = chat.expect(r"last answer: ([0-9]+) tokens \(stopped\)")
    check(0 < int(m.group(1)) < 4000, "the stopped answer has fewer tokens than --max-tokens", chat)
    chat.expect(PROMPT)
    # Ctrl-C at the prompt: the half-typed line is discarded, chat stays; what follows runs on its own.
    chat.send("/reset but not sent")
    chat.send("\x03")
    chat.expect(PROMPT)
    time.sleep(0.2)
    check(chat.alive(), "Ctrl-C at the prompt must not end chat", chat)
    chat.line("/stats")
    chat.expect(r"last answer: [0-9]+ tokens \(stopped\)")  # not "unknown command" nor a reset
    chat.expect(PROMPT)
    chat.send("\x03")  # twice in a row, on an empty line
    chat.expect(PROMPT)
    chat.line("/quit")
    status = chat.wait_exit()
    check(exited_ok(status), f"/quit after Ctrl-C at the prompt: exit status {status}", chat)


def ctrl_d(exe, editing):
    chat = Chat(exe)
    chat.expect(PROMPT)
    if editing:  # Ctrl-D on a line with text deletes (or beeps); only on an empty line does it leave
        chat.send("xy\x1b[D\x04")
        time.sleep(0.3)
        check(chat.alive(), "Ctrl-D on a line with text must not end chat", chat)
        chat.send("\x15")  # Ctrl-U: the line is empty again
        time.sleep(0.1)
    chat.send("\x04")  # the terminal's end-of-file character
    status = chat.wait_exit()
    check(exited_ok(status), f"Ctrl-D on an empty line: exit status {status}", chat)


def line_editing(exe):
    chat = Chat(exe)
    chat.expect(PROMPT)
    # "/sats": three left arrows, insert "t" -> "/stats"; Enter runs it.
    chat.send("/sats\x1b[D\x1b[D\x1b[Dt\r")
    chat.expect(r"\(no answer yet\)")
    chat.expect(PROMPT)
    chat.send("\x1b[A\r")  # up arrow: the previous line again
    chat.expect(r"\(no answer yet\)")
    chat.expect(PROMPT)
    # Ctrl-A to the start, type "/think " there, Ctrl-E to the end: "/think on".
    chat.send("on\x01/think \x05\r")
    chat.expect(r"\(thinking on\)")
    chat.expect(PROMPT)
    chat.send("/frobnicate\x15/think off\r")  # Ctrl-U kills what was typed
    chat.expect(r"\(thinking off\)")
    chat.expect(PROMPT)
    check("unknown command" not in chat.out, "edited lines reach chat as edited", chat)
    chat.line("/quit")
    status = chat.wait_exit()
    check(exited_ok(status), f"/quit: exit status {status}", chat)


def has_line_editing(exe):
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    return "line editing" in r.stdout


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: chat_pty.py PATH_TO_CHAT")
    exe = sys.argv[1]
    global EDITING
    EDITING = editing = has_line_editing(exe)
    tests = [conversation, ctrl_c, lambda e: ctrl_d(e, editing)]
    names = ["conversation", "ctrl_c", "ctrl_d"]
    if editing:
        tests.append(line_editing)
        names.append("line_editing")
    else:
        print("note: chat was built without libedit (-DGEMMA4_T4_LIBEDIT=OFF): line editing not tested")
    for name, test in zip(names, tests):
        test(exe)
        print(f"ok: {name}")


if __name__ == "__main__":
    main()
