#!/usr/bin/env python3
"""The full soak (issue 5): 2,000 requests from 64 clients over 4 demo models, --models-max 2.

Usage: hack/soak.py [--requests N] [--clients N] [--memory-limit SIZE] [--seed N]
                    [--llama-server PATH] [--models DIR]
Prints the figures (requests, successes, documented errors, invariant samples, max children
seen, leaks found) and exits 1 when anything failed, leaked or broke an invariant. The same
engine runs reduced in CI: tests/integration/test_soak.py. Run it in the project's venv.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The engine lives with the integration tests; this script only runs it at full size.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.soak import main

if __name__ == "__main__":
    sys.exit(main())
