"""The cluster of ``memex serve`` on Ray (docs/scaling.md), in one package above the serving
core and the backends: the *slabs* that hold sessions on the nodes (``_slab``), the storage
they save to (``_storage``), the *control actor* that keeps the cluster's directory, ledger,
placement and config (``_control``, its parts each in a module: ``_directory``,
``_placement``, ``_turns``, ``_checkpoints``, ``_records``), the fronts' leases on what they
hold (``_leases``) and
the typed records the control actor answers with (``_replies``) and a slab's (``_direct``:
its outcomes, its direct path's messages and their codec). The fronts' HTTP side is
``memex.service``'s, which reaches this package through ``memex.cluster.internal``.

Nothing here is for an application: a cluster is used through ``memex serve`` and
``memex.RemoteBackend``. The public surface is empty on purpose (pinned in
tests/test_public_api.py)."""

__all__: list[str] = []
