// ptrain_clicks_reference: the clicks data set's reference learner
// (datasets/clicks_reference.h) from the command line. It answers "what AUC
// can N training samples of this data set give at best?", the ceiling to
// read a recommender recipe's eval_auc against.
//
//   build/bin/ptrain_clicks_reference                      recsys_small's data and budget (4.86e6 samples)
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

namespace {

using ptrain::datasets::ClicksOptions;
using ptrain::datasets::ClicksReferenceOptions;

constexpr const char* kUsage =
    "usage: ptrain_clicks_reference [--learn pairwise|first_order+pairwise|all] [--samples N] [--batch-size N]\n"
    "                               [--dim N] [--lr X] [--scale X] [--min-rows N] [--eval-size N]\n"
    "                               [--evaluations N] [--seed N]\n"
    "  Trains the hidden model's own form (datasets/clicks_reference.h) on the terms --learn names, with\n"
    "  the others given exactly (all: nothing given), and prints its validation AUC against the ground\n"
    "  truth's. Defaults: --learn all on recsys_small's data (the default tables, train.seed 1234, 20000\n"
    "  validation samples) and budget (4864000 samples: 19000 steps of 256), dim 16, lr 3e-3.\n"
    "  --scale/--min-rows shrink the tables as model.scale/model.min_table_rows do.\n";

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

int64_t whole(int& i, int argc, char** argv) {
  const std::string flag = argv[i];
  const double v = number(i, argc, argv);
  // 2^62 bounds every count this command takes, and keeps the cast defined.
  if (!(std::abs(v) < 4.6e18) || v != std::floor(v)) usageError(flag + " expects a whole number below 4.6e18");
  return static_cast<int64_t>(v);
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
