#include "rollout.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "ptrain/comm/communicator.h"
#include "ptrain/comm/process_group.h"
#include "ptrain/core/error.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/nn/tp_comm.h"

namespace ptrain::grpo {

Rollout generate(llm::GptModel& model, const std::vector<std::vector<int64_t>>& prompts,
                 const RolloutOptions& o, int64_t firstRow) {
  PTRAIN_CHECK(o.n >= 1 && o.max_response_length >= 0, "generate: n ", o.n, " and max_response_length ",
               o.max_response_length, " out of range");
  torch::NoGradGuard noGrad;
  const auto& config = model.config();
  Rollout out;
  for (const auto& p : prompts) {
    PTRAIN_CHECK(!p.empty() && static_cast<int64_t>(p.size()) < config.seq_length, "generate: a prompt of ",
                 p.size(), " tokens leaves no room within model.seq_length=", config.seq_length);
    for (int64_t s = 0; s < o.n; ++s) out.prompts.push_back(p);
  }
  const int64_t rows = static_cast<int64_t>(out.prompts.size());
  out.responses.resize(out.prompts.size());
  if (rows == 0 || o.max_response_length == 0) return out;

  const at::Device device = model.module().parameters().front().device();
  int64_t width = 0;
  for (const auto& p : out.prompts) width = std::max<int64_t>(width, static_cast<int64_t>(p.size()));
  at::Tensor batch = torch::full({rows, width}, o.pad_id, torch::kInt64);
  std::vector<int64_t> length(out.prompts.size());
  for (int64_t r = 0; r < rows; ++r) {
    const auto& p = out.prompts[static_cast<size_t>(r)];
    batch[r].narrow(0, 0, static_cast<int64_t>(p.size())).copy_(torch::tensor(p, torch::kInt64));
    length[static_cast<size_t>(r)] = static_cast<int64_t>(p.size());
  }

  std::vector<at::Generator> generators;
  for (int64_t r = 0; r < rows; ++r) generators.push_back(rowGenerator(o.seed, firstRow + r));
  llm::KvCache cache;
  const nn::TensorParallelState* tp = model.tensorParallel();
  // Logits of the whole vocabulary (gathered across the group), with the
  // padding entries never drawn.
  auto wholeVocabulary = [&](const at::Tensor& logits) {
    at::Tensor all = nn::isActive(tp) ? nn::gatherFromTpRegion(logits, *tp) : logits;
    all = all.to(torch::kFloat32).cpu();
    if (all.size(-1) > config.validVocab()) {
      all.narrow(-1, config.validVocab(), all.size(-1) - config.validVocab())
          .fill_(-std::numeric_limits<float>::infinity());
    }
    return all;
  };
  // Prefill: each row's logits at its prompt's last token.
  at::Tensor logits = model.decodeLogits(batch.to(device), torch::zeros({rows}, torch::kInt64), cache);
  std::vector<int64_t> last;
  for (int64_t l : length) last.push_back(l - 1);
  at::Tensor next = logits.index({torch::arange(rows, torch::kInt64).to(device), torch::tensor(last, torch::kInt64).to(device)});
  std::vector<char> done(out.prompts.size(), 0);
  for (int64_t step = 0; step < o.max_response_length; ++step) {
    const at::Tensor tokens = sampleTokens(wholeVocabulary(next), o.sampling, generators);
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      if (done[static_cast<size_t>(r)]) continue;
      const int64_t t = tokens[r].item<int64_t>();
      out.responses[static_cast<size_t>(r)].push_back(t);
      ++length[static_cast<size_t>(r)];
      // The model reads seq_length positions; a sequence's last token is
      // never read, so a row holds at most seq_length + 1 tokens.
      if (t == o.stop_id || length[static_cast<size_t>(r)] > config.seq_length) {
        done[static_cast<size_t>(r)] = 1;
      } else {
        any = true;
      }
    }
    if (!any || step + 1 == o.max_response_length) break;
    // Finished rows ride along at their last position (rewritten, never read).
    std::vector<int64_t> starts;
    for (int64_t r = 0; r < rows; ++r) starts.push_back(std::min(length[static_cast<size_t>(r)], config.seq_length) - 1);
    next = model.decodeLogits(tokens.view({rows, 1}).to(device), torch::tensor(starts, torch::kInt64), cache)
               .select(1, 0);
  }
  return out;
}

Rollout generateOnLayout(const GptModels& models, ModelRuntime& runtime,
                         const std::vector<std::vector<int64_t>>& prompts, const RolloutOptions& o) {
  const int64_t rows = static_cast<int64_t>(prompts.size()) * o.n;
  // This rank's rows (an even share of the data-parallel ranks; under device
  // groups its group's share, split over the group's).
  const auto [first, last] = runtime.dataRows(rows);
  const int64_t share = last - first;
  // This rank's rows, one prompt each.
  std::vector<std::vector<int64_t>> mine;
  for (int64_t r = first; r < last; ++r) mine.push_back(prompts[static_cast<size_t>(r / o.n)]);
  RolloutOptions single = o;
  single.n = 1;
  Rollout local;
  runtime.inference([&](StagedModel& model, const EvalContext&) {
    local = generate(models.ownModel(model), mine, single, first);
  });

  Rollout out;
  for (const auto& p : prompts)
    for (int64_t s = 0; s < o.n; ++s) out.prompts.push_back(p);
  out.responses.resize(static_cast<size_t>(rows));
  // Responses padded with -1 to the longest possible, assembled in row order.
  const int64_t width = std::max<int64_t>(1, o.max_response_length);
  at::Tensor block = torch::full({share, width}, -1, torch::kInt64);
  for (int64_t r = 0; r < share; ++r) {
    const auto& response = local.responses[static_cast<size_t>(r)];
    if (!response.empty()) {
      block[r].narrow(0, 0, static_cast<int64_t>(response.size())).copy_(torch::tensor(response, torch::kInt64));
    }
  }
  const at::Tensor all = runtime.assembleRows(block, rows).cpu();
  const int64_t* data = all.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < width && data[r * width + i] >= 0; ++i) {
      out.responses[static_cast<size_t>(r)].push_back(data[r * width + i]);
    }
  }
  return out;
}

}  // namespace ptrain::grpo
