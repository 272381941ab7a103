// ptrain data prepare: runs ptrain-prepare-tokens (tools/prepare_tokens),
// installed beside the ptrain binary, with the options CLI11 checked here.
// ptrain data export: the recipe's trainer writes its built-in data set.
// The tokenizer lives in its own program because SentencePiece's protobuf
// and the one inside Debian's libtorch cannot share a process.
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "ptrain/engine/engine.h"
#include "ptrain/engine/trainer.h"

namespace fs = std::filesystem;

namespace ptrain::cli {

int cmdDataPrepare(const DataPrepareArgs& args) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path tool = self.parent_path() / "ptrain-prepare-tokens";
  if (ec || !fs::exists(tool)) {
    throw InternalError("ptrain data prepare: " + tool.string() + " is missing; build the whole tree (make build)");
  }
  std::vector<std::string> argv = {tool.string()};
  argv.insert(argv.end(), args.inputs.begin(), args.inputs.end());
  argv.insert(argv.end(), {"--output", args.output, "--json-key", args.json_key});
  if (!args.tokenizer.empty()) argv.insert(argv.end(), {"--tokenizer", args.tokenizer});
  if (args.vocab_size > 0) argv.insert(argv.end(), {"--vocab-size", std::to_string(args.vocab_size)});
  std::vector<char*> raw;
  for (auto& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw InternalError(std::string("ptrain data prepare: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::execv(raw[0], raw.data());
    std::_Exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int cmdDataExport(const DataExportArgs& args) {
  // The recipe's trainer, set up as a run would (one process, layout aside).
  PreparedRecipe prepared = prepareRecipe(args.recipe, args.overrides, 0, 0);
  prepared.trainer->exportData(args.name, args.out, args.train, args.validation);
  return 0;
}

}  // namespace ptrain::cli
