// The GPT model of the llm trainer against hand-computed sizes and losses, a
// per-head attention written out here from the documented qkv layout, and a
// short training run; the trainer's keys, batches, FLOPs and evaluation.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "../../trainers/llm/gpt_model.h"
#include "../../trainers/llm/llm_trainer.h"
#include "ptrain/datasets/arithmetic.h"
#include "ptrain/engine/tensor_parallel.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"

using ptrain::Batch;
using ptrain::ConfigError;
using ptrain::Recipe;
using ptrain::Schema;
using ptrain::datasets::ArithmeticTokenizer;
using ptrain::llm::GptConfig;
using ptrain::llm::GptModel;
using ptrain::llm::LlmTrainer;

namespace {

GptConfig smallConfig() {
  GptConfig c;
  c.vocab_size = 16;
  c.seq_length = 12;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_heads = 4;
  return c;
}

std::map<std::string, at::Tensor> params(GptModel& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.module().named_parameters()) out.emplace(p.key(), p.value());
  return out;
}

Batch tokensBatch(const at::Tensor& tokens) {
  Batch b;
  b.tensors.emplace("tokens", tokens);
  return b;
}

at::Tensor causalMask(int64_t n) {
  return torch::full({n, n}, -std::numeric_limits<float>::infinity()).triu(1);
}

// Recipe for the trainer: core keys plus its own, validated.
Recipe trainerRecipe(LlmTrainer& trainer, const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Schema schema;
  ptrain::describeCoreKeys(schema);
  trainer.describeKeys(schema);
  Recipe recipe = Recipe::fromString(yaml, "<test>", overrides);
  recipe.validate(schema);
  return recipe;
}

const char* kTinyRecipe = R"(trainer:
  name: llm
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
data:
  digits: 1
train:
  steps: 200
  global_batch_size: 64
)";

