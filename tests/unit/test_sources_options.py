"""The llama-server option table generated from the pinned binary's --help."""

from __future__ import annotations

import pytest

from node_agent.sources.options import KINDS, llama_options, parse_bool


def test_names_short_forms_and_env_names_resolve_to_one_canonical_option() -> None:
    table = llama_options()
    for key in ("c", "ctx-size", "LLAMA_ARG_CTX_SIZE"):
        match = table.key(key)
        assert match is not None and match.option.name == "ctx-size" and not match.negated
    assert table.flag("-c") == table.flag("--ctx-size")
    # The canonical name is the last positive flag, as llama.cpp renders opt.args.back().
    assert table.key("temp") is not None and table.key("temp").option.name == "temperature"  # type: ignore[union-attr]


def test_negative_forms_are_marked_and_render_back() -> None:
    table = llama_options()
    for key in ("no-repack", "nocb", "no-cont-batching", "no-mmproj"):
        match = table.key(key)
        assert match is not None and match.negated, key
    repack = table.named("repack")
    assert repack.render(False) == ("--no-repack",)
    assert repack.render(True) == ("--repack",)
    # --no-host is a positive flag of its own (it has no --host counterpart).
    no_host = table.key("no-host")
    assert no_host is not None and not no_host.negated and no_host.option.name == "no-host"
    # A false flag without a negative form is left out, like llama.cpp's to_args.
    assert table.named("metrics").render(False) == ()


def test_value_options_and_two_value_options() -> None:
    table = llama_options()
    assert table.named("ctx-size").render("4096") == ("--ctx-size", "4096")
    assert table.named("control-vector-layer-range").nargs == 2
    assert table.named("n-gpu-layers").env == "LLAMA_ARG_N_GPU_LAYERS"


def test_suggestions_for_typos() -> None:
    assert llama_options().suggest("ctx-sise") == "ctx-size"
    assert llama_options().suggest_flag("--n-gpu-layer") == "--n-gpu-layers"


def test_booleans_use_llama_cpp_words() -> None:
    assert [parse_bool(v) for v in ("on", "enabled", "true", "1")] == [True] * 4
    assert [parse_bool(v) for v in ("off", "disabled", "false", "0")] == [False] * 4
    assert parse_bool("maybe") is None


def test_preset_only_and_agent_keys_do_not_shadow_llama_options() -> None:
    from node_agent.sources.preset_ini import AGENT_KEYS, PRESET_ONLY, ROUTER_KEYS

    table = llama_options()
    assert all(table.key(k) is None for k in [*PRESET_ONLY, *AGENT_KEYS])
    assert all(table.key(k) is not None for k in ROUTER_KEYS)


# --- value kinds ------------------------------------------------------------------------


def test_value_kinds_from_the_help_hints() -> None:
    table = llama_options()

    def kind(name: str) -> tuple[str, tuple[str, ...]]:
        return table.named(name).kind, table.named(name).choices

    assert kind("ctx-size") == ("integer", ())
    assert kind("seed") == ("integer", ())
    assert kind("n-gpu-layers") == ("integer", ("auto", "all"))
    # N with a float default, or read with std::stof though the help shows no default.
    for name in ("temperature", "top-p", "min-p", "rope-scale", "rope-freq-base"):
        assert kind(name) == ("number", ()), name
    assert kind("draft-p-split") == ("number", ())  # P
    assert kind("flash-attn") == ("choice", ("on", "off", "auto"))
    assert kind("fit") == ("choice", ("on", "off"))
    assert kind("rope-scaling") == ("choice", ("none", "linear", "yarn"))
    assert kind("cache-type-k")[1][:3] == ("f32", "f16", "bf16")  # "allowed values:" line
    for name in ("model", "mmproj", "hf-file", "chat-template-file", "slot-save-path"):
        assert kind(name) == ("path", ()), name
    # Lists, patterns, words the help only describes, and deprecated --defrag-thold (ignored).
    for name in ("tensor-split", "spec-type", "numa", "load-mode", "cpu-mask", "defrag-thold"):
        assert kind(name) == ("text", ()), name
    assert table.named("repack").kind == "flag"
    assert table.named("control-vector-layer-range").kind == "text"


def test_every_default_from_help_is_accepted() -> None:
    """No option refuses the default its own --help shows (a false refusal is the worse bug)."""
    checked = 0
    for opt in llama_options():
        assert opt.kind in KINDS, opt.name
        assert (opt.kind == "flag") == opt.is_flag, opt.name
        if opt.default is not None:
            assert opt.check(opt.default) is None, (opt.name, opt.default)
            checked += 1
        for word in opt.choices:
            assert opt.check(word) is None, (opt.name, word)
    assert checked >= 90  # the generator found the defaults (e.g. -c 0, --temp 0.80, -fa auto)


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("ctx-size", ["0", "4096", "-1", "+8", " 512"], ["lots", "8k", "1.5", "1e4", "", "auto"]),
        ("n-gpu-layers", ["99", "auto", "all", "-1"], ["most", "ALL", "1.0"]),
        (
            "temperature",
            ["0.8", ".5", "1", "1e-3", "-1.00", "inf", "nan", "0x1p-2"],
            ["hot", "1,5"],
        ),
        ("flash-attn", ["on", "off", "auto", "true", "enabled", "0", "-1"], ["ON", "maybe", ""]),
        ("fit", ["on", "false", "1"], ["auto"]),
        ("split-mode", ["none", "layer", "row", "tensor"], ["rows", "ROW"]),
        ("model", ["m.gguf", "/a b/c.gguf", "lots"], []),
        ("tensor-split", ["3,1", "anything"], []),
    ],
)
def test_check_values(name: str, good: list[str], bad: list[str]) -> None:
    opt = llama_options().named(name)
    assert [v for v in good if opt.check(v) is not None] == []
    assert [v for v in bad if opt.check(v) is None] == []


def test_every_flag_of_the_agents_own_is_an_agent_key_in_a_preset() -> None:
    """A preset naming one is told to give it on the agent's command line, not that the key is
    unknown (seven flags added since the list was written were missing from it; its comment
    said a test kept the two equal, and none did)."""
    from node_agent.config import _OWN_FLAGS
    from node_agent.sources.preset_ini import AGENT_KEYS

    assert {flag.removeprefix("--") for flag in _OWN_FLAGS} == AGENT_KEYS
