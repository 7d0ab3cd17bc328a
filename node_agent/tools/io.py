"""Where a tool's files and programs are: the host, a container, or a host over ssh.

llama.cpp's ``tools_io`` family (``server-tools.cpp``). ``HostIO`` reads and writes files
itself (in a thread, off the event loop) and runs programs directly. ``IsolateIO`` does
everything as a command in the isolate, with the very argv llama.cpp uses (``sh -c 'wc -c <
"$1"' _ PATH``, ``cat -- PATH``, …: a path is always an argument, never part of a script), so
that ``docker exec`` or ``ssh`` sees the same calls from either router. Isolate commands other
than a tool's own program are bounded to 15 s.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, BinaryIO

from node_agent.tools.names import ContainerSpec, check_attachable
from node_agent.tools.params import opt_str
from node_agent.tools.process import ExecResult, OnChunk, run_program
from node_agent.tools.threads import in_thread

LIST_MAX_OUTPUT = 8 * 1024 * 1024  # git ls-files / find output kept
LIST_TIMEOUT = 15  # seconds for one listing, git and the walk together
LIST_MAX_ENTRIES = 200_000  # entries one walk keeps (the agent's memory: ~30 MB of them)
ISOLATE_TIMEOUT = 15  # seconds for an isolate's helper commands
ISOLATE_READ_MAX = 64 * 1024 * 1024
HOST_READ_MAX = ISOLATE_READ_MAX
# Listed but never walked into: they can be enormous.
JUNK_DIRS = (
    ".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build",
    "target", ".cache", ".idea", ".vscode",
)  # fmt: skip
GIT_LS_FILES = ("ls-files", "--cached", "--others", "--exclude-standard")
SSH_OPTIONS = (
    # No console to answer a prompt: key-based authentication, a host key trusted beforehand.
    "-o", "BatchMode=yes",
    "-o", "PasswordAuthentication=no",
    "-o", "KbdInteractiveAuthentication=no",
    "-o", "StrictHostKeyChecking=yes",
)  # fmt: skip


class Kind(Enum):
    FILES = "file"
    DIRS = "dir"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class Entry:
    rel: str  # '/'-separated, relative to the listed directory
    is_dir: bool


@dataclass(slots=True)
class Listing:
    entries: list[Entry] = field(default_factory=list)
    err: str = ""
    truncated: bool = False  # the walk could not see everything (time, unreadable folders)


def _depth(rel: str) -> int:
    return 1 + rel.count("/")


def _lines(output: bytes, *, strip_dot_slash: bool = False) -> list[str]:
    lines = []
    for line in output.decode("utf-8", "surrogateescape").split("\n"):
        line = line.removesuffix("\r")
        if not line:
            continue
        if strip_dot_slash:
            line = line.removeprefix("./")
        lines.append(line.replace("\\", "/"))
    return lines


class ToolsIO:
    """The operations a tool uses; ``resolve`` makes a path absolute for this runtime."""

    def resolve(self, path: str) -> str:
        raise NotImplementedError

    async def is_directory(self, path: str) -> bool:
        raise NotImplementedError

    async def is_regular_file(self, path: str) -> bool:
        raise NotImplementedError

    async def file_size(self, path: str) -> int | None:
        raise NotImplementedError

    async def read_file(self, path: str) -> bytes | None:
        raise NotImplementedError

    async def write_file(self, path: str, content: bytes) -> bool:
        raise NotImplementedError

    async def list_entries(self, base: str, max_depth: int, kind: Kind) -> Listing:
        """Entries under ``base`` (already resolved); ``max_depth`` 0: no limit."""
        raise NotImplementedError

    async def run(
        self, args: Sequence[str], max_output: int, seconds: int, on_chunk: OnChunk | None = None
    ) -> ExecResult:
        raise NotImplementedError


class HostIO(ToolsIO):
    """The agent's own machine; ``cwd`` (``X-Tool-Cwd``) resolves relative paths and is where
    programs run (empty: the agent's working directory)."""

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        home = os.environ.get("HOME", "")
        if home and (path == "~" or path.startswith(("~/", "~\\"))):
            path = home + path[1:]
        if not path.startswith("/"):
            try:
                path = posixpath.join(self.cwd or os.getcwd(), path)
            except OSError:
                return path
        return posixpath.normpath(path)  # no "." or "..", never a trailing '/'

    async def is_directory(self, path: str) -> bool:
        return await in_thread(os.path.isdir, self.resolve(path))

    async def is_regular_file(self, path: str) -> bool:
        return await in_thread(os.path.isfile, self.resolve(path))

    async def file_size(self, path: str) -> int | None:
        def size() -> int | None:
            try:
                st = os.stat(self.resolve(path))
            except (OSError, ValueError):
                return None
            return st.st_size if stat.S_ISREG(st.st_mode) else None

        return await in_thread(size)

    async def read_file(self, path: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                with _open_regular(self.resolve(path), os.O_RDONLY) as f:
                    # Bounded as in an isolate (llama.cpp reads a host file whole, whatever
                    # its size: grep_search over a disk image would take the agent's memory).
                    content = f.read(HOST_READ_MAX + 1)
                return content if len(content) <= HOST_READ_MAX else None
            except IsADirectoryError:
                return b""  # llama.cpp's stream opens a folder and reads nothing
            except (OSError, ValueError):
                return None

        return await in_thread(read)

    async def write_file(self, path: str, content: bytes) -> bool:
        def write() -> bool:
            target = self.resolve(path)
            try:
                os.makedirs(posixpath.dirname(target) or "/", exist_ok=True)
                with _open_regular(target, os.O_WRONLY | os.O_CREAT) as f:
                    f.truncate()
                    f.write(content)
            except (OSError, ValueError):
                return False
            return True

        return await in_thread(write)

    async def list_entries(self, base: str, max_depth: int, kind: Kind) -> Listing:
        if not await in_thread(os.path.isdir, base):
            return Listing(err="path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_TIMEOUT
        if kind is Kind.FILES:
            res = await self.run(["git", "-C", base, *GIT_LS_FILES], LIST_MAX_OUTPUT, LIST_TIMEOUT)
            if res.exit_code == 0 and not res.timed_out:
                return await in_thread(self._git_files, base, res.output, max_depth)
        return await in_thread(_walk, base, max_depth, kind, deadline)

    @staticmethod
    def _git_files(base: str, output: bytes, max_depth: int) -> Listing:
        listing = Listing()
        for rel in _lines(output):
            if max_depth > 0 and _depth(rel) > max_depth:
                continue
            if os.path.isfile(posixpath.join(base, rel)):
                listing.entries.append(Entry(rel, False))
        return listing

    async def run(
        self, args: Sequence[str], max_output: int, seconds: int, on_chunk: OnChunk | None = None
    ) -> ExecResult:
        # Under the reaper: what the program starts dies with it, a new session's too.
        return await run_program(
            args, max_output, seconds, on_chunk=on_chunk, cwd=self.cwd, reap=True
        )


def _walk(base: str, max_depth: int, kind: Kind, deadline: float) -> Listing:
    """llama.cpp's walker, in its order: depth first from a stack, each folder in the order
    the file system lists it; links to folders are listed, never followed."""
    listing = Listing()
    stack: list[tuple[str, str, int]] = [(base, "", 0)]
    while stack:
        if time.monotonic() >= deadline or len(listing.entries) >= LIST_MAX_ENTRIES:
            listing.truncated = True
            return listing
        folder, rel_dir, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                found = list(it)
        except OSError:
            listing.truncated = True
            continue
        for entry in found:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                is_dir = entry.is_dir()
                is_file = not is_dir and entry.is_file()
            except OSError:
                continue
            if is_dir:
                if kind is not Kind.FILES:
                    listing.entries.append(Entry(rel, True))
                if entry.name in JUNK_DIRS or entry.is_symlink():
                    continue
                if max_depth == 0 or depth + 1 < max_depth:
                    stack.append((entry.path, rel, depth + 1))
            elif is_file and kind is not Kind.DIRS:
                listing.entries.append(Entry(rel, False))
    return listing


class IsolateIO(ToolsIO):
    """A POSIX isolate (it must have sh, cat, wc, mkdir, dirname, find, timeout): every
    operation is one command in it, wrapped by ``_argv`` into the host command that runs it."""

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def _argv(self, inner: Sequence[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return f"{self.cwd}/{path}"

    async def _exec(self, inner: Sequence[str], max_output: int, combine: bool) -> ExecResult:
        argv = self._argv(inner, needs_stdin=False)
        return await run_program(argv, max_output, ISOLATE_TIMEOUT, combine_stderr=combine)

    async def _test(self, flag: str, path: str) -> bool:
        res = await self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", path], 4096, True)
        return res.exit_code == 0 and not res.timed_out

    async def is_directory(self, path: str) -> bool:
        return await self._test("-d", self.resolve(path))

    async def is_regular_file(self, path: str) -> bool:
        return await self._test("-f", self.resolve(path))

    async def file_size(self, path: str) -> int | None:
        res = await self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64, True)
        number = re.match(rb"\s*(\d+)", res.output)
        if res.exit_code != 0 or res.timed_out or number is None:
            return None
        return int(number.group(1))

    async def read_file(self, path: str) -> bytes | None:
        # stderr apart: it must not be spliced into the file's bytes
        res = await self._exec(["cat", "--", self.resolve(path)], ISOLATE_READ_MAX, False)
        return res.output if res.exit_code == 0 and not res.timed_out else None

    async def write_file(self, path: str, content: bytes) -> bool:
        # The content goes on stdin: nothing for the far side to parse, no file on the host.
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        argv = self._argv(["sh", "-c", script, "_", self.resolve(path)], needs_stdin=True)
        res = await run_program(argv, 4096, ISOLATE_TIMEOUT, stdin_data=content)
        return res.exit_code == 0 and not res.timed_out

    async def list_entries(self, base: str, max_depth: int, kind: Kind) -> Listing:
        listing = Listing()
        absolute = self.resolve(base)
        if not await self.is_directory(base):
            listing.err = "path does not exist or is not a directory"
            return listing
        if kind is Kind.FILES:
            script = 'cd "$1" && git ' + " ".join(GIT_LS_FILES)
            res = await self._exec(["sh", "-c", script, "_", absolute], LIST_MAX_OUTPUT, True)
            if res.exit_code == 0 and not res.timed_out:
                for rel in _lines(res.output):
                    if max_depth <= 0 or _depth(rel) <= max_depth:
                        listing.entries.append(Entry(rel, False))
                return listing
        if kind is not Kind.FILES:
            for rel in await self._find(absolute, max_depth, True, listing):
                listing.entries.append(Entry(rel, True))
        if kind is not Kind.DIRS:
            for rel in await self._find(absolute, max_depth, False, listing):
                listing.entries.append(Entry(rel, False))
        return listing

    async def _find(self, base: str, max_depth: int, dirs: bool, listing: Listing) -> list[str]:
        # -mindepth/-maxdepth: busybox's find works as well as GNU's
        prune = " -o ".join(f"-name {n}" for n in JUNK_DIRS)
        script = 'cd "$1" && find . -mindepth 1'
        if max_depth > 0:
            script += f" -maxdepth {max_depth}"
        script += f" \\( {prune} \\) -prune"
        script += " -print -o -type d -print" if dirs else " -o -type f -print"
        res = await self._exec(["sh", "-c", script, "_", base], LIST_MAX_OUTPUT, True)
        listing.truncated = listing.truncated or res.timed_out
        return _lines(res.output, strip_dot_slash=True)

    async def run(
        self, args: Sequence[str], max_output: int, seconds: int, on_chunk: OnChunk | None = None
    ) -> ExecResult:
        # ``timeout`` inside: killing the host-side client does not end what runs in there;
        # the host's own bound is 5 s later, so that one can end cleanly first.
        inner = ["timeout", f"{seconds}s", *args]
        if self.cwd:  # 127: what a shell reports for a command it could not run
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        argv = self._argv(inner, needs_stdin=True)
        return await run_program(argv, max_output, seconds + 5, on_chunk=on_chunk)


class ContainerIO(IsolateIO):
    """A running container, through ``<engine> exec`` (docker and podman alike)."""

    def __init__(self, container: ContainerSpec, cwd: str = "") -> None:
        super().__init__(cwd)
        self.engine, self.container_id = container.engine, container.arg

    def _argv(self, inner: Sequence[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]


class SshIO(IsolateIO):
    """A remote host over ssh: remoting, not isolation (the tools can do whatever the target
    account can)."""

    def __init__(self, target: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.target = target

    def _argv(self, inner: Sequence[str], needs_stdin: bool) -> list[str]:
        # The remote shell parses the command line again: the argv travels as one quoted word.
        no_stdin = [] if needs_stdin else ["-n"]
        return ["ssh", *SSH_OPTIONS, *no_stdin, self.target, shell_quote_join(inner)]


def shell_quote_join(argv: Sequence[str]) -> str:
    """One string that a POSIX shell splits back into exactly ``argv``."""
    return " ".join("'" + arg.replace("'", "'\\''") + "'" for arg in argv)


def tools_io(params: Any) -> ToolsIO:
    """The IO of one call, from its ``cwd`` and ``runtime`` (set from headers or
    ``--tools-runtime``, never by the model). A bad runtime raises RuntimeSpecError."""
    cwd = opt_str(params, "cwd", "")
    runtime = opt_str(params, "runtime", "")
    if not runtime:
        return HostIO(cwd)
    where = check_attachable(runtime)
    if isinstance(where, ContainerSpec):
        return ContainerIO(where, cwd)
    return SshIO(where, cwd)


def _open_regular(path: str, flags: int) -> BinaryIO:
    """A host file opened only if it is a regular one (a folder raises IsADirectoryError).
    ``O_NONBLOCK``: a FIFO would otherwise block the open until a peer came, holding a tool
    thread for good; refused here, it answers llama.cpp's "failed to open/write file"."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):
            raise OSError(f"not a regular file: {path}")
        os.set_blocking(fd, True)
        return open(fd, "wb" if flags & os.O_WRONLY else "rb")
    except BaseException:
        os.close(fd)
        raise
