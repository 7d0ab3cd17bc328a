"""A Vertex AI ``/predict`` body split into its instances (``vertex``), in a worker process when
the body is large (``bodies.digest``): a leaf with nothing but ``json``, as ``body_fields``.

Each instance comes back as its ``@requestFormat`` and its endpoint's body, encoded again
(``stream`` forced off), or as the 400 message that takes its place in the predictions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from node_agent.api.body_fields import loads

MAX_INSTANCES = 128  # llama.cpp's bound


@dataclass(frozen=True)
class Instance:
    form: str  # its @requestFormat: a path or its camelCase alias
    body: bytes  # the endpoint's body
    had_stream: bool  # it asked for a stream (the predict route never streams)


def split_instances(body: bytes) -> tuple[str | None, list[Instance | str]]:
    """(the body's mistake, or None; each instance, or its own mistake), in llama.cpp's words."""
    error, data = loads(body)
    if error is not None:
        return error, []
    if not isinstance(data, dict):
        return "request body must be a JSON object", []
    instances = data.get("instances")
    if not isinstance(instances, list):
        return "request body must include an array field named instances", []
    if len(instances) > MAX_INSTANCES:
        return f"instances array exceeds maximum size of {MAX_INSTANCES}", []
    return None, [_instance(i) for i in instances]


def _instance(instance: Any) -> Instance | str:
    if not isinstance(instance, dict):
        return "each instance must be a JSON object"
    form = instance.get("@requestFormat")
    if not isinstance(form, str):
        return "each instance must include a string @requestFormat"
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    had_stream = "stream" in payload
    if had_stream:
        payload["stream"] = False
    return Instance(form, json.dumps(payload).encode(), had_stream)
