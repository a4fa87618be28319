"""kernels/cpu: the few-row product (gemv.c) through both launchers (torch_gemv.py, jax_gemv.py) against its float64
reference, at odd widths, every row count up to MAX_ROWS, with and without bias, float32 and bfloat16 weights; how
it is built (build.py) and what happens where it cannot be.

The bound is the float32 table's (reordered float32 sums; parity/tolerances.py): every variant accumulates in
float32, and a bfloat16 weight is widened exactly, so its product is held to the same bound against the float64
product of its own values. A result rounded to bfloat16 (the launchers' bf16 output) adds one rounding: 2**-8.
"""

from __future__ import annotations

import platform
import shutil

import ml_dtypes
import numpy as np
import pytest

from kernels.cpu import build
from kernels.cpu.reference import gemv_reference
from parity.tolerances import TOLERANCES

MAX_REL = TOLERANCES["float32"].max_rel
BF16_OUT = 2.0**-8  # one rounding of the float32 result to bfloat16
SHAPES = [(1, 1), (7, 5), (33, 17), (37, 53), (300, 4099), (896, 1536)]  # (in, out): tails in every loop
CAN_BUILD = build._unsupported() is None  # x86-64 with AVX2 and FMA, and a C compiler: every CI machine


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def operands(rows: int, in_: int, out: int, bf16: bool, seed: int = 0):
    gen = np.random.default_rng(seed)
    x = gen.standard_normal((rows, in_)).astype(np.float32)
    w = gen.standard_normal((out, in_)).astype(np.float32)  # [out, in]
    if bf16:
        w = w.astype(ml_dtypes.bfloat16)
    return x, w, gen.standard_normal(out).astype(np.float32)


def test_the_kernel_builds_where_it_can():
    """On an x86-64 machine with AVX2, FMA and a C compiler (every machine CI runs on) both libraries build: a
    broken source fails here, instead of the backends quietly keeping their library paths."""
    if not CAN_BUILD:
        pytest.skip(f"not buildable here: {build._unsupported()}")
    assert build.load("gemv") is not None, build.unavailable("gemv")
    pytest.importorskip("jax")
    from kernels.cpu import jax_gemv

    assert jax_gemv.available(), build.unavailable("gemv_xla")


def test_unbuildable_machines_get_a_reason(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert "x86-64" in build._unsupported()
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    assert build._unsupported() == "the processor lacks avx2, fma"
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "no C compiler" in build._unsupported()


def test_a_failed_compile_is_reported_not_raised(monkeypatch, tmp_path):
    if not CAN_BUILD:
        pytest.skip(f"not buildable here: {build._unsupported()}")
    monkeypatch.setattr(build, "HERE", tmp_path)  # a source that does not compile
    (tmp_path / "gemv.c").write_text("this is not C\n")
    monkeypatch.setattr(build, "default_cache_dir", lambda: tmp_path / "cache")
    build.load.cache_clear()
    try:
        assert build.load("gemv") is None
        assert build.unavailable("gemv").startswith("building gemv failed")
        assert not list((tmp_path / "cache" / "kernels").glob("*.so"))  # nothing half-written left behind
    finally:
        build.load.cache_clear()
        build._why.pop("gemv", None)


def test_a_built_library_is_reused(monkeypatch, tmp_path):
    if not CAN_BUILD:
        pytest.skip(f"not buildable here: {build._unsupported()}")
    monkeypatch.setattr(build, "default_cache_dir", lambda: tmp_path)
    first = build._build("gemv", ("gemv.c",), ())
    stamp = first.stat().st_mtime_ns
    assert build._build("gemv", ("gemv.c",), ()) == first and first.stat().st_mtime_ns == stamp


class TestTorch:
    torch = pytest.importorskip("torch")

    @pytest.fixture(autouse=True)
    def _needs_kernel(self):
        from kernels.cpu import torch_gemv

        if not torch_gemv.available():
            pytest.skip(f"kernel not built here: {build.unavailable('gemv')}")

    @pytest.mark.parametrize("rows", range(1, 9))
    @pytest.mark.parametrize(("in_", "out"), SHAPES)
    @pytest.mark.parametrize("bf16", [False, True])
    def test_matches_float64_reference(self, rows, in_, out, bf16):
        from kernels.cpu.torch_gemv import gemv

        torch = self.torch
        x, w, b = operands(rows, in_, out, bf16)
        dtype = torch.bfloat16 if bf16 else torch.float32
        wt = torch.from_numpy(w.astype(np.float32)).to(dtype)
        xt, bt = torch.from_numpy(x).to(dtype), torch.from_numpy(b).to(dtype)
        for bias in (None, bt):
            got = gemv(xt, wt, bias)
            assert got.shape == (rows, out) and got.dtype == dtype
            want = gemv_reference(
                xt.float().numpy(), wt.float().numpy(), None if bias is None else bias.float(), "rows"
            )
            assert rel(got.float().numpy(), want) <= (BF16_OUT if bf16 else MAX_REL)

    def test_thread_count_does_not_change_the_result(self):
        from kernels.cpu.torch_gemv import gemv

        torch = self.torch
        x, w, _ = operands(3, 1024, 1000, False)
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)
        threads = torch.get_num_threads()
        results = []
        try:
            for n in (1, 2, 3):
                torch.set_num_threads(n)
                results.append(gemv(xt, wt))
        finally:
            torch.set_num_threads(threads)
        assert all(torch.equal(results[0], r) for r in results[1:])

    def test_bad_operands_name_the_problem(self):
        from kernels.cpu.torch_gemv import MAX_ROWS, gemv

        torch = self.torch
        w = torch.ones(6, 4)
        with pytest.raises(ValueError, match=r"x \(9, 4\)"):
            gemv(torch.ones(MAX_ROWS + 1, 4), w)
        with pytest.raises(ValueError, match=r"weight \(4, 6\)"):
            gemv(torch.ones(1, 4), w.T)  # a transposed view: not contiguous
        with pytest.raises(ValueError, match="float64"):
            gemv(torch.ones(1, 4, dtype=torch.float64), w.double())
        with pytest.raises(ValueError, match=r"bias \(5,\)"):
            gemv(torch.ones(1, 4), w, torch.ones(5))


