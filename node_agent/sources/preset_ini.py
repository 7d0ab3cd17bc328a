"""``--models-preset`` INI files, read with llama.cpp's rules (``common/preset.cpp``).

Syntax, as llama.cpp's PEG grammar has it: ``[name]`` headers; ``key = value`` lines whose key
is ``[A-Za-z_][A-Za-z0-9_.-]*``; lines end at ``\r\n``, ``\n`` or ``\r``; ``;`` or ``#``
starts a comment anywhere, so a value ends at the first ``;``/``#``; surrounding whitespace is
dropped. Values are passed on as written: a relative ``model`` path is relative to the agent's
working directory, as in llama.cpp, not to the INI's folder.

One addition, in the operator's files only (a restricted ``policy``, see ``sources.trust``): a
value written as a JSON string, ``"…"`` with JSON's escapes, is that string — so ``#``, ``;``,
line breaks and edge whitespace survive (``ini_value`` writes it, and only for values that
need it, so the rest of the file still reads the same in llama.cpp). llama.cpp has no quoting
(its ``to_ini`` writes ``\\``-newline, which its own parser cannot read back) and keeps quotes
as part of the value, and so does Corral in the administrator's own INI.

Keys: llama-server flags without dashes, short forms or ``LLAMA_ARG_*`` names; ``no-x = true``
means ``x = false``; ``version`` is reserved and skipped. Preset-only keys: ``load-on-startup``,
``stop-timeout``, ``dedup-cache-models``, ``alias`` (comma-separated) and Corral's ``ttl``,
``pin``, ``priority``, ``model-sha256`` (64 hex digits: the agent downloads ``model-url``
itself and checks it) and ``hf-revision`` (the agent downloads ``hf-repo``/``hf-file`` at that
revision itself), each in the section that names that source (the operator renders those two
from a ModelPreset's ``url`` and ``huggingFace`` sources); ``env.NAME = value``, the model's
own environment (``sources.preset_env``: device and memory variables only).

Where llama.cpp is silent or lax, Corral refuses with file and line: an unknown key (llama.cpp
also refuses, without a line), a router-level key (llama.cpp silently drops it), a duplicate
section (llama.cpp silently keeps only the last), a key given twice, a key outside any section
(llama.cpp makes it a model named ``default``), a flag whose value is not a boolean, a value
that does not fit its option (``ctx-size = lots``: llama.cpp refuses it only when the model
loads; see ``LlamaOption.check``), and a non-numeric ``stop-timeout`` (llama.cpp warns and
uses 10).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from node_agent.durations import EXAMPLES, idle_seconds
from node_agent.errors import ConfigError
from node_agent.sources.options import llama_options, parse_bool
from node_agent.sources.preset_env import ENV_PREFIX, parse_env_entry
from node_agent.sources.spec import ROUTER_KEYS, OptionValue, PresetLayer
from node_agent.sources.trust import Restricted

GLOBAL_SECTION = "*"

T = TypeVar("T")

# Corral's own agent flags (config's table; a unit test keeps the two equal): a router
# setting's mistake, and its message.
AGENT_KEYS = frozenset(
    {
        "llama-server",
        "models-memory-margin",
        "memory-limit",
        "models-ttl",
        "load-timeout",
        "max-body-size",
        "max-download-size",
        "download-redirect-hosts",
        "queue-timeout",
        "max-queue",
        "shutdown-timeout",
        "client-timeout",
        "max-connections",
        "allowed-hosts",
        "peer",
        "peers-from-service",
        "kube-api",
        "log-level",
        "expect-gpus",
        "metrics-key-file",
        "event-loop",
        "max-child-errors",
        "peer-ca-file",
        "peer-server-name",
        "routing-metrics-port",
        "stream-gather",
        "warm-cache-size",
        "cpu-turns",
    }
)
# Preset-only keys, with llama.cpp's pseudo env names for the two it defines.
PRESET_ONLY = {
    "load-on-startup": "load-on-startup",
    "__PRESET_LOAD_ON_STARTUP": "load-on-startup",
    "stop-timeout": "stop-timeout",
    "__PRESET_STOP_TIMEOUT": "stop-timeout",
    "ttl": "ttl",
    "pin": "pin",
    "priority": "priority",
    "model-sha256": "model-sha256",
    "hf-revision": "hf-revision",
    "dedup-cache-models": "dedup-cache-models",
    "__PRESET_DEDUP_CACHE_MODELS": "dedup-cache-models",
}

_NEWLINE = re.compile(r"\r\n|\n|\r")
_JSON = json.JSONDecoder()
_HEADER = re.compile(r"\[\s*([^\]]*?)\s*\]\s*(?:[;#].*)?")
_KEY_VALUE = re.compile(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
# A git ref or commit as the Hub's resolve URL takes it; no '..' so it cannot climb the URL path.
_REVISION = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*")


@dataclass(frozen=True, slots=True)
class PresetFile:
    """A parsed preset file: the ``[*]`` layer and one layer per ``[name]`` section."""

    path: str
    global_layer: PresetLayer
    sections: dict[str, PresetLayer] = field(default_factory=dict)


@dataclass(slots=True)
class _Section:
    name: str
    line: int
    entries: list[tuple[str, str, int]] = field(default_factory=list)


def load_preset_file(path: str | Path, policy: Restricted | None = None) -> PresetFile:
    """Read and validate one INI file (ConfigError with file:line on any mistake).

    ``policy`` is None for the administrator's own file (every option allowed), else the
    restrictions of a preset that came from elsewhere (``sources.trust``)."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("preset file does not exist (--models-preset)", path=where) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read preset file: {e}", path=where) from e
    return parse_preset_text(text, where, policy)


