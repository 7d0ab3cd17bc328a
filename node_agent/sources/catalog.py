"""All sources merged into one catalog, and what changed between two catalogs.

Order, lowest first (llama.cpp's ``server_models::load_models``): HF cache < ``--models-dir``
(a same-named model replaces the cached one) < preset sections (merged into an existing model,
only the keys they set) < the agent's command line (merged into every model). The ``[*]``
section cascades under *every* model, whatever its source, before that merge.

The operator's presets (``restricted``) never merge into the node's own models: a section
named like a models-dir or cache model (unless it is that cache entry's own download), or with
an alias that is already a name or an alias, is refused alone with its reason (issue 26, rows
9 and 10); the administrator's INI keeps llama.cpp's merge and its whole-file errors.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node_agent.errors import ConfigError
from node_agent.sources.hf_cache import scan_hf_cache
from node_agent.sources.hf_hub import resolve_cached
from node_agent.sources.models_dir import ModelsDir, scan_models_dir
from node_agent.sources.options import llama_options
from node_agent.sources.preset_ini import PresetFile, load_preset_file
from node_agent.sources.spec import (
    CHILD_RESERVED,
    SOURCE_CACHE,
    SOURCE_MODELS_DIR,
    SOURCE_PRESET,
    ModelSpec,
    OptionValue,
    PresetLayer,
    merge_options,
)
from node_agent.sources.trust import Restricted

_HEADER_NAME = re.compile(r"^[ \t]*\[[ \t]*([^\]\r\n]*?)[ \t]*\]", re.MULTILINE)
# Keys that tell a child which weights to load; a preset-only model needs one of them.
MODEL_KEYS = ("model", "model-url", "hf-repo", "docker-repo")
# The command line never renames or re-points a model (llama.cpp's unset_model_args).
NOT_FROM_COMMAND_LINE = frozenset({"model", "mmproj", "alias", "hf-repo"})


@dataclass(frozen=True, slots=True)
class Refusal:
    """A restricted preset the agent would not take: where it is and why (``GET /models``
    lists these under ``refused``; the operator shows them in the ModelPreset's status)."""

    origin: str
    """``file:line`` (or the file alone when it could not be read at all)."""
    reason: str
    models: tuple[str, ...] = ()
    """The model names its sections claimed, where the file could be parsed that far."""
    kind: str = "preset"
    """What was refused: a ``preset``, or a ``models-dir entry`` (a link that loops…)."""


@dataclass(frozen=True)
class Catalog(Mapping[str, ModelSpec]):
    """Models by canonical name, plus alias resolution."""

    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    """alias -> canonical name."""
    refused: tuple[Refusal, ...] = ()
    """Restricted presets left out, each alone (the node's other models stay)."""

    def __getitem__(self, name: str) -> ModelSpec:
        return self.models[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.models)

    def __len__(self) -> int:
        return len(self.models)

    def resolve(self, name: str) -> ModelSpec | None:
        """The model named ``name`` or aliased so (llama.cpp: names first, then aliases)."""
        spec = self.models.get(name)
        if spec is None and name in self.aliases:
            spec = self.models[self.aliases[name]]
        return spec


@dataclass(frozen=True, slots=True)
class CatalogDiff:
    """What ``GET /models?reload=1`` must do, by model name."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    """Gone from every source: unload if running, then forget."""
    changed: tuple[str, ...] = ()
    """The child's command line differs: a running child must restart to apply it."""
    updated: tuple[str, ...] = ()
    """Only agent-side settings differ (aliases, TTL, pin, priority, stop-timeout,
    load-on-startup, source): apply in place."""


def load_catalog(
    *,
    hub: Path | None = None,
    models_dir: str | None = None,
    preset_files: Sequence[str | Path | PresetFile] = (),
    cli_options: Sequence[tuple[str, OptionValue]] = (),
    restricted: Restricted | None = None,
    refuse_clashes: bool = False,
) -> Catalog:
    """Read every source and merge them (ConfigError on any unusable input).

    ``hub`` is the HF hub folder (``hf_cache.hub_dir(env)``); ``preset_files`` are applied in
    order, a later file's section merging over an earlier one's; ``cli_options`` are the
    agent's own llama-server options (``AgentOptions.child_options``). With ``restricted``
    the preset files did not come from the administrator (the operator's ConfigMap): they
    are held to that policy, and a file that breaks it or any other rule is refused alone
    (``Catalog.refused``) instead of failing the whole catalog. ``refuse_clashes``: so is an
    administrator's preset whose alias clashes (a reload: one such preset made every later
    reload of any source fail until it was fixed, issue 50 row 8); at start it stops the agent
    with llama.cpp's message, as llama.cpp's router does.
    """
    cached = scan_hf_cache(hub)
    scanned = scan_models_dir(models_dir) if models_dir is not None else ModelsDir()
    local = scanned.specs
    # An entry of the folder that cannot be a model is skipped alone (a link that loops, one
    # to a file that is not GGUF): shown with the refused presets, the others still listed.
    refused = [
        Refusal(origin=path, reason=reason, kind="models-dir entry")
        for path, reason in scanned.skipped
    ]
    presets: list[PresetFile] = []
    for p in preset_files:
        if isinstance(p, PresetFile):
            presets.append(p)
            continue
        try:
            presets.append(load_preset_file(p, restricted))
        except ConfigError as exc:
            if restricted is None:
                raise
            refused.append(_refusal(exc, str(p)))

    global_layer = PresetLayer()
    sections: dict[str, PresetLayer] = {}
    for preset in presets:
        global_layer = preset.global_layer.over(global_layer)
        for name, layer in preset.sections.items():
            sections[name] = layer.over(sections[name]) if name in sections else layer

    merged: dict[str, ModelSpec] = {}
    for spec in [*cached, *local]:  # local replaces cached whole, as in llama.cpp
        merged[spec.name] = _with_global(spec, global_layer)
    for name, layer in sorted(sections.items()):
        node_model = merged.get(name)
        # A preset from elsewhere never merges over the node's own model (it took over its
        # file and options: issue 26, row 10), unless it names its own download.
        if (
            restricted is not None
            and node_model is not None
            and not _own_download(layer, node_model, hub)
        ):
            refused.append(_clash(layer, name, _NAME_TAKEN))
            continue
        base = node_model or _with_global(ModelSpec(name, SOURCE_PRESET), global_layer)
        # The section is cascaded over [*] before it merges, so [*]'s keys win over what the
        # scan found, as in llama.cpp (cascade(global, custom) then merge).
        spec = base.with_layer(layer.over(global_layer), source=SOURCE_PRESET)
        if not any(spec.get(key) for key in MODEL_KEYS):
            error = ConfigError(
                f"preset [{name}] names no model: no file, folder or cached model has that "
                f"name, and it sets none of {', '.join(MODEL_KEYS)}",
                path=(layer.origin or "").rpartition(":")[0] or None,
                line=_line(layer.origin),
            )
            if restricted is None:
                raise error
            refused.append(_refusal(error, layer.origin or "", (name,)))
            continue
        merged[name] = spec

    overrides = tuple((k, v) for k, v in cli_options if k not in NOT_FROM_COMMAND_LINE)
    final = {
        name: dataclasses.replace(
            spec,
            options=merge_options(spec.options, overrides),
            file_identity=_file_identity(spec.model_path),
        )
        for name, spec in sorted(merged.items())
    }
    final = _dedup(final, hub)
    if restricted is None:
        # Only the administrator's own presets hide a folder model: one from elsewhere never
        # changes the node's own models (as it never merges into them).
        final = _hide_folder_twins(final)
    if restricted is not None or refuse_clashes:
        # One preset whose alias clashes is refused alone (it raised for the whole catalog:
        # the agent did not start, every later update failed; issue 26, row 9).
        final, aliases, clashes = _alias_map_refusing(final, sections)
        return Catalog(models=final, aliases=aliases, refused=(*refused, *clashes))
    return Catalog(models=final, aliases=_alias_map(final), refused=tuple(refused))


def keep_refused(old: Catalog, new: Catalog) -> Catalog:
    """``new``, where a model whose preset was refused keeps its settings from ``old``: a bad
    update of one preset leaves that model as it was running (and reported under ``refused``)
    instead of unloading it."""
    kept = {
        name: old.models[name]
        for refusal in new.refused
        for name in refusal.models
        if name in old.models and name not in new.models
    }
    if not kept:
        return new
    models = dict(sorted({**new.models, **kept}.items()))
    try:
        aliases = _alias_map(models)
    except ConfigError:
        return new  # the old settings clash with a newer preset's names: the new one wins
    return Catalog(models=models, aliases=aliases, refused=new.refused)


def _refusal(exc: ConfigError, where: str, models: tuple[str, ...] = ()) -> Refusal:
    origin = where
    if exc.path is not None:
        origin = exc.path if exc.line is None else f"{exc.path}:{exc.line}"
    if not models and exc.path is not None:
        models = _section_names(exc.path)
    return Refusal(origin=origin, reason=exc.message, models=models)


def _section_names(path: str) -> tuple[str, ...]:
    """The ``[name]`` headers of a file that failed to load, so the refusal can be shown on
    the ModelPreset it came from (the operator matches by model name)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    names = (m.group(1) for m in _HEADER_NAME.finditer(text))
    return tuple(n for n in names if n != "*")


def _named(key: str) -> str:
    match = llama_options().key(key)
    return match.option.name if match is not None else key


def _dedup(models: dict[str, ModelSpec], hub: Path | None) -> dict[str, ModelSpec]:
    """llama.cpp's ``dedup-cache-models``: a pure cache entry whose file a preset with the key
    on already loads (its ``hf-repo``, or its draft's ``spec-draft-hf``) is hidden from the
    list; it stays usable by its name. Decided afresh on every read (a reload with the key
    off brings it back)."""
    used: set[str] = set()
    for spec in models.values():
        if not spec.dedup_cache_models:
            continue
        for repo_key, file_key in (("hf-repo", "hf-file"), ("spec-draft-hf", "spec-draft-model")):
            # The binary in use names the draft's options (b10434: hf-repo-draft, model-draft).
            repo, file = spec.get(_named(repo_key)), spec.get(_named(file_key))
            if isinstance(repo, str) and repo:
                path = resolve_cached(hub, repo, file if isinstance(file, str) else None)
                if path is not None:
                    used.add(path)
    if not used:
        return models
    return {
        name: dataclasses.replace(spec, hidden=True)
        if spec.source == SOURCE_CACHE and resolve_cached(hub, name) in used
        else spec
        for name, spec in models.items()
    }


def _hide_folder_twins(models: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
    """A folder model whose file a preset of another name (the administrator's own) loads is
    hidden from the list, as ``dedup-cache-models`` hides a cache entry: one file was listed
    twice (issue 29). It stays usable by its name. Same file = same device, inode, size and
    time (a hard link too)."""
    presets = {
        spec.file_identity
        for spec in models.values()
        if spec.source == SOURCE_PRESET and spec.file_identity is not None
    }
    if not presets:
        return models
    return {
        name: dataclasses.replace(spec, hidden=True)
        if spec.source == SOURCE_MODELS_DIR and spec.file_identity in presets
        else spec
        for name, spec in models.items()
    }


def _with_global(spec: ModelSpec, global_layer: PresetLayer) -> ModelSpec:
    # llama.cpp's cascade(global, presets): the global values first, the model's own on top.
    if global_layer == _NO_LAYER:  # no [*] section: nothing to cascade (1000 copies saved)
        return spec
    return dataclasses.replace(
        spec.with_layer(global_layer), options=merge_options(global_layer.options, spec.options)
    )


_NO_LAYER = PresetLayer()


def _line(origin: str | None) -> int | None:
    if not origin:
        return None
    tail = origin.rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


_NAME_TAKEN = (
    "this node already has a model of that name (in its models dir or HF cache); a preset "
    "from the operator may not change it: give the ModelPreset another modelName"
)


def _clash(layer: PresetLayer, name: str, reason: str) -> Refusal:
    return Refusal(origin=layer.origin or "", reason=f"preset [{name}]: {reason}", models=(name,))


def _own_download(layer: PresetLayer, node_model: ModelSpec, hub: Path | None) -> bool:
    """Whether a restricted section over a cache model is that model's own download: its
    ``hf-repo`` (and ``hf-file``) resolve to the very file the cache lists under the name
    (the agent downloaded a ModelPreset named as the cache names it)."""
    if node_model.source != SOURCE_CACHE or node_model.cache_file is None:
        return False
    options = dict(layer.options)
    repo, file = options.get(_named("hf-repo")), options.get(_named("hf-file"))
    if not isinstance(repo, str) or not repo:
        return False
    found = resolve_cached(hub, repo, file if isinstance(file, str) else None)
    return found is not None and found == node_model.cache_file


def _alias_map_refusing(
    models: Mapping[str, ModelSpec], sections: Mapping[str, PresetLayer]
) -> tuple[dict[str, ModelSpec], dict[str, str], list[Refusal]]:
    """:func:`_alias_map` that refuses presets alone: the node's own models first, then the
    presets by name; a preset whose alias is a name or an alias already taken is refused
    alone, with its reason, instead of failing the whole catalog."""
    kept: dict[str, ModelSpec] = {}
    aliases: dict[str, str] = {}
    refused: list[Refusal] = []
    names = set(models)
    order = sorted(models, key=lambda n: (n in sections, n))  # scanned models first
    for name in order:
        spec = models[name]
        taken = None
        for alias in spec.aliases:
            if alias == name:
                continue
            if alias in names:
                whose = "another preset's model" if alias in sections else "a model this node has"
                taken = f"alias '{alias}' is already the name of {whose}"
            elif alias in aliases:
                taken = f"alias '{alias}' is already an alias of model '{aliases[alias]}'"
            if taken is not None:
                break
        if taken is not None and name in sections:
            refused.append(_clash(sections[name], name, taken))
            names.discard(name)
            continue
        kept[name] = spec
        for alias in spec.aliases:
            if alias != name and alias not in names:
                aliases.setdefault(alias, name)
    return dict(sorted(kept.items())), aliases, refused


def _alias_map(models: Mapping[str, ModelSpec]) -> dict[str, str]:
    # Same checks, and messages, as llama.cpp's server_models::add_model — but made whatever
    # the order, so a collision is reported on every start, not only in some scan orders.
    aliases: dict[str, str] = {}
    for name, spec in models.items():
        for alias in spec.aliases:
            if alias == name:
                continue
            if alias in models:
                raise ConfigError(
                    f"alias '{alias}' for model '{name}' conflicts with existing model name"
                )
            if alias in aliases:
                raise ConfigError(
                    f"alias '{alias}' for model '{name}' conflicts with alias of model "
                    f"'{aliases[alias]}'"
                )
            aliases[alias] = name
    return aliases


def diff_catalogs(old: Catalog, new: Catalog) -> CatalogDiff:
    """Compare two catalogs for a reload (llama.cpp compares each preset minus host, port
    and alias; Corral also keeps its agent-side settings out of the restart decision)."""
    added = tuple(n for n in new if n not in old)
    removed = tuple(n for n in old if n not in new)
    changed: list[str] = []
    updated: list[str] = []
    for name in new:
        if name not in old:
            continue
        before, after = old[name], new[name]
        if before == after:
            continue
        if _child_view(before) != _child_view(after):
            changed.append(name)
        else:
            updated.append(name)
    return CatalogDiff(added, removed, tuple(changed), tuple(updated))


def _file_identity(path: str | None) -> tuple[int, int, int, int] | None:
    """Which file ``path`` names right now (one stat: cheap even for 1,000 models)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None  # not there (yet): the load will say so
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _child_view(spec: ModelSpec) -> tuple[object, ...]:
    # What the child process sees or loads: its arguments (order-insensitive) and the files
    # (a new checksum or revision of the same URL or repository is a new file).
    options = sorted((k, str(v)) for k, v in spec.options if k not in CHILD_RESERVED)
    return (
        options,
        spec.model_path,
        spec.file_identity,
        spec.mmproj,
        spec.model_sha256,
        spec.hf_revision,
        sorted(spec.env),
    )
