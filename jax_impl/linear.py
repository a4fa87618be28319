"""`Linear`: Flax's nnx.Linear (kernel [in, out], bias) whose product takes, per shape, the fastest of
equivalent forms on the machine that runs it; `product` gives a tied head's x @ E^T the same choice.

Mirrors torch_impl/linear.py: each backend's CPU choice for the same projections. The parameters are
nnx.Linear's own, so the loader, sharding rules and checkpoints see no difference; only `dot_general` changes.

A product x [m, in] @ W with few rows m (a decode step) streams W, and how fast depends on how XLA:CPU lowers it,
which depends on the processor and the dtype; a product of more rows (a prompt's, a training step's forward) is
compute-bound. The forms that compute it (the single dot, split, pad, the project's CPU kernels gemv, gemm and
upcast) are jax_impl/product_forms.py's, which says why each one exists; `forms_for` says which apply to a product. A
key of more than CHOICE_MAX_ROWS rows is kept per power-of-two bucket of rows (`rows_key`) and timed at no more than
TIMED_MAX_ROWS rows over TIMED_MANY_COPIES distinct weights: compute-bound, its rate at a few hundred rows stands for
more.

None is fixed: the first trace of each (rows, in, out, dtype, layout) key asks `PATHS` (spec/path_choice.py),
which times the forms that apply, each a small program of its own (jax_impl/product_timing.py), over distinct
weights of that shape read from memory (a decode step's few rows: evicted from the caches first), as a decode step
streams its weights (a model's own inside `resident_weights`, which generate enters), and keeps the fastest for the
process (a kernel, where one applies, unless another form beats it in every round, or for a prompt's product by the
median round: `PATHS`): every later trace agrees, and a compiled program holds the form chosen when it was traced. A
weight under MIN_CHOICE_BYTES (a test model's) stays in cache and keeps the single dot unmeasured. One bfloat16 row is
not timed against the single dot where XLA lowers that dot through a float32 copy of the weight and the padded form does
not (`bf16_row_dot_copies`): the padded form moves less and is settled without a measurement.

Every form computes the same product up to the order of a float32 sum (product_forms.py). `PATHS.forced(path)` or
`dot_general(..., path=...)` pins a form while tracing (tests, comparisons). Sharded products and other backends than
the CPU keep the single dot.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
from flax import nnx

from jax_impl import product_timing
from jax_impl.product_forms import FORMS, SPLIT_CHUNKS, dot
from kernels.cpu import jax_gemm, jax_gemv
from spec.choice_rules import COMPUTE_BOUND
from spec.path_choice import PathChoice

# The first a key offers is its default, which another form replaces only by beating it in every timed round: the
# project's kernel where one applies -- the few-row one (it reads each weight once, in its stored layout), the many-row
# one (its timed passes vary far less than XLA's dot's on a prompt's product, so that with the dot as the default a dot
# slower on the median kept keys by winning one round: docs/design.md, "The kernels"), for bfloat16 the one on its
# own bf16 instructions before the float32-compute one -- else the single dot. A prompt's product is decided by the
# median of three rounds instead (spec/choice_rules.py's COMPUTE_BOUND): one slow pass of a faster form kept the
# default.
PATHS = PathChoice("jax_impl.linear", ("gemv", "gemm", "upcast", "dot", "split", "pad"))
CHOICE_MAX_ROWS = 8  # token rows up to which a product streams its weight (a decode step's); more are compute-bound
TIMED_MAX_ROWS = 256  # a compute-bound key is timed at no more rows than this
TIMED_MANY_COPIES = 2  # ... over this many distinct weights: reading them is a small share of its time
MIN_CHOICE_BYTES = 256 << 10  # smaller weights (test models) stay in cache and keep the dot unmeasured
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def _contracted(lhs: jax.Array, rhs: jax.Array, dimension_numbers) -> int | None:
    """0 for nnx.Linear's x[..., in] @ W[in, out], 1 for x[..., in] @ W[out, in]^T (a tied head), else None."""
    for axis in (0, 1):
        if rhs.ndim == 2 and dimension_numbers == (((lhs.ndim - 1,), (axis,)), ((), ())):
            return axis
    return None


