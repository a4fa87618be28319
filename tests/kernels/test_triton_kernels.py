"""Triton kernels (kernels/triton/) against their torch references; twin of test_pallas_kernels.py.

Without a GPU the kernels run in Triton's interpreter (tests/kernels/conftest.py sets TRITON_INTERPRET=1),
which is slow: row counts stay small except for the narrowest widths.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kernels.triton import (  # noqa: E402
    add_rms_norm,
    add_rms_norm_reference,
    as_rows,
    silu_and_mul,
    silu_and_mul_reference,
)
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs  # noqa: E402

arn_module = importlib.import_module("kernels.triton.rms_norm")
sam_module = importlib.import_module("kernels.triton.swiglu")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WIDTHS = (1, 123, 1000, 896, 1024, 1536, 3072)
ROWS = (1, 3, 17)
EPS = 1e-6


def _t(a: np.ndarray, dtype: str) -> torch.Tensor:
    return torch.from_numpy(a).to(device=DEVICE, dtype=DTYPES[dtype])


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def _check_add_rms_norm(
    shape: tuple[int, ...], dtype: str, with_residual: bool, prefixes: tuple[int, ...] = ()
) -> None:
    """Fused vs reference on `shape`, and on its first `prefixes` rows against the same reference rows.

    The op is row-wise, so one reference call serves every row count (in JAX: one compile, not three).
    """
    x, residual = sample_inputs(shape, 0, "x"), sample_inputs(shape, 1, "residual") if with_residual else None
    weight = _t(sample_inputs(shape[-1:], 2, "weight"), dtype)
    want = add_rms_norm_reference(_t(x, dtype), _t(residual, dtype) if with_residual else None, weight, EPS)
    want = [_np(w) for w in want] if with_residual else [_np(want)]
    for n in (*prefixes, shape[0]):
        got = add_rms_norm(_t(x[:n], dtype), _t(residual[:n], dtype) if with_residual else None, weight, EPS)
        got = got if with_residual else (got,)
        assert all(g.shape == (n, *shape[1:]) and g.dtype == weight.dtype for g in got)
        for g, w, quantity in zip(got, want, ("add_rms_norm", "new_residual")[: len(got)], strict=True):
            assert_within_tolerance(_np(g), w[:n], quantity, dtype, str((n, *shape[1:])))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(dtype: str, width: int) -> None:
    _check_add_rms_norm((ROWS[-1], width), dtype, with_residual=True, prefixes=ROWS[:-1])
    _check_add_rms_norm((3, width), dtype, with_residual=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_many_rows(dtype: str) -> None:
    _check_add_rms_norm((257, 1), dtype, with_residual=True)
    _check_add_rms_norm((257, 123), dtype, with_residual=True)
    _check_add_rms_norm((257, 123), dtype, with_residual=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_wide_rows(dtype: str) -> None:
    _check_add_rms_norm((2, 9728), dtype, with_residual=True)  # Qwen3-4B's intermediate width


def test_add_rms_norm_3d_and_4d() -> None:
    _check_add_rms_norm((2, 5, 896), "bfloat16", with_residual=True)  # [batch, seq, H]
    _check_add_rms_norm((1, 2, 4, 128), "bfloat16", with_residual=False)  # per-head q/k norm: [b, s, heads, head_dim]


@pytest.mark.parametrize("width", [*WIDTHS, 9728])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype: str, width: int) -> None:
    x = sample_inputs((ROWS[-1], 2 * width), 7, "gate_up")
    want = _np(silu_and_mul_reference(_t(x, dtype)))  # row-wise: its first rows serve the smaller row counts
    for n in ROWS:
        got = silu_and_mul(_t(x[:n], dtype))
        assert got.shape == (n, width) and str(got.dtype).endswith(dtype)
        assert_within_tolerance(_np(got), want[:n], "silu_and_mul", dtype, str((n, 2 * width)))


def test_silu_and_mul_many_rows_and_3d() -> None:
    for shape in [(300, 2 * 123), (2, 3, 2 * 896)]:
        x = _t(sample_inputs(shape, 8, "gate_up"), "bfloat16")
        assert_within_tolerance(
            _np(silu_and_mul(x)), _np(silu_and_mul_reference(x)), "silu_and_mul", "bfloat16", str(shape)
        )


def test_known_answer() -> None:
    out = add_rms_norm(torch.tensor([[3.0, 4.0]], device=DEVICE), None, torch.ones(2, device=DEVICE), 1e-12)
    np.testing.assert_allclose(_np(out), [[0.8485281, 1.1313709]], rtol=1e-6)


def test_residual_is_not_updated_in_place_and_inputs_untouched() -> None:
    x, residual = _t(sample_inputs((3, 64), 0, "x"), "bfloat16"), _t(sample_inputs((3, 64), 1, "residual"), "bfloat16")
    weight = _t(sample_inputs((64,), 2, "weight"), "bfloat16")
    x0, residual0 = x.clone(), residual.clone()
    out, new_residual = add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(x, x0) and torch.equal(residual, residual0)
    assert new_residual.data_ptr() not in (x.data_ptr(), residual.data_ptr())
    assert torch.equal(new_residual, (x.float() + residual.float()).bfloat16())


def test_non_contiguous_inputs() -> None:
    wide = _t(sample_inputs((5, 300), 0, "x"), "float32")
    x = wide[:, 10:133]  # [5, 123], row stride 300: read in place through its row stride, no copy
    assert as_rows(x).data_ptr() == x.data_ptr()
    residual = _t(sample_inputs((123, 5), 1, "residual"), "float32").t()  # [5, 123], column stride 5: copied
    weight = _t(sample_inputs((246,), 2, "weight"), "float32")[::2]  # strided weight
    assert not x.is_contiguous() and not residual.is_contiguous() and not weight.is_contiguous()
    got = add_rms_norm(x, residual, weight, EPS)
    want = add_rms_norm_reference(x.contiguous(), residual.contiguous(), weight.contiguous(), EPS)
    for g, w, quantity in zip(got, want, ("add_rms_norm", "new_residual")[: len(got)], strict=True):
        assert g.is_contiguous()
        assert_within_tolerance(_np(g), _np(w), quantity, "float32", "non-contiguous")
    gate_up = _t(sample_inputs((246, 4), 3, "gate_up"), "float32").t()  # [4, 246], last-dim stride 4
    assert_within_tolerance(_np(silu_and_mul(gate_up)), _np(silu_and_mul_reference(gate_up)), "silu_and_mul", "float32")


def test_empty_input() -> None:
    x = torch.empty(0, 64, device=DEVICE)
    out, new_residual = add_rms_norm(x, x, torch.ones(64, device=DEVICE), EPS)
    assert out.shape == new_residual.shape == (0, 64)
    assert silu_and_mul(torch.empty(2, 0, 8, device=DEVICE)).shape == (2, 0, 4)


@pytest.mark.parametrize(("dtype", "with_residual"), [("float32", True), ("bfloat16", False)])
def test_add_rms_norm_gradients_match_reference(dtype: str, with_residual: bool) -> None:
    def leaves(seed: int) -> list[torch.Tensor | None]:
        x = _t(sample_inputs((3, 123), seed, "x"), dtype).requires_grad_()
        r = _t(sample_inputs((3, 123), seed + 1, "residual"), dtype).requires_grad_() if with_residual else None
        return [x, r, _t(sample_inputs((123,), seed + 2, "weight"), dtype).requires_grad_()]

    grads = []
    for fn in (add_rms_norm, add_rms_norm_reference):
        inputs = leaves(0)
        outs = fn(*inputs, EPS)
        outs = outs if isinstance(outs, tuple) else (outs,)
        # Use every output, with different cotangents, so both outputs' gradients are checked.
        loss = sum(
            (o.float() * (k + 1) * torch.linspace(-1, 1, o.shape[-1], device=DEVICE)).sum() for k, o in enumerate(outs)
        )
        loss.backward()
        grads.append([t.grad for t in inputs if t is not None])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # backward *is* the reference's backward


def test_silu_and_mul_gradient_matches_reference() -> None:
    grads = []
    for fn in (silu_and_mul, silu_and_mul_reference):
        x = _t(sample_inputs((3, 246), 0, "gate_up"), "float32").requires_grad_()
        (fn(x) * torch.linspace(-1, 1, 123, device=DEVICE)).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def _bad_call(case: str, arn, sam):
    x, w = torch.ones(2, 8, device=DEVICE), torch.ones(8, device=DEVICE)
    return {
        "residual shape": lambda: arn(x, torch.ones(2, 9, device=DEVICE), w, EPS),
        "residual dtype": lambda: arn(x, x.half(), w, EPS),
        "weight length": lambda: arn(x, None, torch.ones(9, device=DEVICE), EPS),
        "weight dtype": lambda: arn(x, None, w.half(), EPS),
        "eps zero": lambda: arn(x, None, w, 0.0),
        "eps negative": lambda: arn(x, None, w, -1e-6),
        "float64": lambda: arn(x.double(), None, w.double(), EPS),
        "int": lambda: sam(torch.ones(2, 8, dtype=torch.int32, device=DEVICE)),
        "odd width": lambda: sam(torch.ones(2, 7, device=DEVICE)),
    }[case]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("residual shape", r"residual has shape \(2, 9\) but x has shape \(2, 8\)"),
        ("residual dtype", r"residual has dtype torch.float16 but x has dtype torch.float32"),
        ("weight length", r"weight has shape \(9,\), expected \(8,\)"),
        ("weight dtype", r"weight has dtype torch.float16"),
        ("eps zero", r"eps must be a finite Python float > 0, got 0.0"),
        ("eps negative", r"eps must be"),
        ("float64", r"x has dtype torch.float64; supported dtypes are float32, bfloat16, float16"),
        ("int", r"x has dtype torch.int32"),
        ("odd width", r"even last dim >= 2, got \(2, 7\)"),
    ],
)
def test_errors_name_the_argument(case: str, message: str) -> None:
    # The fused path and the reference refuse exactly the same calls, with the same words.
    with pytest.raises((ValueError, TypeError), match=message):
        _bad_call(case, add_rms_norm, silu_and_mul)()
    with pytest.raises((ValueError, TypeError), match=message):
        _bad_call(case, add_rms_norm_reference, silu_and_mul_reference)()


def test_tensors_on_different_devices_are_refused() -> None:
    x = torch.ones(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"all tensors must be on one device, got \['(cpu|cuda:0)', 'meta'\]"):
        add_rms_norm(x, None, torch.ones(8, device="meta"), EPS)


@pytest.mark.skipif(DEVICE != "cpu", reason="about CPU tensors without interpret mode")
def test_cpu_tensors_without_interpret_mode_say_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import triton

    # What the module holds when it was imported without TRITON_INTERPRET: a compiled-kernel handle.
    compiled = triton.runtime.jit.JITFunction(arn_module._add_rms_norm_kernel.fn)
    monkeypatch.setattr(arn_module, "_add_rms_norm_kernel", compiled)
    with pytest.raises(RuntimeError, match=r"TRITON_INTERPRET=1.*kernels='reference'"):
        add_rms_norm(torch.ones(2, 8), None, torch.ones(8), EPS)


@pytest.mark.parametrize("width", [1, 2, 123, 896, 1000, 1024, 1536, 3072, 4096, 9728, 65536])
def test_block_config_obeys_gpu_rules(width: int) -> None:
    cfg = arn_module._block_config(width)
    assert cfg["BLOCK_H"] >= width and cfg["BLOCK_H"] < 2 * width + 1
    for n in (cfg["BLOCK_H"], cfg["BLOCK_ROWS"], cfg["num_warps"]):
        assert n & (n - 1) == 0, cfg  # tl.arange and the warp count need powers of two
    assert 1 <= cfg["num_warps"] <= 32 and cfg["BLOCK_ROWS"] * cfg["BLOCK_H"] <= arn_module.MAX_BLOCK_H
    cfg = sam_module._block_config(width)
    assert cfg["BLOCK_COLS"] <= 1024 and (cfg["BLOCK_COLS"] >= width or cfg["BLOCK_COLS"] == 1024)
    for n in (cfg["BLOCK_COLS"], cfg["BLOCK_ROWS"], cfg["num_warps"]):
        assert n & (n - 1) == 0, cfg
    assert 1 <= cfg["num_warps"] <= 8


def test_too_wide_rows_are_refused() -> None:
    with pytest.raises(ValueError, match=r"row width 65537 needs a block of 131072.*kernels='reference'"):
        arn_module._block_config(65537)


def test_package_exposes_functions_even_after_submodule_import() -> None:
    import kernels.triton as package

    assert callable(package.add_rms_norm) and callable(package.silu_and_mul)
    assert package.add_rms_norm is arn_module.add_rms_norm


_COMPILE_FOR_GPU = """
import importlib
import triton
from triton.backends.compiler import GPUTarget

