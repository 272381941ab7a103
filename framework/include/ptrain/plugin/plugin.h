// The plugin boundary: the descriptor every plugin library exports, the base
// class of every plugin object, and the context the core hands to factories.
//
// A plugin is one shared library exporting exactly one PluginDescriptor under
// the symbol `ptrain_plugin_descriptor` (PTRAIN_DEFINE_PLUGIN does this with
// BOOST_DLL_ALIAS). The loader reads and checks the descriptor (ABI version,
// build tag) before it calls anything else in the library, and never unloads a
// library: objects it created may live until the process exits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include <boost/dll/alias.hpp>
#include <c10/core/Device.h>
#include <torch/version.h>

#include "ptrain/core/error.h"

namespace spdlog {
class logger;
}

namespace ptrain {

class Recipe;
class Schema;

// Bumped whenever a class crossing the plugin boundary changes layout or
// virtual table. A plugin built against another ABI version is refused.
// 3: the descriptor declares the plugin's recipe keys and, for a parallel
// plugin, the layout dimensions it executes.
inline constexpr uint32_t kPluginAbiVersion = 3;

// Kinds of plugin the core knows how to use.
namespace plugin_kind {
inline constexpr const char* kComm = "comm";
inline constexpr const char* kParallel = "parallel";
inline constexpr const char* kPrecision = "precision";
inline constexpr const char* kOffload = "offload";
inline constexpr const char* kTrainer = "trainer";
}  // namespace plugin_kind

// What the core hands to every plugin factory. The pointers stay valid for the
// lifetime of the plugin object; the plugin does not own them.
struct PluginContext {
  std::shared_ptr<spdlog::logger> logger;  // rank-prefixed, owned by the core
  const Recipe* recipe = nullptr;          // resolved recipe; null in `ptrain plugins`
  int rank = 0;                            // global rank of this process
  int world_size = 1;
  // Where the plugin's model computes (the recipe's `device`): parameters, activations
  // and the scalars that go through collectives live there.
  at::Device device{at::kCPU};
};

// Base of every plugin object. Dispatch on kind() and static_cast to the kind's
// interface: dynamic_cast across shared libraries is not relied upon.
class PTRAIN_API Plugin {
 public:
  virtual ~Plugin();
  virtual const char* kind() const = 0;
};

using PluginFactory = Plugin* (*)(const PluginContext&);
// Adds the plugin's own recipe keys to a schema (keys::key and the other
// builders of ptrain/recipe/key_specs.h). The core calls it for the plugins a
// recipe uses, so a key of a plugin the recipe does not use is refused as
// unknown; the plugin reads its keys itself, through PluginContext::recipe.
using PluginKeysFunction = void (*)(Schema&);

// Exported by every plugin library. Plain data only, so the loader can read it
// without trusting anything else in the library.
struct PluginDescriptor {
  uint32_t abi_version;
  const char* build_tag;  // compiler, libstdc++ ABI and libtorch version it was built with
  const char* kind;
  const char* name;
  const char* version;
  PluginFactory factory;  // returns a new object; the caller owns it
  // The plugin's recipe keys (the class's static `recipeKeys(Schema&)`);
  // null: it has none.
  PluginKeysFunction describe_keys;
  // A parallel plugin: the layout dimensions it executes, comma-separated,
  // from tp, cp, ep, etp, pp, dp (the class's static `kExecutes`); the engine
  // applies the plugins a layout needs by these, in that order. Null for
  // every other kind.
  const char* executes;
};

namespace detail {
// What PTRAIN_DEFINE_PLUGIN reads from the plugin's class when it has it:
// `static void recipeKeys(Schema&)` and `static constexpr const char*
// kExecutes`.
template <class C, class = void>
struct PluginKeysOf {
  static constexpr PluginKeysFunction value = nullptr;
};
template <class C>
struct PluginKeysOf<C, std::void_t<decltype(&C::recipeKeys)>> {
  static constexpr PluginKeysFunction value = &C::recipeKeys;
};
template <class C, class = void>
struct PluginExecutesOf {
  static constexpr const char* value = nullptr;
};
template <class C>
struct PluginExecutesOf<C, std::void_t<decltype(C::kExecutes)>> {
  static constexpr const char* value = C::kExecutes;
};
}  // namespace detail

}  // namespace ptrain

#define PTRAIN_STRINGIFY_IMPL(x) #x
#define PTRAIN_STRINGIFY(x) PTRAIN_STRINGIFY_IMPL(x)

#if defined(__clang__)
#define PTRAIN_COMPILER_TAG "clang" PTRAIN_STRINGIFY(__clang_major__)
#elif defined(__GNUC__)
#define PTRAIN_COMPILER_TAG "gcc" PTRAIN_STRINGIFY(__GNUC__)
#else
#define PTRAIN_COMPILER_TAG "unknown"
#endif

// Two binaries may share C++ objects only when all three parts agree.
#define PTRAIN_BUILD_TAG                                                   \
  PTRAIN_COMPILER_TAG ";cxx11abi=" PTRAIN_STRINGIFY(_GLIBCXX_USE_CXX11_ABI) \
  ";torch=" PTRAIN_STRINGIFY(TORCH_VERSION_MAJOR) "." PTRAIN_STRINGIFY(TORCH_VERSION_MINOR)

// PTRAIN_DEFINE_PLUGIN(kind, name, version, Class): exports the descriptor of a
// plugin whose object is `new Class(context)`. Use once, in one .cpp file of
// the plugin, at global namespace scope. A class with a static
// `recipeKeys(Schema&)` declares its keys through it; a parallel plugin's
// class names the dimensions it executes in `static constexpr const char*
// kExecutes = "tp";`.
#define PTRAIN_DEFINE_PLUGIN(kind_, name_, version_, Class)                   \
  namespace {                                                                \
  ::ptrain::Plugin* ptrainCreatePlugin(const ::ptrain::PluginContext& ctx) {  \
    return new Class(ctx);                                                   \
  }                                                                          \
  }                                                                          \
  extern "C" const ::ptrain::PluginDescriptor ptrain_descriptor_instance;     \
  const ::ptrain::PluginDescriptor ptrain_descriptor_instance{                \
      ::ptrain::kPluginAbiVersion, PTRAIN_BUILD_TAG, kind_, name_, version_,  \
      &ptrainCreatePlugin, ::ptrain::detail::PluginKeysOf<Class>::value,       \
      ::ptrain::detail::PluginExecutesOf<Class>::value};                     \
  BOOST_DLL_ALIAS(ptrain_descriptor_instance, ptrain_plugin_descriptor)
