#include "grpo_trainer.h"

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checks.h"
#include "ptrain/comm/communicator.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/resources.h"
#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/layout/device_groups.h"
#include "ptrain/layout/validation.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain::grpo {

using datasets::ArithmeticOp;
using datasets::ArithmeticTokenizer;

namespace {

const std::string kActor = "actor_rollout_ref.actor.";
const std::string kRollout = "actor_rollout_ref.rollout.";
const std::string kRef = "actor_rollout_ref.ref.";

// The most tokens an answer of `operations` on `digits`-digit operands takes,
// with its EOS: a sum has up to digits + 1 digits, a difference a sign and
// `digits` digits, a product 2 * digits digits.
int64_t longestAnswerTokens(const std::vector<ArithmeticOp>& operations, int64_t digits) {
  int64_t most = 0;
  for (ArithmeticOp op : operations) most = std::max(most, op == ArithmeticOp::kMul ? 2 * digits : digits + 1);
  return most + 1;
}

std::string text(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) out += ArithmeticTokenizer::tokenText(id);
  return out;
}

}  // namespace

GrpoTrainer::GrpoTrainer(const PluginContext& context) : LlmTrainer(context), world_size_(context.world_size) {}

void GrpoTrainer::describeKeys(Schema& schema) const {
  LlmTrainer::describeKeys(schema);
  using T = ValueType;
  using keys::above;
  using keys::atLeast;
  using keys::atMost;
  using keys::key;
  using keys::oneOf;
  using keys::required;

  schema.add(atLeast(required("data.train_batch_size", T::kInt,
                              "Prompts per GRPO step (each brings actor_rollout_ref.rollout.n samples)."),
                     1));
  schema.add(atLeast(key("data.max_response_length", T::kInt, "0",
                         "Most tokens a sampled response takes; 0: the longest answer of data.operations and "
                         "data.digits with its EOS."),
                     0));
  schema.add(key("actor_rollout_ref.model.path", T::kString, "",
                 "Run folder whose newest checkpoint the actor and the reference start from (a finished llm run), "
                 "or runs/NAME for the newest run of recipe NAME; empty: fresh weights."));

  schema.add(atLeast(key(kActor + "ppo_mini_batch_size", T::kInt, "0",
                         "Prompts per actor update (each with its rollout.n samples); a step's batch is cut into "
                         "data.train_batch_size / ppo_mini_batch_size updates. 0: the whole batch."),
                     0));
  schema.add(atLeast(key(kActor + "ppo_micro_batch_size_per_gpu", T::kInt, "0",
                         "Samples per forward/backward pass on one data-parallel rank of the actor; 0: a rank's "
                         "whole share."),
                     0));
  schema.add(atLeast(key(kActor + "ppo_epochs", T::kInt, "1", "Passes of the actor update over a step's batch."), 1));
  schema.add(atLeast(key(kActor + "clip_ratio_low", T::kFloat, "0.2",
                         "The ratio is clipped below at 1 - clip_ratio_low."),
                     0));
  schema.add(atLeast(key(kActor + "clip_ratio_high", T::kFloat, "0.2",
                         "The ratio is clipped above at 1 + clip_ratio_high."),
                     0));
  schema.add(above(key(kActor + "clip_ratio_c", T::kFloat, "3.0",
                       "Dual clip: for negative advantages the loss is at most -A * clip_ratio_c (> 1)."),
                   1));
  schema.add(oneOf(key(kActor + "loss_agg_mode", T::kString, "token-mean",
                       "How per-token losses become one: token-mean, seq-mean-token-sum, seq-mean-token-mean."),
                   {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"}));
  schema.add(key(kActor + "use_kl_loss", T::kBool, "true",
                 "Add the KL divergence to the reference as a loss term (the reference model runs only then)."));
  schema.add(atLeast(key(kActor + "kl_loss_coef", T::kFloat, "0.001", "Weight of the KL loss."), 0));
  schema.add(oneOf(key(kActor + "kl_loss_type", T::kString, "low_var_kl",
                       "KL estimator: kl (k1), abs, mse (k2), low_var_kl (k3, clamped to [-10, 10])."),
                   {"kl", "abs", "mse", "low_var_kl"}));
  schema.add(atLeast(key(kActor + "entropy_coeff", T::kFloat, "0",
                         "Weight of the entropy bonus (subtracted from the loss); 0: none."),
                     0));

  schema.add(atLeast(key(kRollout + "n", T::kInt, "4",
                         "Samples per prompt; GRPO compares them, so at least 2."),
                     1));
  schema.add(atLeast(key(kRollout + "temperature", T::kFloat, "1.0", "Sampling temperature; 0: greedy."), 0));
  schema.add(atMost(above(key(kRollout + "top_p", T::kFloat, "1.0",
                              "Nucleus sampling: the smallest set of tokens whose probability reaches top_p."),
                          0),
                    1));
  schema.add(atLeast(key(kRollout + "top_k", T::kInt, "-1", "Sample among the k likeliest tokens; -1 or 0: all."),
                     -1));
  schema.add(atLeast(key(kRollout + "tensor_model_parallel_size", T::kInt, "0",
                         "Tensor-parallel size of the rollout model, the rest of the world as its data "
                         "parallelism; the actor's weights are resharded onto it every step. 0: the actor's."),
                     0));
  schema.add(atLeast(key(kRollout + "log_prob_micro_batch_size_per_gpu", T::kInt, "0",
                         "Samples per pass when the actor's old log-probabilities are computed (mini-batch by mini-batch); 0: a rank's share of a mini-batch."),
                     0));
  schema.add(atLeast(key(kRef + "log_prob_micro_batch_size_per_gpu", T::kInt, "0",
                         "Samples per pass of the reference's log-probabilities (mini-batch by mini-batch); 0: a rank's share of a mini-batch."),
                     0));
  schema.add(key(kRef + "param_offload", T::kBool, "false",
                 "Keep the reference's parameters in the offload tier (offload/tiered: disk on cpu) between uses."));

  schema.add(oneOf(key("algorithm.adv_estimator", T::kString, "grpo",
                       "Advantage estimator; grpo (group-normalised scores) is the one this trainer has."),
                   {"grpo"}));
  schema.add(key("algorithm.norm_adv_by_std_in_grpo", T::kBool, "true",
                 "Divide each group's centred scores by its std + 1e-6; false: Dr. GRPO (centred only)."));
  schema.add(atLeast(key("algorithm.format_reward", T::kFloat, "0",
                         "Reward of a well-formed but wrong answer (a number then EOS); the exact answer gets 1."),
                     0));
  schema.add(atLeast(key("algorithm.dump_rollouts", T::kInt, "0",
                         "Write the first N steps' samples (prompt, response, reward, advantage, old and reference "
                         "log-probabilities per token) to RUN_DIR/rollouts.jsonl."),
                     0));
}

void GrpoTrainer::setup(const Recipe& recipe) {
  LlmTrainer::setup(recipe);
  const llm::GptConfig& c = modelConfig();
  if (corpus() != nullptr) {
    recipe.fail("data.name", "megatron: the GRPO trainer samples responses to prompts and rewards their answers; use "
                             "arithmetic or prompts (JSONL of prompt and answer)");
  }

  if (recipe.getInt("parallel.pipeline_model_parallel_size") != 1) {
    recipe.fail("parallel.pipeline_model_parallel_size",
                "the grpo trainer's actor, reference and rollout run without a pipeline (sampling decodes one token "
                "at a time through the whole model); use 1 and tensor_model_parallel_size for larger models");
  }
  if (recipe.getInt("parallel.context_parallel_size") != 1) {
    recipe.fail("parallel.context_parallel_size", "the grpo trainer samples whole sequences on one rank; use 1");
  }
  if (c.num_experts > 0) {
    recipe.fail("model.num_experts", "the grpo trainer's rollout decodes the dense GPT only; use 0");
  }
  if (recipe.has("parallel.data_parallel_shares")) {
    recipe.fail("parallel.data_parallel_shares", "the grpo trainer splits its samples evenly; remove the key");
  }

  GrpoOptions o;
  const int64_t n = recipe.getInt(kRollout + "n");
  if (n < 2) {
    recipe.fail(kRollout + "n", std::to_string(n) + ": GRPO's advantage compares the samples of one prompt; use 2 or "
                                                    "more (verl's examples use 5)");
  }
  train_batch_size_ = recipe.getInt("data.train_batch_size");
  const int64_t actorTp = recipe.getInt("parallel.tensor_model_parallel_size");
  // 0: the actor's tp (under device groups, each group's own).
  rollout_tp_ = recipe.getInt(kRollout + "tensor_model_parallel_size");
  const int64_t mini = recipe.getInt(kActor + "ppo_mini_batch_size");
  const int64_t micro = recipe.getInt(kActor + "ppo_micro_batch_size_per_gpu");

  // The layouts the three models run in: the job's, or each device group's
  // own (parallel.groups), each with its rows of a step's and a mini-batch's
  // samples.
  const LayoutRequest job = layoutRequestFromRecipe(recipe, world_size_);
  std::vector<std::string> problems;
  auto request = [&](int64_t world, int64_t tp) {
    GrpoLayoutRequest q;
    q.world = world;
    q.train_batch_size = train_batch_size_;
    q.rollout_n = n;
    q.actor_tp = tp;
    q.rollout_tp = rollout_tp_ > 0 ? rollout_tp_ : tp;
    q.ppo_mini_batch_size = mini > 0 ? mini : train_batch_size_;
    q.num_attention_heads = c.num_heads;
    q.padded_vocab = c.paddedVocab();
    return q;
  };
  if (job.groups.empty()) {
    GrpoLayoutRequest q = request(world_size_, actorTp);
    const int64_t actorDp = world_size_ % actorTp == 0 ? world_size_ / actorTp : 1;
    q.ppo_micro_batch_size_per_gpu = micro > 0 ? micro : q.ppo_mini_batch_size * n / actorDp;
    problems = checkGrpoLayout(q);
  } else {
    const DeviceGroups groups = deviceGroupsOf(job);
    const int64_t miniPrompts = mini > 0 ? mini : train_batch_size_;
    const auto stepRows = groups.rows(train_batch_size_ * n);
    const auto miniRows = groups.rows(miniPrompts * n);
    if (!stepRows || !miniRows) {
      problems.push_back("parallel.groups: the device groups' shares do not split a step's " +
                         std::to_string(train_batch_size_ * n) + " samples and a mini-batch's " +
                         std::to_string(miniPrompts * n) + " (ppo_mini_batch_size x rollout.n) into whole rows: "
                         "change the shares, data.train_batch_size or ppo_mini_batch_size");
    }
    // The step's prompts into mini-batches, once for the job.
    GrpoLayoutRequest batches = request(1, 1);
    batches.rollout_tp = 1;
    batches.ppo_micro_batch_size_per_gpu = 1;
    for (auto& line : checkGrpoLayout(batches)) problems.push_back(std::move(line));
    for (int i = 0; stepRows.has_value() && miniRows.has_value() && i < groups.size(); ++i) {
      const DeviceGroup& g = groups[i];
      const std::string name = "parallel.groups[" + std::to_string(i) + "] (" + g.name + ")";
      if (g.sizes.pp != 1) {
        problems.push_back(name + ": pipeline_model_parallel_size=" + std::to_string(g.sizes.pp) +
                           ": the grpo trainer's models run without a pipeline (sampling decodes one token at a "
                           "time through the whole model); use 1 and tensor_model_parallel_size");
        continue;
      }
      if (job.groups[static_cast<size_t>(i)].micro_batch_size) {
        problems.push_back(name + ": micro_batch_size: the grpo trainer's actor takes " + kActor +
                           "ppo_micro_batch_size_per_gpu in every group; remove the group's micro_batch_size");
        continue;
      }
      GrpoLayoutRequest q = request(g.sizes.world, g.sizes.tp);
      q.group = name;
      const auto [begin, end] = (*stepRows)[static_cast<size_t>(i)];
      const auto [miniBegin, miniEnd] = (*miniRows)[static_cast<size_t>(i)];
      q.samples = end - begin;
      q.mini_samples = miniEnd - miniBegin;
      const int64_t dp = std::max<int64_t>(1, g.sizes.world / g.sizes.tp);
      q.ppo_micro_batch_size_per_gpu = micro > 0 ? micro : std::max<int64_t>(1, q.mini_samples / dp);
      for (auto& line : checkGrpoLayout(q)) problems.push_back(std::move(line));
    }
  }
  // The core's batch keys size the actor's optimizer step for `ptrain check`
  // and `ptrain plan`: they must say what the trainer runs.
  const int64_t stepSamples = (mini > 0 ? mini : train_batch_size_) * n;
  if (recipe.getInt("train.global_batch_size") != stepSamples) {
    problems.push_back("train.global_batch_size=" + std::to_string(recipe.getInt("train.global_batch_size")) +
                       " is not the actor's optimizer step, actor_rollout_ref.actor.ppo_mini_batch_size (" +
                       std::to_string(stepSamples / n) + ") x rollout.n (" + std::to_string(n) + ") = " +
                       std::to_string(stepSamples) + " samples: set it to " + std::to_string(stepSamples));
  }
  if (recipe.has("train.micro_batch_size") && micro > 0 && recipe.getInt("train.micro_batch_size") != micro) {
    problems.push_back("train.micro_batch_size=" + std::to_string(recipe.getInt("train.micro_batch_size")) +
                       " differs from actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=" + std::to_string(micro) +
                       ": set both to the same (or remove train.micro_batch_size)");
  }
  if (!problems.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < problems.size(); ++i) os << (i ? "\n" : "") << problems[i];
    throw ConfigError(os.str());
  }

  const auto& data = dataset().options();
  o.rollout.n = n;
  o.rollout.sampling.temperature = recipe.getFloat(kRollout + "temperature");
  o.rollout.sampling.top_p = recipe.getFloat(kRollout + "top_p");
  o.rollout.sampling.top_k = recipe.getInt(kRollout + "top_k");
  const int64_t maxResponse = recipe.getInt("data.max_response_length");
  o.rollout.max_response_length = maxResponse > 0          ? maxResponse
                                  : prompts() != nullptr ? prompts()->longestAnswerTokens()
                                                         : longestAnswerTokens(data.operations, data.digits);
  o.rollout.stop_id = ArithmeticTokenizer::kEos;
  o.rollout.pad_id = ArithmeticTokenizer::kPad;
  o.rollout.seed = data.seed;
  o.actor.policy.clip_ratio_low = recipe.getFloat(kActor + "clip_ratio_low");
  o.actor.policy.clip_ratio_high = recipe.getFloat(kActor + "clip_ratio_high");
  o.actor.policy.clip_ratio_c = recipe.getFloat(kActor + "clip_ratio_c");
  o.actor.policy.aggregation = lossAggregationFromName(recipe.getString(kActor + "loss_agg_mode"));
  o.actor.use_kl_loss = recipe.getBool(kActor + "use_kl_loss");
  o.actor.kl_loss_coef = recipe.getFloat(kActor + "kl_loss_coef");
  o.actor.kl_loss_type = klEstimatorFromName(recipe.getString(kActor + "kl_loss_type"));
  o.actor.entropy_coeff = recipe.getFloat(kActor + "entropy_coeff");
  o.actor.micro_batch_size = micro;
  o.norm_adv_by_std_in_grpo = recipe.getBool("algorithm.norm_adv_by_std_in_grpo");
  o.ppo_mini_batch_size = mini;
  o.ppo_epochs = recipe.getInt(kActor + "ppo_epochs");
  o.log_prob_micro_batch_size = recipe.getInt(kRollout + "log_prob_micro_batch_size_per_gpu");
  o.ref_log_prob_micro_batch_size = recipe.getInt(kRef + "log_prob_micro_batch_size_per_gpu");

  options_ = o;
  reward_.format = recipe.getFloat("algorithm.format_reward");
  use_reference_ = o.actor.use_kl_loss;
  ref_param_offload_ = recipe.getBool(kRef + "param_offload");
  dump_rollouts_ = recipe.getInt("algorithm.dump_rollouts");
  // Not set (or set empty): fresh weights.
  init_from_ = recipe.has("actor_rollout_ref.model.path") ? recipe.getString("actor_rollout_ref.model.path") : "";
  // Checked here, so that `ptrain check` refuses what the run would: a
  // folder that is not there, or holds no checkpoint.
  if (!init_from_.empty()) {
    try {
      int64_t step = 0;
      resolveWeightsSource(init_from_, &step);
    } catch (const CheckpointError& e) {
      recipe.fail("actor_rollout_ref.model.path", e.what());
    }
  }
  // The actor's starting weights have their own key here.
  if (recipe.has("checkpoint.load")) {
    recipe.fail("checkpoint.load", "the GRPO trainer's actor and reference start from actor_rollout_ref.model.path; "
                                   "set that instead");
  }
}

void GrpoTrainer::promptsOf(int64_t step, std::vector<std::vector<int64_t>>& prompts,
                            std::vector<std::string>& answers) const {
  prompts.clear();
  answers.clear();
  for (int64_t i = 0; i < train_batch_size_; ++i) {
    if (this->prompts() != nullptr) {
      // data.name: prompts: the user's problems, train_batch_size a step.
      const llm::PromptAnswer& p = trainPrompt(step * train_batch_size_ + i);
      prompts.push_back(ArithmeticTokenizer::encode(p.prompt));
      answers.push_back(p.answer);
      continue;
    }
    const datasets::ArithmeticProblem p = dataset().trainProblem(step, i);
    prompts.push_back(ArithmeticTokenizer::encode(p.prompt()));
    answers.push_back(p.answer());
  }
}

void GrpoTrainer::dumpRollouts(const std::string& runDir, int64_t step, const GrpoStepResult& result,
                               const std::vector<std::string>& answers) const {
  std::ofstream out(std::filesystem::path(runDir) / "rollouts.jsonl", std::ios::app);
  const Batch& b = result.batch;
  const at::Tensor mask = b.at("response_mask").cpu();
  const at::Tensor advantages = b.at("advantages").cpu();
  const at::Tensor oldLp = b.at("old_log_probs").cpu();
  const at::Tensor refLp = b.at("ref_log_probs").cpu();
  const int64_t n = options_.rollout.n;
  for (size_t r = 0; r < result.rollout.responses.size(); ++r) {
    const int64_t row = static_cast<int64_t>(r);
    const at::Tensor keep = mask[row] > 0;
    const at::Tensor adv = advantages[row].masked_select(keep);
    nlohmann::json line{{"step", step},
                        {"sample", row},
                        {"prompt", text(result.rollout.prompts[r])},
                        {"answer", answers.at(static_cast<size_t>(row / n))},
                        {"response", text(result.rollout.responses[r])},
                        {"response_tokens", result.rollout.responses[r]},
                        {"reward", result.scores[r]},
                        {"advantage", adv.numel() > 0 ? adv[0].item<double>() : 0.0}};
    auto values = [&](const at::Tensor& t) {
      const at::Tensor v = t[row].masked_select(keep).to(torch::kFloat64).contiguous();
      return std::vector<double>(v.data_ptr<double>(), v.data_ptr<double>() + v.numel());
    };
    line["old_log_probs"] = values(oldLp);
    line["ref_log_probs"] = values(refLp);
    out << line.dump() << "\n";
  }
  if (!out) throw CheckpointError((std::filesystem::path(runDir) / "rollouts.jsonl").string() + ": cannot write");
}

namespace {

// GRPO as the engine's loop drives it: three runtimes (actor, rollout,
// reference), one grpoStep per step, the actor checkpointed and evaluated.
class GrpoTask final : public TrainingTask {
 public:
  using StepFunction = std::function<StepReport(int64_t step, ModelRuntime& actor, ModelRuntime& rollout,
                                                ModelRuntime* reference)>;
  using EvalFunction = std::function<std::map<std::string, double>(ModelRuntime& actor)>;

  GrpoTask(std::unique_ptr<ModelRuntime> actor, std::unique_ptr<ModelRuntime> rollout,
           std::unique_ptr<ModelRuntime> reference, StepFunction step, EvalFunction evaluate)
      : actor_(std::move(actor)),
        rollout_(std::move(rollout)),
        reference_(std::move(reference)),
        step_(std::move(step)),
        evaluate_(std::move(evaluate)) {}

  std::vector<ModelRuntime*> checkpointed() override { return {actor_.get()}; }
  std::vector<ModelRuntime*> loadTargets() override {
    std::vector<ModelRuntime*> out = {actor_.get()};
    if (reference_) out.push_back(reference_.get());
    return out;
  }
  StepReport step(int64_t step) override { return step_(step, *actor_, *rollout_, reference_.get()); }
  std::map<std::string, double> evaluate() override { return evaluate_(*actor_); }
  // The starting policy's score, as verl reports it before training.
  bool evaluatesAtStart() const override { return true; }

 private:
  std::unique_ptr<ModelRuntime> actor_, rollout_, reference_;
  StepFunction step_;
  EvalFunction evaluate_;
};

}  // namespace

TrainSummary GrpoTrainer::train(TrainingSession& session) {
  const Recipe& recipe = session.recipe();
  const bool rankZero = session.isRankZero();

  RuntimeOptions actorOptions = session.runtimeOptions();
  actorOptions.name = "actor";
  // The learning-rate schedule counts optimizer steps: ppo_epochs x
  // mini-batches of them per GRPO step.
  const int64_t mini = options_.ppo_mini_batch_size > 0 ? options_.ppo_mini_batch_size : train_batch_size_;
  actorOptions.optimizer->total_steps = recipe.getInt("train.steps") * options_.ppo_epochs * (train_batch_size_ / mini);
  RuntimeOptions rolloutOptions = actorOptions;
  rolloutOptions.name = "rollout";
  // Over the actor's ranks (under device groups, the group's), at the
  // rollout's tp (0: the actor's).
  LayoutSizes sizes;
  sizes.world = actorOptions.layout.sizes().world;
  sizes.tp = rollout_tp_ > 0 ? static_cast<int>(rollout_tp_) : actorOptions.layout.sizes().tp;
  rolloutOptions.layout = ParallelLayout(sizes);
  rolloutOptions.optimizer.reset();
  rolloutOptions.offload = OffloadSettings{};
  RuntimeOptions refOptions = actorOptions;
  refOptions.name = "ref";
  refOptions.optimizer.reset();
  refOptions.offload = OffloadSettings{};
  if (ref_param_offload_) {
    refOptions.offload.params = true;
    refOptions.offload.folder = (std::filesystem::path(session.runDir()) / "offload" / "ref").string();
  }

  std::unique_ptr<ModelRuntime> actor = session.makeRuntime(actorOptions);
  std::unique_ptr<ModelRuntime> rollout = session.makeRuntime(rolloutOptions);
  std::unique_ptr<ModelRuntime> reference = use_reference_ ? session.makeRuntime(refOptions) : nullptr;

  // The supervised run's model, or another GRPO run's actor (a resume then
  // restores the actor from this run's own checkpoint in the loop).
  if (!init_from_.empty() && !session.resuming()) {
    std::vector<ModelRuntime*> start = {actor.get()};
    if (reference) start.push_back(reference.get());
    const int64_t from = session.loadWeightsFrom(init_from_, {"model", "actor"}, start);
    if (rankZero) logger()->info("actor{} start from {} (step {})", reference ? " and reference" : "", init_from_, from);
  }

  auto step = [this, &session, rankZero](int64_t index, ModelRuntime& actorRuntime, ModelRuntime& rolloutRuntime,
                                         ModelRuntime* referenceRuntime) {
    std::vector<std::vector<int64_t>> prompts;
    std::vector<std::string> answers;
    promptsOf(index, prompts, answers);
    RewardFunction reward = [&](int64_t prompt, const std::vector<int64_t>& response) {
      return arithmeticReward(response, answers.at(static_cast<size_t>(prompt)), reward_);
    };
    GrpoStepResult result = grpoStep(*this, actorRuntime, rolloutRuntime, referenceRuntime, prompts, reward, options_, index);
    if (rankZero && index < dump_rollouts_) dumpRollouts(session.runDir(), index + 1, result, answers);
    const auto& m = result.metrics;
    StepReport report;
    report.loss = m.at("actor/pg_loss") +
                  (options_.actor.use_kl_loss ? options_.actor.kl_loss_coef * m.at("actor/kl_loss") : 0.0) -
                  options_.actor.entropy_coeff * m.at("actor/entropy");
    report.grad_norm = m.at("actor/grad_norm");
    report.lr = m.at("actor/lr");
    // The actor's updates leave themselves out when not finite (the runtime).
    report.nonfinite = m.at("actor/nonfinite_updates") > 0;
    report.items = m.at("perf/throughput") * m.at("timing_s/step");
    for (const auto& [k, v] : m) report.metrics[k] = v;
    report.note = fmt::format("score {:.3f} kl_loss {:.4f} response_length {:.1f} (gen {:.2f} s, update {:.2f} s)",
                              m.at("critic/score/mean"), m.at("actor/kl_loss"), m.at("response_length/mean"),
                              m.at("timing_s/gen"), m.at("timing_s/update_actor"));
    return report;
  };
  auto evaluate = [this](ModelRuntime& actorRuntime) {
    std::map<std::string, double> result;
    actorRuntime.inference(
        [&](StagedModel& model, const EvalContext& ctx) { result = LlmTrainer::evaluate(model, ctx); });
    return result;
  };
  GrpoTask task(std::move(actor), std::move(rollout), std::move(reference), step, evaluate);
  return runTrainingLoop(session, task, "tokens");
}

}  // namespace ptrain::grpo
