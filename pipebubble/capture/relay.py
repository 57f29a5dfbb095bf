"""The profiled command's output on its way to the user: the program's own lines pass through as written, the
profiler's chatter goes to a log file instead, and the last lines of its error stream are kept.

Kineto prints `USDT:... profiler_start` and `STAGE:`/`WARNING:` lines from C++ straight to fd 1/2 of every
profiled process, so no Python-level redirection can hold them back: the child's stdout and stderr are a
pseudo-terminal where ours is a terminal (the program still sees one: line buffering, colours, its width)
and a pipe otherwise, read here line by line. A partial line that cannot be chatter is passed on at once,
so progress bars that redraw with `\\r` still redraw.
"""

from __future__ import annotations

import collections
import os
import re
import threading
from itertools import pairwise
from pathlib import Path

LOG_NAME = "capture.log"
TAIL_LINES = 20
_HOLD_MAX = 4096  # a partial line longer than this is passed on, chatter or not

# Kineto's logger: LEVEL:YYYY-MM-DD HH:MM:SS PID:TID File.cpp:LINE] message (libkineto/src/Logger.cpp).
_KINETO = re.compile(rb"(?:USDT|STAGE|INFO|WARNING|ERROR|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] ")
# What torch.distributed puts before a rank's c10 messages once its process group is up.
_RANK = re.compile(rb"(?:\[rank\d+\]:)?")
# c10's glog-style warnings from the profiler's own sources: [W1201 14:23:09.907 123 .../profiler_kineto.cpp:45],
# and from the CPU allocator's memory reporter, which speaks only while memory is profiled (a free of a block
# allocated before the profiler started).
_C10 = re.compile(_RANK.pattern + rb"\[[WIEF][^\]\n]*(?:kineto|profiler|[Cc]upti|CPUAllocator)"
                  rb"[^\]\n]*\.(?:cpp|h):\d+\]")
# A Python warning raised inside torch.profiler: its header line, then the indented source line under it.
_PYWARN = re.compile(rb"\S*torch[/\\](?:profiler|autograd[/\\]profiler)\S*\.py:\d+: \w*Warning: ")
_INSIDE = re.compile(_KINETO.pattern + rb"|" + _C10.pattern)
_KINETO_STARTS = (b"USDT:", b"STAGE:", b"INFO:", b"WARNING:", b"ERROR:", b"VERBOSE:")
_STARTS = (*_KINETO_STARTS, b"[", b"/")  # how a chatter line may start (a c10 warning; a Python warning's path)
_STARTS_INSIDE = (*_KINETO_STARTS, b"[W", b"[I", b"[E", b"[F")  # ... inside a line: no `[` or `/` alone
_LOUD = (b"WARNING:", b"ERROR:", b"[W", b"[E", b"[F")  # chatter that may explain a thin trace: counted
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def is_chatter(line: bytes) -> bool:
    """Whether a whole line (newline included or not) is the profiler talking, not the program."""
    return bool(_KINETO.match(line) or _C10.match(line) or _PYWARN.match(line))


