// The plugin loader: finds real plugins, and refuses each broken fixture with
// a message naming the file and the reason.
#include <gtest/gtest.h>

#include "ptrain/comm/backend.h"
#include "ptrain/plugin/registry.h"
#include "support/test_support.h"

namespace {

std::string fixture(const std::string& name) { return std::string(PTRAIN_FIXTURE_DIR) + "/" + name; }

std::string loopbackDir() { return ptrain::test::binaryDir() + "/examples/loopback_plugin/plugins"; }

template <typename F>
std::string loadError(F&& f) {
  try {
    f();
  } catch (const ptrain::PluginLoadError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(PluginRegistry, FindsTheExamplePluginAndCreatesIt) {
  ptrain::PluginRegistry registry({loopbackDir()});
  const auto& plugins = registry.plugins();
  ASSERT_EQ(plugins.size(), 1u);
  EXPECT_EQ(plugins[0].kind, "comm");
  EXPECT_EQ(plugins[0].name, "loopback");
  EXPECT_EQ(plugins[0].version, "1.0.0");
  ptrain::PluginContext ctx;
  auto plugin = registry.create("comm", "loopback", ctx);
  ASSERT_STREQ(plugin->kind(), "comm");
  auto* backend = static_cast<ptrain::CommBackend*>(plugin.get());
  EXPECT_EQ(backend->backendName(), "loopback");
}

TEST(PluginRegistry, RefusesWrongAbiVersion) {
  std::string lib = fixture("bad_abi/libfixture_bad_abi.so");
  EXPECT_EQ(loadError([&] { ptrain::PluginRegistry::inspect(lib); }),
            lib + ": plugin ABI version 999, this ptrain needs " + std::to_string(ptrain::kPluginAbiVersion) +
                ": rebuild the plugin against this ptrain");
}

TEST(PluginRegistry, RefusesLibraryWithoutDescriptor) {
  std::string lib = fixture("no_descriptor/libfixture_no_descriptor.so");
  EXPECT_EQ(loadError([&] { ptrain::PluginRegistry::inspect(lib); }),
            lib + ": not a ptrain plugin (no 'ptrain_plugin_descriptor' symbol): export one with PTRAIN_DEFINE_PLUGIN");
}

TEST(PluginRegistry, RefusesWrongBuildTag) {
  std::string lib = fixture("wrong_build_tag/libfixture_wrong_build_tag.so");
  std::string err = loadError([&] { ptrain::PluginRegistry::inspect(lib); });
  EXPECT_EQ(err.rfind(lib + ": built for 'gcc4;cxx11abi=0;torch=1.0', this ptrain is '", 0), 0u) << err;
}

TEST(PluginRegistry, RefusesMissingFile) {
  ptrain::PluginRegistry registry({"/nonexistent/libptrain_comm_x.so"});
  EXPECT_EQ(loadError([&] { registry.discover(); }),
            "/nonexistent/libptrain_comm_x.so: plugin file or folder not found (check plugins.paths and "
            "PTRAIN_PLUGIN_PATH)");
}

TEST(PluginRegistry, RefusesDuplicateNameInOneFolder) {
  ptrain::PluginRegistry registry({fixture("duplicate")});
  std::string err = loadError([&] { registry.discover(); });
  EXPECT_NE(err.find("duplicate plugin parallel/echo"), std::string::npos) << err;
  EXPECT_NE(err.find("libfixture_dup_a.so"), std::string::npos) << err;
  EXPECT_NE(err.find("libfixture_dup_b.so"), std::string::npos) << err;
}

TEST(PluginRegistry, EarlierSearchEntryShadowsLater) {
  ptrain::PluginRegistry registry({fixture("parallel_echo"), fixture("duplicate")});
  // Only the fixture from the first entry is listed; the duplicate folder is
  // still refused because its two libraries clash with each other.
  EXPECT_NE(loadError([&] { registry.discover(); }).find("duplicate plugin"), std::string::npos);
  ptrain::PluginRegistry ok({fixture("parallel_echo"), loopbackDir()});
  EXPECT_EQ(ok.plugins().size(), 2u);
}

TEST(PluginRegistry, RefusesWrongKind) {
  ptrain::PluginRegistry registry({fixture("parallel_echo")});
  ptrain::PluginContext ctx;
  std::string err = loadError([&] { registry.create("comm", "echo", ctx, "communication.backend"); });
  EXPECT_EQ(err.rfind("communication.backend: 'echo' is a parallel plugin (", 0), 0u) << err;
  EXPECT_NE(err.find("), not a comm plugin"), std::string::npos) << err;
}

TEST(PluginRegistry, UnknownNameSuggestsNearest) {
  ptrain::PluginRegistry registry({loopbackDir()});
  ptrain::PluginContext ctx;
  std::string err = loadError([&] { registry.create("comm", "loopbak", ctx, "communication.backend"); });
  EXPECT_EQ(err.rfind("communication.backend: no comm plugin named 'loopbak' (did you mean 'loopback'?); "
                      "available: loopback; searched ",
                      0),
            0u)
      << err;
}

TEST(PluginRegistry, PluginsCommandListsOutOfTreePluginFromEnvironment) {
  auto r = ptrain::test::runPtrain({"plugins"}, {"PTRAIN_PLUGIN_PATH=" + loopbackDir()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("comm       loopback       1.0.0     " + loopbackDir() + "/libptrain_comm_loopback.so"),
            std::string::npos)
      << r.output;
}

TEST(PluginRegistry, PluginsCommandRefusesBrokenPluginWithOneLine) {
  auto r = ptrain::test::runPtrain({"plugins", "--path", fixture("bad_abi")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "ptrain: " + fixture("bad_abi/libfixture_bad_abi.so") +
                          ": plugin ABI version 999, this ptrain needs " + std::to_string(ptrain::kPluginAbiVersion) +
                          ": rebuild the plugin against this ptrain\n");
}
