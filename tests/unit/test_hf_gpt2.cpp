// The GPT's Hugging Face GPT-2 interop (trainers/llm/hf_gpt2.h): export and
// import against transformers' own GPT2LMHeadModel (logits within 1e-5 on the
// same tokens, in the PyPI suite, where tools/install-deps.sh --pypi installs
// transformers), and, everywhere, the round trip through the HF layout and a
// rank's block read against the same rows of the whole tensor.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../../trainers/llm/gpt_model.h"
#include "../../trainers/llm/hf_gpt2.h"
#include "ptrain/engine/safetensors.h"
#include "ptrain/engine/weights_source.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using ptrain::llm::GptConfig;
using ptrain::llm::GptModel;
using ptrain::test::TempDir;

namespace {

GptConfig smallConfig() {
  GptConfig c;
  c.vocab_size = 50;
  c.valid_vocab = 50;
  c.make_vocab_size_divisible_by = 64;  // 14 padding rows, which GPT-2 does not have
  c.seq_length = 12;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_heads = 4;
  return c;
}

// Every parameter of `model` with its name, for a bare state dict.
std::vector<std::pair<std::string, at::Tensor>> stateDict(GptModel& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& p : model.module().named_parameters()) out.emplace_back(p.key(), p.value().detach());
  return out;
}

void loadInto(GptModel& model, ptrain::WeightsSource& weights) {
  torch::NoGradGuard noGrad;
  for (auto& p : model.module().named_parameters()) {
    at::Tensor t = p.value().detach();
    ASSERT_TRUE(weights.find(p.key()).has_value()) << p.key();
    weights.read(p.key(), ptrain::TensorBlock::whole(t.sizes().vec()), t);
  }
}

const std::vector<int64_t> kTokens = {3, 17, 42, 0, 49, 8, 8, 21, 30};

std::string tokenText() {
  std::string s;
  for (size_t i = 0; i < kTokens.size(); ++i) s += (i ? "," : "") + std::to_string(kTokens[i]);
  return s;
}

at::Tensor ourLogits(GptModel& model, int64_t vocab) {
  torch::NoGradGuard noGrad;
  model.module().eval();
  at::Tensor ids = torch::tensor(kTokens, torch::kInt64).unsqueeze(0);
  return model.logits(ids)[0].narrow(1, 0, vocab);
}

at::Tensor readLogits(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<at::Tensor> rows;
  for (const auto& row : j) rows.push_back(torch::tensor(row.get<std::vector<double>>(), torch::kFloat32));
  return torch::stack(rows);
}

std::string runScript(const std::vector<std::string>& args) {
  std::vector<std::string> command = {ptrain::test::testPython(), "-W", "ignore",
                                      ptrain::test::sourceDir() + "/tests/tools/hf_gpt2.py"};
  command.insert(command.end(), args.begin(), args.end());
  const auto result = ptrain::test::runProcess(command, {}, 300);
  return result.exit_code == 0 ? "" : result.output;
}

}  // namespace

// Ours -> HF layout -> ours gives every tensor back bit for bit, and a block
// of rows (a tensor-parallel rank's share of qkv, of the padded embedding)
// reads the same values as those rows of the whole.
TEST(HfGpt2, RoundTripAndBlocksAreExact) {
  TempDir dir;
  const GptConfig c = smallConfig();
  torch::manual_seed(7);
  GptModel source(c);
  const std::string bare = dir.path() + "/model.safetensors";
  ptrain::saveSafetensors(bare, stateDict(source));
  auto weights = ptrain::safetensorsWeights(bare);
  ptrain::llm::exportHfGpt2(c, *weights, dir.path() + "/hf");
  ASSERT_TRUE(ptrain::isHuggingFaceFolder(dir.path() + "/hf"));

  auto hf = ptrain::llm::openHfGpt2(dir.path() + "/hf", c);
  EXPECT_EQ(hf->names().size(), stateDict(source).size());
  torch::manual_seed(99);
  GptModel target(c);
  loadInto(target, *hf);
  for (auto& [name, t] : stateDict(source)) {
    at::Tensor back;
    for (auto& p : target.module().named_parameters())
      if (p.key() == name) back = p.value().detach();
    if (name == "embed.tokens.weight") {
      // GPT-2 keeps the 50 real rows; the padding reads back as zeros.
      EXPECT_TRUE(torch::equal(back.narrow(0, 0, 50), t.narrow(0, 0, 50)));
      EXPECT_EQ(back.narrow(0, 50, 14).abs().sum().item<double>(), 0.0);
    } else {
      EXPECT_TRUE(torch::equal(back, t)) << name;
    }
  }
  // Rows 40..88 of qkv (parts of heads 1 and 2, crossing q/k/v boundaries),
  // columns 5..20.
  ptrain::TensorBlock block;
  block.offsets = {40, 5};
  block.sizes = {48, 15};
  at::Tensor part = torch::empty({48, 15});
  hf->read("blocks.1.attn.qkv.weight", block, part);
  at::Tensor whole;
  for (auto& p : source.module().named_parameters())
    if (p.key() == "blocks.1.attn.qkv.weight") whole = p.value().detach();
  EXPECT_TRUE(torch::equal(part, whole.narrow(0, 40, 48).narrow(1, 5, 15)));
  // A flat range of a block (a distributed optimizer's piece).
  block.flat_begin = 7;
  block.flat_end = 300;
  at::Tensor flat = torch::empty({293});
  hf->read("blocks.1.attn.qkv.weight", block, flat);
  EXPECT_TRUE(torch::equal(flat, whole.narrow(0, 40, 48).narrow(1, 5, 15).reshape({-1}).slice(0, 7, 300)));
}