class LineFilter:
    """Splits one byte stream into what to pass on and the chatter lines, holding back only a partial line
    that may still turn out to be chatter."""

    def __init__(self) -> None:
        self.held = b""
        self.passing = False  # inside a line whose start was passed on already
        self.warning_source = False  # the next indented line belongs to a profiler Python warning
        self.owed = 0  # newlines still to come for profiler lines that ran together (see _whole_line)

    def feed(self, data: bytes) -> tuple[bytes, list[bytes]]:
        out, chatter = bytearray(), []
        if self.held and not data.startswith((b"\n", b"\r\n")) and _whole_message(self.held):
            # Kineto writes its line and the newline apart: a held profiler line followed by anything but its
            # newline ended with its write, and another writer (a rank sharing the stream) wrote next.
            chatter.append(self.held + b"\n")
            self.held, self.owed = b"", self.owed + 1
        buf, self.held = self.held + data, b""
        at = 0
        if not (self.warning_source or self.owed) and b"Warning: " not in buf and _INSIDE.search(buf) is None:
            at = buf.rfind(b"\n") + 1  # no profiler line in here: every whole line is the program's
            out += buf[:at]
            self.passing = self.passing and not at
        while at < len(buf):
            end = buf.find(b"\n", at) + 1
            if not end:
                rest = buf[at:]
                # At the start of a write a profiler line may begin, even inside a program's line.
                if (at == 0 or not self.passing) and len(rest) < _HOLD_MAX and _may_be_chatter(rest, self.passing):
                    self.held = rest
                else:
                    out += rest
                    self.passing = True
                break
            line, at = buf[at:end], end
            self._whole_line(line, out, chatter)
        return bytes(out), chatter

    def _whole_line(self, line: bytes, out: bytearray, chatter: list[bytes]) -> None:
        """Pass one whole line on, or keep it as chatter, or split it between the two."""
        if self.owed and line in (b"\n", b"\r\n"):
            self.owed -= 1
            return
        starts = [m.start() for m in _INSIDE.finditer(line, 0 if self.passing else _RANK.match(line).end() + 1)]
        if not starts:
            self._unsplit(line, out, chatter)
        elif not self.passing and is_chatter(line[: starts[0]]):
            # Kineto writes a line and its newline apart: ranks sharing one stream run their lines together,
            # then send the newlines, one each. Each line is chatter; the newlines after it are theirs.
            pieces = [line[a:b] for a, b in pairwise([0, *starts, len(line)])]
            chatter += [piece + b"\n" for piece in pieces[:-1]] + pieces[-1:]
            self.owed += len(starts)
        else:
            # A profiler line may start inside a line of the program's (a `\r` progress bar on the same
            # terminal): the program's part goes on, and its line stays open.
            out += line[: starts[0]]
            chatter.append(line[starts[0]:])
            self.passing = self.passing or starts[0] > 0

    def _unsplit(self, line: bytes, out: bytearray, chatter: list[bytes]) -> None:
        """A line with no profiler line starting inside it: the end of the program's open line, or one whole."""
        if self.passing:
            out += line
            self.passing = False
        elif self._chatter(line):
            chatter.append(line)
        else:
            out += line

    def close(self) -> bytes:
        held, self.held = self.held, b""
        return held

    def _chatter(self, line: bytes) -> bool:
        follows, self.warning_source = self.warning_source, False
        if follows and line[:1] in (b" ", b"\t"):
            return True
        self.warning_source = bool(_PYWARN.match(line))
        return is_chatter(line)


def _whole_message(partial: bytes) -> bool:
    """Whether a partial line is a Kineto line with its message written: the header and some text after it."""
    header = _KINETO.match(partial)
    return header is not None and header.end() < len(partial)


def _may_be_chatter(partial: bytes, inside_line: bool = False) -> bool:
    """Whether a partial line may be the start of a profiler line (inside a program's line, only a
    Kineto or c10 prefix is waited for: a program's `[` or `/` goes straight on)."""
    return any(partial.startswith(p) or p.startswith(partial) for p in (_STARTS_INSIDE if inside_line else _STARTS))


