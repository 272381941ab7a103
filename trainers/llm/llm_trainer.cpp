#include "llm_trainer.h"

#include <torch/torch.h>

#include <algorithm>

#include "hf_gpt2.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/engine/moe_settings.h"
#include "ptrain/engine/precision.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain::llm {

using datasets::ArithmeticDataset;
using datasets::ArithmeticOp;
using datasets::ArithmeticOptions;
using datasets::ArithmeticTokenizer;

namespace {

// Problems decoded in one batch: bounds the activation memory of evaluation
// whatever data.eval_size is.
constexpr size_t kEvalChunk = 256;

int64_t requiredInt(const Recipe& recipe, const std::string& key, const char* example) {
  if (!recipe.has(key)) recipe.fail(key, std::string("not set; the llm trainer needs it, e.g. ") + key + ": " + example);
  return recipe.getInt(key);
}

}  // namespace

LlmTrainer::LlmTrainer(const PluginContext&) {}

LlmTrainer::~LlmTrainer() = default;

void LlmTrainer::describeKeys(Schema& schema) const {
  using T = ValueType;
  using keys::above;
  using keys::atLeast;
  using keys::atMost;
  using keys::key;
  using keys::oneOf;
  using keys::unitBelowOne;

  // The GPT's shape (Megatron's names; modelShape() reports it back for the
  // layout checks), its recomputation (selective: the attention core), its
  // experts and fused kernels, then the keys only this trainer reads.
  keys::addTransformerShape(schema);
  keys::addRecompute(schema, /*selective=*/true);
  keys::addMoe(schema);
  keys::addFusion(schema);
  schema.add(atLeast(key("model.vocab_size", T::kInt, "0", "Vocabulary size; 0 takes it from the dataset."), 0));
  schema.add(unitBelowOne(key("model.dropout", T::kFloat, "0.0", "Dropout probability.")));
  schema.add(above(key("model.init_std", T::kFloat, "0.02", "Standard deviation of the normal weight initialisation."), 0));
  schema.add(key("model.tie_embeddings", T::kBool, "true", "Share the input embedding with the output projection."));
  schema.add(atLeast(key("model.make_vocab_size_divisible_by", T::kInt, "128",
                         "Pad the vocabulary (embedding and LM-head rows) to a multiple of this; padding is never "
                         "predicted. Fixed, so every tensor-parallel size starts from the same weights; must be "
                         "divisible by tensor_model_parallel_size (after padding)."),
                     1));

  schema.add(oneOf(key("data.operations", T::kStringList, "[add]",
                       "Arithmetic operations the problems use, drawn uniformly per problem (add, sub, mul)."),
                   {"add", "sub", "mul"}));
  schema.add(atMost(atLeast(key("data.digits", T::kInt, "2",
                                "Most digits of each operand; operands are uniform in [0, 10^digits)."),
                            1),
                    9));
  schema.add(key("data.path", T::kStringList, "",
                 "data.name megatron: the files' prefixes (PREFIX.bin + PREFIX.idx), or weights and prefixes "
                 "([0.7, a, 0.3, b]) to blend several, as Megatron's --data-path."));
  schema.add(key("data.validation_path", T::kString, "",
                 "data.name prompts: a JSONL file of problems scored for exact match (none: no evaluation)."));
  schema.add(key("data.shuffle", T::kBool, "true",
                 "data.name prompts: each epoch in an order seeded by train.seed and the epoch (false: the file's)."));
  schema.add(key("data.split", T::kString, "969,30,1",
                 "data.name megatron: the train, validation and test shares of each file's documents, as "
                 "Megatron's --split."));
  schema.add(atLeast(key("data.eval_size", T::kInt, "512",
                         "Evaluation problems (a separate seeded stream), split across data-parallel ranks."),
                     0));
}

