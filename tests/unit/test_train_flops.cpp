// Model FLOPs of the detection and recommender trainers (Trainer::trainFlops,
// the numerator of MFU): for small recipes, against the multiply-adds written
// out by hand layer by layer, and against a measurement, the multiply-adds of
// the convolutions and matrix products libtorch runs in one forward pass of
// the built model; and the figures of the documented recipes.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <ATen/record_function.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../trainers/detection/detection_trainer.h"
#include "../../trainers/recommender/recommender_trainer.h"
#include "ptrain/nn/host_kernels.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"
#include "support/test_support.h"

using ptrain::Batch;
using ptrain::PluginContext;
using ptrain::Recipe;
using ptrain::Schema;
using ptrain::detection::CenterNetModel;
using ptrain::detection::DetectionTrainer;
using ptrain::recommender::RecommenderTrainer;
using ptrain::recommender::RecsysModel;

namespace {

// Multiply-adds of the convolutions and matrix products run on this thread
// while an instance lives, counted from libtorch's own record of each
// operator call (its inputs' and outputs' shapes), so independent of how the
// trainers count. Only the outermost such call counts: aten::linear runs
// aten::addmm or aten::matmul inside, which are the same multiply-adds.
class MultiplyAddCounter {
 public:
  MultiplyAddCounter() {
    depth() = 0;
    total() = 0;
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&MultiplyAddCounter::enter, &MultiplyAddCounter::leave)
            .needsInputs(true)
            .needsOutputs(true));
  }
  ~MultiplyAddCounter() { at::removeCallback(handle_); }
  MultiplyAddCounter(const MultiplyAddCounter&) = delete;
  MultiplyAddCounter& operator=(const MultiplyAddCounter&) = delete;

  int64_t count() const { return total(); }

 private:
  // The products counted, and which input holds the left factor (or the
  // convolution's weight).
  enum class Kind { kNone, kConvolution, kLinear, kProduct, kProductAfterBias };

  static Kind kindOf(const char* name) {
    for (const char* op : {"aten::conv2d", "aten::convolution", "aten::_convolution"}) {
      if (std::strcmp(name, op) == 0) return Kind::kConvolution;
    }
    if (std::strcmp(name, "aten::linear") == 0) return Kind::kLinear;
    for (const char* op : {"aten::matmul", "aten::mm", "aten::bmm"}) {
      if (std::strcmp(name, op) == 0) return Kind::kProduct;
    }
    for (const char* op : {"aten::addmm", "aten::baddbmm"}) {
      if (std::strcmp(name, op) == 0) return Kind::kProductAfterBias;
    }
    return Kind::kNone;
  }

  // The sum each output element of the outermost counted call takes: read
  // from its inputs on entry (libtorch 2.x keeps a call's inputs only
  // until it runs), used with its output's size on leaving.
  static std::unique_ptr<at::ObserverContext> enter(const at::RecordFunction& fn) {
    const Kind kind = kindOf(fn.name());
    if (kind == Kind::kNone || ++depth() > 1) return nullptr;
    const auto inputs = fn.inputs();
    auto tensorAt = [&](size_t i) -> const at::Tensor* {
      return i < inputs.size() && inputs[i].isTensor() ? &inputs[i].toTensor() : nullptr;
    };
    const at::Tensor* factor = nullptr;
    switch (kind) {
      case Kind::kConvolution:       // weight [out, in / groups, kh, kw]
      case Kind::kLinear:            // weight [out, in]
      case Kind::kProductAfterBias:  // (bias, left factor, right factor)
        factor = tensorAt(1);
        break;
      case Kind::kProduct:
        factor = tensorAt(0);
        break;
      case Kind::kNone:
        break;
    }
    if (factor == nullptr) {
      ADD_FAILURE() << fn.name() << ": libtorch recorded no input to count from";
      sumLength() = 0;
    } else if (kind == Kind::kConvolution) {
      // Each output element sums in_channels / groups x kernel area products.
      sumLength() = factor->numel() / factor->size(0);
    } else {
      // linear: the weight's in; a product and addmm / baddbmm: the left
      // factor's last dimension.
      sumLength() = factor->size(-1);
    }
    return nullptr;
  }

  static void leave(const at::RecordFunction& fn, at::ObserverContext*) {
    const Kind kind = kindOf(fn.name());
    if (kind == Kind::kNone || --depth() > 0) return;
    const auto outputs = fn.outputs();
    if (outputs.empty() || !outputs[0].isTensor()) {
      ADD_FAILURE() << fn.name() << ": libtorch recorded no output to count from";
      return;
    }
    total() += outputs[0].toTensor().numel() * sumLength();
  }

  static int64_t& sumLength() {
    thread_local int64_t n = 0;
    return n;
  }
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
  static int64_t& total() {
    thread_local int64_t n = 0;
    return n;
  }

  at::CallbackHandle handle_;
};

