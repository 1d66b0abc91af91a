// The FP8-block prefill GEMM through cuBLASLt (design note: linear_fp8.cu), its plan cache, and
// the prefill linear (activation quantization + GEMM + GEMV for the ragged rows).
//
// Row-major out [m, n] = x [m, k] · wᵀ is column-major outᵀ [n, m] = op(A) · B with A = the weight
// seen column-major as [k, n] (ld k) and op(A) = Aᵀ, B = the quantized activations column-major
// [k, m] (ld k): the "TN" layout cuBLASLt's FP8 kernels require (A transposed, B not). In cuBLAS
// terms M = n, N = m, K = k. Scale tensors (cuBLAS docs 3.1.4.5, "128-element 1D and 128x128 2D
// block scaling"): A_SCALE_MODE = BLK128x128_32F, K-major [ceil(M/128) rows of L4 floats] with
// L4 = ceil(K/128) rounded up to 4 (= the checkpoint's weight_scale_inv when that is already a
// multiple of 4); B_SCALE_MODE = VEC128_32F, N-major [L][N] (the m token scales of each k group
// adjacent). Both 16-byte aligned; M and N multiples of 4.
#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/linear.h"
#include "backend/cuda/linear_fp8.h"

namespace strata::cuda {

struct Fp8GemmPlan {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t algo_workspace = 0;
  float waves = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int64_t m = 0, n = 0, k = 0;

  ~Fp8GemmPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

std::string shape_text(int64_t m, int64_t n, int64_t k) {
  return fmt::format("m {} n {} k {}", m, n, k);
}

// A cuBLASLt call's status as text, or "" on success.
std::string lt_error(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return "";
  return fmt::format("{}: {} ({})", what, cublasGetStatusName(st), int(st));
}

template <typename T>
cublasStatus_t set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                        const T& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}

// Builds a plan; returns "" or the first failure.
std::string build_plan(Fp8GemmPlan& p) {
  std::string e;
  auto step = [&](cublasStatus_t st, const char* what) {
    if (e.empty()) e = lt_error(st, what);
    return e.empty();
  };
  if (!step(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"))
    return e;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  // Heuristics do not read the scale pointers; any aligned device address stands in until a
  // launch sets the real ones.
  const void* stand_in = p.workspace;
  step(set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta), "TRANSA");
  step(set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb), "TRANSB");
  step(set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode), "A_SCALE_MODE");
  step(set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode), "B_SCALE_MODE");
  step(set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, stand_in), "A_SCALE_POINTER");
  step(set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, stand_in), "B_SCALE_POINTER");
  step(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, uint64_t(p.k), uint64_t(p.n), p.k),
       "layout A (weights, k x n, ld k)");
  step(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, uint64_t(p.k), uint64_t(p.m), p.k),
       "layout B (activations, k x m, ld k)");
  step(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, uint64_t(p.n), uint64_t(p.m), p.n),
       "layout C/D (out, n x m, ld n)");
  if (!e.empty()) return e;

  cublasLtMatmulPreference_t pref = nullptr;
  if (!step(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate")) return e;
  const uint64_t ws = p.workspace_bytes;
  const uint32_t align = 16;  // what the callers guarantee (cudaMalloc gives 256)
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    step(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)), "MIN_ALIGNMENT");
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int count = 0;
  if (e.empty())
    step(cublasLtMatmulAlgoGetHeuristic(p.lt, p.desc, p.a, p.b, p.d, p.d, pref, 8, results, &count),
         "AlgoGetHeuristic");
  cublasLtMatmulPreferenceDestroy(pref);
  if (!e.empty()) return e;
  for (int i = 0; i < count; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    p.algo = results[i].algo;
    p.algo_workspace = results[i].workspaceSize;
    p.waves = results[i].wavesCount;
    return "";
  }
  return fmt::format("AlgoGetHeuristic: no algorithm ({} results)", count);
}

}  // namespace

bool fp8_gemm_shape_ok(int64_t m, int64_t n, int64_t k, std::string* why) {
  std::string w;
  if (m < 0 || n <= 0 || k <= 0)
    w = "empty";
  else if (m % 4 != 0)
    w = "m % 4 != 0 (block-scaled cuBLASLt modes)";
  else if (n % 8 != 0)
    w = "n % 8 != 0 (16-byte bf16 output rows; block-scaled modes need n % 4)";
  else if (k % 16 != 0)
    w = "k % 16 != 0 (16-byte fp8 rows)";
  if (why) *why = w;
  return w.empty();
}

struct Fp8GemmPlanner::Impl {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::mutex mu;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Fp8GemmPlan>> plans;
};

Fp8GemmPlanner::Fp8GemmPlanner(void* workspace, size_t workspace_bytes) : impl_(new Impl) {
  CHECK_MSG(workspace && uintptr_t(workspace) % 256 == 0 && workspace_bytes >= (size_t(1) << 20),
            "Fp8GemmPlanner: a 256-byte aligned workspace of at least 1 MiB");
  const cublasStatus_t st = cublasLtCreate(&impl_->lt);
  CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "{}", lt_error(st, "cublasLtCreate"));
  impl_->workspace = workspace;
  impl_->workspace_bytes = workspace_bytes;
}

Fp8GemmPlanner::~Fp8GemmPlanner() {
  impl_->plans.clear();
  if (impl_->lt) cublasLtDestroy(impl_->lt);
}

size_t Fp8GemmPlanner::size() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->plans.size();
}

