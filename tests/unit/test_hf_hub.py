"""Which files ``POST /models`` downloads and where (llama.cpp b11434's rules), what ``DELETE
/models`` removes, what a redirect may reach, and ``dedup-cache-models`` (``sources.hf_hub``,
``sources.download.redirect_allowed``, ``sources.catalog``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node_agent.sources import hf_hub
from node_agent.sources.catalog import load_catalog
from node_agent.sources.download import redirect_allowed
from node_agent.sources.preset_ini import parse_preset_text

COMMIT = "a" * 40


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("Q8_0", ["m-Q8_0.gguf", "mmproj-m-F16.gguf"]),
        ("q8_0", ["m-Q8_0.gguf", "mmproj-m-F16.gguf"]),  # tags match case-insensitively
        ("", ["m-Q4_K_M.gguf", "mmproj-m-F16.gguf"]),  # the default tag
        ("Q2_K", []),
        (  # every shard, and the projector of a folder above
            "BIG",
            ["big/m-BIG-00001-of-00002.gguf", "big/m-BIG-00002-of-00002.gguf", "mmproj-m-F16.gguf"],
        ),
    ],
)
def test_the_files_for_a_tag(tag: str, expected: list[str]) -> None:
    paths = [
        "README.md",
        "big/m-BIG-00002-of-00002.gguf",
        "big/m-BIG-00001-of-00002.gguf",
        "m-Q4_K_M.gguf",
        "m-Q8_0.gguf",
        "mmproj-m-F16.gguf",
        "imatrix-m-Q8_0.gguf",  # an importance matrix is no model
    ]
    assert hf_hub.choose(sorted(paths), tag) == expected


def test_without_the_default_tags_the_first_model_file() -> None:
    assert hf_hub.choose(["a-F16.gguf", "b-Q2_K.gguf"], "") == ["a-F16.gguf"]


def test_a_projector_prefers_the_closest_quant() -> None:
    paths = ["m-Q8_0.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf"]
    assert hf_hub.choose(paths, "Q8_0") == ["m-Q8_0.gguf", "mmproj-Q8_0.gguf"]


@pytest.mark.parametrize("name", ["nope", "a/b/c", ""])
def test_a_name_that_is_not_org_repo_gets_llama_cpps_message(name: str) -> None:
    with pytest.raises(ValueError, match="invalid HF repo format"):
        hf_hub.split_repo_tag(name)


def test_the_endpoint_follows_llama_cpps_variables() -> None:
    assert hf_hub.endpoint({}) == "https://huggingface.co/"
    assert hf_hub.endpoint({"HF_ENDPOINT": "http://h"}) == "http://h/"
    assert hf_hub.endpoint({"MODEL_ENDPOINT": "http://m/", "HF_ENDPOINT": "http://h"}) == (
        "http://m/"
    )


def cached(hub: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A repository in the hub layout llama.cpp writes (blobs, a snapshot of links, a ref)."""
    folder = hf_hub.repo_folder(hub, repo)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    for i, (path, data) in enumerate(files.items()):
        blob = folder / "blobs" / f"{i:064x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = folder / "snapshots" / COMMIT / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return folder


def test_resolve_cached_finds_what_hf_loads_offline(tmp_path: Path) -> None:
    cached(tmp_path, "org/r", {"r-Q8_0.gguf": b"a", "r-F16.gguf": b"b"})
    snapshot = hf_hub.repo_folder(tmp_path, "org/r") / "snapshots" / COMMIT
    assert hf_hub.resolve_cached(tmp_path, "org/r:q8_0") == str(snapshot / "r-Q8_0.gguf")
    assert hf_hub.resolve_cached(tmp_path, "org/r", "r-F16.gguf") == str(snapshot / "r-F16.gguf")
    assert hf_hub.resolve_cached(tmp_path, "org/r:Q2_K") is None
    assert hf_hub.resolve_cached(tmp_path, "org/other") is None


def test_remove_cached_takes_one_tag_and_only_its_blobs(tmp_path: Path) -> None:
    folder = cached(tmp_path, "org/r", {"r-Q8_0.gguf": b"a", "r-F16.gguf": b"b"})
    assert hf_hub.remove_cached(tmp_path, "org/r:Q8_0")
    left = sorted(p.name for p in (folder / "snapshots" / COMMIT).iterdir())
    assert left == ["r-F16.gguf"]
    assert [p.read_bytes() for p in (folder / "blobs").iterdir()] == [b"b"]
    assert not hf_hub.remove_cached(tmp_path, "org/r:Q8_0")  # nothing left of that tag
    assert hf_hub.remove_cached(tmp_path, "org/r")  # no tag: the whole repository
    assert not folder.exists()