// ptrain's host linear kernel calls BLAS directly, past libtorch's record of
// operators: the measurement needs libtorch's own linear.
class LibtorchLinear {
 public:
  LibtorchLinear() : was_(ptrain::nn::hostKernelsEnabled()) {
    if (was_) ptrain::nn::setHostKernels(false);
  }
  ~LibtorchLinear() {
    if (was_) ptrain::nn::setHostKernels(true);
  }

 private:
  bool was_;
};

template <typename T>
void setUpTrainer(T& trainer, Recipe recipe) {
  Schema schema;
  ptrain::describeCoreKeys(schema);
  trainer.describeKeys(schema);
  recipe.validate(schema);
  trainer.setup(recipe);
}

// ---- detection ----

// 64x64 canvases; stem 4 channels, blocks of 8 channels (16 inside).
std::string detectionRecipe(int64_t blockStride, int64_t headChannels) {
  return "trainer: {name: detection}\n"
         "model: {num_layers: 2, hidden_size: 8, ffn_hidden_size: 16, stem_channels: 4, block_dilations: [1, 2], "
         "block_stride: " +
         std::to_string(blockStride) + ", head_channels: " + std::to_string(headChannels) +
         "}\n"
         "data: {name: mosaic, canvas: 64, max_items: 3, min_scale: 0.75, max_scale: 1.25, eval_size: 8}\n"
         "train: {steps: 3, global_batch_size: 2, seed: 7}\n";
}

// Multiply-adds of `images` canvases' forward pass as libtorch runs it.
int64_t measureDetection(DetectionTrainer& trainer, int64_t images) {
  auto model = std::dynamic_pointer_cast<CenterNetModel>(trainer.buildModel());
  EXPECT_NE(model, nullptr);
  const Batch batch = trainer.globalBatch(0, images);
  torch::NoGradGuard noGrad;
  LibtorchLinear libtorchLinear;
  MultiplyAddCounter counter;
  at::Tensor hidden = model->embed(batch);
  for (int i = 0; i < model->numBlocks(); ++i) hidden = model->runBlock(i, hidden);
  const at::Tensor outputs = model->headOutputs(hidden);
  EXPECT_EQ(outputs.size(0), images);
  return counter.count();
}

// A forward pass over two images less one over one image (per-batch work,
// such as folding the head's 3x3 weights into 2x2 ones, cancels): the
// multiply-adds of one image, which must be the hand count `byHand`, and of
// which trainFlops(1) counts 6 (2 forward, 4 backward).
void expectMeasuredPerImage(DetectionTrainer& trainer, int64_t byHand) {
  const int64_t measured = measureDetection(trainer, 2) - measureDetection(trainer, 1);
  EXPECT_EQ(measured, byHand);
  EXPECT_DOUBLE_EQ(trainer.trainFlops(1), 3.0 * 2.0 * static_cast<double>(measured));
}

TEST(DetectionTrainFlops, BlockStride4ByHandAndMeasured) {
  DetectionTrainer trainer{PluginContext{}};
  EXPECT_EQ(trainer.trainFlops(10), 0.0);  // before setup(): no model to count
  setUpTrainer(trainer, Recipe::fromString(detectionRecipe(4, 8), "<test>"));
  // Output side x output channels x input channels x kernel area, per image:
  //   stem.conv1    3x3 s2  1 -> 4   at 32x32: 1024 * 4 * 1 * 9  =  36864
  //   stem.conv2    3x3 s2  4 -> 8   at 16x16:  256 * 8 * 4 * 9  =  73728
  //   block.expand  3x3     8 -> 16  at 16x16:  256 * 16 * 8 * 9 = 294912  (x2 blocks)
  //   block.up      1x1    16 -> 8   at 16x16:  256 * 8 * 16     =  32768  (x2 blocks)
  //   head.features 3x3     8 -> 8   at 16x16:  256 * 8 * 8 * 9  = 147456
  //   head.out      1x1     8 -> 14  at 16x16:  256 * 14 * 8     =  28672
  // 36864 + 73728 + 2 * (294912 + 32768) + 147456 + 28672 = 942080
  // multiply-adds; 6 FLOPs each in training (2 forward, 4 backward).
  const double perImage = 942080.0 * 6;
  EXPECT_DOUBLE_EQ(trainer.trainFlops(1), perImage);
  EXPECT_DOUBLE_EQ(trainer.trainFlops(32), 32 * perImage);

  expectMeasuredPerImage(trainer, 942080);
}

