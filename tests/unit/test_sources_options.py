"""The llama-server option table generated from the pinned binary's --help."""

from __future__ import annotations

from node_agent.sources.options import llama_options, parse_bool


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
    for key in ("no-mmap", "nocb", "no-cont-batching", "no-mmproj"):
        match = table.key(key)
        assert match is not None and match.negated, key
    mmap = table.named("mmap")
    assert mmap.render(False) == ("--no-mmap",)
    assert mmap.render(True) == ("--mmap",)
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
