"""Reading a llama-server's ``--help`` into option rows (the agent's option table).

``--help`` prints each ``common_arg`` as ``args..., args_neg... VALUE_HINT`` padded to column
40, then its help text indented by 40 columns with an ``(env: NAME)`` line. The agent reads the
``--help`` of the binary it runs (options drift with every llama.cpp build); the table committed
in ``llama_options.py`` is generated from the pinned binary by the same parser
(``hack/gen-llama-options.py``), for when no binary can be asked (the operator).

Each option's value kind comes from its value hint and help text (see ``value_kind``); when
in doubt the kind is ``text``, which accepts anything, because refusing a value llama-server
would take is worse than letting a wrong one through to llama-server's own check.
"""

from __future__ import annotations

import re

SPEC_COLUMN = 40  # llama.cpp pads the option column to 40 characters (arg.cpp: to_string)
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
_NAME = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_.-]*")

# Value kinds (node_agent/sources/options.py checks values by them).
# Hints llama.cpp reads with std::stoi/stoul: N (unless a number, below), and these.
INTEGER_HINTS = frozenset({"N", "INDEX", "SEED", "PORT", "SECONDS", "<0|1>"})
_INT_RANGE = re.compile(r"<-?\d+\.\.\.-?\d+>")  # <0...100>
# Hints llama.cpp reads with std::stof.
NUMBER_HINTS = frozenset({"P", "SIMILARITY"})
# `N` options read with std::stof whose help shows no float default to tell them apart.
NUMBER_OPTIONS = frozenset({"--rope-scale", "--rope-freq-base", "--rope-freq-scale"})
# Options whose hint says more than llama.cpp checks: deprecated --defrag-thold ignores its value.
TEXT_OPTIONS = frozenset({"--defrag-thold"})
PATH_HINTS = frozenset({"PATH", "FNAME", "FILE"})
_BRACES = re.compile(r"\{([a-z0-9_+-]+(?:,[a-z0-9_+-]+)+)\}")  # {none,linear,yarn}
_BRACKETS = re.compile(r"\[([a-z]+(?:\|[a-z]+)+)\]")  # [on|off|auto]
_ALLOWED = re.compile(r"^allowed values: ([A-Za-z0-9_]+(?:, [A-Za-z0-9_]+)*)$")
_QUOTED_WORD = re.compile(r"'([a-z]+)'")
_FLOAT = re.compile(r"-?\d*\.\d+")
# Words a default may be that mean "not set" rather than a value.
_NOT_A_VALUE = frozenset({"unused", "disabled", "none"})


def split_spec(line: str) -> tuple[str, str]:
    """The option column and the start of the help text of one option's first line."""
    if len(line) > SPEC_COLUMN and line[SPEC_COLUMN - 2 : SPEC_COLUMN] == "  ":
        return line[:SPEC_COLUMN].strip(), line[SPEC_COLUMN:]
    return line.strip(), ""


def parse_spec(spec: str) -> tuple[list[str], str | None]:
    """``-c,    --ctx-size N`` -> (["-c", "--ctx-size"], "N")."""
    names: list[str] = []
    rest = spec
    while True:
        m = _NAME.match(rest)
        if m is None:
            raise ValueError(f"cannot parse option column {spec!r}")
        names.append(m.group(0))
        rest = rest[m.end() :]
        if rest.startswith(","):
            rest = rest[1:].lstrip()
            if rest.startswith("-"):
                continue
            raise ValueError(f"dangling comma in {spec!r}")
        hint = rest.strip()
        return names, hint or None


def is_negative(name: str) -> bool:
    # llama.cpp spells negatives --no-x, and their short forms -nX / -no-x (-nr, -nkvo, -nocb).
    return name.startswith("--no-") or (not name.startswith("--") and name.startswith("-n"))


def split_negatives(names: list[str], hint: str | None) -> tuple[list[str], list[str]]:
    """``to_string`` prints args then args_neg; find where the negatives begin.

    Only a flag that also has a positive long name can have negatives: ``--no-host`` alone is
    a positive flag named ``no-host``.
    """
    if hint is not None or not any(n.startswith("--") and not is_negative(n) for n in names):
        return names, []
    first_neg = next((i for i, n in enumerate(names) if is_negative(n)), len(names))
    pos, neg = names[:first_neg], names[first_neg:]
    if neg and not all(is_negative(n) for n in neg):
        raise ValueError(f"negatives are not a suffix in {names}")
    return pos, neg


