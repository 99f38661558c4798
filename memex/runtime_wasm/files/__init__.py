"""The files room: the disk ledger keyed on inodes (``_disk``), bounded iterative walks of
guest-built trees (``_tree``) and the guest's files as the host reads and writes them
(``_hostfiles``). Imports the engine room and the runtime's leaf records only."""

__all__: list[str] = []
