"""A command run on a pseudo-terminal, and the screen it leaves: what a user sees at the end of an interactive
run (rich's live display draws, redraws and erases itself with cursor moves; only this replay tells what
stays on screen)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])")


def run_on_terminal(args: list[str], cwd: Path, columns: int = 160, rows: int = 50) -> tuple[int, str]:
    """`python -m npubuild ARGS` with stdout and stderr on one terminal of `columns` x `rows`; its exit code and
    every byte it wrote (read until it exits and the terminal is drained)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": str(rows), "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "npubuild", *args], cwd=cwd, stdin=follower, stdout=follower,
                            stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child's end closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(timeout=600), b"".join(chunks).decode("utf-8", "replace")


def screen(stream: str, columns: int = 160) -> list[str]:
    """The lines left on screen after `stream`: text, CR, LF, and the CSI moves rich uses (cursor up/down,
    erase line, column); colours and cursor visibility ignored. Trailing blank lines dropped."""
    lines: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(stream):
        m = CSI.match(stream, i)
        if m:
            arg, cmd = m.group(1), m.group(2)
            n = int(arg) if arg.isdigit() else 1
            if cmd == "A":
                row = max(0, row - n)
            elif cmd == "B":
                row += n
            elif cmd == "K" or (cmd == "J" and arg in ("", "0")):
                while len(lines) <= row:
                    lines.append([])
                if arg == "2" or cmd == "J":
                    lines[row] = [] if arg == "2" else lines[row][:col]
                else:
                    lines[row] = lines[row][:col]
            elif cmd == "G":
                col = n - 1
            i = m.end()
            continue
        ch = stream[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            col = 0
        elif ch == "\x1b":  # another escape (charset, keypad): skip its next character
            i += 1
        elif ch >= " ":
            while len(lines) <= row:
                lines.append([])
            line = lines[row]
            if col >= columns:  # wrap
                row += 1
                col = 0
                while len(lines) <= row:
                    lines.append([])
                line = lines[row]
            while len(line) < col:
                line.append(" ")
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
    text = ["".join(ln).rstrip() for ln in lines]
    while text and not text[-1]:
        text.pop()
    return text