std::string setupError(const std::vector<std::string>& overrides) {
  LlmTrainer trainer(ptrain::PluginContext{});
  try {
    Recipe recipe = trainerRecipe(trainer, kTinyRecipe, overrides);
    trainer.setup(recipe);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GptModel, ShapesAndStages) {
  torch::manual_seed(0);
  GptModel m(smallConfig());
  EXPECT_EQ(m.numBlocks(), 2);
  EXPECT_EQ(m.blockPrefix(1), "blocks.1.");
  EXPECT_EQ(m.embedPrefixes(), std::vector<std::string>{"embed."});
  EXPECT_EQ(m.headPrefixes(), std::vector<std::string>{"head."});
  at::Tensor tokens = torch::randint(0, 16, {3, 10}, torch::kInt64);
  at::Tensor h = m.embed(tokensBatch(tokens));
  EXPECT_EQ(h.sizes(), (std::vector<int64_t>{3, 10, 32}));
  EXPECT_EQ(m.runBlock(0, h).sizes(), h.sizes());
  EXPECT_EQ(m.logits(tokens).sizes(), (std::vector<int64_t>{3, 10, 16}));
  // Longer than seq_length: refused, not silently wrong.
  EXPECT_THROW(m.embed(tokensBatch(torch::zeros({1, 13}, torch::kInt64))), ptrain::InternalError);
}

TEST(GptModel, ParameterNamesAndClosedFormCount) {
  // h = 32, ffn = 4h = 128, V = 16, T = 12, 2 layers. Per block:
  //   ln1 2h (64) + qkv 3h*h + 3h (3168) + proj h*h + h (1056) + ln2 2h (64)
  //   + fc1 h*f + f (4224) + fc2 f*h + h (4128) = 12704
  // embed: V*h + T*h = 512 + 384 = 896; ln_f 2h = 64.
  // Tied: 2 * 12704 + 896 + 64 = 26368; untied adds head.lm V*h = 512.
  torch::manual_seed(0);
  GptModel tied(smallConfig());
  EXPECT_EQ(tied.numParameters(), 26368);
  int64_t counted = 0;
  auto p = params(tied);
  for (const auto& [name, t] : p) counted += t.numel();
  EXPECT_EQ(counted, 26368);
  for (const char* name :
       {"embed.tokens.weight", "embed.positions.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
        "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias",
        "blocks.1.ln2.weight", "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.bias", "head.ln_f.weight", "head.ln_f.bias"}) {
    EXPECT_EQ(p.count(name), 1u) << name;
  }
  EXPECT_EQ(p.count("head.lm.weight"), 0u);
  EXPECT_EQ(p.at("blocks.0.attn.qkv.weight").sizes(), (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(p.at("blocks.0.mlp.fc2.weight").sizes(), (std::vector<int64_t>{32, 128}));

  GptConfig c = smallConfig();
  c.tie_embeddings = false;
  GptModel untied(c);
  EXPECT_EQ(untied.numParameters(), 26368 + 512);
  auto q = params(untied);
  ASSERT_EQ(q.count("head.lm.weight"), 1u);
  EXPECT_EQ(q.at("head.lm.weight").sizes(), (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(q.count("head.lm.bias"), 0u);
}

TEST(GptModel, InitialisationFollowsGpt2) {
  GptConfig c = smallConfig();
  c.hidden_size = 128;
  c.seq_length = 32;
  c.init_std = 0.02;
  torch::manual_seed(1);
  GptModel m(c);
  auto p = params(m);
  auto stdOf = [&](const char* name) { return p.at(name).std().item<double>(); };
  // Weights N(0, 0.02); residual outputs N(0, 0.02 / sqrt(2 * 2)) = 0.01.
  EXPECT_NEAR(stdOf("blocks.0.attn.qkv.weight"), 0.02, 0.001);
  EXPECT_NEAR(stdOf("blocks.1.mlp.fc1.weight"), 0.02, 0.001);
  EXPECT_NEAR(stdOf("embed.tokens.weight"), 0.02, 0.003);
  EXPECT_NEAR(stdOf("embed.positions.weight"), 0.02, 0.001);
  EXPECT_NEAR(stdOf("blocks.0.attn.proj.weight"), 0.01, 0.0005);
  EXPECT_NEAR(stdOf("blocks.1.mlp.fc2.weight"), 0.01, 0.0005);
  EXPECT_TRUE(torch::equal(p.at("blocks.0.attn.qkv.bias"), torch::zeros({384})));
  EXPECT_TRUE(torch::equal(p.at("blocks.1.ln2.weight"), torch::ones({128})));
  EXPECT_TRUE(torch::equal(p.at("head.ln_f.bias"), torch::zeros({128})));
}

TEST(GptModel, SameSeedSameWeights) {
  torch::manual_seed(11);
  GptModel a(smallConfig());
  torch::manual_seed(11);
  GptModel b(smallConfig());
  torch::manual_seed(12);
  GptModel c(smallConfig());
  auto pa = params(a), pb = params(b), pc = params(c);
  for (const auto& [name, t] : pa) EXPECT_TRUE(torch::equal(t, pb.at(name))) << name;
  EXPECT_FALSE(torch::equal(pa.at("blocks.0.attn.qkv.weight"), pc.at("blocks.0.attn.qkv.weight")));
}

TEST(GptModel, FutureTokensDoNotChangeEarlierLogits) {
  torch::manual_seed(2);
  GptModel m(smallConfig());
  m.module().eval();
  torch::NoGradGuard noGrad;
  at::Tensor tokens = torch::randint(0, 16, {2, 12}, torch::kInt64);
  at::Tensor changed = tokens.clone();
  changed[0][6] = (tokens[0][6].item<int64_t>() + 5) % 16;
  at::Tensor a = m.logits(tokens), b = m.logits(changed);
  EXPECT_TRUE(torch::allclose(a[0].narrow(0, 0, 6), b[0].narrow(0, 0, 6), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(a[0].narrow(0, 6, 6), b[0].narrow(0, 6, 6), 0, 1e-6));
  EXPECT_TRUE(torch::allclose(a[1], b[1], 0, 1e-6));
  // A shorter input gives the same logits for the positions it has.
  EXPECT_TRUE(torch::allclose(m.logits(tokens.narrow(1, 0, 7)), a.narrow(1, 0, 7), 1e-5, 1e-6));
}

TEST(GptModel, KvCacheDecodingEqualsTheWholePrefixsLogits) {
  torch::manual_seed(3);
  GptModel m(smallConfig());
  m.module().eval();
  torch::NoGradGuard noGrad;
  // Three rows whose prompts are 3, 5 and 4 tokens long, each followed by
  // its own continuation up to 11 tokens.
  const at::Tensor full = torch::randint(0, 16, {3, 11}, torch::kInt64);
  const at::Tensor reference = m.logits(full);  // each row's whole prefix, no cache
  const std::vector<int64_t> promptLength = {3, 5, 4};
  // A batched prefill of the prompts padded to 5 (row 0's tokens 3-4 and row
  // 2's token 4 are padding the later steps overwrite).
  at::Tensor prompts = full.narrow(1, 0, 5).clone();
  prompts[0][3] = 0;
  prompts[0][4] = 0;
  prompts[2][4] = 0;
  ptrain::llm::KvCache cache;
  const at::Tensor prefill = m.decodeLogits(prompts, torch::zeros({3}, torch::kInt64), cache);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < promptLength[static_cast<size_t>(r)]; ++i) {
      EXPECT_TRUE(torch::allclose(prefill[r][i], reference[r][i], 1e-5, 1e-5)) << "row " << r << " position " << i;
    }
  }
  // Then one token per row and step, each at its row's next position.
  std::vector<int64_t> next = promptLength;
  for (int step = 0; step < 6; ++step) {
    at::Tensor tokens = torch::empty({3, 1}, torch::kInt64);
    for (int64_t r = 0; r < 3; ++r) tokens[r][0] = full[r][next[static_cast<size_t>(r)]];
    const at::Tensor logits = m.decodeLogits(tokens, torch::tensor(next, torch::kInt64), cache);
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t position = next[static_cast<size_t>(r)];
      EXPECT_TRUE(torch::allclose(logits[r][0], reference[r][position], 1e-5, 1e-5))
          << "step " << step << " row " << r << " position " << position;
    }
    for (auto& n : next) ++n;
  }
  // Past seq_length is refused.
  EXPECT_THROW(m.decodeLogits(torch::zeros({3, 2}, torch::kInt64), torch::full({3}, 11, torch::kInt64), cache),
               ptrain::InternalError);
}

TEST(GptModel, AttentionMatchesPerHeadReferenceOfTheDocumentedLayout) {
  GptConfig c = smallConfig();
  c.hidden_size = 16;
  c.num_heads = 4;  // head_dim 4
  torch::manual_seed(3);
  ptrain::llm::GptAttention attn(c);
  {
    torch::NoGradGuard noGrad;
    attn->qkv->bias.normal_(0, 0.5);
    attn->proj->bias.normal_(0, 0.5);
    attn->qkv->weight.normal_(0, 0.5);
  }
  const int64_t T = 5, d = 4;
  at::Tensor x = torch::randn({2, T, 16});
  at::Tensor got = attn->forward(x, causalMask(12));

  // Reference: rows [head * 3d, head * 3d + d) are q, then k, then v.
  torch::NoGradGuard noGrad;
  const at::Tensor W = attn->qkv->weight, bias = attn->qkv->bias;
  std::vector<at::Tensor> heads;
  for (int64_t head = 0; head < 4; ++head) {
    auto part = [&](int64_t which) {
      const int64_t row = head * 3 * d + which * d;
      return torch::matmul(x, W.narrow(0, row, d).t()) + bias.narrow(0, row, d);
    };
    at::Tensor q = part(0), k = part(1), v = part(2);  // [2, T, d]
    at::Tensor scores = torch::matmul(q, k.transpose(1, 2)) / std::sqrt(4.0);
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = i + 1; j < T; ++j) scores.select(1, i).select(1, j).fill_(-1e30);
    heads.push_back(torch::matmul(torch::softmax(scores, -1), v));
  }
  at::Tensor expected = torch::matmul(torch::cat(heads, -1), attn->proj->weight.t()) + attn->proj->bias;
  EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-5)) << (got - expected).abs().max();

  // Two column shards of qkv (heads 0-1 and 2-3) with the matching row shards
  // of proj sum to the full output: a tensor-parallel split gives whole heads.
  ptrain::llm::GptAttention half(c);
  at::Tensor sum = torch::zeros_like(got);
  for (int64_t shard = 0; shard < 2; ++shard) {
    half->qkv->weight.set_data(W.narrow(0, shard * 24, 24).clone());
    half->qkv->bias.set_data(bias.narrow(0, shard * 24, 24).clone());
    half->proj->weight.set_data(attn->proj->weight.narrow(1, shard * 8, 8).clone());
    half->proj->bias.set_data(torch::zeros({16}));
    sum += half->forward(x, causalMask(12));
  }
  sum += attn->proj->bias;
  EXPECT_TRUE(torch::allclose(sum, got, 1e-5, 1e-5)) << (sum - got).abs().max();
}

