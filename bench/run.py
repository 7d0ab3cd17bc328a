"""Corral vs llama.cpp's router vs a direct child, in one run (issue 6).

    hack/bench.sh [--smoke] [--only S1,S3] [--out bench/results]
    python -m bench.run --help

Prints a markdown table and writes ``<out>/latest.md`` and ``<out>/latest.json`` (the raw
samples too). Targets: ``corral`` (our agent), ``llama.cpp`` (the same llama-server binary in
router mode: same models, same flags) and ``direct`` (one llama-server child, as a router
starts it). Everything listens on 127.0.0.1 only; every process started is stopped at the end.
Set ``CORRAL_BENCH_CPROFILE=DIR`` to run the agent under cProfile (one .prof per process).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import FrameType

from bench import report
from bench.fleet import FULL, SMOKE, Bench, Models, Sizes
from bench.procs import TARGETS, Launcher
from bench.results_model import ScenarioResult
from bench.scenarios import s1_overhead, s2_real_model, s2_streaming, s3_cold_start
from bench.scenarios_load import s4_churn, s5_concurrency, s6_scale
from bench.scenarios_queue import s7_queue
from bench.scenarios_streams import s8_streams
from bench.scenarios_warm import s9_warm_swaps

Scenario = Callable[[Bench], Awaitable[ScenarioResult]]
SCENARIOS: dict[str, Scenario] = {
    "S1": s1_overhead,
    "S2": s2_streaming,
    "S2R": s2_real_model,
    "S3": s3_cold_start,
    "S4": s4_churn,
    "S5": s5_concurrency,
    "S6": s6_scale,
    "S7": s7_queue,
    "S8": s8_streams,
    "S9": s9_warm_swaps,
}


def find_binary() -> Path:
    """The llama-server the agent would run: ``$LLAMA_SERVER``, else the one on ``PATH``, else
    ``corral llama-server build``'s (the one the tests use)."""
    from node_agent.llama_server.binary import find_llama_server

    return find_llama_server(None, os.environ)


def demo_models(where: Path) -> Path:
    from node_agent.demo_models import write_demo_models

    where.mkdir(parents=True, exist_ok=True)
    write_demo_models(where)  # skips files already there and correct
    return where


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: proves it runs")
    parser.add_argument("--only", default="", help="comma-separated scenarios, e.g. S1,S3")
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help=f"comma-separated, of {','.join(TARGETS)}"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("-c", "--ctx", type=int, default=1024, help="context size, every target")
    default_models = os.environ.get("CORRAL_TEST_MODELS") or str(
        Path(tempfile.gettempdir()) / "corral-bench-demo-models"
    )
    parser.add_argument(
        "--models", type=Path, default=Path(default_models), help="demo models cache folder"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument(
        "--corral-args",
        default="",
        help="more flags for every Corral agent, e.g. '--event-loop asyncio' (one string)",
    )
    args = parser.parse_args(argv)
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    args.only = only or list(SCENARIOS)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or any(t not in TARGETS for t in targets):
        parser.error(f"--targets takes a comma-separated list of {', '.join(TARGETS)}")
    args.targets = tuple(t for t in TARGETS if t in targets)
    return args


async def run(bench: Bench, only: Sequence[str]) -> list[ScenarioResult]:
    results = []
    for name in only:
        print(f"[bench] {name} …", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result = await SCENARIOS[name](bench)
        result.seconds = time.perf_counter() - start
        for target, error in result.errors.items():
            print(f"[bench] {name}: {target} failed: {error}", file=sys.stderr)
        print(f"[bench] {name} done in {result.seconds:.1f} s", file=sys.stderr, flush=True)
        results.append(result)
    return results


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM behaves like Ctrl-C, so every `finally` runs and no server outlives the run.
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _interrupt)
    sizes: Sizes = SMOKE if args.smoke else FULL
    size = "smoke" if args.smoke else "full"
    binary = find_binary()
    info = report.machine(binary)
    info["corral_args"] = args.corral_args
    demo = demo_models(args.models)
    # The work folder sits next to the demo models so that hard links to them are possible.
    workdir = Path(tempfile.mkdtemp(prefix="corral-bench-", dir=demo.parent))
    try:
        bench = Bench(
            launcher=Launcher(binary, args.ctx, workdir, tuple(shlex.split(args.corral_args))),
            models=Models.build(demo, workdir / "models"),
            demo=demo,
            targets=args.targets,
            sizes=sizes,
        )
        results = asyncio.run(run(bench, args.only))
    finally:
        if args.keep:
            print(f"[bench] work folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    info["load_average_end"] = report.load_average()
    info["targets"] = list(args.targets)
    table = report.markdown(results, info, size)
    json_path, md_path = report.write(args.out, results, info, size, table)
    print(table)
    print(f"[bench] wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
