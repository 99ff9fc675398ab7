// CudaBackend (cuda_backend_impl.h): construction, memory, the loss and the optimizer,
// and the helpers the op files share; the ops are in cuda_ops.cpp and
// cuda_attention_ops.cpp. See cuda_backend.h for the conventions and docs/cuda.md.
#include "backend/cuda/cuda_backend.h"

#include "backend/cuda/adamw.h"
#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/dropout.h"
#include "backend/cuda/embedding.h"
#include "backend/cuda/image.h"
#include "backend/cuda/nvtx.h"
#include "backend/cuda/step_stats.h"
#include "backend/op_checks.h"
#include "core/dtype.h"
#include "core/error.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

namespace kiln {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no GPU visible (") + cudaGetErrorString(e) + ")";
  }
  return n > 0 ? "" : "no GPU visible";
}

namespace cuda {

namespace {
constexpr size_t kGemmWorkspace = 32u << 20;
}  // namespace

CudaBackend::CudaBackend(int device, const BackendOptions& options)
    : device_(device), simt_attention_(options.attention == AttentionKernel::Simt) {
  KILN_CUDA_CHECK(cudaSetDevice(device));
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&scratch_event_, cudaEventDisableTiming));
  alloc_ = std::make_unique<cuda::CudaAllocator>(device, stream_);
  gemm_ = std::make_unique<cuda::Gemm>();
  workspace_ = empty({static_cast<int64_t>(kGemmWorkspace / 4)}, DType::I32,
                     MemCategory::Temporaries);
  gemm_->set_workspace(workspace_.raw(), kGemmWorkspace);
  gemm_->set_allow_tf32(options.tf32);
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  device_name_ = prop.name;
  if (options.gemm_tuning) {
    gemm_->set_tuning(true);
    // Where the tuned choices are kept is the process's cache, not a numerics choice:
    // an environment variable (docs/config.md, "Environment variables").
    const char* path = std::getenv("KILN_CUDA_GEMM_CACHE");
    if (path && *path) gemm_->set_cache_file(path, fmt::format("{} sm_{}{}", device_name_, prop.major, prop.minor));
    std::fprintf(stderr, "kiln: cuda: GEMM algorithms chosen by timing (backend.gemm_tuning); %s%s\n",
                 path && *path ? "choices kept in " : "choices not persisted (set KILN_CUDA_GEMM_CACHE "
                                                      "for bitwise identical runs)",
                 path && *path ? path : "");
  }
}

CudaBackend::~CudaBackend() {
  (void)cudaStreamSynchronize(stream_);
  workspace_ = Tensor();
  arena_ = Tensor();
  gemm_.reset();
  (void)cudaStreamSynchronize(stream_);
  alloc_.reset();
  cudaEventDestroy(scratch_event_);
  for (cudaEvent_t e : markers_) cudaEventDestroy(e);
  cudaStreamDestroy(stream_);
}

std::string CudaBackend::gemm_path(DType dtype) const {
  return fmt::format("{} GEMMs: cuBLASLt", dtype_name(dtype));
}

void CudaBackend::synchronize(Stream s) { KILN_CUDA_CHECK(cudaStreamSynchronize(st(s))); }

int64_t CudaBackend::record_marker(Stream s) {
  if (markers_used_ == markers_.size()) {
    cudaEvent_t e = nullptr;
    KILN_CUDA_CHECK(cudaEventCreate(&e));
    markers_.push_back(e);
  }
  KILN_CUDA_CHECK(cudaEventRecord(markers_[markers_used_], st(s)));
  return static_cast<int64_t>(markers_used_++);
}

double CudaBackend::marker_elapsed_ms(int64_t from, int64_t to) {
  const auto valid = [&](int64_t id) { return id >= 0 && static_cast<size_t>(id) < markers_used_; };
  KILN_CHECK(valid(from) && valid(to), "cuda: timing markers {} and {}: only {} recorded", from,
             to, markers_used_);
  KILN_CUDA_CHECK(cudaEventSynchronize(markers_[static_cast<size_t>(to)]));
  float ms = 0.f;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, markers_[static_cast<size_t>(from)],
                                       markers_[static_cast<size_t>(to)]));
  return ms;
}