TEST(GptModel, LossIsMaskedCrossEntropySum) {
  torch::manual_seed(4);
  GptModel m(smallConfig());
  at::Tensor tokens = torch::randint(0, 16, {2, 6}, torch::kInt64);
  at::Tensor targets = torch::randint(0, 16, {2, 6}, torch::kInt64);
  at::Tensor mask = torch::tensor({{0.f, 0.f, 1.f, 1.f, 0.f, 0.f}, {0.f, 1.f, 1.f, 1.f, 1.f, 0.f}});
  Batch b;
  b.tensors = {{"tokens", tokens}, {"targets", targets}, {"loss_mask", mask}};
  ptrain::LossOutput out = m.forward(b);
  EXPECT_EQ(out.count, 6.0);

  torch::NoGradGuard noGrad;
  at::Tensor logp = torch::log_softmax(m.logits(tokens), -1);
  double expected = 0;
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t t = 0; t < 6; ++t)
      if (mask[r][t].item<float>() > 0) expected -= logp[r][t][targets[r][t].item<int64_t>()].item<double>();
  EXPECT_NEAR(out.loss_sum.item<double>(), expected, 1e-4);
}

TEST(GptModel, FreshModelLossIsLnVocab) {
  // Untied, the logits start as N(0, sqrt(h) * init_std = 0.16) noise
  // independent of the target, so the loss is ln 16 = 2.7726 plus about
  // var / 2 = 0.013. (Tied, each input token's own logit starts high, which
  // is not what this checks.) The targets are a few classes, so one model's
  // draw moves its loss by about 0.07: the mean over 16 initialisations.
  GptConfig c = smallConfig();
  c.hidden_size = 64;
  c.tie_embeddings = false;
  ptrain::datasets::ArithmeticOptions o;
  o.digits = 2;
  o.seq_length = 12;
  ptrain::datasets::ArithmeticDataset ds(o);
  const ptrain::Batch batch = ds.trainBatch(0, 64);
  double mean = 0;
  for (int seed = 0; seed < 16; ++seed) {
    torch::manual_seed(5 + seed);
    GptModel m(c);
    ptrain::LossOutput out = m.forward(batch);
    mean += out.loss_sum.item<double>() / out.count / 16;
  }
  EXPECT_NEAR(mean, 2.772588722 + 0.0128, 0.03);
}

