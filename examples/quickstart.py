"""MemEx quick start: a persistent, capped Python kernel in WebAssembly.

Run with ``./build.sh demo`` (or ``python examples/quickstart.py`` once ``memex prepare`` ran).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from memex import Door, Limits, Sandbox


def show(title: str, result: object) -> None:
    print(f"--- {title}\n{result}\n")


def main() -> None:
    door = Door()
    door.register("lookup", lambda key: {"alpha": 1, "beta": 2}.get(key))

    with Sandbox(limits=Limits(timeout=2.0, memory=512 << 20), door=door) as sb:
        sb.run("import statistics\nscores = [3, 5, 8, 13]")
        r = sb.run("statistics.mean(scores)")
        show("state persists across turns; a final expression is echoed", r.value)

        r = sb.run("scores.append(21)\nprint('n =', len(scores))\n1 / 0")
        show("a guest exception is data, not a host error",
             f"stdout={r.stdout!r}\n{r.exception.traceback if r.exception else ''}")

        t = time.perf_counter()
        r = sb.run("while True:\n    scores.append(0)")
        show("an endless loop hits the wall deadline and the turn is rolled back",
             f"status={r.status.value} limit={r.limit} rolled_back={r.rolled_back} "
             f"after {time.perf_counter() - t:.2f}s; scores now: {sb.run('scores').value}")

        r = sb.run("blob = bytearray(1 << 30)")
        show("allocating past the memory cap is a MemoryError; the guest lives on",
             f"{r.exception.type if r.exception else None}; "
             f"next turn: {sb.run('len(scores)').value}")

        r = sb.run("import memex_guest\nmemex_guest.call('lookup', 'beta')")
        show("the door: a host function called from the guest over msgpack frames", r.value)

        r = sb.run("import socket\nsocket.create_connection(('127.0.0.1', 80))")
        show("no network", r.exception.message if r.exception else r)

        t = time.perf_counter()
        child = sb.fork()
        fork_ms = (time.perf_counter() - t) * 1e3
        child.run("scores.clear()")
        show("fork: an independent copy of the live session",
             f"fork took {fork_ms:.1f} ms; child={child.run('scores').value} "
             f"parent={sb.run('scores').value}")
        child.close()

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "session.img"
            size = sb.save(path)
            with Sandbox.load(path) as again:
                show("save/load: the session on disk",
                     f"{size / 1e6:.1f} MB image; restored scores={again.run('scores').value}")

    t = time.perf_counter()
    with Sandbox(preload=["numpy", "pandas"]) as warm:
        first = time.perf_counter()
        r = warm.run(
            "import pandas as pd\n"
            "df = pd.DataFrame({'segment': list('abcab'), 'v': [1, 2, 3, 4, 5]})\n"
            "df.groupby('segment').v.sum().to_dict()"
        )
        show("preloaded numpy+pandas (a warm image, copy-on-write)",
             f"sandbox ready in {(first - t) * 1e3:.0f} ms (the first one in a process builds "
             f"the image); result {r.value}")


if __name__ == "__main__":
    main()
