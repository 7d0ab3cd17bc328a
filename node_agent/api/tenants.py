"""Whose prompts a request brings: the tenant of its API key (``core.warm_book.tenant_of``).

Warm swaps keep each tenant's saved prompt caches apart (issue 50, row 5); the auth
middleware (``api.app``) names the tenant of the key a request matched.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from node_agent.api.state import STATE
from node_agent.core.warm_book import NOBODY, OPEN

TENANT: Final = "corral.tenant"  # the request's item the auth middleware fills


def request_tenant(request: web.Request) -> str:
    """``request``'s tenant: its key's; every client's one, on an agent without keys."""
    if not request.app[STATE].settings.api_keys:
        return OPEN
    tenant: str = request.get(TENANT, NOBODY)
    return tenant
