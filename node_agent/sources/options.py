"""llama-server's options: one lookup for preset keys, command-line flags and env names.

The data comes from the ``--help`` of the binary in use (:func:`use_options_of`, once at the
agent's start), else from the pinned binary's (``llama_options.py``, generated). The rules
follow llama.cpp (``common/preset.cpp``):

* a preset key is a flag without its dashes (``ctx-size``, ``c``, ``no-repack``) or the option's
  env name (``LLAMA_ARG_CTX_SIZE``);
* an option's canonical name is its *last* positive flag without dashes (``to_args`` renders
  ``opt.args.back()``), so ``-c``/``--ctx-size``/``LLAMA_ARG_CTX_SIZE`` all mean ``ctx-size``;
* a negative form (``no-repack = true``) sets the positive option to false.

Values are checked by the option's kind (from the ``--help`` value hint, see
``hack/gen-llama-options.py``) so that a mistake is reported where it was written, not when
the model loads. The checks accept everything llama-server takes, with one deliberate
exception: a number with trailing junk (``8k``, ``1.5`` for an integer), which llama.cpp's
``std::stoi``/``std::stof`` silently cut to their leading digits (``8k`` is 8).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from node_agent.llama_server.answers import Answers
from node_agent.llama_server.binary import build_info
from node_agent.llama_server.plan import LLAMA_CPP_BUILD
from node_agent.sources.help_text import parse_help

log = logging.getLogger(__name__)
HELP_TIMEOUT = 30.0

# llama.cpp's common_arg_utils::is_truthy / is_falsey.
TRUTHY = frozenset({"on", "enabled", "true", "1"})
FALSEY = frozenset({"off", "disabled", "false", "0"})
# ... and is_autoy: an [on|off|auto] option takes all of these.
AUTOY = frozenset({"auto", "-1"})
_SYNONYMS = {"on": TRUTHY, "off": FALSEY, "auto": AUTOY}

# Value kinds, as the generated table records them.
KINDS = ("flag", "integer", "number", "path", "choice", "text")
_INTEGER = re.compile(r"[+-]?[0-9]+")
# What std::stof reads in full: decimals with an exponent, hex floats, inf and nan.
_NUMBER = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
    r"|0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
    r"|(?i:inf|infinity|nan))"
)


@dataclass(frozen=True, slots=True)
class LlamaOption:
    """One llama-server option as ``--help`` prints it."""

    flags: tuple[str, ...]
    """Positive flags with dashes, as printed (``("-c", "--ctx-size")``)."""
    negatives: tuple[str, ...]
    """Negative flags with dashes (``("--no-repack",)``); only flags have them."""
    env: str | None
    nargs: int
    """0 for a flag, 1 for an option with a value, 2 for the rare two-value option."""
    kind: str = "text"
    """One of ``KINDS``: what the value must be (``text`` and ``path`` take anything)."""
    choices: tuple[str, ...] = ()
    """A ``choice``'s values; for an ``integer``, words it takes besides numbers (``auto``)."""
    default: str | None = None
    """The default ``--help`` shows, when it is a plain value."""

    @property
    def name(self) -> str:
        """Canonical name: the last positive flag without dashes."""
        return self.flags[-1].lstrip("-")

    @property
    def is_flag(self) -> bool:
        return self.nargs == 0

    def accepted(self) -> frozenset[str]:
        """The words a ``choice`` takes, or an ``integer`` besides numbers.

        llama.cpp reads ``[on|off|auto]`` with is_truthy/is_falsey/is_autoy, so ``on`` also
        means ``true``, ``enabled`` and ``1``; ``{none,linear,yarn}`` values are exact.
        """
        words = set(self.choices)
        if self.kind == "choice":
            for word in self.choices:
                words |= _SYNONYMS.get(word, frozenset())
        return frozenset(words)

    def expects(self) -> str:
        """What a value must be, for messages: ``an integer``, ``one of 'on', 'off'``."""
        listed = ", ".join(repr(c) for c in self.choices)
        if self.kind == "integer":
            return f"an integer or one of {listed}" if self.choices else "an integer"
        if self.kind == "number":
            return "a number"
        if self.kind == "choice":
            synonyms = " (or true/false, 1/0)" if {"on", "off"} <= set(self.choices) else ""
            return f"one of {listed}{synonyms}"
        return "a value"

    def check(self, value: str) -> str | None:
        """None when ``value`` fits this option's kind, else what it expects (``expects``).

        Text and paths are not checked; numbers may have surrounding whitespace, as
        std::stoi/stof skip it.
        """
        if self.kind == "integer":
            if _INTEGER.fullmatch(value.strip()) or value in self.accepted():
                return None
        elif self.kind == "number":
            if _NUMBER.fullmatch(value.strip()):
                return None
        elif self.kind == "choice":
            if value in self.accepted():
                return None
        else:
            return None
        return self.expects()

    def render(self, value: str | bool) -> tuple[str, ...]:
        """Command-line words for ``value`` (llama.cpp's ``common_preset::to_args``)."""
        if self.is_flag:
            if value is True:
                return (self.flags[-1],)
            # A false flag without a negative form is simply left out, as llama.cpp does.
            return (self.negatives[-1],) if self.negatives else ()
        assert isinstance(value, str)
        return (self.flags[-1], value)