TEST(HfGpt2, ConfigThatDiffersIsRefusedNamingTheKey) {
  TempDir dir;
  GptConfig c = smallConfig();
  torch::manual_seed(7);
  GptModel source(c);
  ptrain::saveSafetensors(dir.path() + "/m.safetensors", stateDict(source));
  auto weights = ptrain::safetensorsWeights(dir.path() + "/m.safetensors");
  ptrain::llm::exportHfGpt2(c, *weights, dir.path() + "/hf");
  GptConfig other = c;
  other.hidden_size = 64;
  try {
    ptrain::llm::openHfGpt2(dir.path() + "/hf", other);
    FAIL() << "another hidden size was accepted";
  } catch (const ptrain::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: n_embd is 32, this model's model.hidden_size is 64; set "
                                         "model.hidden_size: 32"),
              std::string::npos)
        << e.what();
  }
  other = c;
  other.seq_length = 40;
  EXPECT_THROW(ptrain::llm::openHfGpt2(dir.path() + "/hf", other), ptrain::CheckpointError);
  other = c;
  other.num_experts = 4;
  EXPECT_THROW(ptrain::llm::exportHfGpt2(other, *weights, dir.path() + "/hf2"), ptrain::ConfigError);
}

// ptrain -> HF: transformers' GPT2LMHeadModel loads the export and computes
// our logits.
TEST(HfGpt2, TransformersLoadsTheExportWithOurLogits) {
  const std::string lacks = ptrain::test::pythonLacks({"transformers"});
  if (!lacks.empty()) GTEST_SKIP() << lacks;
  TempDir dir;
  const GptConfig c = smallConfig();
  torch::manual_seed(11);
  GptModel model(c);
  ptrain::saveSafetensors(dir.path() + "/m.safetensors", stateDict(model));
  auto weights = ptrain::safetensorsWeights(dir.path() + "/m.safetensors");
  ptrain::llm::exportHfGpt2(c, *weights, dir.path() + "/hf");
  const std::string failed = runScript({"logits", dir.path() + "/hf", tokenText(), dir.path() + "/logits.json"});
  ASSERT_EQ(failed, "");
  const at::Tensor theirs = readLogits(dir.path() + "/logits.json");
  const at::Tensor ours = ourLogits(model, c.vocab_size);
  ASSERT_EQ(theirs.sizes(), ours.sizes());
  EXPECT_LT((theirs - ours).abs().max().item<double>(), 1e-5);
}

// HF -> ptrain: a GPT-2 that transformers made and saved loads into our GPT,
// which then computes transformers' logits.
TEST(HfGpt2, AFolderTransformersSavedGivesItsLogits) {
  const std::string lacks = ptrain::test::pythonLacks({"transformers"});
  if (!lacks.empty()) GTEST_SKIP() << lacks;
  TempDir dir;
  GptConfig c = smallConfig();
  c.seq_length = 16;  // fewer positions than the folder's 20: the first 16 are read
  const std::string failed =
      runScript({"make", dir.path() + "/hf", "32", "2", "4", "50", "20", tokenText(), dir.path() + "/logits.json"});
  ASSERT_EQ(failed, "");
  auto hf = ptrain::llm::openHfGpt2(dir.path() + "/hf", c);
  torch::manual_seed(3);
  GptModel model(c);
  loadInto(model, *hf);
  const at::Tensor theirs = readLogits(dir.path() + "/logits.json");
  const at::Tensor ours = ourLogits(model, c.vocab_size);
  ASSERT_EQ(theirs.sizes(), ours.sizes());
  EXPECT_LT((theirs - ours).abs().max().item<double>(), 1e-5);
}
