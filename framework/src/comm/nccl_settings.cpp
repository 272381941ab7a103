#include "ptrain/comm/nccl_settings.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "ptrain/core/text.h"
#include "ptrain/recipe/recipe.h"

namespace ptrain::nccl {
namespace {

constexpr int64_t kNoMax = INT32_MAX;  // NCCL keeps most of its integer settings in an int

const std::vector<std::string> kLevels = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"};
// NCCL's names in ncclAlgoStr, ncclProtoStr and ncclFuncStr; matched with strcasecmp.
const std::vector<std::string> kAlgorithms = {"Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"};
const std::vector<std::string> kProtocols = {"LL", "LL128", "Simple"};
const std::vector<std::string> kFunctions = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};
// NCCL_DEBUG_SUBSYS names, matched with strcasecmp.
const std::vector<std::string> kSubsystems = {
    "INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC",
    "CALL", "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL"};

Variable integer(const char* name, int64_t min, int64_t max, const char* meaning) {
  Variable v;
  v.name = name;
  v.kind = ValueKind::kInteger;
  v.min = min;
  v.max = max;
  v.meaning = meaning;
  return v;
}

Variable simple(const char* name, ValueKind kind, const char* meaning) {
  Variable v;
  v.name = name;
  v.kind = kind;
  v.meaning = meaning;
  return v;
}

Variable flag(const char* name, const char* meaning) { return simple(name, ValueKind::kBool, meaning); }

Variable choice(const char* name, std::vector<std::string> choices, bool caseSensitive, const char* meaning) {
  Variable v = simple(name, ValueKind::kChoice, meaning);
  v.choices = std::move(choices);
  v.case_sensitive = caseSensitive;
  return v;
}

// NCCL's environment variables as its user guide documents them (the
// deprecated threshold variables left out). Bounds are the documented ones,
// or the width of the hardware field the value goes into (InfiniBand's
// 5-bit timeout, 3-bit retry count, 4-bit service level, 8-bit traffic class).
std::vector<Variable> buildTable() {
  using K = ValueKind;
  return {
      // System and process.
      simple("NCCL_CONF_FILE", K::kPath, "Configuration file of NAME=value lines read instead of ~/.nccl.conf."),
      flag("NCCL_IGNORE_CPU_AFFINITY", "Ignore the process's CPU affinity and bind NCCL threads to the GPU's NUMA node alone."),
      flag("NCCL_SET_THREAD_NAME", "Name NCCL's background threads (NCCL I/O, NCCL Proxy, ...) so debuggers and top show them."),
      flag("NCCL_SET_STACK_SIZE", "Raise the CUDA stack size to the largest NCCL kernel needs, once at startup."),
      flag("NCCL_CUMEM_ENABLE", "Allocate NCCL's buffers with the cuMem* virtual memory API."),
      flag("NCCL_CUMEM_HOST_ENABLE", "Allocate NCCL's host buffers with the cuMem* API."),
      choice("NCCL_LAUNCH_MODE", {"PARALLEL", "GROUP"}, true,
             "How kernels of several GPUs in one process are launched: PARALLEL at once, or as a GROUP."),
      flag("NCCL_CHECKS_DISABLE", "Skip argument checks on every collective (deprecated: use NCCL_CHECK_POINTERS)."),
      flag("NCCL_CHECK_POINTERS", "Check that every buffer passed to a collective is accessible from its device."),
      flag("NCCL_COMM_BLOCKING", "Make communicator calls block until done (0: return ncclInProgress)."),
      integer("NCCL_ASYNC_ERROR_HANDLING", 0, 3,
              "PyTorch's handling of a failed collective (0 none, 1 abort and exit, 2 abort only, 3 exit without "
              "cleanup); older name of TORCH_NCCL_ASYNC_ERROR_HANDLING."),
      flag("NCCL_RUNTIME_CONNECT", "Connect peers on first use instead of when the communicator is created."),
      flag("NCCL_GRAPH_REGISTER", "Register user buffers captured in CUDA graphs, avoiding copies."),
      flag("NCCL_LOCAL_REGISTER", "Register user buffers passed to ncclCommRegister, avoiding copies."),
      flag("NCCL_RAS_ENABLE", "Run the RAS subsystem that answers ncclras queries about the job."),

      // Networks and sockets.
      simple("NCCL_NET", K::kString, "Network transport to use, by name (IB, Socket, or a plugin's name)."),
      simple("NCCL_NET_PLUGIN", K::kString,
             "Network plugin library: a suffix of libnccl-net-<suffix>.so, a library file, or none."),
      simple("NCCL_TUNER_PLUGIN", K::kString, "Tuner plugin library, named as NCCL_NET_PLUGIN."),
      simple("NCCL_PROFILER_PLUGIN", K::kString, "Profiler plugin library, named as NCCL_NET_PLUGIN."),
      simple("NCCL_SOCKET_IFNAME", K::kInterfaceList, "IP interfaces NCCL uses, by name prefix."),
      choice("NCCL_SOCKET_FAMILY", {"AF_INET", "AF_INET6"}, true, "IP version of the interfaces NCCL uses."),
      integer("NCCL_SOCKET_NTHREADS", 1, 16, "CPU helper threads per socket connection."),
      integer("NCCL_NSOCKS_PERTHREAD", 1, 64, "Sockets each socket helper thread opens."),
      integer("NCCL_SOCKET_RETRY_CNT", 0, kNoMax, "Retries of a refused or timed-out socket connection."),
      integer("NCCL_SOCKET_RETRY_SLEEP_MSEC", 0, kNoMax, "Milliseconds before the first retry; each retry waits longer."),
      flag("NCCL_OOB_NET_ENABLE", "Bootstrap (out-of-band) traffic over the network transport instead of sockets."),
      simple("NCCL_OOB_NET_IFNAME", K::kInterfaceList, "Interfaces for out-of-band traffic, as NCCL_SOCKET_IFNAME."),
      integer("NCCL_CROSS_NIC", 0, 2,
              "Rings and trees may use different NICs on each node: 0 never, 1 always, 2 when it pays."),
      simple("NCCL_NET_GDR_LEVEL", K::kLevel,
             "Farthest GPU-NIC distance at which the NIC reads and writes GPU memory directly (GPUDirect RDMA)."),
      flag("NCCL_NET_GDR_READ", "Send from GPU memory with GPUDirect RDMA reads (not only receive)."),
      flag("NCCL_NET_GDR_C2C", "Use GPUDirect RDMA across a C2C link to the CPU's NIC."),
      flag("NCCL_NET_SHARED_BUFFERS", "Share network staging buffers between peers to save memory."),
      flag("NCCL_NET_SHARED_COMMS", "Reuse network connections between the same pair of NICs (PXN)."),
      flag("NCCL_NET_DISABLE_INTRA", "Never use the network between GPUs of the same node."),
      flag("NCCL_NET_FORCE_FLUSH", "Flush GPU memory after every network receive with GPUDirect RDMA."),
      flag("NCCL_COLLNET_ENABLE", "Use CollNet (in-network reductions such as SHARP) where the network supports it."),
      integer("NCCL_COLLNET_NODE_THRESHOLD", 1, kNoMax, "Fewest nodes for CollNet to be used."),
      simple("NCCL_TOPO_FILE", K::kPath, "XML topology file loaded before NCCL detects the system's topology."),
      simple("NCCL_TOPO_DUMP_FILE", K::kPath, "File NCCL writes the topology it detected to, as XML."),

      // InfiniBand and RoCE.
      flag("NCCL_IB_DISABLE", "Never use InfiniBand/RoCE; fall back to IP sockets."),
      simple("NCCL_IB_HCA", K::kDeviceList, "InfiniBand devices (and ports) NCCL uses, by name prefix."),
      integer("NCCL_IB_TIMEOUT", 1, 31, "InfiniBand verbs timeout: 4.096 us * 2^value."),
      integer("NCCL_IB_RETRY_CNT", 0, 7, "InfiniBand retransmissions before a connection fails."),
      integer("NCCL_IB_GID_INDEX", -1, kNoMax, "Global ID index for RoCE; -1 picks one."),
      choice("NCCL_IB_ADDR_FAMILY", {"AF_INET", "AF_INET6"}, true, "IP version of the GID NCCL picks for RoCE."),
      simple("NCCL_IB_ADDR_RANGE", K::kString, "IP range (CIDR, e.g. 10.0.0.0/16) the RoCE GID must lie in."),
      integer("NCCL_IB_ROCE_VERSION_NUM", 1, 2, "RoCE version of the GID NCCL picks."),
      integer("NCCL_IB_SL", 0, 15, "InfiniBand service level."),
      integer("NCCL_IB_TC", 0, 255, "InfiniBand traffic class (RoCE: DSCP and ECN bits)."),
      integer("NCCL_IB_FIFO_TC", 0, 255, "Traffic class of NCCL's small control messages."),
      integer("NCCL_IB_QPS_PER_CONNECTION", 1, 128, "Queue pairs per connection; more helps adaptive routing."),
      flag("NCCL_IB_SPLIT_DATA_ON_QPS", "Split each message across the queue pairs instead of alternating them."),
      integer("NCCL_IB_PCI_RELAXED_ORDERING", 0, 2, "PCI relaxed ordering for InfiniBand: 0 off, 1 on, 2 when available."),
      flag("NCCL_IB_ADAPTIVE_ROUTING", "Use InfiniBand adaptive routing."),
      integer("NCCL_IB_AR_THRESHOLD", 0, kNoMax, "Smallest message (bytes) sent with adaptive routing."),
      flag("NCCL_IB_ECE_ENABLE", "Use Enhanced Connection Establishment (congestion control) on RoCE."),
      flag("NCCL_IB_MERGE_NICS", "Merge the ports of one dual-port NIC into one logical device."),
      flag("NCCL_IB_MERGE_VFS", "Merge the virtual functions of one NIC into one logical device."),
      flag("NCCL_IB_USE_INLINE", "Send small messages inline with the work request."),
      flag("NCCL_IB_RETURN_ASYNC_EVENTS", "Report InfiniBand asynchronous events as errors of the communicator."),

      // Transports inside a node.
      flag("NCCL_P2P_DISABLE", "Never copy directly between GPUs (NVLink or PCI peer to peer)."),
      simple("NCCL_P2P_LEVEL", K::kLevel, "Farthest GPU-GPU distance at which NCCL copies directly between GPUs."),
      flag("NCCL_P2P_DIRECT_DISABLE", "Within one process, go through the P2P transport instead of direct pointers."),
      integer("NCCL_P2P_NET_CHUNKSIZE", 1, kNoMax, "Chunk size (bytes) of point-to-point operations over the network."),
      integer("NCCL_P2P_PCI_CHUNKSIZE", 1, kNoMax, "Chunk size (bytes) of point-to-point operations over PCI."),
      integer("NCCL_P2P_NVL_CHUNKSIZE", 1, kNoMax, "Chunk size (bytes) of point-to-point operations over NVLink."),
      flag("NCCL_SHM_DISABLE", "Never go through host shared memory between GPUs."),
      flag("NCCL_SHM_USE_CUDA_MEMCPY", "Move shared-memory data with cudaMemcpy instead of kernels."),
      integer("NCCL_SHM_MEMCPY_MODE", 1, 3, "With NCCL_SHM_USE_CUDA_MEMCPY: 1 sender copies, 2 receiver copies, 3 both."),
      integer("NCCL_SHM_LOCALITY", 1, 2, "Where shared-memory buffers live: 1 sender's NUMA node, 2 receiver's."),
      integer("NCCL_NVLS_ENABLE", 0, 2, "NVLink SHARP (NVSwitch reductions): 0 off, 1 on, 2 when supported."),
      integer("NCCL_NVLS_NCHANNELS", 1, kNoMax, "Channels (thread blocks) NVLink SHARP uses."),
      flag("NCCL_NVB_DISABLE", "Never relay through an intermediate GPU over NVLink."),
      flag("NCCL_PXN_DISABLE", "Never send through a NIC closer to a peer GPU of the same node (PXN)."),
      integer("NCCL_P2P_PXN_LEVEL", 0, 2, "PXN for point to point: 0 never, 1 when the NIC needs it, 2 always."),
      integer("NCCL_MNNVL_ENABLE", 0, 2, "NVLink across nodes (multi-node NVLink): 0 off, 1 on, 2 when supported."),

      // Algorithms, protocols, resources.
      simple("NCCL_ALGO", K::kAlgoList, "Algorithms collectives may use, for all or for each collective."),
      simple("NCCL_PROTO", K::kProtoList, "Protocols collectives may use, for all or for each collective."),
      integer("NCCL_BUFFSIZE", 1, kNoMax, "Bytes of the buffer between each pair of ranks; powers of 2 work best."),
      choice("NCCL_NTHREADS", {"64", "128", "256", "512"}, true, "CUDA threads per NCCL thread block."),
      integer("NCCL_MIN_NCHANNELS", 1, 64, "Fewest channels (thread blocks) a collective uses."),
      integer("NCCL_MAX_NCHANNELS", 1, 64, "Most channels (thread blocks) a collective uses."),
      integer("NCCL_MIN_P2P_NCHANNELS", 1, 64, "Fewest channels point-to-point operations use."),
      integer("NCCL_MAX_P2P_NCHANNELS", 1, 64, "Most channels point-to-point operations use."),
      integer("NCCL_NCHANNELS_PER_NET_PEER", 1, 64, "Channels per network peer for point-to-point operations."),

      // Debugging.
      choice("NCCL_DEBUG", {"VERSION", "WARN", "INFO", "ABORT", "TRACE"}, false,
             "NCCL's messages: VERSION the version only, WARN errors, INFO progress, TRACE every call."),
      simple("NCCL_DEBUG_SUBSYS", K::kSubsysList, "Subsystems whose INFO messages print (^ first: all but these)."),
      simple("NCCL_DEBUG_FILE", K::kPath, "File NCCL's messages go to instead of stdout (%h host, %p pid)."),
  };
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool sameIgnoringCase(const std::string& a, const std::string& b) { return upper(a) == upper(b); }

std::string inQuotes(const std::string& s) { return "'" + s + "'"; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

bool hasSpace(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; });
}

// The canonical spelling of `token` among `names` (ignoring case), or "".
std::string canonical(const std::string& token, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (sameIgnoringCase(token, n)) return n;
  }
  return "";
}

