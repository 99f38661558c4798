"""``python -m memex.backends.worker FD PARENT_PID``: a worker process (see ``_main``)."""

from ._main import main

main()
