#include "recommender_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "ptrain/comm/process_group.h"
#include "ptrain/core/error.h"
#include "ptrain/core/logging.h"
#include "ptrain/core/resources.h"
#include "ptrain/datasets/auc.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/recipe_layout.h"
#include "ptrain/engine/moe_settings.h"
#include "ptrain/layout/validation.h"
#include "ptrain/pipeline/schedule.h"
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain::recommender {

using datasets::ClicksSplit;

namespace {

// data.term_fit's smallest evaluation set.
constexpr int64_t kTermFitMinSamples = 200;

// Validation samples scored in one forward pass: bounds evaluation's memory
// whatever data.eval_size is (rounded up to a multiple of tp, which splits
// the samples around the experts).
constexpr int64_t kEvalChunk = 1024;

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

std::string gigabytes(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string count(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", n);
  return buf;
}

}  // namespace

namespace {

// Dense (non-table) parameters per rank of each stage: the bottom MLP on the
// first, each block on the stage the pipeline gives it (the recipe's layout,
// or the pipeline plugin's balanced partition), the top MLP on the last;
// experts divided by ep.
std::vector<int64_t> denseByStage(const RecsysConfig& c, int64_t pp, int64_t ep,
                                  const std::vector<int64_t>& pipelineLayout, int64_t* expertStage = nullptr) {
  const int64_t bottom = c.bottomParameters(), attn = c.attentionParameters(), top = c.topParameters();
  const int64_t block1 = c.expertBlockParameters(), experts = c.expertBlockParameters(true);
  std::vector<int> perStage;
  if (pp > 1 && !pipelineLayout.empty()) {
    for (int64_t n : pipelineLayout) perStage.push_back(static_cast<int>(n));
  } else if (pp > 1) {
    perStage = pipeline::balancedPartition({attn, block1}, static_cast<int>(pp));
  } else {
    perStage = {2};
  }
  auto stageOf = [&](int block) {
    int first = 0;
    for (size_t s = 0; s < perStage.size(); ++s) {
      if (block < first + perStage[s]) return static_cast<int>(s);
      first += perStage[s];
    }
    return static_cast<int>(pp - 1);
  };
  std::vector<int64_t> dense(static_cast<size_t>(pp), 0);
  dense[0] += bottom;
  dense[static_cast<size_t>(stageOf(0))] += attn;
  dense[static_cast<size_t>(stageOf(1))] += block1 - experts + experts / std::max<int64_t>(1, ep);
  dense[static_cast<size_t>(pp - 1)] += top;
  if (expertStage != nullptr) *expertStage = stageOf(1);
  return dense;
}

// Bytes the table optimizer keeps for `values` table values of `rows` rows.
double tableStateBytes(const std::string& tableOptimizer, int64_t values, int64_t rows) {
  if (tableOptimizer == "rowwise_adagrad") return 4.0 * static_cast<double>(rows);
  return 8.0 * static_cast<double>(values);  // sparse Adam's moments, or AdamW's
}

}  // namespace

plan::MemoryEstimate recsysStageMemory(const RecsysConfig& c, const plan::Layout& l, const std::string& tableOptimizer,
                                       const std::vector<int64_t>& pipelineLayout, int64_t evalSize, int64_t stage) {
  plan::MemoryEstimate e;
  e.stage = stage;
  const nn::EmbeddingTablesOptions tables = c.tableOptions(0);
  const int64_t tableValues = stage == 0 ? nn::embeddingParametersPerRank(tables, static_cast<int>(l.tp)) : 0;
  int64_t expertStage = 0;
  const std::vector<int64_t> denseStages = denseByStage(c, l.pp, l.ep, pipelineLayout, &expertStage);
  const double dense = static_cast<double>(denseStages[static_cast<size_t>(stage)]);
  const double values = static_cast<double>(tableValues);
  const double paramBytes = l.precision == "fp32" ? 4 : 2;
  const int64_t microBatches = l.microBatches();
  e.params = (values + dense) * paramBytes;
  // Every gradient here is made whole by backward (libtorch's linear and
  // batched products, the tables' dense rows) and, with several micro-batches
  // a step, made whole once more for each micro-batch while it is added in:
  // the host allocator keeps a block of each size for it.
  e.grads = (values + dense) * 4 * (microBatches > 1 ? 2 : 1);
  e.optimizer = tableStateBytes(tableOptimizer, tableValues, tableValues / c.dim) + dense * 8 +
                (paramBytes < 4 ? (values + dense) * 4 : 0);
  // Activations, float32 values per sample: the stage's parts of the forward
  // pass (the lookups, each rank's masked partial ones and their sum; the MLP
  // layers; the stacked fields and the pairwise dots; the attention unit over
  // the history; the experts' tokens) and the packed hidden it passes on,
  // twice (an op's output and what it keeps for backward).
  const double d = static_cast<double>(c.dim), h = static_cast<double>(c.history_length);
  const double pairs = static_cast<double>(kInteractionVectors * (kInteractionVectors - 1) / 2);
  double perSample = 2 * static_cast<double>(RecsysPacking(c).width);
  if (stage == 0) {
    double mlp = 0;
    for (int64_t w : c.bottom_mlp) mlp += static_cast<double>(w);
    perSample += 2 * (3 * (kSparseFeatures + h) * d + mlp + static_cast<double>(kInteractionVectors) * d + pairs + d);
  }
  if (stage == l.pp - 1) {
    double mlp = 0;
    for (int64_t w : c.top_mlp) mlp += static_cast<double>(w);
    const double k = static_cast<double>(c.num_experts > 0 ? std::max<int64_t>(1, c.moe.topk) : 1);
    perSample += 2 * (h * (3 * d + static_cast<double>(c.attention_hidden)) + static_cast<double>(c.hidden) +
                      k * (static_cast<double>(c.ffn) + static_cast<double>(c.hidden)) + mlp);
  }
  const int64_t inFlight = l.pp > 1 ? std::min<int64_t>(l.pp - stage, microBatches) : 1;
  e.in_flight = inFlight;
  const double training = perSample * 4 * static_cast<double>(l.micro_batch) * static_cast<double>(inFlight);
  // An evaluation chunk, without gradients (about half of that per sample):
  // the host allocator keeps the blocks of both sizes, so both count.
  const int64_t evalRows = (evalSize + l.dp - 1) / l.dp;
  const int64_t chunk = (std::min<int64_t>(kEvalChunk, evalRows) + l.tp - 1) / l.tp * l.tp;
  e.activations = training + perSample * 2 * static_cast<double>(chunk);
  // The gradient buffer's buckets hold the dense gradients when dp > 1 and
  // the experts' when their data-parallel group (edp) is (the tables' rows
  // travel on their own, row-sparse); the gradients are views of it, so it
  // takes memory of its own only when offload keeps them elsewhere.
  const double experts = static_cast<double>(c.expertBlockParameters(true)) / static_cast<double>(std::max<int64_t>(1, l.ep));
  const int64_t edp = l.tp * l.cp * l.dp / std::max<int64_t>(1, l.etp * l.ep);
  const bool holdsExperts = c.num_experts > 0 && stage == expertStage;
  double reduced = l.dp > 1 ? dense - (holdsExperts ? experts : 0) : 0;
  if (holdsExperts && edp > 1) reduced += experts;
  e.buffers = l.offload_grads || l.offload_params ? std::max(0.0, reduced) * 4 : 0;
  return e;
}

RecsysFootprint recsysFootprint(const RecsysConfig& c, int tp, int pp, int ep, const std::string& tableOptimizer,
                                const std::vector<int64_t>& pipelineLayout) {
  RecsysFootprint f;
  const nn::EmbeddingTablesOptions tables = c.tableOptions(0);
  const nn::EmbeddingShardingPlan plan = nn::EmbeddingShardingPlan::of(tables);
  int64_t tableRows = 0;
  for (size_t t = 0; t < plan.padded_rows.size(); ++t) {
    if (plan.tables[t].sharding == nn::TableSharding::kRowWise) tableRows += plan.padded_rows[t];
  }
  tableRows += plan.slots * plan.slot_rows;
  f.table_parameters = tableRows * c.dim;
  f.total_parameters = f.table_parameters + c.bottomParameters() + c.attentionParameters() +
                       c.expertBlockParameters() + c.topParameters();
  const std::vector<int64_t> dense = denseByStage(c, pp, ep, pipelineLayout);
  const int64_t tablesPerRank = nn::embeddingParametersPerRank(tables, tp);
  // fp32 values and gradients (the tables' gradients are dense [rows, dim]),
  // AdamW's two moments for the dense parameters, the tables' optimizer state.
  f.first_stage_parameters = tablesPerRank + dense[0];
  f.first_stage_bytes = 8.0 * static_cast<double>(tablesPerRank) +
                        tableStateBytes(tableOptimizer, tablesPerRank, tablesPerRank / c.dim) +
                        16.0 * static_cast<double>(dense[0]);
  if (pp == 1) {
    f.last_stage_parameters = f.first_stage_parameters;
    f.last_stage_bytes = f.first_stage_bytes;
  } else {
    f.last_stage_parameters = dense.back();
    f.last_stage_bytes = 16.0 * static_cast<double>(dense.back());
  }
  return f;
}

RecommenderTrainer::RecommenderTrainer(const PluginContext& context) : rank_(context.rank) {}

RecommenderTrainer::~RecommenderTrainer() = default;

void RecommenderTrainer::describeKeys(Schema& schema) const {
  using T = ValueType;
  using keys::above;
  using keys::atLeast;
  using keys::atMost;
  using keys::key;
  using keys::oneOf;

  // The hidden width and the MLP inside the experts in the transformer's
  // names, the experts' keys (one MoE layer: no moe_layer_freq), and whole
  // blocks recomputed.
  schema.add(atLeast(key("model.hidden_size", T::kInt, "64", "Width of the packed hidden state the blocks pass on."), 1));
  schema.add(atLeast(key("model.ffn_hidden_size", T::kInt, "0", "Width of each expert's MLP; 0 means 2 * hidden_size."), 0));
  keys::addMoe(schema);
  schema.remove("model.moe_layer_freq");
  keys::addRecompute(schema, /*selective=*/false);
  schema.add(atLeast(key("model.embedding_dim", T::kInt, "16",
                         "Width of every embedding table and of the bottom MLP's output (the interaction's vectors)."),
                     1));
  schema.add(key("model.bottom_mlp", T::kIntList, "[64]",
                 "Hidden widths of the bottom MLP over the 13 dense features; a last layer to embedding_dim follows."));
  schema.add(key("model.top_mlp", T::kIntList, "[64, 32]",
                 "Hidden widths of the top MLP over the experts' output; a last layer to the click logit follows."));
  schema.add(atLeast(key("model.attention_hidden", T::kInt, "32",
                         "Hidden width of the target attention's scoring MLP over [history item, target, product]."),
                     1));
  schema.add(above(key("model.scale", T::kFloat, "1.0",
                       "Factor on every table size (data.table_sizes or the default), rounded; a table never shrinks "
                       "below min(its size, model.min_table_rows). Shrinks a large recipe to fit a small machine."),
                   0));
  schema.add(atLeast(key("model.min_table_rows", T::kInt, "1000", "Fewest rows model.scale leaves a table."), 1));
  schema.add(atLeast(key("model.row_wise_threshold", T::kInt, "20000",
                         "Tables with at least this many rows are split row-wise over the tensor ranks; smaller ones "
                         "live whole on one rank (table-wise). 0: every table row-wise."),
                     0));
  schema.add(atLeast(key("model.table_wise_slots", T::kInt, "8",
                         "Slots the table-wise tables are packed into; tensor_model_parallel_size must divide it."),
                     1));
  schema.add(atLeast(key("model.row_multiple", T::kInt, "8",
                         "Row-wise tables are padded to a multiple of this (fixed, so checkpoints reshard); "
                         "tensor_model_parallel_size must divide the padded rows."),
                     1));
  schema.add(oneOf(key("model.embedding_optimizer", T::kString, "rowwise_adagrad",
                       "Optimizer of the tables' rows (only rows a step touched are updated): rowwise_adagrad, "
                       "sparse_adam, or none (the tables join optimizer.name's dense update)."),
                   {"rowwise_adagrad", "sparse_adam", "none"}));
  schema.add(atLeast(key("model.embedding_lr", T::kFloat, "0",
                         "Peak learning rate of the tables' sparse optimizer (the schedule scales it like "
                         "optimizer.lr); 0: optimizer.lr."),
                     0));
  schema.add(atLeast(key("model.embedding_weight_decay", T::kFloat, "0",
                         "Weight decay of the touched table rows (L2 for rowwise_adagrad, decoupled for sparse_adam)."),
                     0));

  schema.add(key("data.table_sizes", T::kIntList, "",
                 "Rows of the 26 categorical features' tables (user, item, category, interest, then 22 more); not "
                 "set: the clicks data set's defaults (about 3.0e5 rows in all)."));
  schema.add(atMost(atLeast(key("data.history_length", T::kInt, "8", "Item history slots per sample."), 1), 1024));
  schema.add(atLeast(key("data.min_history", T::kInt, "1", "Fewest valid history items per sample."), 0));
  schema.add(atMost(above(key("data.zipf_exponent", T::kFloat, "1.1", "Zipf exponent of every feature's ids."), 0),
                    10));
  schema.add(atMost(atLeast(key("data.logit_std", T::kFloat, "1.2",
                                "Standard deviation of the hidden model's logit: higher, an easier problem and a "
                                "higher best AUC."),
                            0),
                    20));
  schema.add(atMost(atLeast(key("data.hidden_dim", T::kInt, "8",
                                "Embedding width of the hidden model (the rank of its dot-product terms): lower, "
                                "fewer unknowns per id and a problem learnable from fewer samples."),
                            1),
                    64));
  schema.add(atMost(above(key("data.click_rate", T::kFloat, "0.25", "Mean click probability."), 0), 1));
  schema.add(atLeast(key("data.world_seed", T::kInt, std::to_string(datasets::kClicksWorldSeed),
                         "Seed of the hidden ground-truth model (the same for training and validation)."),
                     0));
  schema.add(key("data.term_fit", T::kBool, "false",
                 "At each evaluation, regress the model's validation logits on the seven terms of the hidden "
                 "model's logit and report the coefficients (fit_<term>: 1 = the term learned at full weight, 0 = "
                 "missed) and the fit's R^2 (fit_r2)."));
  schema.add(atLeast(key("data.eval_size", T::kInt, "20000",
                         "Validation samples scored (AUC, logloss), split across data-parallel ranks; the ground "
                         "truth's best AUC is computed on the same samples. data.name criteo: the first that many "
                         "records of data.validation_path (all of them when it holds fewer)."),
                     0));
  schema.add(key("data.path", T::kString, "",
                 "data.name criteo: the training file, Criteo TSV (plain or .gz; ptrain's history columns "
                 "optional), e.g. what `ptrain data export clicks` writes."));
  schema.add(key("data.validation_path", T::kString, "",
                 "data.name criteo: the validation file (same format), scored at each evaluation."));
  schema.add(key("data.shuffle", T::kBool, "true",
                 "data.name criteo: visit the training records in a per-epoch order seeded by train.seed (blocks "
                 "of data.shuffle_block consecutive records in a shuffled order, each block's records shuffled); "
                 "false: the file's order (what reproduces the generator's batches from an export)."));
  schema.add(atLeast(key("data.shuffle_block", T::kInt, "4096",
                         "data.name criteo: consecutive records shuffled as one block (see data.shuffle)."),
                     1));
}

void RecommenderTrainer::setup(const Recipe& recipe) {
  const std::string name = recipe.has("data.name") ? recipe.getString("data.name") : "";
  const bool fromFiles = name == "criteo";
  if (!name.empty() && name != "clicks" && !fromFiles) {
    recipe.fail("data.name", "'" + name + "' is not a dataset of the recommender trainer; use clicks (built in) or "
                             "criteo (TSV files, data.path)");
  }
  // Keys of the other source would be silently unread.
  static const std::vector<const char*> kGeneratorKeys = {"data.zipf_exponent", "data.logit_std",  "data.click_rate",
                                                          "data.hidden_dim",    "data.world_seed", "data.min_history",
                                                          "data.term_fit"};
  static const std::vector<const char*> kFileKeys = {"data.path", "data.validation_path", "data.shuffle",
                                                     "data.shuffle_block"};
  for (const char* key : fromFiles ? kGeneratorKeys : kFileKeys) {
    if (recipe.isExplicit(key)) {
      recipe.fail(key, std::string("is read only with data.name: ") + (fromFiles ? "clicks" : "criteo") +
                           "; remove it, or set data.name: " + (fromFiles ? "clicks" : "criteo"));
    }
  }
  // Keys whose default is "" may hold no value at all.
  auto text = [&](const char* key) { return recipe.has(key) ? recipe.getString(key) : std::string(); };
  if (fromFiles && text("data.path").empty()) {
    recipe.fail("data.path", "not set; data.name: criteo reads the training records from a Criteo TSV file, e.g. "
                             "data.path: data/clicks_train.tsv.gz (ptrain data export clicks writes one)");
  }
  if (fromFiles && recipe.getInt("data.eval_size") > 0 && text("data.validation_path").empty()) {
    recipe.fail("data.validation_path", "not set; evaluation (data.eval_size > 0) scores the records of a "
                                        "validation file: give one, or set data.eval_size: 0");
  }

  datasets::ClicksOptions data;
  std::vector<int64_t> sizes =
      recipe.has("data.table_sizes") ? recipe.getIntList("data.table_sizes") : datasets::clicksDefaultTableSizes();
  if (static_cast<int64_t>(sizes.size()) != kSparseFeatures) {
    recipe.fail("data.table_sizes", "has " + std::to_string(sizes.size()) + " entries; give one per categorical "
                                    "feature, 26");
  }
  for (int64_t s : sizes) {
    if (s < 1) recipe.fail("data.table_sizes", "a table of " + std::to_string(s) + " rows; every table needs >= 1");
  }
  const double scale = recipe.getFloat("model.scale");
  if (scale != 1.0) sizes = datasets::scaleTableSizes(sizes, scale, recipe.getInt("model.min_table_rows"));
  data.table_sizes = sizes;
  data.history_length = recipe.getInt("data.history_length");
  data.min_history = recipe.getInt("data.min_history");
  data.zipf_exponent = recipe.getFloat("data.zipf_exponent");
  data.logit_std = recipe.getFloat("data.logit_std");
  data.click_rate = recipe.getFloat("data.click_rate");
  data.hidden_dim = recipe.getInt("data.hidden_dim");
  data.world_seed = static_cast<uint64_t>(recipe.getInt("data.world_seed"));
  data.seed = static_cast<uint64_t>(recipe.getInt("train.seed"));
  const int64_t evalSize = recipe.getInt("data.eval_size");
  const bool termFit = recipe.getBool("data.term_fit");
  // The fit has 8 unknowns; with fewer samples than a few hundred its
  // coefficients say nothing (and below 8 it has no answer).
  if (termFit && evalSize < kTermFitMinSamples) {
    recipe.fail("data.term_fit", "needs data.eval_size >= " + std::to_string(kTermFitMinSamples) +
                                     " validation samples to fit the model's logits on the 7 terms (it is " +
                                     std::to_string(evalSize) + "); raise data.eval_size or set data.term_fit: false");
  }
  data.validation_size = std::max<int64_t>(1, evalSize);
  if (auto problem = datasets::checkClicksOptions(data)) recipe.fail("data", *problem);
  std::unique_ptr<ClickFiles> files;
  if (fromFiles) {
    ClickFilesOptions o;
    o.train_path = text("data.path");
    o.validation_path = evalSize > 0 ? text("data.validation_path") : "";
    o.table_sizes = sizes;
    o.item_feature = data.item_feature;
    o.category_feature = data.category_feature;
    o.interest_feature = data.interest_feature;
    o.history_length = data.history_length;
    o.shuffle = recipe.getBool("data.shuffle");
    o.shuffle_block = recipe.getInt("data.shuffle_block");
    o.seed = data.seed;
    try {
      files = std::make_unique<ClickFiles>(o);
    } catch (const ConfigError& e) {
      // Which file is named in the message; the key says where it was set.
      const std::string what = e.what();
      const bool validation = !o.validation_path.empty() && what.rfind(o.validation_path, 0) == 0 &&
                              what.rfind(o.train_path, 0) != 0;
      recipe.fail(validation ? "data.validation_path" : "data.path", what);
    }
  }

  RecsysConfig c;
  c.table_sizes = sizes;
  c.dim = recipe.getInt("model.embedding_dim");
  c.bottom_mlp = recipe.getIntList("model.bottom_mlp");
  c.top_mlp = recipe.getIntList("model.top_mlp");
  for (const char* k : {"model.bottom_mlp", "model.top_mlp"}) {
    for (int64_t w : recipe.getIntList(k)) {
      if (w < 1) recipe.fail(k, "a layer of width " + std::to_string(w) + "; every width must be >= 1");
    }
  }
  c.attention_hidden = recipe.getInt("model.attention_hidden");
  c.hidden = recipe.has("model.hidden_size") ? recipe.getInt("model.hidden_size") : 64;
  const int64_t ffn = recipe.getInt("model.ffn_hidden_size");
  c.ffn = ffn > 0 ? ffn : 2 * c.hidden;
  c.history_length = data.history_length;
  c.item_feature = data.item_feature;
  c.category_feature = data.category_feature;
  c.interest_feature = data.interest_feature;
  c.row_wise_threshold = recipe.getInt("model.row_wise_threshold");
  c.table_wise_slots = recipe.getInt("model.table_wise_slots");
  c.row_multiple = recipe.getInt("model.row_multiple");
  const MoeSettings moe = MoeSettings::fromRecipe(recipe);
  c.num_experts = moe.num_experts;
  c.moe = moe.routing;

  // The layouts the model runs in: the job's, or each device group's own
  // (parallel.groups; the sizes are already checked, see prepareRecipe).
  struct Split {
    std::string group;  // "" for the job; else "entry i (name)" of parallel.groups
    int tp = 1, pp = 1, ep = 1;
    int64_t micro_rows = 0;
    bool micro_written = false;
  };
  std::vector<Split> splits;
  {
    const LayoutRequest job = layoutRequestFromRecipe(recipe, static_cast<int>(recipe.getInt("launch.nproc")));
    const size_t count = std::max<size_t>(1, job.groups.size());
    for (size_t i = 0; i < count; ++i) {
      const bool grouped = !job.groups.empty();
      const LayoutRequest q = grouped ? groupRequest(job, i) : job;
      Split split;
      if (grouped) {
        const std::string& name = job.groups[i].name;
        split.group = "entry " + std::to_string(i) + " (" + (name.empty() ? "group" + std::to_string(i) : name) + ")";
      }
      split.tp = static_cast<int>(q.tp);
      split.pp = static_cast<int>(q.pp);
      split.ep = static_cast<int>(q.ep);
      split.micro_written = q.micro_batch_size.has_value();
      const int64_t dp = std::max<int64_t>(1, q.world / std::max<int64_t>(1, q.tp * q.pp));
      split.micro_rows = q.micro_batch_size ? *q.micro_batch_size : q.global_batch_size / dp;
      splits.push_back(split);
    }
  }
  for (const Split& split : splits) {
    // With groups, the key is the groups' and the line names the group.
    const std::string in = split.group.empty() ? "" : split.group + ": ";
    try {
      nn::checkEmbeddingTablesTensorParallel(c.tableOptions(0), split.tp);
    } catch (const ConfigError& e) {
      recipe.fail(split.group.empty() ? "model.row_multiple" : "parallel.groups", in + e.what());
    }
    if (c.num_experts > 0 && split.tp > 1 && split.micro_rows % split.tp != 0) {
      // The samples of a micro-batch are split over the tensor ranks around
      // the experts.
      const char* key = split.group.empty()
                            ? (split.micro_written ? "train.micro_batch_size" : "train.global_batch_size")
                            : "parallel.groups";
      recipe.fail(key, in + "micro-batches of " + std::to_string(split.micro_rows) +
                           " samples, which tensor_model_parallel_size=" + std::to_string(split.tp) +
                           " does not divide (the samples are split over the tensor ranks around the experts); use a "
                           "multiple of " + std::to_string(split.tp));
    }
  }
  // The footprint logged and kept is the first layout's (group 0's).
  const int tp = splits.front().tp, pp = splits.front().pp, ep = splits.front().ep;

  const std::string tableOptimizer = recipe.getString("model.embedding_optimizer");
  // The run would refuse it in every worker (engine/optimizer.cpp): say it here, before any starts.
  if (tableOptimizer != "none" && recipe.getBool("optimizer.distributed")) {
    recipe.fail("optimizer.distributed",
                "the embedding tables' optimizer (model.embedding_optimizer: " + tableOptimizer +
                    ") steps the rows a step touched in 2-d tables, which the distributed optimizer flattens into "
                    "its ranges: set optimizer.distributed: false, or model.embedding_optimizer: none");
  }
  std::vector<int64_t> layout;
  if (recipe.has("parallel.pipeline_layout")) layout = recipe.getIntList("parallel.pipeline_layout");
  const RecsysFootprint footprint = recsysFootprint(c, tp, pp, ep, tableOptimizer, layout);
  pipeline_layout_ = layout;

  // Only a fully valid recipe replaces what an earlier setup() prepared.
  dataset_ = fromFiles ? nullptr : std::make_unique<datasets::ClicksDataset>(data);
  files_ = std::move(files);
  default_export_samples_ = recipe.getInt("train.steps") * recipe.getInt("train.global_batch_size");
  best_.reset();
  config_ = c;
  eval_size_ = evalSize;
  term_fit_ = termFit;
  term_contributions_.clear();
  embedding_optimizer_ = tableOptimizer;
  embedding_lr_ = recipe.getFloat("model.embedding_lr");
  embedding_weight_decay_ = recipe.getFloat("model.embedding_weight_decay");
  footprint_ = footprint;

  if (rank_ == 0) {
    logger()->info("recommender: {} parameters ({} in the tables: {} rows of {}), fp32", count(footprint.total_parameters),
                   count(footprint.table_parameters), count(footprint.table_parameters / c.dim), c.dim);
    if (pp == 1) {
      logger()->info("recommender: per rank at tp={} ep={}: {} parameters, {} with gradients and optimizer state", tp,
                     ep, count(footprint.first_stage_parameters), gigabytes(footprint.first_stage_bytes));
    } else {
      logger()->info("recommender: per rank at tp={} pp={} ep={}: first stage {} parameters, {}; last stage {} "
                     "parameters, {} (with gradients and optimizer state)",
                     tp, pp, ep, count(footprint.first_stage_parameters), gigabytes(footprint.first_stage_bytes),
                     count(footprint.last_stage_parameters), gigabytes(footprint.last_stage_bytes));
    }
    logger()->debug("recommender: table sizes [{}]", join(sizes));
    if (files_) {
      const auto& info = files_->trainFile().indexInfo();
      logger()->info("recommender: {} training records in {} ({}, index {} {}), {} validation records{}",
                     files_->trainRecords(), files_->options().train_path, info.gzip ? "gzip" : "plain",
                     info.origin == datasets::CriteoIndexOrigin::kLoaded ? "loaded from" : "built into",
                     info.path.empty() ? std::string("memory") : info.path, files_->validationRecords(),
                     files_->options().shuffle ? ", shuffled in blocks of " + std::to_string(files_->options().shuffle_block)
                                               : ", in file order");
    }
  }
}

std::shared_ptr<RecsysModel> RecommenderTrainer::makeModel(const ModelBuild& build) {
  PTRAIN_CHECK(dataset_ || files_, "recommender trainer: buildModel() before setup()");
  return std::make_shared<RecsysModel>(config_, build);
}

std::optional<plan::MemoryEstimate> RecommenderTrainer::stageMemory(const plan::Layout& layout, int64_t stage) const {
  if (!dataset_ && !files_) return std::nullopt;
  return recsysStageMemory(config_, layout, embedding_optimizer_, pipeline_layout_, eval_size_, stage);
}

Batch RecommenderTrainer::globalBatch(int64_t step, int64_t globalBatchSize) {
  return batchRows(step, globalBatchSize, 0, globalBatchSize);
}

Batch RecommenderTrainer::batchRows(int64_t step, int64_t globalBatchSize, int64_t begin, int64_t end) {
  PTRAIN_CHECK(dataset_ || files_, "recommender trainer: batchRows() before setup()");
  // Sample i of step s is sample s * global + i of the training stream.
  if (files_) return files_->trainRows(step * globalBatchSize + begin, end - begin);
  return dataset_->batch(ClicksSplit::kTrain, step * globalBatchSize + begin, end - begin);
}

double RecommenderTrainer::tokensIn(const Batch& batch) const { return static_cast<double>(batch.size()); }

double RecommenderTrainer::trainFlops(double samples) const {
  if (!dataset_ && !files_) return 0;
  // Forward 2 FLOPs a multiply-add, backward twice the forward (Megatron's
  // convention; recomputation not counted).
  return samples * 6.0 * static_cast<double>(config_.forwardMultiplyAdds());
}

const datasets::ClicksBestScores& RecommenderTrainer::bestScores() {
  PTRAIN_CHECK(dataset_, "recommender trainer: bestScores() before setup()");
  if (!best_) best_ = dataset_->bestValidationScores();
  return *best_;
}

std::map<std::string, double> RecommenderTrainer::evaluateModel(RecsysModel& net, const EvalContext& ctx) {
  PTRAIN_CHECK(dataset_ || files_, "recommender trainer: evaluate() before setup()");
  PTRAIN_CHECK(ctx.num_shards >= 1 && ctx.shard >= 0 && ctx.shard < ctx.num_shards, "recommender trainer: eval shard ",
               ctx.shard, " of ", ctx.num_shards);
  torch::NoGradGuard noGrad;
  if (eval_size_ == 0) return {};

  // From files: the first eval_size records of the validation file (all when it holds fewer).
  const int64_t n = files_ ? std::min(eval_size_, files_->validationRecords()) : eval_size_;
  if (n == 0) return {};
  const int64_t begin = n * ctx.shard / ctx.num_shards, end = n * (ctx.shard + 1) / ctx.num_shards;
  const int64_t tp = net.tpSize();
  // The same on every rank (the largest shard's, at most kEvalChunk),
  // rounded up to a multiple of tp.
  const int64_t largest = (n + ctx.num_shards - 1) / ctx.num_shards;
  const int64_t chunk = (std::min(kEvalChunk, largest) + tp - 1) / tp * tp;
  // Under expert parallelism the ranks exchange samples in every forward
  // pass: a rank out of samples runs the first chunk again, uncounted.
  int64_t chunks = (end - begin + chunk - 1) / chunk;
  if (net.forward_sync) {
    at::Tensor most = torch::full({1}, static_cast<double>(chunks), torch::TensorOptions(torch::kFloat64).device(ctx.device));
    AllreduceOptions opts;
    opts.op = ReduceOp::kMax;
    net.forward_sync->allreduce(most, opts)->wait();
    chunks = static_cast<int64_t>(most.item<double>());
  }
  // Row 0: probabilities, row 1: labels, each sample in its place; one sum
  // over the data-parallel ranks gives every rank all of them.
  at::Tensor scored = torch::zeros({2, n}, torch::TensorOptions(torch::kFloat64).device(ctx.device));
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t first = begin + k * chunk;
    const bool real = first < end;
    // Always a whole chunk (tp divides it); rows past `end` are not counted.
    Batch batch = (files_ ? files_->validationRows(real ? first : 0, chunk)
                          : dataset_->batch(ClicksSplit::kValidation, real ? first : 0, chunk))
                      .to(ctx.device);
    at::Tensor hidden = net.forwardHidden(batch);
    at::Tensor probs;
    if (net.holdsHead()) {
      probs = torch::sigmoid(net.logits(hidden)).to(torch::kFloat64);
    } else {
      probs = torch::zeros({chunk}, torch::TensorOptions(torch::kFloat64).device(ctx.device));
    }
    net.shareFromHead(probs);
    if (!real) continue;
    const int64_t used = std::min(chunk, end - first);
    scored[0].narrow(0, first, used).copy_(probs.narrow(0, 0, used));
    scored[1].narrow(0, first, used).copy_(batch.at("labels").narrow(0, 0, used).to(torch::kFloat64));
  }
  if (ctx.all_reduce_sum) ctx.all_reduce_sum(scored);
  scored = scored.cpu().contiguous();
  const double* p = scored.data_ptr<double>();
  const double* y = p + n;

  std::map<std::string, double> out;
  out["eval_logloss"] = datasets::logLoss(p, y, n);
  try {
    out["eval_auc"] = datasets::rocAuc(p, y, n);
  } catch (const std::invalid_argument&) {
    // One class only in a tiny evaluation set: AUC is not defined.
  }
  // Files have no hidden model, so no best_auc / best_logloss.
  if (!dataset_) return out;
  const datasets::ClicksBestScores& best = bestScores();
  out["best_auc"] = best.auc;
  out["best_logloss"] = best.logloss;
  if (term_fit_) fitTerms(scored[0], out);
  return out;
}

void RecommenderTrainer::fitTerms(const at::Tensor& probabilities, std::map<std::string, double>& out) {
  const int64_t n = probabilities.size(0);
  if (term_contributions_.size() != static_cast<size_t>(n * datasets::kClicksTerms)) {
    term_contributions_ = dataset_->termContributions(ClicksSplit::kValidation, 0, n);
  }
  // The model's logits, as the probabilities were rounded to float before.
  at::Tensor logits = torch::logit(probabilities.to(torch::kFloat64).cpu().clamp(1e-9, 1 - 1e-9)).contiguous();
  const datasets::ClicksTermFit fit =
      datasets::fitLogitsOnTerms(logits.data_ptr<double>(), term_contributions_, n);
  for (int k = 0; k < datasets::kClicksTerms; ++k) {
    out[std::string("fit_") + datasets::clicksTermKey(k)] = fit.coefficient[static_cast<size_t>(k)];
  }
  out["fit_r2"] = fit.r2;
}

TrainSummary RecommenderTrainer::train(TrainingSession& session) {
  RuntimeOptions options = session.runtimeOptions();
  if (embedding_optimizer_ != "none" && options.optimizer) {
    options.optimizer->sparse_name = embedding_optimizer_;
    options.optimizer->sparse_prefixes = {"embed.tables."};
    options.optimizer->sparse_lr = embedding_lr_;
    options.optimizer->sparse_weight_decay = embedding_weight_decay_;
  }
  if (session.isRankZero() && dataset_) {
    logger()->info("{}", datasets::clicksBestScoresLine(bestScores()));
    logger()->info("{}", datasets::clicksTermAblationLine(bestScores()));
  } else if (session.isRankZero()) {
    logger()->info("recommender: no ground-truth AUC or logloss for data from files (only the built-in clicks have "
                   "a hidden model); evaluation reports the model's eval_auc and eval_logloss");
  }
  return defaultTrainingLoop(session, *this, options);
}

nlohmann::json RecommenderTrainer::dataPosition(int64_t step, int64_t globalBatchSize) const {
  if (!files_) return nullptr;
  return files_->position(step * globalBatchSize);
}

std::optional<std::string> RecommenderTrainer::checkDataPosition(const nlohmann::json& saved, int64_t step,
                                                                 int64_t globalBatchSize) const {
  if (!files_) {
    if (!saved.is_null()) {
      return std::string("the checkpoint's run read files (data.name: criteo), this one the built-in clicks: "
                         "resuming would not continue the same samples; start a new run with checkpoint.load");
    }
    return std::nullopt;
  }
  if (auto why = files_->differs(saved)) return why;
  const int64_t consumed = step * globalBatchSize;
  if (saved.value("consumed_samples", consumed) != consumed) {
    return "the checkpoint consumed " + std::to_string(saved.value("consumed_samples", int64_t{0})) +
           " samples but step " + std::to_string(step) + " x global batch " + std::to_string(globalBatchSize) +
           " is " + std::to_string(consumed) + " (train.global_batch_size changed): resuming would not continue "
           "where it stopped; set it back, or start a new run with checkpoint.load";
  }
  return std::nullopt;
}

void RecommenderTrainer::exportData(const std::string& name, const std::string& out, int64_t train,
                                    int64_t validation) const {
  if (name != "clicks") Trainer::exportData(name, out, train, validation);
  if (!dataset_) {
    throw ConfigError("ptrain data export clicks: the recipe reads files (data.name: criteo); export with the "
                      "recipe of the built-in clicks (data.name: clicks) whose samples you want");
  }
  const int64_t trainSamples = train > 0 ? train : default_export_samples_;
  const int64_t validationSamples = validation > 0 ? validation : eval_size_;
  const std::string validationOut = validationPathFor(out);
  std::vector<std::pair<std::string, int64_t>> outputs = {{out, trainSamples}};
  if (validationSamples > 0) outputs.emplace_back(validationOut, validationSamples);
  for (const auto& [path, n] : outputs) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      throw ConfigError(path + ": exists; ptrain data export never overwrites a file: remove it, or choose another "
                               "OUT (the validation file is OUT with \"train\" replaced by \"validation\", or "
                               "BASE.validation.tsv[.gz])");
    }
  }
  const bool gzip = out.size() > 3 && out.compare(out.size() - 3, 3, ".gz") == 0;
  // OUT's folder, as `ptrain data prepare` makes its own (data/clicks_train.tsv.gz).
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  std::error_code made;
  if (!parent.empty()) std::filesystem::create_directories(parent, made);
  std::vector<uintmax_t> bytes;
  for (size_t f = 0; f < outputs.size(); ++f) {
    datasets::CriteoWriterOptions o;
    o.gzip = gzip;
    o.history_length = config_.history_length;
    datasets::CriteoWriter writer(outputs[f].first, o);
    const ClicksSplit split = f == 0 ? ClicksSplit::kTrain : ClicksSplit::kValidation;
    for (int64_t i = 0; i < outputs[f].second; ++i) writer.writeSample(dataset_->sample(split, i));
    writer.commit();
    bytes.push_back(std::filesystem::file_size(outputs[f].first));
  }
  std::string line = "clicks: " + std::to_string(trainSamples) + " training samples to " + out + " (" +
                     std::to_string(bytes[0]) + " bytes)";
  if (outputs.size() > 1) {
    line += ", " + std::to_string(validationSamples) + " validation samples to " + validationOut + " (" +
            std::to_string(bytes[1]) + " bytes)";
  } else {
    line += ", no validation samples (data.eval_size is 0)";
  }
  std::printf("%s\n", (line + "; Criteo TSV with " + std::to_string(config_.history_length) +
                        " history columns").c_str());
  std::fflush(stdout);
}

}  // namespace ptrain::recommender
