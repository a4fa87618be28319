"""Compiling and loading the CPU kernels (kernels/cpu/gemv.c with its 512-bit loops gemv_avx512.c,
kernels/cpu/decode_ops.c and decode_layer.c, which composes the two, and for JAX their XLA bindings gemv_ffi.cc and
decode_ops_ffi.cc; and only on the processors `ISA` names, for JAX gemm.c with gemm_ffi.cc (AVX-512), gemm_dpbf16.c
with gemm_dpbf16_ffi.cc (AVX512_BF16) and gemm_amx.c with gemm_amx_ffi.cc (AMX), for torch gemm_amx_rows.c (AMX)
and gemm.c with gemm_upcast_rows.c (AVX-512)).

The kernels are C, compiled on the machine that runs them at first use, with its C compiler, into the project's
cache directory (spec.default_cache_dir(): $XDG_CACHE_HOME/decoder-parity), under a name that hashes the sources
and the flags, so an edited source is rebuilt and a built one is reused by every later process (a compile takes
seconds, once per machine). Written to a temporary name and renamed: two processes building at once never load a
half-written file.

Where a kernel cannot be had -- not x86-64, no AVX2 and FMA (or what `ISA` adds), no compiler, a failed compile --
`load` returns None and `unavailable(name)` says why; the backends then offer only their library paths
(torch_impl/linear.py, jax_impl/linear.py), so nothing needs the kernels to run. Framework-neutral: imports neither
torch nor jax.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Hashable, Mapping
from pathlib import Path

from spec.default import default_cache_dir

HERE = Path(__file__).resolve().parent
# compiling; the link adds -shared. No contraction of a * b + c into one rounding: where a kernel wants a fused
# multiply-add it says so (gemv.c's intrinsics); decode_ops.c rounds as its reference does.
C_FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-fPIC", "-std=gnu11")
CXX_FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-fPIC", "-std=c++17")
REQUIRED_FLAGS = ("avx2", "fma")  # /proc/cpuinfo names of what gemv.c is compiled for
SOURCES = {  # per library: what it compiles (.c, .cc) and the headers they include, all hashed into its name
    "gemv": ("gemv.c", "gemv_avx512.c", "gemv.h", "gemv_loops.h", "bf16.h"),
    "gemv_xla": ("gemv.c", "gemv_avx512.c", "gemv_ffi.cc", "gemv.h", "gemv_loops.h", "xla_pool.h", "bf16.h"),
    "decode_ops": ("decode_ops.c", "attend.c", "attend_amx.c", "amx.h", "decode_ops.h", "vec8.h", "bf16.h"),
    "decode_ops_xla": (
        "decode_ops.c",
        "attend.c",
        "attend_amx.c",
        "amx.h",
        "decode_ops_ffi.cc",
        "decode_ops.h",
        "vec8.h",
        "xla_pool.h",
        "bf16.h",
    ),
    # a layer from both
    "decode_layer": (
        "gemv.c",
        "gemv_avx512.c",
        "decode_ops.c",
        "attend.c",
        "attend_amx.c",
        "amx.h",
        "decode_layer.c",
        "gemv.h",
        "gemv_loops.h",
        "decode_layer.h",
        "decode_ops.h",
        "vec8.h",
        "bf16.h",
    ),
    "decode_layer_xla": (
        "gemv.c",
        "gemv_avx512.c",
        "gemv.h",
        "gemv_loops.h",
        "decode_ops.c",
        "attend.c",
        "attend_amx.c",
        "amx.h",
        "decode_layer.c",
        "decode_layer_ffi.cc",
        "decode_layer.h",
        "xla_pool.h",
        "bf16.h",
    ),
    "gemm_xla": ("gemm.c", "gemm_ffi.cc", "gemm_ffi.h", "xla_pool.h"),
    "gemm_dpbf16_xla": ("gemm_dpbf16.c", "gemm_dpbf16_ffi.cc", "gemm_ffi.h", "xla_pool.h"),
    "evict": ("evict.c",),  # the path choices' timing passes (kernels/cpu/evict.py)
    "gemm_amx_xla": ("gemm_amx.c", "gemm_amx_ffi.cc", "amx.h", "xla_pool.h"),
    "gemm_amx_rows": ("gemm_amx_rows.c", "amx.h", "bf16.h"),  # torch's layout, through ctypes
    "gemm_upcast_rows": ("gemm.c", "gemm_upcast_rows.c", "bf16.h"),  # torch's layout, through ctypes
}
# per library, beyond the flags above: (compile flags, the /proc/cpuinfo flags the processor must have for them)
ISA = {
    "gemm_xla": (("-mavx512f",), ("avx512f",)),
    "gemm_upcast_rows": (("-mavx512f",), ("avx512f",)),
    "gemm_dpbf16_xla": (("-mavx512f", "-mavx512bw", "-mavx512bf16"), ("avx512f", "avx512bw", "avx512_bf16")),
    "gemm_amx_xla": (
        ("-mavx512f", "-mavx512bw", "-mamx-tile", "-mamx-bf16"),
        ("avx512f", "avx512bw", "amx_tile", "amx_bf16"),
    ),
    "gemm_amx_rows": (
        ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mamx-tile", "-mamx-bf16"),
        ("avx512f", "avx512bw", "avx512vl", "amx_tile", "amx_bf16"),
    ),
}

_why: dict[str, str] = {}


def cpu_flags() -> frozenset[str]:
    """The processor's feature flags as Linux reports them (empty where /proc/cpuinfo is not there)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for row in text.splitlines():
        if row.startswith("flags"):
            return frozenset(row.split(":", 1)[1].split())
    return frozenset()


