#include "hf_gpt2.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/safetensors.h"
#include "ptrain/engine/sharded_checkpoint.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace ptrain::llm {

namespace {

// How a GptModel tensor is stored in the HF file.
enum class Layout {
  kSame,        // same shape, same order (LayerNorms, biases, positions' first rows)
  kTransposed,  // a Conv1D weight: HF [in, out] for our [out, in]
  kQkvWeight,   // transposed, and HF's columns (part, head, d) for our rows (head, part, d)
  kQkvBias,     // permuted the same way
  kVocabRows,   // our padded rows past HF's vocabulary are zero
};

struct Mapping {
  std::string hf;  // HF tensor name (without the "transformer." prefix of the LM head model)
  Layout layout;
  std::vector<int64_t> shape;  // ours, whole
};

// Our parameter name -> where its values are in the HF file.
std::map<std::string, Mapping> mappingsFor(const GptConfig& c) {
  const int64_t h = c.hidden_size, f = c.ffnSize();
  std::map<std::string, Mapping> m;
  m["embed.tokens.weight"] = {"wte.weight", Layout::kVocabRows, {c.paddedVocab(), h}};
  m["embed.positions.weight"] = {"wpe.weight", Layout::kSame, {c.seq_length, h}};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string ours = "blocks." + std::to_string(i) + ".";
    const std::string hf = "h." + std::to_string(i) + ".";
    for (const char* p : {"weight", "bias"}) {
      m[ours + "ln1." + p] = {hf + "ln_1." + p, Layout::kSame, {h}};
      m[ours + "ln2." + p] = {hf + "ln_2." + p, Layout::kSame, {h}};
    }
    m[ours + "attn.qkv.weight"] = {hf + "attn.c_attn.weight", Layout::kQkvWeight, {3 * h, h}};
    m[ours + "attn.qkv.bias"] = {hf + "attn.c_attn.bias", Layout::kQkvBias, {3 * h}};
    m[ours + "attn.proj.weight"] = {hf + "attn.c_proj.weight", Layout::kTransposed, {h, h}};
    m[ours + "attn.proj.bias"] = {hf + "attn.c_proj.bias", Layout::kSame, {h}};
    m[ours + "mlp.fc1.weight"] = {hf + "mlp.c_fc.weight", Layout::kTransposed, {f, h}};
    m[ours + "mlp.fc1.bias"] = {hf + "mlp.c_fc.bias", Layout::kSame, {f}};
    m[ours + "mlp.fc2.weight"] = {hf + "mlp.c_proj.weight", Layout::kTransposed, {h, f}};
    m[ours + "mlp.fc2.bias"] = {hf + "mlp.c_proj.bias", Layout::kSame, {h}};
  }
  m["head.ln_f.weight"] = {"ln_f.weight", Layout::kSame, {h}};
  m["head.ln_f.bias"] = {"ln_f.bias", Layout::kSame, {h}};
  if (!c.tie_embeddings) m["head.lm.weight"] = {"lm_head.weight", Layout::kVocabRows, {c.paddedVocab(), h}};
  return m;
}

// Row f of our qkv is (head, part, d); its HF column is (part, head, d).
int64_t hfQkvIndex(int64_t f, int64_t h, int64_t d) {
  const int64_t seg = f / d, head = seg / 3, part = seg % 3;
  return part * h + head * d + (f - seg * d);
}

std::string numberText(const json& v) { return v.is_null() ? "null" : v.dump(); }

