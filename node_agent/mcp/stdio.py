"""One MCP server process: newline-delimited JSON-RPC 2.0 over its stdin and stdout.

The session speaks the client side of MCP as llama.cpp does (``server_mcp_transport``):
``initialize`` once (protocol 2024-11-05) and ``notifications/initialized``, then
``tools/list`` and ``tools/call``; replies are matched by id, notifications and stale replies
are skipped. Its stderr is drained (an undrained pipe blocks the server) into the debug log
and a bounded tail that says why it died, in lines of at most 4 KiB (a longer one is cut, and
reading goes on). It dies with the agent (``PR_SET_PDEATHSIG``) and runs in its own process
group, so closing it ends whatever it started too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

from node_agent.aio import TaskSet
from node_agent.child.pdeathsig import make_preexec
from node_agent.mcp.config import McpServerConfig

log = logging.getLogger("corral.mcp")

PROTOCOL_VERSION = "2024-11-05"
MAX_LINE_BYTES = 8 * 1024 * 1024  # llama.cpp drops longer NDJSON lines
ERR_TAIL_CHARS = 4096
STDERR_LINE_BYTES = 4096  # of one stderr line, for the debug log and the tail
STDERR_READ_BYTES = 64 * 1024
CLOSE_GRACE_SECONDS = 1.0  # after SIGTERM, before SIGKILL


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A tool an MCP server advertises."""

    server: str
    name: str
    description: str
    input_schema: Any


