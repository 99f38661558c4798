"""The agent loop against a real chat-completions server on 127.0.0.1 (a scripted model),
driven through the real openai client, with real sandboxes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from memex.backends import get_backend
from memex.executor import (
    Aids,
    Budget,
    Hooks,
    MemexAgent,
    ModelSettings,
    SandboxSpec,
    Trajectory,
    load_trajectories,
)
from memex.executor.llm import (
    LLMClient,
    ScriptedError,
    ScriptedLLM,
    ScriptedReply,
    ScriptedToolCall,
)
from memex.host_tools import tool
from memex.runtime_wasm import Limits


class Answer(BaseModel):
    total: int
    label: str


@tool
def numbers(n: int) -> list[int]:
    """The first n squares.

    Args:
        n: how many.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    return [i * i for i in range(n)]


def py(code: str, text: str = "Running code.") -> str:
    return f"{text}\n```python\n{code}\n```"


def _on(backend: Any) -> SandboxSpec:
    return SandboxSpec(limits=Limits(timeout=20), backend=backend)


def make_agent(srv: ScriptedLLM, *, code_via: Any = "text", **kw: Any) -> MemexAgent:
    llm = LLMClient("scripted", base_url=srv.base_url, max_retries=kw.pop("retries", 2),
                    backoff=0.01, timeout=kw.pop("llm_timeout", 30))
    kw.setdefault("sandbox", SandboxSpec(limits=Limits(timeout=20)))
    return MemexAgent(model=ModelSettings(client=llm, code_via=code_via), tools=[numbers],
                      submit=Answer, **kw)


def observations(srv: ScriptedLLM) -> list[str]:
    """The user/tool messages the model received, in order (last request's view)."""
    msgs = srv.requests[-1].messages
    return [m["content"] for m in msgs[2:] if m["role"] in ("user", "tool")]


def test_multi_turn_state_print_only_and_submit() -> None:
    script = [
        py("xs = numbers(5)\ntotal = sum(xs)\nbig = list(range(10**5))"),  # prints nothing
        py("print(total, len(big))"),
        py("submit({'total': total, 'label': 'squares'})"),
    ]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("Sum the first five squares.")
    assert r.submitted and r.end_reason == "submitted"
    assert r.answer == Answer(total=30, label="squares")
    obs = [s.observation for s in r.trajectory.steps]
    assert "30 100000" in obs[1]
    assert "0, 1, 4" not in obs[0] and "99999" not in obs[0]  # nothing printed, nothing shown
    assert "xs" in obs[0] and "[new variables" in obs[0]  # the preview names, not contents
    t = r.trajectory
    assert [s.status for s in t.steps] == ["ok", "ok", "submitted"]
    assert t.tool_calls[0].name == "numbers" and t.tool_calls[0].kind == "code"
    assert t.prompt_tokens > 0 and t.completion_tokens > 0 and t.llm_calls == 3
    # the system prompt shows the tool catalogue and the answer schema
    system = srv.requests[0].messages[0]["content"]
    assert "numbers(n: int) -> list[int]" in system and '"total": int' in system


