"""kernels/cpu/gemm.c, gemm_amx.c and gemm_dpbf16.c: the many-row float32 (AVX-512) and bfloat16 (AMX; AVX512_BF16)
products through their JAX launcher (jax_gemm.py), each library on its own wherever it builds, against their float64
reference (reference.py), at shapes that leave a tail in every loop (gemm.c: row tiles of 12, row blocks of 192,
panels of 32 columns, K blocks of 256; gemm_amx.c: blocks of 32 rows, 32 columns and 32 k, groups of 16 panels, K
blocks of 256, the padded copies of x and y; gemm_dpbf16.c: row tiles of 6, row blocks of 192, panels of 64 columns
in 16-column vectors, K blocks of 512, an odd k left alone in its pair); gemm.c's bfloat16 entry (`upcast`) bit for
bit its float32 entry on the widened operands; that an output's sum does not depend on where its row falls; bad
operands refused by name; and which processors build them (kernels/cpu/build.py's ISA).

The bound is the float32 table's (reordered float32 sums; parity/tolerances.py) for all three: a bf16 product is exact
in float32 and each kernel returns the float32 sum unrounded. A bf16 model's prompt with every product on this
processor's bf16 kernel, or on `upcast`, is held to the bf16 table's bound against the same prompt on XLA's dot."""

from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_impl
from kernels.cpu import build, jax_gemm
from kernels.cpu.reference import gemv_reference
from parity.tolerances import TOLERANCES
from tests.kernels.decode_layer_cases import MASK, PROMPT, SPECS, write

MAX_REL = TOLERANCES["float32"].max_rel
CAN_BUILD = build._unsupported("gemm_xla") is None  # x86-64 with AVX-512 (not every CI machine) and a compiler
needs_kernel = pytest.mark.skipif(not CAN_BUILD, reason=f"not buildable here: {build._unsupported('gemm_xla')}")
ODD_SHAPES = [(1, 1, 1), (11, 7, 5), (12, 255, 16), (13, 257, 17), (25, 300, 33), (32, 64, 32), (193, 513, 67),
              (400, 64, 100), (64, 600, 1100), (7, 1025, 65), (6, 512, 64), (5, 3, 129), (197, 1023, 130)]  # fmt: skip


def buildable(dtype: str, library: str):
    why = build._unsupported(library)
    return pytest.param(dtype, library, id=library, marks=pytest.mark.skipif(why is not None, reason=str(why)))


# every library on its own: AMX processors have AVX512_BF16 too, and their bf16 products take AMX's kernel
KERNELS = [buildable(dtype, library) for dtype, choices in jax_gemm.LIBRARIES.items() for library, _ in choices]
SUMS_IN_K_ORDER = [buildable("float32", "gemm_xla"), buildable("bfloat16", "gemm_dpbf16_xla")]


@pytest.fixture
def only(monkeypatch):
    """only(dtype, library): jax_gemm's kernel for `dtype` is `library`'s for this test."""

    def pin(dtype: str, library: str) -> None:
        monkeypatch.setitem(jax_gemm.LIBRARIES, dtype, tuple(c for c in jax_gemm.LIBRARIES[dtype] if c[0] == library))
        assert jax_gemm.library(dtype)[0] == library, jax_gemm.unavailable(dtype)

    return pin


