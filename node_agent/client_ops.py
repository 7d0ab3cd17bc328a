"""``corral ps|logs|pull|rm|reload``: the day-to-day commands people know from Ollama.

Clients of the agent's own API, on :mod:`node_agent.client`'s transport, options and exit
codes: ``ps`` reads ``GET /api/ps`` (its ``corral`` figures: state, memory, devices, the time
until an idle unload, pin, requests in flight), ``logs`` ``GET /models/logs``, ``pull``
``POST /models`` followed on ``/models/sse``, ``rm`` ``DELETE /models``, ``reload``
``GET /models?reload=1``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final, TextIO

from node_agent import client_format as fmt
from node_agent.client import (
    POLL_SECONDS,
    AgentClient,
    AgentError,
    Command,
    EventFeed,
    Outcome,
    Unreachable,
)
from node_agent.client import (
    main as client_main,
)

# How long `corral pull` follows a download that says nothing (no progress event) before it
# looks at the model list itself: the events stream may have broken.
QUIET_SECONDS: Final = 5.0
# The window a download's speed is measured over: long enough to smooth a network's bursts,
# short enough to follow a change of pace.
RATE_SECONDS: Final = 5.0


def duration(seconds: float | None) -> str:
    """``4m 10s``, ``1h 05m``, ``never`` (None)."""
    if seconds is None:
        return "never"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole // 60 % 60:02d}m"


def ps_table(models: Sequence[Mapping[str, Any]]) -> str:
    """``GET /api/ps`` as a table; the memory is the ledger's figure, else the process's own
    (its ``smaps``, counted as the ledger counts a running child)."""
    if not models:
        return "no model is running"
    rows = []
    for model in models:
        info = model.get("corral") or {}
        until = "pinned" if info.get("pinned") else duration(info.get("unload_in"))
        if info.get("state") == "loading":
            until = "-"
        rows.append(
            [
                str(model.get("name", "?")),
                str(info.get("state", "?")),
                fmt.size(info.get("memory")),
                ",".join(info.get("devices") or []),
                until,
                "yes" if info.get("pinned") else "-",
                str(info.get("in_flight", 0)),
            ]
        )
    headers = ["NAME", "STATE", "MEMORY", "DEVICE", "UNLOAD IN", "PIN", "IN FLIGHT"]
    return fmt.table(headers, rows, right={2, 6})


def cmd_ps(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    body = client.call("GET", "/api/ps")
    models = body.get("models", []) if isinstance(body, dict) else []
    print(json.dumps(models, indent=2) if args.json else ps_table(models), file=out)
    return 0


def cmd_logs(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    query = {"model": args.name, "lines": str(args.lines)}
    if args.follow:
        query["follow"] = "1"
    printed = False
    for raw in client.lines("/models/logs?" + urllib.parse.urlencode(query)):
        out.write(raw.decode(errors="replace"))
        out.flush()
        printed = True
    if not printed and not args.follow:
        # An empty answer is a model whose child never ran (the agent keeps each child's
        # output from its start): say so, rather than print nothing and succeed.
        raise AgentError(
            404,
            f"{args.name} has not started since the agent did, so it has no log yet "
            f"(corral load {args.name} starts it; corral logs {args.name} -f follows it)",
        )
    return 0


def cmd_rm(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    name = urllib.parse.quote(args.name, safe="")
    client.call("DELETE", f"/models?model={name}")
    print(f"removed {args.name} (its files are out of the Hugging Face cache)", file=out)
    return 0


def cmd_reload(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    body = client.call("GET", "/models?reload=1")
    count = len(body.get("data", [])) if isinstance(body, dict) else 0
    refused = body.get("refused") if isinstance(body, dict) else None
    print(f"reloaded: {count} models", file=out)
    for entry in refused or []:
        print(f"refused preset {entry.get('origin')}: {entry.get('reason')}", file=out)
    return 1 if refused else 0


def _bytes(data: Mapping[str, Any]) -> tuple[int, int]:
    """Bytes done and in all of a ``download_progress`` event's files."""
    progress = data.get("progress")
    if not isinstance(progress, dict):
        return 0, 0
    files = [p for p in progress.values() if isinstance(p, dict)]
    return sum(int(p.get("done", 0)) for p in files), sum(int(p.get("total", 0)) for p in files)