// ---- memory -----------------------------------------------------------------------------
void CudaBackend::copy_from_host(Stream s, const Tensor& dst, const void* src) {
  if (!dst.nbytes()) return;
  on_device(dst, "copy_from_host");
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src, dst.nbytes(), cudaMemcpyHostToDevice, st(s)));
}
void CudaBackend::copy_to_host(Stream s, void* dst, const Tensor& src) {
  if (!src.nbytes()) return;
  on_device(src, "copy_to_host");
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src.raw(), src.nbytes(), cudaMemcpyDeviceToHost, st(s)));
  KILN_CUDA_CHECK(cudaStreamSynchronize(st(s)));
}
void CudaBackend::copy(Stream s, const Tensor& dst, const Tensor& src) {
  KILN_CHECK(dst.numel() == src.numel(), "copy: {} and {} differ in size", dst.str(), src.str());
  if (!src.numel()) return;
  on_device(dst, "copy");
  on_device(src, "copy");
  if (dst.dtype() == src.dtype()) {
    if (dst.raw() == src.raw()) return;
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, st(s)));
    return;
  }
  // Different float dtypes: convert (round to nearest even, NaN/Inf kept; into fp8
  // saturating, as core's convert()), e.g. the optimizer's fp32 master weights into bf16
  // parameters.
  cuda::convert(st(s), dst.raw(), float_kind(dst, "copy"), src.raw(), float_kind(src, "copy"),
                src.numel());
}
void CudaBackend::copy_stochastic_round(Stream s, const Tensor& dst, const Tensor& src,
                                        uint64_t seed, uint64_t stream, const GlobalIndices& at) {
  KILN_CHECK(dst.numel() == src.numel() && dst.dtype() == DType::BF16 &&
                 src.dtype() == DType::F32,
             "copy_stochastic_round: {} <- {} (bf16 <- fp32 of one size)", dst.str(), src.str());
  on_device(dst, "copy_stochastic_round");
  on_device(src, "copy_stochastic_round");
  cuda::stochastic_round_bf16(st(s), dst.raw(), static_cast<const float*>(src.raw()),
                              src.numel(), seed, stream, at.begin, at.row_len, at.stride);
}
void CudaBackend::fill(Stream s, const Tensor& t, float value) {
  if (!t.numel()) return;
  on_device(t, "fill");
  switch (t.dtype()) {
    case DType::F32: cuda::fill_u32(st(s), t.raw(), f32_bits(value), t.numel()); break;
    case DType::I32: {
      const int32_t i = static_cast<int32_t>(value);
      uint32_t u;
      std::memcpy(&u, &i, 4);
      cuda::fill_u32(st(s), t.raw(), u, t.numel());
      break;
    }
    case DType::BF16: cuda::fill_u16(st(s), t.raw(), f32_to_bf16(value), t.numel()); break;
    case DType::F16: cuda::fill_u16(st(s), t.raw(), f32_to_f16(value), t.numel()); break;
    case DType::F64: {
      const double d = value;
      uint64_t u;
      std::memcpy(&u, &d, 8);
      cuda::fill_u64(st(s), t.raw(), u, t.numel());
      break;
    }
    case DType::E4M3:
    case DType::E5M2:  // fp8 is storage for copy only, as on the CPU (its fill refuses it)
      KILN_FAIL("fill: unsupported dtype {}", dtype_name(t.dtype()));
  }
}
void CudaBackend::sum_squares(Stream s, const Tensor& acc, const Tensor& x) {
  checks::sum_squares(acc, x);
  on_device(acc, "sum_squares");
  if (!x.numel()) return;
  const Elem e = elem(x, "sum_squares");
  Scratch scratch(*this, st(s), cuda::sum_squares_scratch_bytes(x.numel()));
  cuda::sum_squares(st(s), e, x.raw(), x.numel(), scratch.ptr(), static_cast<double*>(acc.raw()));
}

void CudaBackend::accumulate_loss(Stream s, const Tensor& acc, const Tensor& losses,
                                  const Tensor& targets) {
  const int64_t n = checks::accumulate_loss(acc, losses, targets);
  on_device(acc, "accumulate_loss");
  if (n == 0) return;
  cuda::accumulate_loss(st(s), static_cast<double*>(acc.raw()), losses.data<float>(),
                        targets.data<int32_t>(), n);
}

