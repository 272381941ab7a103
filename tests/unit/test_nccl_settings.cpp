// communication.nccl: NCCL's variables checked against their table, normalised
// to what NCCL reads, the environment winning over the recipe, the settings
// exported before a communicator exists, and `ptrain check` refusing a bad one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ptrain/comm/nccl_settings.h"
#include "ptrain/comm/rank_env.h"
#include "ptrain/engine/engine.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"

namespace ptrain {
namespace {

using test::runPtrain;
using test::TempDir;

const char* kMinimal =
    "trainer: {name: llm}\n"
    "train: {steps: 10, global_batch_size: 8}\n";

// The problems of a recipe whose communication.nccl map holds `entries`
// (YAML lines, indented below `nccl:`, which is on line 4).
std::vector<std::string> problemsOf(const std::string& entries) {
  Recipe r = Recipe::fromString(std::string(kMinimal) + "communication:\n  nccl:\n" + entries, "r.yaml");
  return nccl::checkRecipe(r);
}

// The message for one value of one variable, or "" when it is accepted.
std::string errorFor(const std::string& name, const std::string& value, std::string* normalized = nullptr) {
  std::string out;
  std::string err = nccl::checkSetting(name, value, &out);
  if (normalized != nullptr) *normalized = out;
  return err;
}

std::string normalized(const std::string& name, const std::string& value) {
  std::string out;
  std::string err = nccl::checkSetting(name, value, &out);
  EXPECT_EQ(err, "") << name << "=" << value;
  return out;
}

// Sets or unsets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const char* value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value != nullptr) ::setenv(name_.c_str(), value, 1);
    else ::unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(NcclTable, CoversTheCommonlyTunedVariables) {
  const auto& table = nccl::variables();
  EXPECT_GE(table.size(), 40u);
  std::set<std::string> names;
  for (const auto& v : table) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " is listed twice";
    EXPECT_EQ(v.name.compare(0, 5, "NCCL_"), 0) << v.name;
    EXPECT_FALSE(v.meaning.empty()) << v.name;
    EXPECT_FALSE(nccl::acceptedText(v).empty()) << v.name;
    if (v.kind == nccl::ValueKind::kInteger) {
      EXPECT_LE(v.min, v.max) << v.name;
    }
    if (v.kind == nccl::ValueKind::kChoice) {
      EXPECT_FALSE(v.choices.empty()) << v.name;
    }
  }
  for (const char* name :
       {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY",
        "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT",
        "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX", "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_QPS_PER_CONNECTION",
        "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ", "NCCL_P2P_LEVEL", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
        "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NCHANNELS_PER_NET_PEER",
        "NCCL_ALGO", "NCCL_PROTO", "NCCL_CROSS_NIC", "NCCL_NET", "NCCL_TOPO_FILE", "NCCL_TOPO_DUMP_FILE",
        "NCCL_LAUNCH_MODE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_COLLNET_ENABLE", "NCCL_CHECKS_DISABLE",
        "NCCL_COMM_BLOCKING", "NCCL_ASYNC_ERROR_HANDLING", "NCCL_IGNORE_CPU_AFFINITY", "NCCL_MAX_P2P_NCHANNELS",
        "NCCL_P2P_NET_CHUNKSIZE", "NCCL_SET_THREAD_NAME"}) {
    EXPECT_NE(nccl::findVariable(name), nullptr) << name;
  }
  EXPECT_EQ(nccl::findVariable("nccl_debug"), nullptr);  // names are case-sensitive, as in the environment
}

TEST(NcclSettings, ValidMapPassesTheSchemaAndIsNormalised) {
  const std::string yaml = std::string(kMinimal) +
                           "communication:\n"
                           "  backend: nccl\n"
                           "  nccl:\n"
                           "    NCCL_NET_GDR_LEVEL: PHB\n"
                           "    NCCL_IB_DISABLE: true\n"
                           "    NCCL_SOCKET_IFNAME: eth0\n"
                           "    NCCL_DEBUG: warn\n"
                           "    NCCL_ALGO: Ring\n"
                           "    NCCL_PROTO: simple\n"
                           "    NCCL_BUFFSIZE: 0x400000\n"
                           "    NCCL_NCHANNELS_PER_NET_PEER: 2\n"
                           "    NCCL_P2P_DISABLE: no\n"
                           "    NCCL_IB_HCA: [mlx5_0:1, mlx5_1:1]\n";
  Recipe r = Recipe::fromString(yaml, "r.yaml");
  Schema schema;
  describeCoreKeys(schema);
  // The map's entries are not schema keys, and the schema does not call them unknown.
  EXPECT_EQ(r.validateAll(schema), std::vector<std::string>{});
  EXPECT_EQ(nccl::checkRecipe(r), std::vector<std::string>{});
  std::map<std::string, std::string> got;
  for (const auto& s : nccl::settingsFromRecipe(r)) got[s.name] = s.value;
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"NCCL_ALGO", "Ring"},
                                                     {"NCCL_BUFFSIZE", "4194304"},
                                                     {"NCCL_DEBUG", "WARN"},
                                                     {"NCCL_IB_DISABLE", "1"},
                                                     {"NCCL_IB_HCA", "mlx5_0:1,mlx5_1:1"},
                                                     {"NCCL_NCHANNELS_PER_NET_PEER", "2"},
                                                     {"NCCL_NET_GDR_LEVEL", "PHB"},
                                                     {"NCCL_P2P_DISABLE", "0"},
                                                     {"NCCL_PROTO", "Simple"},
                                                     {"NCCL_SOCKET_IFNAME", "eth0"}}));
  // The resolved recipe keeps the map, and reads back the same.
  Recipe back = Recipe::fromString(r.toYaml(), "back.yaml");
  EXPECT_EQ(back.validateAll(schema), std::vector<std::string>{});
  EXPECT_EQ(nccl::settingsFromRecipe(back).size(), 10u);
}

