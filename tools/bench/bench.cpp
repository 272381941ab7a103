// make bench: ptrain against PyTorch eager on the same libtorch, side by side.
//
// For each GPT size it trains the same model, batch and optimizer twice:
//   ptrain  `ptrain run tools/bench/<size>.yaml --nproc 1` (the real engine),
//           median step_time_s of metrics.jsonl after the warm-up steps;
//   eager   tools/bench/gpt_eager.py on the same libtorch: Debian's python3
//           with python3-torch for libtorch 1.13, .venv-torch's python for
//           PyTorch 2.x from PyPI (make TORCH=pypi bench); median step time.
// Both use every core of the machine for intra-op threads. Achieved GFLOP/s
// count 6 x params x tokens plus attention (12 x layers x hidden x seq per
// token), and are compared with this machine's fp32 matmul peak measured here.
// Then the large model at tp=2 beside tp=1, and the measured pipeline bubble
// at pp=2 and pp=4 beside its formula. Then, for both sizes, fp32 / bf16 /
// fp16 with every fusion off and on: ATen operators dispatched per step
// (log.count_ops), step time and peak RSS, and what each fusion alone saves.
// Then two ranks with one slowed on purpose, the batch split evenly and 2:1
// (parallel.data_parallel_shares). Then device groups (parallel.groups): two
// groups of two ranks, the second slowed to half speed and held at tp 2 (as a
// V100 group needs tp 4 for a 7B model), each in its own layout against the
// best common layout, the batch split evenly and by speed, the planner's
// prediction beside each.
// Then the planner's predictions beside measurement for twelve layouts.
// Then the recommender's samples/s: the scaled 12B recipe on its 8-rank
// layout (tp 4 x pp 2 x ep 2) and recsys_small on 2 data-parallel ranks.
// Then scale: a 403M GPT on 4 processes at tp 4 and tp 2 x pp 2, each rank's
// peak memory over the whole run (build, steps, save, load) against
// `ptrain plan`, start-up, save and load seconds.
// `ptrain_bench [eager|tensor|pipeline|fusion|moe|memory|shares|hetero|calibration|recommender|scale]` runs only the
// sections named (`make bench scale`).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ptrain/launch/host_tuning.h"

namespace fs = std::filesystem;

