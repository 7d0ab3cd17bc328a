"""What the proxy passes on of a message's headers (api/proxy.py)."""

from __future__ import annotations

from multidict import CIMultiDict

from node_agent.api.proxy import forward_headers


def test_the_headers_connection_names_are_dropped_with_the_fixed_hop_by_hop_set() -> None:
    # Issue 26, row 18: a child's `Connection: X-Child-Hop` header went on to the client.
    headers = CIMultiDict(
        [
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Child-Hop"),
            ("connection", "x-other"),
            ("X-Child-Hop", "1"),
            ("x-other", "2"),
            ("Keep-Alive", "timeout=5"),
            ("Transfer-Encoding", "chunked"),
            ("X-Kept", "3"),
        ]
    )
    assert list(forward_headers(headers).items()) == [
        ("Content-Type", "application/json"),
        ("X-Kept", "3"),
    ]
