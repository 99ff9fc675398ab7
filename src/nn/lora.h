// LoRA, low-rank adaptation (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
// Models"): a Linear y = x W^T keeps W (usually frozen) and gains a trainable low-rank
// update on its output, or on one piece of a fused output:
//   y[:, rows] += scale * dropout(x) A^T B^T,   A [r, in], B [rows, r],
// scale = alpha / r (Hu et al.), or alpha / sqrt(r) with rsLoRA (Kalajdzievski 2023). As
// Hugging Face PEFT: A starts Kaiming-uniform (bound 1 / sqrt(in)), B at zero, so a fresh
// adapter changes nothing; dropout acts on the adapter's input only.
//
// The adapter is part of its nn::Linear (Linear::add_lora; the computation in linear.cpp),
// so that it runs wherever and however the layer runs: its tensor-parallel style,
// sequence parallelism, activation checkpointing (the layer's input is all it reads), and
// decoding. Which Linears get adapters is a plan applied from outside
// (models/lora_plan.h, train.lora); no model names LoRA.
#pragma once

#include "backend/backend.h"
#include "nn/param.h"

#include <cmath>
#include <cstdint>
#include <string>

namespace kiln::nn {

/// An adapter's hyper-parameters (train.lora).
struct LoraSpec {
  int64_t rank = 8;     // r
  float alpha = 16.f;   // the scale's numerator
  bool rslora = false;  // scale alpha / sqrt(r) instead of alpha / r
  float dropout = 0.f;  // on the adapter's input, in training passes only
  float scale() const {
    const double r = static_cast<double>(rank);
    return static_cast<float>(alpha / (rslora ? std::sqrt(r) : r));
  }
};

/// Where a training pass's adapter dropout draws from: the pass's seed and the global
/// row (sample x position) its first input row is, set by the plan per micro-batch.
struct LoraDropout {
  bool on = false;  // a training pass (evaluation and decoding: off)
  uint64_t seed = 0;
  uint64_t first_row = 0;
};

/// One adapter on a Linear (Linear::lora()).
struct LoraAdapter {
  std::string name;          // the adapted unit: "<linear>" or "<linear>.<piece>"
  int piece = -1;            // the Linear's piece (-1: its whole output)
  int64_t row0 = 0;          // its first output row of the Linear's global output
  int64_t rows = 0;          // its output rows
  LoraSpec spec;
  Param A, B;                // <name>.lora_A.weight [r, in], <name>.lora_B.weight [rows, r]
  const LoraDropout* dropout = nullptr;  // the plan's (nullptr: never)
  uint64_t dropout_stream = 0;           // its Philox stream (distinct per adapter)
};

/// An adapter's weight `w` (A or B) as the GEMMs of activations in `dtype` read it: `w`
/// itself, or a temporary copy rounded to `dtype` when the adapters keep a dtype of their
/// own (fp32 adapters on a bf16 model: train.lora.dtype, ModelStorage::trainable_dtype).
/// Its gradient is still written in its own dtype, which the GEMMs allow (fp32 or the
/// weight's).
inline Tensor lora_weight(Backend& be, Stream s, const Param& w, DType dtype) {
  if (w.v().dtype() == dtype) return w.v();
  Tensor t = be.empty(w.v().shape(), dtype, MemCategory::Temporaries);
  be.copy(s, t, w.v());
  return t;
}

/// dst <- alpha * src (dst overwritten; the same shape and dtype): the scaled adapter path
/// of a backward (Linear's and ExpertLora's).
inline void lora_scaled(Backend& be, Stream s, const Tensor& dst, const Tensor& src, float alpha) {
  be.fill(s, dst, 0.f);
  be.add_columns(s, dst, src, 0, alpha);
}

}  // namespace kiln::nn
