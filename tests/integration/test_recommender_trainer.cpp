// The recommender trainer end to end through the ptrain binary: a short
// two-rank run on small click tables learns (validation AUC well above
// chance, below the ground truth's), the scaled model on tensor x pipeline x
// expert parallel layouts trains the one-rank model, keys that make no sense
// for it are refused in one line, and `ptrain check` of the 12B recipe passes
// and prints its parameters per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/datasets/clicks.h"
#include "support/test_support.h"

using ptrain::test::runPtrain;
using ptrain::test::TempDir;

namespace {

// The clicks tables shrunk 20-fold (at least 200 rows each), a 2-expert
// model: a few hundred steps learn the strongest terms of the ground truth.
const char* kLearnRecipe = R"(
name: recsys_learn
trainer: {name: recommender}
model: {embedding_dim: 8, bottom_mlp: [32], top_mlp: [32], attention_hidden: 16, hidden_size: 32,
        ffn_hidden_size: 32, num_experts: 2, moe_router_topk: 1, scale: 0.05, min_table_rows: 200,
        row_wise_threshold: 2000, embedding_lr: 0.1}
data: {name: clicks, eval_size: 4000}
train: {steps: 300, global_batch_size: 128, seed: 5, eval_every: 300, log_every: 50}
optimizer: {name: adamw, lr: 0.003, weight_decay: 0.0, lr_schedule: constant}
checkpoint: {every: 0}
)";

nlohmann::json lastEvaluation(const std::string& runDir) {
  nlohmann::json last;
  std::istringstream in(ptrain::test::readFile(runDir + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval_auc")) last = j;
  }
  return last;
}

std::map<int, double> lossesOf(const std::string& runDir) {
  std::map<int, double> out;
  for (const auto& [step, text] : ptrain::test::readTrainingSteps(runDir)) {
    out[step] = nlohmann::json::parse(text)["loss"].get<double>();
  }
  return out;
}

double relDiff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

}  // namespace

