// `ptrain plot` as a real process: the curves of real short runs (one, two
// overlaid, a chosen size) come out as PNGs of the right size; metrics files
// in the newer form (with "kind"), with a resume's repeated steps and
// non-finite values, are drawn; a user's mistakes give one line and exit code 2.
// `ptrain plot --trace`: the timeline of a real two-rank run's traces
// (log.profile_steps), and of handwritten traces in both of libtorch's forms.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

using test::runPtrain;
using test::TempDir;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Width and height from a PNG's IHDR chunk, which the format puts first,
// right after the 8-byte signature; {0, 0} when the file is not a PNG.
std::pair<uint32_t, uint32_t> pngSize(const std::string& path) {
  const std::string bytes = test::readFile(path);
  if (bytes.size() < 24 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || bytes.compare(12, 4, "IHDR") != 0) {
    return {0, 0};
  }
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
    return v;
  };
  return {be32(16), be32(20)};
}

// Two short runs of the quickstart recipe on one rank, made once for the
// suite: a few steps with an evaluation every third, so that every panel a
// CPU run logs has several points.
class Plot : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new TempDir();
    runA_ = tmp_->path() + "/run_a";
    runB_ = tmp_->path() + "/run_b";
    for (const auto& [dir, lr] : {std::pair{runA_, "3e-3"}, std::pair{runB_, "1e-3"}}) {
      auto r = runPtrain({"run", test::sourceDir() + "/configs/quickstart.yaml", "--nproc", "1", "--run-dir", dir,
                          "train.steps=9", "train.eval_every=3", "train.log_every=1", "log.progress=lines",
                          std::string("optimizer.lr=") + lr},
                         {}, 300);
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }

  // Runs `ptrain plot` and expects exit 2 with one line holding `message`.
  static void expectRefused(const std::vector<std::string>& args, const std::string& message) {
    std::vector<std::string> full{"plot"};
    full.insert(full.end(), args.begin(), args.end());
    auto r = runPtrain(full, {}, 60);
    ASSERT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    const auto out = lines(r.output);
    ASSERT_EQ(out.size(), 1u) << r.output;
    // One prefix: "ptrain plot: ...", or "ptrain: <file>: ..." (never "ptrain: ptrain plot: ...").
    EXPECT_EQ(out[0].rfind("ptrain", 0), 0u) << r.output;
    EXPECT_EQ(out[0].find("ptrain: ptrain"), std::string::npos) << r.output;
    EXPECT_NE(out[0].find(message), std::string::npos) << "expected: " << message << "\n" << r.output;
  }

  static TempDir* tmp_;
  static std::string runA_, runB_;
};

TempDir* Plot::tmp_ = nullptr;
std::string Plot::runA_, Plot::runB_;