// "'x' is not one of a, b or c; did you mean 'b'?"
std::string notOneOf(const std::string& token, const std::string& what, const std::vector<std::string>& names) {
  std::string msg = inQuotes(token) + " is not " + what + " (" + text::joinOr(names) + ")";
  std::string near = text::nearest(token, names);
  return near.empty() ? msg + "; use one of them" : msg + "; did you mean " + inQuotes(near) + "?";
}

std::string rangeText(const Variable& v) {
  if (v.max == kNoMax) return ">= " + std::to_string(v.min);
  return "in [" + std::to_string(v.min) + ", " + std::to_string(v.max) + "]";
}

// Interface or device lists: [^]item,item with items [=]name (devices: [=]name[:port]).
std::string checkNameList(const std::string& value, bool devices, std::string* out) {
  std::string body = value;
  std::string prefix;
  if (!body.empty() && body[0] == '^') {
    prefix = "^";
    body.erase(0, 1);
  }
  const char* example = devices ? "e.g. mlx5_0:1,mlx5_1:1 or ^mlx5_2" : "e.g. eth0, =eth0,eth1 or ^docker,lo";
  if (body.empty()) return "nothing after '^'; name the " + std::string(devices ? "devices" : "interfaces") + " to leave out";
  for (const auto& raw : split(body, ',')) {
    std::string item = raw;
    if (!item.empty() && item[0] == '=') item.erase(0, 1);
    if (item.empty()) {
      return "empty entry in " + inQuotes(value) + "; write names separated by single commas, " + example;
    }
    if (hasSpace(item) || item.find('^') != std::string::npos || item.find('=') != std::string::npos) {
      return inQuotes(raw) + " is not " + (devices ? "a device" : "an interface") +
             " name; '^' may only start the list and '=' each name, no spaces (" + example + ")";
    }
    if (devices) {
      auto colon = item.find(':');
      if (colon != std::string::npos) {
        int64_t port = 0;
        if (colon == 0 || !text::parseInt(item.substr(colon + 1), &port) || port < 1) {
          return inQuotes(raw) + " has a bad port; write device:port with a port >= 1, " + example;
        }
      }
    } else if (item.find(':') != std::string::npos) {
      return inQuotes(raw) + " is not an interface name (':' gives a port, which only NCCL_IB_HCA takes); " + example;
    }
  }
  *out = prefix + body;
  return "";
}

