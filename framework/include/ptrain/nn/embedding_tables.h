// Embedding tables of a recommender, sharded over the tensor-parallel group
// and placed per table by size (TorchRec's planner, simplified; see
// docs/embedding_tables.md):
//
//   row-wise    a table of at least `row_wise_threshold` rows is split into tp
//               contiguous row ranges, one per rank (VocabParallelEmbedding's
//               scheme): a rank looks up the ids in its range, reads zeros for
//               the others, and the partial results are summed over the group.
//   table-wise  a smaller table lives whole on one rank. The tables are
//               packed into `table_wise_slots` slots balanced by rows (largest
//               first, into the emptiest slot); slot s lives on rank
//               s / (slots / tp). The owner looks the table up, the other
//               ranks contribute zeros, and the same sum hands every rank
//               every table's result; only the owner's rows take a gradient.
//
// Both kinds are declared to the tensor plugin as splits along dimension 0
// (ParallelLayer::splitParameters), so applyTensorParallel slices them, the
// model's Placement records the split, and checkpoints hold the full tensors
// and reshard between tp sizes with the engine's own mechanism:
//   "<prefix>row_wise.<table>"  [rows (padded to row_multiple), dim]
//   "<prefix>table_wise"        [slots * slot_rows, dim], every table-wise
//                               table at plan().tables[t].first_row
// Which kind a table gets, its slot and its rows in the pack depend on the
// options only, never on tp, so the parameter names and full shapes are the
// same at every tp size. With tp = 1 every table is whole and local.
//
// Initial values: row r, column c of table t is uniform in [-b, b]
// (b = init_bound, or sqrt(1 / rows) like DLRM and TorchRec), a pure function
// of (parameterSeed(seed, table name), r, c) through splitmix64, so every tp
// size (and a rank that builds only its rows) starts from the same tables.
// Padding rows are zero and are never looked up.
//
// Huge tables: with shard_count > 1 the module builds only the rows that
// tensor-parallel rank shard_rank of shard_count holds (the same values the
// tensor plugin would slice out of the full build), so no rank ever holds a
// whole table. It then declares no split to the tensor plugin; the model
// records the splits itself (builtShards(), recorded with
// nn::recordBuiltShards of engine/tensor_parallel.h in its setTensorParallel,
// which the plugin calls after the layers), and checkpoints see the same full
// shapes as before.
//
// Ids: table t's ids are in [0, rows_t); -1 means "no id" (a history's
// padding) and reads a zero vector with no gradient.
//
// The backward pass of the sum is the identity (reduceFromTpRegion): each
// rank's output gradient is the full one (the layers after the tables compute
// the same on every rank of the group), and the masks route it to the rows
// this rank holds.
//
// Thread-safety: one thread at a time (a torch module). Every rank of the
// group calls forward / lookup / pooled / lookups together, in the same order
// (each is one all-reduce under tensor parallelism).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "ptrain/core/error.h"
#include "ptrain/nn/parameter_init.h"
#include "ptrain/nn/parallel_layers.h"
#include "ptrain/nn/tensor_parallel.h"

namespace ptrain::nn {

enum class TableSharding { kRowWise, kTableWise };
PTRAIN_API const char* toString(TableSharding sharding);

enum class Pooling { kSum, kMean };

struct EmbeddingTableSpec {
  std::string name;  // a parameter-name component: letters, digits, '_' (no '.')
  int64_t rows = 0;  // >= 1
};

struct PTRAIN_API EmbeddingTablesOptions {
  std::vector<EmbeddingTableSpec> tables;  // at least one, distinct names
  int64_t dim = 16;                        // embedding width of every table, >= 1
  // Tables with at least this many rows are row-wise, the others table-wise.
  // 0 makes every table row-wise.
  int64_t row_wise_threshold = 100000;
  // Slots the table-wise tables are packed into; tp must divide it.
  int64_t table_wise_slots = 8;
  // Row-wise tables are padded to a multiple of this (independent of tp, so
  // checkpoints keep their shape); tp must divide the padded rows.
  int64_t row_multiple = 1;
  uint64_t seed = 0;        // the model's seed
  double init_bound = 0;    // > 0: uniform in [-init_bound, init_bound]; 0: sqrt(1 / rows)
  // Build only tensor-parallel rank shard_rank's rows of shard_count (above);
  // 1: build every table whole.
  int shard_rank = 0;
  int shard_count = 1;
};

// Where a table lives: its parameter (local name in the module), the first
// of its rows there (in the full, unsharded tensor) and its rows.
struct TableLocation {
  TableSharding sharding = TableSharding::kRowWise;
  std::string parameter;  // "row_wise.<name>" or "table_wise"
  int64_t slot = -1;      // table-wise: its slot
  int64_t first_row = 0;  // in the full parameter
  int64_t rows = 0;
};

// The placement of every table for `options`; independent of tp. Throws
// ConfigError for bad options (naming the option and the value).
struct PTRAIN_API EmbeddingShardingPlan {
  std::vector<TableLocation> tables;  // in the order of options.tables
  int64_t slots = 0;                  // options.table_wise_slots
  int64_t slot_rows = 0;              // rows of each slot (the fullest slot's); 0: no table-wise table
  std::vector<int64_t> padded_rows;   // per table: row-wise rows padded to row_multiple (else rows)