TEST(NcclSettings, UnknownNamesSuggestTheClosest) {
  EXPECT_EQ(problemsOf("    NCCL_BUFSIZE: 4194304\n"),
            std::vector<std::string>{
                "r.yaml:5:5: communication.nccl.NCCL_BUFSIZE: unknown NCCL variable; did you mean 'NCCL_BUFFSIZE'?"});
  EXPECT_EQ(errorFor("nccl_debug", "WARN"), "unknown NCCL variable; did you mean 'NCCL_DEBUG'?");
  EXPECT_EQ(errorFor("NCCL_IB_TIMOUT", "20"), "unknown NCCL variable; did you mean 'NCCL_IB_TIMEOUT'?");
  EXPECT_EQ(errorFor("NCCL_NOT_A_THING_AT_ALL", "1"),
            "unknown NCCL variable; `ptrain keys --nccl` lists the variables a recipe may set");
  EXPECT_EQ(errorFor("GLOO_SOCKET_IFNAME", "eth0"),
            "not an NCCL variable (their names start with NCCL_); set other variables in the environment");
  EXPECT_EQ(errorFor("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            "PyTorch reads this variable, not NCCL; set it in the environment instead");
}

TEST(NcclSettings, IntegersOutOfRangeSayTheRange) {
  EXPECT_EQ(problemsOf("    NCCL_IB_TIMEOUT: 40\n"),
            std::vector<std::string>{
                "r.yaml:5:5: communication.nccl.NCCL_IB_TIMEOUT: 40 is out of range; use an integer in [1, 31]"});
  EXPECT_EQ(errorFor("NCCL_IB_RETRY_CNT", "10"), "10 is out of range; use an integer in [0, 7]");
  EXPECT_EQ(errorFor("NCCL_SOCKET_NTHREADS", "0"), "0 is out of range; use an integer in [1, 16]");
  EXPECT_EQ(errorFor("NCCL_BUFFSIZE", "4M"), "expected an integer >= 1, got '4M'; write a whole number");
  EXPECT_EQ(errorFor("NCCL_BUFFSIZE", "0"), "0 is out of range; use an integer >= 1");
  EXPECT_EQ(errorFor("NCCL_IB_GID_INDEX", "-2"), "-2 is out of range; use an integer >= -1");
  EXPECT_EQ(normalized("NCCL_IB_GID_INDEX", "-1"), "-1");
  EXPECT_EQ(normalized("NCCL_IB_TIMEOUT", "0x16"), "22");
  EXPECT_EQ(errorFor("NCCL_DEBUG_FILE", ""), "empty value; remove the key to leave NCCL's default");
}

TEST(NcclSettings, ChoicesBoolsAndLevels) {
  EXPECT_EQ(problemsOf("    NCCL_DEBUG: LOUD\n"),
            std::vector<std::string>{"r.yaml:5:5: communication.nccl.NCCL_DEBUG: 'LOUD' is not one of VERSION, WARN, "
                                     "INFO, ABORT or TRACE; use one of them"});
  EXPECT_EQ(errorFor("NCCL_DEBUG", "WRN"),
            "'WRN' is not one of VERSION, WARN, INFO, ABORT or TRACE; did you mean 'WARN'?");
  EXPECT_EQ(normalized("NCCL_DEBUG", "info"), "INFO");
  // NCCL compares these with strcmp: the case matters.
  EXPECT_EQ(errorFor("NCCL_LAUNCH_MODE", "group"),
            "'group' is not one of PARALLEL or GROUP; write 'GROUP' (NCCL reads it case-sensitively)");
  EXPECT_EQ(normalized("NCCL_SOCKET_FAMILY", "AF_INET6"), "AF_INET6");
  EXPECT_EQ(errorFor("NCCL_NTHREADS", "100"), "'100' is not one of 64, 128, 256 or 512; use one of them");
  EXPECT_EQ(normalized("NCCL_NTHREADS", "256"), "256");

  EXPECT_EQ(normalized("NCCL_IB_DISABLE", "1"), "1");
  EXPECT_EQ(normalized("NCCL_IB_DISABLE", "true"), "1");
  EXPECT_EQ(normalized("NCCL_IB_DISABLE", "Off"), "0");
  EXPECT_EQ(errorFor("NCCL_IB_DISABLE", "2"), "expected 0 or 1 (true or false), got '2'; write 0 or 1");

  EXPECT_EQ(normalized("NCCL_P2P_LEVEL", "NVL"), "NVL");
  EXPECT_EQ(normalized("NCCL_NET_GDR_LEVEL", "5"), "5");  // legacy numbers above 4 mean SYS
  EXPECT_EQ(errorFor("NCCL_NET_GDR_LEVEL", "phb"),
            "'phb' is not a level (LOC, NVL, PIX, PXB, PHB or SYS, or a legacy integer >= 0); write 'PHB' (NCCL "
            "reads levels case-sensitively)");
  EXPECT_EQ(errorFor("NCCL_P2P_LEVEL", "PBH"),
            "'PBH' is not a level (LOC, NVL, PIX, PXB, PHB or SYS, or a legacy integer >= 0); did you mean 'PHB'?");
  EXPECT_EQ(errorFor("NCCL_P2P_LEVEL", "-1"),
            "'-1' is not a level (LOC, NVL, PIX, PXB, PHB or SYS, or a legacy integer >= 0); use one of them");
}

TEST(NcclSettings, AlgorithmAndProtocolSyntax) {
  EXPECT_EQ(normalized("NCCL_ALGO", "ring"), "Ring");
  EXPECT_EQ(normalized("NCCL_ALGO", "ring,TREE"), "Ring,Tree");
  EXPECT_EQ(normalized("NCCL_ALGO", "^nvls,nvlstree"), "^NVLS,NVLSTree");
  EXPECT_EQ(normalized("NCCL_ALGO", "allreduce:tree;allgather:ring"), "AllReduce:Tree;AllGather:Ring");
  EXPECT_EQ(normalized("NCCL_ALGO", "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"),
            "Ring,CollnetDirect;AllReduce:Tree,CollnetDirect;Broadcast:Ring");
  EXPECT_EQ(normalized("NCCL_ALGO", "allreduce:^tree"), "AllReduce:^Tree");
  EXPECT_EQ(normalized("NCCL_PROTO", "LL,Simple;allreduce:^LL"), "LL,Simple;AllReduce:^LL");
  EXPECT_EQ(normalized("NCCL_PROTO", "^ll128"), "^LL128");

  EXPECT_EQ(errorFor("NCCL_ALGO", "Rign"),
            "'Rign' is not an algorithm (Tree, Ring, CollnetDirect, CollnetChain, NVLS, NVLSTree or PAT); did you "
            "mean 'Ring'?");
  EXPECT_EQ(errorFor("NCCL_ALGO", "tree;ring"),
            "'ring' needs a collective before it ('allreduce:ring'): only the first entry applies to all collectives");
  EXPECT_EQ(errorFor("NCCL_ALGO", "allreduc:tree"),
            "'allreduc' is not a collective (Broadcast, Reduce, AllGather, ReduceScatter or AllReduce); did you mean "
            "'AllReduce'?");
  EXPECT_EQ(errorFor("NCCL_ALGO", "allreduce:"),
            "no algorithm in 'allreduce:'; e.g. Ring,Tree, ^NVLS or allreduce:tree;allgather:ring");
  EXPECT_EQ(errorFor("NCCL_ALGO", "allreduce:tree;AllReduce:ring"),
            "AllReduce is given twice in 'allreduce:tree;AllReduce:ring'; give each collective once");
  EXPECT_EQ(errorFor("NCCL_ALGO", "ring,,tree"),
            "empty entry in 'ring,,tree'; e.g. Ring,Tree, ^NVLS or allreduce:tree;allgather:ring");
  EXPECT_EQ(errorFor("NCCL_ALGO", "^"), "no algorithm in '^'; e.g. Ring,Tree, ^NVLS or allreduce:tree;allgather:ring");
  EXPECT_EQ(errorFor("NCCL_PROTO", "Simpel"),
            "'Simpel' is not a protocol (LL, LL128 or Simple); did you mean 'Simple'?");
}

TEST(NcclSettings, InterfaceDeviceAndSubsystemLists) {
  EXPECT_EQ(normalized("NCCL_SOCKET_IFNAME", "^docker0,lo"), "^docker0,lo");
  EXPECT_EQ(normalized("NCCL_SOCKET_IFNAME", "=eth0,eth1"), "=eth0,eth1");
  EXPECT_EQ(normalized("NCCL_SOCKET_IFNAME", "^=docker0"), "^=docker0");
  EXPECT_EQ(errorFor("NCCL_SOCKET_IFNAME", "eth0,,lo"),
            "empty entry in 'eth0,,lo'; write names separated by single commas, e.g. eth0, =eth0,eth1 or ^docker,lo");
  EXPECT_EQ(errorFor("NCCL_SOCKET_IFNAME", "eth0, lo"),
            "' lo' is not an interface name; '^' may only start the list and '=' each name, no spaces (e.g. eth0, "
            "=eth0,eth1 or ^docker,lo)");
  EXPECT_EQ(errorFor("NCCL_SOCKET_IFNAME", "eth0:1"),
            "'eth0:1' is not an interface name (':' gives a port, which only NCCL_IB_HCA takes); e.g. eth0, "
            "=eth0,eth1 or ^docker,lo");
  EXPECT_EQ(normalized("NCCL_IB_HCA", "=mlx5_0:1,mlx5_1"), "=mlx5_0:1,mlx5_1");
  EXPECT_EQ(errorFor("NCCL_IB_HCA", "mlx5_0:x"),
            "'mlx5_0:x' has a bad port; write device:port with a port >= 1, e.g. mlx5_0:1,mlx5_1:1 or ^mlx5_2");
  EXPECT_EQ(normalized("NCCL_DEBUG_SUBSYS", "init,net"), "INIT,NET");
  EXPECT_EQ(normalized("NCCL_DEBUG_SUBSYS", "^proxy"), "^PROXY");
  EXPECT_EQ(errorFor("NCCL_DEBUG_SUBSYS", "INIT,TUNNING"),
            "'TUNNING' is not a debug subsystem (INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV, ALLOC, CALL, PROXY, "
            "NVLS, BOOTSTRAP, REG, PROFILE, RAS or ALL); did you mean 'TUNING'?");
}

TEST(NcclSettings, ValuesThatAreNotScalars) {
  // A YAML list is joined with ',' where NCCL reads a list, refused elsewhere.
  EXPECT_EQ(problemsOf("    NCCL_SOCKET_IFNAME: [eth0, eth1]\n"), std::vector<std::string>{});
  EXPECT_EQ(problemsOf("    NCCL_DEBUG: [WARN]\n"),
            std::vector<std::string>{"r.yaml:5:5: communication.nccl.NCCL_DEBUG: expected one of VERSION, WARN, "
                                     "INFO, ABORT or TRACE (any case), got a list; write a single value"});
  EXPECT_EQ(problemsOf("    NCCL_ALGO: {allreduce: tree}\n"),
            std::vector<std::string>{
                "r.yaml:5:5: communication.nccl.NCCL_ALGO: expected a single value, got a mapping; write "
                "NCCL_ALGO: <value>"});
  // The map itself must be a mapping: the schema says so.
  Recipe r = Recipe::fromString(std::string(kMinimal) + "communication: {nccl: 3}\n", "r.yaml");
  Schema schema;
  describeCoreKeys(schema);
  EXPECT_EQ(r.validateAll(schema),
            std::vector<std::string>{
                "r.yaml:3:23: communication.nccl: expected a mapping, got '3'; write keys below it, e.g. {key: value}"});
  EXPECT_EQ(nccl::checkRecipe(r), std::vector<std::string>{});
}

TEST(NcclSettings, CombinationsNcclRefuses) {
  EXPECT_EQ(problemsOf("    NCCL_SOCKET_NTHREADS: 16\n    NCCL_NSOCKS_PERTHREAD: 8\n"),
            std::vector<std::string>{
                "r.yaml:6:5: communication.nccl.NCCL_NSOCKS_PERTHREAD: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD "
                "= 16 x 8 = 128 sockets per connection, more than NCCL's 64; lower one of them"});
  EXPECT_EQ(problemsOf("    NCCL_SOCKET_NTHREADS: 8\n    NCCL_NSOCKS_PERTHREAD: 8\n"), std::vector<std::string>{});
  EXPECT_EQ(problemsOf("    NCCL_MIN_NCHANNELS: 8\n    NCCL_MAX_NCHANNELS: 4\n"),
            std::vector<std::string>{"r.yaml:5:5: communication.nccl.NCCL_MIN_NCHANNELS: 8 is above "
                                     "NCCL_MAX_NCHANNELS=4; make the minimum at most the maximum"});
}

TEST(NcclSettings, EveryProblemIsReportedAndOverridesAreLocated) {
  Recipe r = Recipe::fromString(std::string(kMinimal) +
                                    "communication:\n  nccl:\n    NCCL_IB_SL: 16\n    NCCL_PROTOCOL: LL\n",
                                "r.yaml", {"communication.nccl.NCCL_CROSS_NIC=3"});
  EXPECT_EQ(nccl::checkRecipe(r),
            (std::vector<std::string>{
                "<command line>: communication.nccl.NCCL_CROSS_NIC: 3 is out of range; use an integer in [0, 2]",
                "r.yaml:5:5: communication.nccl.NCCL_IB_SL: 16 is out of range; use an integer in [0, 15]",
                "r.yaml:6:5: communication.nccl.NCCL_PROTOCOL: unknown NCCL variable; did you mean 'NCCL_PROTO'?"}));
  try {
    nccl::settingsFromRecipe(r);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "<command line>: communication.nccl.NCCL_CROSS_NIC: 3 is out of range; use an integer in [0, 2]");
  }
}

TEST(NcclSettings, EnvironmentWinsOverTheRecipe) {
  const std::vector<nccl::Setting> recipe = {{"NCCL_ALGO", "Ring"}, {"NCCL_DEBUG", "WARN"}, {"NCCL_IB_HCA", "mlx5_0"}};
  const std::map<std::string, std::string> env = {{"NCCL_DEBUG", "INFO"}, {"NCCL_IB_HCA", ""}, {"PATH", "/bin"}};
  auto lookup = [&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  const auto effective = nccl::effectiveSettings(recipe, lookup);
  ASSERT_EQ(effective.size(), 3u);
  EXPECT_EQ(effective[0].source, nccl::Source::kRecipe);
  EXPECT_EQ(effective[0].value, "Ring");
  EXPECT_EQ(effective[1].source, nccl::Source::kEnvironment);
  EXPECT_EQ(effective[1].value, "INFO");
  EXPECT_EQ(effective[1].recipe_value, "WARN");
  std::vector<std::string> header;
  for (const auto& e : effective) header.push_back(nccl::headerLine(e));
  // Set to the empty string still counts as set: NCCL then takes its default.
  EXPECT_EQ(header, (std::vector<std::string>{"NCCL_ALGO=Ring (recipe)",
                                              "NCCL_DEBUG=INFO (environment, recipe says WARN)",
                                              "NCCL_IB_HCA= (environment, recipe says mlx5_0)"}));
  EXPECT_EQ(nccl::environmentEntries(effective), std::vector<std::string>{"NCCL_ALGO=Ring"});
}

TEST(NcclSettings, ApplySetsOnlyWhatTheEnvironmentLacks) {
  ScopedEnv debug("NCCL_DEBUG", "INFO");
  ScopedEnv dump("NCCL_TOPO_DUMP_FILE", nullptr);
  const auto effective = nccl::applySettings({{"NCCL_DEBUG", "WARN"}, {"NCCL_TOPO_DUMP_FILE", "/tmp/topo.xml"}});
  EXPECT_STREQ(std::getenv("NCCL_DEBUG"), "INFO");
  EXPECT_STREQ(std::getenv("NCCL_TOPO_DUMP_FILE"), "/tmp/topo.xml");
  ASSERT_EQ(effective.size(), 2u);
  EXPECT_EQ(nccl::headerLine(effective[0]), "NCCL_DEBUG=INFO (environment, recipe says WARN)");
  EXPECT_EQ(nccl::headerLine(effective[1]), "NCCL_TOPO_DUMP_FILE=/tmp/topo.xml (recipe)");
}

// A run in this process (no launcher): the session sets the variables before
// it creates its communicator, and prints the header on rank 0.
TEST(NcclSettings, InProcessSessionExportsTheSettings) {
  TempDir dir;
  const std::string recipe = dir.write("tiny.yaml",
                                       "trainer: {name: llm}\n"
                                       "model: {num_layers: 1, hidden_size: 16, num_attention_heads: 2, seq_length: 8}\n"
                                       "data: {name: arithmetic, digits: 1, operations: [add], eval_size: 8}\n"
                                       "train: {steps: 1, global_batch_size: 2}\n"
                                       "communication:\n"
                                       "  nccl:\n"
                                       "    NCCL_TOPO_DUMP_FILE: " + dir.path() + "/topo.xml\n"
                                       "    NCCL_DEBUG: warn\n");
  ScopedEnv dump("NCCL_TOPO_DUMP_FILE", nullptr);
  ScopedEnv debug("NCCL_DEBUG", "INFO");
  PreparedRecipe prepared = prepareRecipe(recipe, {}, 1);
  RankEnv env;
  env.master_port = test::freePort();
  EngineOptions options;
  options.run_dir = dir.path();
  testing::internal::CaptureStderr();
  {
    TrainingSession session(prepared, env, options);
    EXPECT_STREQ(std::getenv("NCCL_TOPO_DUMP_FILE"), (dir.path() + "/topo.xml").c_str());
    EXPECT_STREQ(std::getenv("NCCL_DEBUG"), "INFO");
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("NCCL_DEBUG=INFO (environment, recipe says WARN)\n"), std::string::npos) << err;
  EXPECT_NE(err.find("NCCL_TOPO_DUMP_FILE=" + dir.path() + "/topo.xml (recipe)\n"), std::string::npos) << err;
}

// prepareRecipe (what `ptrain run` and every worker call) refuses a bad entry too.
TEST(NcclSettings, PrepareRecipeRefusesABadEntry) {
  TempDir dir;
  const std::string recipe = dir.write("bad.yaml", std::string(kMinimal) + "communication: {nccl: {NCCL_ALGO: Rign}}\n");
  try {
    prepareRecipe(recipe, {}, 1);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              recipe + ":3:24: communication.nccl.NCCL_ALGO: 'Rign' is not an algorithm (Tree, Ring, CollnetDirect, "
                       "CollnetChain, NVLS, NVLSTree or PAT); did you mean 'Ring'?");
  }
}

// The NCCL table is checked whatever the backend (a recipe written for a GPU
// cluster is checked on a laptop); `auto` runs here.
const char* kCheckable =
    "trainer: {name: llm}\n"
    "model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, seq_length: 9}\n"
    "train: {steps: 10, global_batch_size: 4}\n"
    "communication:\n"
    "  backend: auto\n"
    "  nccl:\n";

TEST(NcclCheck, BadValueExitsTwoWithTheKeyPath) {
  TempDir dir;
  const std::string path = dir.write("bad.yaml", std::string(kCheckable) + "    NCCL_IB_TIMEOUT: 99\n");
  test::ProcessResult r = runPtrain({"check", path}, {}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output),
            std::vector<std::string>{"ptrain: " + path +
                                     ":7:5: communication.nccl.NCCL_IB_TIMEOUT: 99 is out of range; use an integer "
                                     "in [1, 31]"});
  // An unknown name, next to a schema problem: both reported, one line each.
  const std::string two =
      dir.write("two.yaml", std::string(kCheckable) + "    NCCL_SOCKET_IFNAM: eth0\n" + "train_steps: 3\n");
  r = runPtrain({"check", two}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(lines(r.output),
            (std::vector<std::string>{
                "ptrain: " + two + ":8:1: train_steps: unknown key; did you mean 'train.steps'?",
                "ptrain: " + two +
                    ":7:5: communication.nccl.NCCL_SOCKET_IFNAM: unknown NCCL variable; did you mean "
                    "'NCCL_SOCKET_IFNAME'?"}));
}

TEST(NcclCheck, ValidMapIsListedWithItsSource) {
  TempDir dir;
  const std::string path =
      dir.write("ok.yaml", std::string(kCheckable) + "    NCCL_ALGO: ring\n    NCCL_SOCKET_IFNAME: eth0\n");
  test::ProcessResult r = runPtrain({"check", path}, {"NCCL_SOCKET_IFNAME=lo"}, 60);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "nccl: NCCL_ALGO=Ring (recipe)\n"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "nccl: NCCL_SOCKET_IFNAME=lo (environment, recipe says eth0)\n"), 1u) << r.output;
}

