"""llama-server's options: one lookup for preset keys, command-line flags and env names.

The data comes from the pinned binary's ``--help`` (``llama_options.py``, generated). The
rules follow llama.cpp (``common/preset.cpp``):

* a preset key is a flag without its dashes (``ctx-size``, ``c``, ``no-mmap``) or the option's
  env name (``LLAMA_ARG_CTX_SIZE``);
* an option's canonical name is its *last* positive flag without dashes (``to_args`` renders
  ``opt.args.back()``), so ``-c``/``--ctx-size``/``LLAMA_ARG_CTX_SIZE`` all mean ``ctx-size``;
* a negative form (``no-mmap = true``) sets the positive option to false.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

# llama.cpp's common_arg_utils::is_truthy / is_falsey.
TRUTHY = frozenset({"on", "enabled", "true", "1"})
FALSEY = frozenset({"off", "disabled", "false", "0"})


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

    @property
    def name(self) -> str:
        """Canonical name: the last positive flag without dashes."""
        return self.flags[-1].lstrip("-")

    @property
    def is_flag(self) -> bool:
        return self.nargs == 0

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

    return OptionTable(tuple(LlamaOption(f, n, e, k) for f, n, e, k in OPTIONS))


def parse_bool(value: str) -> bool | None:
    """llama.cpp's truthy/falsey words; None when the value is neither."""
    v = value.strip().lower()
    if v in TRUTHY:
        return True
    if v in FALSEY:
        return False
    return None