Fp8GemmPlan* Fp8GemmPlanner::try_plan(int64_t m, int64_t n, int64_t k, std::string* why) {
  std::string w;
  if (!fp8_gemm_shape_ok(m, n, k, &w) || m == 0) {
    if (why) *why = fmt::format("fp8 gemm {}: {}", shape_text(m, n, k), m == 0 ? "m = 0" : w);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto key = std::make_tuple(m, n, k);
  auto it = impl_->plans.find(key);
  if (it != impl_->plans.end()) return it->second.get();
  auto plan = std::make_unique<Fp8GemmPlan>();
  plan->lt = impl_->lt;
  plan->workspace = impl_->workspace;
  plan->workspace_bytes = impl_->workspace_bytes;
  plan->m = m;
  plan->n = n;
  plan->k = k;
  w = build_plan(*plan);
  if (!w.empty()) {
    if (why) *why = fmt::format("fp8 gemm {}: cuBLASLt {}", shape_text(m, n, k), w);
    return nullptr;
  }
  Fp8GemmPlan* raw = plan.get();
  impl_->plans.emplace(key, std::move(plan));
  return raw;
}

Fp8GemmPlan* Fp8GemmPlanner::plan(int64_t m, int64_t n, int64_t k) {
  std::string why;
  Fp8GemmPlan* p = try_plan(m, n, k, &why);
  CHECK_MSG(p, "{}", why);
  return p;
}

std::string describe(const Fp8GemmPlan& plan) {
  int32_t id = -1, splitk = -1;
  uint32_t tile = 0, stages = 0;
  uint16_t cluster = 0;
  size_t got = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                       sizeof(tile), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                       sizeof(stages), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                       sizeof(splitk), &got);
  cublasLtMatmulAlgoConfigGetAttribute(&plan.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                       sizeof(cluster), &got);
  return fmt::format(
      "cuBLASLt fp8 block-scaled {}: algo {} tile id {} stages id {} splitK {} cluster id {} "
      "waves {:.2f} workspace {} B",
      shape_text(plan.m, plan.n, plan.k), id, tile, stages, splitk, int(cluster), plan.waves,
      plan.algo_workspace);
}

void launch_fp8_gemm(const Fp8GemmParams& p, cudaStream_t stream) {
  if (p.m == 0) return;
  const Fp8Weight& w = p.w;
  CHECK_MSG(p.plan, "fp8_gemm: no plan ({})", shape_text(p.m, w.n, w.k));
  Fp8GemmPlan& plan = *p.plan;
  CHECK_MSG(plan.m == p.m && plan.n == w.n && plan.k == w.k, "fp8_gemm: plan for {} used for {}",
            shape_text(plan.m, plan.n, plan.k), shape_text(p.m, w.n, w.k));
  CHECK_MSG(w.scale_ld == fp8_gemm_scale_ld(w.k),
            "fp8_gemm: weight scale_ld {} must be {} (repack the scales; {})", w.scale_ld,
            fp8_gemm_scale_ld(w.k), shape_text(p.m, w.n, w.k));
  CHECK_MSG(uintptr_t(p.xq) % 16 == 0 && uintptr_t(w.w) % 16 == 0 && uintptr_t(p.out) % 16 == 0 &&
                uintptr_t(p.x_scale) % 16 == 0 && uintptr_t(w.scale) % 16 == 0,
            "fp8_gemm: operands and scales must be 16-byte aligned ({})",
            shape_text(p.m, w.n, w.k));
  std::string e = lt_error(
      set_desc(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w.scale)),
      "A_SCALE_POINTER");
  if (e.empty())
    e = lt_error(set_desc(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                          static_cast<const void*>(p.x_scale)),
                 "B_SCALE_POINTER");
  CHECK_MSG(e.empty(), "fp8_gemm {}: {}", shape_text(p.m, w.n, w.k), e);
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st =
      cublasLtMatmul(plan.lt, plan.desc, &alpha, w.w, plan.a, p.xq, plan.b, &beta, p.out, plan.d,
                     p.out, plan.d, &plan.algo, plan.workspace, plan.workspace_bytes, stream);
  CHECK_MSG(st == CUBLAS_STATUS_SUCCESS, "fp8_gemm {}: {}", shape_text(p.m, w.n, w.k),
            lt_error(st, "cublasLtMatmul"));
  if (p.bias) {
    BiasAddParams b{};
    b.out = p.out;
    b.bias = p.bias;
    b.rows = p.m;
    b.cols = w.n;
    launch_bias_add(b, Launch{stream});
  }
}

void launch_fp8_linear(const Fp8LinearParams& p, cudaStream_t stream) {
  if (p.m == 0) return;
  const int64_t m4 = fp8_gemm_rows(p.m), n = p.w.n, k = p.w.k;
  if (m4 > 0) {
    Fp8ActQuantParams q{};
    q.x = p.x;
    q.q = p.xq;
    q.scale = p.x_scale;
    q.m = m4;
    q.k = k;
    q.scale_ld = m4;
    launch_fp8_act_quant(q, stream);
    Fp8GemmParams g{};
    g.plan = p.plan;
    g.xq = p.xq;
    g.x_scale = p.x_scale;
    g.w = p.w;
    g.bias = p.bias;
    g.out = p.out;
    g.m = m4;
    launch_fp8_gemm(g, stream);
  }
  for (int64_t r = m4; r < p.m; r += kFp8GemvMaxRows) {  // m % 4 <= 3 rows: one launch
    Fp8GemvParams v{};
    v.x = p.x + r * k;
    v.w = p.w;
    v.bias = p.bias;
    v.out = p.out + r * n;
    v.m = int(std::min<int64_t>(p.m - r, kFp8GemvMaxRows));
    v.batches = 1;
    launch_fp8_gemv(v, stream);
  }
}

}  // namespace strata::cuda