// NCCL_ALGO / NCCL_PROTO: "[func:][^]elem,...;func:[^]elem,..." (NCCL 2.24),
// the plain "[^]elem,..." of earlier versions being the first form without a
// function. Rebuilt with NCCL's own spellings.
std::string checkElementMap(const std::string& value, const std::vector<std::string>& elems, const char* what,
                            const char* example, std::string* out) {
  std::set<std::string> functionsSeen;
  std::string result;
  const auto sections = split(value, ';');
  for (size_t i = 0; i < sections.size(); ++i) {
    const std::string& section = sections[i];
    std::string function, list = section;
    auto colon = section.find(':');
    if (colon != std::string::npos) {
      function = canonical(section.substr(0, colon), kFunctions);
      if (function.empty()) {
        return notOneOf(section.substr(0, colon), "a collective", kFunctions);
      }
      if (!functionsSeen.insert(function).second) {
        return function + " is given twice in " + inQuotes(value) + "; give each collective once";
      }
      list = section.substr(colon + 1);
    } else if (i > 0) {
      return inQuotes(section) + " needs a collective before it (" + inQuotes("allreduce:" + section) +
             "): only the first entry applies to all collectives";
    }
    std::string exclude;
    if (!list.empty() && list[0] == '^') {
      exclude = "^";
      list.erase(0, 1);
    }
    if (list.empty()) {
      return "no " + std::string(what) + " in " + inQuotes(section.empty() ? value : section) + "; " + std::string(example);
    }
    std::string rebuilt;
    for (const auto& token : split(list, ',')) {
      std::string name = canonical(token, elems);
      if (name.empty()) {
        if (token.empty()) return "empty entry in " + inQuotes(value) + "; " + std::string(example);
        return notOneOf(token, std::string(std::strchr("aeiou", what[0]) != nullptr ? "an " : "a ") + what, elems);
      }
      rebuilt += (rebuilt.empty() ? "" : ",") + name;
    }
    result += (i ? ";" : "") + (function.empty() ? "" : function + ":") + exclude + rebuilt;
  }
  *out = result;
  return "";
}