TEST(DetectionTrainFlops, BlockStride8ByHandAndMeasured) {
  DetectionTrainer trainer{PluginContext{}};
  setUpTrainer(trainer, Recipe::fromString(detectionRecipe(8, 6), "<test>"));
  // The stem's second convolution widens to 2 * stem_channels, a third
  // brings the side to 8x8, and the head's 3x3 features run over the blocks'
  // output upsampled to 16x16: 4 taps per output pixel and input channel, as
  // upsampleTwiceThenConv3x3 computes it (the other 5 of 9 read copies).
  //   stem.conv1    3x3 s2  1 -> 4   at 32x32: 1024 * 4 * 1 * 9  =  36864
  //   stem.conv2    3x3 s2  4 -> 8   at 16x16:  256 * 8 * 4 * 9  =  73728
  //   stem.conv3    3x3 s2  8 -> 8   at  8x8:    64 * 8 * 8 * 9  =  36864
  //   block.expand  3x3     8 -> 16  at  8x8:    64 * 16 * 8 * 9 =  73728  (x2 blocks)
  //   block.up      1x1    16 -> 8   at  8x8:    64 * 8 * 16     =   8192  (x2 blocks)
  //   head.features 2x2 x4  8 -> 6   at 16x16:  256 * 6 * 8 * 4  =  49152
  //   head.out      1x1     6 -> 14  at 16x16:  256 * 14 * 6     =  21504
  // 36864 + 73728 + 36864 + 2 * (73728 + 8192) + 49152 + 21504 = 381952
  const double perImage = 381952.0 * 6;
  EXPECT_DOUBLE_EQ(trainer.trainFlops(3), 3 * perImage);

  expectMeasuredPerImage(trainer, 381952);
}

TEST(DetectionTrainFlops, DocumentedRecipe) {
  DetectionTrainer trainer{PluginContext{}};
  setUpTrainer(trainer, Recipe::load(ptrain::test::sourceDir() + "/configs/detection/mosaic_dp2.yaml"));
  // 128x128 canvases, stem 1 -> 16 -> 32 -> 64 to 16x16, three blocks of 64
  // (128 inside), head 48 channels at 32x32:
  //   conv1 4096 * 16 * 9 = 589824; conv2 1024 * 32 * 16 * 9 = 4718592;
  //   conv3 256 * 64 * 32 * 9 = 4718592; blocks 3 * (256 * 128 * 64 * 9 +
  //   256 * 64 * 128) = 62914560; features 1024 * 48 * 64 * 4 = 12582912;
  //   out 1024 * 14 * 48 = 688128: 86212608 multiply-adds per image.
  EXPECT_DOUBLE_EQ(trainer.trainFlops(1), 86212608.0 * 6);
}

// ---- recommender ----

// Tables scaled to 50 rows, width 4, a history of 5, `experts` experts (top-2).
Recipe recommenderRecipe(int64_t experts) {
  return Recipe::fromString(R"(
trainer: {name: recommender}
model: {embedding_dim: 4, bottom_mlp: [8], top_mlp: [8], attention_hidden: 6, hidden_size: 8, ffn_hidden_size: 12,
        scale: 0.001, min_table_rows: 50}
data: {name: clicks, history_length: 5, eval_size: 40}
train: {steps: 4, global_batch_size: 16, seed: 3}
)",
                            "<test>",
                            experts > 0 ? std::vector<std::string>{"model.num_experts=" + std::to_string(experts),
                                                                   "model.moe_router_topk=2"}
                                        : std::vector<std::string>{"model.num_experts=0"});
}