void LlmTrainer::setup(const Recipe& recipe) {
  const std::string name = recipe.has("data.name") ? recipe.getString("data.name") : "";
  const bool files = name == "megatron";
  const bool prompts = name == "prompts";
  if (!name.empty() && name != "arithmetic" && !files && !prompts) {
    recipe.fail("data.name", "'" + name + "' is not a dataset of the llm trainer; use arithmetic (built in), "
                             "megatron (indexed .bin/.idx files, data.path) or prompts (JSONL problems, data.path)");
  }
  // Keys of another source would be silently unread.
  const std::map<std::string, std::vector<std::string>> readBy = {
      {"data.operations", {"arithmetic"}}, {"data.digits", {"arithmetic"}}, {"data.path", {"megatron", "prompts"}},
      {"data.split", {"megatron"}},       {"data.validation_path", {"prompts"}}, {"data.shuffle", {"prompts"}}};
  const std::string source = name.empty() ? "arithmetic" : name;
  for (const auto& [key, sources] : readBy) {
    if (recipe.isExplicit(key) && std::find(sources.begin(), sources.end(), source) == sources.end()) {
      recipe.fail(key, "is read only with data.name: " + sources.front() + "; remove it, or set data.name: " +
                           sources.front());
    }
  }
  if (files && !recipe.has("model.seq_length")) {
    recipe.fail("model.seq_length", "not set; data.name: megatron cuts the documents into samples of seq_length + 1 "
                                    "tokens: set it, e.g. model.seq_length: 256");
  }

  ArithmeticOptions data;
  data.operations.clear();
  for (const std::string& op : recipe.getStringList("data.operations")) {
    auto parsed = datasets::arithmeticOpFromName(op);
    if (!parsed) recipe.fail("data.operations", "'" + op + "' is not an operation; use add, sub or mul");
    if (std::find(data.operations.begin(), data.operations.end(), *parsed) == data.operations.end()) {
      data.operations.push_back(*parsed);
    }
  }
  data.digits = recipe.getInt("data.digits");
  data.eval_size = recipe.getInt("data.eval_size");
  data.seed = static_cast<uint64_t>(recipe.getInt("train.seed"));
  // Checked before seq_length is derived from it, so its message comes first.
  if (data.digits < 1 || data.digits > 9) {
    recipe.fail("data.digits", std::to_string(data.digits) + " is out of range; use 1..9");
  }
  data.seq_length = recipe.has("model.seq_length") ? recipe.getInt("model.seq_length")
                                                   : ArithmeticDataset::minSeqLength(data.operations, data.digits);
  std::unique_ptr<PromptSet> promptSet, validationSet;
  std::vector<std::string> derived;  // derivedSizes()
  if (prompts) {
    const auto paths = recipe.getStringList("data.path");
    if (paths.size() != 1) {
      recipe.fail("data.path", "data.name: prompts reads one JSONL file of problems; give it as data.path: [FILE]");
    }
    // No data.validation_path: no evaluation (docs/data.md).
    const std::string v = recipe.has("data.validation_path") ? recipe.getString("data.validation_path") : "";
    try {
      promptSet = std::make_unique<PromptSet>(paths.front());
      if (!v.empty()) validationSet = std::make_unique<PromptSet>(v);
    } catch (const ConfigError& e) {
      recipe.fail(validationSet || !promptSet ? "data.path" : "data.validation_path", e.what());
    }
    const PromptSet& longestSet =
        validationSet && validationSet->longestTokens() > promptSet->longestTokens() ? *validationSet : *promptSet;
    const int64_t longest = longestSet.longestTokens();
    if (!recipe.has("model.seq_length")) {
      data.seq_length = longest - 1;
      derived.push_back("model.seq_length " + std::to_string(longest - 1) + " comes from the longest problem, " +
                        longestSet.path() + ":" + std::to_string(longestSet.longestLine()) + " (" +
                        std::to_string(longest) + " tokens with its EOS): set model.seq_length to bound it");
    } else if (data.seq_length < longest - 1) {
      recipe.fail("model.seq_length", std::to_string(data.seq_length) + " is too short for the longest problem (" +
                                          std::to_string(longest) + " tokens with its EOS); use at least " +
                                          std::to_string(longest - 1));
    }
  }
  if (!files && !prompts) {
    if (auto problem = ArithmeticDataset::check(data)) recipe.fail(problem->key, problem->message);
  }

  GptConfig c;
  c.num_layers = requiredInt(recipe, "model.num_layers", "2");
  c.hidden_size = requiredInt(recipe, "model.hidden_size", "128");
  c.num_heads = requiredInt(recipe, "model.num_attention_heads", "4");
  c.ffn_hidden_size = recipe.getInt("model.ffn_hidden_size");
  c.seq_length = data.seq_length;
  const int64_t vocab = recipe.getInt("model.vocab_size");
  std::unique_ptr<TokenCorpus> corpus;
  if (files) {
    TokenCorpusOptions o;
    o.path = recipe.getStringList("data.path");
    o.split = recipe.getString("data.split");
    o.seq_length = c.seq_length;
    o.seed = static_cast<uint32_t>(recipe.getInt("train.seed"));
    o.train_samples = recipe.getInt("train.steps") * recipe.getInt("train.global_batch_size");
    o.validation_samples = recipe.getInt("data.eval_size");
    try {
      corpus = std::make_unique<TokenCorpus>(o);
    } catch (const ConfigError& e) {
      const std::string text = e.what();
      recipe.fail("data.path", text.rfind("data.path: ", 0) == 0 ? text.substr(11) : text);
    }
    c.vocab_size = vocab != 0 ? vocab : corpus->metadataVocab();
    if (c.vocab_size == 0) {
      recipe.fail("model.vocab_size", "not set, and the data set has no metadata that says it (PREFIX.json, which "
                                      "ptrain data prepare writes); set it to the tokenizer's vocabulary size");
    }
    if (corpus->metadataVocab() > c.vocab_size) {
      recipe.fail("model.vocab_size", std::to_string(c.vocab_size) + " is smaller than the data set's vocabulary (" +
                                          std::to_string(corpus->metadataVocab()) + "); use 0 (from the data) or >= " +
                                          std::to_string(corpus->metadataVocab()));
    }
    c.valid_vocab = c.vocab_size;
  }
  if (!files && vocab != 0 && vocab < ArithmeticTokenizer::kVocabSize) {
    recipe.fail("model.vocab_size", std::to_string(vocab) + " is smaller than the arithmetic vocabulary (" +
                                        std::to_string(ArithmeticTokenizer::kVocabSize) + " tokens); use 0 (from the data) or >= " +
                                        std::to_string(ArithmeticTokenizer::kVocabSize));
  }
  if (!files) {
    c.vocab_size = vocab == 0 ? ArithmeticTokenizer::kVocabSize : vocab;
    c.valid_vocab = ArithmeticTokenizer::kVocabSize;  // ids beyond the data's are never predicted
  }
  c.make_vocab_size_divisible_by = recipe.getInt("model.make_vocab_size_divisible_by");
  // The padded vocabulary splits by rows across tensor-parallel ranks.
  const int64_t tp = recipe.getInt("parallel.tensor_model_parallel_size");
  if (c.paddedVocab() % tp != 0) {
    recipe.fail("model.make_vocab_size_divisible_by",
                "the padded vocabulary of " + std::to_string(c.paddedVocab()) + " (vocab_size " +
                    std::to_string(c.vocab_size) + " rounded up to a multiple of " +
                    std::to_string(c.make_vocab_size_divisible_by) +
                    ") is not divisible by parallel.tensor_model_parallel_size=" + std::to_string(tp) +
                    "; use a multiple of " + std::to_string(tp));
  }
  // A derived seq_length is not seen by the layout checks: check the split here.
  if (recipe.getBool("parallel.sequence_parallel") && tp > 1 && c.seq_length % tp != 0) {
    recipe.fail("model.seq_length", std::to_string(c.seq_length) + (recipe.has("model.seq_length") ? "" : " (derived)") +
                                        " is not divisible by parallel.tensor_model_parallel_size=" + std::to_string(tp) +
                                        ", which sequence_parallel needs; set model.seq_length to " +
                                        std::to_string((c.seq_length + tp - 1) / tp * tp));
  }
  c.dropout = recipe.getFloat("model.dropout");
  c.init_std = recipe.getFloat("model.init_std");
  c.tie_embeddings = recipe.getBool("model.tie_embeddings");
  // The precision plugin owns the dtypes; the loss's precision is the model's.
  // precision/fp16's key (PrecisionSettings reads it when that plugin is in use).
  c.fp16_lm_cross_entropy = PrecisionSettings::fromRecipe(recipe).fp16_lm_cross_entropy;
  c.fusion.masked_softmax = recipe.getBool("fusion.masked_softmax");
  c.fusion.bias_gelu = recipe.getBool("fusion.bias_gelu");
  c.fusion.layernorm = recipe.getBool("fusion.layernorm");
  c.fusion.bias_dropout_add = recipe.getBool("fusion.bias_dropout_add");
  c.recompute_attention_core = recipe.getString("model.recompute") == "selective";
  const MoeSettings moe = MoeSettings::fromRecipe(recipe);
  c.num_experts = moe.num_experts;
  c.moe_layer_freq = moe.layer_freq;
  c.moe = moe.routing;
  if (c.num_heads < 1 || c.hidden_size % c.num_heads != 0) {
    recipe.fail("model.hidden_size", std::to_string(c.hidden_size) + " is not a multiple of model.num_attention_heads=" +
                                         std::to_string(c.num_heads) + "; use e.g. " +
                                         std::to_string(c.num_heads * std::max<int64_t>(1, c.hidden_size / c.num_heads)));
  }
  // Only a fully valid recipe replaces what an earlier setup() prepared.
  // The arithmetic set stays built for every source (its accessors serve
  // the GRPO trainer's options), long enough for its own problems.
  if (files || prompts) data.seq_length = std::max(data.seq_length, ArithmeticDataset::minSeqLength(data.operations, data.digits));
  dataset_.emplace(data);
  corpus_ = std::move(corpus);
  prompts_ = std::move(promptSet);
  validation_prompts_ = std::move(validationSet);
  derived_sizes_ = std::move(derived);
  shuffle_prompts_ = recipe.getBool("data.shuffle");
  seed_ = static_cast<uint64_t>(recipe.getInt("train.seed"));
  config_ = c;
}