@dataclass(frozen=True, slots=True)
class Match:
    """A key or flag resolved to its option; ``negated`` when it was a ``no-`` form."""

    option: LlamaOption
    negated: bool


class OptionTable:
    """Lookups over a set of llama-server options; ``origin`` names the binary they are of."""

    def __init__(self, options: tuple[LlamaOption, ...], origin: str) -> None:
        self.origin = origin
        self._options = options
        self._by_key: dict[str, Match] = {}
        self._by_flag: dict[str, Match] = {}
        self._by_name: dict[str, LlamaOption] = {}
        for opt in options:
            self._by_name[opt.name] = opt
            for flag in opt.flags:
                self._by_flag[flag] = Match(opt, False)
                self._by_key[flag.lstrip("-")] = Match(opt, False)
            for flag in opt.negatives:
                self._by_flag[flag] = Match(opt, True)
                self._by_key[flag.lstrip("-")] = Match(opt, True)
            if opt.env is not None:
                self._by_key[opt.env] = Match(opt, False)

    def __iter__(self) -> Iterator[LlamaOption]:
        return iter(self._options)

    def key(self, key: str) -> Match | None:
        """A preset key: a flag without dashes, or an env name."""
        return self._by_key.get(key)

    def flag(self, flag: str) -> Match | None:
        """A command-line flag with its dashes (``-c``, ``--no-repack``)."""
        return self._by_flag.get(flag)

    def named(self, name: str) -> LlamaOption:
        """The option with this canonical name (KeyError if none)."""
        return self._by_name[name]

    def suggest(self, key: str) -> str | None:
        """The closest known preset key, for "did you mean" messages."""
        close = difflib.get_close_matches(key, self._by_key.keys(), n=1, cutoff=0.6)
        return close[0] if close else None

    def suggest_flag(self, flag: str, extra: Iterable[str] = ()) -> str | None:
        """The closest known flag, also among ``extra`` (the agent's own flags)."""
        pool = [*self._by_flag, *extra]
        close = difflib.get_close_matches(flag, pool, n=1, cutoff=0.6)
        return close[0] if close else None


@functools.cache
def generated_options() -> OptionTable:
    """The table of llama-server b11434 (``llama_options.py``, built once)."""
    from node_agent.sources.llama_options import OPTIONS

    origin = f"llama-server b{LLAMA_CPP_BUILD} (Corral's built-in table)"
    return OptionTable(tuple(LlamaOption(*row) for row in OPTIONS), origin)


_in_use: OptionTable | None = None


def llama_options() -> OptionTable:
    """The options of the llama-server in use: its own ``--help`` once :func:`use_options_of`
    read it, else the pinned binary's generated table."""
    return _in_use if _in_use is not None else generated_options()


def use_options_of(binary: Path, version: str) -> OptionTable:
    """Read ``binary --help`` and make it the table every later lookup uses.

    Called once at the agent's start, before any flag or preset is read: a user who brings a
    newer or older llama-server gets that binary's options, not the pinned one's. Where its
    ``--help`` cannot be read or parsed, the generated table stays, with a warning.
    """
    global _in_use
    try:
        origin = f"llama-server {build_info(version)} ({binary})"
        _in_use = OptionTable(_read_help(binary, *_file_identity(binary)), origin)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning(
            "cannot read the options of %s from its --help (%s): using those of %s",
            binary,
            exc,
            generated_options().origin,
        )
        _in_use = None
    return llama_options()


def _file_identity(binary: Path) -> tuple[int, int]:
    stat = binary.stat()
    return stat.st_size, stat.st_mtime_ns


def read_options_early(binary: Path, answers: Answers | None = None) -> None:
    """Read ``binary``'s options now (from a thread, while ``--version`` runs): the start waits
    for one child process instead of two, and none where ``answers`` kept its ``--help``. A
    failure is left for :func:`use_options_of`."""
    if answers is not None:
        _help_texts[binary] = answers
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        _read_help(binary, *_file_identity(binary))


# The kept answers to read a binary's --help from (set by read_options_early).
_help_texts: dict[Path, Answers] = {}


@functools.cache
def _read_help(binary: Path, size: int, mtime_ns: int) -> tuple[LlamaOption, ...]:
    """One binary's options; cached by path, size and mtime (a replaced binary is read anew)."""

    def ask() -> str:
        done = subprocess.run(
            [str(binary), "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=HELP_TIMEOUT,
            check=True,
        )
        return done.stdout

    answers = _help_texts.get(binary)
    text = ask() if answers is None else answers.remembered("help", ask, _some_options)
    rows = parse_help(text)
    if not rows:
        raise ValueError("it listed no options")
    return tuple(LlamaOption(*row) for row in rows)


def _some_options(answer: object) -> bool:
    return isinstance(answer, str) and bool(answer)  # (parsed next: one that is not, raises)


def parse_bool(value: str) -> bool | None:
    """llama.cpp's truthy/falsey words; None when the value is neither."""
    v = value.strip().lower()
    if v in TRUTHY:
        return True
    if v in FALSEY:
        return False
    return None
