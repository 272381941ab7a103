#include "ptrain/engine/weights_source.h"

#include <filesystem>

namespace fs = std::filesystem;

namespace ptrain {

WeightsSource::~WeightsSource() = default;

namespace {

// One runtime's parameters of a CheckpointReader, or every tensor of a bare
// file (whose reader serves it as any runtime's parameters).
class ReaderWeights : public WeightsSource {
 public:
  ReaderWeights(CheckpointReader* borrowed, std::unique_ptr<CheckpointReader> owned, std::string runtime,
                std::string where)
      : reader_(borrowed ? borrowed : owned.get()), owned_(std::move(owned)), runtime_(std::move(runtime)),
        where_(std::move(where)) {}

  std::string where() const override { return where_; }

  std::vector<std::string> names() override { return reader_->names(runtime_, CheckpointSection::kParameters); }

  std::optional<TensorInfo> find(const std::string& name) override {
    auto info = reader_->find(runtime_, CheckpointSection::kParameters, name);
    if (!info) return std::nullopt;
    // A lower-precision parameter trained from a float32 master: the master
    // is the exact value (what a float32 model must start from).
    if (info->dtype != at::kFloat && master(name, info->shape)) return TensorInfo{at::kFloat, info->shape};
    return TensorInfo{info->dtype, info->shape};
  }

  void read(const std::string& name, const TensorBlock& block, at::Tensor& out) override {
    auto info = reader_->find(runtime_, CheckpointSection::kParameters, name);
    if (info && info->dtype != at::kFloat && out.scalar_type() == at::kFloat && master(name, info->shape)) {
      reader_->read(runtime_, CheckpointSection::kOptimizer, "master." + name, block, out);
      return;
    }
    reader_->read(runtime_, CheckpointSection::kParameters, name, block, out);
  }

  uint64_t bytesRead() const override { return reader_->bytesRead(); }

 private:
  bool master(const std::string& name, const std::vector<int64_t>& shape) {
    auto m = reader_->find(runtime_, CheckpointSection::kOptimizer, "master." + name);
    return m && m->shape == shape;
  }

  CheckpointReader* reader_;
  std::unique_ptr<CheckpointReader> owned_;
  std::string runtime_;
  std::string where_;
};

}  // namespace

std::unique_ptr<WeightsSource> checkpointWeights(CheckpointReader& reader, std::string runtime) {
  std::string where = reader.dir();
  return std::make_unique<ReaderWeights>(&reader, nullptr, std::move(runtime), std::move(where));
}

std::unique_ptr<WeightsSource> safetensorsWeights(const std::string& path) {
  return std::make_unique<ReaderWeights>(nullptr, CheckpointReader::openFile(path), "model", path);
}

bool isHuggingFaceFolder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec) &&
         fs::is_regular_file(fs::path(path) / "model.safetensors", ec);
}

}  // namespace ptrain
