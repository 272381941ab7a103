// The rule reward of the arithmetic task (verl's reward by rule, as for
// GSM8K): `correct` when the response is the exact answer followed by EOS,
// `format` when it is a well-formed number followed by EOS but the wrong one,
// 0 otherwise (no EOS within the response, a stray symbol, PAD).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptrain::grpo {

struct RewardOptions {
  double correct = 1.0;
  double format = 0.0;  // algorithm.format_reward (0: off)
};

// `response`: the sampled tokens (arithmetic vocabulary); `answer`: the
// problem's ArithmeticProblem::answer() ("432", "-17").
double arithmeticReward(const std::vector<int64_t>& response, const std::string& answer,
                        const RewardOptions& options = {});

}  // namespace ptrain::grpo