std::string checkSubsystems(const std::string& value, std::string* out) {
  std::string body = value;
  std::string result;
  if (!body.empty() && body[0] == '^') {
    result = "^";
    body.erase(0, 1);
  }
  if (body.empty()) return "no subsystem in " + inQuotes(value) + "; e.g. INIT,NET or ^PROXY";
  std::string list;
  for (const auto& token : split(body, ',')) {
    std::string name = canonical(token, kSubsystems);
    if (name.empty()) {
      if (token.empty()) return "empty entry in " + inQuotes(value) + "; e.g. INIT,NET or ^PROXY";
      return notOneOf(token, "a debug subsystem", kSubsystems);
    }
    list += (list.empty() ? "" : ",") + name;
  }
  *out = result + list;
  return "";
}

}  // namespace

const std::vector<Variable>& variables() {
  static const std::vector<Variable> table = buildTable();
  return table;
}

const Variable* findVariable(const std::string& name) {
  for (const auto& v : variables()) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

std::string acceptedText(const Variable& v) {
  switch (v.kind) {
    case ValueKind::kInteger: return "an integer " + rangeText(v);
    case ValueKind::kBool: return "0 or 1 (true or false)";
    case ValueKind::kChoice:
      return "one of " + text::joinOr(v.choices) + (v.case_sensitive ? "" : " (any case)");
    case ValueKind::kPath: return "a file path";
    case ValueKind::kString: return "text";
    case ValueKind::kInterfaceList: return "interface name prefixes joined by ',' (^ first excludes, = exact name)";
    case ValueKind::kDeviceList:
      return "device name prefixes with optional :port joined by ',' (^ first excludes, = exact name)";
    case ValueKind::kLevel: return text::joinOr(kLevels) + ", or a legacy integer >= 0";
    case ValueKind::kAlgoList:
      return "algorithms (" + text::joinOr(kAlgorithms) +
             ") joined by ',', ^ first excludes; per collective as allreduce:tree;allgather:ring";
    case ValueKind::kProtoList:
      return "protocols (" + text::joinOr(kProtocols) +
             ") joined by ',', ^ first excludes; per collective as allreduce:^LL";
    case ValueKind::kSubsysList: return "debug subsystems (" + text::joinOr(kSubsystems) + ") joined by ',', ^ first excludes";
  }
  return "";
}

std::string variablesText() {
  size_t width = 0;
  for (const auto& v : variables()) width = std::max(width, v.name.size());
  std::string out;
  for (const auto& v : variables()) {
    out += v.name + std::string(width + 2 - v.name.size(), ' ') + v.meaning + "\n" + std::string(width + 2, ' ') +
           "accepts " + acceptedText(v) + "\n";
  }
  return out;
}

std::string variablesMarkdown() {
  auto cell = [](const std::string& s) {
    std::string out;
    for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string out = "| Variable | Accepts | Meaning |\n|---|---|---|\n";
  for (const auto& v : variables()) {
    out += "| `" + v.name + "` | " + cell(acceptedText(v)) + " | " + cell(v.meaning) + " |\n";
  }
  return out;
}

std::string checkValue(const Variable& v, const std::string& value, std::string* normalized) {
  if (value.empty()) return "empty value; remove the key to leave NCCL's default";
  std::string out;
  switch (v.kind) {
    case ValueKind::kInteger: {
      int64_t i = 0;
      if (!text::parseInt(value, &i)) {
        return "expected an integer " + rangeText(v) + ", got " + inQuotes(value) + "; write a whole number";
      }
      if (i < v.min || i > v.max) return value + " is out of range; use an integer " + rangeText(v);
      out = std::to_string(i);
      break;
    }
    case ValueKind::kBool: {
      bool b = false;
      if (value == "0" || value == "1") {
        out = value;
      } else if (text::parseBool(value, &b)) {
        out = b ? "1" : "0";
      } else {
        return "expected 0 or 1 (true or false), got " + inQuotes(value) + "; write 0 or 1";
      }
      break;
    }
    case ValueKind::kChoice: {
      for (const auto& c : v.choices) {
        if (c == value || (!v.case_sensitive && sameIgnoringCase(c, value))) out = c;
      }
      if (out.empty()) {
        std::string msg = inQuotes(value) + " is not one of " + text::joinOr(v.choices);
        std::string near = text::nearest(value, v.choices);
        if (near.empty()) return msg + "; use one of them";
        if (sameIgnoringCase(near, value)) return msg + "; write " + inQuotes(near) + " (NCCL reads it case-sensitively)";
        return msg + "; did you mean " + inQuotes(near) + "?";
      }
      break;
    }
    case ValueKind::kPath:
    case ValueKind::kString:
      if (value.find('\0') != std::string::npos) return "the value holds a NUL character; remove it";
      out = value;
      break;
    case ValueKind::kInterfaceList:
    case ValueKind::kDeviceList: {
      std::string err = checkNameList(value, v.kind == ValueKind::kDeviceList, &out);
      if (!err.empty()) return err;
      break;
    }
    case ValueKind::kLevel: {
      int64_t i = 0;
      if (std::find(kLevels.begin(), kLevels.end(), value) != kLevels.end()) {
        out = value;
      } else if (text::parseInt(value, &i) && i >= 0) {
        out = std::to_string(i);
      } else {
        std::string msg = inQuotes(value) + " is not a level (" + text::joinOr(kLevels) + ", or a legacy integer >= 0)";
        std::string near = text::nearest(value, kLevels);
        if (near.empty()) return msg + "; use one of them";
        if (sameIgnoringCase(near, value)) return msg + "; write " + inQuotes(near) + " (NCCL reads levels case-sensitively)";
        return msg + "; did you mean " + inQuotes(near) + "?";
      }
      break;
    }
    case ValueKind::kAlgoList: {
      std::string err = checkElementMap(value, kAlgorithms, "algorithm", "e.g. Ring,Tree, ^NVLS or allreduce:tree;allgather:ring", &out);
      if (!err.empty()) return err;
      break;
    }
    case ValueKind::kProtoList: {
      std::string err = checkElementMap(value, kProtocols, "protocol", "e.g. Simple, ^LL128 or LL,Simple;allreduce:^LL", &out);
      if (!err.empty()) return err;
      break;
    }
    case ValueKind::kSubsysList: {
      std::string err = checkSubsystems(value, &out);
      if (!err.empty()) return err;
      break;
    }
  }
  *normalized = out;
  return "";
}

std::string checkSetting(const std::string& name, const std::string& value, std::string* normalized) {
  if (const Variable* v = findVariable(name)) return checkValue(*v, value, normalized);
  std::vector<std::string> names;
  for (const auto& v : variables()) names.push_back(v.name);
  const std::string near = text::nearest(name, names);
  // Another library's variable (GLOO_SOCKET_IFNAME) is not a typo of NCCL's
  // (NCCL_SOCKET_IFNAME), but NCL_DEBUG or nccl_debug is.
  const bool ncclPrefix = upper(name.substr(0, 5)) == "NCCL_";
  if (!near.empty() && (ncclPrefix || text::editDistance(name, near) <= 2)) {
    return "unknown NCCL variable; did you mean " + inQuotes(near) + "?";
  }
  if (name.compare(0, 11, "TORCH_NCCL_") == 0) {
    return "PyTorch reads this variable, not NCCL; set it in the environment instead";
  }
  if (!ncclPrefix) {
    return "not an NCCL variable (their names start with NCCL_); set other variables in the environment";
  }
  return "unknown NCCL variable; `ptrain keys --nccl` lists the variables a recipe may set";
}

std::vector<std::string> checkCombination(const std::vector<Setting>& settings) {
  std::map<std::string, std::string> byName;
  for (const auto& s : settings) byName[s.name] = s.value;
  std::vector<std::string> problems;
  // net_socket.cc: at most 64 sockets per connection.
  auto threads = byName.find("NCCL_SOCKET_NTHREADS");
  auto socks = byName.find("NCCL_NSOCKS_PERTHREAD");
  if (threads != byName.end() && socks != byName.end()) {
    const long long product = std::atoll(threads->second.c_str()) * std::atoll(socks->second.c_str());
    if (product > 64) {
      problems.push_back("NCCL_NSOCKS_PERTHREAD: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = " + threads->second +
                         " x " + socks->second + " = " + std::to_string(product) +
                         " sockets per connection, more than NCCL's 64; lower one of them");
    }
  }
  auto minCh = byName.find("NCCL_MIN_NCHANNELS");
  auto maxCh = byName.find("NCCL_MAX_NCHANNELS");
  if (minCh != byName.end() && maxCh != byName.end() &&
      std::atoll(minCh->second.c_str()) > std::atoll(maxCh->second.c_str())) {
    problems.push_back("NCCL_MIN_NCHANNELS: " + minCh->second + " is above NCCL_MAX_NCHANNELS=" + maxCh->second +
                       "; make the minimum at most the maximum");
  }
  return problems;
}

namespace {

bool isListKind(ValueKind kind) {
  return kind == ValueKind::kInterfaceList || kind == ValueKind::kDeviceList || kind == ValueKind::kAlgoList ||
         kind == ValueKind::kProtoList || kind == ValueKind::kSubsysList;
}

// Reads and checks every entry of the map: the problems in the recipe's
// error form, and the settings that are fine (sorted by name, as keysUnder
// returns them).
std::vector<std::string> readRecipe(const Recipe& recipe, std::vector<Setting>* settings) {
  std::vector<std::string> problems;
  const std::string prefix = std::string(kRecipeKey) + ".";
  std::set<std::string> seen;
  for (const auto& key : recipe.keysUnder(kRecipeKey)) {
    // The key itself holding a scalar is the schema's to report (not a mapping).
    if (key.size() <= prefix.size()) continue;
    const std::string rest = key.substr(prefix.size());
    const std::string name = rest.substr(0, rest.find('.'));
    const std::string path = prefix + name;
    if (!seen.insert(name).second) continue;
    const std::string where = recipe.location(path).str() + ": " + path + ": ";
    if (name != rest) {
      problems.push_back(where + "expected a single value, got a mapping; write " + name + ": <value>");
      continue;
    }
    const Variable* variable = findVariable(name);
    std::string value;
    try {
      value = recipe.getString(path);
    } catch (const ConfigError&) {
      // A YAML list: NCCL's lists are text joined by ','.
      std::vector<std::string> items;
      try {
        items = recipe.getStringList(path);
      } catch (const ConfigError&) {
        problems.push_back(where + "expected a single value, got a nested list; write " + name + ": <value>");
        continue;
      }
      if (variable != nullptr && !isListKind(variable->kind)) {
        problems.push_back(where + "expected " + acceptedText(*variable) + ", got a list; write a single value");
        continue;
      }
      for (size_t i = 0; i < items.size(); ++i) value += (i ? "," : "") + items[i];
    }
    std::string normalized;
    std::string err = checkSetting(name, value, &normalized);
    if (!err.empty()) {
      problems.push_back(where + err);
      continue;
    }
    settings->push_back(Setting{name, normalized});
  }
  // Combinations only once every value is fine on its own.
  if (problems.empty()) {
    for (const auto& p : checkCombination(*settings)) {
      const std::string name = p.substr(0, p.find(':'));
      problems.push_back(recipe.location(prefix + name).str() + ": " + prefix + p);
    }
  }
  return problems;
}

}  // namespace

std::vector<std::string> checkRecipe(const Recipe& recipe) {
  std::vector<Setting> unused;
  return readRecipe(recipe, &unused);
}

std::vector<Setting> settingsFromRecipe(const Recipe& recipe) {
  std::vector<Setting> settings;
  std::vector<std::string> problems = readRecipe(recipe, &settings);
  if (!problems.empty()) throw ConfigError(problems.front());
  return settings;
}

std::vector<EffectiveSetting> effectiveSettings(const std::vector<Setting>& recipe, const EnvironmentLookup& lookup) {
  std::vector<EffectiveSetting> out;
  for (const auto& s : recipe) {
    EffectiveSetting e;
    e.name = s.name;
    e.recipe_value = s.value;
    std::optional<std::string> env = lookup ? lookup(s.name) : std::nullopt;
    if (env) {
      e.value = *env;
      e.source = Source::kEnvironment;
    } else {
      e.value = s.value;
      e.source = Source::kRecipe;
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string headerLine(const EffectiveSetting& s) {
  if (s.source == Source::kRecipe) return s.name + "=" + s.value + " (recipe)";
  return s.name + "=" + s.value + " (environment, recipe says " + s.recipe_value + ")";
}

std::vector<std::string> environmentEntries(const std::vector<EffectiveSetting>& settings) {
  std::vector<std::string> out;
  for (const auto& s : settings) {
    if (s.source == Source::kRecipe) out.push_back(s.name + "=" + s.value);
  }
  return out;
}

EnvironmentLookup processEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::vector<EffectiveSetting> applySettings(const std::vector<Setting>& recipe) {
  std::vector<EffectiveSetting> effective = effectiveSettings(recipe, processEnvironment());
  for (const auto& s : effective) {
    if (s.source == Source::kRecipe) ::setenv(s.name.c_str(), s.value.c_str(), /*overwrite=*/0);
  }
  return effective;
}

}  // namespace ptrain::nccl