class Rate:
    """A download's speed over its last :data:`RATE_SECONDS` (what a bar shows as it goes)."""

    def __init__(self) -> None:
        self._seen: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int) -> float | None:
        """Bytes per second as of ``done`` bytes at ``now``; None until two reports apart."""
        self._seen.append((now, done))
        while len(self._seen) > 2 and now - self._seen[1][0] >= RATE_SECONDS:
            self._seen.popleft()
        (first, was), (last, now_done) = self._seen[0], self._seen[-1]
        return (now_done - was) / (last - first) if last > first else None


def download_detail(done: int, total: int, rate: float | None) -> str:
    """``2.0 MiB of 5.3 MiB, 1.1 MiB/s, 3s left`` (speed and time once known)."""
    text = f"{fmt.size(done)} of {fmt.size(total)}"
    if rate and done < total:
        text += f", {fmt.size(rate)}/s, {duration((total - done) / rate)} left"
    return text


def cmd_pull(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    """``POST /models`` and its download followed to the end, with a progress bar; a download
    of that name already on its way (one a restart resumed) is followed the same way."""
    name = args.name
    outcome = Outcome(out, name, as_json=args.json, verb="downloading")
    feed = EventFeed(client)
    feed.connected.wait(timeout=0.2)
    try:
        client.call("POST", "/models", {"model": name})
    except AgentError as err:
        if not (err.status == 400 and err.message == f"model '{name}' already exists"):
            raise
        listed = {m.id: m for m in client.models()}.get(name)
        if listed is None or listed.status.value != "downloading":
            return outcome.already("downloaded")
    try:
        return _follow_download(client, feed, name, outcome)
    except Unreachable as exc:
        outcome.progress.clear()  # the message goes on a line of its own, not the bar's
        raise Unreachable(
            f"{exc}. The download is not cancelled: an agent that still runs goes on with it, "
            f"and one that stopped resumes it when it starts again (corral pull {name} then "
            "follows it)"
        ) from exc


def _follow_download(client: AgentClient, feed: EventFeed, name: str, outcome: Outcome) -> int:
    started = last_heard = time.monotonic()
    progress = outcome.progress
    rate = Rate()
    progress.show(0.0)
    while True:
        message = feed.next(timeout=POLL_SECONDS)
        if message is not None and message.get("model") == name:
            last_heard = time.monotonic()
            event, data = message.get("event"), message.get("data") or {}
            if event == "download_progress":
                done, total = _bytes(data)
                if total:
                    speed = rate.add(last_heard, done)
                    progress.show(done / total, download_detail(done, total, speed))
            elif event == "download_finished":
                return outcome.done("downloaded", time.monotonic() - started)
            elif event == "download_failed":
                break
        elif time.monotonic() - last_heard > QUIET_SECONDS:
            last_heard = time.monotonic()
            listed = {m.id: m for m in client.models()}
            entry = listed.get(name)
            if entry is None:
                break  # neither downloading nor a model: the download failed
            if entry.status.value != "downloading":
                return outcome.done("downloaded", time.monotonic() - started)
    return outcome.failed("the download failed (the agent's log says why)")


def _ps_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print /api/ps's models as JSON")


def _logs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the model's name or alias")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument(
        "-n", "--lines", type=int, default=200, help="how many of the last lines (default 200)"
    )


def _name_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the model's name")


def _pull_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name", metavar="REPO[:QUANT]", help="a Hugging Face repository: org/repo:Q4_K_M"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help='print the outcome as one JSON object: {"model", "status", "changed", "seconds"}',
    )


def _no_arguments(p: argparse.ArgumentParser) -> None:
    return None


OPS: Final = {
    "ps": Command(
        cmd_ps, "the running models: memory, device, time until unload, pin", _ps_arguments
    ),
    "logs": Command(cmd_logs, "a model's llama-server output (-f: follow it)", _logs_arguments),
    "pull": Command(cmd_pull, "download a model from Hugging Face, with progress", _pull_arguments),
    "rm": Command(cmd_rm, "remove a downloaded model and its files", _name_argument),
    "reload": Command(cmd_reload, "re-read the models folder, presets and HF cache", _no_arguments),
}


def main(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    return client_main(argv, out or sys.stdout, err or sys.stderr, OPS)
