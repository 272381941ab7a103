// The keys of the sections the core owns. Names follow Megatron-LM where it
// has one, so a Megatron user recognises every parallel key. Keys a plugin
// reads belong to that plugin (schema.h).
#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/schema.h"

namespace ptrain {

void describeCoreKeys(Schema& s) {
  using T = ValueType;
  using keys::above;
  using keys::atLeast;
  using keys::key;
  using keys::oneOf;
  using keys::required;
  using keys::reserved;
  using keys::unitBelowOne;

  s.add(key("name", T::kString, "", "Run name, used for the run folder; defaults to the recipe file name without extension."));

  s.add(oneOf(key("device.type", T::kString, "auto",
                  "Device the workers compute on: `cuda` (each worker takes the GPU of its local rank), `cpu`, or "
                  "`auto` (cuda when a GPU is visible). `device: cuda` is short for `device.type: cuda`."),
              {"auto", "cpu", "cuda"}));
  s.add(key("device.tf32", T::kBool, "false",
            "On cuda: float32 matrix products and convolutions on TF32 tensor cores (10-bit mantissa inputs, "
            "float32 sums; about 7x the float32 rate on A100/H100). Off: full float32. Refused on the cpu."));

  s.add(atLeast(key("launch.nproc", T::kInt, "1", "Worker processes on this host when `--nproc` is not given."), 1));

  s.add(key("plugins.paths", T::kStringList, "[]",
            "Folders or library files searched for plugins before PTRAIN_PLUGIN_PATH and the built-in plugin folder."));

  s.add(required("trainer.name", T::kString, "Trainer plugin that builds the model, data and loss, e.g. `llm`."));

  s.add(key("data.name", T::kString, "", "Dataset the trainer reads, e.g. `arithmetic`."));

  s.add(atLeast(required("train.steps", T::kInt, "Optimizer steps to run."), 1));
  s.add(atLeast(required("train.global_batch_size", T::kInt, "Samples per optimizer step, summed over all data-parallel ranks and micro-batches."), 1));
  s.add(atLeast(key("train.micro_batch_size", T::kInt, "", "Samples per forward/backward pass on one rank; not set: global_batch_size / data-parallel size."), 1));
  s.add(above(key("train.max_memory_mb", T::kFloat, "", "Each worker's memory cap in MB (its peak resident set, checked after every step): over it, the worker stops with an out-of-memory error (exit code 3), as a device of that size would; for rehearsing a layout on the host. Not set: no cap."), 0));
  s.add(atLeast(key("train.seed", T::kInt, "1234", "Seed for initialisation, data order and dropout."), 0));
  s.add(atLeast(key("train.eval_every", T::kInt, "0", "Evaluate every this many steps; 0 never evaluates during training."), 0));
  s.add(reserved(atLeast(key("train.eval_batches", T::kInt, "8", "Batches per evaluation."), 1),
                 "the trainer sizes evaluation, e.g. the llm trainer's data.eval_size", {}));
  s.add(oneOf(key("train.on_nonfinite", T::kString, "stop",
                  "What a step whose loss or gradient norm is not finite (NaN, inf) does, in every precision (fp16's "
                  "loss scaler still skips its overflow steps first): `stop` ends the run with exit code 4 before "
                  "anything of that state is saved (the newest checkpoint stays the last good one); `skip` leaves the "
                  "parameters as they were and goes on (Megatron's skipped iteration), up to "
                  "train.nonfinite_skip_limit steps in a row."),
              {"stop", "skip"}));
  s.add(atLeast(key("train.nonfinite_skip_limit", T::kInt, "10",
                    "With on_nonfinite: skip, this many non-finite steps in a row end the run as `stop` does."),
                1));
  s.add(atLeast(key("train.log_every", T::kInt, "10", "Log the loss every this many steps."), 1));

  s.add(oneOf(key("optimizer.name", T::kString, "adamw", "Optimizer."), {"adamw", "sgd"}));
  s.add(above(key("optimizer.lr", T::kFloat, "0.001", "Peak learning rate."), 0));
  s.add(atLeast(key("optimizer.weight_decay", T::kFloat, "0.01", "Decoupled weight decay (adamw) or L2 penalty (sgd)."), 0));
  s.add(unitBelowOne(key("optimizer.beta1", T::kFloat, "0.9", "Adam's first-moment decay.")));
  s.add(unitBelowOne(key("optimizer.beta2", T::kFloat, "0.999", "Adam's second-moment decay.")));
  s.add(above(key("optimizer.eps", T::kFloat, "1e-8", "Adam's denominator term."), 0));
  s.add(unitBelowOne(key("optimizer.momentum", T::kFloat, "0.0", "SGD momentum.")));
  s.add(key("optimizer.distributed", T::kBool, "false", "Shard optimizer states and float32 master weights over the data-parallel group (ZeRO-1): gradients reduce-scattered, parameters all-gathered."));
  s.add(atLeast(key("optimizer.clip_grad", T::kFloat, "1.0", "Clip the global gradient norm to this; 0 turns clipping off."), 0));
  s.add(oneOf(key("optimizer.lr_schedule", T::kString, "constant", "Learning-rate decay after warmup, down to min_lr at the last step."),
              {"constant", "linear", "cosine"}));
  s.add(atLeast(key("optimizer.warmup_steps", T::kInt, "0", "Steps of linear warmup from 0 to lr."), 0));
  s.add(atLeast(key("optimizer.min_lr", T::kFloat, "0.0", "Learning rate reached at the last step by linear and cosine schedules."), 0));

  s.add(atLeast(key("parallel.tensor_model_parallel_size", T::kInt, "1", "Ranks that split each layer's weights (tp)."), 1));
  s.add(atLeast(key("parallel.pipeline_model_parallel_size", T::kInt, "1", "Pipeline stages (pp)."), 1));
  s.add(atLeast(key("parallel.virtual_pipeline_model_parallel_size", T::kInt, "1", "Model chunks per pipeline stage for the interleaved schedule (vpp); 1 means no interleaving."), 1));
  s.add(atLeast(key("parallel.expert_model_parallel_size", T::kInt, "1", "Ranks that split the experts of each MoE layer (ep)."), 1));
  s.add(atLeast(key("parallel.expert_tensor_parallel_size", T::kInt, "1", "Ranks that split each expert's weights (etp)."), 1));
  s.add(atLeast(key("parallel.context_parallel_size", T::kInt, "1", "Ranks that split each sequence (cp)."), 1));
  s.add(key("parallel.sequence_parallel", T::kBool, "false", "Split layer-norm and dropout activations along the sequence across the tensor-parallel group."));
  s.add(oneOf(key("parallel.pipeline_schedule", T::kString, "1f1b", "Order of micro-batch forward and backward passes across stages."),
              {"1f1b", "interleaved", "gpipe"}));
  s.add(atLeast(key("parallel.pipeline_layout", T::kIntList, "", "Blocks per pipeline stage (pp * vpp entries summing to num_layers); not set: runs of equal parameter count, the even split for identical blocks."), 0));
  s.add(above(key("parallel.data_parallel_shares", T::kFloatList, "", "Each data-parallel rank's weight in the split of the global batch (rank i takes global_batch_size * share_i / sum rows, whole micro-batches), for ranks of unequal speed; not set: an even split."), 0));
  s.add(key("parallel.groups", T::kMapList, "",
            "Device groups of one job, in rank order, each a whole replica of the model in its own layout: "
            "[{name: a100, ranks: 4, tensor_model_parallel_size: 2, pipeline_model_parallel_size: 1, "
            "micro_batch_size: 2, share: 3}, ...] (share: its weight in the split of the global batch, default its "
            "rank count; virtual_pipeline_model_parallel_size > 1 interleaves that group's pipeline; an expert "
            "model's groups also take expert_model_parallel_size and "
            "expert_tensor_parallel_size); gradients are summed across the groups, so every group trains the same model "
            "(docs/planning.md)."));
  s.add(above(key("parallel.grad_bucket_size_mb", T::kFloat, "4", "Size of the gradient buffer's buckets, each reduced over the data-parallel group in one collective (an all-reduce, or the distributed optimizer's reduce-scatter)."), 0));
  s.add(key("parallel.overlap_grad_reduce", T::kBool, "true", "Reduce each gradient bucket as soon as backward has produced it, while backward goes on (the data plugin's all-reduce and the distributed optimizer's reduce-scatter alike); false: all after backward. The results are the same bit for bit."));

  s.add(key("communication.backend", T::kString, "auto", "Comm plugin for collectives: `auto` picks `nccl` on cuda and `gloo` on cpu; or a plugin's name."));
  s.add(above(key("communication.timeout_s", T::kFloat, "300", "Seconds before a collective or the rendezvous is declared hung."), 0));
  s.add(key("communication.nccl", T::kMap, "",
            "NCCL environment variables (NCCL_SOCKET_IFNAME: eth0, ...) checked against NCCL's documented ones and exported to every worker; the environment wins (`ptrain keys --nccl` lists them)."));

  s.add(key("precision.name", T::kString, "fp32",
            "Precision plugin: `fp32`; `bf16` (bf16 parameters and activations, fp32 master weights and gradient accumulation); `fp16` (the same in fp16, with a loss scale: its keys are listed under its name); or a plugin's name."));

  s.add(oneOf(key("cpu.allocator", T::kString, "caching",
                  "Host memory for tensors: `caching` keeps freed blocks for reuse (no page faults once sizes repeat), `system` calls malloc and free for each."),
              {"caching", "system"}));
  s.add(oneOf(key("cpu.kernels", T::kString, "ptrain",
                  "Linear layers and attention on the CPU: `ptrain` splits their products over one thread pool itself (BLAS on one thread per call), `libtorch` uses libtorch's ops."),
              {"ptrain", "libtorch"}));

  s.add(key("offload.params", T::kBool, "false", "Keep each block's parameters in the offload plugin's tier between its forward and backward passes."));
  s.add(key("offload.grads", T::kBool, "false", "Keep gradients in the offload tier; backward accumulates into them there."));
  s.add(key("offload.optimizer", T::kBool, "false", "Keep optimizer states and float32 masters in the offload tier; the optimizer steps one parameter at a time on the host."));
  s.add(key("offload.name", T::kString, "tiered",
            "Offload plugin that keeps parameters, gradients or optimizer states out of device memory when its keys "
            "(offload.params, ...) ask it to; its keys are listed under its name."));

  s.add(atLeast(key("checkpoint.every", T::kInt, "0", "Save every this many steps; 0 saves only the final checkpoint (if save_final)."), 0));
  s.add(atLeast(key("checkpoint.keep", T::kInt, "3", "Newest checkpoints kept on disk; 0 keeps all."), 0));
  s.add(key("checkpoint.save_final", T::kBool, "true", "Save a checkpoint after the last step."));

  s.add(key("checkpoint.load", T::kString, "",
            "Start from weights only: another run's folder (its newest step), runs/NAME (its newest run), a step "
            "folder RUN/checkpoints/step_N, a safetensors state dict under the model's names, or a Hugging Face "
            "folder the trainer reads (the llm trainer: GPT-2); any layout or precision, each rank reading only its "
            "slices; "
            "the optimizer and the data position start fresh. A resumed run (--resume) continues from its own "
            "checkpoint instead. Not set: fresh weights."));
  s.add(key("checkpoint.on_signal", T::kStringList, "[SIGTERM, SIGUSR1]",
            "Signals after which the run saves a checkpoint at the next step boundary and exits with code 75 "
            "(resume with `ptrain run --resume`): any of SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP; `[]` turns it "
            "off (a signal then stops the run without saving). The launcher forwards these to every worker."));
  s.add(above(key("checkpoint.signal_grace_s", T::kFloat, "25",
                  "After forwarding a stop signal, seconds the launcher waits for the workers to finish their step and "
                  "save before it kills them (keep it below the scheduler's own grace: Slurm's KillWait and "
                  "Kubernetes' terminationGracePeriodSeconds are 30 s by default)."),
              0));

  s.add(oneOf(key("log.level", T::kString, "info", "Least severe log message printed."),
              {"trace", "debug", "info", "warn", "error"}));
  s.add(key("log.count_ops", T::kBool, "false", "Count the ATen operators each training step dispatches into metrics.jsonl (`aten_ops`); a callback per op."));
  s.add(oneOf(key("log.progress", T::kString, "auto", "Progress display: a bar on a terminal, plain lines otherwise (auto)."),
              {"auto", "bar", "lines", "none"}));
  s.add(key("log.tensorboard", T::kBool, "false",
            "Also write every metric of metrics.jsonl as TensorBoard scalars (and the resolved recipe as text) to "
            "RUN_DIR/tensorboard/ from rank 0; a resumed run continues the same curves (`tensorboard --logdir "
            "RUN_DIR/tensorboard`)."));
  s.add(key("log.profile_steps", T::kIntList, "[]",
            "[A, B]: record training steps A to B (1-based, inclusive) with libtorch's profiler and write one "
            "Chrome/Perfetto trace per rank to RUN_DIR/traces/rank<R>.json (operators, and ptrain's ranges for "
            "each phase and collective); [] records none."));
}

}  // namespace ptrain