std::shared_ptr<GptModel> LlmTrainer::makeModel(const ModelBuild& build) {
  PTRAIN_CHECK(dataset_.has_value(), "llm trainer: buildModel() before setup()");
  return std::make_shared<GptModel>(config_, build);
}

Batch LlmTrainer::globalBatch(int64_t step, int64_t globalBatchSize) {
  PTRAIN_CHECK(dataset_.has_value(), "llm trainer: globalBatch() before setup()");
  if (corpus_) return corpus_->trainRows(step * globalBatchSize, globalBatchSize, config_.vocab_size);
  if (prompts_) return batchRows(step, globalBatchSize, 0, globalBatchSize);
  return dataset_->trainBatch(step, globalBatchSize);
}

Batch LlmTrainer::batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) {
  PTRAIN_CHECK(dataset_.has_value(), "llm trainer: batchRows() before setup()");
  if (corpus_) return corpus_->trainRows(step * globalBatchSize + begin, end - begin, config_.vocab_size);
  if (prompts_) {
    std::vector<PromptAnswer> rows;
    for (int64_t r = begin; r < end; ++r) rows.push_back(trainPrompt(step * globalBatchSize + r));
    return promptBatch(rows, config_.seq_length);
  }
  return dataset_->trainRows(step, begin, end);
}