class TestJax:
    jax = pytest.importorskip("jax")

    @pytest.fixture(autouse=True)
    def _needs_kernel(self):
        from kernels.cpu import jax_gemv

        if self.jax.default_backend() != "cpu" or not jax_gemv.available():
            pytest.skip(f"kernel not built here: {build.unavailable('gemv_xla')}")

    @pytest.mark.parametrize("rows", [1, 2, 5, 8])
    @pytest.mark.parametrize(("in_", "out"), SHAPES)
    @pytest.mark.parametrize("bf16", [False, True])
    @pytest.mark.parametrize("layout", ["rows", "cols"])
    def test_matches_float64_reference(self, rows, in_, out, bf16, layout):
        import jax.numpy as jnp

        from kernels.cpu.jax_gemv import gemv

        x, w, _ = operands(rows, in_, out, bf16)
        w = w if layout == "rows" else np.ascontiguousarray(w.T)  # [in, out] for Flax's layout
        got = self.jax.jit(gemv, static_argnums=2)(jnp.asarray(x), jnp.asarray(w), layout)
        assert got.shape == (rows, out) and got.dtype == jnp.float32
        assert rel(got, gemv_reference(x, w, None, layout)) <= MAX_REL

    @pytest.mark.parametrize("layout", ["rows", "cols"])
    def test_gradients_are_the_plain_products(self, layout):
        import jax.numpy as jnp

        from kernels.cpu.jax_gemv import gemv

        x, w, _ = operands(2, 37, 53, False)
        w = jnp.asarray(w if layout == "rows" else w.T)
        hi = self.jax.lax.Precision.HIGHEST

        def plain(x, w):
            return jnp.dot(x, w.T if layout == "rows" else w, precision=hi)

        def loss(f, x, w):
            return jnp.sum(jnp.sin(f(x, w)))

        got = self.jax.grad(lambda x, w: loss(lambda a, b: gemv(a, b, layout), x, w), argnums=(0, 1))(x, w)
        want = self.jax.grad(lambda x, w: loss(plain, x, w), argnums=(0, 1))(x, w)
        for g, r in zip(got, want, strict=True):
            assert rel(g, np.asarray(r, np.float64)) <= 10 * MAX_REL  # the forward's reordering, through sin'

    def test_bad_operands_name_the_problem(self):
        import jax.numpy as jnp

        from kernels.cpu.jax_gemv import gemv

        with pytest.raises(ValueError, match=r"x \(1, 4\).*w \(5, 6\)"):
            gemv(jnp.ones((1, 4)), jnp.ones((5, 6)), "cols")  # in 4 against W's 5 rows
        with pytest.raises(ValueError, match="layout 'diag'"):
            gemv(jnp.ones((1, 4)), jnp.ones((4, 6)), "diag")
        with pytest.raises(ValueError, match=r"x \(9, 4\)"):
            gemv(jnp.ones((9, 4)), jnp.ones((4, 6)), "cols")


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_whole_model_through_the_kernel_matches_the_library_path(backend):
    """The built-in checkpoint's forward (5 token rows: every product within the kernel's rows, the tied head
    included) with every product pinned to the kernel equals the same forward on the plain library path within the
    float32 table; the pinned program really calls the kernel (torch: the profiler records its operator; JAX: its
    custom call is in the lowered program)."""
    pytest.importorskip(f"{backend}_impl")
    import spec
    from tests.backends import load, to_numpy

    linear = __import__(f"{backend}_impl.linear", fromlist=["PATHS"])
    if backend == "torch":
        from kernels.cpu import torch_gemv as launcher
    else:
        from kernels.cpu import jax_gemv as launcher
    if not launcher.available():
        pytest.skip(f"kernel not built here: {build.unavailable('gemv')}")
    model = load(backend, spec.default_checkpoint())
    ids = np.array([[3, 141, 59, 26, 5]])
    plain = "f_linear" if backend == "torch" else "dot"
    out = {}
    for path in (plain, "gemv"):
        if backend == "jax":
            import jax

            jax.clear_caches()  # a compiled forward holds the forms it was traced with
        with linear.PATHS.forced(path):
            if backend == "torch":
                import torch

                with torch.inference_mode(), torch.profiler.profile() as profile:
                    out[path] = to_numpy(model(ids))
                calls = sum(event.name == "decoder_parity::gemv" for event in profile.events())
                assert (calls > 0) is (path == "gemv")  # the profiler sees the kernel's operator
            else:
                from flax import nnx

                from jax_impl.model import forward

                out[path] = to_numpy(model(ids))
                graphdef, state = nnx.split(model)
                valid = np.ones(ids.shape, bool)
                program = forward.lower(graphdef, state, ids, valid, None, last_only=False, trace=False).as_text()
                assert ("decoder_parity_Gemv" in program) is (path == "gemv")
    assert out["gemv"].shape == out[plain].shape == (1, 5, model.spec.vocab_size)
    assert rel(out["gemv"], out[plain].astype(np.float64)) <= MAX_REL