class HfGpt2Weights : public WeightsSource {
 public:
  HfGpt2Weights(std::string dir, const GptConfig& config) : dir_(std::move(dir)), config_(config) {
    const std::string configPath = (fs::path(dir_) / "config.json").string();
    const json hf = readJsonFile(configPath);
    checkConfig(hf, configPath);
    file_ = (fs::path(dir_) / "model.safetensors").string();
    reader_ = CheckpointReader::openFile(file_);
    prefix_ = reader_->find("model", CheckpointSection::kParameters, "transformer.wte.weight") ? "transformer." : "";
    mappings_ = mappingsFor(config_);
    hfVocab_ = hf.at("vocab_size").get<int64_t>();
    for (auto& [name, m] : mappings_) {
      // An untied model started from a tied GPT-2 reads its head from wte.
      if (m.hf == "lm_head.weight") {
        if (!reader_->find("model", CheckpointSection::kParameters, "lm_head.weight")) m.hf = prefix_ + "wte.weight";
      } else {
        m.hf = prefix_ + m.hf;
      }
      auto info = reader_->find("model", CheckpointSection::kParameters, m.hf);
      if (!info) {
        throw CheckpointError(file_ + ": no tensor '" + m.hf + "', which GPT-2's " + name +
                              " is read from: not a GPT-2 model.safetensors");
      }
      const std::vector<int64_t> want = hfShape(m);
      if (info->shape.size() != want.size() ||
          (m.layout == Layout::kSame && name == "embed.positions.weight"
               ? info->shape[0] < want[0] || info->shape[1] != want[1]
               : info->shape != want)) {
        throw CheckpointError(file_ + ": '" + m.hf + "' has shape " + shapeText(info->shape) + ", config.json says " +
                              shapeText(want) + ": the folder is inconsistent");
      }
    }
  }

  std::string where() const override { return dir_; }

  std::vector<std::string> names() override {
    std::vector<std::string> out;
    for (const auto& [name, m] : mappings_) out.push_back(name);
    return out;
  }

  std::optional<TensorInfo> find(const std::string& name) override {
    auto it = mappings_.find(name);
    if (it == mappings_.end()) return std::nullopt;
    auto info = reader_->find("model", CheckpointSection::kParameters, it->second.hf);
    return TensorInfo{info->dtype, it->second.shape};
  }

  void read(const std::string& name, const TensorBlock& block, at::Tensor& out) override {
    auto it = mappings_.find(name);
    if (it == mappings_.end()) throw CheckpointError(dir_ + ": no GPT-2 tensor for parameter '" + name + "'");
    const Mapping& m = it->second;
    TensorBlock whole = block;
    whole.flat_begin = whole.flat_end = -1;
    at::Tensor tmp = torch::zeros(whole.sizes, torch::TensorOptions().dtype(out.scalar_type()));
    fill(m, whole, tmp);
    if (block.flat()) {
      out.copy_(tmp.reshape({-1}).slice(0, block.flat_begin, block.flat_end).view(out.sizes()));
    } else {
      out.copy_(tmp.view(out.sizes()));
    }
  }

  uint64_t bytesRead() const override { return reader_->bytesRead(); }

 private:
  static std::string shapeText(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  }

  // The HF tensor's shape for a mapping (n_positions rows for wpe are checked apart).
  std::vector<int64_t> hfShape(const Mapping& m) const {
    switch (m.layout) {
      case Layout::kSame:
      case Layout::kQkvBias:
        return m.shape;
      case Layout::kTransposed:
      case Layout::kQkvWeight:
        return {m.shape[1], m.shape[0]};
      case Layout::kVocabRows:
        return {hfVocab_, m.shape[1]};
    }
    return m.shape;
  }

  void readHf(const std::string& hf, const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes,
              at::Tensor out) {
    TensorBlock b;
    b.offsets = offsets;
    b.sizes = sizes;
    reader_->read("model", CheckpointSection::kParameters, hf, b, out);
  }

  // `whole` of our tensor into tmp (contiguous, of whole.sizes).
  void fill(const Mapping& m, const TensorBlock& whole, at::Tensor& tmp) {
    const auto& o = whole.offsets;
    const auto& s = whole.sizes;
    const at::TensorOptions opts = tmp.options();
    switch (m.layout) {
      case Layout::kSame:
        readHf(m.hf, o, s, tmp);
        return;
      case Layout::kTransposed: {
        if (s.size() == 1) {
          readHf(m.hf, o, s, tmp);
          return;
        }
        at::Tensor t = torch::empty({s[1], s[0]}, opts);
        readHf(m.hf, {o[1], o[0]}, {s[1], s[0]}, t);
        tmp.copy_(t.t());
        return;
      }
      case Layout::kVocabRows: {
        const int64_t rows = std::max<int64_t>(0, std::min(o[0] + s[0], hfVocab_) - o[0]);
        if (rows > 0) readHf(m.hf, {o[0], o[1]}, {rows, s[1]}, tmp.narrow(0, 0, rows));
        return;
      }
      case Layout::kQkvWeight:
      case Layout::kQkvBias: {
        const int64_t h = config_.hidden_size, d = config_.headDim();
        for (int64_t f = o[0]; f < o[0] + s[0];) {
          const int64_t segEnd = std::min(o[0] + s[0], (f / d + 1) * d);
          const int64_t len = segEnd - f, col = hfQkvIndex(f, h, d);
          if (m.layout == Layout::kQkvBias) {
            readHf(m.hf, {col}, {len}, tmp.narrow(0, f - o[0], len));
          } else {
            at::Tensor t = torch::empty({s[1], len}, opts);
            readHf(m.hf, {o[1], col}, {s[1], len}, t);
            tmp.narrow(0, f - o[0], len).copy_(t.t());
          }
          f = segEnd;
        }
        return;
      }
    }
  }

