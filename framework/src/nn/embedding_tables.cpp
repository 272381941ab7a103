#include "ptrain/nn/embedding_tables.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "ptrain/nn/parameter_seed.h"
#include "ptrain/nn/deferred_init.h"

namespace ptrain::nn {
namespace {

bool validTableName(const std::string& name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

int64_t roundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

double boundOf(const EmbeddingTablesOptions& o, int64_t rows) {
  return o.init_bound > 0 ? o.init_bound : std::sqrt(1.0 / static_cast<double>(rows));
}

}  // namespace

const char* toString(TableSharding sharding) {
  return sharding == TableSharding::kRowWise ? "row-wise" : "table-wise";
}

EmbeddingShardingPlan EmbeddingShardingPlan::of(const EmbeddingTablesOptions& o) {
  PTRAIN_CHECK_AS(ConfigError, !o.tables.empty(), "embedding tables: no table");
  PTRAIN_CHECK_AS(ConfigError, o.dim >= 1, "embedding tables: dim ", o.dim, " must be at least 1");
  PTRAIN_CHECK_AS(ConfigError, o.row_wise_threshold >= 0, "embedding tables: row_wise_threshold ",
                  o.row_wise_threshold, " must be at least 0");
  PTRAIN_CHECK_AS(ConfigError, o.table_wise_slots >= 1, "embedding tables: table_wise_slots ", o.table_wise_slots,
                  " must be at least 1");
  PTRAIN_CHECK_AS(ConfigError, o.row_multiple >= 1, "embedding tables: row_multiple ", o.row_multiple,
                  " must be at least 1");
  PTRAIN_CHECK_AS(ConfigError, o.init_bound >= 0, "embedding tables: init_bound ", o.init_bound,
                  " must be at least 0");
  std::set<std::string> names;
  for (size_t t = 0; t < o.tables.size(); ++t) {
    const auto& spec = o.tables[t];
    PTRAIN_CHECK_AS(ConfigError, validTableName(spec.name), "embedding tables: table ", t, " is named '", spec.name,
                    "'; use letters, digits and '_'");
    PTRAIN_CHECK_AS(ConfigError, names.insert(spec.name).second, "embedding tables: two tables are named '",
                    spec.name, "'");
    PTRAIN_CHECK_AS(ConfigError, spec.rows >= 1, "embedding tables: table '", spec.name, "' has ", spec.rows,
                    " rows; every table needs at least 1");
  }

  EmbeddingShardingPlan plan;
  plan.slots = o.table_wise_slots;
  plan.tables.resize(o.tables.size());
  plan.padded_rows.resize(o.tables.size());
  std::vector<size_t> small;
  for (size_t t = 0; t < o.tables.size(); ++t) {
    TableLocation& loc = plan.tables[t];
    loc.rows = o.tables[t].rows;
    if (loc.rows >= o.row_wise_threshold) {
      loc.sharding = TableSharding::kRowWise;
      loc.parameter = "row_wise." + o.tables[t].name;
      plan.padded_rows[t] = roundUp(loc.rows, o.row_multiple);
    } else {
      loc.sharding = TableSharding::kTableWise;
      loc.parameter = "table_wise";
      plan.padded_rows[t] = loc.rows;
      small.push_back(t);
    }
  }
  // Largest first into the emptiest slot (the lower on a tie): a few percent
  // from even for the sizes recommenders have, and a pure function of the
  // options.
  std::stable_sort(small.begin(), small.end(),
                   [&](size_t a, size_t b) { return o.tables[a].rows > o.tables[b].rows; });
  std::vector<int64_t> fill(static_cast<size_t>(plan.slots), 0);
  std::vector<std::vector<size_t>> members(static_cast<size_t>(plan.slots));
  for (size_t t : small) {
    const size_t s = static_cast<size_t>(std::min_element(fill.begin(), fill.end()) - fill.begin());
    plan.tables[t].slot = static_cast<int64_t>(s);
    members[s].push_back(t);
    fill[s] += o.tables[t].rows;
  }
  plan.slot_rows = small.empty() ? 0 : *std::max_element(fill.begin(), fill.end());
  for (size_t s = 0; s < members.size(); ++s) {
    int64_t offset = static_cast<int64_t>(s) * plan.slot_rows;
    for (size_t t : members[s]) {
      plan.tables[t].first_row = offset;
      offset += o.tables[t].rows;
    }
  }
  return plan;
}

int EmbeddingShardingPlan::ownerOf(size_t table, int tpSize) const {
  const TableLocation& loc = tables.at(table);
  if (loc.sharding == TableSharding::kRowWise) return -1;
  PTRAIN_CHECK_AS(ConfigError, tpSize >= 1 && slots % tpSize == 0,
                  "embedding tables: parallel.tensor_model_parallel_size ", tpSize,
                  " does not divide table_wise_slots ", slots);
  return static_cast<int>(loc.slot / (slots / tpSize));
}

void checkEmbeddingTablesTensorParallel(const EmbeddingTablesOptions& o, int tpSize) {
  const EmbeddingShardingPlan plan = EmbeddingShardingPlan::of(o);
  PTRAIN_CHECK_AS(ConfigError, tpSize >= 1, "embedding tables: tensor-parallel size ", tpSize);
  if (tpSize == 1) return;
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    if (plan.tables[t].sharding != TableSharding::kRowWise) continue;
    const int64_t rows = plan.padded_rows[t];
    PTRAIN_CHECK_AS(ConfigError, rows >= tpSize && rows % tpSize == 0, "embedding table '", o.tables[t].name,
                    "' is row-wise with ", rows, " rows", rows != o.tables[t].rows ? " (padded)" : "",
                    ", which parallel.tensor_model_parallel_size ", tpSize,
                    " does not split into equal ranges; pad its rows to a multiple of ", tpSize,
                    " (row_multiple) or place it whole on one rank (a row_wise_threshold above ", o.tables[t].rows,
                    ")");
  }
  if (plan.hasTableWise()) {
    PTRAIN_CHECK_AS(ConfigError, plan.slots % tpSize == 0, "embedding tables: parallel.tensor_model_parallel_size ",
                    tpSize, " does not divide table_wise_slots ", plan.slots,
                    ", so the table-wise tables cannot be shared out; use a slot count that ", tpSize, " divides");
  }
}

int64_t embeddingParametersPerRank(const EmbeddingTablesOptions& o, int tpSize) {
  checkEmbeddingTablesTensorParallel(o, tpSize);
  const EmbeddingShardingPlan plan = EmbeddingShardingPlan::of(o);
  int64_t rows = plan.slots / tpSize * plan.slot_rows;
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    if (plan.tables[t].sharding == TableSharding::kRowWise) rows += plan.padded_rows[t] / tpSize;
  }
  return rows * o.dim;
}

