"""How jax_impl/linear.py times the forms of one product key: each form a small program of its own, run over distinct
weights of the key's shape read from memory (evicted from the caches before each pass), as a decode step streams its
weights.

jax_impl only: a torch path is timed by calling it (torch_impl/linear.py's `_candidates`); an XLA form must first be
lowered and compiled, which is most of what choosing costs (docs/benchmarks.md). The weights timed over are a model's
own where the caller offers them (`timed_weights`), else views of one arena of ones (`host_arena`).
"""

from __future__ import annotations

import functools
import math
import mmap
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from kernels.cpu.evict import evicting
from spec.path_choice import Pass, Timed

STREAM_BYTES = 64 << 20  # the weights one timing pass streams, evicted from the caches before it
MAX_COPIES = 16  # at most this many distinct weights per pass: small products stay cheap to time
ARENA_ALIGN = 64  # the alignment at which XLA's CPU client takes a host buffer without copying it (`host_arena`)

Form = Callable[..., jax.Array]  # (lhs, rhs, axis, precision, preferred_element_type) -> the product


@functools.cache
def host_arena(dtype: str) -> np.ndarray:
    """STREAM_BYTES of ones, written once per process, at a page-aligned (so ARENA_ALIGN-aligned) address: XLA's CPU
    client then takes each timed weight (a view of it whose byte size is a multiple of the alignment) as it is,
    where from a plain numpy array it copied every key's weights (docs/benchmarks.md). Its pages are mapped in one
    call (MAP_POPULATE, Linux), not faulted in one at a time by numpy's single-threaded fill, which on a VM can cost
    more than the fill (docs/benchmarks.md; torch fills its own arena on its threads). Never written again."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)  # POPULATE: Linux only
    arena = np.frombuffer(mmap.mmap(-1, STREAM_BYTES, flags=flags), jnp.dtype(dtype))  # keeps the map alive
    arena[:] = 1
    return arena


def timed_weights(own: list[jax.Array], copies: int, shape: tuple[int, int], dtype) -> list[jax.Array]:
    """`copies` distinct weights of `shape` for the timing passes: a model's own (`own`, the caller's weights of the
    key's full shape) where there are that many, or, for a table larger than STREAM_BYTES timed on its first rows,
    a view of those rows (contiguous and aligned: the CPU client takes it without a copy); else views of the arena,
    whose pages are mapped when it is first asked for. Nothing is copied either way, and a model's weights are in
    memory already: the very memory its products stream. Mapping the arena cost several times more beside the
    benchmark's other backends than in a process of its own (docs/benchmarks.md)."""
    if len(own) >= copies and own[0].shape == shape:
        return own[:copies]
    if own and own[0].shape != shape and own[0].shape[1:] == shape[1:]:  # x @ W^T over a table: its first rows
        return [jax.device_put(np.asarray(own[0])[: shape[0]])]
    host = host_arena(jnp.dtype(dtype).name)[: copies * math.prod(shape)].reshape(copies, *shape)
    return [jax.device_put(w) for w in host]  # distinct device buffers (views of the arena)


def timed_x(form: str, rows: int, k: int, dtype) -> jax.ShapeDtypeStruct:
    """x as `form`'s timing program takes it (`candidates` says why): [in] for one row, else [rows, in]; float32
    for the kernel, which computes in it."""
    return jax.ShapeDtypeStruct((k,) if rows == 1 else (rows, k), jnp.float32 if form == "gemv" else dtype)


def compiling(pool: ThreadPoolExecutor, table: Mapping[str, Form], forms: tuple[str, ...], rows: int,
              w: jax.ShapeDtypeStruct, axis: int, precision=None) -> dict[str, Future]:  # fmt: skip
    """{form: its timing program (`table[form]`) for `rows` rows and weights like `w`, compiling on `pool` from the
    moment it is lowered}. Lowered in a trace of its own even while the caller traces, and outside compile-time
    evaluation, under which the padded form's zero row would be computed (and compiled) on the spot."""
    k = w.shape[axis]
    return {
        name: pool.submit(
            jax.jit(functools.partial(table[name], axis=axis, precision=precision, preferred_element_type=jnp.float32))
            .lower(timed_x(name, rows, k, w.dtype), w)
            .compile
        )
        for name in forms
    }