TEST(GptModel, DropoutOnlyInTrainMode) {
  GptConfig c = smallConfig();
  c.dropout = 0.5;
  torch::manual_seed(6);
  GptModel m(c);
  at::Tensor tokens = torch::randint(0, 16, {2, 8}, torch::kInt64);
  m.module().train();
  EXPECT_FALSE(torch::equal(m.logits(tokens), m.logits(tokens)));
  m.module().eval();
  EXPECT_TRUE(torch::equal(m.logits(tokens), m.logits(tokens)));
}

TEST(GptModel, BatchedGreedyDecodeMatchesOnePromptAtATime) {
  torch::manual_seed(7);
  GptModel m(smallConfig());  // seq_length 12
  m.module().eval();
  std::vector<std::vector<int64_t>> prompts = {{3, 12, 4, 15}, {5, 6, 12, 7, 8, 15}, {9}, {2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};
  const int64_t eos = 1, maxNew = 5;
  auto batched = m.greedyDecode(prompts, maxNew, eos);
  ASSERT_EQ(batched.size(), prompts.size());
  torch::NoGradGuard noGrad;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> seq = prompts[i], expected;
    while (static_cast<int64_t>(expected.size()) < maxNew) {
      at::Tensor logits = m.logits(torch::tensor(seq, torch::kInt64).unsqueeze(0));
      const int64_t next = logits[0][static_cast<int64_t>(seq.size()) - 1].argmax().item<int64_t>();
      expected.push_back(next);
      if (next == eos || seq.size() == 12) break;  // stopped, or no position left for it
      seq.push_back(next);
    }
    EXPECT_EQ(batched[i], expected) << "prompt " << i;
  }
  // Prompt 3 has 10 tokens: 2 can be fed back, a third is predicted from position 11.
  EXPECT_LE(batched[3].size(), 3u);
}