def rel(got: jax.Array, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def operands(rows: int, in_: int, out: int, seed: int = 0, dtype: str = "float32") -> tuple[jax.Array, jax.Array]:
    gen = np.random.default_rng(seed)
    x = jnp.asarray(gen.standard_normal((rows, in_)), dtype)
    w = jnp.asarray(gen.standard_normal((in_, out)), dtype)  # [in, out]: Flax's kernel layout
    return x, w


@pytest.mark.parametrize(
    ("library", "flag"), [("gemm_xla", "avx512f"), ("gemm_amx_xla", "amx"), ("gemm_dpbf16_xla", "avx512_bf16")]
)
def test_the_kernels_build_where_the_processor_has_their_instructions(library, flag):
    """Where the processor has what a library is compiled for, it builds and registers (a broken source fails here
    instead of jax_impl quietly keeping XLA's dot); elsewhere the reason names what is missing."""
    why = build._unsupported(library)
    if why is not None:
        assert flag in why or build._unsupported() is not None
        return
    symbol = dict(c for choices in jax_gemm.LIBRARIES.values() for c in choices)[library]
    assert jax_gemm._registered(library, symbol), build.unavailable(library)


def test_bfloat16_takes_amx_where_both_build():
    """The preference jax_gemm's docstring argues: AMX's kernel where it builds, else vdpbf16ps's, else none."""
    want = next((name for name, _ in jax_gemm.LIBRARIES["bfloat16"] if build._unsupported(name) is None), None)
    assert (jax_gemm.library("bfloat16") or (None,))[0] == want
    assert [name for name, _ in jax_gemm.LIBRARIES["bfloat16"]] == ["gemm_amx_xla", "gemm_dpbf16_xla"]


def test_processors_without_avx512_get_a_reason(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert build._unsupported("gemm_xla") == "the processor lacks avx512f"
    assert build._unsupported("gemm_amx_xla") == "the processor lacks avx512f, avx512bw, amx_tile, amx_bf16"
    assert build._unsupported("gemm_dpbf16_xla") == "the processor lacks avx512f, avx512bw, avx512_bf16"
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f", "avx512bw"}))
    assert build._unsupported("gemm_amx_xla") == "the processor lacks amx_tile, amx_bf16"  # AVX-512 without AMX
    assert build._unsupported("gemm_dpbf16_xla") == "the processor lacks avx512_bf16"  # Skylake-SP, Ice Lake
    assert "avx512f" not in (build._unsupported("gemv_xla") or "")  # the AVX2 kernels ask for no more


@pytest.mark.parametrize(("dtype", "library"), KERNELS)
@pytest.mark.parametrize(("rows", "in_", "out"), ODD_SHAPES)
def test_matches_float64_product(only, dtype, library, rows, in_, out):
    only(dtype, library)
    x, w = operands(rows, in_, out, dtype=dtype)
    got = jax.jit(jax_gemm.gemm)(x, w)
    assert got.shape == (rows, out) and got.dtype == jnp.float32
    assert rel(got, gemv_reference(np.asarray(x), np.asarray(w), None, "cols")) <= MAX_REL


@needs_kernel
@pytest.mark.parametrize(("rows", "in_", "out"), ODD_SHAPES)
def test_upcast_is_the_float32_kernel_on_widened_operands(rows, in_, out):
    """gemm.c's bfloat16 entry widens each value exactly as it packs it and runs the float32 entry's loops: its result
    is bit for bit the float32 product of the widened operands (a rounding or a lost tail would show here), and so
    within the float32 bound of the float64 product."""
    x, w = operands(rows, in_, out, seed=2, dtype="bfloat16")
    got = np.asarray(jax.jit(jax_gemm.upcast)(x, w))
    assert got.shape == (rows, out) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.asarray(jax.jit(jax_gemm.gemm)(x.astype(jnp.float32), w.astype(jnp.float32))))
    assert rel(got, gemv_reference(np.asarray(x), np.asarray(w), None, "cols")) <= MAX_REL


@pytest.mark.parametrize(("dtype", "library"), SUMS_IN_K_ORDER)
def test_a_rows_sum_does_not_depend_on_its_place(only, dtype, library):
    """Each output is one chain of multiply-adds (pairs of them for vdpbf16ps) in k order, whatever row tile, row
    block or thread computes it: a row's result is bit for bit the same in a product of 401 rows (three row blocks, a
    short last tile) as alone, and alone with the columns of another product beside it."""
    only(dtype, library)
    x, w = operands(401, 600, 70, seed=1, dtype=dtype)
    whole = np.asarray(jax.jit(jax_gemm.gemm)(x, w))
    for row in (0, 5, 6, 11, 12, 191, 192, 400):
        alone = np.asarray(jax.jit(jax_gemm.gemm)(x[row : row + 1], w))
        np.testing.assert_array_equal(whole[row : row + 1], alone)
    wider = np.asarray(jax.jit(jax_gemm.gemm)(x[:7], jnp.concatenate([w, w[:, :61]], axis=1)))
    np.testing.assert_array_equal(wider[:, :70], whole[:7])


@needs_kernel
def test_bad_operands_are_refused_by_name():
    x, w = operands(16, 40, 24)
    with pytest.raises(ValueError, match=r"gemm: x \(16, 40\) float32, w \(24, 40\) float32"):
        jax_gemm.gemm(x, w.T)  # W [out, in]: not the kernel's layout
    with pytest.raises(ValueError, match="bfloat16"):
        jax_gemm.gemm(x, w.astype(jnp.bfloat16))  # mixed dtypes
    with pytest.raises(ValueError, match="float16"):
        jax_gemm.gemm(x.astype(jnp.float16), w.astype(jnp.float16))  # no kernel for it
    with pytest.raises(ValueError, match=r"x \(16, 0\)"):
        jax_gemm.gemm(x[:, :0], w[:0])
    with pytest.raises(ValueError, match=r"upcast: x \(16, 40\) float32, w \(40, 24\) float32: .* both bfloat16"):
        jax_gemm.upcast(x, w)  # float32 operands: gemm's
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match=r"upcast: x \(16, 40\) bfloat16, w \(24, 40\) bfloat16"):
        jax_gemm.upcast(xb, wb.T)


