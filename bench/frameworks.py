"""The framework adapters' cost per step, side by side in one run on this machine.

For each framework, a trivial step through the MemEx adapter beside MemEx direct
(``Sandbox.run``) and beside the framework's own way of doing the same step:

* smolagents: ``MemexExecutor`` vs smolagents' default ``LocalPythonExecutor`` (the executor
  seam called as ``CodeAgent`` calls it, no model), a bare cell and a cell calling a tool;
* pydantic-ai and the OpenAI Agents SDK: whole agent runs driven by the framework's own test
  model (``FunctionModel``, ``ScriptedModel``) with K steps each: a native tool call per step
  vs a ``run_python`` step (a bare cell, and a cell calling the same tool); per step = run / K;
* fastmcp: ``execute`` through fastmcp's in-memory ``Client`` (shared sandbox, fresh sandbox
  per call, a block calling a tool) vs a plain tool call through the same client;
* Jupyter: an ``execute_request`` round trip on the MemEx kernel vs ipykernel's own kernel.

Every adapter keeps ``Sandbox``'s default per-cell rollback checkpoint (a copy of the guest's
memory after each good cell, made in the background; a caller that sends the next cell at once
waits for it, a model's think time hides it), so both direct rows are shown. Medians and p90.
Asserts nothing.

    python bench/frameworks.py            # 200 samples per row
    python bench/frameworks.py --quick    # 40
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# bench/mcp.py would shadow the mcp package the frameworks import: bench/ goes last.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
from _fmt import fmt, median_p90, sample  # noqa: E402

from memex import Limits, Sandbox  # noqa: E402

Row = tuple[str, list[float]]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# ---- MemEx direct -----------------------------------------------------------------------------
def direct(n: int) -> list[Row]:
    rows = []
    for rollback in (True, False):
        with Sandbox(rollback=rollback) as sb:
            rows.append((f"Sandbox.run('x = 1'), rollback {'on' if rollback else 'off'}",
                         sample(lambda sb=sb: sb.run("x = 1"), n, warm=3)))
    return rows


# ---- smolagents -------------------------------------------------------------------------------
def smolagents_rows(n: int) -> list[Row]:
    from smolagents import tool
    from smolagents.local_python_executor import LocalPythonExecutor

    from memex.integrations.smolagents import MemexExecutor

    @tool
    def add_tool(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first.
            b: the second.
        """
        return a + b

    tools = {"add_tool": add_tool}
    local = LocalPythonExecutor(additional_authorized_imports=[])
    local.send_tools(tools)
    rows = [("LocalPythonExecutor: x = 1", sample(lambda: local("x = 1"), n, warm=3)),
            ("LocalPythonExecutor: y = add_tool(1, 2)",
             sample(lambda: local("y = add_tool(a=1, b=2)"), n, warm=3))]
    with MemexExecutor(limits=Limits(timeout=10)) as ex:
        ex.send_tools(tools)
        rows += [("MemexExecutor: x = 1", sample(lambda: ex("x = 1"), n, warm=3)),
                 ("MemexExecutor: y = add_tool(1, 2)",
                  sample(lambda: ex("y = add_tool(a=1, b=2)"), n, warm=3))]
    return rows


# ---- pydantic-ai ------------------------------------------------------------------------------
def pydantic_ai_rows(n: int, k: int) -> list[Row]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from memex.integrations.pydantic_ai import MemexCodeMode

    def model(name: str, args: dict[str, Any]) -> FunctionModel:
        def fn(messages: list[Any], info: Any) -> ModelResponse:
            done = sum(1 for m in messages if m.kind == "response")
            if done < k:
                return ModelResponse(parts=[ToolCallPart(tool_name=name, args=args,
                                                         tool_call_id=f"c{done}")])
            return ModelResponse(parts=[TextPart("done")])
        return FunctionModel(fn)

    def agent(m: FunctionModel, caps: list[Any]) -> Agent[None, str]:
        a: Agent[None, str] = Agent(m, capabilities=caps)
        a.tool_plain(add)
        return a

    native = agent(model("add", {"a": 1, "b": 2}), [])
    rows = [("native tool call", per_step(lambda: native.run_sync("go"), n, k))]
    with_mode = MemexCodeMode(limits=Limits(timeout=10), per="conversation")
    try:
        bare = agent(model("run_python", {"code": "x = 1"}), [with_mode])
        calls = agent(model("run_python", {"code": "y = add(1, 2)"}), [with_mode])
        rows += [("run_python('x = 1')",
                  per_step(lambda: bare.run_sync("go", conversation_id="b"), n, k)),
                 ("run_python('y = add(1, 2)')",
                  per_step(lambda: calls.run_sync("go", conversation_id="b"), n, k))]
    finally:
        with_mode.close()
    return rows