TEST(GptModel, PaddedVocabularyEntriesNeverCount) {
  // vocab_size 18 pads the 16 real ids (e.g. to split over 3 ranks): the loss
  // is the cross-entropy over the first 16 logits, and decoding never emits 16 or 17.
  GptConfig c = smallConfig();
  c.vocab_size = 18;
  c.valid_vocab = 16;
  c.tie_embeddings = false;
  torch::manual_seed(9);
  GptModel m(c);
  {
    torch::NoGradGuard noGrad;
    auto p = params(m);
    // Make the padding rows win every argmax if they were allowed to.
    p.at("head.ln_f.bias").fill_(1.0);
    p.at("head.lm.weight").narrow(0, 16, 2).narrow(1, 0, 32).fill_(5.0);
  }
  at::Tensor tokens = torch::randint(0, 16, {2, 6}, torch::kInt64);
  at::Tensor targets = torch::randint(0, 16, {2, 6}, torch::kInt64);
  Batch b;
  b.tensors = {{"tokens", tokens}, {"targets", targets}, {"loss_mask", torch::ones({2, 6})}};
  ptrain::LossOutput out = m.forward(b);
  torch::NoGradGuard noGrad;
  at::Tensor all = m.logits(tokens);
  ASSERT_EQ(all.size(-1), 18);
  EXPECT_TRUE((all.argmax(-1) >= 16).all().item<bool>());  // the padding does dominate
  at::Tensor logp = torch::log_softmax(all.narrow(-1, 0, 16), -1);
  const double expected = -logp.gather(-1, targets.unsqueeze(-1)).sum().item<double>();
  EXPECT_NEAR(out.loss_sum.item<double>(), expected, 1e-3);
  for (const auto& row : m.greedyDecode({{3, 12, 4, 15}, {5}}, 4, 1)) {
    for (int64_t id : row) EXPECT_LT(id, 16);
  }
}

