#include "reward.h"

#include <algorithm>

#include "ptrain/datasets/arithmetic.h"

namespace ptrain::grpo {

double arithmeticReward(const std::vector<int64_t>& response, const std::string& answer,
                        const RewardOptions& options) {
  using Tok = datasets::ArithmeticTokenizer;
  const auto eos = std::find(response.begin(), response.end(), Tok::kEos);
  if (eos == response.end()) return 0.0;
  std::string text;
  for (auto it = response.begin(); it != eos; ++it) {
    const int64_t id = *it;
    if (id >= Tok::kDigit0 && id < Tok::kDigit0 + 10) {
      text += static_cast<char>('0' + (id - Tok::kDigit0));
    } else if (id == Tok::kMinus && text.empty()) {
      text += '-';
    } else {
      return 0.0;  // PAD, an operator, '=' or a '-' inside the number
    }
  }
  const bool number = !text.empty() && text != "-";
  if (!number) return 0.0;
  return text == answer ? options.correct : options.format;
}

}  // namespace ptrain::grpo