int64_t measureRecommender(RecommenderTrainer& trainer, int64_t samples) {
  auto model = std::dynamic_pointer_cast<RecsysModel>(trainer.buildModel());
  EXPECT_NE(model, nullptr);
  const Batch batch = trainer.globalBatch(0, samples);
  torch::NoGradGuard noGrad;
  LibtorchLinear libtorchLinear;
  MultiplyAddCounter counter;
  at::Tensor hidden = model->embed(batch);
  for (int i = 0; i < model->numBlocks(); ++i) hidden = model->runBlock(i, hidden);
  EXPECT_EQ(model->logits(hidden).size(0), samples);
  return counter.count();
}

// Where the recommender's implementation and its model FLOPs differ, so the
// measurement is checked against the model's count with them accounted for:
// pairwiseDots multiplies out the whole 29 x 29 Gram matrix of width dim for
// the 406 pairs it keeps, and the attention's weighted sum of the history is
// an elementwise product and a sum, which the count of products does not see.
int64_t measuredLessModel(int64_t dim, int64_t history) {
  const int64_t gram = 29 * 29 * dim, pairs = 406 * dim, weightedSum = history * dim;
  return (gram - pairs) - weightedSum;
}

TEST(RecommenderTrainFlops, ExpertsByHandAndMeasured) {
  RecommenderTrainer trainer{PluginContext{}};
  EXPECT_EQ(trainer.trainFlops(10), 0.0);
  setUpTrainer(trainer, recommenderRecipe(4));
  // Per sample (in x out of each linear layer):
  //   bottom MLP   13 x 8, 8 x 4                           = 104 + 32       =  136
  //   interaction  406 pairs of the 29 vectors x width 4   = 406 * 4        = 1624
  //   attention    5 slots x (12 x 6 + 6 x 1 + a weighted
  //                sum of width 4)                         = 5 * (72+6+4)   =  410
  //   projection   (4 + 406 + 4 * 4) x 8                   = 426 * 8        = 3408
  //   router       8 x 4 experts                                            =   32
  //   experts      top-2 x (8 x 12 + 12 x 8)               = 2 * 192        =  384
  //   top MLP      8 x 8, 8 x 1                            = 64 + 8         =   72
  // 136 + 1624 + 410 + 3408 + 32 + 384 + 72 = 6066 multiply-adds, 6 FLOPs each.
  EXPECT_DOUBLE_EQ(trainer.trainFlops(1), 6066.0 * 6);
  EXPECT_DOUBLE_EQ(trainer.trainFlops(256), 256 * 6066.0 * 6);

  // Each sample runs its top-2 experts whichever they are, so the
  // difference of two samples and one is one sample's work.
  const int64_t measured = measureRecommender(trainer, 2) - measureRecommender(trainer, 1);
  EXPECT_EQ(measured, 6066 + measuredLessModel(4, 5));
  EXPECT_DOUBLE_EQ(trainer.trainFlops(1), 3.0 * 2.0 * static_cast<double>(measured - measuredLessModel(4, 5)));
}

TEST(RecommenderTrainFlops, DenseBlockByHandAndMeasured) {
  RecommenderTrainer trainer{PluginContext{}};
  setUpTrainer(trainer, recommenderRecipe(0));
  // As above with block 1's dense GELU MLP (8 x 12, 12 x 8 = 192) in place
  // of the router and the experts: 136 + 1624 + 410 + 3408 + 192 + 72 = 5842.
  EXPECT_DOUBLE_EQ(trainer.trainFlops(1), 5842.0 * 6);
  const int64_t measured = measureRecommender(trainer, 2) - measureRecommender(trainer, 1);
  EXPECT_EQ(measured, 5842 + measuredLessModel(4, 5));
}

TEST(RecommenderTrainFlops, DocumentedRecipe) {
  RecommenderTrainer trainer{PluginContext{}};
  setUpTrainer(trainer, Recipe::load(ptrain::test::sourceDir() + "/configs/recommender/recsys_small.yaml"));
  // Width 16, history 8, hidden 64, 4 experts of 128 (top-2):
  //   bottom 13 * 64 + 64 * 16 = 1856; interaction 406 * 16 = 6496;
  //   attention 8 * (48 * 32 + 32 + 16) = 12672; projection 486 * 64 = 31104;
  //   router 64 * 4 = 256; experts 2 * (64 * 128 + 128 * 64) = 32768;
  //   top 64 * 64 + 64 * 32 + 32 = 6176: 91328 multiply-adds per sample.
  EXPECT_DOUBLE_EQ(trainer.trainFlops(1), 91328.0 * 6);
}

}  // namespace
