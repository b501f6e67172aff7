"""More than one process: start JAX's distributed runtime, place host data, read results back.

One process per host (or per GPU), each seeing its local devices; together they form one
global mesh, and the engine's batch axis is split over all of it. Every process computes
the same batches (they depend only on seed and step) and hands JAX the rows its own
devices hold; the parameters are replicated, so any process can read them back. Only
process 0 writes files (results, logs, checksums); orbax saves and restores checkpoints
with every process taking part.

    initialize("10.0.0.1:1234", num_processes=2, process_id=0)   # on host 0,
                                                                 # before any JAX computation
    initialize("10.0.0.1:1234", num_processes=2, process_id=1)   # on host 1

On a Cloud TPU pod slice or under SLURM/Open MPI, `initialize(auto=True)` lets JAX find all three.
"""
from __future__ import annotations

import jax
import numpy as np

from attention_jax.errors import ConfigError


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False, timeout: float = 60.0) -> bool:
    """Join the processes of one run (before any JAX computation); False when there is nothing to
    join. `auto`: let JAX find them (a Cloud TPU pod slice, SLURM, Open MPI). `timeout`: seconds
    to wait for the others; a process other than 0 first waits for the coordinator to answer
    (in Python, so Ctrl-C stops it) and raises `ConfigError` naming the address if it does not."""
    if not auto and not coordinator:
        return False
    if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
        raise ConfigError(f"process_id={process_id} is outside 0 .. {num_processes - 1} "
                          f"for num_processes={num_processes}; "
                          "number the processes from 0")   # before any wait
    jax.config.update("jax_cpu_collectives_implementation", "gloo")   # CPU processes talk over TCP
    if auto:
        jax.distributed.initialize(initialization_timeout=int(timeout))
        return True
    if process_id:   # JAX itself would wait minutes in native code,
                     # deaf to Ctrl-C, then abort the process
        _wait_for(coordinator, timeout)
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                               initialization_timeout=max(1, int(timeout)))
    return True


def _wait_for(address: str, timeout: float) -> None:
    """Until something listens at host:port, or `timeout` seconds have gone."""
    import socket
    import time
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"coordinator {address!r} is not HOST:PORT (e.g. 10.0.0.1:8476)")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=min(2.0, timeout)):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConfigError(f"no coordinator answered at {address} within {timeout:g} s "
                                  f"({e.strerror or e}); "
                                  "start process 0 there first, or check the address") from None
            time.sleep(0.2)


def is_writer() -> bool:
    """Process 0 writes the files; the others compute the same things and keep quiet."""
    return jax.process_index() == 0


def put(host: np.ndarray, sharding) -> jax.Array:
    """Host data onto a (possibly multi-process) sharding: each process supplies its own
    devices' part."""
    if jax.process_count() == 1:
        return jax.device_put(host, sharding)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def local(tree):
    """Each replicated array as this process's own copy (PRNG keys stay keys), e.g. to
    build a model."""
    return jax.tree.map(lambda a: a.addressable_data(0)
                        if isinstance(a, jax.Array) and not a.is_fully_addressable
                        else jax.device_get(a), tree)


def to_host(tree):
    """Device arrays -> numpy, for replicated arrays even when some of their devices are
    another process's."""
    def one(a):
        if isinstance(a, jax.Array) and not a.is_fully_addressable:
            return np.asarray(a.addressable_data(0))
        return np.asarray(jax.device_get(a))
    return jax.tree.map(one, tree)


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (after process 0 has changed files, say)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
