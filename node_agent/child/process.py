"""One llama-server child process, supervised by one owner task.

API::

    config = ChildConfig(name="tiny", binary=path, args=("-m", "tiny.gguf", "-c", "4096"))
    child = ChildProcess(config, on_event=callback)   # inside a running event loop
    await child.start()          # spawn, wait until ready; ChildError on failure (child gone)
    child.port, child.pid, child.state, child.meta, child.logs.tail(20), child.snapshot()
    code = await child.stop()    # graceful, then SIGKILL after stop_timeout; idempotent
    code = await child.wait_exited()

A ChildProcess runs once: to load a model again, make a new one (pass the old ``logs`` ring to
keep one log per model across restarts).

**Ownership.** ``start()`` creates the owner task; it alone spawns, reads the child's stdout
protocol lines and ``/health``, changes ``state`` (through ``_set_state``, checked against
:data:`~node_agent.child.state.ALLOWED`) and calls ``on_event``. ``stop()`` only sends it a
request. Every helper task (pipe readers, exit watcher, health poller) belongs to the owner and
is cancelled or awaited before it returns.

How a child is spawned, found ready and stopped, and what was measured with the pinned
binary: see the package docstring (:mod:`node_agent.child`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, BinaryIO, Final

import aiohttp

from node_agent.child import protocol
from node_agent.child.launched import Launched
from node_agent.child.logs import LogRing, failure_line
from node_agent.child.ports import CHILD_HOST, release_port, reserve_port
from node_agent.child.spawn import ChildConfig, Spawned, child_argv, spawn
from node_agent.child.state import (
    ALLOWED,
    NOT_LOADED,
    ChildEvent,
    ChildSnapshot,
    ChildState,
    EventKind,
)
from node_agent.child.streams import (
    LogPace,
    health_session,
    pipe_stream,
    read_lines,
    watch_health,
)
from node_agent.errors import ChildError
from node_agent.llama_server.binary import explain_exit

# The supervisor's whole public API, importable from here.
__all__ = [
    "EXIT_NOT_RUN",
    "ChildConfig",
    "ChildEvent",
    "ChildProcess",
    "ChildSnapshot",
    "ChildState",
    "EventKind",
]

log = logging.getLogger("corral.child")

HEALTH_FIRST_DELAY: Final = 0.005
HEALTH_MAX_DELAY: Final = 0.25
# After the child exits, how long its pipe readers may keep draining buffered output. Only a
# grandchild that inherited the pipes could hold them open longer.
READER_GRACE: Final = 1.0
# llama-server writes its log a line at a time, ~9 lines a request: read in one go what came
# within this many seconds, the pipe paused meanwhile (the loop woke and read once a line, 15
# reads a request; nothing waits for the log, and a child's exit ends the wait at once). Bench
# S1, Corral's CPU ÷ the router's: 1.60-1.61 as it was, 1.49-1.55 paused for 0.05 s, 1.36-1.40
# for 0.25 s (its requests come ~20 ms apart). A child writing more than a pipe holds (64 KB)
# within it waits at most this long, once: it is busy then, and not paused (streams.LogPace).
LOG_GATHER: Final = 0.25
BIND_FAILURE: Final = "couldn't bind"
EXIT_NUDGE_AFTER: Final = 0.5  # see _begin_stop
EXIT_NOT_RUN: Final = 127  # the exit code reported for a child that could not be executed
_OWN_PREFIX: Final = "corral: "  # lines the supervisor adds to the ring


# Messages to the owner. Those from one spawn carry its attempt number, so that late output of
# a process that lost its port cannot be mistaken for its successor's.
@dataclass(frozen=True)
class _Line:
    attempt: int
    text: str


@dataclass(frozen=True)
class _Health:
    attempt: int
    status: int


@dataclass(frozen=True)
class _Exited:
    attempt: int
    code: int


@dataclass(frozen=True)
class _Stop:
    now: bool = False  # SIGKILL at once, without the exit command


_Message = _Line | _Health | _Exited | _Stop


def _consume_exception(future: asyncio.Future[None]) -> None:
    # start() may have been cancelled: nobody else reads a failed start's exception.
    if not future.cancelled():
        future.exception()


class ChildProcess:
    """A supervised llama-server child (see the module docstring). Create it inside a loop."""

    def __init__(
        self,
        config: ChildConfig,
        on_event: Callable[[ChildEvent], None] | None = None,
        *,
        logs: LogRing | None = None,
    ) -> None:
        self.config = config
        self._on_event = on_event
        # A ring we made ends with this child (followers stop); a ring handed in outlives it.
        self._owns_logs = logs is None
        self.logs = logs if logs is not None else LogRing(config.log_lines)
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[None] = loop.create_future()
        self._ready.add_done_callback(_consume_exception)
        self._exited: asyncio.Future[int] = loop.create_future()
        self._inbox: asyncio.Queue[_Message] = asyncio.Queue()
        self._owner: asyncio.Task[None] | None = None

        self._state = ChildState.STARTING
        self._launched: Launched | None = None  # the latest spawn
        self._port: int | None = None
        self._exit_code: int | None = None
        self._progress: float | None = None
        self._meta: Mapping[str, Any] | None = None
        self._attempt = 0
        self._spawned_at: float | None = None
        self._ready_after: float | None = None
        # Per attempt, reset by _spawn.
        self._speaks_protocol = False
        self._ready_line = False
        self._healthy = False
        self._bind_failed = False
        self._poller: asyncio.Task[None] | None = None
        self._health: aiohttp.ClientSession | None = None
        self._stale_pollers: list[asyncio.Task[None]] = []
        self._returncode: int | None = None  # of the last spawn, once reaped
        # Set while handling messages.
        self._stop_requested = False
        self._killed = False
        self._kill_at: float | None = None
        self._nudge_at: float | None = None  # SIGTERM after an exit command that went unheard
        self._failure: str | None = None

    # -- read-only view -------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def state(self) -> ChildState:
        return self._state

    @property
    def pid(self) -> int | None:
        return None if self._launched is None else self._launched.pid

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def url(self) -> str | None:
        return None if self._port is None else f"http://{CHILD_HOST}:{self._port}"

    @property
    def exit_code(self) -> int | None:
        return self._exit_code

    @property
    def progress(self) -> float | None:
        return self._progress

    @property
    def meta(self) -> Mapping[str, Any] | None:
        """The ``ready`` line's payload (llama-server's model info), None before or without."""
        return self._meta

    def snapshot(self) -> ChildSnapshot:
        return ChildSnapshot(
            name=self.name,
            state=self._state,
            pid=self.pid,
            port=self._port,
            progress=self._progress,
            exit_code=self._exit_code,
            speaks_protocol=self._speaks_protocol,
            ready_after=self._ready_after,
            spawn_attempts=self._attempt,
            log_lines=self.logs.statistics().held,
        )

    # -- commands -------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the child and wait until it is ready.

        Raises ChildError (the child is gone by then) when it cannot be spawned, exits while
        loading, is stopped while loading, or is not ready within ``load_timeout``. Cancelling
        start() kills the child and waits for it to be reaped.
        """
        if self._owner is not None:
            raise ChildError(f"model {self.name}: a ChildProcess runs once; make a new one")
        self._owner = asyncio.create_task(self._own(), name=f"corral-child:{self.name}")
        self._owner.add_done_callback(self._owner_done)
        try:
            # Shielded: cancelling start() must not cancel the shared future the owner sets.
            await asyncio.shield(self._ready)
        except asyncio.CancelledError:
            self._inbox.put_nowait(_Stop())
            await asyncio.wait([self._owner])
            raise

    async def stop(self, *, now: bool = False) -> int | None:
        """Stop the child (see the module docstring) and return its exit code.

        ``now``: SIGKILL at once. For requests in flight whose drain is over: llama-server
        finishes every generation before it obeys the exit command, so asking would keep them
        (and the stop) going for up to ``stop_timeout`` more.

        Idempotent and safe in any state; None when it never ran. Cancelling stop() does not
        cancel the stop.
        """
        if self._owner is None:
            return None
        if not self._owner.done():
            self._inbox.put_nowait(_Stop(now))
        return await self.wait_exited()

    def kill(self) -> None:
        """SIGKILL the child's process group now, without waiting (a forced shutdown); the
        owner still reaps it and settles every waiter."""
        if self._launched is None or self._exited.done():
            return
        self._killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self._launched.kill_group(signal.SIGKILL)  # (not once it has been reaped)

    async def wait_exited(self) -> int:
        """Wait until the child has exited and been reaped; its exit code.

        :data:`EXIT_NOT_RUN` (127, the shell's "cannot run") when it could not be executed.
        """
        if self._owner is None:
            raise ChildError(f"model {self.name}: not started")
        code = await asyncio.shield(self._exited)
        # The owner sets the result in its last steps; let it finish so no task outlives us.
        await asyncio.wait([self._owner])
        return code

    # -- the owner ------------------------------------------------------------------------

    def _owner_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("model=%s: child supervisor crashed", self.name, exc_info=task.exception())

    async def _own(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.load_timeout
        try:
            while True:
                spawned = await self._spawn()
                await self._supervise(spawned, deadline)
                if not self._should_respawn():
                    break
                log.warning(
                    "model=%s port=%s: port taken before the child bound it; retrying",
                    self.name,
                    self._port,
                )
        except asyncio.CancelledError:
            self._failure = self._failure or "its supervisor was cancelled"
            self._finish(self._returncode)
            raise
        except ChildError as exc:  # could not spawn
            self._failure = str(exc)
        except Exception as exc:  # a bug here must not leave start()/stop() waiting forever
            log.exception("model=%s: child supervisor failed", self.name)
            self._failure = f"supervisor error: {exc!r}"
        self._finish(self._returncode)

    def _should_respawn(self) -> bool:
        # Stop requests still queued count: do not spawn again just to kill it.
        while not self._inbox.empty():
            if isinstance(self._inbox.get_nowait(), _Stop):
                self._stop_requested = True
        return (
            self._bind_failed
            and self._state is ChildState.STARTING
            and not self._stop_requested
            and self._failure is None  # e.g. the load timeout passed
            and self._attempt < self.config.port_attempts
        )

    async def _spawn(self) -> Spawned:
        release_port(self._port)
        self._attempt += 1
        port = reserve_port()
        try:
            spawned = spawn(self.config, port)
        except ChildError:
            release_port(port)
            raise
        proc = spawned.process
        self._launched, self._port = proc, port
        self._spawned_at = asyncio.get_running_loop().time()
        self._speaks_protocol = self._ready_line = self._healthy = self._bind_failed = False
        self._killed = False
        argv = shlex.join(child_argv(self.config, port))
        self.logs.append(f"{_OWN_PREFIX}spawned pid {proc.pid}: {argv}")
        log.info("model=%s pid=%d port=%d: spawned", self.name, proc.pid, port)
        self._emit(EventKind.SPAWNED)
        return spawned

    async def _supervise(self, spawned: Spawned, deadline: float) -> None:
        """Handle messages until this spawn has exited; then reap it and drain its pipes."""
        attempt = self._attempt
        proc = spawned.process
        exited = asyncio.Event()
        helpers = [
            asyncio.create_task(self._pump_stdout(attempt, proc.stdout)),
            asyncio.create_task(self._pump_stderr(spawned.stderr, exited)),
            asyncio.create_task(self._watch_exit(attempt, proc, exited)),
        ]
        self._restart_poller(HEALTH_FIRST_DELAY)
        try:
            while True:
                wake_at = self._next_deadline(deadline)
                try:
                    async with asyncio.timeout_at(wake_at):
                        message = await self._inbox.get()
                except TimeoutError:
                    self._on_deadline(proc, deadline)
                    continue
                if isinstance(message, _Stop):
                    self._begin_stop(proc, at_once=message.now)
                elif message.attempt != attempt:
                    continue  # left over from a spawn that lost its port
                elif isinstance(message, _Exited):
                    return
                elif isinstance(message, _Line):
                    self._on_stdout(message.text)
                else:
                    self._on_health(message.status)
        finally:
            # Also reached on cancellation or a bug: never leave a child unsupervised.
            self._kill(proc)
            await self._cancel_poller()
            self._returncode = await proc.wait()
            _, late = await asyncio.wait(helpers, timeout=READER_GRACE)
            for task in late:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    def _next_deadline(self, load_deadline: float) -> float | None:
        if self._killed:
            return None
        if self._state in NOT_LOADED:
            return load_deadline
        if self._state is ChildState.STOPPING:
            pending = [t for t in (self._nudge_at, self._kill_at) if t is not None]
            return min(pending, default=None)
        return None

    def _on_deadline(self, proc: Launched, load_deadline: float) -> None:
        now = asyncio.get_running_loop().time()
        if self._state in NOT_LOADED and now >= load_deadline:
            self._failure = f"not ready within load_timeout={self.config.load_timeout:g}s; killed"
            log.warning("model=%s pid=%s: %s", self.name, self.pid, self._failure)
            self._kill(proc)
        elif self._state is not ChildState.STOPPING:
            return
        elif self._nudge_at is not None and now >= self._nudge_at:
            self._nudge_at = None
            log.info("model=%s pid=%s: exit command unheard; SIGTERM", self.name, self.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        elif self._kill_at is not None and now >= self._kill_at:
            log.warning(
                "model=%s pid=%s: did not exit within stop_timeout=%gs; SIGKILL",
                self.name,
                self.pid,
                self.config.stop_timeout,
            )
            self._kill(proc)

    # -- message handlers (owner only) ------------------------------------------------------

    def _on_stdout(self, text: str) -> None:
        try:
            line = protocol.parse_state_line(text)
        except protocol.ProtocolError as exc:
            log.warning("model=%s pid=%s: %s", self.name, self.pid, exc)
            self.logs.append(text)
            return
        if line is None:  # a binary without the protocol may log to stdout
            self.logs.append(text)
            return
        if not self._speaks_protocol and line.state == protocol.LOADING:
            # It will say when it is ready: asking /health meanwhile only costs both sides
            # CPU (30+ probes per load on a busy machine, bench S4); the ready line restarts
            # the poller for its one confirming probe.
            self._pause_poller()
        self._speaks_protocol = True
        if line.state == protocol.LOADING:
            self._progress = line.progress if line.progress is not None else self._progress
            if self._state in NOT_LOADED:
                self._set_state(ChildState.LOADING)
            # Every progress line is an event (llama.cpp's router sends each one on SSE).
            detail = line.payload if isinstance(line.payload, Mapping) else None
            self._emit(EventKind.LOADING, loading=detail)
        elif line.state == protocol.READY:
            if isinstance(line.payload, Mapping):
                self._meta = line.payload
            self._ready_line = True
            if self._state in NOT_LOADED:
                if self._healthy:
                    self._become_ready()
                else:
                    self._restart_poller(HEALTH_FIRST_DELAY)  # confirm without waiting a backoff
            elif self._state is ChildState.SLEEPING:
                self._set_state(ChildState.READY)
                self._emit(EventKind.WOKE)
        elif line.state == protocol.SLEEPING:
            if self._state is ChildState.READY:
                self._set_state(ChildState.SLEEPING)
                self._emit(EventKind.SLEEPING)
        else:
            log.debug("model=%s: ignoring child state %r", self.name, line.state)

    def _on_health(self, status: int) -> None:
        if status == 200:
            self._healthy = True
            # A binary without the protocol has nothing else to say; one with it must also
            # have sent `ready` (its payload is the model's info).
            if self._state in NOT_LOADED and (self._ready_line or not self._speaks_protocol):
                self._progress = 1.0
                self._become_ready()
        elif status == 503 and self._state is ChildState.STARTING:
            self._set_state(ChildState.LOADING)  # llama-server answers 503 while loading
            self._emit(EventKind.LOADING)

    def _become_ready(self) -> None:
        self._set_state(ChildState.READY)
        if self._spawned_at is not None:
            self._ready_after = asyncio.get_running_loop().time() - self._spawned_at
        log.info(
            "model=%s pid=%s port=%s: ready after %.3fs",
            self.name,
            self.pid,
            self._port,
            self._ready_after or 0.0,
        )
        if not self._ready.done():
            self._ready.set_result(None)
        self._emit(EventKind.READY)

    def _begin_stop(self, proc: Launched, *, at_once: bool = False) -> None:
        if self._state is ChildState.STOPPING and at_once:
            self._kill(proc)
        if self._state in (ChildState.STOPPING, ChildState.EXITED):
            return
        self._stop_requested = True
        loaded = self._state not in NOT_LOADED
        self._set_state(ChildState.STOPPING)
        self._emit(EventKind.STOPPING)
        if not loaded:
            self._failure = "stopped while loading"
            self._kill(proc)
            return
        if at_once:
            log.info("model=%s pid=%s: its drain is over: SIGKILL", self.name, self.pid)
            self._kill(proc)
            return
        now = asyncio.get_running_loop().time()
        self._kill_at = now + self.config.stop_timeout
        if self._speaks_protocol and proc.write_stdin(protocol.EXIT_COMMAND):
            # llama.cpp race (seen 2 in ~35 stops right after ready): the stdin thread starts
            # before the main loop does, and a terminate() that lands in between is lost; the
            # child then runs on. One SIGTERM later terminates it: the exit command does not
            # arm llama.cpp's "second signal = exit(1) now", so requests in flight are spared.
            self._nudge_at = now + EXIT_NUDGE_AFTER
        else:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def _kill(self, proc: Launched) -> None:
        already, self._killed = self._killed, True  # no deadline applies any more
        if already or proc.returncode is not None:
            return
        try:
            # Its own process group, which takes any helper it spawned along.
            proc.kill_group(signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            proc.send_signal(signal.SIGKILL)

    def _set_state(self, new: ChildState) -> None:
        old = self._state
        if new is old:
            return
        if new not in ALLOWED[old]:
            raise ChildError(f"model {self.name}: illegal state change {old.value} -> {new.value}")
        self._state = new
        log.info(
            "model=%s pid=%s port=%s: %s -> %s",
            self.name,
            self.pid,
            self._port,
            old.value,
            new.value,
        )

    def _emit(self, kind: EventKind, **extra: Any) -> None:
        if self._on_event is None:
            return
        event = ChildEvent(
            name=self.name,
            kind=kind,
            state=self._state,
            pid=self.pid,
            port=self._port,
            progress=self._progress,
            meta=self._meta,
            exit_code=self._exit_code,
            **extra,
        )
        try:
            self._on_event(event)
        except Exception:  # a listener's bug must not kill the supervisor
            log.exception("model=%s: on_event callback failed for %s", self.name, kind.value)

    def _finish(self, code: int | None) -> None:
        """The child is reaped (or never ran): settle every waiter, once."""
        if self._exited.done():
            return
        if code is None:
            code = EXIT_NOT_RUN
        self._exit_code = code
        self._killed = True
        release_port(self._port)
        expected = self._stop_requested
        failed_start = not self._ready.done()
        reason: str | None = None
        if failed_start or not expected:
            reason = self._reason(code, loading=failed_start)
        self._set_state(ChildState.EXITED)
        self.logs.append(f"{_OWN_PREFIX}exited with code {code}")
        if failed_start:
            assert reason is not None
            self._ready.set_exception(ChildError(reason))
        elif not expected:
            log.warning("model=%s pid=%s: %s", self.name, self.pid, reason)
        self._emit(EventKind.EXITED, expected=expected, reason=reason)
        self._exited.set_result(code)
        if self._owns_logs:
            self.logs.close()

    def _reason(self, code: int | None, *, loading: bool) -> str:
        if self._failure is not None:
            what = self._failure
        elif loading:
            what = f"exited with code {code} while loading"
        else:
            what = f"exited unexpectedly with code {code}"
        parts = [f"model {self.name}: {what}"]
        hint = explain_exit(code) if code is not None else None
        if hint is not None:
            parts.append(hint)
        last = failure_line(self.logs.tail(50), skip_prefix=_OWN_PREFIX)
        if last is not None:
            parts.append(f"last log line: {last}")
        return "; ".join(parts)

    # -- helper tasks (owned by _supervise) ----------------------------------------------------

    async def _pump_stdout(self, attempt: int, pipe: IO[bytes]) -> None:
        async with pipe_stream(pipe) as (stream, _):
            async for text in read_lines(stream):
                self._inbox.put_nowait(_Line(attempt, text))

    async def _pump_stderr(self, pipe: BinaryIO, exited: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        pace = LogPace(LOG_GATHER)
        async with pipe_stream(pipe) as (stream, transport):

            async def gather(size: int) -> None:
                # Until the child has exited: then what is left is read at once (a stop waits
                # for this reader, and a churn of loads waited 50 ms a swap for it: bench S4).
                if exited.is_set() or not pace.gathers_after(size, loop.time()):
                    return
                transport.pause_reading()
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(exited.wait(), LOG_GATHER)
                finally:
                    transport.resume_reading()

            async for text in read_lines(stream, gather):
                if BIND_FAILURE in text:
                    self._bind_failed = True
                self.logs.append(text)

    async def _watch_exit(self, attempt: int, proc: Launched, exited: asyncio.Event) -> None:
        code = await proc.wait()
        exited.set()
        self._inbox.put_nowait(_Exited(attempt, code))

    def _pause_poller(self) -> None:
        if self._poller is not None:
            self._poller.cancel()  # awaited by _cancel_poller at the end of the spawn
            self._stale_pollers.append(self._poller)
            self._poller = None

    def _restart_poller(self, first_delay: float) -> None:
        self._pause_poller()
        assert self._port is not None
        attempt = self._attempt
        self._poller = asyncio.create_task(
            watch_health(
                self._health_session(),
                CHILD_HOST,
                self._port,
                lambda status: self._inbox.put_nowait(_Health(attempt, status)),
                first_delay=first_delay,
                max_delay=HEALTH_MAX_DELAY,
            )
        )

    def _health_session(self) -> aiohttp.ClientSession:
        # One per child, not one per poll: a session costs more to build than a probe
        # (bench S4: 14% of the agent's busy time went to sessions made for two probes).
        if self._health is None:
            self._health = health_session()
        return self._health

    async def _cancel_poller(self) -> None:
        pollers = [*self._stale_pollers, *([self._poller] if self._poller else [])]
        self._poller, self._stale_pollers = None, []
        for task in pollers:
            task.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)
        if self._health is not None:
            session, self._health = self._health, None
            await session.close()