  // Every GPT-2 setting that changes the function, against the model's.
  void checkConfig(const json& hf, const std::string& where) const {
    auto fail = [&](const std::string& what) { throw CheckpointError(where + ": " + what); };
    if (hf.value("model_type", "") != "gpt2") {
      fail("model_type is " + numberText(hf.value("model_type", json())) +
           ": the llm trainer reads GPT-2 folders (model_type \"gpt2\") only");
    }
    auto intOf = [&](const char* key) -> int64_t {
      if (!hf.contains(key) || !hf.at(key).is_number_integer()) fail(std::string(key) + " is missing or not an integer");
      return hf.at(key).get<int64_t>();
    };
    auto same = [&](const char* key, int64_t theirs, const char* ours, int64_t mine) {
      if (theirs != mine) {
        fail(std::string(key) + " is " + std::to_string(theirs) + ", this model's " + ours + " is " +
             std::to_string(mine) + "; set " + ours + ": " + std::to_string(theirs));
      }
    };
    same("n_embd", intOf("n_embd"), "model.hidden_size", config_.hidden_size);
    same("n_layer", intOf("n_layer"), "model.num_layers", config_.num_layers);
    same("n_head", intOf("n_head"), "model.num_attention_heads", config_.num_heads);
    same("vocab_size", intOf("vocab_size"), "model.vocab_size", config_.vocab_size);
    const int64_t inner = hf.contains("n_inner") && !hf.at("n_inner").is_null() ? intOf("n_inner") : 4 * intOf("n_embd");
    same("n_inner", inner, "model.ffn_hidden_size", config_.ffnSize());
    const int64_t positions = intOf("n_positions");
    if (positions < config_.seq_length) {
      fail("n_positions is " + std::to_string(positions) + ", fewer than this model's model.seq_length " +
           std::to_string(config_.seq_length) + "; set model.seq_length to at most " + std::to_string(positions));
    }
    const std::string act = hf.value("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
      fail("activation_function is \"" + act + "\"; this GPT uses GELU with the tanh approximation (gelu_new)");
    }
    const double eps = hf.value("layer_norm_epsilon", 1e-5);
    if (std::abs(eps - config_.layernorm_eps) > 1e-12) {
      fail("layer_norm_epsilon is " + numberText(hf.at("layer_norm_epsilon")) + "; this GPT's LayerNorms use 1e-05");
    }
    if (!hf.value("scale_attn_weights", true) || hf.value("scale_attn_by_inverse_layer_idx", false)) {
      fail("attention scores are not scaled by 1/sqrt(head_dim) alone (scale_attn_weights, "
           "scale_attn_by_inverse_layer_idx); this GPT scales by exactly that");
    }
    if (config_.num_experts > 0) fail("GPT-2 has no experts; this model has model.num_experts " + std::to_string(config_.num_experts));
  }

  std::string dir_;
  GptConfig config_;
  std::string file_;
  std::unique_ptr<CheckpointReader> reader_;
  std::string prefix_;
  std::map<std::string, Mapping> mappings_;
  int64_t hfVocab_ = 0;
};

}  // namespace

std::unique_ptr<WeightsSource> openHfGpt2(const std::string& dir, const GptConfig& config) {
  return std::make_unique<HfGpt2Weights>(dir, config);
}

