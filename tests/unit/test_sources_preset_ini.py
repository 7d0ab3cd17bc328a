"""--models-preset INI files: llama.cpp's syntax and keys, Corral's stricter errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.errors import ConfigError
from node_agent.sources.preset_ini import load_preset_file, parse_preset_text


def parse(text: str):  # type: ignore[no-untyped-def]
    return parse_preset_text(text, "p.ini")


def test_sections_keys_comments_and_global() -> None:
    ini = parse(
        "; a comment\n"
        "# another\n"
        "[*]\n"
        "c = 1024   ; inline comment\n"
        "\n"
        "[qwen]\n"
        "model = /m/qwen.gguf\n"
        "ngl=99\n"
        "LLAMA_ARG_N_PARALLEL = 2\n"
        'chat-template = "chatml"\n'
        "version = 1\n"
    )
    assert ini.global_layer.options == (("ctx-size", "1024"),)
    qwen = ini.sections["qwen"]
    assert dict(qwen.options) == {
        "model": "/m/qwen.gguf",
        "n-gpu-layers": "99",
        "parallel": "2",
        "chat-template": '"chatml"',  # no quoting in llama.cpp's grammar: quotes are kept
    }
    assert qwen.origin == "p.ini:6"


def test_value_ends_at_first_comment_character() -> None:
    # llama.cpp's grammar: ';' or '#' anywhere ends the value.
    ini = parse("[m]\nmodel = /a#b.gguf\nchat-template = x;y\n")
    assert dict(ini.sections["m"].options) == {"model": "/a", "chat-template": "x"}


def test_negated_flags_and_booleans() -> None:
    ini = parse("[m]\nno-repack = true\ncont-batching = off\nno-warmup = false\nmetrics = 1\n")
    assert dict(ini.sections["m"].options) == {
        "repack": False,
        "cont-batching": False,
        "warmup": True,
        "metrics": True,
    }


def test_preset_only_keys() -> None:
    ini = parse(
        "[m]\nmodel = x.gguf\nload-on-startup = true\nstop-timeout = 2.5\n"
        "alias = a, b ,, c\nttl = 300\npin = on\npriority = -3\n"
    )
    m = ini.sections["m"]
    assert m.load_on_startup is True
    assert m.stop_timeout == 2.5
    assert m.aliases == ("a", "b", "c")
    assert (m.ttl, m.pin, m.priority) == (300.0, True, -3)
    assert dict(m.options) == {"model": "x.gguf"}  # alias is not a child option


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "[m]\nctx-sise = 1\n",
            2,
            "unknown key 'ctx-sise' in [m]: not a preset key, nor an option of "
            "llama-server b11434 (Corral's built-in table); did you mean 'ctx-size'?",
        ),
        (
            "[m]\nmodels-max = 2\n",
            2,
            "'models-max' in [m] is a router setting, not a per-model "
            "one: give --models-max on the agent's command line instead",
        ),
        ("[*]\nport = 1\n", 2, "router setting"),
        ("[m]\nLLAMA_API_KEY = k\n", 2, "give --api-key on the agent's command line"),
        ("[m]\nmodels-memory-margin = 1\n", 2, "is an agent setting"),
        ("[m]\nc = 1\n[n]\nc = 2\n[m]\nc = 3\n", 5, "section [m] appears twice (first at line 1)"),
        (
            "[m]\nc = 1\nctx-size = 2\n",
            3,
            "'ctx-size' in [m] sets 'ctx-size' again (already set by 'c' at line 2)",
        ),
        ("c = 1\n[m]\n", 1, "key 'c' is outside any section: put it under [*]"),
        (
            "[m]\nstop-timeout = soon\n",
            2,
            "'stop-timeout' in [m] expects a number of seconds, got 'soon'",
        ),
        ("[m]\nstop-timeout = -1\n", 2, "a number of seconds >= 0"),
        ("[m]\npriority = high\n", 2, "expects an integer"),
        ("[m]\nload-on-startup = yes\n", 2, "expects true or false, got 'yes'"),
        ("[m]\nrepack = maybe\n", 2, "'repack' in [m] is a flag: expected true/false"),
        ("[m]\nc =\n", 2, "'c' in [m] needs a value"),
        ("[m]\nc = lots\n", 2, "'c' in [m] expects an integer, got 'lots'"),
        ("[m]\nLLAMA_ARG_CTX_SIZE = 8k\n", 2, "'LLAMA_ARG_CTX_SIZE' in [m] expects an integer"),
        ("[*]\ntemp = hot\n", 2, "'temp' in [*] expects a number, got 'hot'"),
        # Quotes are part of the value, so a quoted number is not a number (llama.cpp agrees).
        ('[m]\ntemp = "0.5"\n', 2, "'temp' in [m] expects a number, got '\"0.5\"'"),
        ("[m]\nflash-attn = yes\n", 2, "expects one of 'on', 'off', 'auto' (or true/false"),
        ("[m]\nngl = most\n", 2, "'ngl' in [m] expects an integer or one of 'auto', 'all'"),
        ("[m]\nsplit-mode = rows\n", 2, "one of 'none', 'layer', 'row', 'tensor', got 'rows'"),
        ("[m]\ncontrol-vector-layer-range = 1 2\n", 2, "takes 2 values"),
        ("[m]\n--ctx-size = 1\n", 2, "cannot parse '--ctx-size = 1'"),
        ("[m\n", 1, "malformed section header"),
        ("[]\n", 1, "malformed section header"),
    ],
)
def test_errors_name_file_line_and_key(text: str, line: int, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(text)
    assert err.value.path == "p.ini"
    assert err.value.line == line
    assert str(err.value).startswith(f"p.ini:{line}: ")
    assert message in str(err.value)


def test_files_missing_and_present(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="preset file does not exist"):
        load_preset_file(tmp_path / "nope.ini")
    f = tmp_path / "p.ini"
    f.write_text("[m]\r\nmodel = m.gguf\r\n")
    assert dict(load_preset_file(f).sections["m"].options) == {"model": "m.gguf"}


def test_option_values_fit_their_kind_and_stay_as_written() -> None:
    layer = parse(
        "[m]\nc = 8192\ntemp = 0.7\nngl = all\nfa = on\nctk = q8_0\nmodel = ./m.gguf\nts = 3,1\n"
    ).sections["m"]
    assert dict(layer.options) == {
        "ctx-size": "8192",
        "temperature": "0.7",
        "n-gpu-layers": "all",
        "flash-attn": "on",
        "cache-type-k": "q8_0",
        "model": "./m.gguf",
        "tensor-split": "3,1",
    }


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ("600", 600.0),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("1.5 h", 5400.0),
        ("-1", 0.0),
        ("0", 0.0),
    ],
)
def test_ttl_takes_durations_like_keep_alive(written: str, seconds: float) -> None:
    """Issue 29: ``ttl = 10m`` was refused while requests took ``keep_alive: "5m"``; -1 and 0
    are "never" (0.0 in the layer, as before)."""
    parsed = parse_preset_text(f"[m]\nmodel = /m.gguf\nttl = {written}\n", "p.ini")
    assert parsed.sections["m"].ttl == seconds


@pytest.mark.parametrize("written", ["10 minutes", "m", "nan", "1e999", "x" * 40])
def test_a_ttl_that_is_no_duration_is_refused_with_examples(written: str) -> None:
    with pytest.raises(ConfigError, match="10m, 1h; -1 for never"):
        parse_preset_text(f"[m]\nmodel = /m.gguf\nttl = {written}\n", "p.ini")
