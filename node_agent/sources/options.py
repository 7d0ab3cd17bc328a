"""llama-server's options: one lookup for preset keys, command-line flags and env names.

The data comes from the pinned binary's ``--help`` (``llama_options.py``, generated). The
rules follow llama.cpp (``common/preset.cpp``):

* a preset key is a flag without its dashes (``ctx-size``, ``c``, ``no-mmap``) or the option's
  env name (``LLAMA_ARG_CTX_SIZE``);
* an option's canonical name is its *last* positive flag without dashes (``to_args`` renders
  ``opt.args.back()``), so ``-c``/``--ctx-size``/``LLAMA_ARG_CTX_SIZE`` all mean ``ctx-size``;
* a negative form (``no-mmap = true``) sets the positive option to false.

Values are checked by the option's kind (from the ``--help`` value hint, see
``hack/gen-llama-options.py``) so that a mistake is reported where it was written, not when
the model loads. The checks accept everything llama-server takes, with one deliberate
exception: a number with trailing junk (``8k``, ``1.5`` for an integer), which llama.cpp's
``std::stoi``/``std::stof`` silently cut to their leading digits (``8k`` is 8).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

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
    """Negative flags with dashes (``("--no-mmap",)``); only flags have them."""
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
    """Lookups over a set of llama-server options."""

    def __init__(self, options: tuple[LlamaOption, ...]) -> None:
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
        """A command-line flag with its dashes (``-c``, ``--no-mmap``)."""
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
def llama_options() -> OptionTable:
    """The table of the pinned llama-server (built once)."""
    from node_agent.sources.llama_options import OPTIONS

    return OptionTable(tuple(LlamaOption(*row) for row in OPTIONS))


def parse_bool(value: str) -> bool | None:
    """llama.cpp's truthy/falsey words; None when the value is neither."""
    v = value.strip().lower()
    if v in TRUTHY:
        return True
    if v in FALSEY:
        return False
    return None
