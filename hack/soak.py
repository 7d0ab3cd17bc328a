#!/usr/bin/env python3
"""The full soak (issues 5 and 48): 2,000 requests from 64 clients over 4 demo models,
``--models-max 2 -c 512``, clients that give up after 60 s.

Usage: hack/soak.py [--target corral|llama.cpp] [--hog N] [--requests N] [--clients N]
                    [--seed N] [--flag=F ...] [--corral-flag=F ...] [--llama-server PATH]
                    [--models DIR] [--keep DIR]
``--hog 2`` runs two spinning processes beside it (a busy machine); ``--target llama.cpp``
runs llama.cpp's own router on the same plan. Prints the figures (failures, p99 wait, the
children's own speed, invariant samples, leaks) and exits 1 when anything failed, leaked or
broke an invariant. The same engine runs reduced in CI: tests/integration/test_soak.py.
Run it in the project's venv.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The engine lives with the integration tests; this script only runs it at full size.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.soak import main

if __name__ == "__main__":
    sys.exit(main())