def forms_for(lhs: jax.Array, rhs: jax.Array, dimension_numbers, out_sharding=None) -> tuple[str, ...]:
    """The forms that can compute this product, the single dot first; more than one only on the CPU, for unsharded
    float32 or bfloat16 products.

    Up to CHOICE_MAX_ROWS token rows: split, float32 x @ W[in, out] with in-features that make SPLIT_CHUNKS equal
    blocks; pad, a single bfloat16 row; gemv, where the CPU kernel was built. More rows: gemm, x @ W[in, out] where
    the many-row kernel of its dtype was built, and for bfloat16 upcast where gemm.c was (kernels/cpu/jax_gemm.py)."""
    axis = _contracted(lhs, rhs, dimension_numbers)
    rows = math.prod(lhs.shape[:-1])
    if not (
        axis is not None
        and out_sharding is None
        and lhs.dtype == rhs.dtype
        and jnp.dtype(lhs.dtype) in DTYPES
        and jax.default_backend() == "cpu"
        and jax.sharding.get_abstract_mesh().empty  # under a mesh the partitioner owns the product's layout
    ):
        return ("dot",)
    x2 = jax.ShapeDtypeStruct((rows, lhs.shape[-1]), lhs.dtype)
    if rows > CHOICE_MAX_ROWS:
        if axis != 0:
            return ("dot",)
        gemm = ("gemm",) if jax_gemm.supports(x2, rhs) else ()
        return ("dot", *gemm, *(("upcast",) if jax_gemm.supports_upcast(x2, rhs) else ()))
    f32 = jnp.dtype(lhs.dtype) == jnp.float32  # see the docstring for why each form has its dtype
    split = ("split",) if f32 and axis == 0 and rhs.shape[0] % SPLIT_CHUNKS == 0 else ()
    pad = ("pad",) if rows == 1 and not f32 else ()
    gemv = ("gemv",) if jax_gemv.supports(x2, rhs, "cols" if axis == 0 else "rows") else ()
    return ("dot", *split, *pad, *gemv)


def has_choice(lhs: jax.Array, rhs: jax.Array, dimension_numbers, out_sharding=None) -> bool:
    """True when `dot_general` chooses among forms for this product (forms_for names them)."""
    return len(forms_for(lhs, rhs, dimension_numbers, out_sharding)) > 1


def resident_weights(weights: Iterable[jax.Array]) -> contextlib.AbstractContextManager[None]:
    """Within the block (this thread), a measurement times over `weights` (a model's own arrays: jax_impl/generate.py
    passes its state's leaves) where they hold enough of the key's shape, instead of fresh memory
    (jax_impl/product_timing.py's `timed_weights`)."""
    return PATHS.timing_weights(weights, _resident_key)


def _resident_key(weight: jax.Array) -> tuple[tuple[int, ...], str]:
    return tuple(weight.shape), jnp.dtype(weight.dtype).name


def path_of(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None, preferred_element_type=None,
            out_sharding=None) -> str:  # fmt: skip
    """The form `dot_general` takes for these operands (abstract or concrete): forced, chosen before, or measured."""
    due = _due(lhs, rhs, dimension_numbers, out_sharding)
    if isinstance(due, str):
        return due
    key, timed = due
    axis, rows = _contracted(lhs, rhs, dimension_numbers), min(math.prod(lhs.shape[:-1]), TIMED_MAX_ROWS)
    copies = TIMED_MANY_COPIES if rows > CHOICE_MAX_ROWS else product_timing.MAX_COPIES

    def measure() -> dict:
        own = PATHS.resident(_resident_key(rhs))  # a model's weights of this shape, if offered
        streams = rows <= CHOICE_MAX_ROWS  # a decode step's product: timed from memory
        return product_timing.candidates(
            FORMS, timed, rows, rhs.shape, lhs.dtype, axis, precision, own, copies, streams
        )

    rule = COMPUTE_BOUND if rows > CHOICE_MAX_ROWS else {}  # a prompt's product: the median of three rounds
    return PATHS.choose(key, measure, **rule)


