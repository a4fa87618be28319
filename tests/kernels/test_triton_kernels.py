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

import numpy as np
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


def _leaves(*arrays: torch.Tensor | None, grad: tuple[bool, ...] = (True, True, True)) -> list[torch.Tensor | None]:
    return [a.clone().requires_grad_(g) if a is not None else None for a, g in zip(arrays, grad, strict=True)]


def test_backward_with_unused_outputs_and_broadcast_cotangents() -> None:
    """torch hands the backward None for an unused output (read as absent: no zeros are materialized) and a
    stride-0 (expanded) cotangent for a .sum() (made unit-stride by as_rows); both match the reference's."""
    x, residual = _t(sample_inputs((5, 123), 0, "x"), "float32"), _t(sample_inputs((5, 123), 1, "residual"), "float32")
    weight = _t(sample_inputs((123,), 2, "weight"), "float32")
    for use in ("out", "new_residual", "both"):
        grads = []
        for fn in (add_rms_norm, add_rms_norm_reference):
            leaves = _leaves(x, residual, weight)
            out, new_residual = fn(*leaves, EPS)
            loss = {"out": out.sum(), "new_residual": new_residual.sum(), "both": out.sum() + 3 * new_residual.sum()}
            loss[use].backward()
            grads.append([leaf.grad for leaf in leaves])
        for quantity, got, want in zip(("d_x", "d_residual", "d_weight"), *grads, strict=True):
            if want is None:  # the weight has no gradient when only the new residual is used
                assert got is None, (use, quantity)
                continue
            assert_within_tolerance(to_numpy(got), to_numpy(want), quantity, "float32", use)


def test_backward_computes_only_what_is_asked() -> None:
    """A frozen weight (requires_grad False) and a residual that needs no gradient get none."""
    x, residual = _t(sample_inputs((3, 64), 0, "x"), "bfloat16"), _t(sample_inputs((3, 64), 1, "residual"), "bfloat16")
    x_leaf, residual_leaf, weight_leaf = _leaves(
        x, residual, _t(np.ones(64, np.float32), "bfloat16"), grad=(True, False, False)
    )
    out, _ = add_rms_norm(x_leaf, residual_leaf, weight_leaf, EPS)
    out.float().square().sum().backward()
    assert x_leaf.grad is not None and residual_leaf.grad is None and weight_leaf.grad is None


def test_backward_reads_row_strided_inputs() -> None:
    """Without a residual the backward reads x itself (saved as s): a column slice, through its row stride."""
    wide = _t(sample_inputs((5, 300), 0, "x"), "float32")
    weight = _t(sample_inputs((123,), 2, "weight"), "float32")
    d_out = _t(sample_inputs((5, 123), 3, "cotangent"), "float32")
    grads = []
    for fn in (add_rms_norm, add_rms_norm_reference):
        wide_leaf, w = _leaves(wide, weight, grad=(True, True))
        x = wide_leaf[:, 10:133]  # [5, 123], row stride 300
        assert as_rows(x).data_ptr() == x.data_ptr()
        fn(x, None, w, EPS).backward(d_out)
        grads.append((wide_leaf.grad, w.grad))
    for quantity, got, want in zip(("d_x", "d_weight"), *grads, strict=True):
        assert_within_tolerance(to_numpy(got), to_numpy(want), quantity, "float32", "row-strided")


def test_backward_is_once_differentiable() -> None:
    """The backward kernels have no backward of their own: asking for one is an error, not a silent zero."""
    x = _t(sample_inputs((2, 8), 0, "x"), "float32").requires_grad_()
    d_out = torch.ones(2, 8, device=DEVICE, requires_grad=True)  # a cotangent that itself needs a gradient
    out = add_rms_norm(x, None, torch.ones(8, device=DEVICE), EPS)
    (d_x,) = torch.autograd.grad(out, (x,), d_out, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        d_x.sum().backward()


def test_float64_is_refused() -> None:
    # The fused path and the reference refuse it with the same words (the other refusals: test_kernels.py).
    x, w = torch.ones(2, 8, device=DEVICE, dtype=torch.float64), torch.ones(8, device=DEVICE, dtype=torch.float64)
    message = r"x has dtype torch.float64; supported dtypes are float32, bfloat16, float16"
    with pytest.raises((ValueError, TypeError), match=message):
        add_rms_norm(x, None, w, EPS)
    with pytest.raises((ValueError, TypeError), match=message):
        add_rms_norm_reference(x, None, w, EPS)


def test_bf16_sums_round_to_nearest_even() -> None:
    """1 + (2^-8 + 2^-15) in bf16 (ulp 2^-7 at 1) is past half an ulp: to nearest, 1 + 2^-7, as torch rounds it;
    truncated (how Triton's interpreter casts), 1. And 1 + 2^-8, a tie, goes to the even 1. Both in the new
    residual that add_rms_norm stores, interpreted (rounded by hand) or compiled (the GPU's instruction)."""
    x = torch.ones(2, 8, device=DEVICE, dtype=torch.bfloat16)
    residual = torch.tensor([[2**-8 + 2**-15], [2**-8]], device=DEVICE, dtype=torch.bfloat16).expand(2, 8)
    _, new_residual = add_rms_norm(x, residual.contiguous(), torch.ones(8, device=DEVICE, dtype=torch.bfloat16), EPS)
    assert new_residual[:, 0].float().tolist() == [1 + 2**-7, 1.0]
    assert torch.equal(new_residual, (x.float() + residual.float()).to(torch.bfloat16))


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
arnb = importlib.import_module("kernels.triton.rms_norm_backward")
sam = importlib.import_module("kernels.triton.swiglu")
samb = importlib.import_module("kernels.triton.swiglu_backward")
target = GPUTarget("cuda", 90, 32)  # sm_90 (Hopper): ptxas ships with triton, no GPU needed
rounding = importlib.import_module("kernels.triton.rounding")
assert not rounding.BY_HAND  # compiled, a bf16 cast is the GPU's own cvt.rn, not the interpreter's rounding by hand
for forward in (arn._add_rms_norm_kernel, sam._gated_and_mul_kernel):  # one compilation for one row and for many
    assert [p.name for p in forward.params if p.do_not_specialize] == ["n_rows"], forward


def compile(fn, ptrs, ints, consts, num_warps, floats=()):
    sig = {**ptrs, **dict.fromkeys(ints, "i32"), **dict.fromkeys(floats, "fp32"), **dict.fromkeys(consts, "constexpr")}
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts)
    options = {"num_warps": num_warps, "enable_fp_fusion": False}
    asm = triton.compile(src, target=target, options=options).asm
    assert "cubin" in asm, fn
    assert "32767" not in asm["ptx"], fn  # 0x7FFF: the hand rounding's half-ulp, which a compiled kernel leaves out