std::vector<std::string> describeEmbeddingSharding(const EmbeddingTablesOptions& o, int tpSize) {
  checkEmbeddingTablesTensorParallel(o, tpSize);
  const EmbeddingShardingPlan plan = EmbeddingShardingPlan::of(o);
  std::vector<std::string> lines;
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    const TableLocation& loc = plan.tables[t];
    if (loc.sharding == TableSharding::kRowWise) {
      lines.push_back(detail::concat(o.tables[t].name, ": row-wise, ", loc.rows, " rows, ",
                                     plan.padded_rows[t] / tpSize, " per rank"));
    } else {
      lines.push_back(detail::concat(o.tables[t].name, ": table-wise, ", loc.rows, " rows, slot ", loc.slot,
                                     " on rank ", plan.ownerOf(t, tpSize)));
    }
  }
  return lines;
}

void fillEmbeddingRows(at::Tensor& out, uint64_t tableSeed, int64_t firstRow, double bound) {
  PTRAIN_CHECK(out.dim() == 2 && out.is_contiguous() && out.is_cpu(),
               "fillEmbeddingRows: needs a contiguous 2-d host tensor");
  PTRAIN_CHECK(out.scalar_type() == at::kFloat || out.scalar_type() == at::kDouble,
               "fillEmbeddingRows: float32 or float64, not ", out.scalar_type());
  const int64_t rows = out.size(0);
  const int64_t dim = out.size(1);
  const bool isFloat = out.scalar_type() == at::kFloat;
  float* f = isFloat ? out.data_ptr<float>() : nullptr;
  double* d = isFloat ? nullptr : out.data_ptr<double>();
  // One hash per value: a row's values do not depend on which rows a rank
  // builds, nor on the thread that draws them.
  at::parallel_for(0, rows, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint64_t rowKey = static_cast<uint64_t>(firstRow + r) * static_cast<uint64_t>(dim);
      for (int64_t c = 0; c < dim; ++c) {
        const uint64_t z = splitmix64(tableSeed + (rowKey + static_cast<uint64_t>(c) + 1) * 0x9E3779B97F4A7C15ULL);
        const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
        const double v = bound * (2.0 * u - 1.0);
        if (isFloat) {
          f[r * dim + c] = static_cast<float>(v);
        } else {
          d[r * dim + c] = v;
        }
      }
    }
  });
}

