"""The security tier runs the real agent with real b11434 children, as the integration tier
does: the same fixtures."""

from tests.integration.conftest import b11434, demo_dir, real_model, start_agent, tiny_model

__all__ = ["b11434", "demo_dir", "real_model", "start_agent", "tiny_model"]