PTRAIN_LONG_TEST(RecommenderTrainer, TwoRankRunLearnsTheClicks) {
  TempDir tmp;
  const std::string recipe = tmp.write("learn.yaml", kLearnRecipe);
  const std::string dir = tmp.path() + "/dp2";
  auto r = runPtrain({"run", recipe, "--nproc", "2", "--run-dir", dir, "data.term_fit=true"}, {"OMP_NUM_THREADS=1"},
                     300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto losses = lossesOf(dir);
  ASSERT_EQ(losses.size(), 300u);
  const nlohmann::json eval = lastEvaluation(dir);
  ASSERT_FALSE(eval.is_null()) << r.output;
  for (const char* k : {"eval_auc", "eval_logloss", "best_auc", "best_logloss"}) {
    ASSERT_TRUE(eval.contains(k)) << k << " missing in " << eval.dump();
  }
  std::printf("after 300 steps: eval_auc %.4f (best %.4f)\n", eval["eval_auc"].get<double>(),
              eval["best_auc"].get<double>());
  EXPECT_GT(eval["eval_auc"].get<double>(), 0.6) << eval.dump();
  EXPECT_LT(eval["eval_auc"].get<double>(), eval["best_auc"].get<double>() + 0.01) << eval.dump();
  EXPECT_GT(eval["best_auc"].get<double>(), 0.7) << eval.dump();
  // The ground truth's line is printed beside the run, with what each term is worth.
  EXPECT_NE(r.output.find("ground truth on 4000 validation samples"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ground truth without each term (AUC): first order 0."), std::string::npos) << r.output;
  // Throughput in the trainer's unit: samples, not tokens.
  EXPECT_NE(r.output.find(" samples/s"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("tok/s"), std::string::npos) << r.output;
  // data.term_fit: a model that learned something carries part of the
  // ground truth's logit, the first-order term (the easiest) among it.
  for (const char* k : {"fit_first_order", "fit_pairwise", "fit_user_item", "fit_interest_category", "fit_dense",
                        "fit_dense_item", "fit_attention", "fit_r2"}) {
    ASSERT_TRUE(eval.contains(k)) << k << " missing in " << eval.dump();
  }
  std::printf("fit: first order %.3f, r2 %.3f\n", eval["fit_first_order"].get<double>(), eval["fit_r2"].get<double>());
  EXPECT_GT(eval["fit_r2"].get<double>(), 0.05) << eval.dump();
  EXPECT_LE(eval["fit_r2"].get<double>(), 1.0) << eval.dump();
  EXPECT_GT(eval["fit_first_order"].get<double>(), 0.05) << eval.dump();
}

namespace {

// The scaled 12B recipe's shape, tiny: 8 rows per micro-batch, which tp 2
// splits around the 4 experts; every step logged.
const char* kExactRecipe = R"(
name: recsys_exact
trainer: {name: recommender}
model: {embedding_dim: 8, bottom_mlp: [16], top_mlp: [16], attention_hidden: 8, hidden_size: 16,
        ffn_hidden_size: 16, num_experts: 4, moe_router_topk: 2, moe_aux_loss_coeff: 0.01, scale: 0.01,
        min_table_rows: 100, row_wise_threshold: 500, table_wise_slots: 4, row_multiple: 8, embedding_lr: 0.05}
data: {name: clicks, eval_size: 64}
train: {steps: 20, global_batch_size: 32, micro_batch_size: 8, seed: 11, eval_every: 0, log_every: 1}
optimizer: {name: adamw, lr: 0.003, weight_decay: 0.0, lr_schedule: constant}
checkpoint: {every: 0}
)";

// kExactRecipe run by `nproc` ranks into tmp/<name>: its losses by step.
std::map<int, double> trainExact(const TempDir& tmp, const std::string& name, const std::string& nproc,
                                 std::vector<std::string> extra) {
  std::vector<std::string> args{"run", tmp.path() + "/exact.yaml", "--nproc", nproc, "--run-dir",
                                tmp.path() + "/" + name};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = runPtrain(args, {"OMP_NUM_THREADS=1"}, 400);
  EXPECT_EQ(r.exit_code, 0) << name << ": " << r.output;
  return lossesOf(tmp.path() + "/" + name);
}

// Holds `losses` to the one-rank curve (1e-5 at step 1, 1e-4 over the run)
// and prints the differences.
void expectOneRankCurve(const std::map<int, double>& losses, const std::map<int, double>& one,
                        const std::string& name) {
  ASSERT_EQ(losses.size(), one.size()) << name;
  EXPECT_LT(relDiff(losses.at(1), one.at(1)), 1e-5) << name << " step 1";
  double worst = 0;
  for (const auto& [step, loss] : one) {
    EXPECT_LT(relDiff(losses.at(step), loss), 1e-4) << name << " step " << step;
    worst = std::max(worst, relDiff(losses.at(step), loss));
  }
  std::printf("%s: step 1 %.3g, worst over %zu steps %.3g (relative)\n", name.c_str(),
              relDiff(losses.at(1), one.at(1)), one.size(), worst);
}

}  // namespace

// Four data-parallel replicas; tables split over tp 2 and 4 (row-wise and table-wise), the stages cut as the seed
// cuts them (tables, bottom MLP and interaction | attention, experts, top
// MLP), experts over ep with the samples split over tp around them: the
// one-rank losses within 1e-5 at step 1 and 1e-4 over 20 steps.
PTRAIN_LONG_TEST(RecommenderTrainer, ParallelLayoutsTrainTheOneRankModel) {
  TempDir tmp;
  tmp.write("exact.yaml", kExactRecipe);
  const auto one = trainExact(tmp, "one", "1", {});
  ASSERT_EQ(one.size(), 20u);
  const std::map<std::string, std::map<int, double>> layouts{
      // Four data-parallel replicas: the tables' gradients summed by
      // exchanging the rows each replica touched (row_sparse_gradient).
      {"dp4", trainExact(tmp, "dp4", "4", {})},
      {"tp2_pp2_ep2", trainExact(tmp, "tp2_pp2_ep2", "8",
                                 {"parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2",
                                  "parallel.pipeline_layout=[0, 2]", "parallel.expert_model_parallel_size=2",
                                  "parallel.expert_tensor_parallel_size=1", "parallel.sequence_parallel=true"})},
      // The seed's layout.
      {"tp4_pp2_ep2", trainExact(tmp, "tp4_pp2_ep2", "8",
                                 {"parallel.tensor_model_parallel_size=4", "parallel.pipeline_model_parallel_size=2",
                                  "parallel.pipeline_layout=[0, 2]", "parallel.expert_model_parallel_size=2",
                                  "parallel.expert_tensor_parallel_size=1", "parallel.sequence_parallel=true"})},
  };
  // The dp 4 replicas sent rows, not tables: a step's traffic is below the
  // parameters' bytes, which an all-reduce of every gradient would send.
  const auto steps = ptrain::test::readTrainingSteps(tmp.path() + "/dp4");
  ASSERT_GE(steps.size(), 2u);
  const double paramBytes = nlohmann::json::parse(steps.at(1))["mem_params"].get<double>();
  const double sentBytes = nlohmann::json::parse(steps.at(2))["dp_comm_bytes"].get<double>();
  std::printf("dp4: %.0f bytes exchanged in step 2, parameters %.0f bytes\n", sentBytes, paramBytes);
  EXPECT_LT(sentBytes, 0.75 * paramBytes);
  for (const auto& [name, losses] : layouts) expectOneRankCurve(losses, one, name);
}

// Device groups (parallel.groups): group a holds the model in tp 2 x pp 2
// (tables split over tp, experts with the samples split over tp around
// them), group b in ep 2 over 2 data-parallel ranks (tables whole), half
// the batch each; the groups sum the tables' gradients by exchanging the
// rows each group touched. The one-rank losses within 1e-5 at step 1 and
// 1e-4 over 20 steps; the exchange sent rows, not tables.
PTRAIN_LONG_TEST(RecommenderTrainer, DeviceGroupsTrainTheOneRankModel) {
  TempDir tmp;
  tmp.write("exact.yaml", kExactRecipe);
  const auto one = trainExact(tmp, "one", "1", {});
  ASSERT_EQ(one.size(), 20u);
  const auto groups = trainExact(
      tmp, "groups", "6",
      {"parallel.sequence_parallel=true",
       "parallel.groups=[{name: a, ranks: 4, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2,"
       " expert_tensor_parallel_size: 1, share: 1}, {name: b, ranks: 2, expert_model_parallel_size: 2, share: 1}]"});
  expectOneRankCurve(groups, one, "groups (tp2 x pp2 | ep2 x dp2, 1:1)");
  // Rank 0 (group a, the tables' first stage) sent the rows its group
  // touched, far below its tables' bytes.
  const auto steps = ptrain::test::readTrainingSteps(tmp.path() + "/groups");
  ASSERT_GE(steps.size(), 2u);
  const auto step2 = nlohmann::json::parse(steps.at(2));
  ASSERT_TRUE(step2.contains("cross_group_bytes")) << steps.at(2);
  const double sent = step2["cross_group_bytes"].get<double>();
  const double params = nlohmann::json::parse(steps.at(1))["mem_params"].get<double>();  // logged at step 1
  std::printf("groups: rank 0 sent %.0f bytes across the groups in step 2, its parameters %.0f bytes\n", sent,
              params);
  EXPECT_GT(sent, 0);
  EXPECT_LT(sent, 0.75 * params);
}

// The recommender's own layout rules hold for each device group's layout,
// one line naming the group: its tp against the table-wise slots, and
// against the micro-batch the experts split.
TEST(RecommenderTrainer, CheckHoldsEachDeviceGroupToTheTablesAndExperts) {
  TempDir tmp;
  const std::string recipe = tmp.write("exact.yaml", kExactRecipe);
  auto check = [&](const std::string& nproc, std::vector<std::string> extra) {
    std::vector<std::string> args{"check", recipe, "--nproc", nproc, "launch.nproc=" + nproc,
                                  "parallel.sequence_parallel=true"};
    args.insert(args.end(), extra.begin(), extra.end());
    return runPtrain(args, {}, 120);
  };
  auto slots = check("10", {"parallel.groups=[{name: big, ranks: 8, tensor_model_parallel_size: 8,"
                            " expert_tensor_parallel_size: 1, share: 1}, {ranks: 2, share: 1}]"});
  EXPECT_EQ(slots.exit_code, 2) << slots.output;
  EXPECT_NE(slots.output.find("parallel.groups: entry 0 (big): embedding tables: parallel.tensor_model_parallel_size "
                              "8 does not divide table_wise_slots 4"),
            std::string::npos)
      << slots.output;
  auto experts = check("6", {"train.global_batch_size=48",
                             "parallel.groups=[{ranks: 4, tensor_model_parallel_size: 4, expert_tensor_parallel_size: 1,"
                             " micro_batch_size: 6, share: 1}, {ranks: 2, micro_batch_size: 4, share: 1}]"});
  EXPECT_EQ(experts.exit_code, 2) << experts.output;
  EXPECT_NE(experts.output.find("parallel.groups: entry 0 (group0): micro-batches of 6 samples, which "
                                "tensor_model_parallel_size=4 does not divide"),
            std::string::npos)
      << experts.output;
  auto ok = check("6", {"parallel.groups=[{ranks: 4, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 2,"
                        " expert_tensor_parallel_size: 1, share: 1}, {ranks: 2, expert_model_parallel_size: 2, share: 1}]"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  // The job's sequence parallelism serves group 0's tp; group 1 (tp 1) is not warned about it.
  EXPECT_EQ(ok.output.find("sequence_parallel has no effect"), std::string::npos) << ok.output;
}

TEST(RecommenderTrainer, RefusesKeysOfOtherTrainersInOneLine) {
  TempDir tmp;
  const std::string recipe = tmp.write("learn.yaml", kLearnRecipe);
  for (const std::string& bad : {std::string("model.num_attention_heads=4"), std::string("model.seq_length=16"),
                                 std::string("data.name=arithmetic")}) {
    auto r = runPtrain({"check", recipe, bad}, {}, 120);
    EXPECT_NE(r.exit_code, 0) << bad;
    const std::string key = bad.substr(0, bad.find('='));
    EXPECT_NE(r.output.find(key), std::string::npos) << r.output;
  }
  // The term fit needs an evaluation set it can fit on: one line, before any worker starts.
  auto fit = runPtrain({"check", recipe, "data.term_fit=true", "data.eval_size=50"}, {}, 120);
  EXPECT_EQ(fit.exit_code, 2) << fit.output;
  EXPECT_NE(fit.output.find("data.term_fit: needs data.eval_size >= 200"), std::string::npos) << fit.output;
  // Experts under tensor parallelism split each micro-batch over the tensor ranks.
  auto r = runPtrain({"check", recipe, "--nproc", "2", "parallel.tensor_model_parallel_size=2",
                      "parallel.sequence_parallel=true", "train.global_batch_size=9"},
                     {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("train.global_batch_size"), std::string::npos) << r.output;
  // The tables' sparse optimizer steps 2-d rows, which the distributed optimizer flattens.
  auto sharded = runPtrain({"check", recipe, "--nproc", "2", "optimizer.distributed=true"}, {}, 120);
  EXPECT_EQ(sharded.exit_code, 2) << sharded.output;
  EXPECT_NE(sharded.output.find("optimizer.distributed: the embedding tables' optimizer (model.embedding_optimizer: "
                                "rowwise_adagrad)"),
            std::string::npos)
      << sharded.output;
}

// recsys_small's data keys (26 tables of 1000 rows, Zipf 1.2, a hidden model
// of width 2) reach the data set: the ground truth the run prints is the one
// the data set gives for that world, built here in the test's own process,
// and not the default world's.
TEST(RecommenderTrainer, TheSmallRecipesDataKeysSetTheWorldItsGroundTruthIsFor) {
  ptrain::datasets::ClicksOptions world;
  world.table_sizes.assign(26, 1000);
  world.zipf_exponent = 1.2;
  world.hidden_dim = 2;
  world.validation_size = 2000;
  const std::string expected =
      ptrain::datasets::clicksBestScoresLine(ptrain::datasets::ClicksDataset(world).bestValidationScores());
  ptrain::datasets::ClicksOptions defaults;
  defaults.validation_size = 2000;
  const std::string defaultWorld =
      ptrain::datasets::clicksBestScoresLine(ptrain::datasets::ClicksDataset(defaults).bestValidationScores());
  ASSERT_NE(expected, defaultWorld);

  TempDir tmp;
  auto r = runPtrain({"run", std::string(PTRAIN_SOURCE_DIR) + "/configs/recommender/recsys_small.yaml", "--nproc",
                      "1", "--run-dir", tmp.path() + "/run", "train.steps=2", "train.eval_every=0",
                      "data.eval_size=2000"},
                     {"OMP_NUM_THREADS=1"}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
}

TEST(RecommenderTrainer, CheckOfThe12bRecipePrintsItsParametersPerRank) {
  auto r = runPtrain({"check", std::string(PTRAIN_SOURCE_DIR) + "/configs/recommender/recsys_12b_tp4_pp2_ep2.yaml"},
                     {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("OK"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layout: world=8 tp=4 pp=2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("recommender: 1.202e+10 parameters"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("first stage"), std::string::npos) << r.output;
}

// The clicks data set's reference learner from the command line: it runs on
// a small budget and prints its AUC beside the ground truth's; a bad argument
// gets one line and exit code 2.
TEST(ClicksReferenceTool, PrintsItsAucAndRefusesBadArgumentsInOneLine) {
  const std::string tool = ptrain::test::binaryDir() + "/bin/ptrain_clicks_reference";
  const auto run = ptrain::test::runProcess({tool, "--learn", "pairwise", "--scale", "0.002", "--min-rows", "50",
                                             "--samples", "2560", "--evaluations", "1", "--eval-size", "2000"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("samples      2560  auc 0."), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("ground truth auc 0."), std::string::npos) << run.output;

  const auto bad = ptrain::test::runProcess({tool, "--learn", "everything"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_EQ(bad.output.rfind("ptrain_clicks_reference: --learn expects pairwise, first_order+pairwise or all, got "
                             "'everything'\n",
                             0),
            0u)
      << bad.output;
  // The data world's flags: 26 tables of 50 rows, a hidden model of width 2.
  std::string sizes = "50";
  for (int t = 1; t < 26; ++t) sizes += ",50";
  const auto world = ptrain::test::runProcess({tool, "--table-sizes", sizes, "--zipf-exponent", "1.2", "--hidden-dim",
                                               "2", "--samples", "256", "--evaluations", "1", "--eval-size", "2000"});
  ASSERT_EQ(world.exit_code, 0) << world.output;
  EXPECT_NE(world.output.find("clicks reference: 1300 rows in 26 tables"), std::string::npos) << world.output;
  const auto twoTables = ptrain::test::runProcess({tool, "--table-sizes", "10,20"});
  EXPECT_EQ(twoTables.exit_code, 2) << twoTables.output;
  EXPECT_NE(twoTables.output.find("table_sizes has 2 entries"), std::string::npos) << twoTables.output;
  EXPECT_EQ(std::count(twoTables.output.begin(), twoTables.output.end(), '\n'), 1) << twoTables.output;
  const auto notANumber = ptrain::test::runProcess({tool, "--table-sizes", "10,x"});
  EXPECT_EQ(notANumber.exit_code, 2) << notANumber.output;
  EXPECT_NE(notANumber.output.find("--table-sizes expects a whole number below 4.6e18, got 'x'"), std::string::npos)
      << notANumber.output;
  const auto few = ptrain::test::runProcess({tool, "--samples", "10"});
  EXPECT_EQ(few.exit_code, 2) << few.output;
  EXPECT_NE(few.output.find("need at least one whole batch"), std::string::npos) << few.output;
}
