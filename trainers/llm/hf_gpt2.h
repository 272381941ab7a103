// Hugging Face GPT-2 interop for the GPT of gpt_model.h: the same
// architecture (learned positions, pre-LayerNorm blocks with eps 1e-5, GELU
// with the tanh approximation, a head tied to the token embedding), stored
// another way:
//
//   ptrain (GptModel)                      transformers (GPT2LMHeadModel)
//   embed.tokens.weight [V_pad, h]          transformer.wte.weight [V, h]   (rows >= V: padding, zero)
//   embed.positions.weight [T, h]           transformer.wpe.weight [n_positions >= T, h]
//   blocks.i.ln1 / ln2                      transformer.h.i.ln_1 / ln_2
//   blocks.i.attn.qkv.weight [3h, h]        transformer.h.i.attn.c_attn.weight [h, 3h]
//       rows (head, part, d) head-major          columns (part, head, d): q of every head, then k, then v
//   blocks.i.attn.proj.weight [h, h]        transformer.h.i.attn.c_proj.weight [h, h]  (transposed)
//   blocks.i.mlp.fc1.weight [f, h]          transformer.h.i.mlp.c_fc.weight [h, f]      (transposed)
//   blocks.i.mlp.fc2.weight [h, f]          transformer.h.i.mlp.c_proj.weight [f, h]    (transposed)
//   head.ln_f                               transformer.ln_f
//   head.lm.weight (untied only)            lm_head.weight (tie_word_embeddings: false)
// GPT-2's Conv1D keeps its weight as [in, out], hence the transposes; biases
// map the same way without them (c_attn's bias permuted like its columns).
//
// Reading (checkpoint.load of an HF folder) is block by block: a rank reads
// only the bytes of its own rows and columns, transposed and permuted on the
// way, so an HF folder loads at any layout without any rank holding a whole
// sharded tensor. Writing (`ptrain export --format hf`) holds one tensor at a
// time.
//
// Thread-safety: one thread at a time per source.
#pragma once

#include <memory>
#include <string>

#include "gpt_model.h"
#include "ptrain/engine/weights_source.h"

namespace ptrain::llm {

// The HF GPT-2 folder `dir` (config.json + model.safetensors) as a source
// under GptModel's parameter names for a model of `config`. Throws
// CheckpointError naming config.json and the first difference (another
// hidden size, vocabulary, activation, too few positions, experts in this
// model, ...) and how to set the recipe to match.
std::unique_ptr<WeightsSource> openHfGpt2(const std::string& dir, const GptConfig& config);

// Writes the weights of a model of `config` (under GptModel's names) as an HF
// GPT-2 folder `outDir` (created; config.json and model.safetensors, float32,
// vocabulary vocab_size without the padding rows, n_positions = seq_length).
// Throws ConfigError naming what GPT-2 cannot express (experts), and
// CheckpointError for a missing tensor or an unwritable folder.
void exportHfGpt2(const GptConfig& config, WeightsSource& weights, const std::string& outDir);

}  // namespace ptrain::llm