void exportHfGpt2(const GptConfig& c, WeightsSource& weights, const std::string& outDir) {
  if (c.num_experts > 0) {
    throw ConfigError("--format hf: GPT-2 has no experts, and this model has model.num_experts " +
                      std::to_string(c.num_experts) + "; a mixture-of-experts GPT cannot be written as GPT-2");
  }
  std::error_code ec;
  if (fs::exists(outDir, ec) && !fs::is_empty(outDir, ec)) {
    throw ConfigError(outDir + ": exists and is not empty; give a new folder");
  }
  const std::map<std::string, Mapping> mappings = mappingsFor(c);
  const int64_t h = c.hidden_size, d = c.headDim();
  // Every tensor in HF's layout, one at a time, in the writer's order.
  std::map<std::string, std::string> hfToOurs;
  std::vector<SafetensorsTensorSpec> specs;
  for (const auto& [ours, m] : mappings) {
    auto info = weights.find(ours);
    if (!info) throw CheckpointError(weights.where() + ": no parameter '" + ours + "': not a checkpoint of this GPT");
    if (info->shape != m.shape) {
      throw CheckpointError(weights.where() + ": parameter '" + ours + "' has another shape than this recipe's GPT");
    }
    const std::string hf = m.hf == "lm_head.weight" ? m.hf : "transformer." + m.hf;
    hfToOurs[hf] = ours;
    std::vector<int64_t> shape = m.shape;
    if (m.layout == Layout::kTransposed && shape.size() == 2) shape = {m.shape[1], m.shape[0]};
    if (m.layout == Layout::kQkvWeight) shape = {m.shape[1], m.shape[0]};
    if (m.layout == Layout::kVocabRows) shape = {c.vocab_size, h};
    specs.push_back({hf, at::kFloat, shape});
  }
  std::sort(specs.begin(), specs.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  const fs::path tmp = fs::path(outDir).string() + ".tmp-export";
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw CheckpointError(tmp.string() + ": cannot create (" + ec.message() + ")");
  {
    SafetensorsWriter writer((tmp / "model.safetensors").string(), specs, {{"format", "pt"}});
    for (const auto& spec : writer.order()) {
      const std::string& ours = hfToOurs.at(spec.name);
      const Mapping& m = mappings.at(ours);
      at::Tensor t = torch::empty(m.shape, torch::kFloat32);
      weights.read(ours, TensorBlock::whole(m.shape), t);
      switch (m.layout) {
        case Layout::kSame: break;
        case Layout::kTransposed: t = t.dim() == 2 ? t.t().contiguous() : t; break;
        case Layout::kVocabRows: t = t.narrow(0, 0, c.vocab_size).contiguous(); break;
        case Layout::kQkvWeight:
        case Layout::kQkvBias: {
          // Our row f goes to HF column hfQkvIndex(f).
          std::vector<int64_t> order(static_cast<size_t>(3 * h));
          for (int64_t f = 0; f < 3 * h; ++f) order[static_cast<size_t>(hfQkvIndex(f, h, d))] = f;
          at::Tensor index = torch::tensor(order, torch::kInt64);
          t = t.index_select(0, index);
          if (m.layout == Layout::kQkvWeight) t = t.t().contiguous();
          break;
        }
      }
      writer.append(t);
    }
    writer.finish();
  }
  json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"activation_function", "gelu_new"},
      {"n_embd", c.hidden_size},
      {"n_head", c.num_heads},
      {"n_layer", c.num_layers},
      {"n_inner", c.ffnSize()},
      {"n_positions", c.seq_length},
      {"n_ctx", c.seq_length},
      {"vocab_size", c.vocab_size},
      {"layer_norm_epsilon", c.layernorm_eps},
      {"initializer_range", c.init_std},
      {"attn_pdrop", c.dropout},
      {"embd_pdrop", c.dropout},
      {"resid_pdrop", c.dropout},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", c.tie_embeddings},
      {"torch_dtype", "float32"},
  };
  writeJsonFile((tmp / "config.json").string(), config);
  fs::remove_all(outDir, ec);
  fs::rename(tmp, outDir, ec);
  if (ec) throw CheckpointError(outDir + ": cannot rename the export into place (" + ec.message() + ")");
}

}  // namespace ptrain::llm