def per_step(run: Callable[[], Any], n: int, k: int) -> list[float]:
    return [t / k for t in sample(run, max(3, n // k), warm=1)]


# ---- OpenAI Agents SDK --------------------------------------------------------------------------
def openai_agents_rows(n: int, k: int) -> list[Row]:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from memex.integrations.openai_agents import MemexCodeMode

    set_tracing_disabled(True)
    add_tool = function_tool(add)

    def scripted(name: str, args: dict[str, Any]) -> ScriptedModel:
        steps: list[Any] = [[function_call(name, args, call_id=f"c{i}")] for i in range(k)]
        return ScriptedModel([*steps, [assistant_message("done")]])

    def run(agent_for: Callable[[ScriptedModel], Agent[Any]], name: str,
            args: dict[str, Any], context: Any = None) -> Callable[[], Any]:
        return lambda: Runner.run_sync(agent_for(scripted(name, args)), "go", context=context,
                                       max_turns=k + 2)

    rows = [("native function tool call",
             per_step(run(lambda m: Agent(name="a", model=m, tools=[add_tool]), "add",
                          {"a": 1, "b": 2}), n, k))]

    class Context:
        pass

    ctx = Context()
    with MemexCodeMode(limits=Limits(timeout=10), per="context") as mode:
        def code_agent(m: ScriptedModel) -> Agent[Any]:
            return mode.agent(Agent(name="a", model=m, tools=[add_tool]))
        rows += [("run_python('x = 1')",
                  per_step(run(code_agent, "run_python", {"code": "x = 1"}, ctx), n, k)),
                 ("run_python('y = add(1, 2)')",
                  per_step(run(code_agent, "run_python", {"code": "y = add(1, 2)"}, ctx),
                           n, k))]
    return rows


# ---- fastmcp ----------------------------------------------------------------------------------
def fastmcp_rows(n: int) -> list[Row]:
    from fastmcp import Client, FastMCP
    from fastmcp.experimental.transforms.code_mode import CodeMode

    from memex.integrations.fastmcp import MemexSandboxProvider

    def server(provider: MemexSandboxProvider | None) -> FastMCP:
        mcp = FastMCP("bench")
        mcp.tool(add)
        if provider is not None:
            mcp.add_transform(CodeMode(sandbox_provider=provider))
        return mcp

    async def calls(mcp: FastMCP, name: str, args: dict[str, Any]) -> list[float]:
        out = []
        async with Client(mcp) as client:
            for i in range(n + 3):
                t = time.perf_counter()
                await client.call_tool(name, args)
                if i >= 3:
                    out.append(time.perf_counter() - t)
        return out

    rows = [("plain tool call add(1, 2)", asyncio.run(calls(server(None), "add",
                                                              {"a": 1, "b": 2})))]
    with MemexSandboxProvider(state="shared") as shared:
        mcp = server(shared)
        rows += [("execute 'return 1', shared sandbox",
                  asyncio.run(calls(mcp, "execute", {"code": "return 1"}))),
                 ("execute 'return await call_tool(add)', shared",
                  asyncio.run(calls(mcp, "execute", {
                      "code": "return await call_tool('add', {'a': 1, 'b': 2})"})))]
    with MemexSandboxProvider(state="call") as fresh:
        rows.append(("execute 'return 1', a sandbox per call",
                     asyncio.run(calls(server(fresh), "execute", {"code": "return 1"}))))
    return rows


# ---- Jupyter ----------------------------------------------------------------------------------
def jupyter_rows(n: int) -> list[Row]:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    from memex.integrations.jupyter import install_kernelspec

    rows = []
    with tempfile.TemporaryDirectory() as prefix:
        install_kernelspec("memex-bench", prefix=prefix, timeout=30)
        specs = KernelSpecManager()
        specs.kernel_dirs = [str(Path(prefix) / "share" / "jupyter" / "kernels"),
                             *specs.kernel_dirs]
        for label, name in (("ipykernel (python3)", "python3"), ("memex kernel", "memex-bench")):
            km = KernelManager(kernel_name=name, kernel_spec_manager=specs)
            km.start_kernel()
            kc = km.client()
            kc.start_channels()
            try:
                kc.wait_for_ready(timeout=60)
                rows.append((f"{label}: execute 'x = 1'",
                             sample(lambda kc=kc: kc.execute_interactive(
                                 "x = 1", timeout=30, output_hook=lambda _m: None), n, warm=3)))
            finally:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description="framework adapters: per-step cost")
    p.add_argument("--quick", action="store_true", help="fewer samples")
    p.add_argument("--only", default="", help="comma-separated: direct,smolagents,pydantic-ai,"
                   "openai-agents,fastmcp,jupyter")
    args = p.parse_args()
    n, k = (40, 10) if args.quick else (200, 20)
    sections: list[tuple[str, Callable[[], list[Row]]]] = [
        ("MemEx direct", lambda: direct(n)),
        ("smolagents (executor seam)", lambda: smolagents_rows(n)),
        (f"pydantic-ai (FunctionModel, {k} steps a run; per step)",
         lambda: pydantic_ai_rows(n, k)),
        (f"OpenAI Agents SDK (ScriptedModel, {k} steps a run; per step)",
         lambda: openai_agents_rows(n, k)),
        ("fastmcp (in-memory Client)", lambda: fastmcp_rows(n)),
        ("Jupyter (execute_request round trip)", lambda: jupyter_rows(n)),
    ]
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    print(f"{'row':<52} {'median':>10} {'p90':>10}")
    for title, make in sections:
        key = title.split(" (")[0].lower().replace(" direct", "").replace(" sdk", "")
        key = {"memex": "direct", "openai agents": "openai-agents"}.get(key, key)
        if only and key not in only:
            continue
        print(f"-- {title}")
        for label, samples in make():
            med, p90 = median_p90(samples)
            print(f"   {label:<49} {fmt(med):>10} {fmt(p90):>10}")


if __name__ == "__main__":
    main()
