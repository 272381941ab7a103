// Sharded checkpoints (engine/sharded_checkpoint.h) against whole tensors:
// blocks and flat ranges written by several "ranks" read back as any block of
// any tensor, in any dtype; damaged files refused in one line naming the file;
// whole-tensor folders of an earlier ptrain read the same way; consolidation
// equal, byte for byte, to writing the whole tensors.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptrain/engine/checkpoint_io.h"
#include "ptrain/engine/safetensors.h"
#include "ptrain/engine/sharded_checkpoint.h"
#include "support/test_support.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

at::Tensor blockOf(const at::Tensor& full, const TensorBlock& b) {
  at::Tensor out = full;
  for (size_t d = 0; d < b.offsets.size(); ++d) out = out.narrow(static_cast<int64_t>(d), b.offsets[d], b.sizes[d]);
  out = out.contiguous();
  if (b.flat()) out = out.view({-1}).narrow(0, b.flat_begin, b.flat_end - b.flat_begin);
  return out;
}

TensorBlock box(std::vector<int64_t> offsets, std::vector<int64_t> sizes, int64_t flatBegin = -1, int64_t flatEnd = -1) {
  TensorBlock b;
  b.offsets = std::move(offsets);
  b.sizes = std::move(sizes);
  b.flat_begin = flatBegin;
  b.flat_end = flatEnd;
  return b;
}

// Four "ranks": the weight [6, 8, 10] split in two along dimensions 0 and 2;
// its moment split in two along dimension 0, each half saved as two flat
// ranges (a distributed optimizer's pieces); a bias whole on rank 0; a
// loss scale on rank 0.
struct Saved {
  at::Tensor weight = torch::randn({6, 8, 10});
  at::Tensor moment = torch::randn({6, 8, 10});
  at::Tensor bias = torch::randn({7});
  at::Tensor scale = torch::tensor({65536.0});
};

json writeSaved(const std::string& dir, const Saved& s, int64_t step) {
  std::vector<json> parts;
  for (int rank = 0; rank < 4; ++rank) {
    RankShare share;
    const int64_t d0 = (rank / 2) * 3, d2 = (rank % 2) * 5;
    const TensorBlock w = box({d0, 0, d2}, {3, 8, 5});
    share.parameters.push_back(ShardedTensor{"w", blockOf(s.weight, w), {6, 8, 10}, w});
    // Ranks 0, 1 hold rows 0..2 of the moment, ranks 2, 3 rows 3..5; within
    // each, a flat half of the 240 elements.
    const TensorBlock m = box({d0, 0, 0}, {3, 8, 10}, (rank % 2) * 120, (rank % 2) * 120 + 120);
    share.optimizer.push_back(ShardedTensor{"exp_avg.w", blockOf(s.moment, m), {6, 8, 10}, m});
    if (rank == 0) {
      share.parameters.push_back(ShardedTensor{"b", s.bias, {7}, TensorBlock::whole({7})});
      share.optimizer.push_back(ShardedTensor{"precision.loss_scale", s.scale, {1}, TensorBlock::whole({1})});
    }
    parts.push_back(writeRankShare(dir, "model", rank, share));
  }
  json index = mergeIndexParts(parts, step);
  writeJsonFile(dir + "/" + kCheckpointIndexFile, index);
  writeJsonFile(dir + "/meta.json", json{{"step", step}, {"format", "ptrain.sharded"}, {"runtimes", {{"model", json::object()}}}});
  return index;
}