const PromptAnswer& LlmTrainer::trainPrompt(int64_t index) const {
  PTRAIN_CHECK(prompts_ != nullptr, "llm trainer: trainPrompt() without data.name: prompts");
  return prompts_->at(promptOrder(index, prompts_->size(), shuffle_prompts_, seed_));
}

std::vector<PromptAnswer> LlmTrainer::evalItems() const {
  if (prompts_) return validation_prompts_ ? validation_prompts_->items() : std::vector<PromptAnswer>{};
  std::vector<PromptAnswer> out;
  for (const auto& p : dataset_->evalProblems()) out.push_back({p.prompt(), p.answer()});
  return out;
}

nlohmann::json LlmTrainer::dataPosition(int64_t step, int64_t globalBatchSize) const {
  if (corpus_) return corpus_->position(step * globalBatchSize);
  if (prompts_) {
    return nlohmann::json{{"source", "prompts"},
                          {"files", {prompts_->stamp()}},
                          {"shuffle", shuffle_prompts_},
                          {"seed", seed_},
                          {"consumed_samples", step * globalBatchSize}};
  }
  return nullptr;
}

std::optional<std::string> LlmTrainer::checkDataPosition(const nlohmann::json& saved, int64_t step,
                                                         int64_t globalBatchSize) const {
  if (prompts_) {
    const nlohmann::json now = dataPosition(step, globalBatchSize);
    if (!saved.is_object() || saved.value("source", "") != "prompts") {
      return std::string("the checkpoint's run read another data set (data.name changed)");
    }
    if (saved.value("files", nlohmann::json()) != now.at("files")) {
      return std::string("the problems file changed since the checkpoint (its size or time differs): resuming would "
                         "not continue the same order; restore it, or start a new run with checkpoint.load");
    }
    for (const char* key : {"shuffle", "seed"}) {
      if (saved.value(key, nlohmann::json()) != now.at(key)) {
        return std::string("the order of the problems changed since the checkpoint (data.") + key + " or train.seed)";
      }
    }
    return std::nullopt;
  }
  if (!corpus_) {
    if (!saved.is_null()) return std::string("the checkpoint's run read files (data.name: megatron), this one the "
                                             "built-in arithmetic problems");
    return std::nullopt;
  }
  return corpus_->differs(saved);
}