class StdioSession:
    """A running MCP server and the JSON-RPC session with it."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks = TaskSet(f"mcp:{config.name}")
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 1
        self._lock = asyncio.Lock()  # one call at a time per server, as llama.cpp does
        self._initialized = False
        self._tools: list[ToolDef] | None = None
        self._running = False
        self.last_error = ""
        self._err_tail = ""

    @property
    def alive(self) -> bool:
        return self._running

    def diagnostics(self) -> str:
        parts = [self.last_error] if self.last_error else []
        if self._err_tail:
            parts.append("last stderr: " + self._err_tail)
        return "; ".join(parts)

    async def start(self) -> bool:
        """Spawn the server; False (with :meth:`diagnostics`) when it cannot be started."""
        config = self.config
        env = {**os.environ, **dict(config.env)} if config.env else None
        try:
            self._proc = await asyncio.create_subprocess_exec(
                config.command,
                *config.args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=config.cwd,
                limit=MAX_LINE_BYTES,
                start_new_session=True,
                preexec_fn=make_preexec(),
            )
        except OSError as exc:
            self.last_error = f"failed to spawn '{config.command}': {exc.strerror or exc}"
            return False
        self._running = True
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._tasks.spawn(self._read_replies(self._proc.stdout), "stdout")
        self._tasks.spawn(self._drain_stderr(self._proc.stderr), "stderr")
        log.debug("MCP '%s' started (pid %d)", config.name, self._proc.pid)
        return True

    async def list_tools(self, within: float) -> list[ToolDef]:
        """The server's tools (asked once per process); [] when it does not answer in time."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + within
            if not await self._ensure_init(deadline):
                return []
            if self._tools is not None:
                return self._tools
            reply = await self._rpc("tools/list", None, deadline)
            if "result" not in reply:
                self.last_error = "tools/list failed: " + _error_message(reply)
                return []
            result = reply["result"]
            listed = result.get("tools") if isinstance(result, dict) else None
            self._tools = [
                ToolDef(
                    server=self.config.name,
                    name=str(t.get("name", "")),
                    description=str(t.get("description", "")),
                    input_schema=t.get("inputSchema"),
                )
                for t in (listed if isinstance(listed, list) else [])
                if isinstance(t, dict)
            ]
            return self._tools

    async def call_tool(self, name: str, arguments: Any) -> dict[str, Any]:
        """Run one tool: ``{"plain_text_response": text}`` or ``{"error": message}`` (the
        ``/tools`` contract, llama.cpp's ``mcp_result_to_response``)."""
        async with self._lock:
            deadline = asyncio.get_running_loop().time() + self.config.timeout_ms / 1000
            if not await self._ensure_init(deadline):
                return {"error": self.last_error}
            params = {"name": name, "arguments": arguments}
            reply = await self._rpc("tools/call", params, deadline)
        if "error" in reply:
            return {"error": _error_message(reply)}
        if "result" in reply:
            return _tool_response(reply["result"])
        return {"error": "invalid response from MCP server"}

    async def close(self, why: str = "transport closed") -> None:
        """End the server and its process group; a call still waiting answers ``why``.
        Idempotent."""
        self._running = False
        self._fail_pending(why)
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), CLOSE_GRACE_SECONDS)
            except TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        await self._tasks.close()

    # -- the JSON-RPC session ------------------------------------------------------------

    async def _ensure_init(self, deadline: float) -> bool:
        if self._initialized:
            return True
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "llama.cpp", "version": "1.0"},
        }
        reply = await self._rpc("initialize", params, deadline)
        if "result" not in reply:
            self.last_error = "initialize failed: " + _error_message(reply)
            return False
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self._initialized = True
        return True

    async def _rpc(self, method: str, params: Any, deadline: float) -> dict[str, Any]:
        """The reply to one request, or an ``{"error": …}`` of llama.cpp's own making."""
        rid = self._next_id
        self._next_id += 1
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            request["params"] = params
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = reply
        try:
            if not self._running or not await self._send(request):
                return _rpc_error("transport closed")
            timeout = max(0.0, deadline - asyncio.get_running_loop().time())
            return await asyncio.wait_for(reply, timeout)
        except TimeoutError:
            return _rpc_error("request timed out")
        finally:
            self._pending.pop(rid, None)

    async def _send(self, message: dict[str, Any]) -> bool:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        try:
            proc.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError):  # the server closed its stdin or exited
            self._running = False
            return False
        return True

    async def _read_replies(self, stdout: asyncio.StreamReader) -> None:
        try:
            while True:
                try:
                    line = await stdout.readline()
                except ValueError:  # longer than MAX_LINE_BYTES: skip it
                    log.warning("MCP '%s': dropping an oversized line", self.config.name)
                    continue
                if not line:
                    break
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # llama.cpp skips a malformed frame
                rid = message.get("id") if isinstance(message, dict) else None
                waiter = self._pending.get(rid) if isinstance(rid, int) else None
                if waiter is not None and not waiter.done():
                    waiter.set_result(message)
        finally:
            # stdout's EOF: the server is gone (or closed it); every caller hears it now.
            self._running = False
            self._fail_pending("transport closed")

    async def _drain_stderr(self, stderr: asyncio.StreamReader) -> None:
        # In chunks, never ``readline()``: a line over the reader's limit raised there and
        # ended this reader, and the server then blocked on its next write (issue 26, row 11).
        # A long line keeps its first STDERR_LINE_BYTES, the rest is counted and dropped.
        line = bytearray()
        cut = 0
        while chunk := await stderr.read(STDERR_READ_BYTES):
            start = 0
            while start < len(chunk):
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                room = STDERR_LINE_BYTES - len(line)
                line += piece[:room]
                cut += max(len(piece) - room, 0)
                if end < 0:
                    break
                self._stderr_line(bytes(line), cut)
                line.clear()
                cut = 0
                start = end + 1
        if line or cut:
            self._stderr_line(bytes(line), cut)

    def _stderr_line(self, line: bytes, cut: int) -> None:
        text = line.decode(errors="replace")
        if cut:
            text += f" [{cut} more bytes cut]"
        log.debug("MCP '%s' stderr: %s", self.config.name, text)
        self._err_tail = (self._err_tail + text + "\n")[-ERR_TAIL_CHARS:]

    def _fail_pending(self, why: str) -> None:
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_result(_rpc_error(why))


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _rpc_error(message: str) -> dict[str, Any]:
    return {"error": {"code": -32603, "message": message}}


def _error_message(reply: dict[str, Any]) -> str:
    error = reply.get("error")
    if isinstance(error, dict):
        return str(error.get("message", "unknown error"))
    if isinstance(error, str):
        return error
    return "unknown error"


def _tool_response(result: Any) -> dict[str, Any]:
    """The text parts of ``result.content`` joined by newlines; ``isError`` becomes an error."""
    texts = []
    content = result.get("content") if isinstance(result, dict) else None
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict) and part.get("type") == "text":
            texts.append(str(part.get("text", "")))
    text = "\n".join(texts)
    if isinstance(result, dict) and result.get("isError") is True:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}
