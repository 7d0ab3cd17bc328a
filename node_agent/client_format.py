"""Text for the ``corral`` client commands: tables, sizes and the load progress line.

Pure functions of the agent's answers (``GET /models`` parsed with the shared schema,
``/ledger``, ``/props``), so they are tested without an agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from node_agent.models_schema import ModelEntry

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
KNOWN_NAMES_SHOWN = 20  # an agent may serve 1,000 models: name a few, count the rest


def size(n: int | float | None) -> str:
    if n is None:
        return "-"
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {UNITS[unit]}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """Columns padded to their widest cell; ``right`` holds the numeric columns' indexes."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        out = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def model_state(model: ModelEntry) -> str:
    value = model.status.value
    if model.corral is not None and model.corral.stopping:
        return f"{value} (stopping)"
    if value == "unloaded" and model.status.failed:
        return f"failed (exit {model.status.exit_code})"
    return value


def ledger_held(model: ModelEntry) -> Mapping[str, int]:
    """What the ledger counts ``model`` holding, by device (empty: none, or the ledger is off)."""
    memory = model.corral.memory if model.corral is not None else None
    return memory.held if memory is not None else {}


def held_memory(model: ModelEntry, process: Mapping[str, int]) -> str:
    """The ledger's figures; with it off, the process's own (``process``: from GET /api/ps)."""
    held = ledger_held(model)
    if held:
        return ", ".join(f"{device} {size(n)}" for device, n in sorted(held.items()))
    return f"process {size(process[model.id])}" if model.id in process else "-"


def models_table(models: Sequence[ModelEntry], process: Mapping[str, int] | None = None) -> str:
    if not models:
        return "no models (check the agent's --models-dir, --models-preset or HF cache)"
    rows = []
    for m in models:
        rows.append(
            [
                m.id,
                model_state(m),
                ", ".join(m.aliases) or "-",
                held_memory(m, process or {}),
                str(m.corral.in_flight if m.corral else 0),
                str(m.corral.queued if m.corral else 0),
            ]
        )
    headers = ["NAME", "STATE", "ALIASES", "MEMORY", "IN FLIGHT", "QUEUED"]
    return table(headers, rows, right={4, 5})


def ledger_table(ledger: Mapping[str, Any]) -> str:
    rows = []
    for d in ledger.get("devices", []):
        held = sum((d.get("held") or {}).values())
        capacity = d.get("limit") if d.get("limit") is not None else d.get("total")
        # The ledger's own "other" (CAPACITY = OTHER + MODELS + AVAILABLE, as /ui shows it);
        # an older agent sends only the raw external use.
        other = d.get("other", d.get("external"))
        rows.append(
            [
                str(d.get("name")),
                size(capacity),
                size(other),
                size(held),
                size(d.get("available")),
                size(d.get("margin")),
            ]
        )
    headers = ["DEVICE", "CAPACITY", "OTHER", "MODELS", "AVAILABLE", "MARGIN"]
    return table(headers, rows, right={1, 2, 3, 4, 5})


def status_text(
    url: str,
    props: Mapping[str, Any],
    models: Sequence[ModelEntry],
    ledger: Mapping[str, Any] | None,
    process: Mapping[str, int] | None = None,
) -> str:
    # What holds an instance, as llama.cpp's router counts them against --models-max: a
    # download on its way holds none.
    running = [m for m in models if m.status.value in ("loading", "loaded", "sleeping")]
    limit = props.get("max_instances")
    unlimited = not isinstance(limit, int) or limit <= 0
    queued = sum(m.corral.queued for m in models if m.corral)
    in_flight = sum(m.corral.in_flight for m in models if m.corral)
    lines = [
        f"agent      {url}",
        f"instances  {len(running)} running of {'unlimited' if unlimited else limit}"
        f" ({len(models)} models known)",
        f"requests   {in_flight} in flight, {queued} waiting",
        f"autoload   {'on' if props.get('models_autoload') else 'off'}",
        "",
        models_table(models, process),
    ]
    if ledger is None:
        lines += ["", "memory ledger off (start the agent with --models-memory-margin MiB)"]
    else:
        lines += ["", ledger_table(ledger)]
    return "\n".join(lines)


def unknown_model(name: str, known: Sequence[str]) -> str:
    """The one wording of "no such model", for load and unload alike, with the names to use."""
    if not known:
        return (
            f"the agent has no model named {name!r}: it has no models at all (check its "
            "--models-dir, --models-preset or HF cache)"
        )
    shown = ", ".join(known[:KNOWN_NAMES_SHOWN])
    more = len(known) - KNOWN_NAMES_SHOWN
    rest = f" and {more} more (`corral models` lists them all)" if more > 0 else ""
    return f"the agent has no model named {name!r}; its models: {shown}{rest}"


def progress_line(name: str, value: float | None, width: int = 30, verb: str = "loading") -> str:
    if value is None:
        return f"{verb} {name} …"
    filled = round(max(0.0, min(1.0, value)) * width)
    return f"{verb} {name} [{'#' * filled}{'.' * (width - filled)}] {value * 100:3.0f}%"
