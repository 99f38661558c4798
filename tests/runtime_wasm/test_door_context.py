"""Door handlers that want the turn's context, and the re-entrancy guard."""

from __future__ import annotations

from memex import Door, DoorContext, Sandbox


def test_context_handler_gets_the_turn_deadline() -> None:
    door = Door()
    seen: list[float] = []

    def handler(ctx: DoorContext, x: int) -> int:
        assert isinstance(ctx, DoorContext) and ctx.op == "ctx"
        seen.append(ctx.remaining())
        return x + 1

    door.register("ctx", handler, context=True)
    with Sandbox(door=door) as sb:
        r = sb.run("import memex_guest\nmemex_guest.call('ctx', 41)", timeout=5)
    assert r.value == "42"
    assert 0 < seen[0] <= 5


def test_handler_cannot_reenter_its_own_sandbox() -> None:
    door = Door()
    holder: dict[str, Sandbox] = {}
    door.register("reenter", lambda: holder["sb"].run("1").value)
    with Sandbox(door=door) as sb:
        holder["sb"] = sb
        r = sb.run("import memex_guest\nmemex_guest.call('reenter')", timeout=5)
        assert r.exception is not None
        assert "cannot run code in the sandbox" in r.exception.message
        assert sb.run("2 + 2").value == "4"  # no deadlock, the sandbox goes on


def test_handler_may_use_another_sandbox() -> None:
    door = Door()
    with Sandbox() as other:
        door.register("other", lambda: other.run("6 * 7").value)
        with Sandbox(door=door) as sb:
            r = sb.run("import memex_guest\nmemex_guest.call('other')", timeout=10)
    assert r.value == "'42'"