def test_traceback_trimmed_and_state_survives_errors() -> None:
    script = [py("a = 1\nb = a / 0"), py("print(a)"), py("submit(total=a, label='x')")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("t")
    first = r.trajectory.steps[0]
    assert first.status == "error" and first.error == "ZeroDivisionError"
    assert "ZeroDivisionError: division by zero" in first.observation
    assert "memex" not in first.observation.lower().replace("[new variables", "")
    assert "Output:\n1" in r.trajectory.steps[1].observation
    assert r.answer == Answer(total=1, label="x")


def test_long_output_is_bounded_with_a_marker() -> None:
    script = [py("print('A' * 50000 + 'THE-END')"), py("submit(total=1, label='y')")]
    with ScriptedLLM(script) as srv:
        box = SandboxSpec(limits=Limits(timeout=20), observation_chars=1000)
        r = make_agent(srv, sandbox=box).run("t")
    obs = r.trajectory.steps[0].observation
    assert "characters elided ...]" in obs and obs.rstrip().endswith("THE-END")
    assert len(obs) < 1300
    assert len(srv.requests[1].messages[-1]["content"]) < 1300


def test_submit_rejected_then_accepted() -> None:
    script = [py("submit({'total': 'many'})"), py("submit({'total': 3, 'label': 'ok'})")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("t")
    first = r.trajectory.steps[0]
    assert first.status == "rejected"
    assert "total" in first.observation and "label" in first.observation
    assert "Field required" in first.observation
    assert r.submitted and r.answer == Answer(total=3, label="ok")


def test_tool_and_submit_errors_show_the_cell_and_the_message_only() -> None:
    script = [py("numbers(-1)"), py("submit({'total': 'many'})"), py("submit(total=1, label='e')")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("t")
    for s in r.trajectory.steps[:2]:
        assert '"<cell-' in s.observation
        assert "memex_guest/" not in s.observation and "<memex-" not in s.observation
    assert "n must be" in r.trajectory.steps[0].observation
    assert "Input should be a valid integer" in r.trajectory.steps[1].observation


def test_reply_without_code_gets_a_nudge() -> None:
    script = ["I think the answer is 4.", py("submit(total=4, label='n')")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("t")
    s0 = r.trajectory.steps[0]
    assert s0.status == "no_action" and "no ```python code block" in s0.observation
    assert r.submitted


def test_repeated_reply_is_noted() -> None:
    script = [py("print(1)"), py("print(1)"), py("submit(total=1, label='r')")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv, aids=Aids(resample_repeats=False)).run("t")
    assert "repeats an earlier reply" in r.trajectory.steps[1].observation
    assert r.trajectory.steps[1].status == "repeated"
    with ScriptedLLM(script) as srv:
        r = make_agent(srv, aids=Aids(repeat_note=False, resample_repeats=False)).run("t")
    assert "repeats" not in r.trajectory.steps[1].observation


def _stubborn(fresh: str) -> Any:
    """A model that repeats its first reply at temperature 0 and writes ``fresh`` when
    sampled hotter; it answers with the first reply again on every cold call."""
    first = py("print(1)\nnumbers(-1)")

    def reply(req: dict[str, Any]) -> str:
        return fresh if req.get("temperature") else first
    return reply


def test_a_repeat_is_asked_again_hotter_and_never_enters_the_context() -> None:
    with ScriptedLLM(_stubborn(py("submit(total=2, label='fresh')"))) as srv:
        r = make_agent(srv).run("t")
    assert r.submitted and r.answer == Answer(total=2, label="fresh")
    t = r.trajectory
    assert len(t.steps) == 2 and t.steps[1].resampled == 1 and t.llm_calls == 3
    hot = srv.requests[2].body
    assert hot["temperature"] == 0.8 and hot["seed"] == 1001
    # the repeated turn left the context (reply and observation); the message before it
    # carries a remark, the hot request a note on how the repeated code ended
    cold, hot_msgs = srv.requests[1].messages, srv.requests[2].messages
    assert len(cold) == 4 and cold[2]["content"] == py("print(1)\nnumbers(-1)")
    assert len(hot_msgs) == 2 and hot_msgs[0] == cold[0]
    assert hot_msgs[1]["content"].startswith(cold[1]["content"])
    assert "MemEx removed a turn here" in hot_msgs[1]["content"]
    assert "(turn 1) word for word; it failed with" in hot_msgs[1]["content"]
    assert "numbers(-1)" not in str(hot_msgs)
    assert "(turn 1) word for word" not in str(t.messages)  # the note was for that request
    assert "MemEx removed a turn here" in str(t.messages)  # the remark stays
    # the discarded call's tokens are counted in the step that made it
    assert t.steps[1].prompt_tokens >= 2 * t.steps[0].prompt_tokens > 0
    assert t.prompt_tokens == sum(s.prompt_tokens for s in t.steps)


def test_the_note_on_a_repeat_says_how_the_earlier_turn_failed() -> None:
    first = py("numbers(-1)")

    def reply(req: dict[str, Any]) -> str:
        return py("submit(total=0, label='fixed')") if req.get("temperature") else first

    with ScriptedLLM(reply) as srv:
        r = make_agent(srv).run("t")
    assert r.submitted
    note = srv.requests[2].messages[-1]["content"]
    assert "(turn 1) word for word; it failed with" in note and "n must be >= 0" in note


def test_a_reply_that_stays_a_repeat_runs_with_the_note() -> None:
    with ScriptedLLM(_stubborn(py("print(1)\nnumbers(-1)"))) as srv:
        r = make_agent(srv, budget=Budget(max_turns=2),
                       aids=Aids(resample_tries=3, repeat_temperature=1.1)).run("t")
    s1 = r.trajectory.steps[1]
    assert s1.resampled == 3 and s1.status == "error"
    assert "repeats an earlier reply" in s1.observation
    assert [q.body.get("seed") for q in srv.requests] == [None, None, 1001, 1002, 1003]
    assert {q.body.get("temperature") for q in srv.requests[2:]} == {1.1}
    assert r.trajectory.llm_calls == 5 and r.end_reason == "max_turns"


def test_tool_calling_repeats_are_asked_again_too() -> None:
    def reply(req: dict[str, Any]) -> ScriptedReply:
        turn = sum(1 for m in req["messages"] if m["role"] == "assistant")
        if turn == 0 or not req.get("temperature"):  # same call, spaced differently
            args = '{"n": -3}' if turn == 0 else '{ "n" : -3 }'
            return ScriptedReply(content="", tool_calls=(
                ScriptedToolCall(name="numbers", arguments=args),))
        return ScriptedReply(content="", tool_calls=(ScriptedToolCall(
            name="submit", arguments={"answer": {"total": 3, "label": "t"}}),))

    with ScriptedLLM(reply) as srv:
        r = make_agent(srv, action_space="tools").run("t")
    assert r.submitted and r.trajectory.steps[1].resampled == 1


def test_a_tool_call_repeating_a_successful_one_is_asked_again_too() -> None:
    """In tool calling, the same calls give the same results, which are above already: a
    reply repeating a successful call word for word is asked again, as a failed one is."""
    def reply(req: dict[str, Any]) -> ScriptedReply:
        turn = sum(1 for m in req["messages"] if m["role"] == "assistant")
        if turn <= 1 and not req.get("temperature"):  # the same good call, twice
            return ScriptedReply(content="", tool_calls=(
                ScriptedToolCall(name="numbers", arguments={"n": 3}),))
        return ScriptedReply(content="", tool_calls=(ScriptedToolCall(
            name="submit", arguments={"answer": {"total": 5, "label": "t"}}),))

    with ScriptedLLM(reply) as srv:
        r = make_agent(srv, action_space="tools").run("t")
    assert r.submitted and r.trajectory.steps[0].status == "ok"
    assert r.trajectory.steps[1].resampled == 1
    note = srv.requests[2].messages[-1]["content"]
    assert "word for word; its results are in the conversation above" in note


def test_several_blocks_run_in_order_and_stop_at_an_error() -> None:
    reply = ("```python\nx = 2\n```\n```python\nprint(x * 10)\n```\n"
             "```python\nraise ValueError('nope')\n```\n```python\nprint('never')\n```")
    with ScriptedLLM([reply, py("submit(total=x, label='m')")]) as srv:
        r = make_agent(srv).run("t")
    s0 = r.trajectory.steps[0]
    assert "20" in s0.observation and "ValueError: nope" in s0.observation
    assert "never" not in s0.observation and "1 later block(s) not run" in s0.observation
    assert len(s0.code) == 3


@pytest.mark.parametrize("budget,reason", [
    (Budget(max_turns=2), "max_turns"),
    (Budget(max_tokens=50), "max_tokens"),
    (Budget(max_seconds=0.5), "max_seconds"),
    (Budget(max_cost=0.0001), "max_cost"),
])
def test_each_budget_ends_the_rollout(budget: Budget, reason: str) -> None:
    def forever(_req: dict[str, Any]) -> ScriptedReply:
        return ScriptedReply(content=py("import time; time.sleep(0.2); print('again')"),
                             prompt_tokens=30, completion_tokens=10)

    with ScriptedLLM(forever) as srv:
        llm = LLMClient("priced", base_url=srv.base_url, prices={"priced": (10.0, 10.0)})
        agent = MemexAgent(model=llm, tools=[numbers], submit=Answer, budget=budget,
                           sandbox=SandboxSpec(limits=Limits(timeout=20)))
        r = agent.run("loop forever")
    assert not r.submitted and r.answer is None
    assert r.end_reason == reason == r.trajectory.end_reason
    assert len(r.trajectory.steps) >= 1


def test_llm_retries_then_success_and_exhaustion() -> None:
    script: list[Any] = [ScriptedError(status=500), ScriptedError(status=429, retry_after=0.05),
                         py("submit(total=7, label='retry')")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("t")
    assert r.submitted and len(srv.requests) == 3
    with ScriptedLLM([ScriptedError(status=500)] * 5) as srv:
        r = make_agent(srv, retries=1).run("t")
    assert r.end_reason == "llm_error" and not r.submitted
    assert r.error is not None and "500" in r.error


def test_native_function_calling_mode() -> None:
    script = [
        ScriptedReply(tool_calls=(ScriptedToolCall(name="python",
                                                   arguments={"code": "v = sum(numbers(4))\nv"}),)),
        ScriptedReply(tool_calls=(ScriptedToolCall(
            name="python", arguments={"code": "submit(total=v, label='native')"}),)),
    ]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv, code_via="tool_call").run("t")
    assert r.answer == Answer(total=14, label="native")
    assert r.trajectory.steps[0].action == "native_code"
    req = srv.requests[1]
    assert req.tools and req.tools[0]["function"]["name"] == "python"
    tool_msgs = [m for m in req.messages if m["role"] == "tool"]
    assert tool_msgs and "Out: 14" in tool_msgs[0]["content"]


def test_tool_calling_baseline_native_and_text_calls() -> None:
    script = [
        ScriptedReply(tool_calls=(ScriptedToolCall(name="numbers", arguments={"n": 4}),)),
        '```json\n{"name": "python_exec", "arguments": {"code": "print(0+1+4+9)"}}\n```',
        ScriptedReply(tool_calls=(ScriptedToolCall(name="submit",
                                                   arguments={"answer": {"total": "x"}}),)),
        '<tool_call>{"name": "submit", "arguments": {"answer": {"total": 14, "label": "t"}}}'
        "</tool_call>",
    ]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv, action_space="tools").run("t")
    assert r.submitted and r.answer == Answer(total=14, label="t")
    steps = r.trajectory.steps
    assert [c.kind for s in steps for c in s.tool_calls] == ["native", "text", "native", "text"]
    assert "[0, 1, 4, 9]" in steps[0].observation  # serialized to text for the model
    assert steps[1].observation.strip().endswith("14")
    assert steps[2].status == "rejected" and "invalid_arguments" in steps[2].observation
    names = {t["function"]["name"] for t in srv.requests[0].tools or []}
    assert names == {"numbers", "python_exec", "submit"}


def test_a_tool_call_that_cannot_be_read_is_told_to_the_model() -> None:
    """A reply that marks a tool call but whose JSON does not parse, or that names no tool,
    gets an error observation the model can act on; it is never dropped silently."""
    script = [
        '<tool_call>{"name": "numbers", "arguments": {"n": 4}</tool_call>',  # a brace short
        '<tool_call>{"arguments": {"n": 4}}</tool_call>',  # no name
        '<tool_call>{"name": "submit", "arguments": {"answer": {"total": 1, "label": "x"}}}'
        "</tool_call>",
    ]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv, action_space="tools").run("t")
    assert r.submitted
    first, second = r.trajectory.steps[:2]
    assert "not valid JSON" in first.observation and first.tool_calls
    assert "needs a \"name\"" in second.observation and second.tool_calls
    # what the model read next holds the error (the context, not only the trajectory)
    told = json.dumps(srv.requests[1].messages)
    assert "not valid JSON" in told


@pytest.mark.slow
def test_trajectory_jsonl_round_trip_and_inputs(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    path = tmp_path / "t.jsonl"
    df = pd.DataFrame({"a": [1, 2, 3], "when": pd.to_datetime(["2026-01-01"] * 3)})
    script = [py("print(df.dtypes['when'], arr.dtype, arr.shape, int(df.a.sum()))"),
              py("submit(total=int(arr.sum()), label=str(df.when.dt.year[0]))")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv, hooks=Hooks(trajectory_path=str(path))).run(
            "use the inputs", inputs={"df": df, "arr": np.arange(6).reshape(2, 3)})
    assert "datetime64" in r.trajectory.steps[0].observation
    assert "int64 (2, 3) 6" in r.trajectory.steps[0].observation
    assert r.answer == Answer(total=15, label="2026")
    assert "DataFrame, 3 rows x 2 columns" in srv.requests[0].messages[0]["content"]
    [loaded] = load_trajectories(path)
    assert loaded == r.trajectory
    assert Trajectory.from_dict(json.loads(json.dumps(r.trajectory.to_dict()))) == r.trajectory


def test_trajectories_as_inputs_arrive_typed() -> None:
    with ScriptedLLM([py("submit(total=2, label='a')")]) as srv:
        first = make_agent(srv).run("t").trajectory
    script = [py("t = runs[0]\nprint(type(t).__name__, t.end_reason, t.answer['label'], "
                 "len(t.steps), t.steps[0].code[0].strip())"),
              py("submit(total=len(runs), label=runs[0].steps[0].status)")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("audit", inputs={"runs": [first]})
    obs = r.trajectory.steps[0].observation
    assert "Trajectory submitted a 1 submit(total=2, label='a')" in obs
    assert r.answer == Answer(total=1, label="submitted")


def test_bad_configuration_raises() -> None:
    from memex.errors import ConfigError

    with ScriptedLLM(["x"]) as srv:
        with pytest.raises(ConfigError):
            make_agent(srv, action_space="json")  # type: ignore[arg-type]
        agent = make_agent(srv)
        with pytest.raises(ConfigError):
            agent.run("")
        with pytest.raises(ConfigError):
            agent.run("t", inputs={"_hidden": 1})
        with pytest.raises(ConfigError):
            agent.run("t", inputs={"numbers": 1})
    with pytest.raises(ConfigError, match="repeat_temperature"):
        Aids(repeat_temperature=0.0)
    with pytest.raises(ConfigError, match="resample_tries"):
        Aids(resample_tries=-1)


@pytest.mark.parametrize("backend", ["inprocess", "subprocess", "pool"])
def test_the_same_rollout_on_every_local_backend(backend: str) -> None:
    script = [py("xs = numbers(4)\nprint(sum(xs))"), py("submit(total=sum(xs), label='b')")]
    with ScriptedLLM(script) as srv, make_agent(srv, sandbox=_on(backend)) as agent:
        r = agent.run("t")
    assert r.answer == Answer(total=14, label="b")
    assert "14" in r.trajectory.steps[0].observation
    assert r.trajectory.tool_calls[0].name == "numbers"


def test_the_same_rollout_on_a_memex_serve_service(memex_server: Any) -> None:
    """MemexAgent unchanged on RemoteBackend: the tool runs here, the guest on the service."""
    script = [py("xs = numbers(4)\nprint(sum(xs))"), py("submit(total=sum(xs), label='r')")]
    backend = get_backend("remote", url=memex_server.url, api_key=memex_server.keys["a"])
    with backend, ScriptedLLM(script) as srv, make_agent(srv, sandbox=_on(backend)) as agent:
        r = agent.run("t")
    assert r.answer == Answer(total=14, label="r")
    assert "14" in r.trajectory.steps[0].observation
    assert r.trajectory.tool_calls[0].name == "numbers"


@pytest.mark.parametrize("code_via", ["text", "tool_call"])
def test_repeating_an_older_turn_removes_that_turn_only(code_via: str) -> None:
    def as_reply(code: str) -> Any:
        if code_via == "text":
            return py(code)
        return ScriptedReply(content="", tool_calls=(
            ScriptedToolCall(name="python", arguments={"code": code}),))

    cold = iter(["a = 1\nnumbers(-a)", "b = 2\nprint(b)", "a = 1\nnumbers(-a)"])

    def reply(req: dict[str, Any]) -> Any:
        if req.get("temperature"):
            return as_reply("submit(total=a + b, label='older')")
        return as_reply(next(cold))

    with ScriptedLLM(reply) as srv:
        r = make_agent(srv, code_via=code_via).run("t")
    assert r.submitted and r.answer == Answer(total=3, label="older")
    hot = srv.requests[3].messages
    roles = [m["role"] for m in hot]
    obs = "tool" if code_via == "tool_call" else "user"
    assert roles == ["system", "user", "assistant", obs]  # turn 1 left, turn 2 stayed
    assert "MemEx removed a turn here" in hot[1]["content"]
    assert "b = 2" in json.dumps(hot[2]) and "a = 1" not in json.dumps(hot)
    assert "(turn 1) word for word" in hot[-1]["content"]


def test_a_repeat_of_code_that_worked_or_timed_out_runs_again() -> None:
    """Polling, or retrying a wait that timed out, with the same block is legitimate."""
    script = [py("print(1)"), py("print(1)"), py("raise TimeoutError('w')"),
              py("raise TimeoutError('w')"), py("submit(total=1, label='p')")]
    with ScriptedLLM(script) as srv:
        r = make_agent(srv).run("t")
    assert r.submitted and [s.resampled for s in r.trajectory.steps] == [0] * 5
    assert all(q.body.get("seed") is None for q in srv.requests)
