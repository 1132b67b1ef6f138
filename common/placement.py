"""Where a process of a run computes: what a step's placement is made of (the
`placement` view, `StageContext.place`)."""

from __future__ import annotations

import socket
import sys


def here() -> dict[str, str | None]:
    """This process's Ray node id (None outside a Ray session) and host name."""
    node = None
    if "ray" in sys.modules:  # a step that never used Ray does not import it to say so
        import ray

        if ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
    return {"node": node, "host": socket.gethostname()}
