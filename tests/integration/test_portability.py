"""One llama-server build for every x86_64 CPU: the build `corral llama-server build` makes,
run on emulated older CPUs (Debian's qemu-user, ``qemu-x86_64 -cpu MODEL``), answers a chat
on a generated model, with the CPU variant ggml chose for that CPU.

A native build (``GGML_NATIVE=ON``) died of SIGILL here under ``-cpu Nehalem``, and the
AVX-512 wheel Corral used to ship on every CPU without AVX-512. Run with ``-s`` to see each
CPU's variant and answer.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.harness import b11434_path, free_port, http, missing_in_ci_fails

# ggml's line when it loads a backend module: "load_backend: loaded CPU backend from .../
# libggml-cpu-haswell.so" (ggml-backend-reg.cpp).
_LOADED = re.compile(rb"loaded CPU backend from \S*libggml-cpu-([\w.]+)\.so")
# Emulated CPUs, oldest first, and the variant ggml must pick on each: Nehalem has SSE4.2 and
# no AVX; Haswell adds AVX2, FMA, F16C and BMI2.
CPUS = {"Nehalem": "sse42", "Haswell": "haswell"}
# Emulation is some 20-50x slower than the machine: loading and a short chat take seconds.
READY_SECONDS = 240


@pytest.fixture(scope="module")
def binary() -> Path:
    if platform.machine() != "x86_64":
        pytest.skip("the emulated CPUs are x86_64 ones")
    path = b11434_path()
    if not os.access(path, os.X_OK):
        missing_in_ci_fails(f"no llama-server at {path} (corral llama-server build)")
    return path


def _serve(command: list[str], model: Path, log: Path) -> tuple[str, bytes]:
    """Start ``command`` (llama-server, maybe under qemu) on ``model``, chat once; the answer
    and everything it logged."""
    port = free_port()
    args = ["-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "256", "-np", "1"]
    args.append("-v")  # ggml names the CPU variant it loaded only in verbose mode
    with log.open("wb") as out:
        proc = subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if http("GET", f"{url}/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{log.read_bytes()[-3000:]!r}"
        body = {
            "max_tokens": 4,
            "temperature": 0,
            "messages": [{"role": "user", "content": "hello"}],
        }
        status, answer = http("POST", f"{url}/v1/chat/completions", body, timeout=READY_SECONDS)
        assert status == 200, answer
        return str(answer["choices"][0]["message"]["content"]), log.read_bytes()
    finally:
        proc.kill()
        proc.wait()


def test_the_build_has_cpu_variants_and_no_amx(binary: Path) -> None:
    variants = sorted(p.name for p in binary.parent.glob("libggml-cpu-*.so"))
    assert "libggml-cpu-x64.so" in variants and "libggml-cpu-haswell.so" in variants
    assert "libggml-cpu-sse42.so" in variants and "libggml-cpu-skylakex.so" in variants
    # b11434's AMX Q4_1 kernel dies of SIGILL on AMX CPUs: the AMX variant is not built.
    assert "libggml-cpu-sapphirerapids.so" not in variants


def test_this_machine_gets_its_best_variant(binary: Path, demo_dir: Path, tmp_path: Path) -> None:
    answer, logged = _serve([str(binary)], demo_dir / "demo-tiny.gguf", tmp_path / "native.log")
    chosen = _LOADED.search(logged)
    assert chosen, logged[-3000:]
    print(f"\nthis machine: ggml loaded libggml-cpu-{chosen.group(1).decode()}.so; {answer!r}")


def test_no_backend_is_loaded_from_the_working_folder(binary: Path, tmp_path: Path) -> None:
    # ggml as published also loads every libggml-*-*.so of the current folder, and loading a
    # library runs its code: a file a tool or a download left in a child's working folder
    # would run inside it. Corral's build looks beside the binary only.
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        missing_in_ci_fails("no C compiler to make the planted library with")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "planted-code-ran"
    source = cwd / "planted.c"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void ran(void) "
        f'{{ fclose(fopen("{marker}", "w")); }}\n'
    )
    library = cwd / "libggml-cpu-planted.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", library, source], check=True)
    args = [str(binary), "-m", str(tmp_path / "none.gguf"), "-v"]  # loads backends, then stops
    done = subprocess.run(args, cwd=cwd, capture_output=True, timeout=60, check=False)
    said = done.stdout + done.stderr
    assert b"loaded CPU backend from " + str(binary.parent).encode() in said, said[-2000:]
    assert not marker.exists(), "a library in the working folder was loaded"


@pytest.mark.parametrize("cpu", list(CPUS))
def test_an_emulated_older_cpu_gets_an_answer(
    binary: Path, demo_dir: Path, tmp_path: Path, cpu: str
) -> None:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        missing_in_ci_fails("qemu-x86_64 is not installed (apt-get install qemu-user)")
    command = [qemu, "-cpu", cpu, str(binary)]
    answer, logged = _serve(command, demo_dir / "demo-tiny.gguf", tmp_path / f"{cpu}.log")
    chosen = _LOADED.search(logged)
    assert chosen, logged[-3000:]
    print(f"\nqemu -cpu {cpu}: ggml loaded libggml-cpu-{chosen.group(1).decode()}.so; {answer!r}")
    assert chosen.group(1).decode() == CPUS[cpu]
    assert answer  # the model's words (random weights: not a sentence)