def nargs(hint: str | None) -> int:
    if hint is None:
        return 0
    # Two-value options (value_hint_2) print as "START END"; llama.cpp presets refuse them.
    return 2 if re.fullmatch(r"[A-Z_]+ [A-Z_]+", hint) else 1


def help_default(body: str) -> str | None:
    """The value after ``default:`` in an option's help, when it is one plain word.

    ``(default: 0, 0 = loaded from model)`` -> ``0``; ``(default: 'auto')`` -> ``auto``;
    ``(default: same as --threads)`` -> None (a phrase, not a value).
    """
    m = re.search(r"default: ?(.*)", body)
    if m is None:
        return None
    text = m.group(1)
    for stop in (")", " (", "; "):
        text = text.split(stop, 1)[0]
    head, sep, tail = text.partition(", ")
    if sep and (" = " in tail or " - " in tail or tail.startswith("use ")):
        text = head  # "-1, -1 = infinity": the rest describes the value
    text = text.split(" = ", 1)[0].strip().strip("'\"")
    if not text or any(c.isspace() for c in text) or text.startswith("--"):
        return None
    return text


def value_kind(names: list[str], hint: str | None, lines: list[str]) -> tuple[str, tuple[str, ...]]:
    """(kind, choices) for one option; kinds as in ``node_agent.sources.options.KINDS``.

    ``integer`` may list extra words (``-ngl``: ``auto``, ``all``); ``choice`` lists the values.
    """
    if hint is None:
        return "flag", ()
    if nargs(hint) != 1 or any(n in TEXT_OPTIONS for n in names):
        return "text", ()
    body = " ".join(lines)
    allowed = [m.group(1) for ln in lines if (m := _ALLOWED.match(ln.strip()))]
    if allowed:  # -ctk TYPE: "allowed values: f32, f16, ..." (kv_cache_type_from_str)
        return "choice", tuple(allowed[0].split(", "))
    if (m := _BRACES.fullmatch(hint)) or (m := _BRACKETS.fullmatch(hint)):
        return "choice", tuple(re.split(r"[,|]", m.group(1)))
    if hint in NUMBER_HINTS:
        return "number", ()
    if hint == "N":
        default = help_default(body)
        if any(n in NUMBER_OPTIONS for n in names) or (default and _FLOAT.fullmatch(default)):
            return "number", ()
        # "either an exact number, 'auto', or 'all'" (-ngl): those words are values too.
        return "integer", tuple(dict.fromkeys(_QUOTED_WORD.findall(body)))
    if hint in INTEGER_HINTS or _INT_RANGE.fullmatch(hint):
        return "integer", ()
    if hint in PATH_HINTS or hint.endswith("_FILE"):
        return "path", ()
    return "text", ()


Row = tuple[tuple[str, ...], tuple[str, ...], str | None, int, str, tuple[str, ...], str | None]


def parse_help(text: str) -> list[Row]:
    blocks: list[tuple[list[str], str | None, list[str]]] = []
    seen: set[str] = set()
    for line in text.splitlines():
        if line.startswith("-----") or not line.strip():
            continue
        if line.startswith("-"):
            spec, rest = split_spec(line)
            names, hint = parse_spec(spec)
            for n in names:
                if n in seen:
                    raise ValueError(f"option {n} listed twice")
                seen.add(n)
            blocks.append((names, hint, [rest] if rest.strip() else []))
        elif blocks:
            blocks[-1][2].append(line.strip())
    rows: list[Row] = []
    for names, hint, lines in blocks:
        pos, neg = split_negatives(names, hint)
        envs = [m.group(1) for ln in lines if (m := _ENV.search(ln))]
        kind, choices = value_kind(names, hint, lines)
        default = help_default(" ".join(lines)) if kind != "flag" else None
        if default in _NOT_A_VALUE and default not in choices:
            default = None
        rows.append(
            (
                tuple(pos),
                tuple(neg),
                envs[-1] if envs else None,
                nargs(hint),
                kind,
                choices,
                default,
            )
        )
    return rows