def filled(shape: tuple[int, ...], dtype, value: int) -> jax.Array:
    """A concrete array of `value`, even while the caller traces, made on the host and copied in: built by jnp, each
    such array would compile a program of its own, which costs more than the timing it serves."""
    with jax.ensure_compile_time_eval():
        return jax.device_put(np.full(shape, value, jnp.dtype(dtype)))


def timed_pass(rhs_shape: tuple[int, int], dtype, axis: int, max_copies: int = MAX_COPIES
               ) -> tuple[tuple[int, int], int]:  # fmt: skip
    """(the weight shape a timing pass takes, how many distinct weights of it the pass streams): the key's own shape,
    up to STREAM_BYTES in all and `max_copies` weights, or, for a larger weight (a tied head's table), one with as
    many output features as fit in STREAM_BYTES."""
    k, itemsize = rhs_shape[axis], jnp.dtype(dtype).itemsize
    if math.prod(rhs_shape) * itemsize > STREAM_BYTES:
        out = max(1, STREAM_BYTES // (k * itemsize))
        rhs_shape = (out, k) if axis == 1 else (k, out)
    return rhs_shape, max(1, min(max_copies, STREAM_BYTES // (math.prod(rhs_shape) * itemsize)))


def candidates(table: Mapping[str, Form], forms: tuple[str, ...], rows: int, rhs_shape: tuple[int, int], dtype,
               axis: int, precision, own: list[jax.Array], max_copies: int = MAX_COPIES,
               streams: bool = True) -> dict[str, Timed]:  # fmt: skip
    """One timing pass per form: the product of `rows` rows over the distinct weights of `timed_pass` (at most
    `max_copies`), a model's own (`own`) where they suffice (`timed_weights`); where it `streams` (a decode step's
    few rows), its weights evicted from the caches before each pass (untimed, spec/path_choice.py's Pass), as a decode
    step finds them in memory.

    Each form is its own small program, compiled on a thread of its own from the moment it is lowered
    (`compiling`), so that choosing costs about one compilation per key. The programs leave out what a model's
    program fuses into the operations around the product and what XLA:CPU would otherwise compile as kernels of
    their own, each one a compilation that times nothing the forms differ in (docs/benchmarks.md): one row is
    passed as a vector, not reshaped from [1, in]; the kernel's x comes in the float32 it computes in; the result
    stays float32, not rounded to the operands' dtype (`timed_x`). The product's own operations (the dot, the
    custom call, a float32 copy of a bfloat16 weight where XLA makes one) are the ones a model's program runs
    (tests/jax_impl/test_linear.py compares them)."""
    dtype = jnp.dtype(dtype)
    k = rhs_shape[axis]
    rhs_shape, copies = timed_pass(rhs_shape, dtype, axis, max_copies)
    with ThreadPoolExecutor(len(forms)) as pool:
        programs = compiling(pool, table, forms, rows, jax.ShapeDtypeStruct(rhs_shape, dtype), axis, precision)
        with jax.ensure_compile_time_eval():  # concrete arrays, even while the caller traces
            x_of = {name: timed_x(name, rows, k, dtype) for name in forms}
            xs = {name: filled(x.shape, x.dtype, 1) for name, x in x_of.items()}
            weights = timed_weights(own, copies, rhs_shape, dtype)
        compiled = {name: future.result() for name, future in programs.items()}

    def run(program: Callable, x: jax.Array, warm: list[bool]) -> None:
        jax.block_until_ready([program(x, w) for w in (weights if warm else weights[:1])])  # the first: set-up
        warm.append(True)

    passes = {name: functools.partial(run, compiled[name], xs[name], []) for name in forms}
    evict = evicting(buffers(weights)) if streams else None
    return passes if evict is None else {name: Pass(run, evict) for name, run in passes.items()}


def buffers(arrays: Iterable[jax.Array]) -> list[tuple[int, int]]:
    """(address, bytes) of each array's memory on the CPU, for kernels/cpu/evict.py."""
    return [(a.unsafe_buffer_pointer(), a.nbytes) for a in arrays]
