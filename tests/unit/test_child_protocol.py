"""The parent–child protocol lines, the child's configuration, environment and state table."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.child import protocol
from node_agent.child.orphans import AGENT_PID_ENV, TAG_ENV
from node_agent.child.protocol import ProtocolError, StateLine, parse_state_line
from node_agent.child.spawn import ChildConfig, child_argv, child_environment
from node_agent.child.state import ALLOWED, ChildState
from node_agent.errors import ChildError, ConfigError

# As the pinned llama-server writes them (captured with a 0.5 MB model).
LOADING = (
    'cmd_child_to_router:state:{"state":"loading","payload":{"stages":["text_model"],'
    '"current":"text_model","value":0.25}}'
)
READY = (
    'cmd_child_to_router:state:{"state":"ready","payload":{"id":"tiny.gguf","aliases":'
    '["tiny.gguf"],"tags":[],"object":"model","created":1796004025,"owned_by":"llamacpp",'
    '"meta":{"vocab_type":1,"n_vocab":272,"n_ctx":256,"n_ctx_train":2048}}}'
)


class TestStateLines:
    def test_loading_carries_progress(self) -> None:
        line = parse_state_line(LOADING + "\n")
        assert line == StateLine(
            "loading", {"stages": ["text_model"], "current": "text_model", "value": 0.25}
        )
        assert line.progress == 0.25

    def test_ready_carries_the_model_info(self) -> None:
        line = parse_state_line(READY + "\r\n")
        assert line is not None and line.state == protocol.READY
        assert line.payload["meta"]["n_ctx"] == 256
        assert line.progress is None  # only loading lines have one

    def test_sleeping_has_a_null_payload(self) -> None:
        line = parse_state_line('cmd_child_to_router:state:{"state":"sleeping","payload":null}')
        assert line == StateLine("sleeping", None)

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "0.00.009.714 I srv  llama_server: listening on http://127.0.0.1:40295",
            " cmd_child_to_router:state:{}",  # not at the start of the line
            "cmd_router_to_child:exit",
        ],
    )
    def test_other_lines_are_not_state_lines(self, text: str) -> None:
        assert parse_state_line(text) is None

    @pytest.mark.parametrize(
        "body", ['{"state":"ready"', "[]", '{"payload":{}}', '{"state":3}', "not json"]
    )
    def test_broken_state_lines_raise(self, body: str) -> None:
        with pytest.raises(ProtocolError) as raised:
            parse_state_line(protocol.STATE_PREFIX + body)
        assert isinstance(raised.value, ChildError)

    @pytest.mark.parametrize(
        ("value", "progress"),
        [(0, 0.0), (1, 1.0), (1.5, 1.0), (-2, 0.0), (True, None), ("0.5", None), (None, None)],
    )
    def test_progress_is_clamped_and_typed(self, value: object, progress: float | None) -> None:
        assert StateLine("loading", {"value": value}).progress == progress
        assert StateLine("loading", [value]).progress is None

    def test_progress_ignores_non_finite_numbers(self) -> None:
        assert StateLine("loading", {"value": float("nan")}).progress is None

    def test_the_exit_command(self) -> None:
        assert protocol.EXIT_COMMAND == b"cmd_router_to_child:exit\n"


class TestConfig:
    @pytest.mark.parametrize("arg", ["--port", "--host", "--port=8081", "--host=0.0.0.0"])
    def test_host_and_port_are_the_supervisors(self, arg: str) -> None:
        with pytest.raises(ConfigError, match="chosen by Corral"):
            ChildConfig(name="m", binary=Path("/x"), args=("-m", "m.gguf", arg))

    @pytest.mark.parametrize(
        "bad", [{"stop_timeout": -1}, {"load_timeout": 0}, {"port_attempts": 0}]
    )
    def test_limits(self, bad: dict[str, float]) -> None:
        with pytest.raises(ConfigError):
            ChildConfig(name="m", binary=Path("/x"), args=(), **bad)  # type: ignore[arg-type]

    def test_argv_ends_with_loopback_host_and_port(self) -> None:
        config = ChildConfig(name="m", binary=Path("/bin/llama-server"), args=("-m", "m.gguf"))
        assert child_argv(config, 4242) == [
            "/bin/llama-server", "-m", "m.gguf", "--host", "127.0.0.1", "--port", "4242",
        ]  # fmt: skip

    def test_environment(self) -> None:
        config = ChildConfig(
            name="m",
            binary=Path("/x"),
            args=(),
            env={"HOME": "/model-home", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
            agent_tag="127.0.0.1:8080",
            router_port=8080,
        )
        env = child_environment(config, base={"HOME": "/agent-home", "PATH": "/bin"})
        assert env["PATH"] == "/bin"  # inherited
        assert env["HOME"] == "/model-home"  # the model's env wins over the agent's
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # the ledger depends on it
        assert env["LLAMA_SERVER_ROUTER_PORT"] == "8080"
        assert env[TAG_ENV] == "127.0.0.1:8080"
        assert env[AGENT_PID_ENV].isdigit()

    def test_untagged_by_default(self) -> None:
        env = child_environment(ChildConfig(name="m", binary=Path("/x"), args=()), base={})
        assert TAG_ENV not in env and env["LLAMA_SERVER_ROUTER_PORT"] == "0"


class TestStates:
    def test_every_state_can_end_and_exited_is_final(self) -> None:
        for state in ChildState:
            if state is not ChildState.EXITED:
                assert ChildState.EXITED in ALLOWED[state]
        assert ALLOWED[ChildState.EXITED] == frozenset()
        assert ALLOWED[ChildState.STOPPING] == {ChildState.EXITED}

    def test_no_way_back_to_starting(self) -> None:
        assert all(ChildState.STARTING not in targets for targets in ALLOWED.values())
