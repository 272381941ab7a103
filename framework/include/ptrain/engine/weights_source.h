// WeightsSource: where a model's starting weights come from (checkpoint.load,
// `ptrain export`). A source names tensors with the model's own parameter
// names and hands out any block of any of them, so each rank reads only the
// part it holds, whatever layout wrote them and whatever layout reads them.
//
// Three kinds ship with the core:
//   - a ptrain step folder (sharded or whole-tensor): one runtime's
//     parameters, float32 masters preferred where the run kept them;
//   - a bare safetensors state dict (one file, the model's parameter names);
//   - a trainer's adapter of another framework's folder
//     (Trainer::openForeignWeights: the llm trainer reads Hugging Face GPT-2),
//     which renames and reshapes block by block.
//
// Thread-safety: a source is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ptrain/core/error.h"
#include "ptrain/engine/sharded_checkpoint.h"

namespace ptrain {

class PTRAIN_API WeightsSource {
 public:
  struct TensorInfo {
    at::ScalarType dtype;
    std::vector<int64_t> shape;  // the whole tensor's
  };
  virtual ~WeightsSource();
  // The path, for messages ("runs/a/checkpoints/step_40", "gpt2/model.safetensors").
  virtual std::string where() const = 0;
  // Every tensor name, sorted.
  virtual std::vector<std::string> names() = 0;
  // The tensor's dtype and whole shape, or nullopt when the source lacks it.
  virtual std::optional<TensorInfo> find(const std::string& name) = 0;
  // Fills `out` (sizes: the block's; any dtype and device) with the elements
  // `block` of tensor `name`, converted to out's dtype. Reads only the bytes
  // of that block. Throws CheckpointError naming the file for a missing
  // tensor, a block outside it, or damaged bytes.
  virtual void read(const std::string& name, const TensorBlock& block, at::Tensor& out) = 0;
  // Bytes read from files so far.
  virtual uint64_t bytesRead() const = 0;
};

// The parameters of runtime `runtime` in the step folder `reader` reads:
// where the checkpoint holds a float32 master ("master.<name>") of a
// lower-precision parameter, that master, so a float32 model starts from the
// exact values. Borrows `reader`, which must outlive the source.
PTRAIN_API std::unique_ptr<WeightsSource> checkpointWeights(CheckpointReader& reader, std::string runtime);

// A safetensors file (as torch's safetensors.torch.save_file or
// transformers' save_pretrained writes it): its tensors under their own
// names. Reads the header now, tensor bytes as asked. Throws CheckpointError
// naming the file when it is missing or not a safetensors file.
PTRAIN_API std::unique_ptr<WeightsSource> safetensorsWeights(const std::string& path);

// Whether `path` is a Hugging Face model folder: one holding config.json and
// model.safetensors (what save_pretrained writes).
PTRAIN_API bool isHuggingFaceFolder(const std::string& path);

}  // namespace ptrain