TEST_F(Plot, OneRunGoesToItsFolderAt1200By900) {
  auto r = runPtrain({"plot", runA_}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string png = runA_ + "/curves.png";
  EXPECT_EQ(pngSize(png), std::make_pair(1200u, 900u)) << png;
  // The panels a CPU run of the llm trainer logs, named on the one line of output.
  EXPECT_NE(r.output.find("wrote " + png + " (1200x900): loss, evaluation, learning rate, throughput, memory"),
            std::string::npos)
      << r.output;
}

TEST_F(Plot, SizeAndOutAreTheUsers) {
  const std::string png = tmp_->path() + "/small.png";
  auto r = runPtrain({"plot", runA_, "--size", "640x480", "--out", png}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(pngSize(png), std::make_pair(640u, 480u)) << r.output;
}

TEST_F(Plot, TwoRunsAreOverlaidInOnePicture) {
  const std::string png = tmp_->path() + "/both.png";
  auto r = runPtrain({"plot", runA_, runB_, "--out", png}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(pngSize(png), std::make_pair(1200u, 900u)) << r.output;
  EXPECT_FALSE(fs::exists(runB_ + "/curves.png")) << "--out is the only file written";
}

// The newer rows say their kind; a resume writes steps again (the last row
// stands); a diverged step's loss is null (nlohmann) or NaN (Python); rows of
// other kinds are not curves. Every panel appears, mfu and GPU memory too.
TEST_F(Plot, KindsRepeatedStepsAndNonFiniteValuesAreDrawn) {
  TempDir dir;
  std::ostringstream metrics;
  metrics << R"({"kind":"startup","step":0,"time":0.0,"startup_s":0.4})" << "\n";
  for (int step = 1; step <= 12; ++step) {
    metrics << R"({"kind":"train","step":)" << step << R"(,"time":)" << step * 0.5 << R"(,"loss":)"
            << 3.0 / step << R"(,"lr":)" << 1e-4 * step << R"(,"grad_norm":1.5,"mfu":0.41,"images_per_s":)"
            << 800 + step << R"(,"mem_mb":2100,"peak_rss_mb":2300,"device_mem_mb":9000,"peak_device_mb":12000})"
            << "\n";
    if (step == 8) metrics << R"({"kind":"checkpoint","step":8,"time":4.1,"checkpoint_save_s":[0.2]})" << "\n";
  }
  metrics << R"({"kind":"train","step":9,"time":7.0,"loss":NaN,"lr":9e-4})" << "\n";  // resumed at 8
  metrics << R"({"kind":"train","step":10,"time":7.5,"loss":null,"lr":1e-3})" << "\n";
  metrics << R"({"kind":"eval","step":6,"time":3.2,"eval_loss":0.6,"eval_map":0.2,"eval_map50":0.45})" << "\n";
  metrics << R"({"kind":"eval","step":12,"time":6.2,"eval_loss":0.4,"eval_map":0.3,"eval_map50":0.55})" << "\n";
  metrics << R"({"kind":"summary","step":12,"time":6.3,"wall_s":6.3})" << "\n";
  dir.write("metrics.jsonl", metrics.str());
  auto r = runPtrain({"plot", dir.path(), "--size", "900x700"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(pngSize(dir.path() + "/curves.png"), std::make_pair(900u, 700u)) << r.output;
  EXPECT_NE(r.output.find(": loss, evaluation, learning rate, throughput, memory, gradient norm, model FLOPs "
                          "utilisation"),
            std::string::npos)
      << r.output;
}

// A run still training: its last line may be half written (no newline yet).
// The curves so far are drawn, and the phase timers of a real run are a panel.
TEST_F(Plot, ALiveRunsHalfWrittenLastLineIsLeftOut) {
  TempDir dir;
  std::string metrics = ptrain::test::readFile(runA_ + "/metrics.jsonl");
  metrics += R"({"kind":"train","step":10,"loss":1.)";
  dir.write("metrics.jsonl", metrics);
  auto r = runPtrain({"plot", dir.path()}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step time by phase"), std::string::npos) << r.output;
}

// --field draws any field of the training rows (GRPO's scores, fp16's
// scale) in a panel of its own; one no row has is refused.
TEST_F(Plot, FieldsByNameGetAPanelEach) {
  const std::string png = tmp_->path() + "/fields.png";
  auto r = runPtrain({"plot", runA_, "--field", "micro_batches", "--field", "time_data_s", "--out", png}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step time by phase, micro_batches, time_data_s"), std::string::npos) << r.output;
  EXPECT_EQ(pngSize(png), std::make_pair(1200u, 900u)) << r.output;
  expectRefused({runA_, "--field", "loss_scale"},
                "ptrain plot: --field loss_scale: no training row of the run has it");
}

TEST_F(Plot, UserMistakesAreOneLineAndExitCode2) {
  TempDir dir;
  const std::string empty = dir.path() + "/empty";
  fs::create_directories(empty);
  expectRefused({empty}, "ptrain plot: " + empty +
                             "/metrics.jsonl not found: give the folder a run wrote (ptrain run --run-dir)");

  const std::string broken = dir.path() + "/broken";
  fs::create_directories(broken);
  dir.write("broken/metrics.jsonl", "{\"step\":1,\"loss\":2.0}\n{\"step\":2,\"loss\":\n");
  expectRefused({broken}, "ptrain: " + broken + "/metrics.jsonl:2:18: not valid JSON (syntax error");

  // Binary garbage is not a run that stopped early: the file is not JSON
  // lines, and the line says where.
  const std::string garbage = dir.path() + "/garbage";
  fs::create_directories(garbage);
  dir.write("garbage/metrics.jsonl", std::string("\x89PNG\r\n\x1a\n\x00\x00\xff\xfe binary", 18));
  expectRefused({garbage}, "ptrain: " + garbage + "/metrics.jsonl:1:1: not UTF-8 (byte 0x89 at offset 0 of the file)");
  const std::string text = dir.path() + "/text";
  fs::create_directories(text);
  dir.write("text/metrics.jsonl", "{\"step\":1,\"loss\":2.0}\nstep 2 loss 1.5");
  expectRefused({text}, "ptrain: " + text + "/metrics.jsonl:2:1: not valid JSON (syntax error");

  const std::string untrained = dir.path() + "/untrained";
  fs::create_directories(untrained);
  dir.write("untrained/metrics.jsonl", "{\"startup_s\":0.4,\"step\":0}\n");
  expectRefused({untrained}, "ptrain plot: " + untrained + "/metrics.jsonl has no training rows");

  expectRefused({runA_, "--size", "640by480"}, "ptrain plot: --size 640by480: expected WIDTHxHEIGHT");
  expectRefused({runA_, "--size", "20x20"}, "ptrain plot: --size 20x20: expected WIDTHxHEIGHT");
  expectRefused({runA_, "--out", dir.path() + "/curves.jpg"},
                "ptrain plot: --out " + dir.path() + "/curves.jpg: the picture is a PNG");
  expectRefused({runA_, "--out", dir.path() + "/no/such/folder/curves.png"},
                "ptrain plot: cannot write " + dir.path() + "/no/such/folder/curves.png: No such file or directory");
}

// A real run of two ranks traced over steps 2 and 3: one band per rank, the
// picture beside the traces by default, 1400 wide and as tall as the bands
// need; or the size and file given.
TEST_F(Plot, TracesOfARealRunAreDrawnAsATimeline) {
  const std::string run = tmp_->path() + "/traced";
  auto r = runPtrain({"run", test::sourceDir() + "/configs/quickstart.yaml", "--nproc", "2", "--run-dir", run,
                      "train.steps=4", "train.global_batch_size=8", "log.profile_steps=[2, 3]"},
                     {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string rank0 = run + "/traces/rank0.json", rank1 = run + "/traces/rank1.json";

  r = runPtrain({"plot", "--trace", rank0, rank1}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string png = run + "/traces/timeline.png";
  const auto [width, height] = pngSize(png);
  EXPECT_EQ(width, 1400u) << png;
  EXPECT_GE(height, 200u) << png;
  EXPECT_LE(height, 900u) << "two ranks of a few lanes each: " << png;
  EXPECT_NE(r.output.find("wrote " + png + " (1400x" + std::to_string(height) + "): timeline of rank 0, rank 1"),
            std::string::npos)
      << r.output;

  const std::string chosen = tmp_->path() + "/timeline_1000x600.png";
  r = runPtrain({"plot", "--trace", rank0, rank1, "--out", chosen, "--size", "1000x600"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(pngSize(chosen), std::make_pair(1000u, 600u)) << r.output;
}

// libtorch's legacy profiler (Debian's libtorch) writes a bare array; Kineto
// (PyPI's) an object with "traceEvents", string tids, instant and metadata
// events, and ptrain's ranges repeated on the GPU's stream. Both are drawn,
// in one picture too (their clocks differ: each band keeps its own).
TEST_F(Plot, HandwrittenTracesInBothFormsAreDrawn) {
  TempDir dir;
  const std::string legacy = dir.write("rank0.json", R"([
{"name": "ptrain::other", "ph": "X", "ts": 10.0, "dur": 900.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "ptrain::data", "ph": "X", "ts": 12.0, "dur": 5.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "ptrain::forward_backward", "ph": "X", "ts": 20.0, "dur": 500.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "aten::mm", "ph": "X", "ts": 30.0, "dur": 100.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "ptrain::grad_reduce", "ph": "X", "ts": 400.0, "dur": 110.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "ptrain::allreduce dp0", "ph": "X", "ts": 410.0, "dur": 40.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "ptrain::wait dp0", "ph": "X", "ts": 455.0, "dur": 50.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "ptrain::optimizer", "ph": "X", "ts": 530.0, "dur": 300.0, "tid": 1, "pid": "CPU Functions", "args": {}},
{"name": "aten::add_", "ph": "X", "ts": 100.0, "dur": 50.0, "tid": 2, "pid": "CPU Functions", "args": {}}
]
)");
  const std::string kineto = dir.write("rank1.json", R"({"schemaVersion": 1, "traceEvents": [
{"ph": "i", "name": "Iteration Start: PyTorch Profiler", "pid": 77, "tid": "77", "ts": 1733450000000000, "s": "g"},
{"ph": "M", "name": "thread_name", "pid": 77, "tid": "77", "args": {"name": "python"}},
{"ph": "X", "cat": "user_annotation", "name": "ptrain::other", "pid": 77, "tid": "77", "ts": 1733450000000100, "dur": 9000},
{"ph": "X", "cat": "user_annotation", "name": "ptrain::forward_backward", "pid": 77, "tid": "77", "ts": 1733450000000200, "dur": 6000},
{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 77, "tid": "77", "ts": 1733450000000300, "dur": 1200},
{"ph": "X", "cat": "gpu_user_annotation", "name": "ptrain::forward_backward", "pid": 0, "tid": "stream 7", "ts": 1733450000000400, "dur": 6100},
{"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": "stream 7", "ts": 1733450000000500, "dur": 300},
{"ph": "X", "cat": "user_annotation", "name": "ptrain::pipeline_wait", "pid": 77, "tid": "77", "ts": 1733450000006300, "dur": 700},
{"ph": "X", "cat": "user_annotation", "name": "ptrain::optimizer", "pid": 77, "tid": "77", "ts": 1733450000007100, "dur": 1900}
], "traceName": "rank1.json"}
)");
  auto r = runPtrain({"plot", "--trace", legacy, "--size", "800x300"}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(pngSize(dir.path() + "/timeline.png"), std::make_pair(800u, 300u)) << r.output;
  EXPECT_NE(r.output.find("timeline of rank 0"), std::string::npos) << r.output;

  const std::string png = dir.path() + "/both.png";
  r = runPtrain({"plot", "--trace", legacy, kineto, "--out", png}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(pngSize(png).first, 1400u) << r.output;
  EXPECT_NE(r.output.find("timeline of rank 0, rank 1"), std::string::npos) << r.output;

  // A file not named by its rank is named as it is.
  const std::string named = dir.write("step_trace.json", test::readFile(kineto));
  r = runPtrain({"plot", "--trace", named, "--out", png}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("timeline of step_trace.json"), std::string::npos) << r.output;
}

TEST_F(Plot, TraceMistakesAreOneLineAndExitCode2) {
  TempDir dir;
  const std::string missing = dir.path() + "/rank0.json";
  expectRefused({"--trace", missing}, "ptrain plot: " + missing + " not found");
  expectRefused({"--trace", dir.path()}, "ptrain plot: " + dir.path() + " is a folder");

  const std::string broken = dir.write("broken.json", "[{\"name\": \"ptrain::data\", \"ph\": \n");
  expectRefused({"--trace", broken}, "ptrain plot: " + broken + ": not valid JSON (line 2");

  const std::string other = dir.write("other.json", R"({"displayTimeUnit": "ms"})");
  expectRefused({"--trace", other}, "ptrain plot: " + other + ": not a Chrome trace");

  // A trace of something else: operators, no ranges of ptrain's.
  const std::string foreign =
      dir.write("foreign.json", R"([{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 2, "tid": 1, "pid": 1}])");
  expectRefused({"--trace", foreign},
                "ptrain plot: " + foreign + " has no ptrain ranges: was it written by log.profile_steps?");

  expectRefused({runA_, "--trace", foreign}, "ptrain plot: give run folders or --trace files, not both");
  expectRefused({}, "ptrain plot: give a run folder (ptrain plot RUN_DIR) or traces");
  expectRefused({"--trace", foreign, "--out", dir.path() + "/timeline.svg"},
                "ptrain plot: --out " + dir.path() + "/timeline.svg: the picture is a PNG");
}

}  // namespace
}  // namespace ptrain