class Relay:
    """The child's stdout and stderr (one channel when ours are the same file, so their order is kept), the
    threads that pass them on to ours, the chatter log (created on its first line) and the error tail."""

    def __init__(self, log: Path, targets: tuple[int, int] = (1, 2)) -> None:
        self.log, self.loud = log, 0
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._lock, self._log_file, self._threads = threading.Lock(), None, []
        merged = _same_file(*targets)
        self._channels = [_Channel(targets[0], keep_tail=True)] if merged else [
            _Channel(targets[0], keep_tail=False), _Channel(targets[1], keep_tail=True)]
        self.child_fds = (self._channels[0].child_fd, self._channels[-1].child_fd)

    @property
    def wrote_log(self) -> bool:
        return self._log_file is not None

    def start(self) -> None:
        """Once the child has its ends: close ours of them (so end of file comes when the child's go) and read."""
        for channel in self._channels:
            os.close(channel.child_fd)
            thread = threading.Thread(target=self._pump, args=(channel,), daemon=True, name="pipebubble-relay")
            thread.start()
            self._threads.append(thread)

    def finish(self, timeout: float = 2.0) -> None:
        """Wait for the rest of the output. A process the program left running may hold the channel open:
        its output keeps flowing (the threads are daemons) but the capture does not wait for it."""
        for thread in self._threads:
            thread.join(timeout)
        with self._lock:
            if self._log_file is not None:
                self._log_file.flush()

    def say(self, lines: list[str]) -> None:
        """Lines of the capture's own, on the error stream while the program writes there too: each on a line
        of its own, never inside one of the program's (a progress bar drawn with `\r`)."""
        if not lines:
            return
        channel = self._channels[-1]
        with channel.lock:
            channel.forward(b"\n" if channel.line_open else b"")
            channel.forward("".join(f"{line}\n" for line in lines).encode())

    def end_line(self) -> None:
        """End a line the program left open on a terminal, so what follows starts on a line of its own."""
        for channel in self._channels:
            with channel.lock:
                if channel.line_open and os.isatty(channel.target):
                    channel.forward(b"\n")

    def abandon(self) -> None:
        """The child never started: close every end."""
        for channel in self._channels:
            for fd in (channel.child_fd, channel.read_fd):
                _close(fd)

    def _pump(self, channel: _Channel) -> None:
        line_filter = LineFilter()
        while data := _read(channel.read_fd):
            passed, chatter = line_filter.feed(data)
            with channel.lock:
                channel.forward(passed)
            self._keep(channel, passed, chatter)
        held = line_filter.close()
        with channel.lock:
            channel.forward(held)
        self._keep(channel, held, [])
        channel.flush_tail(self.tail)
        _close(channel.read_fd)

    def _keep(self, channel: _Channel, passed: bytes, chatter: list[bytes]) -> None:
        if channel.keep_tail:
            channel.collect(passed, self.tail)
        if not chatter:
            return
        with self._lock:
            self.loud += sum(line.startswith(_LOUD) for line in chatter)
            try:
                if self._log_file is None:
                    self._log_file = open(self.log, "ab")  # noqa: SIM115 - open for the whole run
                self._log_file.write(b"".join(chatter))
            except OSError:
                pass  # a log we cannot write costs the chatter, never the capture


class _Channel:
    """One stream: the end the child writes (a pty where the target is a terminal, else a pipe) and ours."""

    def __init__(self, target: int, keep_tail: bool) -> None:
        self.target, self.keep_tail, self.open_target = target, keep_tail, True
        self.read_fd, self.child_fd = _pty_for(target) or os.pipe()
        self.partial, self.line_open, self.lock = b"", False, threading.Lock()

    def forward(self, data: bytes) -> None:
        """Write ``data`` to the target whole (the caller holds ``lock``)."""
        if data:
            self.line_open = not data.endswith(b"\n")
        while data and self.open_target:
            try:
                data = data[os.write(self.target, data):]
            except InterruptedError:
                continue
            except OSError:  # our reader left (`| head`): keep draining so the program never blocks
                self.open_target = False

    def collect(self, data: bytes, tail: collections.deque[str]) -> None:
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            _add_tail(line, tail)
        self.partial = self.partial[-_HOLD_MAX:]

    def flush_tail(self, tail: collections.deque[str]) -> None:
        if self.keep_tail and self.partial:
            _add_tail(self.partial, tail)


def _add_tail(line: bytes, tail: collections.deque[str]) -> None:
    text = _ANSI.sub("", line.decode(errors="replace")).rsplit("\r", 1)[-1].strip()
    if text:
        tail.append(text)


def _pty_for(target: int) -> tuple[int, int] | None:
    """A pseudo-terminal (master, slave) shaped like ``target`` when it is a terminal, else None."""
    try:
        import fcntl
        import pty
        import termios
    except ImportError:  # not a POSIX system: a pipe it is
        return None
    if not os.isatty(target):
        return None
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(target, termios.TIOCGWINSZ, b"\0" * 8))
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST  # "\n" stays "\n": our own terminal adds its "\r"
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
    except OSError:
        pass
    return master, slave


def _read(fd: int) -> bytes:
    while True:
        try:
            return os.read(fd, 1 << 16)
        except InterruptedError:
            continue
        except OSError:  # a pty's master reads EIO once every slave end is closed: end of file
            return b""


def _same_file(a: int, b: int) -> bool:
    try:
        return os.path.samestat(os.fstat(a), os.fstat(b))
    except OSError:
        return False


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
