"""The real-agent tier uses the integration tier's llama-server and demo models."""

from tests.integration.conftest import demo_dir, llama_server

__all__ = ["demo_dir", "llama_server"]
