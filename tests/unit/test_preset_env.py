"""A model's own environment in a preset (``env.NAME = value``): parsed, refused, round-tripped."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.api.views import preset_text
from node_agent.child.spawn import ChildConfig, child_environment
from node_agent.errors import ConfigError
from node_agent.sources.catalog import load_catalog
from node_agent.sources.preset_env import pins_device
from node_agent.sources.preset_ini import parse_preset_text


def catalog(text: str, tmp_path: Path) -> dict[str, object]:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    ini = text.replace("MODEL", str(model))
    return dict(load_catalog(preset_files=[parse_preset_text(ini, "p.ini")]).models)


def test_env_keys_cascade_from_the_global_section_and_merge_per_variable(tmp_path: Path) -> None:
    models = catalog(
        "[*]\nenv.GGML_CUDA_NO_PINNED = 1\nenv.CUDA_VISIBLE_DEVICES = 0\n"
        "[m]\nmodel = MODEL\nenv.CUDA_VISIBLE_DEVICES = 1,2\n",
        tmp_path,
    )
    spec = models["m"]
    assert dict(spec.env) == {"GGML_CUDA_NO_PINNED": "1", "CUDA_VISIBLE_DEVICES": "1,2"}  # type: ignore[attr-defined]
    assert pins_device(spec.env)  # type: ignore[attr-defined]


def test_env_round_trips_through_status_preset(tmp_path: Path) -> None:
    spec = catalog("[m]\nmodel = MODEL\nenv.CUDA_VISIBLE_DEVICES = 0,1\n", tmp_path)["m"]
    text = preset_text(spec)  # type: ignore[arg-type]
    assert "env.CUDA_VISIBLE_DEVICES = 0,1" in text
    again = parse_preset_text(text, "again.ini").sections["m"]
    assert again.env == (("CUDA_VISIBLE_DEVICES", "0,1"),)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("env.LD_PRELOAD = evil.so", "may not set LD_PRELOAD"),
        ("env.GGML_BACKEND_PATH = x", "may not set GGML_BACKEND_PATH"),  # loads a library
        ("env.LLAMA_ARG_MODEL = x", "may not set LLAMA_ARG_MODEL"),
        ("env.CUDA_DEVICE_ORDER = FASTEST_FIRST", "set by Corral for every child"),
        ("env.CUDA_VISIBLE_DEVICES = ../0", "not a device list"),
        ("env. = 1", "an empty name"),
    ],
)
def test_env_outside_the_allow_list_is_refused_with_file_and_line(line: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        parse_preset_text(f"[m]\nmodel = x.gguf\n{line}\n", "p.ini")
    assert str(caught.value).startswith("p.ini:3: ")


def test_a_variable_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="again"):
        parse_preset_text("[m]\nenv.GGML_CUDA_NO_PINNED = 1\nenv.GGML_CUDA_NO_PINNED = 0\n", "p")


def test_a_restricted_preset_has_the_same_env_allow_list(tmp_path: Path) -> None:
    """The operator's files (a ModelPreset's spec.env) may set what the administrator's may,
    and nothing more."""
    from node_agent.sources.trust import Restricted

    policy = Restricted.under([tmp_path])
    parsed = parse_preset_text("[m]\nenv.CUDA_VISIBLE_DEVICES = 1\n", "p.ini", policy)
    assert parsed.sections["m"].env == (("CUDA_VISIBLE_DEVICES", "1"),)
    with pytest.raises(ConfigError, match="may not set LD_PRELOAD"):
        parse_preset_text("[m]\nenv.LD_PRELOAD = x.so\n", "p.ini", policy)


def test_the_child_gets_its_env_and_the_agent_keeps_its_own(tmp_path: Path) -> None:
    config = ChildConfig(
        "m", tmp_path / "llama-server", (), env={"CUDA_VISIBLE_DEVICES": "3"}, router_port=1
    )
    env = child_environment(config, base={"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