TEST(GptModel, TensorParallelPlanNamesEveryParallelLayer) {
  GptConfig c = smallConfig();
  c.tie_embeddings = false;
  torch::manual_seed(10);
  GptModel m(c);
  ptrain::TensorParallelPlan plan = m.tensorParallelPlan();
  std::map<std::string, ptrain::nn::ParallelStyle> styles;
  for (const auto& [prefix, layer] : plan.layers) styles[prefix] = layer->parallelStyle();
  using ptrain::nn::ParallelStyle;
  const std::map<std::string, ParallelStyle> expected{
      {"embed.tokens.", ParallelStyle::kVocab},      {"head.lm.", ParallelStyle::kColumn},
      {"blocks.0.attn.qkv.", ParallelStyle::kColumn}, {"blocks.0.attn.proj.", ParallelStyle::kRow},
      {"blocks.0.mlp.fc1.", ParallelStyle::kColumn},  {"blocks.0.mlp.fc2.", ParallelStyle::kRow},
      {"blocks.1.attn.qkv.", ParallelStyle::kColumn}, {"blocks.1.attn.proj.", ParallelStyle::kRow},
      {"blocks.1.mlp.fc1.", ParallelStyle::kColumn},  {"blocks.1.mlp.fc2.", ParallelStyle::kRow}};
  EXPECT_EQ(styles, expected);
  // Every LayerNorm parameter, and nothing else, acts on sequence shards.
  std::set<std::string> partial(plan.sequence_parallel_params.begin(), plan.sequence_parallel_params.end());
  std::set<std::string> norms;
  for (const auto& [name, t] : params(m))
    if (name.find(".ln") != std::string::npos) norms.insert(name);
  EXPECT_EQ(partial, norms);
  EXPECT_EQ(norms.size(), 10u);  // 2 blocks x 2 norms x {weight, bias} + ln_f

  // Tied: no head.lm; the tied projection goes through embed.tokens.
  GptModel tied(smallConfig());
  for (const auto& [prefix, layer] : tied.tensorParallelPlan().layers) EXPECT_NE(prefix, "head.lm.");

  // A group of one changes nothing.
  at::Tensor tokens = torch::randint(0, 16, {2, 8}, torch::kInt64);
  at::Tensor before = m.logits(tokens).detach();
  auto one = std::make_shared<ptrain::nn::TensorParallelState>();
  EXPECT_TRUE(ptrain::nn::applyTensorParallel(m, one).empty());
  EXPECT_TRUE(torch::equal(m.logits(tokens), before));
}

TEST(GptModel, TensorParallelNeedsWholeHeads) {
  torch::manual_seed(11);
  GptModel m(smallConfig());  // 4 heads, seq_length 12
  auto three = std::make_shared<ptrain::nn::TensorParallelState>();
  three->size = 3;
  try {
    m.setTensorParallel(three);
    FAIL() << "3 ranks accepted for 4 heads";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "parallel.tensor_model_parallel_size: 3 does not divide model.num_attention_heads=4 (each rank needs "
              "whole heads); use a size that divides it");
  }
  GptConfig c = smallConfig();
  c.seq_length = 9;
  GptModel odd(c);
  auto two = std::make_shared<ptrain::nn::TensorParallelState>();
  two->size = 2;
  two->sequence_parallel = true;
  try {
    odd.setTensorParallel(two);
    FAIL() << "sequence of 9 split over 2 ranks";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.seq_length=9 is not divisible by parallel.tensor_model_parallel_size=2"),
              std::string::npos)
        << e.what();
  }
}

// ---- the trainer ----

// The model keys only this trainer reads are its own, with the types,
// defaults and ranges they had in the core schema.
TEST(LlmTrainer, DescribesTheModelKeysOnlyItReads) {
  Schema own;
  LlmTrainer(ptrain::PluginContext{}).describeKeys(own);
  struct Expect {
    const char* path;
    ptrain::ValueType type;
    const char* def;
    const char* range;
  };
  const std::vector<Expect> expected = {
      {"model.vocab_size", ptrain::ValueType::kInt, "0", ">= 0"},
      {"model.dropout", ptrain::ValueType::kFloat, "0.0", "in [0, 1)"},
      {"model.init_std", ptrain::ValueType::kFloat, "0.02", "> 0"},
      {"model.tie_embeddings", ptrain::ValueType::kBool, "true", ""},
      {"model.make_vocab_size_divisible_by", ptrain::ValueType::kInt, "128", ">= 1"},
      {"data.operations", ptrain::ValueType::kStringList, "[add]", ""},
      {"data.digits", ptrain::ValueType::kInt, "2", "in [1, 9]"},
      {"data.eval_size", ptrain::ValueType::kInt, "512", ">= 0"},
  };
  for (const auto& e : expected) {
    const ptrain::KeySpec* k = own.find(e.path);
    ASSERT_NE(k, nullptr) << e.path;
    EXPECT_EQ(k->type, e.type) << e.path;
    EXPECT_EQ(k->default_value, e.def) << e.path;
    EXPECT_EQ(Schema::rangeText(*k), e.range) << e.path;
    EXPECT_FALSE(k->doc.empty()) << e.path;
  }
  EXPECT_EQ(own.find("data.operations")->choices, (std::vector<std::string>{"add", "sub", "mul"}));
  // The GPT's shape, MoE, recomputation and fusion keys are the trainer's
  // too (the SDK's shared groups): the core has no model keys.
  for (const char* shared : {"model.num_layers", "model.hidden_size", "model.num_attention_heads", "model.seq_length",
                             "model.num_experts", "model.moe_router_topk", "fusion.bias_gelu"}) {
    EXPECT_NE(own.find(shared), nullptr) << shared;
  }
  EXPECT_EQ(own.find("model.recompute")->choices, (std::vector<std::string>{"none", "selective", "full"}));
}

