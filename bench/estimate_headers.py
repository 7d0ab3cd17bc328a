"""Benchmark: estimate 1,000 GGUF headers (target: under 2 s in total).

Hard links of the demo models in a temporary directory stand in for a large models
directory; each file is opened, its header read and the min estimate computed, as
``GET /models`` would. For comparison, gguf-py's reader on a sample of the same files.

    python bench/estimate_headers.py [--count 1000] [--models DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from node_agent.memory.estimator import estimate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--models", type=Path, help="existing demo models (else generated)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        root = Path(tmp)
        sources = sorted(args.models.glob("*.gguf")) if args.models else _generate(root / "src")
        files = []
        for i in range(args.count):
            link = root / f"m{i:05d}.gguf"
            os.link(sources[i % len(sources)], link)
            files.append(link)

        start = time.perf_counter()
        for path in files:
            estimate(path, {"c": "4096"}, ["host"])
        ours = time.perf_counter() - start

        sample = files[:50]
        start = time.perf_counter()
        _gguf_py(sample)
        theirs = (time.perf_counter() - start) * len(files) / len(sample)

    print(f"estimated {len(files)} headers in {ours:.3f} s ({ours / len(files) * 1e3:.2f} ms each)")
    print(f"gguf-py GGUFReader, extrapolated from {len(sample)}: {theirs:.3f} s")
    print("target < 2 s:", "met" if ours < 2 else "MISSED")


def _generate(dest: Path) -> list[Path]:
    from node_agent.demo_models import write_demo_models

    return write_demo_models(dest)


def _gguf_py(paths: list[Path]) -> None:
    from gguf import GGUFReader

    for path in paths:
        GGUFReader(str(path))


if __name__ == "__main__":
    main()