void CudaBackend::cross_entropy_shard_combine(Stream s, const Tensor& lse, const Tensor& acc,
                                              const Tensor& stats, const Tensor& targets) {
  const auto d = checks::cross_entropy_shard_combine(lse, acc, stats, targets);
  on_device(acc, "cross_entropy_shard_combine");
  cuda::cross_entropy_shard_combine(st(s), lse.data<float>(), static_cast<double*>(acc.raw()),
                                    stats.data<float>(), targets.data<int32_t>(), d.N, d.Vp);
}

void CudaBackend::clip_coefficient(Stream s, const Tensor& coef, const Tensor& sumsq,
                                   const Tensor& check, double max_norm, float loss_scale) {
  checks::clip_coefficient(coef, sumsq, check, loss_scale);
  on_device(coef, "clip_coefficient");
  cuda::clip_coefficient(st(s), coef.data<float>(), static_cast<const double*>(sumsq.raw()),
                         check ? static_cast<const double*>(check.raw()) : nullptr, max_norm,
                         loss_scale);
}

// ---- loss and optimizer -----------------------------------------------------------------
void CudaBackend::softmax_cross_entropy(Stream s, const Tensor& losses, const Tensor& dlogits,
                                        const Tensor& logits, const Tensor& targets,
                                        int vocab_size, int ignore_index, float grad_scale) {
  cuda::NvtxRange r("softmax_cross_entropy");
  const auto d = checks::cross_entropy(losses, dlogits, logits, targets, vocab_size);
  const Elem e = dlogits ? elem(logits, "softmax_cross_entropy", {&dlogits})
                         : elem(logits, "softmax_cross_entropy");
  cuda::softmax_cross_entropy(st(s), e, losses.data<float>(), dlogits ? dlogits.raw() : nullptr,
                              logits.raw(), targets.data<int32_t>(), d.N, d.Vp, vocab_size,
                              ignore_index, grad_scale);
}

void CudaBackend::cross_entropy_shard_stats(Stream s, const Tensor& stats, const Tensor& logits,
                                            const Tensor& targets, int64_t vocab_begin,
                                            int valid) {
  cuda::NvtxRange r("cross_entropy_shard_stats");
  const auto d = checks::cross_entropy_shard(stats, Tensor(), logits, targets, Tensor(),
                                             vocab_begin, valid);
  const Elem e = elem(logits, "cross_entropy_shard_stats");
  cuda::cross_entropy_shard_stats(st(s), e, stats.data<float>(), logits.raw(),
                                  targets.data<int32_t>(), d.N, d.Vp, vocab_begin, valid);
}

void CudaBackend::cross_entropy_shard_backward(Stream s, const Tensor& dlogits,
                                               const Tensor& logits, const Tensor& targets,
                                               const Tensor& lse, int64_t vocab_begin, int valid,
                                               int ignore_index, float grad_scale) {
  cuda::NvtxRange r("cross_entropy_shard_backward");
  const auto d = checks::cross_entropy_shard(Tensor(), dlogits, logits, targets, lse,
                                             vocab_begin, valid);
  const Elem e = elem(logits, "cross_entropy_shard_backward", {&dlogits});
  cuda::cross_entropy_shard_backward(st(s), e, dlogits.raw(), logits.raw(),
                                     targets.data<int32_t>(), lse.data<float>(), d.N, d.Vp,
                                     vocab_begin, valid, ignore_index, grad_scale);
}

void CudaBackend::shard_ids(Stream s, const Tensor& out, const Tensor& ids, int64_t begin,
                            int64_t count) {
  checks::shard_ids(out, ids, begin, count);
  cuda::shard_ids(st(s), out.data<int32_t>(), ids.data<int32_t>(), ids.numel(), begin, count);
}

void CudaBackend::patchify(Stream s, const Tensor& out, const Tensor& images, int patch) {
  checks::patchify(out, images, patch);
  on_device(images, "patchify");
  const Elem e = elem(out, "patchify");
  cuda::patchify(st(s), e, out.raw(), images.data<float>(), images.size(0), images.size(1),
                 images.size(2), images.size(3), patch, out.size(1));
}