namespace {

struct GptSize {
  std::string name;
  int layers, hidden, heads, seq, batch, steps;
};

// Runs a command, returns its stdout (stderr passes through); exits on failure.
std::string capture(const std::string& cmd) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    std::fprintf(stderr, "bench: cannot run %s\n", cmd.c_str());
    std::exit(1);
  }
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  if (status != 0) {
    std::fprintf(stderr, "bench: command failed (%d): %s\n%s\n", status, cmd.c_str(), out.c_str());
    std::exit(1);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One `ptrain run` of the bench recipe at size `s` on `nproc` processes with
// extra overrides (the parallel layout): median step time after the warm-up
// steps, peak RSS, the tensor plugin's bytes per step and the pipeline
// plugin's median measured bubble with its formula.
struct PtrainRun {
  double step_s = 0;
  double rss_mb = 0;
  double tp_bytes = 0;
  double pp_bubble = 0;
  double pp_bubble_formula = 0;
  int pp_inflight = 0;
  double ops = 0;  // median aten_ops per step (with log.count_ops=true)
  // MoE (medians): token all-to-all bytes sent per step, their uniform-routing
  // count, time in the all-to-alls (summed over ranks), tokens-per-expert CV.
  double a2a_bytes = 0, a2a_bytes_uniform = 0, a2a_s = 0, tokens_cv = 0;
};

// The bench recipe at size `s` on `nproc` processes.
std::string sizeOverrides(const GptSize& s, int nproc) {
  std::ostringstream o;
  o << "launch.nproc=" << nproc << " model.num_layers=" << s.layers << " model.hidden_size=" << s.hidden
    << " model.num_attention_heads=" << s.heads << " model.seq_length=" << s.seq
    << " train.global_batch_size=" << s.batch;
  return o.str();
}

// What `ptrain plan --json` predicts for the same run on this machine.
nlohmann::json planPtrain(const fs::path& binary, const fs::path& source, const GptSize& s, int nproc,
                          const std::string& overrides) {
  std::ostringstream cmd;
  cmd << binary / "bin/ptrain" << " plan " << source / "tools/bench/gpt.yaml" << " --json --device host --nproc "
      << nproc << " " << sizeOverrides(s, nproc) << " " << overrides;
  return nlohmann::json::parse(capture(cmd.str()));
}

PtrainRun runPtrain(const fs::path& binary, const fs::path& source, const GptSize& s, int warmup, int nproc,
                    const std::string& overrides = "", const std::string& env = "") {
  const std::string runDir =
      (fs::temp_directory_path() / ("ptrain-bench-" + s.name + "-" + std::to_string(getpid()))).string();
  fs::remove_all(runDir);
  std::ostringstream cmd;
  cmd << env << (env.empty() ? "" : " ") << binary / "bin/ptrain" << " run " << source / "tools/bench/gpt.yaml"
      << " --nproc " << nproc << " --run-dir " << runDir << " " << sizeOverrides(s, nproc)
      << " train.steps=" << s.steps + warmup << " " << overrides << " 2>&1";
  capture(cmd.str());
  PtrainRun run;
  std::vector<double> stepTimes, bubbles, ops, a2aBytes, a2aUniform, a2aSeconds, cv;
  std::ifstream metrics(runDir + "/metrics.jsonl");
  std::string line;
  while (std::getline(metrics, line)) {
    auto j = nlohmann::json::parse(line);
    // Training rows only (metrics.jsonl also holds startup, eval, checkpoint
    // and summary rows, told apart by "kind").
    if (j.value("kind", "train") != "train" || !j.contains("step_time_s")) continue;
    if (j["step"].get<int>() > warmup) {
      stepTimes.push_back(j["step_time_s"].get<double>());
      if (j.contains("pp_bubble")) bubbles.push_back(j["pp_bubble"].get<double>());
      if (j.contains("aten_ops")) ops.push_back(j["aten_ops"].get<double>());
      if (j.contains("moe_a2a_bytes")) {
        a2aBytes.push_back(j["moe_a2a_bytes"].get<double>());
        a2aUniform.push_back(j["moe_a2a_bytes_uniform"].get<double>());
        a2aSeconds.push_back(j["moe_a2a_s"].get<double>());
        cv.push_back(j["moe_tokens_cv"].get<double>());
      }
    }
    run.rss_mb = std::max(run.rss_mb, j["peak_rss_mb"].get<double>());
    if (j.contains("tp_comm_bytes")) run.tp_bytes = j["tp_comm_bytes"].get<double>();
    if (j.contains("pp_bubble_formula")) run.pp_bubble_formula = j["pp_bubble_formula"].get<double>();
    if (j.contains("pp_inflight_max")) run.pp_inflight = std::max(run.pp_inflight, j["pp_inflight_max"].get<int>());
  }
  fs::remove_all(runDir);
  run.step_s = median(stepTimes);
  run.pp_bubble = median(bubbles);
  run.ops = ops.empty() ? 0 : median(ops);
  run.a2a_bytes = median(a2aBytes);
  run.a2a_bytes_uniform = median(a2aUniform);
  run.a2a_s = median(a2aSeconds);
  run.tokens_cv = median(cv);
  return run;
}

// Slows one worker of the runs started while it lives to `duty` of its speed,
// as a device that much slower would: the worker is stopped and continued in
// turn (SIGSTOP, SIGCONT, as cpulimit does), every `period`. The worker is the
// process whose environment holds `tag`, PTRAIN_WORKER=1 and RANK=<rank>.
class RankThrottle {
 public:
  RankThrottle(std::string tag, int rank, double duty)
      : tag_(std::move(tag)), rank_("RANK=" + std::to_string(rank)), duty_(duty), thread_([this] { loop(); }) {}
  ~RankThrottle() {
    stop_ = true;
    thread_.join();
  }

 private:
  pid_t find() const {
    for (const auto& entry : fs::directory_iterator("/proc")) {
      const std::string name = entry.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(entry.path() / "environ", std::ios::binary);
      std::string var;
      bool tagged = false, worker = false, ranked = false;
      while (std::getline(in, var, '\0')) {
        tagged = tagged || var == tag_;
        worker = worker || var == "PTRAIN_WORKER=1";
        ranked = ranked || var == rank_;
      }
      if (tagged && worker && ranked) return static_cast<pid_t>(std::stol(name));
    }
    return 0;
  }
  void loop() {
    const auto period = std::chrono::milliseconds(20);
    pid_t pid = 0;
    while (!stop_) {
      if (pid == 0 || kill(pid, SIGCONT) != 0) {
        pid = find();
        std::this_thread::sleep_for(period);
        continue;
      }
      std::this_thread::sleep_for(period * duty_);
      if (stop_) break;
      kill(pid, SIGSTOP);
      std::this_thread::sleep_for(period * (1 - duty_));
    }
    if (pid != 0) kill(pid, SIGCONT);
  }

  std::string tag_, rank_;
  double duty_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The peak resident set (VmHWM) of each worker of the runs started while it
// lives, by rank: the workers whose environment holds `tag`,
// PTRAIN_WORKER=1 and RANK=<r>, read from /proc every 50 ms.
class RankPeaks {
 public:
  explicit RankPeaks(std::string tag) : tag_(std::move(tag)), thread_([this] { loop(); }) {}
  ~RankPeaks() { stop(); }
  // Stops watching; peak MB by rank.
  std::map<int, double> stop() {
    if (!stop_.exchange(true)) thread_.join();
    return peaks_;
  }

 private:
  void loop() {
    while (!stop_) {
      for (const auto& entry : fs::directory_iterator("/proc")) {
        const std::string name = entry.path().filename();
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream in(entry.path() / "environ", std::ios::binary);
        std::string var;
        bool tagged = false, worker = false;
        int rank = -1;
        while (std::getline(in, var, '\0')) {
          tagged = tagged || var == tag_;
          worker = worker || var == "PTRAIN_WORKER=1";
          if (var.rfind("RANK=", 0) == 0) rank = std::atoi(var.c_str() + 5);
        }
        if (!tagged || !worker || rank < 0) continue;
        std::ifstream status(entry.path() / "status");
        for (std::string line; std::getline(status, line);) {
          if (line.rfind("VmHWM:", 0) == 0) peaks_[rank] = std::max(peaks_[rank], std::atof(line.c_str() + 6) / 1024);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::string tag_;
  std::map<int, double> peaks_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// fp32 matmul peak of this machine with all cores, GFLOP/s.
double matmulPeak(int threads) {
  at::set_num_threads(threads);
  const int64_t n = 1024;
  auto a = torch::randn({n, n}), b = torch::randn({n, n}), c = torch::empty({n, n});
  for (int i = 0; i < 3; ++i) torch::mm_out(c, a, b);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    const int iters = 10;
    for (int i = 0; i < iters; ++i) torch::mm_out(c, a, b);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n * iters / s / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  // The BLAS kernels ptrain's launcher chooses for its workers
  // (launch/host_tuning.h) apply to this process too, and so to the matmul
  // peak and to eager, which inherits them: all three run the same BLAS
  // kernels. The BLAS reads the setting when it is loaded, so the bench starts
  // itself again. The OpenMP wait policy is not set here: ptrain's launcher
  // chooses its workers' own, and eager gets the one for libtorch's two
  // thread pools on its command line (below).
  const ptrain::HostTuning tuning = ptrain::hostTuning();
  bool restart = false;
  for (const auto& e : tuning.env) {
    const auto eq = e.find('=');
    if (e.compare(0, eq, "OMP_WAIT_POLICY") == 0) continue;
    setenv(e.substr(0, eq).c_str(), e.substr(eq + 1).c_str(), 1);
    restart = true;
  }
  if (restart) {
    for (const auto& note : tuning.notes) std::fprintf(stderr, "bench: %s\n", note.c_str());
    execv("/proc/self/exe", argv);
    std::fprintf(stderr, "bench: cannot restart itself with the tuned environment; continuing without it\n");
  }
  const fs::path source = PTRAIN_SOURCE_DIR;
  const fs::path binary = PTRAIN_BINARY_DIR;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<GptSize> sizes{{"small", 4, 256, 4, 64, 32, 12}, {"large", 8, 1024, 16, 128, 8, 6}};
  const int warmup = 2;

  // Sections to run: eager, tensor, pipeline (default: all), e.g.
  // `build/bin/ptrain_bench pipeline`.
  std::vector<std::string> only(argv + 1, argv + argc);
  for (const auto& name : only) {
    if (name != "eager" && name != "tensor" && name != "pipeline" && name != "fusion" && name != "moe" &&
        name != "memory" && name != "shares" && name != "hetero" && name != "calibration" && name != "recommender" &&
        name != "scale") {
      std::fprintf(stderr,
                   "ptrain_bench: unknown section '%s'; use eager, tensor, pipeline, fusion, moe, memory, shares, hetero, "
                   "calibration, recommender or scale (default: all)\n",
                   name.c_str());
      return 2;
    }
  }
  auto runs = [&](const char* section) { return only.empty() || std::find(only.begin(), only.end(), section) != only.end(); };

  const double peak = matmulPeak(threads);
  std::printf("fp32 matmul peak (1024^3, %d threads): %.1f GFLOP/s\n\n", threads, peak);
  if (runs("eager"))
    std::printf("%-6s %8s %7s | %-44s | %-44s | %s\n", "model", "params", "tokens", "ptrain: step s, tok/s, GFLOP/s, %peak, RSS MB",
              "eager:  step s, tok/s, GFLOP/s, %peak, RSS MB", "ptrain/eager");

  for (const auto& s : sizes) {
    if (!runs("eager")) break;
    // ptrain and eager alternate, twice each, and each keeps its best median:
    // background load then hits both sides alike.
    double ptrainStep = 1e30, eagerStep = 1e30, rss = 0;
    nlohmann::json eager;
    for (int round = 0; round < 2; ++round) {
      PtrainRun run = runPtrain(binary, source, s, warmup, 1);
      rss = std::max(rss, run.rss_mb);
      ptrainStep = std::min(ptrainStep, run.step_s);

      // Eager inherits the BLAS kernels main() chose and runs with the
      // OpenMP setting ptrain's launcher gives workers that use libtorch's
      // own ops (two thread pools: passive waiting, its better choice).
      std::ostringstream py;
      for (const auto& e : ptrain::hostTuning(/*oneThreadPool=*/false).env) {
        if (e.rfind("OMP_WAIT_POLICY=", 0) == 0) py << e << " ";
      }
      py << PTRAIN_BENCH_PYTHON << " -W ignore " << source / "tools/bench/gpt_eager.py" << " --layers " << s.layers << " --hidden "
         << s.hidden << " --heads " << s.heads << " --seq " << s.seq << " --batch " << s.batch << " --steps " << s.steps
         << " --warmup " << warmup << " --threads " << threads;
      auto result = nlohmann::json::parse(capture(py.str()));
      if (result["step_time_s"].get<double>() < eagerStep) {
        eagerStep = result["step_time_s"].get<double>();
        eager = result;
      }
    }
    const double params = eager["params"].get<double>();
    const double tokens = static_cast<double>(s.batch) * s.seq;
    const double flops = 6.0 * params * tokens + 12.0 * s.layers * s.hidden * s.seq * tokens;
    auto cell = [&](double step, double mb) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%7.3f %9.0f %8.1f %5.1f%% %7.0f", step, tokens / step, flops / step / 1e9,
                    100.0 * flops / step / 1e9 / peak, mb);
      return std::string(buf);
    };
    std::printf("%-6s %7.1fM %7.0f | %-44s | %-44s | %.2fx\n", s.name.c_str(), params / 1e6, tokens,
                cell(ptrainStep, rss).c_str(), cell(eagerStep, eager["peak_rss_mb"].get<double>()).c_str(),
                eagerStep / ptrainStep);
  }

  // Tensor parallelism: the large model at tp=2 beside tp=1 (same global
  // batch), with the bytes parallel/tensor moved per step against the
  // analytic count. Per layer and micro-batch Megatron's tensor parallelism
  // all-reduces b*s*h elements 4 times (2 forward, 2 backward); the embedding
  // adds 2 more and the vocab-parallel loss 3 reductions of b*s (fp32).
  if (runs("tensor")) {
    const GptSize& s = sizes.back();
    std::printf("\ntensor parallel, %s model (same global batch %d):\n", s.name.c_str(), s.batch);
    std::printf("%-4s %8s %10s %16s %16s %8s\n", "tp", "step s", "tok/s", "measured B/step", "analytic B/step",
                "layers");
    for (int tp : {1, 2}) {
      PtrainRun run =
          runPtrain(binary, source, s, warmup, tp, "parallel.tensor_model_parallel_size=" + std::to_string(tp));
      const double bsh = static_cast<double>(s.batch) * s.seq * s.hidden;
      const double layerBytes = tp > 1 ? 4.0 * 4.0 * s.layers * bsh : 0;  // one micro-batch
      const double analytic = tp > 1 ? 4.0 * ((4.0 * s.layers + 2.0) * bsh + 3.0 * s.batch * s.seq) : 0;
      const double step = run.step_s;
      std::printf("%-4d %8.3f %10.0f %16.0f %16.0f %8.0f\n", tp, step, s.batch * s.seq / step, run.tp_bytes, analytic,
                  layerBytes);
    }
    std::printf("(analytic: 4 bytes x ((4L+2) b s h + 3 b s); 'layers' is the 4 all-reduces of b s h per layer alone)\n");
  }

  // Pipeline parallelism: the small model (8 layers, so pp=4 x vpp=2 gets
  // one block per chunk) cut into pp stages, m micro-batches per step. The
  // measured bubble is the mean over stages of idle / busy time (idle:
  // blocked on a receive or an unfinished send), beside its formula.
  if (runs("pipeline")) {
    GptSize s = sizes.front();
    s.layers = 8;
    std::printf("\npipeline parallel, %d-layer %s model (global batch %d, one process per stage):\n", s.layers,
                s.name.c_str(), s.batch);
    std::printf("%-3s %-12s %3s %8s %10s %9s %9s %9s\n", "pp", "schedule", "m", "step s", "tok/s", "bubble", "formula",
                "in flight");
    struct Row {
      int pp;
      std::string schedule;
      int vpp, micro;
    };
    for (const Row& row : {Row{1, "1f1b", 1, 8}, Row{2, "1f1b", 1, 8}, Row{2, "1f1b", 1, 4}, Row{2, "gpipe", 1, 8},
                           Row{2, "interleaved", 2, 8}, Row{4, "1f1b", 1, 8}, Row{4, "1f1b", 1, 4},
                           Row{4, "interleaved", 2, 8}}) {
      std::ostringstream o;
      o << "parallel.pipeline_model_parallel_size=" << row.pp << " parallel.pipeline_schedule=" << row.schedule
        << " parallel.virtual_pipeline_model_parallel_size=" << row.vpp
        << " train.micro_batch_size=" << s.batch / row.micro;
      PtrainRun run = runPtrain(binary, source, s, warmup, row.pp, o.str());
      std::printf("%-3d %-12s %3d %8.3f %10.0f %9.3f %9.3f %9d\n", row.pp, row.schedule.c_str(), row.micro, run.step_s,
                  s.batch * s.seq / run.step_s, run.pp_bubble, run.pp_bubble_formula, run.pp_inflight);
    }
    std::printf("(bubble: idle / busy time per stage, mean over stages; formula (pp-1)/m, interleaved (pp-1)/(vpp m);\n"
                " in flight: most micro-batches (chunks x micro-batches when interleaved) with live activations on a stage)\n");
  }

  // Fused kernels and precisions: one process per run, dropout on (so the
  // bias-dropout-add fusion has work), the ATen operators of each step
  // counted by log.count_ops.
  if (runs("fusion")) {
    const std::string kAllFusions =
        "fusion.masked_softmax=true fusion.bias_gelu=true fusion.layernorm=true fusion.bias_dropout_add=true";
    const std::string common = "model.dropout=0.1 log.count_ops=true";
    auto precisionOverrides = [](const std::string& p) {
      // fp16 from a scale that fits: the default 2^32 would skip the first steps.
      return "precision.name=" + p + (p == "fp16" ? " precision.initial_loss_scale=1024" : "");
    };
    std::printf("\nfused kernels and precision (one process; per training step: ATen ops, step s, peak RSS MB):\n");
    std::printf("%-6s %-5s | %9s %8s %8s | %9s %8s %8s | %9s %8s\n", "model", "prec", "ops off", "step s", "RSS MB",
                "ops on", "step s", "RSS MB", "fewer ops", "speed-up");
    for (const auto& s : sizes) {
      for (const std::string precision : {"fp32", "bf16", "fp16"}) {
        const std::string base = common + " " + precisionOverrides(precision);
        PtrainRun off = runPtrain(binary, source, s, warmup, 1, base);
        PtrainRun on = runPtrain(binary, source, s, warmup, 1, base + " " + kAllFusions);
        std::printf("%-6s %-5s | %9.0f %8.3f %8.0f | %9.0f %8.3f %8.0f | %8.1f%% %7.2fx\n", s.name.c_str(),
                    precision.c_str(), off.ops, off.step_s, off.rss_mb, on.ops, on.step_s, on.rss_mb,
                    100.0 * (1.0 - on.ops / off.ops), off.step_s / on.step_s);
      }
    }
    const GptSize& s = sizes.front();
    std::printf("\neach fusion alone, %s model, fp32:\n%-18s %9s %10s %8s\n", s.name.c_str(), "fusion", "ops",
                "fewer ops", "step s");
    PtrainRun none = runPtrain(binary, source, s, warmup, 1, common);
    std::printf("%-18s %9.0f %10s %8.3f\n", "none", none.ops, "", none.step_s);
    for (const char* f : {"masked_softmax", "bias_gelu", "layernorm", "bias_dropout_add"}) {
      PtrainRun one = runPtrain(binary, source, s, warmup, 1, common + " fusion." + f + "=true");
      std::printf("%-18s %9.0f %9.1f%% %8.3f\n", f, one.ops, 100.0 * (1.0 - one.ops / none.ops), one.step_s);
    }
  }
  // GPT-MoE: the small model with 8 experts (top-2) in every block, on 2
  // processes: ep=1 (every rank all experts; dp 2) and ep=2 (4 experts per
  // rank, tokens exchanged by all-to-all), the same global batch.
  if (runs("moe")) {
    const GptSize& s = sizes.front();
    std::printf("\nGPT-MoE, %s model, 8 experts top-2, 2 processes (global batch %d):\n", s.name.c_str(), s.batch);
    std::printf("%-3s %8s %10s %9s %16s %16s %9s\n", "ep", "step s", "tok/s", "a2a share", "a2a B/step",
                "uniform B/step", "tokens cv");
    for (int ep : {1, 2}) {
      PtrainRun run = runPtrain(binary, source, s, warmup, 2,
                                "model.num_experts=8 model.moe_router_topk=2 model.moe_aux_loss_coeff=0.01 "
                                "parallel.expert_model_parallel_size=" + std::to_string(ep));
      // moe_a2a_s sums both ranks' time: per rank, half of it.
      std::printf("%-3d %8.3f %10.0f %8.1f%% %16.0f %16.0f %9.3f\n", ep, run.step_s, s.batch * s.seq / run.step_s,
                  100.0 * run.a2a_s / 2 / run.step_s, run.a2a_bytes, run.a2a_bytes_uniform, run.tokens_cv);
    }
    std::printf("(a2a: the token all-to-alls, dispatch and combine, forward and backward; bytes sent to the other rank,\n"
                " summed over ranks; uniform: 4 x choices x h x 4 bytes x (ep-1)/ep; share: time in them / step time)\n");
  }
  // Memory levers on the large model, one process, dropout on (so the
  // recomputation replays the random streams): peak RSS and step time.
  if (runs("memory")) {
    const GptSize& s = sizes.back();
    std::printf("\nmemory levers, %s model, one process (peak RSS of the process, median step time):\n", s.name.c_str());
    std::printf("%-22s %8s %8s %9s %9s\n", "lever", "RSS MB", "step s", "vs none", "RSS cut");
    PtrainRun none = runPtrain(binary, source, s, warmup, 1, "model.dropout=0.1");
    std::printf("%-22s %8.0f %8.3f %9s\n", "none", none.rss_mb, none.step_s, "");
    struct Lever {
      const char* name;
      const char* overrides;
    };
    for (const Lever& lever : {Lever{"recompute full", "model.recompute=full"},
                               Lever{"recompute selective", "model.recompute=selective"},
                               Lever{"offload params+optim", "offload.params=true offload.optimizer=true"},
                               Lever{"offload all", "offload.params=true offload.optimizer=true offload.grads=true"}}) {
      PtrainRun run = runPtrain(binary, source, s, warmup, 1, std::string("model.dropout=0.1 ") + lever.overrides);
      std::printf("%-22s %8.0f %8.3f %8.2fx %8.1f%%\n", lever.name, run.rss_mb, run.step_s, run.step_s / none.step_s,
                  100.0 * (1.0 - run.rss_mb / none.rss_mb));
    }
    // The distributed optimizer needs a data-parallel group: two processes,
    // each with half the batch, against the same two without it.
    PtrainRun dp2 = runPtrain(binary, source, s, warmup, 2, "model.dropout=0.1");
    PtrainRun sharded = runPtrain(binary, source, s, warmup, 2, "model.dropout=0.1 optimizer.distributed=true");
    std::printf("%-22s %8.0f %8.3f %9s\n", "dp=2", dp2.rss_mb, dp2.step_s, "");
    std::printf("%-22s %8.0f %8.3f %8.2fx %8.1f%%\n", "dp=2 distributed optim", sharded.rss_mb, sharded.step_s,
                sharded.step_s / dp2.step_s, 100.0 * (1.0 - sharded.rss_mb / dp2.rss_mb));
    std::printf("(RSS: rank 0's peak resident set; the last column: how much lower than without the lever, the dp=2\n"
                " rows against each other)\n");
  }
  // The planner's cost model against measurement: peak memory of rank 0
  // and median step time, for layouts across dp, tp, sp, pp, recomputation,
  // offload and the distributed optimizer on both sizes.
  if (runs("calibration")) {
    std::printf("\ncost model (ptrain plan --device host) against measurement, rank 0 (memory: peak RSS):\n");
    std::printf("%-6s %-30s %9s %9s %7s %9s %9s %7s\n", "model", "layout", "pred MB", "meas MB", "diff", "pred s",
                "meas s", "diff");
    struct Layout {
      size_t size;
      int nproc;
      const char* name;
      const char* overrides;
    };
    int withinMemory = 0, withinTime = 0, rows = 0;
    for (const Layout& l : {Layout{0, 1, "dp1", ""}, Layout{0, 2, "dp2", ""},
                            Layout{0, 2, "tp2", "parallel.tensor_model_parallel_size=2"},
                            Layout{1, 1, "dp1", ""}, Layout{1, 2, "dp2", ""},
                            Layout{1, 2, "tp2", "parallel.tensor_model_parallel_size=2"},
                            Layout{1, 2, "tp2 sp", "parallel.tensor_model_parallel_size=2 parallel.sequence_parallel=true"},
                            Layout{1, 2, "pp2 micro 2", "parallel.pipeline_model_parallel_size=2 train.micro_batch_size=2"},
                            Layout{1, 1, "recompute full", "model.recompute=full"},
                            Layout{1, 1, "recompute selective", "model.recompute=selective"},
                            Layout{1, 1, "offload params+optimizer", "offload.params=true offload.optimizer=true"},
                            Layout{1, 2, "dp2 distributed optimizer", "optimizer.distributed=true"}}) {
      const GptSize& s = sizes[l.size];
      const nlohmann::json predicted = planPtrain(binary, source, s, l.nproc, l.overrides);
      const PtrainRun measured = runPtrain(binary, source, s, warmup, l.nproc, l.overrides);
      const double predMb = predicted["memory_bytes"].get<double>() / (1 << 20);
      const double predS = predicted["step_s"].get<double>();
      const double memDiff = predMb / measured.rss_mb - 1, timeDiff = predS / measured.step_s - 1;
      ++rows;
      withinMemory += std::abs(memDiff) <= 0.10;
      withinTime += std::abs(timeDiff) <= 0.25;
      std::printf("%-6s %-30s %9.0f %9.0f %+6.1f%% %9.3f %9.3f %+6.1f%%\n", s.name.c_str(), l.name, predMb,
                  measured.rss_mb, 100 * memDiff, predS, measured.step_s, 100 * timeDiff);
    }
    std::printf("(%d of %d layouts within 10%% on memory, %d of %d within 25%% on step time)\n", withinMemory, rows,
                withinTime, rows);
  }
  // Uneven data-parallel shares: two ranks, the second slowed to half its
  // speed; the even split waits for it every step, the 2:1 split
  // (parallel.data_parallel_shares) gives it half the rows of the first.
  if (runs("shares")) {
    GptSize s = sizes.front();
    s.batch = 48;
    std::printf("\nuneven data-parallel shares, %s model, 2 ranks, rank 1 slowed to 50%% (stopped half of every 20 ms):\n",
                s.name.c_str());
    std::printf("%-24s %8s %9s\n", "split (rows per rank)", "step s", "vs even");
    const std::string tag = "PTRAIN_BENCH_TAG=" + std::to_string(getpid());
    PtrainRun plain = runPtrain(binary, source, s, warmup, 2, "train.micro_batch_size=4");
    std::printf("%-24s %8.3f %9s\n", "even, not slowed", plain.step_s, "");
    PtrainRun even, uneven;
    {
      RankThrottle throttle(tag, 1, 0.5);
      even = runPtrain(binary, source, s, warmup, 2, "train.micro_batch_size=4", tag);
      uneven = runPtrain(binary, source, s, warmup, 2, "train.micro_batch_size=4 parallel.data_parallel_shares=[2,1]",
                         tag);
    }
    std::printf("%-24s %8.3f %9s\n", "even [24, 24]", even.step_s, "");
    std::printf("%-24s %8.3f %8.2fx\n", "shares 2:1 [32, 16]", uneven.step_s, even.step_s / uneven.step_s);
    std::printf("(predicted gain of 2:1 over even for a rank at half speed: 1.50x)\n");
  }
  // Device groups: ranks 0-1 a fast group, ranks 2-3 a group at half speed
  // that must split the model (tp 2). One common layout must then be tp 2
  // everywhere; device groups let the fast group run tp 1 x dp 2.
  if (runs("hetero")) {
    GptSize s = sizes.front();
    s.batch = 48;
    std::printf("\ndevice groups, %s model, 4 ranks: ranks 0-1 fast, ranks 2-3 slowed to 50%% and held at tp 2; batch 48,"
                " micro-batch 4:\n", s.name.c_str());
    std::printf("%-48s %-10s %8s %9s %8s\n", "layout", "rows", "step s", "vs first", "pred s");
    const std::string tag = "PTRAIN_BENCH_TAG=" + std::to_string(getpid());
    // The planner's step for `nproc` ranks of a layout on `rows` rows.
    auto predict = [&](int nproc, const std::string& layout, int64_t rows) {
      GptSize part = s;
      part.batch = rows;
      return planPtrain(binary, source, part, nproc, layout + " train.micro_batch_size=4")["step_s"].get<double>();
    };
    const std::string tp2 = "parallel.tensor_model_parallel_size=2";
    const std::string dp2 = "parallel.tensor_model_parallel_size=1";
    struct Row {
      const char* name;
      const char* rows;
      std::string overrides;
      std::string fastLayout;  // the fast half's layout, for the prediction
      int64_t fastRows, slowRows;
    };
    auto groups = [](int64_t fastShare, int64_t slowShare) {
      return "'parallel.groups=[{name: fast, ranks: 2, share: " + std::to_string(fastShare) +
             "}, {name: slow, ranks: 2, tensor_model_parallel_size: 2, share: " + std::to_string(slowShare) + "}]'";
    };
    const std::vector<Row> table = {
        {"common tp 2 x dp 2, even", "[24 | 24]", tp2, tp2, 24, 24},
        {"common tp 2 x dp 2, by speed", "[32 | 16]", tp2 + " parallel.data_parallel_shares=[2,1]", tp2, 32, 16},
        {"groups: fast tp 1 x dp 2 | slow tp 2, even", "[24 | 24]", groups(1, 1), dp2, 24, 24},
        {"groups: fast tp 1 x dp 2 | slow tp 2, by speed", "[32 | 16]", groups(2, 1), dp2, 32, 16},
    };
    double first = 0;
    for (const Row& row : table) {
      PtrainRun run;
      {
        RankThrottle slow2(tag, 2, 0.5), slow3(tag, 3, 0.5);
        run = runPtrain(binary, source, s, warmup, 4, "train.micro_batch_size=4 " + row.overrides, tag);
      }
      // A step lasts as long as its slower half: the slow one at half speed.
      const double predicted = std::max(predict(2, row.fastLayout, row.fastRows), 2 * predict(2, tp2, row.slowRows));
      if (first == 0) first = run.step_s;
      std::printf("%-48s %-10s %8.3f %8.2fx %8.3f\n", row.name, row.rows, run.step_s, first / run.step_s, predicted);
    }
    std::printf("(pred: the planner's step for each half on its rows (ptrain plan --device host), the slow half's\n"
                " doubled, the longer of the two; 4 processes share this machine's cores, which the planner's\n"
                " per-rank figures do not)\n");
  }
  // The recommender (docs/trainers/recommender.md): training samples a second
  // over the whole job, the global batch over the median step time after the
  // warm-up; evaluation off. The seed's 1.2e8 samples a day on 8 GPUs is
  // 1,389 samples/s: a figure for its cluster, printed beside, not compared.
  if (runs("recommender")) {
    struct RecommenderRun {
      const char* recipe;
      const char* layout;
      int nproc, batch, steps;
    };
    std::printf("\nrecommender, samples/s (global batch / median step time; seed: 1.2e8/day = 1389 samples/s on 8 GPUs):\n");
    std::printf("%-28s %-22s %6s %8s %10s\n", "recipe", "layout", "ranks", "step s", "samples/s");
    for (const RecommenderRun& r : {RecommenderRun{"recsys_12b_scaled_cpu", "tp4 x pp2 x ep2", 8, 256, 12},
                                    RecommenderRun{"recsys_small", "dp2", 2, 256, 40}}) {
      const std::string runDir =
          (fs::temp_directory_path() / ("ptrain-bench-" + std::string(r.recipe) + "-" + std::to_string(getpid())))
              .string();
      fs::remove_all(runDir);
      std::ostringstream cmd;
      cmd << binary / "bin/ptrain" << " run " << source / "configs/recommender" / (std::string(r.recipe) + ".yaml")
          << " --run-dir " << runDir << " train.steps=" << r.steps + warmup << " train.eval_every=0"
          << " train.global_batch_size=" << r.batch << " log.progress=none 2>&1";
      capture(cmd.str());
      std::vector<double> stepTimes;
      std::ifstream metrics(runDir + "/metrics.jsonl");
      std::string line;
      while (std::getline(metrics, line)) {
        auto j = nlohmann::json::parse(line);
        if (j.value("kind", "train") == "train" && j.contains("step_time_s") && j["step"].get<int>() > warmup)
          stepTimes.push_back(j["step_time_s"].get<double>());
      }
      fs::remove_all(runDir);
      const double step = median(stepTimes);
      std::printf("%-28s %-22s %6d %8.3f %10.0f\n", r.recipe, r.layout, r.nproc, step, step > 0 ? r.batch / step : 0.0);
    }
  }
  // Scale: the 403M GPT of docs/performance.md ("Start-up, save and load at
  // scale") on 4 processes, SGD without momentum, batch 4: each rank's peak
  // over the whole run against `ptrain plan`, start-up, save and load.
  if (runs("scale")) {
    const std::string model =
        "model.num_layers=8 model.hidden_size=2048 model.num_attention_heads=16 train.global_batch_size=4 "
        "optimizer.name=sgd data.eval_size=4 train.eval_every=0 log.progress=none launch.nproc=4";
    struct ScaleLayout {
      const char* name;
      const char* folder;
      const char* overrides;
      // Measured on this machine with the main of 2026-12-05 (fc0d10c), which
      // built the whole model on every rank and gathered every tensor to rank
      // 0 to save: peak MB of the most loaded rank, start-up, save, load s.
      double beforePeak, beforeStartup, beforeSave, beforeLoad;
    };
    const ScaleLayout layouts[] = {
        {"tp4", "tp4", "parallel.tensor_model_parallel_size=4", 5101, 21.8, 94, 70},
        {"tp2 x pp2", "tp2xpp2", "parallel.tensor_model_parallel_size=2 parallel.pipeline_model_parallel_size=2", 5204,
         7.4, 85.5, 0},
    };
    const std::string tag = "PTRAIN_BENCH_TAG=scale-" + std::to_string(getpid());
    const fs::path root = fs::temp_directory_path() / ("ptrain-bench-scale-" + std::to_string(getpid()));
    fs::remove_all(root);
    auto run = [&](const std::string& dir, const std::string& overrides, const std::string& extra) {
      std::ostringstream cmd;
      cmd << tag << " " << binary / "bin/ptrain" << " run " << source / "configs/quickstart.yaml"
          << " --nproc 4 --run-dir " << dir << " " << model << " " << overrides << " " << extra << " 2>&1";
      RankPeaks peaks(tag);
      capture(cmd.str());
      return peaks.stop();
    };
    // What metrics.jsonl says of a run: start-up, and the slowest rank's
    // save and load seconds and bytes.
    struct Figures {
      double startup = 0, save = 0, saveBytes = 0, load = 0;
    };
    auto figures = [](const std::string& dir) {
      Figures f;
      std::ifstream metrics(dir + "/metrics.jsonl");
      for (std::string line; std::getline(metrics, line);) {
        auto j = nlohmann::json::parse(line);
        if (j.contains("startup_s")) f.startup = j["startup_s"].get<double>();
        for (const char* key : {"checkpoint_save_s", "checkpoint_load_s"}) {
          if (!j.contains(key)) continue;
          double slowest = 0;
          for (const auto& v : j[key]) slowest = std::max(slowest, v.get<double>());
          (std::string(key) == "checkpoint_save_s" ? f.save : f.load) = slowest;
        }
        if (j.contains("checkpoint_save_bytes")) {
          for (const auto& v : j["checkpoint_save_bytes"]) f.saveBytes = std::max(f.saveBytes, v.get<double>());
        }
      }
      return f;
    };
    std::printf("\nscale: GPT 403M (8 layers, hidden 2048, 16 heads, 1.6 GB of fp32 weights), SGD, batch 4, "
                "4 processes; each rank's peak over the run (build, 2 steps, save) against `ptrain plan`:\n");
    std::printf("%-10s %8s %27s %7s %9s %8s %10s %8s | before: %8s %9s %7s %7s\n", "layout", "plan MB",
                "peak MB (ranks 0-3)", "diff", "start s", "save s", "MB/rank", "load s", "peak MB", "start s",
                "save s", "load s");
    std::string firstCheckpoint;
    for (const ScaleLayout& l : layouts) {
      std::ostringstream plan;
      plan << binary / "bin/ptrain" << " plan " << source / "configs/quickstart.yaml"
           << " --json --device host --nproc 4 " << model << " " << l.overrides;
      const double predicted = nlohmann::json::parse(capture(plan.str()))["memory_bytes"].get<double>() / (1 << 20);
      const std::string dir = (root / l.folder).string();
      const auto peaks = run(dir, l.overrides, "train.steps=2 checkpoint.save_final=true");
      double worst = 0;
      std::string perRank;
      for (const auto& [rank, mb] : peaks) {
        worst = std::max(worst, mb);
        perRank += (perRank.empty() ? "" : " ") + std::to_string(static_cast<int>(mb));
      }
      // Load: this checkpoint resumed at the same layout for one more step.
      const std::string resumed = dir + "-resumed";
      fs::create_directories(resumed + "/checkpoints");
      fs::copy(dir + "/checkpoints/step_2", resumed + "/checkpoints/step_2", fs::copy_options::recursive);
      run(resumed, l.overrides, "train.steps=3 --resume");
      const Figures f = figures(dir), r = figures(resumed);
      if (firstCheckpoint.empty()) firstCheckpoint = dir;
      std::printf("%-10s %8.0f %27s %+6.1f%% %9.1f %8.1f %10.0f %8.1f | %16.0f %9.1f %7.1f %7s\n", l.name, predicted,
                  perRank.c_str(), 100 * (predicted / worst - 1), f.startup, f.save, f.saveBytes / 1e6, r.load,
                  l.beforePeak, l.beforeStartup, l.beforeSave,
                  l.beforeLoad > 0 ? std::to_string(static_cast<int>(l.beforeLoad)).c_str() : "-");
    }
    // The tp4 checkpoint into tp 2 x pp 2: each rank reads its blocks only.
    const std::string moved = (root / "tp4-to-tp2xpp2").string();
    fs::create_directories(moved + "/checkpoints");
    fs::copy(firstCheckpoint + "/checkpoints/step_2", moved + "/checkpoints/step_2", fs::copy_options::recursive);
    const auto movedPeaks = run(moved, layouts[1].overrides, "train.steps=3 --resume");
    double worst = 0;
    for (const auto& [rank, mb] : movedPeaks) worst = std::max(worst, mb);
    std::printf("tp4 checkpoint resumed at tp2 x pp2: load %.1f s, peak %.0f MB\n", figures(moved).load, worst);
    std::printf("(diff: plan against the most loaded rank; before: the main of 2026-12-05, fc0d10c, which built the\n"
                " whole model on every rank and gathered every tensor to rank 0 to save; its load was every rank\n"
                " reading the whole files)\n");
    fs::remove_all(root);
  }
  return 0;
}
