"""Ollama's API (``/api/*``) on the same queue, leases and models as the OpenAI-style one."""
