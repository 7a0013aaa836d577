"""Joining a Ray cluster, for the environment pool's actors (`rl.env_pool.ray`) and the sampler
actor (`rl.overlap.ray`).

Ray itself waits minutes for a cluster that is not there (its GCS connection timeout) and then
raises with a traceback; an address is the user's input, so one that nothing answers at is refused
at once with a line naming the field (exit 2).
"""

from __future__ import annotations

import os
import socket

from agentrl.config import ConfigError

PROBE_S = 5.0
"""How long to wait for the cluster's port to accept a connection."""


def join(section: str, address: str | None):
    """Ray, joined to the cluster at `address` (None: $RAY_ADDRESS, else a local cluster started
    here) unless this process has joined one already. Returns (ray, owns): `owns` when this call
    started Ray, so the caller shuts it down when done. `section`: the config section asking
    (`rl.env_pool`), for the messages."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"{section}.backend: ray needs Ray: pip install 'agentrl[ray]'") from None
    if ray.is_initialized():
        return ray, False
    field, where = (f"{section}.ray.address", address) if address else ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS"))
    if where and where not in ("auto", "local"):
        host, _, port = where.removeprefix("ray://").rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"{field}: {where!r} is not host:port (or ray://host:port, auto, local)")
        try:
            socket.create_connection((host, int(port)), timeout=PROBE_S).close()
        except OSError as err:
            raise ConfigError(f"{field}: no Ray cluster answers at {where} ({err.strerror or err})") from None
    ray.init(address=address, include_dashboard=False)
    return ray, True
