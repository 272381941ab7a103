// Builders for KeySpec, so a schema reads as one line per key:
//
//   schema.add(keys::atLeast(keys::key("train.seed", ValueType::kInt, "1234", "Seed for ..."), 0));
//   schema.add(keys::oneOf(keys::key("optimizer.name", ValueType::kString, "adamw", "Optimizer."),
//                          {"adamw", "sgd"}));
//   schema.add(keys::reserved(keys::key("offload.params", ValueType::kBool, "false", "Keep ..."),
//                             "parameter offload is not built yet", {"false"}));
//
// Each builder takes a spec by value and returns it with one more property,
// so they nest in any order. None checks anything: Schema::add does, and
// throws InternalError for a spec that contradicts itself (a default out of
// its own range, an accepted value of the wrong type, ...).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <string>
#include <vector>

#include "ptrain/core/error.h"
#include "ptrain/recipe/schema.h"

namespace ptrain::keys {

// A key with a default: `path` dotted ("train.seed"), `defaultValue` YAML
// text ("1234", "[add]"; "" for a key that has no value unless a recipe sets
// it), `doc` one sentence for `ptrain keys` and docs/recipes.md.
PTRAIN_API KeySpec key(std::string path, ValueType type, std::string defaultValue, std::string doc);

// A key every recipe must set: no default.
PTRAIN_API KeySpec required(std::string path, ValueType type, std::string doc);

// Numbers (and the elements of number lists) >= `min`.
PTRAIN_API KeySpec atLeast(KeySpec spec, double min);

// Numbers (and the elements of number lists) > `min`, e.g. a learning rate above 0.
PTRAIN_API KeySpec above(KeySpec spec, double min);

// Numbers (and the elements of number lists) <= `max`.
PTRAIN_API KeySpec atMost(KeySpec spec, double max);

// Numbers in [0, 1): probabilities and decay factors.
PTRAIN_API KeySpec unitBelowOne(KeySpec spec);

// Strings (and the elements of string lists) limited to `choices`, listed
// in this order in messages and tables.
PTRAIN_API KeySpec oneOf(KeySpec spec, std::vector<std::string> choices);

// A key that is planned but not built yet. `reason` says why and when, in a
// few words ("bf16 and fp16 arrive with the precision plugins"); `accepts`
// lists, as YAML text, the values that run today ({"false"}; empty: none, so
// any value a recipe writes is refused). Validation refuses a recipe that
// sets the key to any other value; the schema default never counts as set.
PTRAIN_API KeySpec reserved(KeySpec spec, std::string reason, std::vector<std::string> accepts);

// The keys of a trainer's model that the engine and the layout checks also
// understand. A trainer adds the groups its model reads (its describeKeys);
// the keys of a group it does not add are refused in its recipes.
//
// model.num_layers, hidden_size, num_attention_heads, ffn_hidden_size,
// seq_length: a GPT-shaped transformer (Megatron's names), which the trainer
// reports back through Trainer::modelShape() for the layout checks.
PTRAIN_API void addTransformerShape(Schema& schema);
// model.recompute (none, full, and selective when `selective`: the model
// recomputes its attention core itself) and model.recompute_num_layers: the
// engine recomputes whole blocks of any StagedModel.
PTRAIN_API void addRecompute(Schema& schema, bool selective);
// model.num_experts and model.moe_*: a model with MoE layers (nn/moe.h),
// which the expert plugin places.
PTRAIN_API void addMoe(Schema& schema);
// fusion.*: the fused kernels of nn/fused.h a transformer block can use.
PTRAIN_API void addFusion(Schema& schema);

}  // namespace ptrain::keys