arn = importlib.import_module("kernels.triton.rms_norm")
sam = importlib.import_module("kernels.triton.swiglu")
target = GPUTarget("cuda", 90, 32)  # sm_90 (Hopper): ptxas ships with triton, no GPU needed
for dtype, width in [("bf16", 123), ("fp16", 4096), ("fp32", 9728), ("bf16", 65536)]:
    cfg = arn._block_config(width)
    ptrs = dict.fromkeys(["x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "new_residual_ptr"], "*" + dtype)
    ints = dict.fromkeys(["n_rows", "n_cols", "x_row_stride", "residual_row_stride"], "i32")
    consts = {"HAS_RESIDUAL": True, "BLOCK_ROWS": cfg["BLOCK_ROWS"], "BLOCK_H": cfg["BLOCK_H"]}
    sig = {**ptrs, **ints, "eps": "fp32", **dict.fromkeys(consts, "constexpr")}
    src = triton.compiler.ASTSource(fn=arn._add_rms_norm_kernel, signature=sig, constexprs=consts)
    options = {"num_warps": cfg["num_warps"], "enable_fp_fusion": False}
    assert "cubin" in triton.compile(src, target=target, options=options).asm
    cfg = sam._block_config(width)
    consts = {"BLOCK_ROWS": cfg["BLOCK_ROWS"], "BLOCK_COLS": cfg["BLOCK_COLS"]}
    sig = {"x_ptr": "*" + dtype, "out_ptr": "*" + dtype, "n_rows": "i32", "n_inter": "i32", "x_row_stride": "i32"}
    sig.update(dict.fromkeys(consts, "constexpr"))
    src = triton.compiler.ASTSource(fn=sam._silu_and_mul_kernel, signature=sig, constexprs=consts)
    options = {"num_warps": cfg["num_warps"], "enable_fp_fusion": False}
    assert "cubin" in triton.compile(src, target=target, options=options).asm
print("compiled")
"""


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU every other test already runs the compiled kernels")
def test_kernels_compile_for_gpu() -> None:
    """Compile (not run) both kernels to a cubin for sm_90, as a GPU would: the interpreter checks the math,
    this checks that the same source passes Triton's compiler (power-of-two blocks, the bit-level rounding)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_GPU], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
