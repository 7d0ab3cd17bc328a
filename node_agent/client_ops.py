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
)
from node_agent.client import (
    main as client_main,
)

# How long `corral pull` follows a download that says nothing (no progress event) before it
# looks at the model list itself: the events stream may have broken.
QUIET_SECONDS: Final = 5.0


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
    for raw in client.lines("/models/logs?" + urllib.parse.urlencode(query)):
        out.write(raw.decode(errors="replace"))
        out.flush()
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


def _fraction(data: Mapping[str, Any]) -> float | None:
    progress = data.get("progress")
    if not isinstance(progress, dict):
        return None
    done = sum(int(p.get("done", 0)) for p in progress.values() if isinstance(p, dict))
    total = sum(int(p.get("total", 0)) for p in progress.values() if isinstance(p, dict))
    return done / total if total else None


def cmd_pull(client: AgentClient, args: argparse.Namespace, out: TextIO) -> int:
    """``POST /models`` and its download followed to the end, with a progress bar."""
    name = args.name
    outcome = Outcome(out, name, as_json=args.json, verb="downloading")
    feed = EventFeed(client)
    feed.connected.wait(timeout=0.2)
    try:
        client.call("POST", "/models", {"model": name})
    except AgentError as err:
        if err.status == 400 and err.message == f"model '{name}' already exists":
            return outcome.already("downloaded")
        raise
    started = last_heard = time.monotonic()
    progress = outcome.progress
    progress.show(0.0)
    while True:
        message = feed.next(timeout=POLL_SECONDS)
        if message is not None and message.get("model") == name:
            last_heard = time.monotonic()
            event, data = message.get("event"), message.get("data") or {}
            if event == "download_progress":
                progress.show(_fraction(data))
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
