#include "ptrain/plugin/registry.h"

#include <dlfcn.h>
#include <elf.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <boost/dll/shared_library.hpp>

#include "ptrain/core/logging.h"
#include "ptrain/core/text.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

constexpr const char* kDescriptorSymbol = "ptrain_plugin_descriptor";

// Libraries are never unloaded: objects they created (and code their vtables
// point to) may live until exit. The list itself is intentionally leaked so no
// destructor runs at exit while plugin objects may still be alive.
std::map<std::string, boost::dll::shared_library>& loadedLibraries() {
  static auto* libs = new std::map<std::string, boost::dll::shared_library>();
  return *libs;
}

// Checks that `path` is a whole shared library of this machine's kind before
// the loader maps it: a truncated file would be mapped past its end and the
// first touch of the missing pages kills the process (SIGBUS); a foreign one
// would fail deep inside the loader. Throws PluginLoadError naming the file.
void validateLibraryFile(const std::string& path) {
  auto refuse = [&](const std::string& why) {
    throw PluginLoadError(path + ": not a usable plugin library: " + why +
                          "; rebuild or reinstall it, or remove it from the plugin path");
  };
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) refuse("not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) refuse("cannot read its size (" + ec.message() + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse("cannot be opened");
  Elf64_Ehdr header{};
  if (size < sizeof header || !in.read(reinterpret_cast<char*>(&header), sizeof header)) {
    refuse("too short to be a shared library (" + std::to_string(size) + " bytes)");
  }
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) refuse("not an ELF file");
  if (header.e_ident[EI_CLASS] != ELFCLASS64) refuse("not a 64-bit library");
#if defined(__x86_64__)
  constexpr uint16_t kMachine = EM_X86_64;
#elif defined(__aarch64__)
  constexpr uint16_t kMachine = EM_AARCH64;
#else
  const uint16_t kMachine = header.e_machine;
#endif
  if (header.e_machine != kMachine) refuse("built for another processor (ELF machine " + std::to_string(header.e_machine) + ")");
  if (header.e_type != ET_DYN) refuse("not a shared library (ELF type " + std::to_string(header.e_type) + ")");
  // Everything the loader maps must lie inside the file.
  const auto truncated = [&](uintmax_t need) {
    refuse("truncated: " + std::to_string(size) + " bytes, its headers describe " + std::to_string(need));
  };
  const uintmax_t phEnd = header.e_phoff + static_cast<uintmax_t>(header.e_phnum) * header.e_phentsize;
  if (header.e_phentsize != sizeof(Elf64_Phdr) || phEnd > size) truncated(phEnd);
  in.seekg(static_cast<std::streamoff>(header.e_phoff));
  for (int i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) truncated(phEnd);
    if (ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC) {
      const uintmax_t end = ph.p_offset + ph.p_filesz;
      if (end > size) truncated(end);
    }
  }
  const uintmax_t shEnd = header.e_shoff + static_cast<uintmax_t>(header.e_shnum) * header.e_shentsize;
  if (header.e_shoff != 0 && shEnd > size) truncated(shEnd);
}

const boost::dll::shared_library& openLibrary(const std::string& path) {
  auto& libs = loadedLibraries();
  auto it = libs.find(path);
  if (it != libs.end()) return it->second;
  validateLibraryFile(path);
  boost::dll::shared_library lib;
  boost::dll::fs::error_code ec;
  lib.load(path, boost::dll::load_mode::default_mode, ec);
  if (ec) {
    const char* why = dlerror();
    throw PluginLoadError(detail::concat(path, ": cannot load the library (", why ? why : ec.message(),
                                         "): rebuild the plugin against this ptrain"));
  }
  return libs.emplace(path, std::move(lib)).first->second;
}

bool isKnownKind(const std::string& kind) {
  for (const char* k : {plugin_kind::kComm, plugin_kind::kParallel, plugin_kind::kPrecision, plugin_kind::kOffload,
                        plugin_kind::kTrainer}) {
    if (kind == k) return true;
  }
  return false;
}

// Folder holding libptrain_core.so: the install/build plugin folder is
// <that folder>/ptrain/plugins.
std::string coreLibraryDir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&PluginRegistry::defaultSearchPath), &info) != 0 && info.dli_fname) {
    return fs::path(info.dli_fname).parent_path().string();
  }
  return "";
}