@pytest.mark.parametrize(
    ("origin", "target", "allowed"),
    [
        ("http://127.0.0.1:9/a", "http://127.0.0.1:9/b", True),  # same host
        ("http://127.0.0.1:9/a", "http://localhost:9/b", False),
        ("http://127.0.0.1:9/a", "http://127.0.0.1:10/b", False),  # another port
        ("https://huggingface.co/r/resolve/main/m", "https://cas-bridge.xethub.hf.co/x", True),
        ("https://huggingface.co/r/resolve/main/m", "https://cdn-lfs.huggingface.co/x", True),
        ("https://huggingface.co/r/resolve/main/m", "http://cdn-lfs.huggingface.co/x", False),
        ("https://huggingface.co/r/resolve/main/m", "https://evil.example/x", False),
        ("https://huggingface.co/r/resolve/main/m", "https://evilhf.co/x", False),
        ("https://files.example/m", "https://cas-bridge.xethub.hf.co/x", False),  # not from HF
        ("https://files.example/m", "file:///etc/passwd", False),
    ],
)
def test_redirects_reach_only_allowed_hosts(origin: str, target: str, allowed: bool) -> None:
    assert redirect_allowed(origin, target) is allowed


def test_the_operator_may_allow_more_redirect_hosts() -> None:
    assert redirect_allowed("https://a.example/m", "https://cdn.b.example/m", (".b.example",))
    assert redirect_allowed("https://a.example/m", "https://b.example/m", ("b.example",))
    assert not redirect_allowed("https://a.example/m", "https://c.example/m", (".b.example",))


# -- dedup-cache-models ------------------------------------------------------------------


def catalog(hub: Path, ini: str) -> dict[str, bool]:
    presets = [parse_preset_text(ini, "p.ini")] if ini else []
    found = load_catalog(hub=hub, preset_files=presets)
    return {name: spec.hidden for name, spec in found.models.items()}


def test_dedup_hides_the_cache_entry_a_preset_loads(tmp_path: Path) -> None:
    cached(tmp_path, "org/r", {"r-Q8_0.gguf": b"a", "r-F16.gguf": b"b"})
    cached(tmp_path, "org/d", {"d-Q4_0.gguf": b"c"})
    on = "[mine]\nhf-repo = org/r:Q8_0\nspec-draft-hf = org/d:Q4_0\ndedup-cache-models = true\n"
    assert catalog(tmp_path, on) == {
        "mine": False,
        "org/d:Q4_0": True,  # its draft's file too
        "org/r:F16": False,
        "org/r:Q8_0": True,
    }
    assert catalog(tmp_path, on.replace("true", "false")) == dict.fromkeys(
        ["mine", "org/d:Q4_0", "org/r:F16", "org/r:Q8_0"], False
    )
    assert catalog(tmp_path, "") == dict.fromkeys(["org/d:Q4_0", "org/r:F16", "org/r:Q8_0"], False)


def test_dedup_leaves_an_entry_a_preset_merged_into(tmp_path: Path) -> None:
    cached(tmp_path, "org/r", {"r-Q8_0.gguf": b"a"})
    ini = "[org/r:Q8_0]\nctx-size = 512\ndedup-cache-models = true\n"
    assert catalog(tmp_path, ini) == {"org/r:Q8_0": False}  # a preset now, not a cache entry


def test_dedup_is_llama_cpps_preset_key_with_its_env_name() -> None:
    layer = parse_preset_text("[m]\nmodel = /x.gguf\n__PRESET_DEDUP_CACHE_MODELS = 1\n", "p.ini")
    assert layer.sections["m"].dedup_cache_models is True


# -- the agent's download settings -----------------------------------------------------------


def test_the_token_comes_from_the_flag_else_the_environment() -> None:
    from node_agent.agent import download_settings
    from node_agent.config import parse_agent_args

    env = {"HF_TOKEN": "hf_from_env"}
    flagged = download_settings(parse_agent_args(["--hf-token", "hf_from_flag"], env), env)
    assert flagged.token == "hf_from_flag"
    assert download_settings(parse_agent_args([], env), env).token == "hf_from_env"
    assert download_settings(parse_agent_args([], {}), {}).token is None


def test_download_limits_come_from_the_agents_flags() -> None:
    from node_agent.agent import download_settings
    from node_agent.config import parse_agent_args

    args = ["--max-download-size", "2GiB", "--download-redirect-hosts", "cdn.example,.example.net"]
    settings = download_settings(parse_agent_args([*args, "--load-timeout", "9"], {}), {})
    assert settings.limits.max_bytes == 2 << 30
    assert settings.limits.redirect_hosts == ("cdn.example", ".example.net")
    assert settings.load_timeout == 9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-download-size", "lots"], "--max-download-size expects a size like 20GiB"),
        (["--download-redirect-hosts", "http://x/"], "--download-redirect-hosts expects host"),
    ],
)
def test_bad_download_flags_are_refused(args: list[str], message: str) -> None:
    from node_agent.config import parse_agent_args
    from node_agent.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        parse_agent_args(args, {})
