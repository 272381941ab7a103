#include "recsys_model.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/nn/parameter_seed.h"
#include "ptrain/nn/tp_comm.h"

namespace ptrain::recommender {

namespace {

// Table names as parameter-name components: the clicks data set's roles
// where a feature has one, c<t> otherwise.
std::string tableName(const RecsysConfig& c, int64_t t) {
  if (t == 0) return "user";
  if (t == c.item_feature) return "item";
  if (t == c.category_feature) return "category";
  if (t == c.interest_feature) return "interest";
  return "c" + std::to_string(t);
}

torch::nn::Sequential mlp(int64_t in, const std::vector<int64_t>& widths, int64_t last, bool reluAfterLast) {
  torch::nn::Sequential seq;
  int64_t width = in;
  for (int64_t w : widths) {
    seq->push_back(torch::nn::Linear(width, w));
    seq->push_back(torch::nn::ReLU());
    width = w;
  }
  if (last > 0) {
    seq->push_back(torch::nn::Linear(width, last));
    if (reluAfterLast) seq->push_back(torch::nn::ReLU());
  }
  return seq;
}

int64_t mlpParameters(int64_t in, const std::vector<int64_t>& widths, int64_t last) {
  int64_t n = 0, width = in;
  for (int64_t w : widths) {
    n += width * w + w;
    width = w;
  }
  if (last > 0) n += width * last + last;
  return n;
}

}  // namespace

nn::EmbeddingTablesOptions RecsysConfig::tableOptions(uint64_t seed) const {
  nn::EmbeddingTablesOptions o;
  for (size_t t = 0; t < table_sizes.size(); ++t) {
    o.tables.push_back({tableName(*this, static_cast<int64_t>(t)), table_sizes[t]});
  }
  o.dim = dim;
  o.row_wise_threshold = row_wise_threshold;
  o.table_wise_slots = table_wise_slots;
  o.row_multiple = row_multiple;
  o.seed = seed;
  return o;
}

// The bottom MLP and the interaction's first-order vector.
int64_t RecsysConfig::bottomParameters() const { return mlpParameters(kDenseFeatures, bottom_mlp, dim) + dim; }

int64_t RecsysConfig::attentionParameters() const { return mlpParameters(3 * dim, {attention_hidden}, 1); }

int64_t RecsysConfig::expertBlockParameters(bool expertsOnly) const {
  const int64_t pairs = kInteractionVectors * (kInteractionVectors - 1) / 2;
  const int64_t projIn = (dim + pairs) + 4 * dim;
  const int64_t experts = std::max<int64_t>(1, num_experts) * (hidden * ffn + ffn + ffn * hidden + hidden);
  if (expertsOnly) return num_experts > 0 ? experts : 0;
  return projIn * hidden + hidden + experts + (num_experts > 0 ? num_experts * hidden : 0);
}

int64_t RecsysConfig::topParameters() const { return mlpParameters(hidden, top_mlp, 1); }

int64_t RecsysConfig::forwardMultiplyAdds() const {
  // A linear layer's multiply-adds per row are its weights, so the MLPs'
  // parameter counts less their biases.
  auto mlpMacs = [](int64_t in, const std::vector<int64_t>& widths, int64_t last) {
    int64_t n = 0, width = in;
    for (int64_t w : widths) {
      n += width * w;
      width = w;
    }
    return last > 0 ? n + width * last : n;
  };
  const int64_t pairs = kInteractionVectors * (kInteractionVectors - 1) / 2;
  const int64_t bottom = mlpMacs(kDenseFeatures, bottom_mlp, dim);
  const int64_t interaction = pairs * dim;
  const int64_t attention = history_length * (mlpMacs(3 * dim, {attention_hidden}, 1) + dim);
  const int64_t projection = (dim + pairs + 4 * dim) * hidden;
  const int64_t expertMlp = hidden * ffn + ffn * hidden;
  const int64_t experts = num_experts > 0 ? hidden * num_experts + moe.topk * expertMlp : expertMlp;
  const int64_t top = mlpMacs(hidden, top_mlp, 1);
  return bottom + interaction + attention + projection + experts + top;
}

RecsysPacking::RecsysPacking(const RecsysConfig& c)
    : dim(c.dim), history_length(c.history_length), hidden(c.hidden) {
  interaction_size = c.dim + kInteractionVectors * (kInteractionVectors - 1) / 2;
  int64_t at = 0;
  interaction = at;
  at += interaction_size;
  target = at;
  at += c.dim;
  category = at;
  at += c.dim;
  interest = at;
  at += c.dim;
  history = at;
  at += c.history_length * c.dim;
  mask = at;
  at += c.history_length;
  attention = at;
  at += c.dim;
  experts = at;
  at += c.hidden;
  width = at;
}

at::Tensor pairwiseDots(const at::Tensor& vectors) {
  const int64_t v = vectors.size(1);
  at::Tensor gram = torch::bmm(vectors, vectors.transpose(1, 2));  // [B, V, V]
  at::Tensor index = torch::triu_indices(v, v, 1, torch::TensorOptions(torch::kInt64).device(vectors.device()));
  // Row-major upper triangle as one gather over the flattened Gram matrix.
  at::Tensor flat = index[0] * v + index[1];
  return gram.reshape({gram.size(0), v * v}).index_select(1, flat);
}

RecsysModuleImpl::RecsysModuleImpl(const RecsysConfig& c, const ModelBuild& build, uint64_t baseSeed) {
  // Registration order is the parameter order: embed, blocks, head.
  embed = register_module("embed", std::make_shared<torch::nn::Module>());
  if (build.embed) {
    tables = embed->register_module("tables", nn::EmbeddingTables(c.tableOptions(baseSeed)));
    bottom = embed->register_module("bottom", mlp(kDenseFeatures, c.bottom_mlp, c.dim, true));
    first_order = embed->register_parameter("first_order", torch::empty({1, c.dim}));
  }
  blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
  if (build.buildsBlock(0)) {
    attn = blocks->register_module("0", std::make_shared<torch::nn::Module>());
    attn_fc1 = attn->register_module("fc1", torch::nn::Linear(3 * c.dim, c.attention_hidden));
    attn_fc2 = attn->register_module("fc2", torch::nn::Linear(c.attention_hidden, 1));
  }
  if (build.buildsBlock(1)) {
    mix = blocks->register_module("1", std::make_shared<torch::nn::Module>());
    const RecsysPacking p(c);
    proj = mix->register_module("proj", torch::nn::Linear(p.interaction_size + 4 * c.dim, c.hidden));
    if (c.num_experts > 0) {
      nn::MoeConfig m = c.moe;
      m.num_experts = c.num_experts;
      m.hidden_size = c.hidden;
      m.ffn_hidden_size = c.ffn;
      m.layer_number = 1;
      moe = mix->register_module("moe", nn::MoeLayer(m));
    } else {
      auto ffn = mix->register_module("ffn", std::make_shared<torch::nn::Module>());
      ffn_fc1 = ffn->register_module("fc1", torch::nn::Linear(c.hidden, c.ffn));
      ffn_fc2 = ffn->register_module("fc2", torch::nn::Linear(c.ffn, c.hidden));
    }
  }
  if (build.head) {
    head = register_module("head", std::make_shared<torch::nn::Module>());
    top = head->register_module("top", mlp(c.hidden, c.top_mlp, 0, false));
    const int64_t last = c.top_mlp.empty() ? c.hidden : c.top_mlp.back();
    out = head->register_module("out", torch::nn::Linear(last, 1));
  }
}

RecsysModel::RecsysModel(const RecsysConfig& config, const ModelBuild& build)
    : config_(config), packing_(config) {
  const RecsysConfig& c = config_;
  PTRAIN_CHECK_AS(ConfigError, static_cast<int64_t>(c.table_sizes.size()) == kSparseFeatures, "recommender: ",
                  c.table_sizes.size(), " table sizes; the clicks data have ", kSparseFeatures, " sparse features");
  PTRAIN_CHECK_AS(ConfigError, c.dim >= 1 && c.hidden >= 1 && c.ffn >= 1 && c.attention_hidden >= 1 &&
                                   c.history_length >= 1,
                  "recommender: embedding_dim, hidden_size, ffn_hidden_size, attention_hidden and the history length "
                  "must be >= 1");
  base_seed_ = nn::modelSeed();
  root_ = RecsysModule(c, build, base_seed_);
  initialiseParameters();
  // A step's table gradients are zero outside the rows it looked up: data
  // parallelism exchanges those rows instead of all-reducing the tables.
  for (const auto& item : root_->named_parameters()) {
    if (item.key().rfind("embed.tables.", 0) == 0) placement.edit(item.key()).row_sparse_gradient = true;
  }
}

RecsysModel::~RecsysModel() = default;

std::optional<nn::ParameterInit> RecsysModel::parameterInit(const std::string& name,
                                                           const std::vector<int64_t>& fullSizes) const {
  const std::string tables = "embed.tables.";
  if (name.rfind(tables, 0) == 0) {
    if (!root_->tables) return std::nullopt;
    return root_->tables->parameterInit(name.substr(tables.size()));
  }
  if (text::endsWith(name, ".bias")) return nn::ParameterInit::constant(0.0);
  // [out, in], or [E, out, in] stacked over experts.
  const size_t dims = fullSizes.size();
  const double fanIn = static_cast<double>(fullSizes[dims - 1]);
  const double fanOut = static_cast<double>(dims >= 2 ? fullSizes[dims - 2] : 1);
  return nn::ParameterInit::normal(parameterSeed(base_seed_, name), 0.0, std::sqrt(2.0 / (fanIn + fanOut)));
}

torch::nn::Module& RecsysModel::module() { return *root_; }

int64_t RecsysModel::blockCost(int index) {
  return index == 0 ? config_.attentionParameters() : config_.expertBlockParameters();
}

std::string RecsysModel::blockPrefix(int index) const { return "blocks." + std::to_string(index) + "."; }
std::vector<std::string> RecsysModel::embedPrefixes() const { return {"embed."}; }
std::vector<std::string> RecsysModel::headPrefixes() const { return {"head."}; }

int RecsysModel::tpSize() const { return tp_ ? tp_->size : 1; }

at::Tensor RecsysModel::embed(const Batch& micro) {
  PTRAIN_CHECK(root_->tables, "recommender: embed() on a rank that did not build the tables");
  const RecsysConfig& c = config_;
  const at::Tensor sparse = micro.at("sparse");
  const at::Tensor history = micro.at("history");
  PTRAIN_CHECK(sparse.dim() == 2 && sparse.size(1) == kSparseFeatures, "recommender: sparse must be [B, 26], got ",
               sparse.sizes());
  PTRAIN_CHECK(history.dim() == 2 && history.size(1) == c.history_length, "recommender: history must be [B, ",
               c.history_length, "], got ", history.sizes());
  const int64_t b = sparse.size(0);

  // The 26 features and the history in one lookup (one all-reduce under tp).
  std::vector<nn::EmbeddingTablesImpl::Request> requests;
  requests.reserve(kSparseFeatures + 1);
  for (int64_t t = 0; t < kSparseFeatures; ++t) {
    nn::EmbeddingTablesImpl::Request r;
    r.table = t;
    r.ids = sparse.select(1, t);
    requests.push_back(r);
  }
  nn::EmbeddingTablesImpl::Request h;
  h.table = c.item_feature;
  h.ids = history;
  requests.push_back(h);
  std::vector<at::Tensor> found = root_->tables->lookups(requests);
  at::Tensor fields = torch::stack(std::vector<at::Tensor>(found.begin(), found.begin() + kSparseFeatures), 1);
  at::Tensor items = found.back();  // [B, H, d], zeros on padding

  at::Tensor z = root_->bottom->forward(micro.at("dense").to(fields.scalar_type()));  // [B, d]
  at::Tensor mask = micro.at("history_mask").to(fields.scalar_type());
  at::Tensor historyMean = items.sum(1) / mask.sum(1, true).clamp_min(1.0);
  at::Tensor u = root_->first_order.to(fields.scalar_type()).unsqueeze(0).expand({b, 1, c.dim});
  at::Tensor vectors = torch::cat({z.unsqueeze(1), fields, historyMean.unsqueeze(1), u}, 1);  // [B, 29, d]
  at::Tensor interaction = torch::cat({z, pairwiseDots(vectors)}, 1);

  at::Tensor zeros = torch::zeros({b, c.dim + c.hidden}, fields.options());
  return torch::cat({interaction, fields.select(1, c.item_feature), fields.select(1, c.category_feature),
                     fields.select(1, c.interest_feature), items.reshape({b, c.history_length * c.dim}), mask, zeros},
                    1);
}

at::Tensor RecsysModel::attention(const at::Tensor& hidden) {
  PTRAIN_CHECK(root_->attn, "recommender: block 0 is not built on this rank");
  const RecsysPacking& p = packing_;
  const int64_t b = hidden.size(0), hl = p.history_length, d = p.dim;
  at::Tensor target = hidden.narrow(1, p.target, d);
  at::Tensor items = hidden.narrow(1, p.history, hl * d).reshape({b, hl, d});
  at::Tensor mask = hidden.narrow(1, p.mask, hl);
  at::Tensor t = target.unsqueeze(1).expand({b, hl, d});
  at::Tensor unit = torch::cat({items, t, items * t}, 2);  // [B, H, 3d]
  at::Tensor scores = root_->attn_fc2(torch::relu(root_->attn_fc1(unit))).squeeze(2);  // [B, H]
  // Padding slots get no weight; a sample without history attends to nothing.
  scores = scores - (1 - mask) * 1e9;
  at::Tensor weights = torch::softmax(scores, 1) * mask;
  at::Tensor attended = (weights.unsqueeze(2) * items).sum(1);  // [B, d]
  return torch::cat({hidden.narrow(1, 0, p.attention), attended, hidden.narrow(1, p.experts, p.hidden)}, 1);
}

at::Tensor RecsysModel::mixture(const at::Tensor& hidden) {
  PTRAIN_CHECK(root_->mix, "recommender: block 1 is not built on this rank");
  const RecsysPacking& p = packing_;
  at::Tensor target = hidden.narrow(1, p.target, p.dim);
  at::Tensor attended = hidden.narrow(1, p.attention, p.dim);
  at::Tensor in = torch::cat({hidden.narrow(1, p.interaction, p.interaction_size), attended, attended * target,
                              hidden.narrow(1, p.category, p.dim), hidden.narrow(1, p.interest, p.dim)},
                             1);
  at::Tensor x = torch::relu(root_->proj(in));  // [B, h]
  at::Tensor y;
  if (root_->moe) {
    // Each tensor rank routes its share of the samples (as sequence
    // parallelism shares a sequence), then every rank gets all of them back.
    const bool split = tp_ && tp_->active();
    at::Tensor xs = split ? nn::scatterToSequenceParallelRegion(x, *tp_, 0) : x;
    at::Tensor ys = xs + root_->moe(xs);
    y = split ? nn::gatherFromSequenceParallelRegion(ys, *tp_, 0, /*outputGradIsPartial=*/false) : ys;
  } else {
    y = x + root_->ffn_fc2(torch::gelu(root_->ffn_fc1(x)));
  }
  return torch::cat({hidden.narrow(1, 0, p.experts), y}, 1);
}

at::Tensor RecsysModel::runBlock(int index, const at::Tensor& hidden) {
  PTRAIN_CHECK(hidden.dim() == 2 && hidden.size(1) == packing_.width, "recommender: hidden must be [B, ",
               packing_.width, "], got ", hidden.sizes());
  PTRAIN_CHECK(index == 0 || index == 1, "recommender: no block ", index);
  return index == 0 ? attention(hidden) : mixture(hidden);
}

at::Tensor RecsysModel::logits(const at::Tensor& hidden) {
  PTRAIN_CHECK(root_->top, "recommender: head on a rank that did not build it");
  at::Tensor y = hidden.narrow(1, packing_.experts, packing_.hidden);
  return root_->out(root_->top->forward(y)).squeeze(1).to(torch::kFloat32);
}

LossOutput RecsysModel::head(const at::Tensor& hidden, const Batch& micro) {
  at::Tensor z = logits(hidden);
  const at::Tensor labels = micro.at("labels").to(z.device(), torch::kFloat32);
  LossOutput loss;
  loss.loss_sum = torch::binary_cross_entropy_with_logits(z, labels, {}, {}, at::Reduction::Sum);
  loss.count = static_cast<double>(z.size(0));
  return loss;
}

TensorParallelPlan RecsysModel::tensorParallelPlan() {
  TensorParallelPlan plan;
  if (root_->tables) plan.layers.emplace_back("embed.tables.", root_->tables.get());
  // The router acts on this rank's share of the samples only.
  if (root_->moe) plan.sequence_parallel_params.push_back("blocks.1.moe.router.weight");
  return plan;
}

void RecsysModel::setTensorParallel(std::shared_ptr<const nn::TensorParallelState> state) {
  // Without sequence parallelism the tensor plugin would not sum the
  // router's partial gradients.
  PTRAIN_CHECK_AS(ConfigError, !(root_->moe && state && state->active() && !state->sequence_parallel),
                  "recommender: experts under tensor_model_parallel_size=", state ? state->size : 1,
                  " need parallel.sequence_parallel: true (the samples are split over the tensor ranks around the "
                  "MoE layer)");
  tp_ = std::move(state);
}

std::vector<std::pair<std::string, nn::MoeLayerImpl*>> RecsysModel::moeLayers() {
  if (!root_->moe) return {};
  return {{"blocks.1.moe.", root_->moe.get()}};
}

}  // namespace ptrain::recommender
