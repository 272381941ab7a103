// The framework's parts depend on each other one way only (docs/architecture.md,
// "Dependencies"). Every file under framework/include/ptrain and framework/src
// is read for its #include lines, and each include of a framework header is
// mapped to the part that holds it:
//   - a part includes only its own headers and the public headers
//     (ptrain/<part>/...) of the parts in lower layers;
//   - the private headers under framework/src/<part>/ are that part's alone,
//     and no public header includes one (they are not installed);
//   - the SDK's parts never include the launcher or the command line;
//   - every folder under framework/src and framework/include/ptrain is a part
//     of the table, and the table's SDK parts are the libptrain_core parts of
//     framework/CMakeLists.txt;
//   - docs/architecture.md draws the same layers in the same order.
// A failure names the file and line, the two parts and what to do.
//
// Torch-free: it reads files only.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace {

namespace fs = std::filesystem;

struct Part {
  const char* name;
  int layer;  // a part may include parts of its own layer and lower ones
  bool sdk;   // in libptrain_core and installed; launch and cli are static libraries on top
};

// The layers, lowest first. No two parts share a layer today: two parts given
// the same layer on purpose may include each other (say why beside them).
const Part kParts[] = {
    {"core", 0, true},       // errors, logging, text, host memory, torch differences
    {"plugin", 1, true},     // the plugin ABI and the loader
    {"recipe", 2, true},     // YAML recipes, the schema
    {"pipeline", 3, true},   // schedules: pure functions (layout's checks use the partition and bubble)
    {"layout", 4, true},     // rank grids, the layout rules of `ptrain check`
    {"comm", 5, true},       // store, process groups, the communicator of a layout, NCCL's settings
    {"nn", 6, true},         // parallel layers and their collectives, MoE, kernels
    {"engine", 7, true},     // the runtime, trainers' interface, optimizers, checkpoints
    {"plan", 8, true},       // the planner's model of a run: above the engine it models
    {"launch", 9, false},    // ptrain_launch: worker processes
    {"cli", 10, false},      // ptrain_cli: the subcommands
};

