"""fp32 matrix multiplies on XLA:CPU through a BLAS sgemm (an XLA FFI custom call), with their own gradients.

XLA:CPU's own dots (oneDNN, as bert_jax configures them) ran the encoder's shapes at the BLAS rate on the 2-core
benchmark machine, but the MLM head's vocab-sized decoder ([160, 768] x [768, 30522] and its gradients) at about half
of it. This module routes matmuls to the sgemm of the OpenBLAS that SciPy (a dependency of JAX) ships, through a
small C++ custom call, bert_jax/csrc/cpu_gemm.cc (model.matmul chooses which matmuls):

- It is compiled on first use with the machine's C++ compiler (`$CXX`, else `c++`) against the XLA FFI headers that
  jaxlib ships, into a cache directory ($BERT_JAX_CACHE_DIR, else $XDG_CACHE_HOME/bert_jax, else ~/.cache/bert_jax),
  keyed by the source, jaxlib's version and the compiler. Later processes load the cached library.
- Each call is split into tiles run by XLA's own intra-op threads with a single-threaded sgemm each, so that no
  second thread pool competes with XLA's for the cores.
- `matmul` is differentiable: its backward pass is two more sgemm calls with transposed operands (no transposes
  are materialised). `dot_general` is a drop-in for flax's `nn.Dense(dot_general=...)`.

When it cannot be used (no compiler, no SciPy sgemm, a build error) `unavailable_reason()` says why and the model
keeps XLA's dots (model.matmul=auto); nothing else changes. Numerics: fp32 products with fp32 accumulation, as
XLA's; results differ from XLA's by summation order only (about 1e-6 relative).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax import lax

TARGET_NAME = "bert_jax_sgemm"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "cpu_gemm.cc")

_LOCK = threading.Lock()
_STATE: dict = {}  # "error": why it is unavailable (None once loaded); "library": the loaded handle


def cache_dir() -> str:
    if os.environ.get("BERT_JAX_CACHE_DIR"):
        return os.environ["BERT_JAX_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bert_jax")


def _compiler() -> str | None:
    name = os.environ.get("CXX") or "c++"
    return shutil.which(name)


def _sgemm_address() -> int:
    """The address of SciPy's Fortran-ABI sgemm (the OpenBLAS bundled with SciPy), from its Cython C-API capsule."""
    from scipy.linalg import cython_blas  # pylint: disable=import-outside-toplevel

    capsule = cython_blas.__pyx_capi__["sgemm"]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


def _build(compiler: str) -> str:
    """Compiles the custom call (once per source, jaxlib and compiler) and returns the shared library's path."""
    import jaxlib  # pylint: disable=import-outside-toplevel

    with open(SOURCE, "rb") as handle:
        source = handle.read()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256(source + jaxlib.__version__.encode() + version.encode()).hexdigest()[:16]
    directory = os.path.join(cache_dir(), f"cpu_gemm-{key}")
    library = os.path.join(directory, "libbert_jax_cpu_gemm.so")
    if os.path.exists(library):
        return library
    os.makedirs(directory, exist_ok=True)
    # Compile to a private name, then rename: concurrent processes never load a half-written library.
    handle, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(handle)
    command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{jax.ffi.include_dir()}", SOURCE,
               "-o", partial, "-ldl"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        os.remove(partial)
        raise RuntimeError(f"compiling {SOURCE} failed ({' '.join(command)}): {result.stderr.strip()[-2000:]}")
    os.replace(partial, library)
    return library


def _load() -> None:
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX') or 'c++'} is not on PATH; set $CXX or install "
                           "g++) to build bert_jax/csrc/cpu_gemm.cc")
    try:
        address = _sgemm_address()
    except (ImportError, KeyError, AttributeError) as error:
        raise RuntimeError(f"SciPy's BLAS sgemm is not available ({error!r})") from error
    library = ctypes.CDLL(_build(compiler))
    library.bert_jax_set_sgemm.restype = ctypes.c_int
    library.bert_jax_set_sgemm.argtypes = [ctypes.c_void_p]
    if not library.bert_jax_set_sgemm(address):
        logging.warning("bert_jax.cpu_gemm: the BLAS has no openblas_set_num_threads_local, so each call runs on "
                        "the calling thread with the BLAS's own threading rather than tiled over XLA's threads")
    jax.ffi.register_ffi_target(TARGET_NAME, jax.ffi.pycapsule(library.BertJaxSgemm), platform="cpu")
    _STATE["library"] = library  # keeps the handle (and the registered function) alive


def unavailable_reason() -> str | None:
    """None when the BLAS custom call is built and registered (building it on first call), else why not."""
    with _LOCK:
        if "error" not in _STATE:
            try:
                _load()
                _STATE["error"] = None
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                _STATE["error"] = str(error)
                logging.warning("bert_jax.cpu_gemm unavailable, XLA's dots are used instead: %s", error)
        return _STATE["error"]


def sgemm(a, b, trans_a: bool, trans_b: bool):
    """The custom call itself (no gradient): op(a) @ op(b) over equal leading (batch) dimensions, float32."""
    m = a.shape[-1] if trans_a else a.shape[-2]
    n = b.shape[-2] if trans_b else b.shape[-1]
    out = jax.ShapeDtypeStruct(a.shape[:-2] + (m, n), jnp.float32)
    return jax.ffi.ffi_call(TARGET_NAME, out)(a, b, trans_a=trans_a, trans_b=trans_b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul(a, b, transpose_a: bool = False, transpose_b: bool = False):
    """op(a) @ op(b) over equal leading (batch) dimensions, float32, op = transpose of the last two axes or not."""
    return sgemm(a, b, transpose_a, transpose_b)


def _matmul_forward(a, b, transpose_a, transpose_b):
    return sgemm(a, b, transpose_a, transpose_b), (a, b)


def _matmul_backward(transpose_a, transpose_b, residuals, grad):
    # C = op(A) op(B): d op(A) = dC op(B)^T and d op(B) = op(A)^T dC, each one sgemm with transposed operands.
    a, b = residuals
    grad_a = sgemm(b, grad, transpose_b, True) if transpose_a else sgemm(grad, b, False, not transpose_b)
    grad_b = sgemm(grad, a, True, transpose_a) if transpose_b else sgemm(a, grad, not transpose_a, False)
    return grad_a, grad_b


matmul.defvjp(_matmul_forward, _matmul_backward)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **kwargs):
    """`lax.dot_general` for flax's Dense: the BLAS matmul where the contraction is lhs's trailing axes with rhs's
    leading (or trailing) axes, no batch axes, both float32; `lax.dot_general` otherwise."""
    (lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch) = dimension_numbers
    count = len(lhs_contracting)
    if (not lhs_batch and not rhs_batch and count and lhs.dtype == jnp.float32 and rhs.dtype == jnp.float32
            and preferred_element_type in (None, jnp.float32)
            and tuple(lhs_contracting) == tuple(range(lhs.ndim - count, lhs.ndim))):
        free = lhs.shape[:lhs.ndim - count]
        depth = int(np.prod(lhs.shape[lhs.ndim - count:]))
        flat = lhs.reshape(-1, depth)
        if tuple(rhs_contracting) == tuple(range(count)):
            return matmul(flat, rhs.reshape(depth, -1)).reshape(free + rhs.shape[count:])
        if tuple(rhs_contracting) == tuple(range(rhs.ndim - count, rhs.ndim)):
            return matmul(flat, rhs.reshape(-1, depth), False, True).reshape(free + rhs.shape[:rhs.ndim - count])
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type, **kwargs)
