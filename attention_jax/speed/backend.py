"""Which devices a program is built for: read once, where the program is made, never inside a trace.

Four choices differ by backend, all of the same numbers to float rounding: attention's "auto"
form and the fused form's kernel (`speed.forms`), the dense layer's low-precision backward
(`speed.dense`), decoding's product (`decoding.layout`), and how many training steps go in one
call (`train.loop`). Each takes a `Backend`, which the programs that use them resolve when they
are built (`Engine`: from its devices; `Decoder`: from the default devices; both take an explicit
`backend=`), so a program built for other devices than this process's (an export for cuda or
tpu, a mesh) gets their forms, not the CPU's.

    backend_of("tpu")                        # a name: "cpu", "cuda" (or "gpu"), "rocm", "tpu"
    backend_of(Backend("cuda", 7.5))         # an NVIDIA GPU of that compute capability (a T4)
    backend_of(jax.devices())                # devices, a mesh, or None: this process's default ones
"""
from __future__ import annotations

import dataclasses
import math

from attention_jax.errors import ConfigError

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")      # jax.export's names
ALIASES = {"gpu": "cuda"}                       # jax.default_backend()'s name for an NVIDIA GPU


@dataclasses.dataclass(frozen=True)
class Backend:
    """A platform (`PLATFORMS`) and, for an NVIDIA GPU, its compute capability (None: not known,
    taken to be a current one, >= 8.0)."""
    platform: str
    capability: float | None = None

    def __post_init__(self):
        platform = ALIASES.get(self.platform, self.platform)
        if platform not in PLATFORMS:
            raise ConfigError(f"backend {self.platform!r}; choose one of {', '.join(PLATFORMS)} "
                              "(or 'gpu' for cuda)")
        c = self.capability
        number = isinstance(c, (int, float)) and not isinstance(c, bool)
        if c is not None and not (number and math.isfinite(c) and c > 0):    # nan passes `c <= 0`
            raise ConfigError(f"capability={c!r} must be a GPU's compute capability, such as 8.0")
        if self.capability is not None and platform != "cuda":
            raise ConfigError(f"capability={self.capability} is an NVIDIA GPU's; the {platform} "
                              "backend has none")
        object.__setattr__(self, "platform", platform)

    @property
    def cpu(self) -> bool:
        return self.platform == "cpu"

    def __str__(self) -> str:
        said = f" (compute capability {self.capability:g})" if self.capability else ""
        return self.platform + said


def default_devices() -> list:
    """This process's default devices: the one place a backend is read from JAX when none is
    given."""
    import jax
    return jax.devices()


def _of_device(device) -> Backend:
    if device.platform != "gpu":
        return Backend(device.platform if device.platform in PLATFORMS else "cpu")
    if "rocm" in str(getattr(getattr(device, "client", None), "platform_version", "")).lower():
        return Backend("rocm")
    try:        # "8.6" on an NVIDIA GPU
        capability = float(getattr(device, "compute_capability", ""))
    except (TypeError, ValueError):
        capability = None
    return Backend("cuda", capability if capability and math.isfinite(capability) else None)


def backend_of(where=None) -> Backend:
    """The `Backend` of `where`: None (this process's default devices), a `Backend`, a name
    ("cpu", "cuda" or "gpu", "rocm", "tpu"), a device, a sequence of devices, or a mesh."""
    if isinstance(where, Backend):
        return where
    if isinstance(where, str):
        return Backend(where.lower())
    if where is None:
        where = default_devices()
    devices = getattr(where, "devices", where)      # a Mesh holds an array of devices
    try:
        flat = [devices] if hasattr(devices, "platform") else \
            list(getattr(devices, "flat", devices))
    except TypeError:                               # no device, and nothing that holds some
        flat = []
    if not flat or not all(hasattr(d, "platform") for d in flat):
        raise ConfigError(f"backend={where!r}: give a name ({', '.join(PLATFORMS)}), a Backend, "
                          "devices or a mesh")
    kinds = {_of_device(d) for d in flat}
    if len(kinds) > 1:
        named = ", ".join(sorted(map(str, kinds)))
        raise ConfigError(f"the devices are of {len(kinds)} kinds ({named}); build a program for "
                          "devices of one kind")
    return kinds.pop()
