"""Issue 16 rows 1–5: nobody gets in through a preset.

A ModelPreset is written by whoever may create one in the cluster, not by the node's
administrator: its ``args`` pass an allow-list (operator, CRD CEL, and the agent again when it
reads the operator's files), file options stay inside the trusted folders, values round-trip
exactly through the INI, and one bad preset is refused alone. The administrator's own INI keeps
every option.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from preset_operator.presets import InvalidPreset, parse_preset
from preset_operator.render import render

from node_agent.errors import ConfigError
from node_agent.sources.catalog import load_catalog
from node_agent.sources.options import generated_options
from node_agent.sources.preset_ini import parse_preset_text
from node_agent.sources.spec import ROUTER_KEYS
from node_agent.sources.trust import MODEL_PRESET_OPTIONS, PATH_OPTIONS, Restricted
from tests.crd_rules import errors as crd_errors
from tests.operator.presets import preset

NODES = {"node-a": {}}
TABLE = generated_options()

# The attacks of rows 1–3, as a ModelPreset's args.
ATTACKS = {
    "mcp": ["--mcp-servers-json", '{"mcpServers":{"x":{"command":"/bin/sh","args":["-c","id"]}}}'],
    "environ": ["--chat-template-file", "/proc/self/environ"],
    "passwd": ["--chat-template-file", "/etc/passwd"],
    "log-file": ["--log-file", "/tmp/owned"],
    "slot-save": ["--slot-save-path", "/tmp"],
    "tools": ["--tools", "all"],
    "agent": ["--agent"],
    "control-vector": ["--control-vector", "/etc/passwd"],
    "grammar-file": ["--grammar-file", "/etc/shadow"],
    "media": ["--media-path", "/"],
    "rpc": ["--rpc", "10.0.0.1:50052"],
    "mmproj-url": ["--mmproj-url", "http://evil.example/x.gguf"],
    "json-schema-file": ["--json-schema-file", "/etc/passwd"],
    "lookup-cache": ["--lookup-cache-dynamic", "/tmp/x"],
    "webui-config-file": ["--webui-config-file", "/etc/passwd"],
    "hf-repo-draft": ["--hf-repo-draft", "evil/draft"],
    "prio": ["--prio", "3"],
}


def refused_by_operator(args: list[str]) -> str:
    r = render([preset("p", args=args)], NODES)
    assert "p" in r.invalid and not r.files, (args, r.files)
    return r.invalid["p"]


def complement() -> list[list[str]]:
    """Every option the allow-list leaves out, each in every spelling, as ModelPreset args."""
    out = []
    for opt in TABLE:
        if opt.name in MODEL_PRESET_OPTIONS:
            continue
        for flag in (*opt.flags, *opt.negatives):
            out.append([flag] if opt.is_flag or flag in opt.negatives else [flag, "1"])
    return out


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_rows_1_to_3_attacks_are_refused_by_the_operator_and_the_crd(name: str) -> None:
    args = ATTACKS[name]
    assert "may not set" in refused_by_operator(args)
    assert any("args may only set" in e for e in crd_errors(preset("p", args=args)))


@pytest.mark.parametrize("args", complement(), ids=lambda a: a[0])
def test_16_2_every_option_off_the_allow_list_is_refused_with_a_reason(args: list[str]) -> None:
    """Acceptance 16.2: the allow-list's whole complement, through render and CEL."""
    why = refused_by_operator(args)
    assert args[0] in why and ("may not set" in why or "is not an option" in why), why
    assert any("args may only set" in e for e in crd_errors(preset("p", args=args)))


def test_allowed_options_exist_and_pass_both() -> None:
    names = {opt.name for opt in TABLE}
    assert names >= MODEL_PRESET_OPTIONS  # no typo hides a refusal
    args = ["--ctx-size", "8192", "-ngl", "-1", "--flash-attn", "on", "--no-repack"]
    args += ["--chat-template", "{{ 'a;b' }}#", "--mmproj", "/models/x/mmproj.gguf"]
    r = render([preset("p", args=args)], NODES)
    assert r.invalid == {}
    assert crd_errors(preset("p", args=args)) == []


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"localPath": {"path": "/models/a.gguf\n[evil]\nmcp-servers-json = {}"}}, "path"),
        ({"huggingFace": {"repo": "org/repo", "file": "a\nb.gguf"}}, "file"),
        ({"huggingFace": {"repo": "org/repo\n[x]", "file": "a.gguf"}}, "repo"),
        ({"url": {"url": "https://x/a\r\nrpc = 1", "sha256": "a" * 64}}, "url"),
        ({"pvc": {"claimName": "c\n[x]", "subPath": "a.gguf"}}, "claimName"),
        ({"pvc": {"claimName": "c", "subPath": "a.gguf\nlog-file = /x"}}, "subPath"),
    ],
)
def test_row_5_line_breaks_in_source_fields_are_refused_by_the_operator(
    source: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidPreset, match=f"{field} contains a line break"):
        parse_preset(preset("p", source=source))


@pytest.mark.parametrize("args", [["--mmproj", "x.gguf"], ["--lora", "/models/../etc/passwd"]])
def test_file_options_must_be_absolute_without_dotdot(args: list[str]) -> None:
    assert "absolute path" in refused_by_operator(args)