TEST(LlmTrainer, KeysAndDerivedShapes) {
  LlmTrainer trainer(ptrain::PluginContext{});
  Recipe recipe = trainerRecipe(trainer, kTinyRecipe);
  EXPECT_EQ(recipe.getStringList("data.operations"), std::vector<std::string>{"add"});
  EXPECT_EQ(recipe.getInt("data.eval_size"), 512);
  trainer.setup(recipe);
  // Not set: the shortest that fits "9+9=18" + EOS (7 tokens) -> 6.
  EXPECT_EQ(trainer.modelConfig().seq_length, 6);
  EXPECT_EQ(trainer.modelConfig().vocab_size, 16);
  EXPECT_EQ(trainer.modelConfig().ffnSize(), 256);

  Batch b = trainer.globalBatch(3, 64);
  EXPECT_EQ(b.at("tokens").sizes(), (std::vector<int64_t>{64, 6}));
  EXPECT_DOUBLE_EQ(trainer.tokensIn(b), 384);
  // Answer + EOS per problem: 2 tokens for a one-digit sum, 3 for two digits.
  double expectedCount = 0;
  for (int64_t i = 0; i < 64; ++i) {
    auto p = trainer.dataset().trainProblem(3, i);
    expectedCount += (p.lhs + p.rhs >= 10 ? 3 : 2);
  }
  EXPECT_DOUBLE_EQ(trainer.lossCount(b), expectedCount);
  // matmul params 2 * (4 * 64^2 + 2 * 64 * 256) + 16 * 64 = 99328;
  // per token 6 * 99328 + 12 * 2 * 64 * 6 = 595968 + 9216 = 605184.
  EXPECT_DOUBLE_EQ(trainer.trainFlops(384), 605184.0 * 384);
}

TEST(LlmTrainer, MistakesNameTheKey) {
  EXPECT_NE(setupError({"model.seq_length=4"}).find("model.seq_length: 4 is too short for 1-digit add problems"),
            std::string::npos)
      << setupError({"model.seq_length=4"});
  // "999+999=1998" + EOS = 13 tokens -> seq_length 12.
  EXPECT_NE(setupError({"model.seq_length=8", "data.digits=3"}).find("use model.seq_length >= 12"), std::string::npos);
  const std::string digits = setupError({"data.digits=12"});
  EXPECT_NE(digits.find("data.digits"), std::string::npos) << digits;
  EXPECT_NE(digits.find("12"), std::string::npos) << digits;
  const std::string op = setupError({"data.operations=[add, div]"});
  EXPECT_NE(op.find("data.operations"), std::string::npos) << op;
  EXPECT_NE(op.find("div"), std::string::npos) << op;
  EXPECT_NE(setupError({"model.hidden_size=30"}).find("model.hidden_size: 30 is not a multiple of model.num_attention_heads=4"),
            std::string::npos)
      << setupError({"model.hidden_size=30"});
  EXPECT_NE(setupError({"model.vocab_size=8"}).find("model.vocab_size: 8 is smaller than the arithmetic vocabulary"),
            std::string::npos);
  EXPECT_NE(setupError({"model.num_layers="}).find("model.num_layers: not set"), std::string::npos)
      << setupError({"model.num_layers="});
  EXPECT_NE(setupError({"data.name=mnist"}).find("data.name: 'mnist' is not a dataset of the llm trainer"),
            std::string::npos);
  for (const auto& o : std::vector<std::string>{"model.seq_length=4", "data.digits=12", "model.hidden_size=30"}) {
    EXPECT_EQ(setupError({o}).find('\n'), std::string::npos) << o;
  }
}

