"""Downloads the agent does itself: the preset keys that ask for one, and the pure planning
(URL, cache path, the child's spec afterwards). Fetching is in tests/integration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from preset_operator.ini import render_ini
from preset_operator.presets import Preset, parse_preset

from node_agent.errors import ChildError, ConfigError
from node_agent.sources.catalog import load_catalog
from node_agent.sources.download import (
    ChecksumError,
    DownloadPlan,
    cache_dir,
    destination,
    hf_url,
    needs_download,
    with_local_model,
)
from node_agent.sources.preset_ini import parse_preset_text
from node_agent.sources.spec import ModelSpec

SHA = "ab" * 32
CACHE = Path("/cache")


def spec_from(ini: str, name: str = "m") -> ModelSpec:
    return load_catalog(preset_files=[parse_preset_text(ini, "p.ini")])[name]


# -- the INI keys ---------------------------------------------------------------------------


def test_operator_url_source_parses_and_never_reaches_the_child() -> None:
    # What operator/preset_operator/ini.py renders for a url{url, sha256} source.
    spec = spec_from(f"[m]\nmodel-url = https://x.test/m.gguf\nmodel-sha256 = {SHA.upper()}\n")
    assert spec.model_sha256 == SHA  # normalised to hashlib's lower case
    assert spec.get("model-url") == "https://x.test/m.gguf"
    assert "model-sha256" not in " ".join(spec.argv())


def test_operator_hf_source_with_revision_parses_and_never_reaches_the_child() -> None:
    spec = spec_from("[m]\nhf-repo = org/repo\nhf-file = m-Q4_K_M.gguf\nhf-revision = v1.0\n")
    assert spec.hf_revision == "v1.0"
    assert "revision" not in " ".join(spec.argv())


@pytest.mark.parametrize("key", [f"model-sha256 = {SHA}", "hf-revision = main"])
def test_pins_are_refused_in_the_global_section(key: str) -> None:
    # One file's hash or revision would otherwise reach every model, local ones included.
    with pytest.raises(ConfigError, match=r"^p\.ini:2: .* pins one model's file: .*not \[\*\]"):
        parse_preset_text(f"[*]\n{key}\n[m]\nmodel = /m.gguf\n", "p.ini")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            f"model = /m.gguf\nmodel-sha256 = {SHA}\n",
            "p.ini:3: 'model-sha256' in [m] needs 'model-url' in the same section "
            "(missing 'model-url')",
        ),
        (
            "hf-repo = o/r:Q4_K_M\nhf-revision = main\n",
            "p.ini:3: 'hf-revision' in [m] needs 'hf-repo' and 'hf-file' in the same section "
            "(missing 'hf-file')",
        ),
    ],
)
def test_pins_without_their_source_are_refused(body: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_preset_text(f"[m]\n{body}", "p.ini")
    assert str(err.value) == message


@pytest.mark.parametrize("value", ["abc", "g" * 64, "a" * 63, "a" * 65, ""])
def test_bad_sha256_names_file_line_and_key(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_preset_text(f"[m]\nmodel-url = https://x/m.gguf\nmodel-sha256 = {value}\n", "p.ini")
    message = str(err.value)
    assert message.startswith("p.ini:3: ")
    assert "'model-sha256' in [m] expects the file's SHA-256 as 64 hex digits" in message


@pytest.mark.parametrize("value", ["", "a b", "../main", "/main", "x..y"])
def test_bad_revision_names_file_line_and_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^p\.ini:2: 'hf-revision' in \[m\] expects a commit"):
        parse_preset_text(f"[m]\nhf-revision = {value}\nhf-repo = o/r\nhf-file = f\n", "p.ini")


def test_new_keys_given_twice_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"p\.ini:3: .*'model-sha256' again"):
        parse_preset_text(f"[m]\nmodel-sha256 = {SHA}\nmodel-sha256 = {SHA}\n", "p.ini")


@pytest.mark.parametrize(
    ("typo", "key"), [("model-sha265", "model-sha256"), ("hf-revison", "hf-revision")]
)
def test_misspelt_key_suggests_the_new_key(typo: str, key: str) -> None:
    # Not llama-server's closest option ('models-max', 'hf-repo'): the closer of both pools.
    with pytest.raises(ConfigError, match=f"did you mean '{key}'"):
        parse_preset_text(f"[m]\n{typo} = {SHA}\n", "p.ini")


def test_what_the_operator_renders_the_agent_reads_and_plans() -> None:
    # The bug this guards: the operator wrote model-sha256 / hf-revision, and the agent refused
    # the whole preset file for keys llama-server does not know.
    def preset(name: str, source: dict[str, object]) -> Preset:
        return parse_preset({"metadata": {"name": name}, "spec": {"source": source}})

    text = render_ini(
        [
            preset("u", {"url": {"url": "https://x.test/d/m.gguf", "sha256": SHA}}),
            preset("h", {"huggingFace": {"repo": "o/r", "file": "m.gguf", "revision": "v2"}}),
        ]
    )
    catalog = load_catalog(preset_files=[parse_preset_text(text, "rendered.ini")])
    url_plan = needs_download(catalog["u"], CACHE, {})
    hf_plan = needs_download(catalog["h"], CACHE, {})
    assert url_plan == DownloadPlan("https://x.test/d/m.gguf", SHA, CACHE / f"{SHA[:16]}-m.gguf")
    assert hf_plan is not None
    assert hf_plan.url == "https://huggingface.co/o/r/resolve/v2/m.gguf"


# -- URLs and the cache ---------------------------------------------------------------------


def test_hf_url() -> None:
    assert (
        hf_url("org/repo", "m-Q4_K_M.gguf", "main")
        == "https://huggingface.co/org/repo/resolve/main/m-Q4_K_M.gguf"
    )
    # Subfolders stay paths; a ref with slashes is one path segment; a :TAG is dropped
    # because the file is named; a mirror endpoint may end with a slash.
    assert (
        hf_url("org/repo:Q4_K_M", "sub/m a.gguf", "refs/pr/1", "http://mirror.test/")
        == "http://mirror.test/org/repo/resolve/refs%2Fpr%2F1/sub/m%20a.gguf"
    )


def test_cache_dir() -> None:
    assert cache_dir({"LLAMA_CACHE": "/lc", "HOME": "/h"}) == Path("/lc")
    assert cache_dir({"HOME": "/h"}) == Path("/h/.cache/corral/models")


def test_destination_is_keyed_by_hash_else_by_url() -> None:
    assert destination("https://x/a/m.gguf?dl=1", CACHE, SHA) == CACHE / f"{SHA[:16]}-m.gguf"
    # Same content at another URL: the same file.
    assert destination("https://y/m.gguf", CACHE, SHA) == CACHE / f"{SHA[:16]}-m.gguf"
    # Without a hash the URL tells versions apart.
    one = destination("https://x/r/resolve/v1/m.gguf", CACHE, None)
    two = destination("https://x/r/resolve/v2/m.gguf", CACHE, None)
    assert one != two
    assert one.parent == CACHE
    assert one.name.endswith("-m.gguf")


def test_destination_name_is_safe() -> None:
    assert destination("https://x/%2E%2E%2Fetc%2Fpasswd", CACHE, SHA).parent == CACHE
    assert destination("https://x/", CACHE, SHA).name == f"{SHA[:16]}-model.gguf"
    assert destination("https://x/a%20b.gguf", CACHE, SHA).name == f"{SHA[:16]}-a_b.gguf"


# -- plans and the child's spec -------------------------------------------------------------


def test_no_plan_without_a_corral_key() -> None:
    # Plain model-url / hf-repo: the child downloads, exactly as under llama.cpp's router.
    assert needs_download(spec_from("[m]\nmodel-url = https://x/m.gguf\n"), CACHE, {}) is None
    assert needs_download(spec_from("[m]\nhf-repo = o/r:Q4_K_M\n"), CACHE, {}) is None
    assert needs_download(spec_from("[m]\nmodel = /m.gguf\n"), CACHE, {}) is None


def test_plan_for_url_with_sha256() -> None:
    spec = spec_from(f"[m]\nmodel-url = https://x/m.gguf\nmodel-sha256 = {SHA}\n")
    assert needs_download(spec, CACHE, {}) == DownloadPlan(
        "https://x/m.gguf", SHA, CACHE / f"{SHA[:16]}-m.gguf"
    )


def test_plan_for_hf_revision_honours_hf_endpoint() -> None:
    spec = spec_from("[m]\nhf-repo = o/r\nhf-file = m.gguf\nhf-revision = 0123abc\n")
    plan = needs_download(spec, CACHE, {"HF_ENDPOINT": "http://mirror.test"})
    assert plan is not None
    assert plan.url == "http://mirror.test/o/r/resolve/0123abc/m.gguf"
    assert plan.sha256 is None
    assert plan.destination.parent == CACHE
    plan = needs_download(spec, None, {"LLAMA_CACHE": "/lc"})
    assert plan is not None
    assert plan.url.startswith("https://huggingface.co/o/r/resolve/0123abc/")
    assert plan.destination.parent == Path("/lc")


def test_hf_revision_without_file_is_a_clear_error() -> None:
    # The INI parser refuses this; a spec built another way still gets a clear error.
    spec = ModelSpec("m", "preset", options=(("hf-repo", "o/r:Q4_K_M"),), hf_revision="main")
    with pytest.raises(ConfigError, match="model m: hf-revision needs hf-repo and hf-file"):
        needs_download(spec, CACHE, {})


def test_sha256_without_url_is_a_clear_error() -> None:
    spec = ModelSpec("m", "preset", options=(("model", "/m.gguf"),), model_sha256=SHA)
    with pytest.raises(ConfigError, match="model m: model-sha256 is set but model-url is not"):
        needs_download(spec, CACHE, {})


def test_with_local_model_loads_the_file_and_drops_remote_options() -> None:
    spec = spec_from(
        "[m]\nhf-repo = o/r\nhf-file = m.gguf\nhf-revision = v1\nctx-size = 512\n"
        "model-url = https://x/m.gguf\n"
    )
    local = with_local_model(spec, CACHE / "k-m.gguf")
    assert dict(local.options) == {"ctx-size": "512", "model": "/cache/k-m.gguf"}
    assert local.model_path == "/cache/k-m.gguf"
    argv = local.argv()
    assert "--model" in argv
    assert not {"--hf-repo", "--hf-file", "--model-url"} & set(argv)
    assert (local.name, local.hf_revision) == (spec.name, spec.hf_revision)


def test_with_local_model_keeps_an_hf_cache_projector() -> None:
    spec = ModelSpec(
        "o/r:Q4",
        "cache",
        options=(("hf-repo", "o/r:Q4"),),
        cache_file="/hub/m.gguf",
        cache_mmproj="/hub/mmproj.gguf",
    )
    local = with_local_model(spec, CACHE / "k-m.gguf")
    assert local.model_path == "/cache/k-m.gguf"
    assert local.get("mmproj") == "/hub/mmproj.gguf"


def test_checksum_error_says_url_and_mismatch_but_no_hash() -> None:
    # Issue 16 row 9: the body's hash is what the remote served; a client learns only that
    # it did not match.
    err = ChecksumError("https://x/m.gguf")
    assert isinstance(err, ChildError)
    assert "https://x/m.gguf" in str(err)
    assert "checksum mismatch" in str(err)
    assert not re.search(r"[0-9a-f]{64}", str(err))