EmbeddingTablesImpl::EmbeddingTablesImpl(EmbeddingTablesOptions options)
    : options_(std::move(options)), plan_(EmbeddingShardingPlan::of(options_)) {
  const int count = options_.shard_count;
  PTRAIN_CHECK_AS(ConfigError, count >= 1 && options_.shard_rank >= 0 && options_.shard_rank < count,
                  "embedding tables: shard ", options_.shard_rank, " of ", count);
  checkEmbeddingTablesTensorParallel(options_, count);
  torch::NoGradGuard noGrad;
  const int64_t dim = options_.dim;
  const int64_t rank = options_.shard_rank;
  // Under a DeferredInit (a runtime's build) the tables come without storage
  // and the runtime draws this rank's rows with parameterInit; otherwise the
  // module draws the rows it holds (all, or shard_rank's of shard_count).
  const bool deferred = count == 1 && DeferredInit::active();
  auto build = [&](const std::string& local, int64_t fullRows) {
    const int64_t rows = fullRows / count;
    if (deferred) return deferredTensor({fullRows, dim});
    at::Tensor weight = torch::empty({rows, dim});
    fillRows(local, weight, rank * rows);
    return weight;
  };
  row_wise.resize(options_.tables.size());
  std::shared_ptr<torch::nn::Module> rowWise;
  if (plan_.hasTableWise()) table_wise = register_parameter("table_wise", build("table_wise", plan_.slots * plan_.slot_rows));
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    const TableLocation& loc = plan_.tables[t];
    if (loc.sharding != TableSharding::kRowWise) continue;
    if (!rowWise) rowWise = register_module("row_wise", std::make_shared<torch::nn::Module>());
    row_wise[t] = rowWise->register_parameter(options_.tables[t].name, build(loc.parameter, plan_.padded_rows[t]));
  }
}

void EmbeddingTablesImpl::fillRows(const std::string& local, at::Tensor& rows, int64_t firstRow) const {
  PTRAIN_CHECK(rows.dim() == 2 && rows.size(1) == options_.dim, "embedding tables: rows of ", local,
               " must be [n, ", options_.dim, "], got ", rows.sizes());
  rows.zero_();  // padding, and the pack's rows no table uses
  const int64_t end = firstRow + rows.size(0);
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    const auto& spec = options_.tables[t];
    const TableLocation& loc = plan_.tables[t];
    if (loc.parameter != local) continue;
    // The table's rows in the parameter, cut to the block asked for.
    const int64_t from = std::max(firstRow, loc.first_row), to = std::min(end, loc.first_row + spec.rows);
    if (from >= to) continue;
    at::Tensor part = rows.narrow(0, from - firstRow, to - from);
    fillEmbeddingRows(part, parameterSeed(options_.seed, spec.name), from - loc.first_row, boundOf(options_, spec.rows));
  }
}

ParameterInit EmbeddingTablesImpl::parameterInit(const std::string& local) const {
  return ParameterInit::custom([this, local](at::Tensor& shard, const std::vector<int64_t>& offsets) {
    PTRAIN_CHECK(shard.dim() == 2 && offsets.size() == 2 && offsets[1] == 0 && shard.size(1) == options_.dim,
                 "embedding tables: ", local, " is split by rows only");
    fillRows(local, shard, offsets[0]);
  });
}

EmbeddingTablesImpl::~EmbeddingTablesImpl() = default;

std::vector<std::pair<std::string, int>> EmbeddingTablesImpl::splitParameters() const {
  std::vector<std::pair<std::string, int>> out;
  if (options_.shard_count > 1) return out;  // built sharded: builtShards() says what
  for (size_t t = 0; t < plan_.tables.size(); ++t) {
    if (plan_.tables[t].sharding == TableSharding::kRowWise) out.emplace_back(plan_.tables[t].parameter, 0);
  }
  if (plan_.hasTableWise()) out.emplace_back("table_wise", 0);
  return out;
}

std::vector<TensorParallelSplit> EmbeddingTablesImpl::builtShards() const {
  std::vector<TensorParallelSplit> out;
  if (options_.shard_count <= 1) return out;
  for (size_t t = 0; t < plan_.tables.size(); ++t) {
    if (plan_.tables[t].sharding == TableSharding::kRowWise) {
      out.push_back(TensorParallelSplit{plan_.tables[t].parameter, 0, plan_.padded_rows[t]});
    }
  }
  if (plan_.hasTableWise()) out.push_back(TensorParallelSplit{"table_wise", 0, plan_.slots * plan_.slot_rows});
  return out;
}

