"""The failed load's one-line message: llama.cpp's words, then why and what to do (issue 29)."""

from __future__ import annotations

from node_agent.runtime.load_failure import REASON_SHOWN, failure_message


def test_without_a_reason_it_is_llama_cpps_message() -> None:
    assert failure_message("m", "") == "model name=m failed to load"


def test_the_cause_and_the_next_step_follow_llama_cpps_words() -> None:
    reason = (
        "model m: exited with code 1 while loading; last log line: 0.00.063.483 E "
        "llama_model_load: error loading model: tensor 'x' data is not within the file bounds"
    )
    assert failure_message("m", reason) == (
        "model name=m failed to load: exited with code 1 while loading; last log line: "
        "llama_model_load: error loading model: tensor 'x' data is not within the file bounds; "
        "check the model file: a partial download or a copy cut short fails this way; download "
        "or copy it again; its log: corral logs m (GET /models/logs?model=m)"
    )


def test_a_load_timeout_says_which_option_gives_more_time() -> None:
    message = failure_message("m", "model m: not ready within load_timeout=5s; killed")
    assert "not ready within load_timeout=5s; killed; " in message
    assert "--load-timeout" in message


def test_the_message_is_one_bounded_line() -> None:
    message = failure_message("m", "line one\nline two " + "x" * 10_000)
    assert "\n" not in message
    assert len(message) < REASON_SHOWN + 300