def unavailable(name: str) -> str | None:
    """Why the library `name` could not be loaded in this process, or None (loaded, or not asked for yet)."""
    return _why.get(name)


@functools.cache
def load(name: str, include_dirs: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The compiled library `name` (SOURCES: "gemv" and "decode_ops" for torch through ctypes; "gemv_xla" and
    "decode_ops_xla" with their XLA FFI handlers, which need XLA's FFI headers in `include_dirs`), built at first
    use; None where it cannot be."""
    sources = SOURCES[name]
    reason = _unsupported(name)
    if reason is None:
        try:
            path = _build(name, sources, include_dirs)
            return ctypes.CDLL(str(path))
        except (OSError, subprocess.CalledProcessError) as err:
            reason = f"building {name} failed: {_last_lines(err)}"
    _why[name] = reason
    return None


def functions(name: str, symbols: Mapping[Hashable, tuple[str, list]]) -> dict[Hashable, ctypes._CFuncPtr] | None:
    """The library `name`'s functions for ctypes calls, `symbols` mapping a caller's key (a dtype, say) to (the C
    symbol, its argument types), each returning void; None where the library cannot be loaded (`load`)."""
    lib = load(name)
    if lib is None:
        return None
    table = {}
    for key, (symbol, argtypes) in symbols.items():
        fn = getattr(lib, symbol)
        fn.argtypes, fn.restype = argtypes, None
        table[key] = fn
    return table


def _unsupported(name: str | None = None) -> str | None:
    """Why library `name` (None: any of them) cannot be built here, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the CPU kernels are x86-64 code; this is {platform.machine()}"
    required = (*REQUIRED_FLAGS, *ISA.get(name, ((), ()))[1])
    missing = [flag for flag in required if flag not in cpu_flags()]
    if missing:
        return f"the processor lacks {', '.join(missing)}"
    if _compiler("c") is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    return None


def _compiler(language: str) -> str | None:
    names = ("cc", "gcc", "clang") if language == "c" else ("c++", "g++", "clang++")
    return next((found for found in map(shutil.which, names) if found), None)


def _build(name: str, sources: tuple[str, ...], include_dirs: tuple[str, ...]) -> Path:
    extra = ISA.get(name, ((), ()))[0]
    digest = hashlib.sha256()
    for source in sources:
        digest.update((HERE / source).read_bytes())
    for part in (*C_FLAGS, *CXX_FLAGS, *extra, *include_dirs):
        digest.update(part.encode())
    for include in include_dirs:  # XLA's FFI headers: a new jaxlib's ABI is a new library
        for header in sorted(Path(include).glob("xla/ffi/api/*.h")):
            digest.update(header.read_bytes())
    cxx = any(source.endswith(".cc") for source in sources)
    for language in ("c", "c++") if cxx else ("c",):
        compiler = _compiler(language)
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True) if compiler else None
        digest.update((version.stdout if version else "").encode())  # another compiler, another build
    out_dir = default_cache_dir() / "kernels"
    target = out_dir / f"lib{name}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        objects = []
        for source in (source for source in sources if not source.endswith(".h")):
            language, flags = ("c++", CXX_FLAGS) if source.endswith(".cc") else ("c", C_FLAGS)
            compiler = _compiler(language)
            if compiler is None:
                raise OSError(f"no {language} compiler to build {source}")
            obj = Path(tmp) / f"{source}.o"
            includes = [f"-I{d}" for d in include_dirs]
            _run([compiler, *flags, *extra, *includes, "-c", str(HERE / source), "-o", str(obj)])
            objects.append(str(obj))
        linker = _compiler("c++" if cxx else "c")
        partial = Path(tmp) / target.name
        _run([linker, "-shared", "-fopenmp", *objects, "-o", str(partial)])
        os.replace(partial, target)
    return target


def _run(command: list[str]) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


def _last_lines(err: Exception) -> str:
    text = getattr(err, "stderr", None) or str(err)
    return " | ".join(text.strip().splitlines()[-3:])