int64_t EmbeddingTablesImpl::tableIndex(const std::string& name) const {
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    if (options_.tables[t].name == name) return static_cast<int64_t>(t);
  }
  throw ConfigError("embedding tables: no table named '" + name + "'");
}

at::Tensor EmbeddingTablesImpl::tableFromFull(const std::string& name,
                                              const std::map<std::string, at::Tensor>& fullParameters,
                                              const std::string& prefix) const {
  const TableLocation& loc = plan_.tables[static_cast<size_t>(tableIndex(name))];
  auto it = fullParameters.find(prefix + loc.parameter);
  if (it == fullParameters.end()) {
    throw CheckpointError("no parameter '" + prefix + loc.parameter + "' holding embedding table '" + name + "'");
  }
  const at::Tensor& full = it->second;
  if (full.dim() != 2 || full.size(0) < loc.first_row + loc.rows || full.size(1) != options_.dim) {
    throw CheckpointError(detail::concat("parameter '", prefix, loc.parameter,
                                         "' is too small to hold embedding table '", name, "' (rows ", loc.first_row,
                                         "..", loc.first_row + loc.rows, ", width ", options_.dim, ")"));
  }
  return full.narrow(0, loc.first_row, loc.rows);
}

std::vector<at::Tensor> EmbeddingTablesImpl::partials(const std::vector<Request>& requests) {
  // What each request reads: a parameter and the rows in it.
  struct Read {
    at::Tensor weight;   // undefined: another rank owns the table (zeros)
    at::Tensor local;    // ids as rows of `weight`, outside ids at row 0
    at::Tensor outside;  // ids this rank does not hold
    std::vector<int64_t> shape;  // of the result
  };
  std::vector<Read> reads(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    const size_t t = static_cast<size_t>(r.table);
    const TableLocation& loc = plan_.tables[t];
    const at::Tensor& ids = r.ids;
    PTRAIN_CHECK(!r.pooled || ids.dim() == 2, "embedding table '", options_.tables[t].name,
                 "': pooled ids must be [batch, bag], not ", ids.sizes());
    Read& read = reads[i];
    read.shape = ids.sizes().vec();
    if (r.pooled) read.shape.pop_back();
    read.shape.push_back(options_.dim);
    at::Tensor inside;  // ids this rank holds
    if (loc.sharding == TableSharding::kRowWise) {
      read.weight = row_wise[t];
      const int64_t rows = read.weight.size(0);
      PTRAIN_CHECK(rows * tpSize() == plan_.padded_rows[t], "embedding table '", options_.tables[t].name, "' holds ",
                   rows, " rows at tp ", tpSize(), ", not ", plan_.padded_rows[t], " / ", tpSize());
      const int64_t start = static_cast<int64_t>(tpRank()) * rows;
      inside = (ids >= start).logical_and(ids < start + rows);
      read.local = ids - start;
    } else {
      const int owner = plan_.ownerOf(t, tpSize());
      if (owner != tpRank()) continue;
      read.weight = table_wise;
      const int64_t perRank = plan_.slots / tpSize();
      PTRAIN_CHECK(read.weight.size(0) == perRank * plan_.slot_rows, "embedding tables: the table-wise pack holds ",
                   read.weight.size(0), " rows at tp ", tpSize(), ", not ", perRank * plan_.slot_rows);
      // The pack's rows from this rank's first slot on.
      const int64_t base = loc.first_row - static_cast<int64_t>(owner) * perRank * plan_.slot_rows;
      inside = ids >= 0;
      read.local = ids + base;
    }
    // Ids elsewhere look up row 0 and are zeroed, so their gradient is zero too.
    read.outside = inside.logical_not();
    read.local = read.local.masked_fill(read.outside, 0);
  }

  // One embedding call per parameter, over every request's ids for it.
  std::vector<at::Tensor> rowsOf(requests.size());
  std::vector<bool> done(requests.size(), false);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (done[i] || !reads[i].weight.defined()) continue;
    std::vector<size_t> group;
    std::vector<at::Tensor> ids;
    for (size_t j = i; j < requests.size(); ++j) {
      if (!done[j] && reads[j].weight.defined() && reads[j].weight.is_same(reads[i].weight)) {
        group.push_back(j);
        ids.push_back(reads[j].local.reshape({-1}));
        done[j] = true;
      }
    }
    at::Tensor rows = torch::embedding(reads[i].weight, group.size() == 1 ? ids[0] : torch::cat(ids));
    int64_t offset = 0;
    for (size_t j : group) {
      const int64_t n = reads[j].local.numel();
      std::vector<int64_t> shape = reads[j].local.sizes().vec();
      shape.push_back(options_.dim);
      rowsOf[j] = rows.narrow(0, offset, n).view(shape);
      offset += n;
    }
  }

  std::vector<at::Tensor> out;
  out.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    const Read& read = reads[i];
    if (!read.weight.defined()) {
      out.push_back(torch::zeros(read.shape, table_wise.options()));
      continue;
    }
    at::Tensor rows = rowsOf[i].masked_fill(read.outside.unsqueeze(-1), 0.0);
    if (!r.pooled) {
      out.push_back(rows);
      continue;
    }
    at::Tensor sum = rows.sum(1);
    if (r.pooling == Pooling::kSum) {
      out.push_back(sum);
      continue;
    }
    // Counted from the ids, the same on every rank.
    at::Tensor count = (r.ids >= 0).sum(1, /*keepdim=*/true).clamp_min(1).to(sum.scalar_type());
    out.push_back(sum / count);
  }
  return out;
}

