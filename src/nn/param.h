// nn::Param: one named parameter of a layer, as the layer sees it.
//
// A layer owns its Params (named fields: `weight`, `bias`, never offsets into a table).
// The model collects them part by part into its flat layout (ParamSpec, nn/parameter.h)
// and binds `value` and `grad` to views of whatever storage holds the part now (the flat
// buffer, or a ZeRO-3 gather); a layer reads them through value() and grad(), which
// throw when the part is not bound. Initial values are drawn on the host from Philox by
// global element coordinates (init_values), so every layout initialises identically.
//
// Freezing: a Param with `trainable` false has no gradient (grad stays unbound: the
// model lays out no gradient storage for it), no optimizer state and no part in any
// reduction; a layer's backward skips its weight gradient (trainable_grad() is empty)
// but still propagates the input gradient. Model code freezes a parameter by clearing
// the flag before the model's layout is built (LayeredModel::build); the config's
// train.freeze patterns do the same through freeze_matching().
#pragma once

#include "core/error.h"
#include "core/tensor.h"
#include "nn/param_slice.h"
#include "nn/tensor_parallel.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::nn {

/// How a parameter starts.
///   Zeros, Ones   constant (biases, norm gains).
///   Normal        N(0, std^2) (GPT-2: Radford et al. 2019, std 0.02; residual
///                 projections 0.02 / sqrt(2 n_layer)).
///   Uniform       U(-bound, bound), `std` holding the bound (a LoRA adapter's A: PyTorch's
///                 kaiming_uniform_ with a = sqrt(5), bound 1 / sqrt(fan_in), as PEFT).
/// Rows >= zero_rows_from stay zero (GPT-2's padded vocabulary rows); -1 = none.
struct Init {
  enum class Kind { Zeros, Ones, Normal, Uniform };
  Kind kind = Kind::Zeros;
  float std = 0.f;
  int64_t zero_rows_from = -1;
  static Init zeros() { return {}; }
  static Init ones() { return {Kind::Ones, 0.f, -1}; }
  static Init normal(float std) { return {Kind::Normal, std, -1}; }
  static Init uniform(float bound) { return {Kind::Uniform, bound, -1}; }
};

struct Param {
  std::string name;           // global name, e.g. transformer.h.0.attn.c_attn.weight
  Shape shape;                // global shape
  Init init;
  bool weight_decay = false;  // matrices decay; biases and norm gains do not
  ParamSlice slice;              // the elements this rank holds (tp and ep cuts; whole when replicated)
  bool tp_partial_grad = false;  // grad is this rank's partial sum: reduce over tp once
  bool trainable = true;      // false: frozen (no gradient, optimizer state or reduction)
  bool adapter = false;       // a LoRA adapter's (nn/lora.h): numbered (its init stream)
                              // after every parameter of the model's own, so that adding
                              // adapters leaves the model's initial values as they were
  Tensor value, grad;         // bound views of local_shape() (empty while not bound; grad
                              // always empty when frozen)

  Param() = default;
  Param(std::string n, Shape s, Init i, bool decay)
      : name(std::move(n)), shape(s), init(i), weight_decay(decay) {}
  /// The shape this rank holds: `shape`, or its slice.
  Shape local_shape() const { return slice.local_shape(shape); }
  /// The bound value / gradient; throws kiln::Error naming the parameter when unbound.
  const Tensor& v() const {
    KILN_CHECK(value, "parameter {} is not bound", name);
    return value;
  }
  const Tensor& g() const {
    KILN_CHECK(trainable, "{} is frozen: it has no gradient", name);
    KILN_CHECK(grad, "gradient of {} is not bound", name);
    return grad;
  }
  /// The bound gradient (as g()), or an empty Tensor when frozen: what a layer's backward
  /// passes as a weight gradient, so that the backend skips it.
  Tensor trainable_grad() const { return trainable ? g() : Tensor(); }
};

/// Freezes (trainable = false) every parameter of `params` whose name matches one of the
/// glob `patterns` (fnmatch, `*` also matching dots). A pattern matches a name when it,
/// or the pattern followed by ".*", matches the whole name or a part of it that starts
/// after a dot: "wte" and "h.0.*" match "transformer.wte.weight" and
/// "transformer.h.0.attn.c_attn.weight". Throws kiln::Error naming `key` and the pattern
/// when a pattern matches no parameter.
void freeze_matching(const std::vector<Param*>& params, const std::vector<std::string>& patterns,
                     const std::string& key);
/// Whether `pattern` matches parameter `name` (the rule of freeze_matching).
bool freeze_pattern_matches(const std::string& pattern, const std::string& name);
/// Whether glob `pattern` (fnmatch, `*` also matching dots) matches the whole of `name` or
/// a part of it that starts after a dot: freeze_pattern_matches without its module rule
/// (train.lora.targets' patterns, which must not reach a Linear's pieces).
bool dotted_tail_matches(const std::string& pattern, const std::string& name);

/// Elements [begin, end) (row-major, of the global tensor) of `p`'s initial values, for
/// Philox `seed` and stream `stream` (the model gives each parameter its own stream):
/// element i is a function of (seed, stream, i) only.
std::vector<float> init_values(const Param& p, uint64_t seed, uint64_t stream, int64_t begin,
                               int64_t end);

}  // namespace kiln::nn