TEST(LlmTrainer, EvaluationShardsAddUp) {
  LlmTrainer trainer(ptrain::PluginContext{});
  trainer.setup(trainerRecipe(trainer, kTinyRecipe, {"data.eval_size=10"}));
  torch::manual_seed(8);
  auto model = trainer.buildModel();
  model->module().eval();
  auto sumsOf = [&](int shard, int shards) {
    at::Tensor captured;
    ptrain::EvalContext ctx;
    ctx.shard = shard;
    ctx.num_shards = shards;
    ctx.all_reduce_sum = [&](at::Tensor& t) { captured = t.clone(); };
    trainer.evaluate(*model, ctx);
    return captured;
  };
  at::Tensor whole = sumsOf(0, 1);
  at::Tensor parts = sumsOf(0, 3) + sumsOf(1, 3) + sumsOf(2, 3);
  // Counts add up exactly; the loss sum up to float rounding of other batch shapes.
  EXPECT_EQ(whole[0].item<double>(), parts[0].item<double>());
  EXPECT_EQ(whole[1].item<double>(), 10.0);
  EXPECT_EQ(parts[1].item<double>(), 10.0);
  EXPECT_NEAR(whole[2].item<double>(), parts[2].item<double>(), 1e-4);
  EXPECT_EQ(whole[3].item<double>(), parts[3].item<double>());
  // A model from elsewhere is refused rather than cast blindly.
  GptModel stranger(trainer.modelConfig());
  EXPECT_THROW(trainer.evaluate(stranger, ptrain::EvalContext{}), ptrain::InternalError);
}

TEST(LlmTrainer, LearnsOneDigitAddition) {
  // About 200 AdamW steps of 64 problems (a few seconds on one core).
  LlmTrainer trainer(ptrain::PluginContext{});
  trainer.setup(trainerRecipe(trainer, kTinyRecipe, {"data.eval_size=200"}));
  torch::manual_seed(1234);
  auto staged = trainer.buildModel();
  auto& model = static_cast<GptModel&>(*staged);
  model.module().train();
  torch::optim::AdamW optimizer(model.module().parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  const int steps = 200, warmup = 20;
  for (int step = 0; step < steps; ++step) {
    const double lr = step < warmup ? 3e-3 * (step + 1) / warmup
                                    : 3e-3 * 0.5 * (1 + std::cos(M_PI * (step - warmup) / double(steps - warmup)));
    static_cast<torch::optim::AdamWOptions&>(optimizer.param_groups()[0].options()).lr(lr);
    Batch batch = trainer.globalBatch(step, 64);
    ptrain::LossOutput out = model.forward(batch);
    optimizer.zero_grad();
    (out.loss_sum / trainer.lossCount(batch)).backward();
    torch::nn::utils::clip_grad_norm_(model.module().parameters(), 1.0);
    optimizer.step();
  }

  // Exact match checked here with integer sums, independently of evaluate().
  model.module().eval();
  auto problems = trainer.dataset().evalProblems();
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : problems) prompts.push_back(ArithmeticTokenizer::encode(std::to_string(p.lhs) + "+" + std::to_string(p.rhs) + "="));
  auto generated = model.greedyDecode(prompts, 4, ArithmeticTokenizer::kEos);
  int correct = 0;
  for (size_t i = 0; i < problems.size(); ++i) {
    const bool stopped = !generated[i].empty() && generated[i].back() == ArithmeticTokenizer::kEos;
    correct += stopped && ArithmeticTokenizer::decode(generated[i]) == std::to_string(problems[i].lhs + problems[i].rhs);
  }
  const double exact = correct / static_cast<double>(problems.size());
  EXPECT_GE(exact, 0.9);

  ptrain::EvalContext ctx;
  auto metrics = trainer.evaluate(model, ctx);
  EXPECT_DOUBLE_EQ(metrics.at("eval_exact_match"), exact);
  EXPECT_LT(metrics.at("eval_loss"), 0.3);
}