for dtype, width in [("bf16", 123), ("fp16", 4096), ("fp32", 9728), ("bf16", 65536)]:
    d = "*" + dtype
    cfg = arn._block_config(width)
    ptrs = dict.fromkeys(["x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "new_residual_ptr"], d)
    ints = ["n_rows", "n_cols", "x_row_stride", "residual_row_stride"]
    for float32_weight in (False, True):  # Qwen/Llama's weight multiply, and Gemma's / OLMo 2's in float32
        consts = {"HAS_RESIDUAL": True, "FLOAT32_WEIGHT": float32_weight}
        consts |= {"BLOCK_ROWS": cfg["BLOCK_ROWS"], "BLOCK_H": cfg["BLOCK_H"]}
        compile(arn._add_rms_norm_kernel, ptrs, ints, consts, cfg["num_warps"], floats=["eps", "offset"])

    cfg = arnb._block_config(4099, width)
    ptrs = {**dict.fromkeys(["s_ptr", "weight_ptr", "d_out_ptr", "d_new_residual_ptr", "d_s_ptr"], d)}
    ptrs["partial_dw_ptr"] = "*fp32"
    ints = ["n_rows", "n_cols", "s_row_stride", "d_out_row_stride", "d_new_residual_row_stride"]
    ints = [*ints, "blocks_per_program"]
    for float32_weight in (False, True):
        consts = {"HAS_D_NEW_RESIDUAL": True, "FLOAT32_WEIGHT": float32_weight}
        consts |= {"BLOCK_ROWS": cfg["BLOCK_ROWS"], "BLOCK_H": cfg["BLOCK_H"]}
        compile(arnb._add_rms_norm_backward_kernel, ptrs, ints, consts, cfg["num_warps"], ["eps", "offset"])
    ptrs = {"partial_ptr": "*fp32", "out_ptr": d}
    compile(arnb._sum_partials_kernel, ptrs, ["n_partials", "n_cols"], {"BLOCK_COLS": arnb._SUM_BLOCK_COLS}, 4)

    for module, kernel, ptr_names, ints in [
        (sam, sam._gated_and_mul_kernel, ["x_ptr", "out_ptr"], ["n_rows", "n_inter", "x_row_stride"]),
        (
            samb,
            samb._gated_and_mul_backward_kernel,
            ["x_ptr", "d_out_ptr", "d_x_ptr"],
            ["n_rows", "n_inter", "x_row_stride", "d_out_row_stride"],
        ),
    ]:
        cfg = module._block_config(width)
        for activation in ("silu", "gelu_tanh"):
            consts = {"ACTIVATION": activation, "BLOCK_ROWS": cfg["BLOCK_ROWS"], "BLOCK_COLS": cfg["BLOCK_COLS"]}
            compile(kernel, dict.fromkeys(ptr_names, d), ints, consts, cfg["num_warps"])
print("compiled")
"""


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU every other test already runs the compiled kernels")
def test_kernels_compile_for_gpu() -> None:
    """Compile (not run) every kernel, forward and backward, to a cubin for sm_90, as a GPU would: the interpreter
    checks the math, this checks that the same source passes Triton's compiler (power-of-two blocks, the
    backward's loop over row blocks), and that compiled, a bf16 cast is the GPU's own rounding instruction: the
    rounding by hand on the bits (kernels/triton/rounding.py) is for the interpreter, which truncates."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_GPU], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