  static EmbeddingShardingPlan of(const EmbeddingTablesOptions& options);
  bool hasTableWise() const { return slot_rows > 0; }
  // The tensor-parallel rank that holds table-wise table t's rows at tp
  // `tpSize` (a row-wise table: -1, every rank holds a range).
  int ownerOf(size_t table, int tpSize) const;
};

// Throws ConfigError when the tables cannot be split over `tpSize` ranks: a
// row-wise table whose (padded) rows tpSize does not divide (or fewer rows
// than ranks), or table-wise tables with a slot count tpSize does not divide.
// The message names the table, both numbers and the options that fix it.
PTRAIN_API void checkEmbeddingTablesTensorParallel(const EmbeddingTablesOptions& options, int tpSize);

// Parameters (values) of the tables one rank holds at tp `tpSize`: the same on
// every rank (row ranges and slots split evenly), padding included.
PTRAIN_API int64_t embeddingParametersPerRank(const EmbeddingTablesOptions& options, int tpSize);

// One line per table for logs and `ptrain check`: "user: row-wise, 100000
// rows, 25000 per rank" or "category: table-wise, 1000 rows, slot 3 on rank
// 1". Throws as checkEmbeddingTablesTensorParallel.
PTRAIN_API std::vector<std::string> describeEmbeddingSharding(const EmbeddingTablesOptions& options, int tpSize);

// Fills `out` [count, dim] with rows first_row.. of a table's initial values
// (seeded by `tableSeed`, uniform in [-bound, bound]); what the module draws.
PTRAIN_API void fillEmbeddingRows(at::Tensor& out, uint64_t tableSeed, int64_t firstRow, double bound);

class PTRAIN_API EmbeddingTablesImpl : public torch::nn::Module, public ParallelLayer {
 public:
  // Builds every table full-size (the tensor plugin keeps this rank's rows),
  // or only shard_rank's rows of shard_count; under a DeferredInit
  // (deferred_init.h) the tables come without storage and the runtime fills
  // this rank's rows with parameterInit. Throws ConfigError for bad options.
  explicit EmbeddingTablesImpl(EmbeddingTablesOptions options);
  ~EmbeddingTablesImpl() override;

  // ids [B, N] int64, column t the ids of table t (N = number of tables) ->
  // [B, N, dim], complete on every rank.
  at::Tensor forward(const at::Tensor& ids);
  // ids [...] of table `table` -> [..., dim] (-1: zeros).
  at::Tensor lookup(int64_t table, const at::Tensor& ids);
  // ids [B, H] of table `table`, -1 padding -> [B, dim]: the sum of the valid
  // ids' rows, or their mean (zeros for a row with none). Pooled on each rank
  // before the sum over the group, so it communicates B x dim values.
  at::Tensor pooled(int64_t table, const at::Tensor& ids, Pooling pooling);

  // Several lookups with one all-reduce: request i is (table, ids [...]) and
  // gives [..., dim]; with `pooling` set for it, ids [B, H] give [B, dim].
  struct Request {
    int64_t table = 0;
    at::Tensor ids;
    bool pooled = false;
    Pooling pooling = Pooling::kSum;
  };
  std::vector<at::Tensor> lookups(const std::vector<Request>& requests);

  ParallelStyle parallelStyle() const override { return ParallelStyle::kVocab; }
  // Every row-wise table and the table-wise pack, along dimension 0; none
  // when the module was built sharded (shard_count > 1).
  std::vector<std::pair<std::string, int>> splitParameters() const override;
  // Built sharded: the split of every row-wise table and the pack (dimension
  // 0 of the tensor group, full rows; this rank holds piece
  // options().shard_rank of options().shard_count), under the module's own
  // names. Empty otherwise (the tensor plugin records them as it slices).
  std::vector<TensorParallelSplit> builtShards() const;

  // How the parameter `local` ("row_wise.<table>" or "table_wise") starts:
  // any block of its rows, drawn alone (the tables' values, zero padding).
  ParameterInit parameterInit(const std::string& local) const;

  const EmbeddingTablesOptions& options() const { return options_; }
  const EmbeddingShardingPlan& plan() const { return plan_; }
  int64_t numTables() const { return static_cast<int64_t>(options_.tables.size()); }
  int64_t tableIndex(const std::string& name) const;  // ConfigError when unknown
  // Table `name` out of the full (unsharded) parameters of a checkpoint,
  // keyed by their names under `prefix` (the module's, e.g. "embeddings."):
  // [rows, dim]. Throws CheckpointError when the tensor is missing or short.
  at::Tensor tableFromFull(const std::string& name, const std::map<std::string, at::Tensor>& fullParameters,
                           const std::string& prefix) const;

  // The row-wise tables' weights (in table order, undefined for table-wise
  // tables) and the pack; this rank's shard once the tensor plugin has run.
  std::vector<at::Tensor> row_wise;
  at::Tensor table_wise;

 private:
  // Rows [firstRow, firstRow + rows.size(0)) of the parameter `local` of the
  // full (unsharded) layout: each table's values, zeros elsewhere.
  void fillRows(const std::string& local, at::Tensor& rows, int64_t firstRow) const;
  // This rank's contribution to each request: [..., dim] (or [B, dim]
  // pooled), zeros for ids it does not hold. The requests reading one
  // parameter (the table-wise pack, a table asked twice) share one embedding
  // call, so backward builds one dense gradient of it, not one per request.
  std::vector<at::Tensor> partials(const std::vector<Request>& requests);
  // Throws InternalError for a request of no table, ids that are not int64
  // or out of [-1, rows).
  void checkIds(const std::vector<Request>& requests) const;
  int tpRank() const { return parallel() ? tp_->rank : 0; }
  int tpSize() const { return parallel() ? tp_->size : 1; }

  EmbeddingTablesOptions options_;
  EmbeddingShardingPlan plan_;
};
TORCH_MODULE(EmbeddingTables);

}  // namespace ptrain::nn
