"""CPU kernels: the few-row product of a decode step (gemv.c), compiled on the machine that runs it (build.py),
with a launcher per framework (torch_gemv.py, jax_gemv.py) and a float64 reference (reference.py); and a decode
step's small operators (decode_ops.c: launched by torch_decode_ops.py against the layers' references, and its
attention by jax_decode_ops.py through XLA's FFI); and a dense layer's whole decode step built from both
(decode_layer.c, its phases in decode_layer.h: launched by torch_decode_layer.py, consecutive layers by
torch_decode_stack.py, on an OpenMP team and by jax_decode_layer.py through XLA's FFI, decode_layer_ffi.cc, on XLA's
pool; its operands in decode_layer_operands.py);
and a prompt's many-row products (gemm.c, gemm_amx.c and gemm_dpbf16.c in Flax's layout, launched by jax_gemm.py
through XLA's FFI; gemm_amx_rows.c in torch's, launched by torch_gemm.py); and the eviction of a timing pass's
operands from the caches (evict.c, evict.py), for the backends' path choices.

Unlike kernels/triton and kernels/pallas, which are GPU kernels checked on CPU in interpret mode, these run
natively on the CPU; the product only where it was measured faster than the libraries (torch_impl/linear.py,
jax_impl/linear.py choose per product shape). This module imports neither torch nor jax.
"""