std::vector<std::string> splitColon(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ':'))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

struct PluginRegistry::Impl {
  std::vector<std::string> paths;
  bool discovered = false;
  std::vector<PluginInfo> plugins;
};

PluginRegistry::PluginRegistry(std::vector<std::string> paths) : impl_(std::make_unique<Impl>()) {
  impl_->paths = std::move(paths);
}

PluginRegistry::~PluginRegistry() = default;

std::vector<std::string> PluginRegistry::defaultSearchPath(const std::vector<std::string>& recipePaths) {
  std::vector<std::string> paths = recipePaths;
  if (const char* env = std::getenv("PTRAIN_PLUGIN_PATH")) {
    for (auto& p : splitColon(env)) paths.push_back(p);
  }
  std::string coreDir = coreLibraryDir();
  std::string installed = coreDir.empty() ? "" : (fs::path(coreDir) / "ptrain" / "plugins").string();
  if (!installed.empty() && fs::is_directory(installed)) {
    paths.push_back(installed);
  } else {
    paths.push_back(PTRAIN_PLUGIN_BUILD_DIR);
  }
  return paths;
}

const std::vector<std::string>& layoutDimensions() {
  static const std::vector<std::string> dimensions = {"tp", "cp", "ep", "etp", "pp", "dp"};
  return dimensions;
}

bool isLayoutDimension(const std::string& name) {
  const auto& all = layoutDimensions();
  return std::find(all.begin(), all.end(), name) != all.end();
}

PluginInfo PluginRegistry::inspect(const std::string& path) {
  if (!fs::exists(path)) {
    throw PluginLoadError(detail::concat(path, ": plugin file not found"));
  }
  const auto& lib = openLibrary(path);
  if (!lib.has(kDescriptorSymbol)) {
    throw PluginLoadError(detail::concat(path, ": not a ptrain plugin (no '", kDescriptorSymbol,
                                         "' symbol): export one with PTRAIN_DEFINE_PLUGIN"));
  }
  const auto& desc = lib.get_alias<const PluginDescriptor>(kDescriptorSymbol);
  // Only the first field is trusted until it matches.
  if (desc.abi_version != kPluginAbiVersion) {
    throw PluginLoadError(detail::concat(path, ": plugin ABI version ", desc.abi_version, ", this ptrain needs ",
                                         kPluginAbiVersion, ": rebuild the plugin against this ptrain"));
  }
  const std::string tag = desc.build_tag ? desc.build_tag : "";
  if (tag != PTRAIN_BUILD_TAG) {
    throw PluginLoadError(detail::concat(path, ": built for '", tag, "', this ptrain is '", PTRAIN_BUILD_TAG,
                                         "': rebuild the plugin with the same compiler, libstdc++ ABI and libtorch"));
  }
  PluginInfo info;
  info.kind = desc.kind ? desc.kind : "";
  info.name = desc.name ? desc.name : "";
  info.version = desc.version ? desc.version : "";
  info.path = path;
  info.build_tag = tag;
  if (!isKnownKind(info.kind)) {
    throw PluginLoadError(detail::concat(path, ": unknown plugin kind '", info.kind,
                                         "': use comm, parallel, precision, offload or trainer"));
  }
  if (info.name.empty() || desc.factory == nullptr) {
    throw PluginLoadError(detail::concat(path, ": the descriptor has no name or no factory"));
  }
  info.keys = desc.describe_keys;
  if (info.kind == plugin_kind::kParallel) {
    const std::string executes = desc.executes ? desc.executes : "";
    std::string part;
    for (size_t i = 0; i <= executes.size(); ++i) {
      if (i < executes.size() && executes[i] != ',') {
        if (executes[i] != ' ') part += executes[i];
        continue;
      }
      if (part.empty()) continue;
      if (!isLayoutDimension(part)) {
        throw PluginLoadError(detail::concat(path, ": parallel plugin '", info.name, "' executes '", part,
                                             "', which is not a layout dimension: use tp, cp, ep, etp, pp or dp"));
      }
      info.executes.push_back(part);
      part.clear();
    }
    if (info.executes.empty()) {
      throw PluginLoadError(detail::concat(path, ": parallel plugin '", info.name,
                                           "' names no dimension it executes: give its class `static constexpr "
                                           "const char* kExecutes` (tp, cp, ep, etp, pp or dp)"));
    }
  }
  return info;
}

