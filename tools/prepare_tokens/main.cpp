// ptrain-prepare-tokens: what `ptrain data prepare` runs (it passes its own
// arguments on): text or JSONL in, a Megatron indexed data set out
// (datasets/prepare_tokens.h), with a progress bar on a terminal and the
// counts at the end. A program of its own, without libtorch: SentencePiece's
// protobuf and the one inside Debian's libtorch cannot share a process.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "ptrain/core/error.h"
#include "ptrain/datasets/prepare_tokens.h"

namespace {

// ptrain-prepare-tokens INPUT... --output PREFIX [--tokenizer MODEL]
// [--vocab-size N] [--json-key KEY]; `ptrain data prepare` has checked the
// options (CLI11) before it runs this.
int prepare(int argc, char** argv) {
  using namespace ptrain;
  datasets::PrepareTokensOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a + ": expected a value after it");
      return argv[++i];
    };
    if (a == "--output") o.output = value();
    else if (a == "--tokenizer") o.tokenizer = value();
    else if (a == "--vocab-size") o.vocab_size = std::atoll(value().c_str());
    else if (a == "--json-key") o.json_key = value();
    else if (a.rfind("--", 0) == 0) throw ConfigError(a + ": not an option of ptrain data prepare");
    else o.inputs.push_back(a);
  }
  if (o.output.empty()) throw ConfigError("--output: required; the data set's prefix, e.g. data/wiki");
  const std::string output = o.output;
  const bool terminal = ::isatty(2) != 0;
  auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  int pass = 0;
  o.progress = [&](uint64_t done, uint64_t total, int64_t documents) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::milliseconds(200)) return;
    last = now;
    if (done == total) ++pass;
    if (!terminal) return;
    const int width = 30;
    const double share = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(share * width);
    std::fprintf(stderr, "\r[%.*s%*s] %3.0f%%  %.1f of %.1f MB  %lld documents", filled,
                 "==============================", width - filled, "", share * 100, done / 1e6, total / 1e6,
                 static_cast<long long>(documents));
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
  const datasets::PrepareTokensResult r = datasets::prepareTokens(o);
  std::printf("%s.bin/.idx: %lld documents, %lld tokens, vocabulary %lld (%s)\n", output.c_str(),
              static_cast<long long>(r.documents), static_cast<long long>(r.tokens),
              static_cast<long long>(r.vocab_size), r.tokenizer.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return prepare(argc, argv);
  } catch (const ptrain::Error& e) {
    std::fprintf(stderr, "ptrain: %s\n", e.what());
    return e.exitCode();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ptrain: internal error: %s\n", e.what());
    return 1;
  }
}
