"""What the agent knows about one model: its name, where it came from, how to start it.

``ModelSpec`` is the merged result of every source (llama.cpp's ``common_preset``); a
``PresetLayer`` is one source's contribution, merged on top with llama.cpp's rule: only the keys
a layer sets replace earlier values (``common_preset::merge``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from node_agent.llama_server.devices import CORE_OPTIONS, THREADS_ENV, threads_given
from node_agent.sources.options import llama_options

OptionValue = str | bool
"""A value option's text, or a flag's on/off (off renders as its ``--no-`` form)."""

Options = tuple[tuple[str, OptionValue], ...]
Env = tuple[tuple[str, str], ...]
"""A model's own environment variables (``env.NAME`` preset keys, ``sources.preset_env``)."""

T = TypeVar("T")

DEFAULT_STOP_TIMEOUT = 10.0  # seconds; llama.cpp's DEFAULT_STOP_TIMEOUT
DEFAULT_PARALLEL = 4  # llama-server's slots when -np is not given (or is -1, auto)

# Where llama.cpp's GET /models says a model came from (server_model_source names).
SOURCE_CACHE = "cache"
SOURCE_MODELS_DIR = "models_dir"
SOURCE_PRESET = "preset"

# Router-run tools and MCP servers (node_agent.mcp, api/tools_api.py).
TOOL_KEYS = frozenset(
    {"tools", "tools-runtime", "mcp-servers-config", "mcp-servers-json", "webui-mcp-proxy", "agent"}
)
# Router settings: one value for the whole agent, meaningless per model (the preset parser
# refuses them, llama.cpp's unset_reserved_args drops them from a child's arguments).
ROUTER_KEYS = frozenset(
    {
        "host",
        "port",
        "api-key",
        "api-key-file",
        "ssl-key-file",
        "ssl-cert-file",
        "models-dir",
        "models-preset",
        "models-max",
        "models-autoload",
        # They run programs: only the agent's own command line may turn them on, and the
        # agent runs them itself (llama.cpp's router also hands them to every child).
        *TOOL_KEYS,
    }
)
# Options the agent owns for every child and never passes through: the router settings, and
# --alias, which llama.cpp's update_args sets to the model's name (the child listens on
# 127.0.0.1 and a port the agent picks).
CHILD_RESERVED = ROUTER_KEYS | {"alias"}


def merge_options(base: Options, top: Iterable[tuple[str, OptionValue]]) -> Options:
    """``base`` with ``top``'s options replacing or appended (order of first appearance)."""
    merged = dict(base)
    merged.update(top)
    return tuple(merged.items())


@dataclass(frozen=True, slots=True)
class PresetLayer:
    """One source's settings for a model; ``None`` means "not set here, keep what is below"."""

    options: Options = ()
    aliases: tuple[str, ...] | None = None
    load_on_startup: bool | None = None
    stop_timeout: float | None = None
    ttl: float | None = None
    pin: bool | None = None
    priority: int | None = None
    model_sha256: str | None = None
    hf_revision: str | None = None
    dedup_cache_models: bool | None = None
    origin: str | None = None
    """``file:line`` of the INI section, for error messages."""
    env: Env = ()
    """Only the variables this layer sets (merged key by key, like options)."""
    preset_hash: str | None = None
    """A ``[name]`` section's own hash (``preset_ini``); None for ``[*]`` and other sources."""

    def over(self, below: PresetLayer) -> PresetLayer:
        """This layer merged on top of ``below`` (the ``[*]`` cascade)."""
        return PresetLayer(
            options=merge_options(below.options, self.options),
            aliases=self.aliases if self.aliases is not None else below.aliases,
            load_on_startup=_pick(self.load_on_startup, below.load_on_startup),
            stop_timeout=_pick(self.stop_timeout, below.stop_timeout),
            ttl=_pick(self.ttl, below.ttl),
            pin=_pick(self.pin, below.pin),
            priority=_pick(self.priority, below.priority),
            model_sha256=_pick(self.model_sha256, below.model_sha256),
            hf_revision=_pick(self.hf_revision, below.hf_revision),
            dedup_cache_models=_pick(self.dedup_cache_models, below.dedup_cache_models),
            origin=self.origin or below.origin,
            env=_merge_env(below.env, self.env),
            preset_hash=_chain_hash(below.preset_hash, self.preset_hash),
        )


def _chain_hash(below: str | None, top: str | None) -> str | None:
    """One section merged over another's (two files name one model): a hash of both."""
    if below is None or top is None:
        return top or below
    return hashlib.sha256(f"{below}:{top}".encode()).hexdigest()[:12]


def _merge_env(below: Env, top: Env) -> Env:
    return tuple({**dict(below), **dict(top)}.items())