void PluginRegistry::discover() {
  if (impl_->discovered) return;
  std::vector<PluginInfo> found;
  for (const auto& entry : impl_->paths) {
    std::vector<std::string> files;
    if (fs::is_directory(entry)) {
      for (auto it = fs::recursive_directory_iterator(entry, fs::directory_options::follow_directory_symlink);
           it != fs::recursive_directory_iterator(); ++it) {
        if (it->is_regular_file() && it->path().extension() == ".so") files.push_back(it->path().string());
      }
      std::sort(files.begin(), files.end());
    } else if (fs::exists(entry)) {
      files.push_back(entry);
    } else {
      throw PluginLoadError(detail::concat(entry, ": plugin file or folder not found (check plugins.paths and ",
                                           "PTRAIN_PLUGIN_PATH)"));
    }
    std::vector<PluginInfo> here;
    for (const auto& file : files) {
      PluginInfo info = inspect(file);
      for (const auto& other : here) {
        if (other.kind == info.kind && other.name == info.name) {
          throw PluginLoadError(detail::concat(file, ": duplicate plugin ", info.kind, "/", info.name, " (also in ",
                                               other.path, "): remove one of them"));
        }
      }
      here.push_back(info);
    }
    for (auto& info : here) {
      bool shadowed = std::any_of(found.begin(), found.end(), [&](const PluginInfo& f) {
        return f.kind == info.kind && f.name == info.name;
      });
      if (shadowed) {
        logger()->debug("plugin {}/{} at {} is shadowed by one found earlier", info.kind, info.name, info.path);
      } else {
        found.push_back(info);
      }
    }
  }
  impl_->plugins = std::move(found);
  impl_->discovered = true;
}

const std::vector<PluginInfo>& PluginRegistry::plugins() {
  discover();
  return impl_->plugins;
}

std::unique_ptr<Plugin> PluginRegistry::create(const std::string& kind, const std::string& name,
                                               const PluginContext& ctx, const std::string& requestedBy) {
  discover();
  const std::string who = requestedBy.empty() ? "" : requestedBy + ": ";
  const PluginInfo* match = nullptr;
  const PluginInfo* otherKind = nullptr;
  std::vector<std::string> sameKind;
  for (const auto& info : impl_->plugins) {
    if (info.kind == kind) sameKind.push_back(info.name);
    if (info.name != name) continue;
    if (info.kind == kind) match = &info;
    else otherKind = &info;
  }
  if (match == nullptr) {
    if (otherKind != nullptr) {
      throw PluginLoadError(detail::concat(who, "'", name, "' is a ", otherKind->kind, " plugin (", otherKind->path,
                                           "), not a ", kind, " plugin"));
    }
    const std::string suggestion = text::nearest(name, sameKind, 2);
    std::ostringstream known;
    for (size_t i = 0; i < sameKind.size(); ++i) known << (i ? ", " : "") << sameKind[i];
    std::ostringstream searched;
    for (size_t i = 0; i < impl_->paths.size(); ++i) searched << (i ? ":" : "") << impl_->paths[i];
    throw PluginLoadError(detail::concat(who, "no ", kind, " plugin named '", name, "'",
                                         suggestion.empty() ? "" : " (did you mean '" + suggestion + "'?)",
                                         "; available: ", sameKind.empty() ? "none" : known.str(),
                                         "; searched ", searched.str()));
  }
  const auto& lib = openLibrary(match->path);
  const auto& desc = lib.get_alias<const PluginDescriptor>(kDescriptorSymbol);
  std::unique_ptr<Plugin> plugin(desc.factory(ctx));
  PTRAIN_CHECK(plugin != nullptr, match->path, ": factory returned null");
  PTRAIN_CHECK_AS(PluginLoadError, kind == plugin->kind(), match->path, ": descriptor says kind '", kind,
                  "' but the object reports '", plugin->kind(), "'");
  return plugin;
}

}  // namespace ptrain