# --- the agent's side: the operator's files are restricted, the administrator's are not ------
def restricted(tmp_path: Path) -> Restricted:
    return Restricted.under([tmp_path / "models"])


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_the_agent_refuses_the_attacks_in_a_restricted_preset(tmp_path: Path, name: str) -> None:
    flag, *value = ATTACKS[name]
    text = f"[m]\nmodel = /m.gguf\n{flag.lstrip('-')} = {value[0] if value else 'true'}\n"
    # (tools, agent and MCP are router settings now: refused in every preset, the agent's own
    # command line turns them on.)
    refused = r"p\.ini:3: .*(not on the list of options|is a router setting)"
    with pytest.raises(ConfigError, match=refused):
        parse_preset_text(text, "p.ini", restricted(tmp_path))
    # ... and the administrator's own file keeps every per-model option, on purpose.
    match = TABLE.key(flag.lstrip("-"))
    assert match is not None
    if match.option.name not in ROUTER_KEYS:
        parse_preset_text(text, "p.ini")


def test_restricted_file_options_stay_inside_the_roots(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "a").mkdir(parents=True)
    (models / "a" / "mmproj.gguf").write_bytes(b"")
    os.symlink("/etc/passwd", models / "escape.gguf")
    policy = restricted(tmp_path)
    for option in sorted(PATH_OPTIONS):
        ok = f"[m]\nmodel = /m.gguf\n{option} = {models}/a/mmproj.gguf\n"
        parse_preset_text(ok, "p.ini", policy)
        for bad in ("/etc/passwd", f"{models}/../x.gguf", f"{models}/escape.gguf"):
            text = f"[m]\nmodel = /m.gguf\n{option} = {bad}\n"
            with pytest.raises(ConfigError, match="outside the folders a ModelPreset may name"):
                parse_preset_text(text, "p.ini", policy)


def test_restricted_model_url_needs_the_agents_checksum(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs 'model-sha256'"):
        parse_preset_text("[m]\nmodel-url = https://x/a.gguf\n", "p.ini", restricted(tmp_path))


# --- row 4: values round-trip, one bad preset is refused alone ------------------------------
def rendered_value(value: str) -> str:
    """A chat template through the operator's render and the agent's restricted parse."""
    r = render([preset("p", args=["--chat-template", value])], NODES)
    assert r.invalid == {}, r.invalid
    (text,) = r.files.values()
    parsed = parse_preset_text(text, "p.ini", Restricted.under([]))
    return str(dict(parsed.sections["p"].options)["chat-template"])


@pytest.mark.parametrize("value", ["#", '{{ "a;b" }}', "a # b ; c", '"quoted"', "x\\n"])
def test_row_4_comment_characters_round_trip(value: str) -> None:
    assert rendered_value(value) == value


def test_plain_values_stay_readable_by_llama_cpp() -> None:
    r = render([preset("p", args=["--ctx-size", "4096", "--chat-template", "chatml"])], NODES)
    (text,) = r.files.values()
    assert "ctx-size = 4096\n" in text and "chat-template = chatml\n" in text


# The operator trims values (numbers may carry spaces); refuses line breaks (the CRD does too).
_VALUES = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), min_size=1
).filter(lambda v: v.strip() == v and not v.startswith("-"))


@given(_VALUES)
def test_any_value_round_trips_operator_render_to_agent_parse(value: str) -> None:
    assert rendered_value(value) == value


@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1))
def test_any_text_round_trips_through_ini_value(value: str) -> None:
    """Line breaks and edge whitespace too (the encoding, beyond what the CRD admits)."""
    from node_agent.sources.preset_ini import ini_value

    text = f"[p]\nmodel = /m.gguf\nchat-template = {ini_value(value)}\n"
    parsed = parse_preset_text(text, "p.ini", Restricted.under([]))
    assert dict(parsed.sections["p"].options)["chat-template"] == value


def test_one_bad_preset_is_refused_alone(tmp_path: Path) -> None:
    good = tmp_path / "preset-good.ini"
    good.write_text("[good]\nmodel = /m/good.gguf\nctx-size = 512\n")
    bad = tmp_path / "preset-bad.ini"
    bad.write_text("; from a ModelPreset\n[bad]\nmodel = /m/bad.gguf\nmcp-servers-json = {}\n")
    unknown = tmp_path / "preset-skew.ini"  # e.g. an option this agent's binary does not know
    unknown.write_text("[skew]\nmodel = /m/skew.gguf\nctx-sise = 1\n")
    catalog = load_catalog(preset_files=[good, bad, unknown], restricted=restricted(tmp_path))
    assert list(catalog) == ["good"]
    by_model = {r.models: r for r in catalog.refused}
    assert by_model[("bad",)].origin == f"{bad}:4"
    assert "mcp-servers-json" in by_model[("bad",)].reason  # a router setting now, too
    assert by_model[("skew",)].origin == f"{unknown}:3"
    # The administrator's own file is still refused whole, at once (llama.cpp does too).
    with pytest.raises(ConfigError):
        load_catalog(preset_files=[good, bad, unknown])


def test_the_operator_shows_an_agents_refusal_on_its_model_preset() -> None:
    from preset_operator.status import parse_models

    body = {
        "object": "list",
        "data": [],
        "refused": [{"origin": "/p/preset-x.ini:4", "reason": "'rpc' is not…", "models": ["x"]}],
    }
    report = parse_models(body)["x"]
    assert report.failed and report.value == "unloaded"
    assert report.error == "the agent refused this preset: /p/preset-x.ini:4: 'rpc' is not…"
