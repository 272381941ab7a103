#include "ptrain/recipe/key_specs.h"

#include <utility>

namespace ptrain::keys {

KeySpec key(std::string path, ValueType type, std::string defaultValue, std::string doc) {
  KeySpec k;
  k.path = std::move(path);
  k.type = type;
  k.default_value = std::move(defaultValue);
  k.doc = std::move(doc);
  return k;
}

KeySpec required(std::string path, ValueType type, std::string doc) {
  KeySpec k = key(std::move(path), type, "", std::move(doc));
  k.required = true;
  return k;
}

KeySpec atLeast(KeySpec spec, double min) {
  spec.min = min;
  spec.min_exclusive = false;
  return spec;
}

KeySpec above(KeySpec spec, double min) {
  spec.min = min;
  spec.min_exclusive = true;
  return spec;
}

KeySpec atMost(KeySpec spec, double max) {
  spec.max = max;
  spec.max_exclusive = false;
  return spec;
}

KeySpec unitBelowOne(KeySpec spec) {
  spec.min = 0;
  spec.min_exclusive = false;
  spec.max = 1;
  spec.max_exclusive = true;
  return spec;
}

KeySpec oneOf(KeySpec spec, std::vector<std::string> choices) {
  spec.choices = std::move(choices);
  return spec;
}

KeySpec reserved(KeySpec spec, std::string reason, std::vector<std::string> accepts) {
  spec.reserved = std::move(reason);
  spec.reserved_accepts = std::move(accepts);
  return spec;
}

void addTransformerShape(Schema& schema) {
  using T = ValueType;
  Schema& s = schema;
  s.add(atLeast(key("model.num_layers", T::kInt, "", "Transformer blocks (the repeated layer); split across pipeline stages."), 1));
  s.add(atLeast(key("model.hidden_size", T::kInt, "", "Width of the hidden states."), 1));
  s.add(atLeast(key("model.num_attention_heads", T::kInt, "", "Attention heads per layer; split across tensor-parallel ranks."), 1));
  s.add(atLeast(key("model.ffn_hidden_size", T::kInt, "0", "Width of the MLP inside each block; 0 means 4 * hidden_size."), 0));
  s.add(atLeast(key("model.seq_length", T::kInt, "", "Tokens per sample."), 1));
}

void addRecompute(Schema& schema, bool selective) {
  using T = ValueType;
  Schema& s = schema;
  s.add(oneOf(key("model.recompute", T::kString, "none",
                  selective ? "Activation recomputation: `full` (a block keeps only its input and recomputes its "
                              "forward in backward), `selective` (only the attention core is recomputed), or `none`."
                            : "Activation recomputation: `full` (a block keeps only its input and recomputes its "
                              "forward in backward) or `none`."),
              selective ? std::vector<std::string>{"none", "selective", "full"}
                        : std::vector<std::string>{"none", "full"}));
  s.add(atLeast(key("model.recompute_num_layers", T::kInt, "0",
                    "With recompute: full, the first this many blocks of each pipeline stage are recomputed; 0: every "
                    "block."),
                0));
}

void addMoe(Schema& schema) {
  using T = ValueType;
  Schema& s = schema;
  s.add(atLeast(key("model.num_experts", T::kInt, "0", "Experts per MoE layer; 0 builds a dense model."), 0));
  s.add(atLeast(key("model.moe_router_topk", T::kInt, "2", "Experts each token is routed to (MoE only)."), 1));
  s.add(atLeast(key("model.moe_layer_freq", T::kInt, "1", "Every this many blocks (0, freq, 2 freq, ...) has a MoE MLP; the others a dense one (MoE only)."), 1));
  s.add(oneOf(key("model.moe_router_score_function", T::kString, "softmax", "Router scores: `softmax` or `sigmoid` (normalised over the chosen experts) (MoE only)."),
              {"softmax", "sigmoid"}));
  s.add(key("model.moe_router_pre_softmax", T::kBool, "false", "Softmax over every expert before the top-k (true) or over the top-k logits (false) (MoE only)."));
  s.add(atLeast(key("model.moe_aux_loss_coeff", T::kFloat, "0", "Coefficient of the load-balancing (switch) loss; 0 turns it off (MoE only)."), 0));
  s.add(atLeast(key("model.moe_z_loss_coeff", T::kFloat, "0", "Coefficient of the router z-loss; 0 turns it off (MoE only)."), 0));
  s.add(above(key("model.moe_expert_capacity_factor", T::kFloat, "", "Tokens an expert takes, as a multiple of an even share; over it the lowest-probability tokens are dropped. Not set: dropless (MoE only)."), 0));
  s.add(key("model.moe_pad_expert_input_to_capacity", T::kBool, "false", "Every expert computes exactly its capacity of rows (padding with zero-gate tokens); needs moe_expert_capacity_factor (MoE only)."));
}

void addFusion(Schema& schema) {
  using T = ValueType;
  Schema& s = schema;
  s.add(key("fusion.masked_softmax", T::kBool, "false", "Attention's scale, causal or padding mask and softmax in one pass, forward and backward."));
  s.add(key("fusion.bias_gelu", T::kBool, "false", "The MLP's bias add and GELU in one pass, forward and backward."));
  s.add(key("fusion.layernorm", T::kBool, "false", "LayerNorm forward and backward in one pass each, with the residual add before it."));
  s.add(key("fusion.bias_dropout_add", T::kBool, "false", "Bias add, dropout and the residual add in one pass (attention output and MLP output)."));
}

}  // namespace ptrain::keys