TEST(ShardedCheckpoint, AnyBlockOfAnyTensorReadsBackExactly) {
  test::TempDir dir;
  torch::manual_seed(1);
  Saved s;
  writeSaved(dir.path(), s, 3);
  CheckpointReader reader(dir.path());
  EXPECT_TRUE(reader.sharded());
  EXPECT_TRUE(reader.hasRuntime("model"));
  EXPECT_FALSE(reader.hasRuntime("actor"));
  EXPECT_EQ(reader.names("model", CheckpointSection::kParameters), (std::vector<std::string>{"b", "w"}));
  EXPECT_TRUE(torch::equal(reader.readWhole("model", CheckpointSection::kParameters, "w"), s.weight));
  EXPECT_TRUE(torch::equal(reader.readWhole("model", CheckpointSection::kOptimizer, "exp_avg.w"), s.moment));
  EXPECT_TRUE(torch::equal(reader.readWhole("model", CheckpointSection::kParameters, "b"), s.bias));
  torch::manual_seed(2);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int64_t> offsets, sizes;
    for (int64_t n : {6, 8, 10}) {
      const int64_t a = torch::randint(n, {1}).item<int64_t>(), b = torch::randint(n, {1}).item<int64_t>();
      offsets.push_back(std::min(a, b));
      sizes.push_back(std::max(a, b) - std::min(a, b) + 1);
    }
    TensorBlock b = box(offsets, sizes);
    if (trial % 2 == 1) {  // a flat range of the block, as another dp size would ask
      const int64_t n = b.numel(), x = torch::randint(n, {1}).item<int64_t>(), y = torch::randint(n, {1}).item<int64_t>();
      b.flat_begin = std::min(x, y);
      b.flat_end = std::max(x, y) + 1;
    }
    for (const char* name : {"w", "exp_avg.w"}) {
      const bool param = std::string(name) == "w";
      const at::Tensor& full = param ? s.weight : s.moment;
      at::Tensor out = b.flat() ? torch::empty({b.numel()}) : torch::empty(b.sizes);
      reader.read("model", param ? CheckpointSection::kParameters : CheckpointSection::kOptimizer, name, b, out);
      ASSERT_TRUE(torch::equal(out, blockOf(full, b))) << name << " trial " << trial;
    }
  }
  // Another precision: the saved float32 values, converted.
  at::Tensor half = torch::empty({3, 8, 5}, torch::kBFloat16);
  reader.read("model", CheckpointSection::kParameters, "w", box({3, 0, 5}, {3, 8, 5}), half);
  EXPECT_TRUE(torch::equal(half, s.weight.narrow(0, 3, 3).narrow(2, 5, 5).to(torch::kBFloat16)));
}

TEST(ShardedCheckpoint, ABlockReadsOnlyTheBytesItNeeds) {
  test::TempDir dir;
  // Four ranks' rows of a 4 MB tensor; rank 2's block is 1 MB.
  at::Tensor big = torch::randn({1024, 1024});
  std::vector<json> parts;
  for (int rank = 0; rank < 4; ++rank) {
    RankShare share;
    const TensorBlock b = box({rank * 256, 0}, {256, 1024});
    share.parameters.push_back(ShardedTensor{"w", blockOf(big, b), {1024, 1024}, b});
    parts.push_back(writeRankShare(dir.path(), "model", rank, share));
  }
  writeJsonFile(dir.path() + "/" + kCheckpointIndexFile, mergeIndexParts(parts, 1));
  CheckpointReader reader(dir.path());
  at::Tensor out = torch::empty({256, 1024});
  reader.read("model", CheckpointSection::kParameters, "w", box({512, 0}, {256, 1024}), out);
  EXPECT_TRUE(torch::equal(out, big.narrow(0, 512, 256)));
  // The block itself and the checksum blocks around it: one file, not four.
  EXPECT_LE(reader.bytesRead(), 2 * (uint64_t{1} << 20) + 4096);
}

