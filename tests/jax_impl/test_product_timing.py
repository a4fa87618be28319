"""jax_impl/product_timing.py: the programs that time a product's forms run the product a model runs, over weights
that stream from memory as a decode step's do, nothing copied: a model's own where it offers enough of them,
else views of one aligned arena."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_impl.linear as linear_module
from jax_impl import product_timing
from jax_impl.linear import FORMS, dot_general, forms_for, has_choice, path_of
from spec.path_choice import Pass

LINEAR_DIMS = (((1,), (0,)), ((), ()))  # nnx.Linear's dimension numbers for a 2-D input
ON_CPU = jax.default_backend() == "cpu"


def weight_ops(program_text: str, w_shape: tuple[int, int]) -> list[str]:
    """A compiled program's operations on the weight, operand names and metadata left out: its dots and custom
    calls (result type, dimensions, target) and any float32 copy of the weight."""
    copy = f"f32[{w_shape[0]},{w_shape[1]}]"
    ops = []
    for line in program_text.splitlines():
        m = re.match(r"\s*(?:ROOT )?%\S+ = (\S+) (dot|custom-call|convert)\([^)]*\)(.*)", line)
        if m and (m[2] != "convert" or m[1].startswith(copy)):
            ops.append(f"{m[1].split('{')[0]} {m[2]}{re.sub(r', metadata=.*', '', m[3])}")
    return sorted(ops)


@pytest.mark.skipif(not ON_CPU, reason="XLA:CPU's programs")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(("axis", "w_shape"), [(0, (1024, 1536)), (1, (1536, 1024))])  # x @ W, a tied head's x @ W^T
@pytest.mark.parametrize("rows", [1, 3, 128])  # 128: a prompt's, where float32 x @ W has the many-row kernel
def test_timed_programs_run_the_products_a_model_runs(dtype, axis, w_shape, rows):
    """The timing programs drop glue a model fuses away (a row as a vector, float32 in and out around the
    kernel); what touches the weight must stay as a model's program compiles it, or the timing measures another
    product: the same dots, custom calls and float32 copies of the weight."""
    k, dims = w_shape[axis], (((2,), (axis,)), ((), ()))
    x, w = jax.ShapeDtypeStruct((1, rows, k), dtype), jax.ShapeDtypeStruct(w_shape, dtype)
    forms = forms_for(x, w, dims)
    if len(forms) == 1:  # float32 x @ W^T without the CPU kernel: no choice, nothing timed
        pytest.skip(f"one form for this product here: {forms}")
    with ThreadPoolExecutor(len(forms)) as pool:
        timed = {
            name: future.result()
            for name, future in product_timing.compiling(pool, FORMS, forms, rows, w, axis).items()
        }
    for form in forms:
        model = jax.jit(lambda x, w, form=form: dot_general(x, w, dims, path=form)).lower(x, w).compile()
        assert weight_ops(timed[form].as_text(), w_shape) == weight_ops(model.as_text(), w_shape) != [], form


@pytest.mark.skipif(not ON_CPU, reason="the timing arena is a CPU measurement's")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_timing_arena_is_aligned_ones_that_the_cpu_client_takes_without_a_copy(dtype):
    """The measurement's weights are views of one arena: aligned, so that putting them on the device copies
    nothing (each key's 64 MB was copied before), and all ones (never the lazily zeroed pages a fresh
    allocation reads as, which would stay in cache and time nothing)."""
    arena = product_timing.host_arena(dtype)
    assert arena.ctypes.data % product_timing.ARENA_ALIGN == 0
    assert arena.nbytes == product_timing.STREAM_BYTES and arena.dtype == jnp.dtype(dtype)
    assert np.all(arena[::4099] == 1) and arena[-1] == 1
    views = arena[: 4 * 256 * 384].reshape(4, 256, 384)  # 384 KiB / 192 KiB per weight: multiples of 64 bytes
    weights = [jax.device_put(view) for view in views]
    assert [w.unsafe_buffer_pointer() for w in weights] == [view.ctypes.data for view in views]


@pytest.mark.skipif(not ON_CPU, reason="the timed weights are a CPU measurement's")
def test_a_models_own_weights_are_timed_where_it_has_enough_of_them(fresh_choices, monkeypatch):
    """Inside `resident_weights`, a measurement times over the model's own arrays (no arena, nothing copied): as
    many as a pass streams, a large table's first rows as a view of it; too few of a shape to leave the cache, and
    it falls back to the arena. path_of hands the block's weights of the key's shape to the measurement."""
    own = [jnp.full((256, 1024), i, jnp.float32) for i in range(20)]  # 1 MiB each: a pass takes 16 of them
    got = product_timing.timed_weights(own, 16, (256, 1024), jnp.float32)
    assert [w.unsafe_buffer_pointer() for w in got] == [w.unsafe_buffer_pointer() for w in own[:16]]
    rows = product_timing.STREAM_BYTES // 4096  # a float32 table of 1024 columns: this many rows make a pass
    table = jnp.ones((rows + 64, 1024), jnp.float32)
    (head,) = product_timing.timed_weights([table], 1, (rows, 1024), jnp.float32)
    assert head.shape == (rows, 1024) and head.unsafe_buffer_pointer() == table.unsafe_buffer_pointer()
    few = product_timing.timed_weights(own[:3], 16, (256, 1024), jnp.float32)  # 3 MiB would stay in cache
    assert len(few) == 16 and few[0].unsafe_buffer_pointer() == product_timing.host_arena("float32").ctypes.data

    offered, streamed = [], []

    def measured(_table, forms, _rows, _shape, _dtype, _axis, _precision, own, _copies, streams):
        offered.append(own)  # as path_of passed it
        streamed.append(streams)
        return {form: lambda: None for form in forms}

    weights = [jnp.zeros((1024, 1536), jnp.float32) for _ in range(3)]
    x = jax.ShapeDtypeStruct((1, 1024), jnp.float32)
    assert has_choice(x, weights[0], LINEAR_DIMS)
    monkeypatch.setattr(product_timing, "candidates", measured)
    with linear_module.resident_weights([*weights, own[0]]):
        path_of(x, weights[0], LINEAR_DIMS)
    assert [[w.unsafe_buffer_pointer() for w in ws] for ws in offered] == [[w.unsafe_buffer_pointer() for w in weights]]
    assert streamed == [True]  # one row streams its weight: timed from memory


@pytest.mark.skipif(not ON_CPU, reason="the timing passes are a CPU measurement's")
@pytest.mark.parametrize("streams", [True, False])
def test_streaming_passes_evict_their_weights_first(streams, monkeypatch):
    """A decode step's passes are Passes that evict exactly the weights they stream before each timed pass
    (spec/path_choice.py), so they read them from memory as the step does; a compute-bound key's passes do not."""
    evicted: list[list[tuple[int, int]]] = []
    monkeypatch.setattr(product_timing, "evicting", lambda buffers: evicted.append(list(buffers)) or (lambda: None))
    own = [jnp.full((256, 1024), i, jnp.float32) for i in range(16)]  # 1 MiB each: a pass takes 16
    passes = product_timing.candidates(FORMS, ("dot",), 1, (1024, 256), jnp.float32, 0, None, [], streams=streams)
    own_passes = product_timing.candidates(FORMS, ("dot",), 1, (256, 1024), jnp.float32, 1, None, own, streams=streams)
    if not streams:
        assert evicted == [] and not any(isinstance(p, Pass) for p in (*passes.values(), *own_passes.values()))
        return
    assert isinstance(passes["dot"], Pass) and isinstance(own_passes["dot"], Pass)
    arena = product_timing.host_arena("float32").ctypes.data
    assert evicted[0] == [(arena + i * (1 << 20), 1 << 20) for i in range(16)]  # views of the arena
    assert evicted[1] == [(w.unsafe_buffer_pointer(), 1 << 20) for w in own]
    passes["dot"]()  # and the passes run