void CudaBackend::unpatchify(Stream s, const Tensor& images, const Tensor& patches, int patch) {
  checks::unpatchify(images, patches, patch);
  on_device(images, "unpatchify");
  const Elem e = elem(patches, "unpatchify");
  cuda::unpatchify(st(s), e, images.data<float>(), patches.raw(), images.size(0), images.size(1),
                   images.size(2), images.size(3), patch, patches.size(1));
}

void CudaBackend::adamw_step(Stream s, const Tensor& param, const Tensor& grad, const Tensor& m,
                             const Tensor& v, const Tensor& scale, const AdamWParams& hp) {
  cuda::NvtxRange r("adamw_step");
  KILN_CHECK(grad.numel() == param.numel(), "adamw: grad {} vs param {}", grad.str(),
             param.str());
  KILN_CHECK(m.numel() == param.numel() && v.numel() == param.numel(),
             "adamw: m {} and v {} must have the {} elements of param {}", m.str(), v.str(),
             param.numel(), param.str());
  check_dtype(m, DType::F32, "adamw m");
  check_dtype(v, DType::F32, "adamw v");
  const Elem e = elem(param, "adamw");
  // fp32 master weights with fp32 or bf16 gradients, or parameter and gradient alike.
  const Elem g = elem(grad, "adamw grad");
  checks::adamw_scale(scale);
  cuda::adamw(st(s), e, g, param.raw(), grad.raw(), m.data<float>(), v.data<float>(), param.numel(),
              adamw_args(scale, hp));
}

cuda::AdamWArgs CudaBackend::adamw_args(const Tensor& scale, const AdamWParams& hp) const {
  const double bc1 = 1.0 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(hp.beta2, static_cast<double>(hp.step));
  cuda::AdamWArgs a{};
  a.lr = hp.lr;
  a.beta1 = static_cast<float>(hp.beta1);
  a.beta2 = static_cast<float>(hp.beta2);
  a.eps = hp.eps;
  a.grad_scale = hp.grad_scale;
  if (scale) on_device(scale, "adamw scale");
  a.scale = scale ? scale.data<float>() : nullptr;
  // The CPU backend's arithmetic (bias corrections in double), so that the two agree.
  a.step_size = static_cast<float>(static_cast<double>(hp.lr) / bc1);
  a.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  a.decay = 1.f - hp.lr * hp.weight_decay;
  return a;
}

// Groups the tensors by (parameter type, gradient type, master or not), each group one
// cuda::adamw_multi; fp16 parameters (no fp16 kernel) take adamw_step and copy.
void CudaBackend::adamw_multi_step(Stream s, std::span<const AdamWTensor> tensors,
                                   const Tensor& scale, const AdamWParams& hp) {
  cuda::NvtxRange r("adamw_multi_step");
  checks::adamw_multi(tensors, scale);
  const cuda::AdamWArgs a = adamw_args(scale, hp);
  std::map<std::tuple<Elem, Elem, bool>, std::vector<cuda::AdamWSegment>> groups;
  for (const AdamWTensor& t : tensors) {
    if (t.param.numel() == 0) continue;
    on_device(t.param, "adamw param");
    if (t.param.dtype() != DType::F32 && t.param.dtype() != DType::BF16) {
      adamw_tensor_step(*this, s, t, scale, hp);
      continue;
    }
    const Elem e = elem(t.param, "adamw");
    const Elem g = elem(t.grad, "adamw grad");
    groups[{e, g, static_cast<bool>(t.master)}].push_back(
        {t.param.raw(), t.master ? t.master.data<float>() : nullptr, t.grad.raw(),
         t.m.data<float>(), t.v.data<float>(), t.param.numel(), 1.f - hp.lr * t.weight_decay});
  }
  for (const auto& [key, segs] : groups)
    cuda::adamw_multi(st(s), std::get<0>(key), std::get<1>(key), std::get<2>(key), segs.data(),
                      static_cast<int>(segs.size()), a);
}