// `ptrain run` prints the header once, from the launcher (its worker does not
// repeat it), and the run goes through.
TEST(NcclRun, HeaderComesFromTheLauncherOnce) {
  TempDir dir;
  const std::string path = dir.write("run.yaml",
                                     "trainer: {name: llm}\n"
                                     "model: {num_layers: 1, hidden_size: 16, num_attention_heads: 2, seq_length: 8}\n"
                                     "data: {name: arithmetic, digits: 1, operations: [add], eval_size: 8}\n"
                                     "train: {steps: 2, global_batch_size: 2}\n"
                                     "checkpoint: {save_final: false}\n"
                                     "log: {progress: none}\n"
                                     "communication:\n"
                                     "  nccl:\n"
                                     "    NCCL_DEBUG: warn\n"
                                     "    NCCL_ALGO: Ring\n");
  test::ProcessResult r =
      runPtrain({"run", path, "--nproc", "1", "--run-dir", dir.path() + "/run"}, {"NCCL_ALGO=Tree"}, 300);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "NCCL_DEBUG=WARN (recipe)\n"), 1u) << r.output;
  EXPECT_EQ(count(r.output, "NCCL_ALGO=Tree (environment, recipe says Ring)\n"), 1u) << r.output;
}

// docs/recipes.md lists the variables between markers; it must equal what
// `ptrain keys --nccl --markdown` prints.
TEST(NcclDocs, RecipesDocListsEveryVariable) {
  const std::string section = test::markedSection(test::sourceDir() + "/docs/recipes.md", "nccl");
  ASSERT_FALSE(section.empty());
  const auto trim = test::trimNewlines;
  test::ProcessResult r = runPtrain({"keys", "--nccl", "--markdown"}, {}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(section, trim(r.output))
      << "docs/recipes.md is out of date: replace the table between the nccl markers with the output of "
         "`ptrain keys --nccl --markdown`";
  EXPECT_EQ(trim(r.output), trim(nccl::variablesMarkdown()));
}

}  // namespace
}  // namespace ptrain