def parse_preset_text(text: str, path: str, policy: Restricted | None = None) -> PresetFile:
    sections = _split_sections(text, path, quoted=policy is not None)
    global_layer = PresetLayer()
    layers: dict[str, PresetLayer] = {}
    for section in sections:
        layer = _interpret(section, path, policy)
        if section.name == GLOBAL_SECTION:
            global_layer = layer
        else:
            layers[section.name] = dataclasses.replace(layer, preset_hash=_hash(section))
    return PresetFile(path=path, global_layer=global_layer, sections=layers)


def section_hashes(text: str, path: str) -> dict[str, str]:
    """Each ``[name]`` section's hash, as an agent computes it reading the operator's file
    (JSON-quoted values): the operator's expectation of what its agents report."""
    return {
        section.name: _hash(section)
        for section in _split_sections(text, path, quoted=True)
        if section.name != GLOBAL_SECTION
    }


def _hash(section: _Section) -> str:
    """A section's keys and values as read, in order (12 hex digits): the agent reports it
    for the child it runs (``corral.preset_hash``), so whoever wrote the file can tell which
    version a node serves."""
    pairs = [[key, value] for key, value, _ in section.entries]
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:12]


def _split_sections(text: str, path: str, *, quoted: bool) -> list[_Section]:
    sections: list[_Section] = []
    by_name: dict[str, _Section] = {}
    current: _Section | None = None
    # llama.cpp's newlines only (str.splitlines also splits at \x0b, \x85, \u2028…).
    for number, raw in enumerate(_NEWLINE.split(text), start=1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            m = _HEADER.fullmatch(line)
            if m is None or not m.group(1):
                raise ConfigError(f"malformed section header {line!r}", path=path, line=number)
            name = m.group(1)
            if name in by_name:
                first = by_name[name].line
                raise ConfigError(
                    f"section [{name}] appears twice (first at line {first}); merge them",
                    path=path,
                    line=number,
                )
            current = _Section(name, number)
            by_name[name] = current
            sections.append(current)
            continue
        m = _KEY_VALUE.fullmatch(line)
        if m is None:
            raise ConfigError(
                f"cannot parse {line!r}: expected '[name]' or 'key = value'", path=path, line=number
            )
        if current is None:
            raise ConfigError(
                f"key {m.group(1)!r} is outside any section: put it under [*] (all models) "
                "or under [model-name]",
                path=path,
                line=number,
            )
        value = _value(m.group(2), path, number, quoted=quoted)
        current.entries.append((m.group(1), value, number))
    return sections


def _value(text: str, path: str, line: int, *, quoted: bool) -> str:
    """A value as written after ``=``: where ``quoted``, a JSON string literal is decoded;
    anything else ends, as llama.cpp's grammar has it, at the first ';' or '#', whitespace
    before it dropped."""
    if not quoted or not text.startswith('"'):
        return re.split(r"[;#]", text, maxsplit=1)[0].rstrip()
    try:
        value, end = _JSON.raw_decode(text)
    except json.JSONDecodeError:
        value, end = None, 0
    rest = text[end:].strip(" \t")
    if not isinstance(value, str) or (rest and rest[0] not in ";#"):
        raise ConfigError(
            f"cannot read the quoted value {text!r}: a value that starts with '\"' must be one "
            'JSON string ("…" with \\ escapes), optionally followed by a comment',
            path=path,
            line=line,
        )
    return value


def ini_value(value: str) -> str:
    """``value`` as an INI value that reads back exactly: as written when llama.cpp's grammar
    keeps it whole, else as a JSON string (see the module's docstring)."""
    plain = (
        value == value.strip()  # the parser drops what Python calls whitespace at both ends
        and not value.startswith('"')
        and not any(c in value for c in ";#\r\n")
    )
    return value if plain else json.dumps(value)


def _interpret(section: _Section, path: str, policy: Restricted | None) -> PresetLayer:
    table = llama_options()
    options: dict[str, OptionValue] = {}
    env: dict[str, str] = {}
    extras: dict[str, object] = {}
    seen: dict[str, tuple[str, int]] = {}
    where = f"[{section.name}]"

    def once(canonical: str, key: str, line: int) -> None:
        if canonical in seen:
            first_key, first_line = seen[canonical]
            raise ConfigError(
                f"{key!r} in {where} sets {canonical!r} again "
                f"(already set by {first_key!r} at line {first_line})",
                path=path,
                line=line,
            )
        seen[canonical] = (key, line)

    def refuse_restricted(canonical: str, value: str, key: str, line: int) -> None:
        if policy is None:
            return
        why = policy.refusal(canonical, value)
        if why is not None:
            raise ConfigError(f"{key!r} in {where}: {why}", path=path, line=line)

    for key, value, line in section.entries:
        if key == "version":  # reserved by llama.cpp for future use
            continue
        if key.startswith(ENV_PREFIX):
            # One allow-list for every preset, restricted or not (sources.preset_env).
            once(key, key, line)
            name, text = parse_env_entry(key, value, where, path=path, line=line)
            env[name] = text
            continue
        if key in PRESET_ONLY:
            name = PRESET_ONLY[key]
            refuse_restricted(name, value, key, line)
            once(name, key, line)
            extras[name] = _preset_only_value(name, value, key, where, path, line)
            continue
        match = table.key(key)
        if match is None:
            raise ConfigError(_unknown_key_message(key, where), path=path, line=line)
        opt = match.option
        if opt.name in ROUTER_KEYS:
            raise ConfigError(
                f"{key!r} in {where} is a router setting, not a per-model one: "
                f"give --{opt.name} on the agent's command line instead",
                path=path,
                line=line,
            )
        refuse_restricted(opt.name, value, key, line)
        once(opt.name, key, line)
        if opt.name == "alias":
            extras["alias"] = tuple(a.strip() for a in value.split(",") if a.strip())
        elif opt.is_flag:
            flag = parse_bool(value)
            if flag is None:
                raise ConfigError(
                    f"{key!r} in {where} is a flag: expected true/false (on/off, 1/0), "
                    f"got {value!r}",
                    path=path,
                    line=line,
                )
            options[opt.name] = flag != match.negated
        elif opt.nargs > 1:
            raise ConfigError(
                f"{key!r} in {where} takes {opt.nargs} values, which presets cannot express "
                "(llama.cpp refuses it too); give it on the command line",
                path=path,
                line=line,
            )
        elif not value:
            raise ConfigError(f"{key!r} in {where} needs a value", path=path, line=line)
        elif (expected := opt.check(value)) is not None:
            raise ConfigError(
                f"{key!r} in {where} expects {expected}, got {value!r}", path=path, line=line
            )
        else:
            options[opt.name] = value

    _check_pins(section, seen, path)
    if policy is not None and "model-url" in seen and "model-sha256" not in seen:
        key, line = seen["model-url"]
        raise ConfigError(
            f"{key!r} in {where} needs 'model-sha256': a restricted preset's download must be "
            "checked by the agent",
            path=path,
            line=line,
        )
    aliases = extras.get("alias")
    return PresetLayer(
        options=tuple(options.items()),
        aliases=aliases if isinstance(aliases, tuple) else None,
        load_on_startup=_get(extras, "load-on-startup", bool),
        stop_timeout=_get(extras, "stop-timeout", float),
        ttl=_get(extras, "ttl", float),
        pin=_get(extras, "pin", bool),
        priority=_get(extras, "priority", int),
        model_sha256=_get(extras, "model-sha256", str),
        hf_revision=_get(extras, "hf-revision", str),
        dedup_cache_models=_get(extras, "dedup-cache-models", bool),
        origin=f"{path}:{section.line}",
        env=tuple(env.items()),
    )


# Corral's pinning keys and the source each one pins, all in one section: a hash or revision
# names one file, so it means nothing in [*], nor without the source it checks.
_PINS = {"model-sha256": ("model-url",), "hf-revision": ("hf-repo", "hf-file")}


def _check_pins(section: _Section, seen: dict[str, tuple[str, int]], path: str) -> None:
    for pin, needs in _PINS.items():
        if pin not in seen:
            continue
        key, line = seen[pin]
        if section.name == GLOBAL_SECTION:
            raise ConfigError(
                f"{key!r} pins one model's file: put it in that model's section, not [*]",
                path=path,
                line=line,
            )
        missing = [n for n in needs if n not in seen]
        if missing:
            raise ConfigError(
                f"{key!r} in [{section.name}] needs {' and '.join(repr(n) for n in needs)} "
                f"in the same section (missing {', '.join(repr(n) for n in missing)})",
                path=path,
                line=line,
            )


def _get(extras: dict[str, object], name: str, kind: type[T]) -> T | None:
    value = extras.get(name)
    return value if isinstance(value, kind) else None


def _unknown_key_message(key: str, where: str) -> str:
    if key in AGENT_KEYS:
        return (
            f"{key!r} in {where} is an agent setting, not a per-model one: "
            f"give --{key} on the agent's command line instead"
        )
    # The closer of the two pools: 'model-sha265' must not get llama-server's 'models-max'.
    table = llama_options()
    hints = [h for h in (table.suggest(key), _closest_preset_only(key)) if h]
    hint = max(hints, key=lambda h: difflib.SequenceMatcher(None, key, h).ratio(), default=None)
    tail = f"; did you mean {hint!r}?" if hint else ""
    return (
        f"unknown key {key!r} in {where}: not a preset key, nor an option of {table.origin}{tail}"
    )


def _closest_preset_only(key: str) -> str | None:
    close = difflib.get_close_matches(key, list(PRESET_ONLY), n=1, cutoff=0.6)
    return close[0] if close else None


def _preset_only_value(
    name: str, value: str, key: str, where: str, path: str, line: int
) -> bool | float | int | str:
    def bad(expected: str) -> ConfigError:
        return ConfigError(
            f"{key!r} in {where} expects {expected}, got {value!r}", path=path, line=line
        )

    if name in ("load-on-startup", "pin", "dedup-cache-models"):
        flag = parse_bool(value)
        if flag is None:
            raise bad("true or false")
        return flag
    if name == "model-sha256":
        if not _SHA256.fullmatch(value):
            raise bad("the file's SHA-256 as 64 hex digits")
        return value.lower()  # hashlib's hexdigest() is lower-case
    if name == "hf-revision":
        if not _REVISION.fullmatch(value) or ".." in value:
            raise bad("a commit, branch or tag name")
        return value
    if name == "priority":
        try:
            return int(value)
        except ValueError:
            raise bad("an integer") from None
    if name == "ttl":
        try:
            seconds = idle_seconds(value)
        except ValueError:
            raise bad(EXAMPLES) from None
        return 0.0 if seconds is None else seconds  # a preset's ttl 0 is "never" too
    try:
        number = float(value)
    except ValueError:
        raise bad("a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise bad("a number of seconds >= 0")
    return number
