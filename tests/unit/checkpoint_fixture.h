// Whole tensors of runtimes on any layout, for tests that compare them with
// a reference: written as a sharded checkpoint (each rank its share, as a run
// saves) and read back whole with the checkpoint reader.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "ptrain/comm/communicator.h"
#include "ptrain/engine/runtime.h"
#include "ptrain/engine/sharded_checkpoint.h"

namespace ptrain::checkpoint_fixture {

struct WholeTensors {
  std::map<std::string, at::Tensor> parameters;
  std::map<std::string, at::Tensor> optimizer;
};

// Collective over `comm`'s world: `runtime`'s checkpoint in the folder `dir`
// (made here; the same path on every rank), then every tensor whole, read by
// every rank.
inline WholeTensors wholeTensors(ModelRuntime& runtime, Communicator& comm, const std::string& dir) {
  std::filesystem::create_directories(dir);
  writeShardedCheckpoint(dir, 0, {&runtime}, comm.world());
  CheckpointReader reader(dir);
  WholeTensors out;
  for (const auto& name : reader.names(runtime.name(), CheckpointSection::kParameters)) {
    out.parameters[name] = reader.readWhole(runtime.name(), CheckpointSection::kParameters, name);
  }
  for (const auto& name : reader.names(runtime.name(), CheckpointSection::kOptimizer)) {
    out.optimizer[name] = reader.readWhole(runtime.name(), CheckpointSection::kOptimizer, name);
  }
  // Nobody removes or rewrites the folder while another rank still reads it.
  comm.world().barrier()->wait();
  return out;
}

}  // namespace ptrain::checkpoint_fixture
