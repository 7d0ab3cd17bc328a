"""The run's report: the machine it ran on, a markdown table, and the raw figures as JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.procs import CORRAL, DIRECT, PEER, TARGETS
from bench.results_model import ScenarioResult

NAMES = {CORRAL: "Corral", PEER: "llama.cpp router", DIRECT: "direct child"}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(binary: Path) -> str:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    # llama-server prints its version on stderr: "version: 0.1.0-dev (build 1, commit …)".
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.startswith("version")]
    version = lines[0].removeprefix("version:").strip() if lines else "unknown"
    return f"{version} ({binary})"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine(binary: Path) -> dict[str, Any]:
    try:
        corral = metadata.version("corral")
    except metadata.PackageNotFoundError:
        corral = "not installed"
    return {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "python": sys.version.split()[0],
        "llama_server": _version(binary),
        "llama_server_path": str(binary),
        "corral": corral,
        "kernel": platform.release(),
        "load_average_start": load_average(),
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _met(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "—"}[value]


def markdown(results: Sequence[ScenarioResult], info: dict[str, Any], size: str) -> str:
    lines = [
        f"## Corral vs llama.cpp's router ({size} run)",
        "",
        "| Scenario | Metric | Corral | llama.cpp router | Direct child "
        "| Corral ÷ router | Corral ÷ direct | Target | Met |",
        "|---|---|--:|--:|--:|--:|--:|---|---|",
    ]
    for result in results:
        for metric in result.metrics:
            unit = f" ({metric.unit})" if metric.unit else ""
            cells = [_fmt(metric.values.get(t)) for t in TARGETS]
            goals = ", ".join(g.text(metric.unit) for g in metric.goals) or ""
            lines.append(
                f"| {result.id} | {metric.label}{unit} | {' | '.join(cells)} "
                f"| {_ratio(metric.ratio(PEER))} | {_ratio(metric.ratio(DIRECT))} "
                f"| {goals} | {_met(metric.met()) if goals else ''} |"
            )
    lines += [
        "",
        "Router processes' own resources during each scenario's measured phase "
        "(children = their llama-server children, reaped and live):",
        "",
        "| Scenario | Corral CPU (s) | Corral children CPU (s) | Corral peak RSS (MiB) "
        "| llama.cpp CPU (s) | llama.cpp children CPU (s) | llama.cpp peak RSS (MiB) |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for result in results:
        cells = []
        for target in (CORRAL, PEER):
            used = result.resources.get(target)
            figures = (used.cpu_s, used.children_cpu_s, used.peak_rss_mib) if used else ()
            cells += [_fmt(f) for f in figures] if used else ["—"] * 3
        lines.append(f"| {result.id} | {' | '.join(cells)} |")
    lines += ["", "Scenarios:", ""]
    for result in results:
        lines.append(f"- **{result.id}** {result.title} ({result.seconds:.0f} s).")
        for target, error in sorted(result.errors.items()):
            first = error.splitlines()[0] if error else ""
            lines.append(f"  - {NAMES.get(target, target)} failed: `{first[:200]}`")
    load = f"{info['load_average_start']} → {info.get('load_average_end')}"
    lines += [
        "",
        f"Machine: {info['cores']} cores ({info['cores_usable']} usable), {info['cpu_model']}; "
        f"Python {info['python']}; llama-server {info['llama_server']}; "
        f"load average (1, 5, 15 min) {load}."
        + (
            f" Corral's agents ran with `{info['corral_args']}`." if info.get("corral_args") else ""
        ),
        "",
    ]
    return "\n".join(lines)


def write(
    out: Path, results: Sequence[ScenarioResult], info: dict[str, Any], size: str, table: str
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "size": size,
        "machine": info,
        "scenarios": [r.to_json() for r in results],
    }
    json_path, md_path = out / "latest.json", out / "latest.md"
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    md_path.write_text(table)
    return json_path, md_path
