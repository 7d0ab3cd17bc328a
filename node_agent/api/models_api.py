"""llama.cpp b11434's models API: ``POST /models`` (download) and ``DELETE /models?model=``.

Same status codes, messages and shapes as its router (``tools/server/server-models.cpp``):

* ``POST /models {"model": "org/repo[:quant]"}`` -> ``{"success": true}`` once the download is
  on its way; 400 ``model must be a non-empty string``, 400 with llama.cpp's
  ``error: invalid HF repo format…``, 400 ``model 'X' already exists``;
* ``DELETE /models?model=X`` -> ``{"success": true}`` after the model's child (or download) is
  gone and its files are out of the cache; 400 ``model must be a non-empty string``, 500
  ``model name=X is not found``, 500 ``model name=X is not removable (not from cache)``;
  ``model_remove`` on ``/models/sse``;
* while a download is on its way, ``GET /models`` lists the model as ``downloading``.

Deliberate differences (README, "Models API"; each has a test): a name the Hub has no model
file for is refused with 400 (llama.cpp starts a download that "finishes" with nothing); a
download sharing files with one on its way is refused with 400 (llama.cpp lets both write the
same partial file); a request for a downloading model waits for it (llama.cpp answers 400
``model name=X is not running``); a field besides ``model`` is refused with 400 (llama.cpp
ignores it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from node_agent.api.bodies import parse_json_body, read_control_body
from node_agent.api.state import STATE, AgentState
from node_agent.child.ports import CHILD_HOST
from node_agent.clip import clip
from node_agent.errors import ApiError
from node_agent.sources import hf_hub
from node_agent.sources.options import llama_options
from node_agent.sources.spec import SOURCE_CACHE
from node_agent.sources.trust import option_refusal

NON_EMPTY = "model must be a non-empty string"


async def _body_name(request: web.Request) -> str:
    """llama.cpp's ``json_value(body, "model", "")``: anything but a non-empty string is
    missing; a body that is not JSON is the client's mistake (400, as the app says it)."""
    body = parse_json_body(await read_control_body(request))
    name = body.get("model") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise ApiError(400, NON_EMPTY)
    _only_the_name(body, name)
    return name


def _only_the_name(body: dict[str, Any], name: str) -> None:
    """A model added over HTTP carries its name (``hf-repo``) and nothing else: its options
    come from the node's presets. Whoever may call the API is not the node's administrator,
    so an option is judged as in a restricted preset (``sources.trust``); and since llama.cpp
    reads nothing but ``model`` here, any other field is refused too, never dropped unsaid."""
    extra = sorted(key for key in body if key != "model")
    for key in extra:
        match = llama_options().key(key.lstrip("-"))
        refusal = option_refusal(match.option.name) if match is not None else None
        if refusal is not None:
            raise ApiError(400, f"POST /models cannot set {clip(key)!r}: {refusal}")
    if extra:
        fields = clip(", ".join(repr(clip(key)) for key in extra))
        raise ApiError(
            400,
            f'POST /models takes only "model", not {fields}: a downloaded model\'s options '
            f"come from the node's presets (a [{clip(name)}] section)",
        )


async def post_models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    name = await _body_name(request)
    registry = state.registry
    await registry.downloads.start_repo(name, exists=lambda n: registry.resolve(n) is not None)
    return web.json_response({"success": True})


async def delete_models(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    registry = state.registry
    name = request.query.get("model", "")
    if not name:
        raise ApiError(400, NON_EMPTY)
    canonical = registry.resolve(name)
    if canonical is None:
        raise ApiError(500, f"model name={clip(name)} is not found")
    downloading = registry.downloads.active(canonical)
    if not downloading and registry.spec(canonical).source != SOURCE_CACHE:
        raise ApiError(500, f"model name={canonical} is not removable (not from cache)")
    await registry.stop_and_wait(canonical)
    hub = registry.downloads.settings.hub
    if hub is not None:
        try:
            await asyncio.to_thread(hf_hub.remove_cached, hub, canonical)
        except (OSError, ValueError) as exc:
            why = f"model name={canonical}: removing its files failed: {exc}"
            raise ApiError(500, why) from exc
    await state.reload()
    registry.publish(canonical, "model_remove", None)
    return web.json_response({"success": True})


def download_entries(state: AgentState, now: int) -> list[dict[str, Any]]:
    """``GET /models`` entries for downloads of models not in the catalog yet (b11434's)."""
    from node_agent.models_schema import ModelEntry, ModelStatus, dump  # pydantic: lazily

    registry = state.registry
    entries = []
    for name in registry.downloads.names():
        if name in registry.specs():
            continue  # a preset's own download: its entry says "downloading" itself
        args = [state.binary, "--host", CHILD_HOST, "--port", "0", "--alias", name]
        entry = ModelEntry(
            id=name,
            aliases=[],
            tags=[],
            object="model",
            owned_by="llamacpp",
            created=now,
            status=ModelStatus(value="downloading", args=args),
            architecture={"input_modalities": ["text"], "output_modalities": ["text"]},
            source=SOURCE_CACHE,
            can_remove=True,
        )
        entries.append(dump(entry))
    return entries


def setup_models_api(app: web.Application) -> None:
    app.add_routes([web.post("/models", post_models), web.delete("/models", delete_models)])
