"""Corral node agent: many llama-server children behind one OpenAI-compatible port."""