double LlmTrainer::lossCount(const Batch& batch) const { return batch.at("loss_mask").sum().item<double>(); }

double LlmTrainer::tokensIn(const Batch& batch) const { return static_cast<double>(batch.at("tokens").numel()); }

double LlmTrainer::trainFlops(double tokens) const {
  const double h = static_cast<double>(config_.hidden_size);
  const double f = static_cast<double>(config_.ffnSize());
  const double layers = static_cast<double>(config_.num_layers);
  // Model FLOPs: the LM head over vocab_size, not the padded rows, which are
  // overhead of the layout (as recomputation would be).
  const double matmulParams = layers * (4 * h * h + 2 * h * f) + static_cast<double>(config_.vocab_size) * h;
  const double attention = 12 * layers * h * static_cast<double>(config_.seq_length);
  return tokens * (6 * matmulParams + attention);
}

std::optional<plan::ModelShape> LlmTrainer::modelShape() const {
  plan::ModelShape m;
  m.name = config_.num_experts > 0 ? "GPT-MoE" : "GPT";
  m.num_layers = config_.num_layers;
  m.hidden = config_.hidden_size;
  m.heads = config_.num_heads;
  m.ffn = config_.ffnSize();
  m.seq = config_.seq_length;
  m.vocab = config_.paddedVocab();
  m.tied_embeddings = config_.tie_embeddings;
  m.num_experts = config_.num_experts;
  m.topk = config_.moe.topk;
  m.moe_layer_freq = config_.moe_layer_freq;
  return m;
}

std::unique_ptr<WeightsSource> LlmTrainer::openForeignWeights(const std::string& path) const {
  if (!isHuggingFaceFolder(path)) return nullptr;
  return openHfGpt2(path, config_);
}

void LlmTrainer::exportWeights(const std::string& format, WeightsSource& weights, const std::string& outDir) const {
  if (format != "hf") Trainer::exportWeights(format, weights, outDir);
  exportHfGpt2(config_, weights, outDir);
}

