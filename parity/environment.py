"""What the frameworks read once, set up in one place: the Triton interpreter and JAX's CPU device count.

Triton decides between compiling and interpreting a kernel when its module is imported (TRITON_INTERPRET),
and JAX fixes its number of CPU devices when its backend starts (the first computation). Both are process
state that must be set before that moment, so the parity check, the generate CLI and the test session all
call `prepare_environment` first; a Python caller can too (`parity.check(..., tp=2)` does it itself, so it
works from a fresh interpreter). Nothing here runs at import.
"""

from __future__ import annotations

import os
import re
import sys

from spec import InputError


def prepare_environment(kernels: str = "reference", tp: int = 1) -> None:
    """Make `kernels="fused"` runnable without a GPU and give JAX at least `tp` CPU devices."""
    if kernels == "fused":
        _interpret_triton_on_cpu()
    if tp > 1:
        _jax_cpu_devices(tp)


def _interpret_triton_on_cpu() -> None:
    """TRITON_INTERPRET=1 when there is no GPU. An explicit TRITON_INTERPRET from the user wins; Pallas needs
    nothing (it picks interpret mode per call on CPU)."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch  # importing torch does not import triton

    if torch.cuda.is_available():
        return
    if "kernels.triton.rms_norm" in sys.modules or "kernels.triton.swiglu" in sys.modules:
        return  # already decorated: the kernel's own launch check explains what to do
    os.environ["TRITON_INTERPRET"] = "1"


def _jax_cpu_devices(count: int) -> None:
    """At least `count` CPU devices for a simulated mesh; refused, naming the fix, once JAX has started."""
    import jax
    from jax._src import xla_bridge  # backends_are_initialized: the one way to ask without starting them

    if not xla_bridge.backends_are_initialized():
        flag = re.search(r"xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
        if jax.config.jax_num_cpu_devices < count and not (flag and int(flag.group(1)) >= count):
            jax.config.update("jax_num_cpu_devices", count)
        return
    if jax.default_backend() == "cpu" and len(jax.devices()) < count:
        raise InputError(
            f"tensor parallelism over {count} devices needs {count} JAX CPU devices, but JAX already started "
            f"with {len(jax.devices())}: call parity.prepare_environment(tp={count}) before any JAX computation"
        )