def _pick(top: T | None, below: T | None) -> T | None:
    return top if top is not None else below


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model the agent can serve, merged from all sources."""

    name: str
    """Canonical name (what ``GET /models`` lists as ``id``)."""
    source: str
    """``cache``, ``models_dir`` or ``preset``, as llama.cpp reports it."""
    options: Options = ()
    """llama-server options by canonical name, in the order they were first set."""
    aliases: tuple[str, ...] = ()
    load_on_startup: bool = False
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    ttl: float | None = None
    """Corral: unload after this many idle seconds; None = the agent's ``--models-ttl``."""
    pin: bool = False
    """Corral: never chosen as an eviction victim."""
    priority: int = 0
    """Corral: lower priorities are evicted first."""
    cache_file: str | None = None
    """The GGUF an HF-cache model resolves to (its child gets ``--hf-repo``, like llama.cpp)."""
    cache_mmproj: str | None = None
    file_identity: tuple[int, int, int, int] | None = None
    """(device, inode, size, mtime) of the model file when the catalog was read: a file
    replaced under the same name is a new model to a reload (the running child still maps
    the old one)."""
    model_sha256: str | None = None
    """Corral: the SHA-256 ``model-url`` must match; the agent then downloads and checks it
    itself (``sources.download``) instead of letting the child fetch it unchecked."""
    hf_revision: str | None = None
    """Corral: the Hugging Face revision (commit, branch or tag) of ``hf-repo``/``hf-file``,
    which llama-server cannot pin; the agent downloads that exact file itself."""
    dedup_cache_models: bool = False
    """llama.cpp's ``dedup-cache-models`` preset key: hide the cache entries whose file this
    model (or its draft) already uses."""
    hidden: bool = False
    """A cache entry hidden by a preset's ``dedup-cache-models``: unlisted, still usable."""
    env: Env = ()
    """The child's own environment variables, on top of the agent's (``env.NAME`` keys)."""
    preset_hash: str | None = None
    """Its preset section's hash (``preset_ini``), None without one: which version of its
    preset it is, for the operator (``GET /models``' ``corral.preset_hash``)."""

    def get(self, name: str) -> OptionValue | None:
        """An option's value by canonical name (``ctx-size``), or None when unset."""
        for key, value in self.options:
            if key == name:
                return value
        return None

    @property
    def slots(self) -> int:
        """How many requests its child serves at once: its ``-np``, else llama-server's
        default (``-np -1``, auto, is that default too)."""
        value = self.get("parallel")
        try:
            parallel = int(value) if isinstance(value, str) else 0
        except ValueError:
            parallel = 0
        return parallel if parallel > 0 else DEFAULT_PARALLEL

    @property
    def own_threads(self) -> int | None:
        """The threads its own options or environment give its child (``-t`` above 0, or
        ``LLAMA_ARG_THREADS``), or None where they give none."""
        threads = self.get("threads")
        if threads is not None and (count := threads_given(threads)) is not None:
            return count
        for key, value in self.env:
            if key == THREADS_ENV and (count := threads_given(value)) is not None:
                return count
        return None

    @property
    def chooses_threads(self) -> bool:
        """Its options or environment say how many threads, or which cores, its child runs
        (llama.cpp's default ``-t -1`` included): the agent then gives it none."""
        return (
            self.get("threads") is not None
            or any(key == THREADS_ENV for key, _ in self.env)
            or any(self.get(name) is not None for name in CORE_OPTIONS)
        )

    def takes_turns(self, threads: int | None) -> bool:
        """Whether its child computes with several threads on the shared cores, and so takes
        turns on the CPU (``--cpu-turns``): its own threads, else ``threads`` (every child's,
        None: llama-server's thread per core). Not one with cores of its own (``-C``, ``-Cr``),
        nor one of a single thread: that never waits for another at ggml's barriers."""
        if any(self.get(name) is not None for name in CORE_OPTIONS):
            return False
        count = self.own_threads or threads
        return count is None or count > 1

    @property
    def model_path(self) -> str | None:
        """The GGUF file to load (``--model``, else the HF cache file), as given."""
        value = self.get("model")
        return value if isinstance(value, str) else self.cache_file

    @property
    def mmproj(self) -> str | None:
        value = self.get("mmproj")
        return value if isinstance(value, str) else self.cache_mmproj

    def argv(self) -> tuple[str, ...]:
        """The child's arguments, without the binary and the agent-owned options
        (``--host``, ``--port``, ``--alias``, router keys); see ``CHILD_RESERVED``."""
        table = llama_options()
        words: list[str] = []
        for key, value in self.options:
            if key in CHILD_RESERVED:
                continue
            words.extend(table.named(key).render(value))
        return tuple(words)

    def with_layer(self, layer: PresetLayer, *, source: str | None = None) -> ModelSpec:
        """This spec with ``layer`` merged on top (llama.cpp's ``common_preset::merge``)."""
        return dataclasses.replace(
            self,
            source=source or self.source,
            options=merge_options(self.options, layer.options),
            aliases=layer.aliases if layer.aliases is not None else self.aliases,
            load_on_startup=_pick(layer.load_on_startup, self.load_on_startup) or False,
            stop_timeout=_or(layer.stop_timeout, self.stop_timeout),
            ttl=_pick(layer.ttl, self.ttl),
            pin=_or(layer.pin, self.pin),
            priority=_or(layer.priority, self.priority),
            model_sha256=_pick(layer.model_sha256, self.model_sha256),
            hf_revision=_pick(layer.hf_revision, self.hf_revision),
            dedup_cache_models=_or(layer.dedup_cache_models, self.dedup_cache_models),
            env=_merge_env(self.env, layer.env),
            preset_hash=_pick(layer.preset_hash, self.preset_hash),
        )


def _or(top: T | None, below: T) -> T:
    return top if top is not None else below