std::map<std::string, double> LlmTrainer::evaluateModel(GptModel& gpt, const EvalContext& ctx) {
  PTRAIN_CHECK(dataset_.has_value(), "llm trainer: evaluate() before setup()");
  PTRAIN_CHECK(ctx.num_shards >= 1 && ctx.shard >= 0 && ctx.shard < ctx.num_shards, "llm trainer: eval shard ",
               ctx.shard, " of ", ctx.num_shards);
  torch::NoGradGuard noGrad;
  if (corpus_) return evaluateCorpus(gpt, ctx);

  const std::vector<PromptAnswer> all = evalItems();
  const size_t n = all.size();
  if (n == 0) return {};  // prompts without data.validation_path: the same on every rank
  const size_t begin = n * static_cast<size_t>(ctx.shard) / static_cast<size_t>(ctx.num_shards);
  const size_t end = n * static_cast<size_t>(ctx.shard + 1) / static_cast<size_t>(ctx.num_shards);
  // Enough for the longest answer and its EOS; decoding stops there even if
  // the model babbles on.
  const int64_t maxNew =
      validation_prompts_ ? validation_prompts_->longestAnswerTokens()
                          : ArithmeticDataset::maxProblemTokens(dataset_->options().operations, dataset_->options().digits);

  // Under expert parallelism every rank must run as many forward passes as
  // the others (they exchange tokens): a rank out of problems evaluates the
  // first problem again, uncounted, until every shard is done.
  int64_t chunks = static_cast<int64_t>((end - begin + kEvalChunk - 1) / kEvalChunk);
  if (gpt.forward_sync) {
    at::Tensor most = torch::full({1}, static_cast<double>(chunks), torch::TensorOptions(torch::kFloat64).device(ctx.device));
    AllreduceOptions opts;
    opts.op = ReduceOp::kMax;
    gpt.forward_sync->allreduce(most, opts)->wait();
    chunks = static_cast<int64_t>(most.item<double>());
  }

  double correct = 0, lossSum = 0, lossCount = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t chunk = begin + static_cast<size_t>(c) * kEvalChunk;
    if (chunk >= end) {
      LossOutput ignored = gpt.forward(promptBatch({all.at(0)}, config_.seq_length).to(ctx.device));
      gpt.greedyDecode({ArithmeticTokenizer::encode(all.at(0).prompt)}, maxNew, ArithmeticTokenizer::kEos,
                       ArithmeticTokenizer::kPad);
      continue;
    }
    const size_t stop = std::min(end, chunk + kEvalChunk);
    std::vector<PromptAnswer> problems(all.begin() + chunk, all.begin() + stop);

    LossOutput loss = gpt.forward(promptBatch(problems, config_.seq_length).to(ctx.device));
    lossSum += loss.loss_sum.item<double>();
    lossCount += loss.count;

    std::vector<std::vector<int64_t>> prompts;
    prompts.reserve(problems.size());
    for (const auto& p : problems) prompts.push_back(ArithmeticTokenizer::encode(p.prompt));
    auto generated = gpt.greedyDecode(prompts, maxNew, ArithmeticTokenizer::kEos, ArithmeticTokenizer::kPad);
    for (size_t i = 0; i < problems.size(); ++i) {
      // Exactly the answer, then EOS: an answer that runs on does not count.
      std::vector<int64_t> expected = ArithmeticTokenizer::encode(problems[i].answer);
      expected.push_back(ArithmeticTokenizer::kEos);
      if (generated[i] == expected) correct += 1;
    }
  }

  at::Tensor sums = torch::tensor({correct, static_cast<double>(end - begin), lossSum, lossCount},
                                  torch::TensorOptions(torch::kFloat64).device(ctx.device));
  if (ctx.all_reduce_sum) ctx.all_reduce_sum(sums);
  sums = sums.cpu();
  const double total = sums[1].item<double>();
  const double count = sums[3].item<double>();
  std::map<std::string, double> out;
  if (total > 0) out["eval_exact_match"] = sums[0].item<double>() / total;
  if (count > 0) out["eval_loss"] = sums[2].item<double>() / count;
  return out;
}

std::map<std::string, double> LlmTrainer::evaluateCorpus(GptModel& gpt, const EvalContext& ctx) {
  const int64_t n = corpus_->validationSamples();
  const int64_t begin = n * ctx.shard / ctx.num_shards, end = n * (ctx.shard + 1) / ctx.num_shards;
  const int64_t chunk = static_cast<int64_t>(kEvalChunk) / 8;
  int64_t chunks = (end - begin + chunk - 1) / chunk;
  // Expert parallelism: every rank runs as many forward passes.
  if (gpt.forward_sync) {
    at::Tensor most = torch::full({1}, static_cast<double>(chunks), torch::TensorOptions(torch::kFloat64).device(ctx.device));
    AllreduceOptions opts;
    opts.op = ReduceOp::kMax;
    gpt.forward_sync->allreduce(most, opts)->wait();
    chunks = static_cast<int64_t>(most.item<double>());
  }
  double lossSum = 0, lossCount = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t first = begin + k * chunk;
    if (first >= end) {
      if (n > 0) gpt.forward(corpus_->validationRows(0, 1, config_.vocab_size).to(ctx.device));
      continue;
    }
    LossOutput loss =
        gpt.forward(corpus_->validationRows(first, std::min(end, first + chunk) - first, config_.vocab_size).to(ctx.device));
    lossSum += loss.loss_sum.item<double>();
    lossCount += loss.count;
  }
  at::Tensor sums = torch::tensor({lossSum, lossCount}, torch::TensorOptions(torch::kFloat64).device(ctx.device));
  if (ctx.all_reduce_sum) ctx.all_reduce_sum(sums);
  sums = sums.cpu();
  std::map<std::string, double> out;
  if (sums[1].item<double>() > 0) out["eval_loss"] = sums[0].item<double>() / sums[1].item<double>();
  return out;
}

}  // namespace ptrain::llm