def _due(lhs: jax.Array, rhs: jax.Array, dimension_numbers, out_sharding=None) -> str | tuple[tuple, tuple[str, ...]]:
    """The form where no measurement applies (one form, forced, a weight that stays in cache, one left by a rule),
    else (the key, the forms its measurement times)."""
    forms = forms_for(lhs, rhs, dimension_numbers, out_sharding)
    if len(forms) == 1:
        return "dot"
    forced = PATHS.forced_path()
    if forced is not None:
        return forced if forced in forms else "dot"
    if math.prod(rhs.shape) * jnp.dtype(rhs.dtype).itemsize < MIN_CHOICE_BYTES:
        return "dot"  # a weight that stays in cache: nothing to stream, nothing worth measuring
    key = _key(lhs, rhs, _contracted(lhs, rhs, dimension_numbers))
    timed = _worth_timing(forms, math.prod(lhs.shape[:-1]), lhs.dtype)
    return PATHS.settle(key, timed[0]) if len(timed) == 1 else (key, timed)


def rows_key(rows: int) -> int:
    """The row count a choice is kept under: exact up to CHOICE_MAX_ROWS (a few rows stream the weight), else the
    power of two at or above it (compute-bound: the ranking does not turn within a factor of two of rows, and a
    prompt of each new length would otherwise measure again). torch_impl/linear.py keys its products alike."""
    return rows if rows <= CHOICE_MAX_ROWS else 1 << (rows - 1).bit_length()


def _key(lhs: jax.Array, rhs: jax.Array, axis: int) -> tuple:
    rows = rows_key(math.prod(lhs.shape[:-1]))
    return rows, rhs.shape[axis], rhs.shape[1 - axis], jnp.dtype(lhs.dtype).name, "x@W" if axis == 0 else "x@W^T"


def _worth_timing(forms: tuple[str, ...], rows: int, dtype) -> tuple[str, ...]:
    """The forms a measurement times. Not the single dot of one bfloat16 row where this XLA lowers it through a
    float32 copy of the whole weight and the padded form reads the weight as it is (`bf16_row_dot_copies`): 10
    bytes moved per weight element against 2. Timed alone it can look close, because a lone program's copy stays
    in cache; inside a decode step it ran several times slower, and a near-tie once chose it (docs/benchmarks.md).
    Where the lowering differs, both forms are timed."""
    if rows == 1 and jnp.dtype(dtype) == jnp.bfloat16 and "pad" in forms and bf16_row_dot_copies():
        return tuple(form for form in forms if form != "dot")
    return forms


@functools.cache
def bf16_row_dot_copies() -> bool:
    """Whether XLA lowers one bfloat16 row's single dot through a float32 copy of its weight while the padded form
    reads the weight as bf16: read once per process from the compiled pair on a small shape (the lowering depends
    on the jaxlib and may depend on the processor's bf16 support, so it is read here, not assumed). Part of
    choosing, so its time (two compilations, side by side) is charged to PATHS.cost()."""
    start = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        w = jax.ShapeDtypeStruct((256, 384), jnp.bfloat16)  # as a measurement's programs would take it
        compiling = product_timing.compiling(pool, FORMS, ("dot", "pad"), 1, w, 0, jax.lax.Precision.HIGHEST)
        dot, pad = ("f32[256,384]" in future.result().as_text() for future in compiling.values())
    copied = dot and not pad
    PATHS.charge(time.perf_counter() - start)
    return copied


def dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    out_sharding=None,
    *,
    path: str | None = None,
) -> jax.Array:
    """jax.lax.dot_general, except that x[..., in] @ W[in, out] (or W[out, in]^T) with few rows takes the form
    chosen for its shape. `path` ("dot", "split", "pad", "gemv") pins a form where it applies (else the single dot);
    None takes the measured one."""
    if path is None:
        path = path_of(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding)
    elif PATHS.check(path) not in forms_for(lhs, rhs, dimension_numbers, out_sharding):
        path = "dot"
    if path != "dot":
        axis = _contracted(lhs, rhs, dimension_numbers)
        return FORMS[path](lhs, rhs, axis, precision, preferred_element_type)
    return dot(lhs, rhs, dimension_numbers, precision, preferred_element_type, out_sharding)


def product(x: jax.Array, weight: jax.Array, precision=None) -> jax.Array:
    """x [..., in] @ weight[out, in]^T -> [..., out] in the form chosen for its shape: a tied head's logits
    (the embedding table [V, H] is such a weight) take the same choice as the Linear products."""
    return dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())), precision=precision)


class Linear(nnx.Linear):
    """nnx.Linear with this file's `dot_general`; every other argument is nnx.Linear's."""

    def __init__(self, in_features: int, out_features: int, **kwargs):
        super().__init__(in_features, out_features, dot_general=dot_general, **kwargs)
