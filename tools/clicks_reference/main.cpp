// ptrain_clicks_reference: the clicks data set's reference learner
// (datasets/clicks_reference.h) from the command line. It answers "what AUC
// can N training samples of this data set give at best?", the ceiling to
// read a recommender recipe's eval_auc against.
//
//   build/bin/ptrain_clicks_reference                      the default world, 4.86e6 samples
//   build/bin/ptrain_clicks_reference --table-sizes 1000,...,1000 --zipf-exponent 1.2 --hidden-dim 2
//       --samples 10240000                                 recsys_small's world and budget (one line)
//   build/bin/ptrain_clicks_reference --learn pairwise --scale 0.002 --min-rows 50 --samples 1800000
#include "ptrain/core/error.h"
#include "ptrain/datasets/clicks.h"
#include "ptrain/datasets/clicks_reference.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using ptrain::datasets::ClicksOptions;
using ptrain::datasets::ClicksReferenceOptions;

constexpr const char* kUsage =
    "usage: ptrain_clicks_reference [--learn pairwise|first_order+pairwise|all] [--samples N] [--batch-size N]\n"
    "                               [--dim N] [--lr X] [--scale X] [--min-rows N] [--eval-size N]\n"
    "                               [--evaluations N] [--seed N] [--table-sizes N,N,...] [--zipf-exponent X]\n"
    "                               [--hidden-dim N] [--logit-std X]\n"
    "  Trains the hidden model's own form (datasets/clicks_reference.h) on the terms --learn names, with\n"
    "  the others given exactly (all: nothing given), and prints its validation AUC against the ground\n"
    "  truth's. Defaults: --learn all on the data set's default world (the default tables, Zipf 1.1,\n"
    "  hidden width 8; train.seed 1234, 20000 validation samples), 4864000 samples (19000 steps of 256),\n"
    "  dim 16, lr 3e-3. recsys_small's world: --table-sizes with 26 x 1000, --zipf-exponent 1.2,\n"
    "  --hidden-dim 2; its budget --samples 10240000.\n"
    "  --scale/--min-rows shrink the tables as model.scale/model.min_table_rows do; --table-sizes,\n"
    "  --zipf-exponent, --hidden-dim and --logit-std set the data world as the data.* keys of the same\n"
    "  names do.\n";

// One line, exit code 2: the command saves nothing, so nothing is lost.
[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "ptrain_clicks_reference: %s\n", message.c_str());
  std::exit(2);
}

double number(int& i, int argc, char** argv) {
  const std::string flag = argv[i];
  if (i + 1 >= argc) usageError(flag + " needs a value");
  char* end = nullptr;
  const double v = std::strtod(argv[++i], &end);
  if (end == argv[i] || *end != '\0') usageError(flag + " expects a number, got '" + argv[i] + "'");
  return v;
}

// 2^62 bounds every count this command takes, and keeps the cast defined.
int64_t wholeOrExit(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(std::abs(v) < 4.6e18) || v != std::floor(v)) {
    usageError(flag + " expects a whole number below 4.6e18, got '" + text + "'");
  }
  return static_cast<int64_t>(v);
}

int64_t whole(int& i, int argc, char** argv) {
  const std::string flag = argv[i];
  if (i + 1 >= argc) usageError(flag + " needs a value");
  return wholeOrExit(flag, argv[++i]);
}

// "1000,500,..." -> sizes; the data set checks the count and the range.
std::vector<int64_t> wholeList(int& i, int argc, char** argv) {
  const std::string flag = argv[i];
  if (i + 1 >= argc) usageError(flag + " needs a value");
  const std::string text = argv[++i];
  std::vector<int64_t> values;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    values.push_back(wholeOrExit(flag, text.substr(start, comma == std::string::npos ? comma : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

const char* learned(ptrain::datasets::ClicksReferenceTerms terms) {
  switch (terms) {
    case ptrain::datasets::ClicksReferenceTerms::kPairwise:
      return "the pairwise term";
    case ptrain::datasets::ClicksReferenceTerms::kFirstOrderAndPairwise:
      return "the first-order and pairwise terms";
    case ptrain::datasets::ClicksReferenceTerms::kAll:
      return "every term";
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  ClicksOptions data;
  data.seed = 1234;
  data.validation_size = 20000;
  ClicksReferenceOptions o;
  o.terms = ptrain::datasets::ClicksReferenceTerms::kAll;
  double scale = 1.0;
  int64_t minRows = 1000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--samples") o.samples = whole(i, argc, argv);
    else if (a == "--batch-size") o.batch_size = whole(i, argc, argv);
    else if (a == "--dim") o.dim = whole(i, argc, argv);
    else if (a == "--lr") o.lr = number(i, argc, argv);
    else if (a == "--learn") {
      const std::string what = i + 1 < argc ? argv[++i] : "";
      if (what == "pairwise") o.terms = ptrain::datasets::ClicksReferenceTerms::kPairwise;
      else if (what == "first_order+pairwise") o.terms = ptrain::datasets::ClicksReferenceTerms::kFirstOrderAndPairwise;
      else if (what == "all") o.terms = ptrain::datasets::ClicksReferenceTerms::kAll;
      else usageError("--learn expects pairwise, first_order+pairwise or all, got '" + what + "'");
    }
    else if (a == "--scale") scale = number(i, argc, argv);
    else if (a == "--min-rows") minRows = whole(i, argc, argv);
    else if (a == "--eval-size") data.validation_size = whole(i, argc, argv);
    else if (a == "--evaluations") o.evaluations = whole(i, argc, argv);
    else if (a == "--seed") o.seed = static_cast<uint64_t>(whole(i, argc, argv));
    else if (a == "--table-sizes") data.table_sizes = wholeList(i, argc, argv);
    else if (a == "--zipf-exponent") data.zipf_exponent = number(i, argc, argv);
    else if (a == "--hidden-dim") data.hidden_dim = whole(i, argc, argv);
    else if (a == "--logit-std") data.logit_std = number(i, argc, argv);
    else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      usageError("unknown argument '" + a + "' (--help lists the options)");
    }
  }
  try {
    at::set_num_threads(1);
    if (scale != 1.0) data.table_sizes = ptrain::datasets::scaleTableSizes(data.table_sizes, scale, minRows);
    const ptrain::datasets::ClicksDataset dataset(data);
    int64_t rows = 0;
    for (int64_t t : data.table_sizes) rows += t;
    std::printf("clicks reference: %lld rows in 26 tables, %lld samples of %lld, dim %lld, lr %g, learns %s\n",
                static_cast<long long>(rows), static_cast<long long>(o.samples), static_cast<long long>(o.batch_size),
                static_cast<long long>(o.dim), o.lr, learned(o.terms));
    std::fflush(stdout);
    const auto result = ptrain::datasets::fitClicksReference(dataset, o, [](const auto& p) {
      std::printf("samples %9lld  auc %.4f  pairwise coefficient %.3f\n", static_cast<long long>(p.samples), p.auc,
                  p.pairwise_coefficient);
      std::fflush(stdout);
    });
    std::printf("ground truth auc %.4f, the given terms alone %.4f, the learner at the end %.4f\n",
                result.ground_truth_auc, result.given_auc, result.points.back().auc);
  } catch (const ptrain::ConfigError& e) {
    usageError(e.what());
  } catch (const std::invalid_argument& e) {  // rocAuc: a validation set of one class
    usageError(std::string(e.what()) + "; raise --eval-size");
  }
  return 0;
}
