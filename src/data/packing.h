// Document packing (data.packing = "document"): the samples of the token stream as they
// are, but each document attending only to itself, as if run alone (Megatron-LM's
// reset_attention_mask and reset_position_ids; FlashAttention's varlen inputs).
//
// A sample of T tokens holds the tail of one document, whole documents and the head of
// another; its document starts are the positions where a document's separator token (the
// end-of-text kiln prepare writes before each document) falls, and 0. For a micro-batch
// of B samples the model takes two inputs besides the tokens (models/batch.h):
//   positions   int32 [B,T]    t minus the start of t's document: 0 at each separator;
//   cu_seqlens  int32 [B*T+1]  the documents over the B*T tokens laid end to end:
//                              0, b*T + each start, ..., B*T, then B*T repeated up to the
//                              fixed size (empty documents).
// The loss needs no mask: a target is the next token of the same document, or the next
// document's separator, which ends the document as it would end it alone.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kiln::data {

enum class Packing : uint8_t { None, Document };

/// "none" or "document" (data.packing). Throws kiln::Error naming `where` otherwise.
Packing parse_packing(const std::string& name, const std::string& where);

/// Bytes of the packed inputs after the tokens of B samples of T: positions and cu_seqlens.
int64_t packed_input_bytes(int64_t B, int64_t T);

/// positions [B*T] and cu_seqlens [B*T+1] of B samples of T tokens whose document starts
/// are starts[b] (ascending, in [0, T), the first 0).
void pack_documents(std::span<const std::vector<int32_t>> starts, int64_t T, int32_t* positions,
                    int32_t* cu_seqlens);

}  // namespace kiln::data
