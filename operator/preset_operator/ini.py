"""Presets → the INI text of llama.cpp's ``--models-preset`` (pure).

Format (what llama-server's router and Corral's agent read): ``[name]`` sections; keys are
llama-server long options without dashes (short forms are accepted too), plus the preset-only
keys ``alias``, ``load-on-startup``, ``stop-timeout``, ``ttl``, ``pin``, ``priority`` and, for
sources llama-server cannot express itself, ``hf-revision`` and ``model-sha256`` (see
operator/README.md, "Source keys"). Values are written with the agent's own ``ini_value``: as-is
where llama.cpp's grammar keeps them whole (so the file stays readable by llama-server too), as a
JSON string where they hold ``;``, ``#``, a line break or edge whitespace, which llama.cpp would
cut.
"""

from __future__ import annotations

from collections.abc import Iterable

from node_agent.sources.preset_env import ENV_PREFIX
from node_agent.sources.preset_ini import ini_value

from .presets import (
    HuggingFaceSource,
    InvalidPreset,
    LocalPathSource,
    Preset,
    PvcSource,
    UrlSource,
)

HEADER = "; Rendered by the corral operator from ModelPreset objects; edits are overwritten.\n"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def source_keys(preset: Preset) -> list[tuple[str, str]]:
    """The model arguments for the preset's source."""
    src = preset.source
    if isinstance(src, LocalPathSource):
        return [("model", src.path)]
    if isinstance(src, PvcSource):
        return [("model", src.path)]
    if isinstance(src, HuggingFaceSource):
        keys = [("hf-repo", src.repo)]
        if src.file is not None:
            keys.append(("hf-file", src.file))
        if src.revision is not None:
            keys.append(("hf-revision", src.revision))
        return keys
    if isinstance(src, UrlSource):
        # `model-url` is llama-server's own option; the agent intercepts it (with the checksum)
        # so the download lands in its cache, shows as `downloading`, and is verified.
        return [("model-url", src.url), ("model-sha256", src.sha256)]
    raise AssertionError(f"unknown source {src!r}")


def section_keys(preset: Preset) -> list[tuple[str, str]]:
    """All (key, value) pairs of one preset's section, in a fixed order."""
    keys = source_keys(preset)
    if preset.aliases:
        keys.append(("alias", ",".join(preset.aliases)))
    life = preset.lifecycle
    if life.load_on_startup is not None:
        keys.append(("load-on-startup", _bool(life.load_on_startup)))
    if life.stop_timeout is not None:
        keys.append(("stop-timeout", str(life.stop_timeout)))
    if life.ttl is not None:
        keys.append(("ttl", str(life.ttl)))
    if life.pin is not None:
        keys.append(("pin", _bool(life.pin)))
    if life.priority is not None:
        keys.append(("priority", str(life.priority)))
    taken = {k for k, _ in keys}
    for key, value in preset.options:
        if key in taken:
            # parse_args refuses reserved options, but e.g. `--ttl` in args would fight
            # spec.lifecycle.ttl; the spec's structured field wins and args may not repeat it.
            raise InvalidPreset(
                f"args set {key!r}, which spec.source, spec.aliases or spec.lifecycle sets"
            )
        keys.append((key, value))
    keys += [(ENV_PREFIX + name, value) for name, value in preset.env]
    return keys


def render_section(preset: Preset) -> str:
    lines = [f"; ModelPreset {preset.name}", f"[{preset.model_name}]"]
    lines += [f"{key} = {ini_value(value)}" for key, value in section_keys(preset)]
    return "\n".join(lines) + "\n"


def render_ini(presets: Iterable[Preset]) -> str:
    """One node's preset file: the sections of these presets, sorted by model name."""
    sections = [render_section(p) for p in sorted(presets, key=lambda p: p.model_name)]
    return HEADER + "".join("\n" + s for s in sections)