TEST(ShardedCheckpoint, MergeRefusesOverlapsAndGaps) {
  test::TempDir dir;
  at::Tensor t = torch::randn({4, 4});
  auto part = [&](int rank, const TensorBlock& b) {
    RankShare share;
    share.parameters.push_back(ShardedTensor{"w", blockOf(t, b), {4, 4}, b});
    return writeRankShare(dir.path(), "model", rank, share);
  };
  EXPECT_THROW(mergeIndexParts({part(0, box({0, 0}, {3, 4})), part(1, box({2, 0}, {2, 4}))}, 1), InternalError);
  try {
    mergeIndexParts({part(0, box({0, 0}, {2, 4}))}, 1);
    ADD_FAILURE() << "a half-saved tensor was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("hold 8 of its 16 elements"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(mergeIndexParts({part(0, box({0, 0}, {2, 4})), part(1, box({2, 0}, {2, 4}))}, 1));
}

// Flips one byte of `path` at `offset`.
void flipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

TEST(ShardedCheckpoint, AFlippedByteIsRefusedNamingItsFile) {
  for (const bool inHeader : {false, true}) {
    test::TempDir dir;
    Saved s;
    writeSaved(dir.path(), s, 3);
    const std::string file = dir.path() + "/" + shardFileName("model", 1);
    uint64_t dataStart = 0;
    readSafetensorsHeader(file, nullptr, &dataStart);
    flipByte(file, inHeader ? 20 : dataStart + 100);
    CheckpointReader reader(dir.path());
    try {
      reader.readWhole("model", CheckpointSection::kParameters, "w");
      ADD_FAILURE() << "a damaged file was read";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file + ": bytes [0, "), std::string::npos) << what;
      EXPECT_NE(what.find("do not match their checksum"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    // What other files hold still reads.
    EXPECT_TRUE(torch::equal(reader.readWhole("model", CheckpointSection::kParameters, "b"), s.bias));
  }
}

TEST(ShardedCheckpoint, ATruncatedOrMissingFileIsRefusedNamingIt) {
  test::TempDir dir;
  Saved s;
  writeSaved(dir.path(), s, 3);
  const std::string file = dir.path() + "/" + shardFileName("model", 2);
  fs::resize_file(file, fs::file_size(file) - 10);
  CheckpointReader reader(dir.path());
  try {
    reader.readWhole("model", CheckpointSection::kParameters, "w");
    ADD_FAILURE() << "a truncated file was read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(file + ": "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("damaged or truncated"), std::string::npos) << e.what();
  }
  fs::remove(file);
  CheckpointReader again(dir.path());
  EXPECT_THROW(again.readWhole("model", CheckpointSection::kParameters, "w"), CheckpointError);
}

TEST(ShardedCheckpoint, WholeTensorFoldersOfEarlierVersionsReadTheSameWay) {
  test::TempDir dir;
  Saved s;
  saveSafetensors(dir.path() + "/model.safetensors", {{"w", s.weight}, {"b", s.bias}}, {{"format", "pt"}});
  saveSafetensors(dir.path() + "/optimizer.safetensors", {{"exp_avg.w", s.moment}}, {{"format", "pt"}});
  saveSafetensors(dir.path() + "/actor.model.safetensors", {{"w", s.weight}}, {{"format", "pt"}});
  writeJsonFile(dir.path() + "/meta.json", json{{"step", 3}});
  CheckpointReader reader(dir.path());
  EXPECT_FALSE(reader.sharded());
  EXPECT_TRUE(reader.hasRuntime("model"));
  EXPECT_TRUE(reader.hasRuntime("actor"));
  EXPECT_FALSE(reader.hasRuntime("rollout"));
  at::Tensor out = torch::empty({2, 8, 3});
  reader.read("model", CheckpointSection::kParameters, "w", box({4, 0, 7}, {2, 8, 3}), out);
  EXPECT_TRUE(torch::equal(out, s.weight.narrow(0, 4, 2).narrow(2, 7, 3)));
  EXPECT_TRUE(torch::equal(reader.readWhole("model", CheckpointSection::kOptimizer, "exp_avg.w"), s.moment));
  EXPECT_FALSE(reader.find("model", CheckpointSection::kOptimizer, "exp_avg_sq.w").has_value());
}

TEST(ShardedCheckpoint, ConsolidatedFilesAreTheWholeTensorsByteForByte) {
  test::TempDir dir;
  torch::manual_seed(4);
  Saved s;
  const std::string sharded = dir.path() + "/sharded", out = dir.path() + "/out", whole = dir.path() + "/whole";
  fs::create_directories(sharded);
  fs::create_directories(whole);
  writeSaved(sharded, s, 3);
  consolidateCheckpoint(sharded, out);
  saveSafetensors(whole + "/model.safetensors", {{"w", s.weight}, {"b", s.bias}}, {{"format", "pt"}});
  saveSafetensors(whole + "/optimizer.safetensors", {{"exp_avg.w", s.moment}, {"precision.loss_scale", s.scale}},
                  {{"format", "pt"}});
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(test::readFile(out + "/" + file), test::readFile(whole + "/" + file)) << file;
  }
  const json meta = readJsonFile(out + "/meta.json");
  EXPECT_EQ(meta["step"], 3);
  EXPECT_FALSE(meta.contains("format"));
  // And the consolidated folder reads as a checkpoint of its own.
  CheckpointReader reader(out);
  EXPECT_FALSE(reader.sharded());
  EXPECT_TRUE(torch::equal(reader.readWhole("model", CheckpointSection::kParameters, "w"), s.weight));
}

TEST(ShardedCheckpoint, ChecksumsAreZlibsCrc32OfTheFileAndItsBlocks) {
  test::TempDir dir;
  at::Tensor t = torch::randn({300000});  // 1.2 MB: two blocks
  FileChecksum sum;
  saveSafetensors(dir.path() + "/t.safetensors", {{"t", t}}, {}, &sum);
  const std::string bytes = test::readFile(dir.path() + "/t.safetensors");
  EXPECT_EQ(sum.bytes, bytes.size());
  ASSERT_EQ(sum.block_crc32.size(), 2u);
  // CRC-32 (IEEE, as zlib and Python's zlib.crc32), computed here bit by bit.
  auto crc = [](const char* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
      c ^= static_cast<uint8_t>(p[i]);
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
  };
  EXPECT_EQ(sum.crc32, crc(bytes.data(), bytes.size()));
  EXPECT_EQ(sum.block_crc32[0], crc(bytes.data(), kChecksumBlockBytes));
  EXPECT_EQ(sum.block_crc32[1], crc(bytes.data() + kChecksumBlockBytes, bytes.size() - kChecksumBlockBytes));
}

}  // namespace
}  // namespace ptrain
