"""Benchmarks: Corral's agent side by side with llama.cpp's router and a direct child.

Run ``hack/bench.sh`` (``python -m bench.run``); see ``bench/run.py``.
"""
