// A micro-batch as a model takes it: named inputs the model declares (BatchShape), the
// targets, and the loss accumulator.
//
// A model declares its inputs by name, shape and dtype (Model::batch_shape); the loader
// and the step stage whatever it declares, so that a new family (pixels and tokens, a
// loss mask, document boundaries, a caption) declares new inputs without a change in
// src/train. The names in use:
//   "tokens"     int32 [B,T]        token ids in [0, vocab)             (language models)
//   "positions"  int32 [B,T]        each token's position (rotary angle or learned-position
//                                   row); optional: absent = 0..T-1. The step fills it under
//                                   context parallelism (a rank's chunks of each sequence).
//   "cu_seqlens" int32 [B*T+1]      documents packed into the sequences (data.packing =
//                                   "document"): the cumulative document lengths over the
//                                   B*T tokens laid end to end, padded with B*T
//                                   (Backend::attention_varlen_forward); optional: absent =
//                                   one document per sequence. Under context parallelism
//                                   every rank takes the whole micro-batch's.
//   "images"     fp32 [B,H,W,C]     pixels scaled to [-1, 1]            (image models)
// Targets are int32: [B,T] next tokens or [B] class labels; -1 is ignored.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

/// [B, item...]: B items of shape `item` (e.g. images [B,H,W,C] from one image's [H,W,C]).
Shape batched(int64_t B, const Shape& item);

/// One declared input of a micro-batch.
struct BatchInput {
  std::string name;   // "tokens", "positions", "images" (the list above)
  Shape shape;        // [B, ...]
  DType dtype = DType::I32;
  /// Values of an int32 input lie in [0, range) (a vocabulary, a class count); 0: any.
  int64_t range = 0;
  /// Laid out [B, T, ...]: one entry (or row) per token, so that context parallelism
  /// splits dimension 1 into each rank's chunks of the sequence.
  bool per_token = false;
  /// The data need not supply it (the step may: "positions" under context parallelism).
  bool optional = false;
  /// Not per token: under context parallelism every rank takes the whole micro-batch's
  /// (cu_seqlens, whose shape is then that of the whole sequences).
  bool whole_under_cp = false;

  /// Bytes of the whole [B, ...] input.
  int64_t nbytes() const { return shape.numel() * static_cast<int64_t>(dtype_size(dtype)); }
};

/// The inputs and targets of one micro-batch as a model takes them (Batch). The host
/// layout of a micro-batch that the data supplies (TrainData::next_batch, TrainStep::run)
/// is its required inputs' bytes in declaration order, then (separately) the targets.
struct BatchShape {
  std::vector<BatchInput> inputs;
  Shape targets;  // int32
  /// Targets lie in [0, target_range) (a vocabulary, a class count) or are -1; 0: any.
  int64_t target_range = 0;

  /// The declared input `name`, or nullptr.
  const BatchInput* find(std::string_view name) const;
  /// The required (not optional) inputs, in declaration order.
  std::vector<BatchInput> required() const;
  /// Bytes of the required inputs of one micro-batch (the host layout above).
  int64_t required_bytes() const;
};

/// A training micro-batch on the backend's device: the inputs by name (BatchShape), the
/// targets int32 ([B,T] or [B]; -1 ignored). `loss`, when given, is an fp64 [2]
/// accumulator on the device: forward adds (+=) the loss sum (nats) and the target count
/// there and reads nothing back to the host (a training step's losses stay on the
/// device); without it, forward returns them.
struct Batch {
  std::vector<std::pair<std::string, Tensor>> inputs;
  Tensor targets;
  Tensor loss{};

  /// A language model's batch: tokens and targets int32 [B,T], positions int32 [B,T] or
  /// empty (0..T-1).
  static Batch of_tokens(Tensor tokens, Tensor targets, Tensor positions = {});
  /// An image model's batch: images fp32 [B,H,W,C] and targets int32 [B].
  static Batch of_images(Tensor images, Tensor targets);

  /// Sets input `name` (replacing one of that name); an empty tensor removes it.
  void set(std::string_view name, Tensor t);
  /// Input `name`, or an empty Tensor when the batch has none.
  Tensor input(std::string_view name) const;
  /// Input `name`; throws kiln::Error naming it (and `model`) when the batch has none.
  const Tensor& require(std::string_view name, std::string_view model) const;
};

}  // namespace kiln