BF16_FORMS = [
    pytest.param("gemm", marks=pytest.mark.skipif(not jax_gemm.available("bfloat16"), reason="no bf16 kernel here")),
    pytest.param("upcast", marks=needs_kernel),
]


@pytest.mark.parametrize("form", BF16_FORMS)  # the kernel on bf16 instructions; gemm.c's float32 loops
@pytest.mark.parametrize("shape", list(SPECS))  # Qwen3's, odd widths (76, 100, 20), Qwen2's with q/k/v biases
def test_a_bf16_prompt_on_the_kernel_matches_the_dot(tmp_path, form, shape, monkeypatch):
    """A bf16 model's forward over a 3 x 5 prompt (15 rows: more than a decode step's) with every product pinned to
    `form` gives the logits of XLA's dot within the bf16 table's bound for its depth, the kernel running every layer's
    q, k, v, o, gate_up and down projections and an untied head (a tied head, x @ E^T, is not its layout)."""
    from jax_impl import linear

    write(tmp_path, SPECS[shape])
    model = jax_impl.from_pretrained(tmp_path, "bfloat16")
    calls = []
    kernel = getattr(jax_gemm, form)
    monkeypatch.setattr(jax_gemm, form, lambda x, w: calls.append(w.shape) or kernel(x, w))
    jax.clear_caches()  # the forward's compiled program holds the forms it was traced with
    with linear.PATHS.forced(form):
        got = np.asarray(model(PROMPT, attention_mask=MASK), np.float64)
    spec = model.spec
    products = 6 * spec.num_hidden_layers + (not spec.tie_word_embeddings)
    assert len(calls) == products
    jax.clear_caches()
    with linear.PATHS.forced("dot"):
        want = np.asarray(model(PROMPT, attention_mask=MASK), np.float64)
    assert len(calls) == products  # no kernel in the dot's program
    bound = TOLERANCES["bfloat16"].bound(spec.num_hidden_layers)
    keep = MASK.astype(bool)  # padded positions attend to nothing meaningful
    assert np.abs(got - want)[keep].max() / np.abs(want)[keep].max() <= bound.max_rel
