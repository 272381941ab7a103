// NCCL settings from the recipe: the `communication.nccl` map.
//
//   communication:
//     nccl:
//       NCCL_SOCKET_IFNAME: eth0
//       NCCL_IB_DISABLE: true
//       NCCL_ALGO: allreduce:tree;allgather:ring
//
// NCCL reads its tuning from environment variables. The map names them, and
// this module holds the table of the variables NCCL documents, each with the
// kind of value it takes, so a recipe is checked before any worker starts:
// an unknown name suggests the nearest known one, a bad value says what is
// accepted. Values are normalised to the text NCCL reads (true -> 1,
// 0x10 -> 16, warn -> WARN).
//
// Precedence: a variable already set in the environment wins over the
// recipe, so an operator can override a recipe without editing it. The run
// prints one line per setting, `NCCL_X=value (recipe)` or
// `NCCL_X=value (environment, recipe says Y)`.
//
// Applying: `ptrain run` hands the recipe's settings to its workers'
// environment; a worker started any other way (torchrun, srun, a test that
// trains in-process) sets them itself before its communicator is created
// (TrainingSession). The settings matter to the nccl comm backend only;
// other backends ignore them.
//
// No libtorch: the table, the checks and the precedence are plain functions.
// Thread-safety: everything is a pure function of its arguments except
// applySettings and processEnvironment, which touch the process environment
// (call them before other threads read it).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ptrain/core/error.h"

namespace ptrain {

class Recipe;

namespace nccl {

// The recipe key that holds the map.
inline constexpr const char* kRecipeKey = "communication.nccl";

enum class ValueKind {
  kInteger,        // a whole number in [min, max] (decimal or 0x hex in the recipe)
  kBool,           // 0 or 1; true/false/yes/no/on/off are written as 1 or 0
  kChoice,         // one of `choices`
  kPath,           // a file path (NCCL expands %h to the host name and %p to the pid)
  kString,         // free text NCCL hands on, e.g. a plugin name
  kInterfaceList,  // network interfaces: prefixes joined by ',', '^' first excludes, '=' an exact name
  kDeviceList,     // InfiniBand devices: as kInterfaceList, each name with an optional ':port'
  kLevel,          // topology distance: LOC, NVL, PIX, PXB, PHB, SYS or a legacy integer >= 0
  kAlgoList,       // collective algorithms: [func:][^]algo,...;func:[^]algo,...
  kProtoList,      // protocols: as kAlgoList with LL, LL128, Simple
  kSubsysList,     // debug subsystems: [^]name,...
};

struct Variable {
  std::string name;                  // "NCCL_IB_TIMEOUT"
  ValueKind kind = ValueKind::kString;
  std::string meaning;               // one line for messages and docs
  int64_t min = 0;                   // kInteger: inclusive bounds
  int64_t max = 0;
  std::vector<std::string> choices;  // kChoice: the accepted values, as NCCL spells them
  bool case_sensitive = false;       // kChoice: NCCL compares with strcmp, not strcasecmp
};

// Every variable the recipe may set, grouped by topic (system, network,
// InfiniBand, transports, tuning, debugging), the order docs list them in.
PTRAIN_API const std::vector<Variable>& variables();
// nullptr when `name` is not in the table (names are case-sensitive, as in
// the environment).
PTRAIN_API const Variable* findVariable(const std::string& name);

// What a variable accepts, for messages and tables: "an integer in [1, 31]",
// "0 or 1 (true or false)", "one of VERSION, WARN, INFO, ABORT or TRACE", ...
PTRAIN_API std::string acceptedText(const Variable& variable);

// The table for people: `ptrain keys --nccl` prints text() (one variable per
// line, aligned columns), and docs/recipes.md holds markdown() (a table of
// variable, accepts, meaning), which a test keeps equal to the code.
PTRAIN_API std::string variablesText();
PTRAIN_API std::string variablesMarkdown();

// Checks `value` (the YAML scalar's text) for `variable`. Returns "" and
// stores the text NCCL reads in `*normalized`, else returns
// "<what is wrong>; <how to fix>" (no key path) and leaves `*normalized` alone.
PTRAIN_API std::string checkValue(const Variable& variable, const std::string& value, std::string* normalized);

// Checks a name and its value. Unknown names (not NCCL_*, or an NCCL_ name
// missing from the table) get "unknown NCCL variable; did you mean
// 'NCCL_X'?" when one is close.
PTRAIN_API std::string checkSetting(const std::string& name, const std::string& value, std::string* normalized);

// One setting as NCCL will read it.
struct Setting {
  std::string name;   // "NCCL_ALGO"
  std::string value;  // normalised: "Ring", "1", "4194304"
};

// Checks the settings as a whole (each already fine alone), e.g.
// NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD <= 64. One
// "<NCCL_X>: <what>; <how>" line per problem.
PTRAIN_API std::vector<std::string> checkCombination(const std::vector<Setting>& settings);

// Every problem of the recipe's communication.nccl map (a validated
// recipe: the schema has accepted the map itself), one line each in the
// recipe's error form: "<file:line:col>: communication.nccl.NCCL_X: <what>;
// <how>". Empty when the map is fine or not set. Called by `ptrain check`
// and prepareRecipe next to the layout checks.
PTRAIN_API std::vector<std::string> checkRecipe(const Recipe& recipe);

// The recipe's settings, normalised, sorted by name. Throws ConfigError with
// the first problem checkRecipe finds.
PTRAIN_API std::vector<Setting> settingsFromRecipe(const Recipe& recipe);

// Where a setting's value comes from.
enum class Source { kRecipe, kEnvironment };

struct EffectiveSetting {
  std::string name;
  std::string value;         // what NCCL will read
  Source source = Source::kRecipe;
  std::string recipe_value;  // what the recipe says (normalised)
};

// Looks up one environment variable; nullopt when it is not set.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string&)>;

// The settings NCCL will see: for each recipe setting, the environment's
// value when `lookup` finds the variable (even set to the same or an empty
// value), else the recipe's. Same order as `recipe`.
PTRAIN_API std::vector<EffectiveSetting> effectiveSettings(const std::vector<Setting>& recipe,
                                                           const EnvironmentLookup& lookup);

// "NCCL_ALGO=Ring (recipe)" or "NCCL_ALGO=Tree (environment, recipe says Ring)".
PTRAIN_API std::string headerLine(const EffectiveSetting& setting);

// "NCCL_X=value" for each setting that comes from the recipe: what a
// launcher adds to its workers' environment.
PTRAIN_API std::vector<std::string> environmentEntries(const std::vector<EffectiveSetting>& settings);

// getenv.
PTRAIN_API EnvironmentLookup processEnvironment();

// Sets, in this process's environment, every recipe setting the environment
// does not already hold (setenv without overwrite), and returns the
// effective settings as computed before. Call before the comm plugin is
// created: NCCL reads its variables when its first communicator is made.
PTRAIN_API std::vector<EffectiveSetting> applySettings(const std::vector<Setting>& recipe);

}  // namespace nccl
}  // namespace ptrain