void EmbeddingTablesImpl::checkIds(const std::vector<Request>& requests) const {
  // Every request's smallest and largest id, brought to the host at once (one
  // device synchronisation per call).
  std::vector<at::Tensor> bounds;
  std::vector<size_t> which;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    PTRAIN_CHECK(r.table >= 0 && r.table < numTables(), "embedding tables: no table ", r.table, " of ", numTables());
    PTRAIN_CHECK(r.ids.scalar_type() == at::kLong, "embedding table '", options_.tables[r.table].name,
                 "': ids must be int64");
    if (r.ids.numel() == 0) continue;
    auto [lo, hi] = at::aminmax(r.ids);
    bounds.push_back(lo.reshape({1}));
    bounds.push_back(hi.reshape({1}));
    which.push_back(i);
  }
  if (bounds.empty()) return;
  const at::Tensor host = torch::cat(bounds).cpu();
  const int64_t* v = host.data_ptr<int64_t>();
  for (size_t k = 0; k < which.size(); ++k) {
    const auto& spec = options_.tables[static_cast<size_t>(requests[which[k]].table)];
    const int64_t lo = v[2 * k], hi = v[2 * k + 1];
    PTRAIN_CHECK(lo >= -1 && hi < spec.rows, "embedding table '", spec.name, "' has ", spec.rows, " rows; ids from ",
                 lo, " to ", hi, " (-1 is the only id allowed below 0)");
  }
}

std::vector<at::Tensor> EmbeddingTablesImpl::lookups(const std::vector<Request>& requests) {
  if (parallel()) checkEmbeddingTablesTensorParallel(options_, tpSize());
  PTRAIN_CHECK(options_.shard_count == 1 || (tpSize() == options_.shard_count && tpRank() == options_.shard_rank),
               "embedding tables built for tensor-parallel rank ", options_.shard_rank, " of ", options_.shard_count,
               " run as rank ", tpRank(), " of ", tpSize());
  checkIds(requests);
  std::vector<at::Tensor> parts = partials(requests);
  if (!parallel() || parts.empty()) return parts;
  // One all-reduce for every request: flattened, concatenated, split again.
  std::vector<at::Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  at::Tensor summed = reduceFromTpRegion(torch::cat(flat), *tp_);
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (const auto& p : parts) {
    out.push_back(summed.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

at::Tensor EmbeddingTablesImpl::forward(const at::Tensor& ids) {
  PTRAIN_CHECK(ids.dim() == 2 && ids.size(1) == numTables(), "embedding tables: ids must be [batch, ", numTables(),
               "], not ", ids.sizes());
  std::vector<Request> requests;
  for (int64_t t = 0; t < numTables(); ++t) requests.push_back(Request{t, ids.select(1, t), false, Pooling::kSum});
  return torch::stack(lookups(requests), 1);
}

at::Tensor EmbeddingTablesImpl::lookup(int64_t table, const at::Tensor& ids) {
  return lookups({Request{table, ids, false, Pooling::kSum}})[0];
}

at::Tensor EmbeddingTablesImpl::pooled(int64_t table, const at::Tensor& ids, Pooling pooling) {
  return lookups({Request{table, ids, true, pooling}})[0];
}

}  // namespace ptrain::nn
