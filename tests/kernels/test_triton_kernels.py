"""Triton kernels (kernels/triton/): what only the torch side has. The cases both frameworks share are in
test_kernels.py; this is the twin of test_pallas_kernels.py.

Torch specifics: outputs are new tensors (inputs untouched), strided inputs, autograd, devices, and float64
(which JAX cannot express without jax_enable_x64). Triton specifics: the launch check without interpret mode
and a compile for a GPU. Without a GPU the kernels run in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before any kernel module is imported), which is slow: shapes stay small.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends import to_numpy
from tests.kernels.frameworks import EPS, framework
from tests.kernels.tolerances import assert_within_tolerance, sample_inputs

TRITON = framework("triton")
torch = pytest.importorskip("torch")

from kernels.triton import (  # noqa: E402
    add_rms_norm,
    add_rms_norm_reference,
    as_rows,
    silu_and_mul,
    silu_and_mul_reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_t = TRITON.array


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
        assert_within_tolerance(to_numpy(g), to_numpy(w), quantity, "float32", "non-contiguous")
    gate_up = _t(sample_inputs((246, 4), 3, "gate_up"), "float32").t()  # [4, 246], last-dim stride 4
    assert_within_tolerance(
        to_numpy(silu_and_mul(gate_up)), to_numpy(silu_and_mul_reference(gate_up)), "silu_and_mul", "float32"
    )


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


def test_float64_is_refused() -> None:
    # The fused path and the reference refuse it with the same words (the other refusals: test_kernels.py).
    x, w = torch.ones(2, 8, device=DEVICE, dtype=torch.float64), torch.ones(8, device=DEVICE, dtype=torch.float64)
    message = r"x has dtype torch.float64; supported dtypes are float32, bfloat16, float16"
    with pytest.raises((ValueError, TypeError), match=message):
        add_rms_norm(x, None, w, EPS)
    with pytest.raises((ValueError, TypeError), match=message):
        add_rms_norm_reference(x, None, w, EPS)


def test_tensors_on_different_devices_are_refused() -> None:
    x = torch.ones(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"all tensors must be on one device, got \['(cpu|cuda:0)', 'meta'\]"):
        add_rms_norm(x, None, torch.ones(8, device="meta"), EPS)


@pytest.mark.skipif(DEVICE != "cpu", reason="about CPU tensors without interpret mode")
def test_cpu_tensors_without_interpret_mode_say_how_to_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import triton

    # What the module holds when it was imported without TRITON_INTERPRET: a compiled-kernel handle.
    compiled = triton.runtime.jit.JITFunction(TRITON.rms_norm._add_rms_norm_kernel.fn)
    monkeypatch.setattr(TRITON.rms_norm, "_add_rms_norm_kernel", compiled)
    with pytest.raises(RuntimeError, match=r"TRITON_INTERPRET=1.*kernels='reference'"):
        add_rms_norm(torch.ones(2, 8), None, torch.ones(8), EPS)


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
