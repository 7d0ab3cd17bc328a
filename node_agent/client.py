"""``corral models|load|unload|status``: a command-line client of a running agent.

Standard library only (urllib), so the commands start fast and need nothing of the server's
stack. Exit codes: 0 done (loading a loaded model, or unloading an unloaded one, is done
already), 1 the agent refused, has no such model, or the load failed, 2 bad usage, 3 the agent
could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from node_agent import client_format as fmt
from node_agent.client_transport import BadUrl, agent_url, opener_for
from node_agent.models_schema import ModelEntry, dump, parse_entries

DEFAULT_URL = "http://127.0.0.1:8080"
EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3
# While following a load the client also polls GET /models this often: the events stream
# says how far a load got, the poll makes sure an outcome is never missed (an event sent
# before the stream was open, or a stream that broke).
POLL_SECONDS = 0.5


class AgentError(Exception):
    """The agent answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Unreachable(Exception):
    """No agent answered at the URL."""


class UnknownModel(Exception):
    """The agent has no model by the name (or alias) the user gave."""


class AgentClient:
    """A blocking client of the agent's HTTP API."""

    def __init__(self, url: str, api_key: str | None, timeout: float = 60) -> None:
        self.url = url.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout
        self._base, self._opener = opener_for(self.url)

    def _request(self, method: str, path: str, body: Any = None) -> urllib.request.Request:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self._base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self._api_key:
            request.add_header("Authorization", f"Bearer {self._api_key}")
        return request

    def _open(self, request: urllib.request.Request, timeout: float | None) -> Any:
        try:
            return self._opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise AgentError(err.code, _error_message(err.code, err.read())) from err
        except (TimeoutError, urllib.error.URLError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise Unreachable(f"cannot reach the agent at {self.url}: {reason}") from err

    def call(self, method: str, path: str, body: Any = None) -> Any:
        with self._open(self._request(method, path, body), self._timeout) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def models(self) -> list[ModelEntry]:
        """``GET /models``, parsed with the schema the agent builds it from."""
        body = self.call("GET", "/models")
        try:
            entries, skipped = parse_entries(body)
        except ValueError as err:
            message = f"GET /models answered something else than a model list: {err}"
            raise AgentError(200, message) from err
        for why in skipped:
            print(f"corral: skipped a model the client cannot read: {why}", file=sys.stderr)
        return list(entries.values())

    def ledger(self) -> dict[str, Any] | None:
        try:
            ledger: dict[str, Any] = self.call("GET", "/ledger")
        except AgentError as err:
            if err.status == 404:
                return None  # the ledger is off
            raise
        return ledger

    def lines(self, path: str) -> Iterator[bytes]:
        """``GET path``'s body line by line, as it comes (no read timeout: a long wait)."""
        with self._open(self._request("GET", path), None) as response:
            yield from response

    def events(self) -> Iterator[dict[str, Any]]:
        """``GET /models/sse`` messages, as they come (no read timeout: it is a long wait)."""
        for raw in self.lines("/models/sse"):
            line = raw.decode(errors="replace").strip()
            if line.startswith("data:"):
                yield json.loads(line[5:])


def _error_message(status: int, payload: bytes) -> str:
    try:
        error = json.loads(payload)["error"]
        return str(error["message"])
    except (ValueError, KeyError, TypeError):
        text = payload.decode(errors="replace").strip()
        return text or f"HTTP {status}"


def find_model(models: list[ModelEntry], name: str) -> ModelEntry | None:
    for m in models:
        if m.id == name or name in m.aliases:
            return m
    return None


def require_model(models: list[ModelEntry], name: str) -> ModelEntry:
    """The model named (or aliased) ``name``; UnknownModel, listing the known names, if none.

    The client looks the name up itself rather than relaying the agent's answer: llama.cpp's
    router words "not found" differently for load (404) and unload (400), and lists nothing.
    """
    model = find_model(models, name)
    if model is None:
        raise UnknownModel(fmt.unknown_model(name, [m.id for m in models]))
    return model


def model_state(client: AgentClient, name: str) -> str | None:
    """``name``'s state now (``loaded``, ``unloaded``…), None if the agent forgot it."""
    model = find_model(client.models(), name)
    return model.status.value if model is not None else None


class EventFeed:
    """The events stream read by a daemon thread, handed over through a queue."""

    def __init__(self, client: AgentClient) -> None:
        self.queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._client = client
        self.connected = threading.Event()
        thread = threading.Thread(target=self._run, name="corral-events", daemon=True)
        thread.start()

    def _run(self) -> None:
        try:
            for message in self._client.events():
                self.connected.set()
                self.queue.put(message)
        except (AgentError, Unreachable, OSError, ValueError):
            pass  # the poll still sees the outcome
        finally:
            self.connected.set()

    def next(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None


class Progress:
    """One line redrawn in place on a terminal; plain lines, only on change, otherwise;
    nothing at all under ``--json`` (stdout then holds one JSON document)."""

    def __init__(
        self, out: TextIO, name: str, *, quiet: bool = False, verb: str = "loading"
    ) -> None:
        self._out = out
        self._tty = out.isatty()
        self._name = name
        self._quiet = quiet
        self._verb = verb
        self._last: str | None = None

    def show(self, value: float | None, detail: str = "") -> None:
        """The bar at ``value`` (0-1; None: not known yet), ``detail`` after it (a download's
        bytes, speed and time left)."""
        if self._quiet:
            return
        tail = f" {detail}" if detail else ""
        if self._tty:
            line = fmt.progress_line(self._name, value, verb=self._verb) + tail
            self._out.write("\r" + line + "\x1b[K")  # what a longer line left goes too
            self._out.flush()
            return
        # A log or pipe gets a line per tenth, not a line per report.
        shown = None if value is None else round(value, 1)
        text = fmt.progress_line(self._name, shown, 10, verb=self._verb)
        if text != self._last:
            print(text + tail, file=self._out, flush=True)
            self._last = text

    def clear(self) -> None:
        if self._tty and not self._quiet:
            self._out.write("\r\x1b[K")
            self._out.flush()


class Outcome:
    """How a load or unload ended, said as a line of text or (``--json``) one JSON object:
    ``{"model", "status", "changed"}``, plus ``seconds`` when the client waited for it and
    ``error`` when it failed."""

    def __init__(self, out: TextIO, name: str, *, as_json: bool, verb: str = "loading") -> None:
        self._out = out
        self._name = name
        self._json = as_json
        self.progress = Progress(out, name, quiet=as_json, verb=verb)
        self._what = "download" if verb == "downloading" else "load"

    def _say(self, text: str, **fields: Any) -> None:
        self.progress.clear()
        body = json.dumps({"model": self._name, **fields}) if self._json else text
        print(body, file=self._out, flush=True)

    def done(self, status: str, seconds: float) -> int:
        text = f"{self._name} {status} in {seconds:.1f} s"
        self._say(text, status=status, changed=True, seconds=round(seconds, 3))
        return 0

    def already(self, status: str) -> int:
        self._say(f"{self._name} is already {status}", status=status, changed=False)
        return 0

    def requested(self, status: str) -> int:
        """``--no-wait``: the agent took the request; ``status`` is loading or unloading."""
        self._say(f"{status} {self._name}", status=status, changed=True)
        return 0

    def failed(self, why: str) -> int:
        text = f"{self._name} failed to {self._what}: {why}"
        self._say(text, status="failed", changed=False, error=why)
        return EXIT_REFUSED


def wait_loaded(client: AgentClient, feed: EventFeed, name: str, outcome: Outcome) -> int:
    """Follow ``name``'s load until it is loaded (0) or failed (1)."""
    progress = outcome.progress
    progress.show(None)
    started = time.monotonic()
    next_poll = started
    while True:
        message = feed.next(timeout=POLL_SECONDS / 2)
        data = (message or {}).get("data") or {}
        if message is not None and message.get("model") == name:
            status = data.get("status")
            if status == "loading" and isinstance(data.get("progress"), dict):
                progress.show(float(data["progress"].get("value", 0.0)))
            elif status in ("loaded", "sleeping"):
                return outcome.done("loaded", time.monotonic() - started)
            elif status == "unloaded":
                break
        if time.monotonic() >= next_poll:
            next_poll = time.monotonic() + POLL_SECONDS
            state = model_state(client, name)
            if state in ("loaded", "sleeping"):
                return outcome.done("loaded", time.monotonic() - started)
            if state == "unloaded":
                break
    model = find_model(client.models(), name)
    error = model.corral.error if model is not None and model.corral else None
    exit_code = model.status.exit_code if model is not None else None
    why = error or (f"exit code {exit_code}" if exit_code is not None else "it was stopped")
    return outcome.failed(why)


def cmd_models(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    models = client.models()
    if args.json:
        print(json.dumps([dump(m) for m in models], indent=2), file=out)
    else:
        print(fmt.models_table(models, process_memory(client, models)), file=out)
    return 0


def process_memory(client: AgentClient, models: Sequence[ModelEntry]) -> dict[str, int]:
    """The running models' own memory (GET /api/ps, counted as the ledger counts a running
    child), asked only where the ledger is off (it counts none of them)."""
    running = [m for m in models if m.status.value != "unloaded"]
    if not running or any(fmt.ledger_held(m) for m in running):
        return {}
    try:
        body = client.call("GET", "/api/ps")
    except (AgentError, ValueError):
        # A column of the table, not worth the listing: an agent without Ollama's API
        # (llama.cpp's router), a proxy that passes only some routes, or an /api/ps that failed.
        return {}
    listed = body.get("models", []) if isinstance(body, dict) else []
    return {
        str(m.get("name")): memory
        for m in listed
        if isinstance(m, dict) and isinstance(memory := (m.get("corral") or {}).get("memory"), int)
    }


def cmd_status(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    props = client.call("GET", "/props")
    models = client.models()
    ledger = client.ledger()
    if args.json:
        body = {
            "url": client.url,
            "props": props,
            "models": [dump(m) for m in models],
            "ledger": ledger,
        }
        print(json.dumps(body, indent=2), file=out)
    else:
        process = process_memory(client, models)
        print(fmt.status_text(client.url, props, models, ledger, process), file=out)
    return 0


def cmd_load(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    name = require_model(client.models(), args.name).id
    outcome = Outcome(out, name, as_json=args.json)
    feed = EventFeed(client) if not args.no_wait else None
    if feed is not None:
        feed.connected.wait(timeout=0.2)  # the stream usually opens at once; never block on it
    try:
        client.call("POST", "/models/load", {"model": name})
    except AgentError as err:
        # 400 "model is already running" (llama.cpp's words) covers loading and sleeping too.
        state = model_state(client, name)
        if err.status != 400 or state not in ("loaded", "loading", "sleeping"):
            raise
        if state != "loading" or feed is None:
            return outcome.already(state)
    if feed is None:
        return outcome.requested("loading")
    return wait_loaded(client, feed, name, outcome)


def cmd_unload(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    name = require_model(client.models(), args.name).id
    outcome = Outcome(out, name, as_json=args.json)
    try:
        client.call("POST", "/models/unload", {"model": name})
    except AgentError as err:
        # 400 "model is not running": unloading an unloaded model is done already, as loading
        # a loaded one is.
        if err.status != 400 or model_state(client, name) != "unloaded":
            raise
        return outcome.already("unloaded")
    if args.no_wait:
        return outcome.requested("unloading")
    started = time.monotonic()
    while model_state(client, name) not in (None, "unloaded"):
        time.sleep(POLL_SECONDS / 5)
    return outcome.done("unloaded", time.monotonic() - started)


COMMANDS = {"models": cmd_models, "status": cmd_status, "load": cmd_load, "unload": cmd_unload}
HELP = {
    "models": "list the agent's models: state, aliases, memory, requests",
    "status": "the agent's instances, queue, models and memory ledger",
    "load": "load a model and follow its progress until it is ready",
    "unload": "unload a model (requests in flight finish first)",
}


@dataclass(frozen=True)
class Command:
    """A command served by :func:`main` besides this module's own (``client_ops``)."""

    run: Callable[[AgentClient, argparse.Namespace, TextIO], int]
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]


def parser(command: str, extra: Command | None = None) -> argparse.ArgumentParser:
    description = extra.help if extra is not None else HELP[command]
    p = argparse.ArgumentParser(prog=f"corral {command}", description=description)
    p.add_argument(
        "--url",
        default=os.environ.get("CORRAL_URL", DEFAULT_URL),
        help="the agent's URL: host:port means http://host:port, unix:///PATH.sock an agent "
        f"started with --host PATH.sock (env CORRAL_URL; default {DEFAULT_URL})",
    )
    p.add_argument(
        "--api-key",
        default=env_api_key()[1],
        help="the agent's --api-key (env CORRAL_API_KEY or LLAMA_API_KEY)",
    )
    p.add_argument("--timeout", type=float, default=60, help="seconds per HTTP request")
    if extra is not None:
        extra.arguments(p)
    elif command in ("load", "unload"):
        p.add_argument("name", help="the model's name or alias")
        p.add_argument("--no-wait", action="store_true", help="return once the agent accepted")
        p.add_argument(
            "--json",
            action="store_true",
            help='print the outcome as one JSON object: {"model", "status", "changed", '
            '"seconds"} (no progress lines)',
        )
    else:
        p.add_argument("--json", action="store_true", help="print the agent's JSON")
    return p


def env_api_key() -> tuple[str | None, str | None]:
    """(variable, key): the API key the environment gives, and which variable gave it."""
    for variable in ("CORRAL_API_KEY", "LLAMA_API_KEY"):
        if os.environ.get(variable):
            return variable, os.environ[variable]
    return None, None


def api_key_hint(given: str | None) -> str:
    """What to do about a 401, depending on whether a key was sent and where it came from."""
    if not given:
        return "the agent wants an API key: pass --api-key KEY or set CORRAL_API_KEY"
    variable, from_env = env_api_key()
    source = variable if variable is not None and given == from_env else "--api-key"
    return f"the agent refused the key from {source}: it must be one of the agent's --api-key keys"


def main(
    argv: Sequence[str],
    out: TextIO | None = None,
    err: TextIO | None = None,
    extra: Mapping[str, Command] | None = None,
) -> int:
    """``argv[0]`` is the command (``models``, ``load``, ``unload``, ``status``, or one of
    ``extra``)."""
    out, err = out or sys.stdout, err or sys.stderr
    extra = extra or {}
    runs = {**COMMANDS, **{name: command.run for name, command in extra.items()}}
    if not argv or argv[0] not in runs:
        print(f"corral: expected one of {', '.join(runs)}", file=err)
        return EXIT_USAGE
    command = argv[0]
    try:
        args = parser(command, extra.get(command)).parse_args(list(argv[1:]))
    except SystemExit as exc:  # argparse printed the usage; keep main() a function
        return int(exc.code or 0)
    try:
        client = AgentClient(agent_url(args.url), args.api_key, args.timeout)
    except BadUrl as exc:
        print(f"corral {command}: {exc}", file=err)
        return EXIT_USAGE
    try:
        return runs[command](client, args, out)
    except AgentError as exc:
        hint = f"\n({api_key_hint(args.api_key)})" if exc.status == 401 else ""
        print(f"corral {command}: the agent answered {exc.status}: {exc.message}{hint}", file=err)
        return EXIT_REFUSED
    except UnknownModel as exc:
        print(f"corral {command}: {exc}", file=err)
        return EXIT_REFUSED
    except Unreachable as exc:
        print(
            f"corral {command}: {exc}\n(is `corral agent` running there? set --url or CORRAL_URL)",
            file=err,
        )
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        print(file=err)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
