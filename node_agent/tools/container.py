"""The container of ``--tools-runtime docker:<image>`` (or ``podman:<image>``).

llama.cpp's ``server_tools_container_runtime``: ``<engine> run --rm -i --cidfile F <image> sh``
is started once, its stdin kept open (the shell waits on it, so the container lives), and every
tool call runs in it as ``<engine>-container:<id>``. One that died is started again at the next
call. At the agent's exit its stdin is closed: the shell ends and ``--rm`` removes the
container (also when the agent is killed, since the pipe closes with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile

from node_agent.tools.names import ContainerSpec

log = logging.getLogger("corral.tools")

CID_POLLS = 100  # llama.cpp waits 100 x 100 ms for the container's id
CID_POLL_SECONDS = 0.1
STOP_SECONDS = 10.0  # then the client is killed (the container's shell has had its EOF)


class RuntimeStartError(RuntimeError):
    """The container could not be started; the message is llama.cpp's."""


class ContainerRuntime:
    def __init__(self, spec: ContainerSpec) -> None:
        self.engine, self.image = spec.engine, spec.arg
        self._proc: asyncio.subprocess.Process | None = None
        self._id = ""
        self._lock = asyncio.Lock()
        self._respawn: asyncio.Task[None] | None = None

    async def start(self) -> None:
        async with self._lock:
            await self._spawn()

    async def spec(self) -> str:
        """The runtime a call uses: a container that runs (started again if it died)."""
        async with self._lock:
            if self._respawn is None and (self._proc is None or self._proc.returncode is not None):
                log.warning(
                    '%s tools runtime container "%s" died, respawning', self.engine, self._id
                )
                self._id = ""  # never the dead one's, whatever becomes of the respawn
                self._respawn = asyncio.ensure_future(self._spawn())
            if self._respawn is not None:
                # Shielded: a client that goes away (aiohttp cancels its handler) must not
                # leave a `run` half started; the next call waits for the same respawn.
                try:
                    await asyncio.shield(self._respawn)
                finally:
                    if self._respawn.done():
                        self._respawn = None
            return f"{self.engine}-container:{self._id}"

    async def _spawn(self) -> None:
        await self._end()
        # In a folder of our own (0700): in the shared temp folder another user could put an
        # id there first, and the tools would run in their container.
        folder = tempfile.mkdtemp(prefix="corral-tools-runtime-")
        cidfile = os.path.join(folder, "cid")
        args = [self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh"]
        try:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL
                )
            except OSError as exc:
                raise RuntimeStartError(
                    f"failed to spawn {self.engine} container for tools runtime (image: "
                    f"{self.image}): {exc.strerror}"
                ) from None
            cid = ""
            for _ in range(CID_POLLS):
                cid = _first_line(cidfile)
                if cid or self._proc.returncode is not None:
                    break
                await asyncio.sleep(CID_POLL_SECONDS)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if not cid:
            code = self._proc.returncode
            await self._end(kill=True)
            if code is not None:  # its own words are on the agent's stderr, just above
                raise RuntimeStartError(
                    f"{self.engine} run ended with exit code {code} before the container "
                    f"started (image: {self.image})"
                )
            raise RuntimeStartError(
                f"timed out waiting for {self.engine} container to start (image: {self.image})"
            )
        self._id = cid
        log.info("tools runtime: %s container %s (image %s)", self.engine, cid, self.image)

    async def _end(self, kill: bool = False) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # EOF for the container's shell: it exits, --rm removes it
        try:
            await asyncio.wait_for(proc.wait(), STOP_SECONDS)
        except TimeoutError:
            log.warning("%s run did not end on its stdin's close: killing it", self.engine)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def close(self) -> None:
        async with self._lock:
            if self._respawn is not None:
                self._respawn.cancel()
                await asyncio.gather(self._respawn, return_exceptions=True)
                self._respawn = None
            await self._end()


def _first_line(path: str) -> str:
    """The container id the engine wrote, or "" while there is none yet."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return ""