const Part* findPart(const std::string& name) {
  for (const Part& p : kParts) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

// The source tree, as the paths found under it are spelt.
std::string sourceDir() { return fs::weakly_canonical(ptrain::test::sourceDir()).string(); }

std::string inTree(const fs::path& p) { return fs::relative(p, sourceDir()).generic_string(); }

bool isSource(const fs::path& p) {
  static const std::set<std::string> kExtensions = {".h", ".hpp", ".cuh", ".inl", ".cpp", ".cc", ".cu"};
  return kExtensions.count(p.extension().string()) > 0;
}

// A framework file: the part it belongs to and whether it is private
// (framework/src) or public (framework/include/ptrain).
struct Location {
  std::string part;  // "" when the file lies in no part's folder
  bool isPrivate = false;
};

std::optional<Location> locate(const fs::path& file) {
  const fs::path src = fs::path(sourceDir()) / "framework/src";
  const fs::path pub = fs::path(sourceDir()) / "framework/include/ptrain";
  for (const auto& [root, isPrivate] : {std::pair{src, true}, std::pair{pub, false}}) {
    const fs::path rel = fs::relative(file, root);
    if (rel.empty() || *rel.begin() == "..") continue;
    Location loc;
    loc.isPrivate = isPrivate;
    if (std::distance(rel.begin(), rel.end()) > 1) loc.part = rel.begin()->string();
    return loc;
  }
  return std::nullopt;
}

struct Include {
  int line = 0;
  std::string text;  // as written between the quotes
};

std::vector<Include> includesOf(const fs::path& file) {
  static const std::regex kQuoted(R"(^\s*#\s*include\s*"([^"]+)\")");
  static const std::regex kAngledPtrain(R"(^\s*#\s*include\s*<(ptrain/[^>]+)>)");
  std::ifstream in(file);
  std::vector<Include> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::smatch m;
    if (std::regex_search(line, m, kQuoted) || std::regex_search(line, m, kAngledPtrain)) {
      out.push_back({n, m[1].str()});
    }
  }
  return out;
}

// Where the compiler finds a quoted include: beside the including file, then
// in the framework's include folders. nullopt: no framework file (a library's).
std::optional<fs::path> resolve(const fs::path& from, const std::string& include) {
  for (const fs::path& dir : {from.parent_path(), fs::path(sourceDir()) / "framework/include",
                              fs::path(sourceDir()) / "framework/src"}) {
    const fs::path candidate = dir / include;
    if (fs::is_regular_file(candidate)) return fs::weakly_canonical(candidate);
  }
  return std::nullopt;
}

std::vector<fs::path> frameworkFiles() {
  std::vector<fs::path> files;
  for (const char* root : {"framework/include/ptrain", "framework/src"}) {
    for (const auto& entry : fs::recursive_directory_iterator(fs::path(sourceDir()) / root)) {
      if (entry.is_regular_file() && isSource(entry.path())) files.push_back(fs::weakly_canonical(entry.path()));
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string layerName(const Part& p) {
  return std::string(p.name) + " (layer " + std::to_string(p.layer) + (p.sdk ? "" : ", not SDK") + ")";
}

TEST(Architecture, EveryFolderIsAPartOfTheTable) {
  for (const char* root : {"framework/include/ptrain", "framework/src"}) {
    for (const auto& entry : fs::directory_iterator(fs::path(sourceDir()) / root)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory()) {
        if (findPart(name) != nullptr) continue;
        ADD_FAILURE() << root << "/" << name << ": a folder the layer table of tests/unit/test_architecture.cpp "
                      << "does not know; add it to kParts at its layer (and to docs/architecture.md's "
                      << "Dependencies picture, and to a library in framework/CMakeLists.txt)";
      } else {
        ADD_FAILURE() << root << "/" << name << ": a file outside every part; put it in a part's folder";
      }
    }
  }
}

TEST(Architecture, TheSdkPartsAreTheCoreLibrarysParts) {
  std::ifstream in(sourceDir() + "/framework/CMakeLists.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  const std::string cmake = text.str();
  ASSERT_TRUE(std::regex_search(cmake, m, std::regex(R"(set\(PTRAIN_SDK_PARTS([^)]*)\))")))
      << "framework/CMakeLists.txt no longer sets PTRAIN_SDK_PARTS";
  std::set<std::string> fromCmake;
  std::istringstream words(m[1].str());
  for (std::string w; words >> w;) fromCmake.insert(w);
  std::set<std::string> fromTable;
  for (const Part& p : kParts) {
    if (p.sdk) fromTable.insert(p.name);
  }
  EXPECT_EQ(fromTable, fromCmake) << "kParts' SDK parts and framework/CMakeLists.txt's PTRAIN_SDK_PARTS differ";
}

TEST(Architecture, IncludesPointDownTheLayers) {
  size_t checked = 0;
  for (const fs::path& file : frameworkFiles()) {
    const std::string name = inTree(file);
    const std::optional<Location> from = locate(file);
    ASSERT_TRUE(from.has_value()) << name;
    const Part* fromPart = findPart(from->part);
    if (fromPart == nullptr) continue;  // EveryFolderIsAPartOfTheTable reports it
    for (const Include& inc : includesOf(file)) {
      const std::string where = name + ":" + std::to_string(inc.line) + ": #include \"" + inc.text + "\": ";
      const std::optional<fs::path> target = resolve(file, inc.text);
      const std::string first = inc.text.substr(0, inc.text.find('/'));
      if (!target) {
        // A library's header, unless it is written the way framework headers are.
        EXPECT_FALSE(first == "ptrain" || findPart(first) != nullptr)
            << where << "names no file of the framework (a framework header that moved?)";
        continue;
      }
      const std::optional<Location> to = locate(*target);
      if (!to) {
        ADD_FAILURE() << where << "a file outside framework/include/ptrain and framework/src ("
                      << inTree(*target) << "): the framework includes only its own headers and libraries'";
        continue;
      }
      const Part* toPart = findPart(to->part);
      if (toPart == nullptr) continue;  // EveryFolderIsAPartOfTheTable reports it
      ++checked;
      const std::string edge = std::string(fromPart->name) + " -> " + toPart->name;
      if (to->isPrivate && !from->isPrivate) {
        ADD_FAILURE() << where << edge << ": a public header includes a private one (framework/src is not "
                      << "installed); move what it needs into a header under framework/include/ptrain";
      } else if (to->isPrivate && toPart != fromPart) {
        ADD_FAILURE() << where << edge << ": " << toPart->name << "'s private header (framework/src/"
                      << toPart->name << "/) is for " << toPart->name << " alone; move what " << fromPart->name
                      << " needs into a public header of a part at or below " << layerName(*fromPart);
      }
      if (fromPart->sdk && !toPart->sdk) {
        ADD_FAILURE() << where << edge << ": the SDK never includes the launcher or the command line (static "
                      << "libraries above it, not installed)";
      } else if (toPart->layer > fromPart->layer) {
        ADD_FAILURE() << where << edge << ": " << layerName(*fromPart) << " includes the higher layer "
                      << layerName(*toPart) << "; move what it needs down, or pass it in from above "
                      << "(docs/architecture.md, Dependencies)";
      }
    }
  }
  EXPECT_GT(checked, 100u) << "too few framework includes found: is PTRAIN_SOURCE_DIR the source tree?";
}

TEST(Architecture, TheDocumentDrawsTheSameLayers) {
  const std::string picture = ptrain::test::markedSection(sourceDir() + "/docs/architecture.md", "layers");
  // Top to bottom, one line per layer; the first word of a line names its part.
  std::vector<std::string> drawn;
  std::istringstream lines(picture);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string first;
    if (words >> first && findPart(first) != nullptr) drawn.push_back(first);
  }
  std::vector<const Part*> ordered;
  for (const Part& p : kParts) ordered.push_back(&p);
  std::stable_sort(ordered.begin(), ordered.end(), [](const Part* a, const Part* b) { return a->layer > b->layer; });
  std::vector<std::string> expected;
  for (const Part* p : ordered) expected.push_back(p->name);
  EXPECT_EQ(drawn, expected) << "docs/architecture.md's layers picture (highest first) and kParts differ";
}

}  // namespace