void CudaBackend::ema_update(Stream s, const Tensor& ema, const Tensor& param, float decay) {
  cuda::NvtxRange r("ema_update");
  checks::ema_update(ema, param, decay);
  on_device(ema, "ema_update");
  const Elem e = elem(param, "ema_update");
  // 1 - decay in double, rounded once (as the CPU backend).
  cuda::ema_update(st(s), e, ema.data<float>(), param.raw(), param.numel(), decay,
                   static_cast<float>(1.0 - static_cast<double>(decay)));
}

// ---- helpers shared by the op files -----------------------------------------------------
void CudaBackend::on_device(const Tensor& t, const char* op) {
  KILN_CHECK(t.device().type == DeviceType::CUDA, "{}: tensor {} is not on a CUDA device", op,
             t.str());
}

void CudaBackend::on_device_all(std::initializer_list<const Tensor*> ts, const char* op) {
  for (const Tensor* t : ts)
    if (*t) on_device(*t, op);
}

Elem CudaBackend::elem(const Tensor& t, const char* op,
                       std::initializer_list<const Tensor*> same) {
  KILN_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::BF16,
             "{}: the cuda backend does not support {}", op, dtype_name(t.dtype()));
  on_device(t, op);
  for (const Tensor* o : same)
    if (*o)
      KILN_CHECK(o->dtype() == t.dtype(), "{}: tensor {} must be {} like {}", op, o->str(),
                 dtype_name(t.dtype()), t.str());
  return t.dtype() == DType::F32 ? Elem::F32 : Elem::BF16;
}

Elem CudaBackend::grad_elem(const Tensor& g, Elem e, const char* op,
                             std::initializer_list<const Tensor*> same) {
  on_device(g, op);
  const DType act = e == Elem::F32 ? DType::F32 : DType::BF16;
  KILN_CHECK(g.dtype() == DType::F32 || g.dtype() == act,
             "{}: gradients in {} with activations in {} are not supported", op,
             dtype_name(g.dtype()), dtype_name(act));
  for (const Tensor* o : same)
    if (*o)
      KILN_CHECK(o->dtype() == g.dtype(), "{}: tensor {} must be {} like {}", op, o->str(),
                 dtype_name(g.dtype()), g.str());
  return g.dtype() == DType::F32 ? Elem::F32 : Elem::BF16;
}

FloatKind CudaBackend::float_kind(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::F32: return cuda::FloatKind::F32;
    case DType::BF16: return cuda::FloatKind::BF16;
    case DType::F16: return cuda::FloatKind::F16;
    case DType::E4M3: return cuda::FloatKind::E4M3;
    case DType::E5M2: return cuda::FloatKind::E5M2;
    default: break;
  }
  KILN_FAIL("{}: cannot convert {} (float dtypes only)", op, t.str());
}

void CudaBackend::head_dim_ok(int64_t hd, const char* op) {
  KILN_CHECK(hd <= cuda::kMaxHeadDim, "{}: the cuda backend supports head sizes up to {}, got {}",
             op, cuda::kMaxHeadDim, hd);
}

AttnDropout CudaBackend::drop(const DropoutSpec& d) {
  cuda::AttnDropout a;
  if (d.enabled()) {
    a.p = d.p;
    a.scale = 1.f / (1.f - d.p);
    a.seed = d.seed;
    a.stream = d.stream;
    a.offset = d.offset;
    a.head_offset = d.head_offset;
    a.total_heads = d.total_heads;
  }
  return a;
}

void CudaBackend::run_dropout(Stream s, const Tensor& out, const Tensor& inp,
                              const DropoutSpec& spec, const char* op) {
  const Elem e = elem(inp, op);
  if (!spec.enabled()) {
    copy(s, out, inp);
    return;
  }
  cuda::dropout(st(s), e, out.raw(), inp.raw(), inp.numel(), spec.p, 1.f / (1.f - spec.p),
                spec.seed, spec.stream, spec.offset);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device, const BackendOptions& options) {
  const int n = cuda_device_count();
  KILN_CHECK(device >= 0 && device < n, "cuda: device {} requested but {} visible ({})", device, n,
             n == 0 ? cuda_unavailable_reason() : "use CUDA_VISIBLE_DEVICES to choose");
  return std::make_unique<cuda::CudaBackend>(device, options);
}

}  // namespace kiln
