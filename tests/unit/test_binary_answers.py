"""A binary's kept answers (llama_server/answers.py): what is kept, and what is asked again."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.llama_server.answers import MAX_ANSWER, Answers


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n")
    return path


def env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def asks(answers: Answers, answer: str = "b11434") -> tuple[str, int]:
    calls = []

    def ask() -> str:
        calls.append(1)
        return answer

    return answers.remembered("version", ask, lambda a: isinstance(a, str)), len(calls)


def test_an_answer_is_asked_once_then_kept(tmp_path: Path, binary: Path) -> None:
    assert asks(Answers(binary, env(tmp_path))) == ("b11434", 1)
    assert asks(Answers(binary, env(tmp_path))) == ("b11434", 0)


def test_a_changed_binary_or_library_beside_it_is_asked_again(tmp_path: Path, binary: Path) -> None:
    asks(Answers(binary, env(tmp_path)))
    (binary.parent / "libllama.so").write_bytes(b"\0")
    assert asks(Answers(binary, env(tmp_path)), "b11435") == ("b11435", 1)
    binary.write_text("#!/bin/sh\n# rebuilt\n")
    assert asks(Answers(binary, env(tmp_path)), "b11436") == ("b11436", 1)


@pytest.mark.parametrize(
    "content", [b"{not json", b'{"other": 1}', b"[1]", b" " * (MAX_ANSWER + 1)]
)
def test_a_file_that_is_no_answer_is_asked_again(
    tmp_path: Path, binary: Path, content: bytes
) -> None:
    asks(Answers(binary, env(tmp_path)))
    (kept,) = (tmp_path / "cache" / "corral" / "llama-server-answers").glob("*-version.json")
    kept.write_bytes(content)
    assert asks(Answers(binary, env(tmp_path))) == ("b11434", 1)


def test_a_failure_is_not_kept(tmp_path: Path, binary: Path) -> None:
    def fails() -> str:
        raise OSError("no such file")

    with pytest.raises(OSError):
        Answers(binary, env(tmp_path)).remembered("version", fails, lambda a: True)
    assert asks(Answers(binary, env(tmp_path))) == ("b11434", 1)


def test_an_answer_of_the_wrong_type_is_asked_again(tmp_path: Path, binary: Path) -> None:
    Answers(binary, env(tmp_path)).put("version", 7)
    assert asks(Answers(binary, env(tmp_path))) == ("b11434", 1)
