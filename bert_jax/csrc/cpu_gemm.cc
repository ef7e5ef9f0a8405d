// XLA:CPU custom call (XLA FFI): fp32 matrix multiply through a BLAS sgemm, tiled over XLA's intra-op thread pool.
//
// C[..., M, N] = op(A[...]) op(B[...]) for row-major operands with equal leading (batch) dimensions, op(X) = X or
// X^T per the `trans_a` / `trans_b` attributes. The sgemm (Fortran ABI, 32-bit integers) is handed over at load
// time by bert_jax.cpu_gemm, which takes it from SciPy's bundled OpenBLAS. Each tile calls a single-threaded sgemm
// (OpenBLAS's openblas_set_num_threads_local) on one of XLA's own threads, so no second thread pool competes with
// XLA's for the cores. Work is split into `tiles` contiguous pieces that any thread may take: the calling thread
// takes pieces too and waits only for pieces already started, so a busy pool cannot deadlock the call.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                         const int*, const float*, const int*, const float*, float*, const int*);
using SetThreadsFn = void (*)(int);

SgemmFn g_sgemm = nullptr;
SetThreadsFn g_set_local_threads = nullptr;

struct Job {
  const float* a;
  const float* b;
  float* c;
  int64_t batch;
  int m, n, k;
  bool trans_a, trans_b;
  int tiles;
  bool split_rows = false;  // batch == 1: split C's rows (else its columns); batch > 1: split the batch
  std::atomic<int> next{0};
  std::atomic<int> done{0};
  std::mutex mutex;
  std::condition_variable finished;

  // Row-major C[m, n] = op(A) op(B) is column-major C^T[n, m] = op(B)^T op(A)^T: sgemm with the operands swapped.
  void Gemm(const float* a_ptr, const float* b_ptr, float* c_ptr, int rows, int cols) const {
    const float one = 1.0f, zero = 0.0f;
    const char op_b = trans_b ? 'T' : 'N', op_a = trans_a ? 'T' : 'N';
    const int ld_b = trans_b ? k : n, ld_a = trans_a ? m : k, ld_c = n;
    g_sgemm(&op_b, &op_a, &cols, &rows, &k, &one, b_ptr, &ld_b, a_ptr, &ld_a, &zero, c_ptr, &ld_c);
  }

  void RunTile(int tile) const {
    if (g_set_local_threads != nullptr) g_set_local_threads(1);
    if (batch > 1) {
      const int64_t lo = batch * tile / tiles, hi = batch * (tile + 1) / tiles;
      for (int64_t i = lo; i < hi; ++i) {
        Gemm(a + i * m * k, b + i * k * n, c + i * m * n, m, n);
      }
      return;
    }
    const int extent = split_rows ? m : n;
    const int lo = static_cast<int>(int64_t{extent} * tile / tiles);
    const int hi = static_cast<int>(int64_t{extent} * (tile + 1) / tiles);
    if (hi <= lo) return;
    if (split_rows) {  // rows lo..hi of C: rows of op(A)
      Gemm(trans_a ? a + lo : a + int64_t{lo} * k, b, c + int64_t{lo} * n, hi - lo, n);
    } else {  // columns lo..hi of C: columns of op(B)
      Gemm(a, trans_b ? b + int64_t{lo} * k : b + lo, c + lo, m, hi - lo);
    }
  }

  void Work() {
    for (int tile; (tile = next.fetch_add(1)) < tiles;) {
      RunTile(tile);
      if (done.fetch_add(1) + 1 == tiles) {
        std::lock_guard<std::mutex> lock(mutex);
        finished.notify_all();
      }
    }
  }
};

// Columns (or rows) per tile below which splitting a single matrix costs more than it gains.
constexpr int kMinTileExtent = 64;

ffi::Error GemmImpl(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> c,
                    bool trans_a, bool trans_b) {
  if (g_sgemm == nullptr) {
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "bert_jax_sgemm: no sgemm was set");
  }
  if (a.element_type() != ffi::F32 || b.element_type() != ffi::F32 || c->element_type() != ffi::F32) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "bert_jax_sgemm: float32 operands only");
  }
  const auto a_dims = a.dimensions(), b_dims = b.dimensions();
  if (a_dims.size() < 2 || a_dims.size() != b_dims.size()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "bert_jax_sgemm: operands need equal ranks >= 2");
  }
  const size_t rank = a_dims.size();
  auto job = std::make_shared<Job>();
  job->batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if (a_dims[i] != b_dims[i]) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, "bert_jax_sgemm: batch dimensions differ");
    }
    job->batch *= a_dims[i];
  }
  job->a = a.typed_data<float>();
  job->b = b.typed_data<float>();
  job->c = c->typed_data<float>();
  job->trans_a = trans_a;
  job->trans_b = trans_b;
  job->m = static_cast<int>(trans_a ? a_dims[rank - 1] : a_dims[rank - 2]);
  job->k = static_cast<int>(trans_a ? a_dims[rank - 2] : a_dims[rank - 1]);
  job->n = static_cast<int>(trans_b ? b_dims[rank - 2] : b_dims[rank - 1]);
  if ((trans_b ? b_dims[rank - 1] : b_dims[rank - 2]) != job->k) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "bert_jax_sgemm: contracting dimensions differ");
  }
  if (job->batch == 0 || job->m == 0 || job->n == 0) return ffi::Error::Success();
  if (job->k == 0) {
    std::fill(job->c, job->c + job->batch * job->m * job->n, 0.0f);
    return ffi::Error::Success();
  }
  // Without a per-thread thread count the BLAS threads itself: one tile, on the calling thread.
  const int threads = g_set_local_threads != nullptr ? std::max<int64_t>(1, pool.num_threads()) : 1;
  if (job->batch > 1) {
    job->tiles = static_cast<int>(std::min<int64_t>(threads, job->batch));
  } else {
    job->split_rows = job->m >= job->n;
    job->tiles = std::max(1, std::min(threads, (job->split_rows ? job->m : job->n) / kMinTileExtent));
  }
  for (int i = 1; i < job->tiles; ++i) pool.Schedule([job] { job->Work(); });
  job->Work();
  std::unique_lock<std::mutex> lock(job->mutex);
  job->finished.wait(lock, [&] { return job->done.load() == job->tiles; });
  return ffi::Error::Success();
}

}  // namespace

// Called once through ctypes with the address of a Fortran-ABI sgemm. Returns 1 when the library that holds it
// has openblas_set_num_threads_local (then calls are tiled over XLA's threads), else 0.
extern "C" int bert_jax_set_sgemm(void* sgemm) {
  g_sgemm = reinterpret_cast<SgemmFn>(sgemm);
  g_set_local_threads = nullptr;
  Dl_info info;
  if (dladdr(sgemm, &info) != 0 && info.dli_fname != nullptr) {
    if (void* handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) {
      g_set_local_threads = reinterpret_cast<SetThreadsFn>(dlsym(handle, "openblas_set_num_threads_local"));
    }
  }
  return g_set_local_threads != nullptr ? 1 : 0;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(BertJaxSgemm, GemmImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("trans_a")
                                  .Attr<bool>("trans_b"));
