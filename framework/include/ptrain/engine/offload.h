// OffloadPlugin: the interface of an `offload` plugin (recipe section
// `offload`; built in: tiered). It keeps a model's parameters, gradients and
// optimizer states in a slower, larger tier between their uses, and brings
// each in just before it is used:
//
//   offload.params     a block's parameters come in before its forward and
//                      its backward (the next block's are prefetched) and go
//                      back after;
//   offload.grads      gradients rest in the tier; backward accumulates into
//                      them there;
//   offload.optimizer  optimizer states (moments, float32 masters) rest in
//                      the tier; the optimizer steps one parameter at a time,
//                      on the host, with that parameter's state brought in.
//
// A ModelRuntime creates the plugin when any of the three is on, calls
// attachModel() before it makes the optimizer and attachOptimizer() after; it
// is the innermost of the runtime's block hooks, so its runBlock wraps the
// block alone (inside a recomputation).
//
// Values never change on the way: the same kernels run on the same numbers
// in the same order, so losses are bitwise those of a run without offload.
#pragma once

#include <string>
#include <vector>

#include "ptrain/engine/hooks.h"
#include "ptrain/plugin/plugin.h"

namespace ptrain {

class Optimizer;
class Recipe;
class StagedModel;

// The keys of the recipe's `offload` section, and the folder the tier's
// files go to.
struct PTRAIN_API OffloadSettings {
  bool params = false;
  bool grads = false;
  bool optimizer = false;
  // auto: disk on cpu (memory-mapped files under `folder`), pinned on cuda
  // (page-locked host memory); `disk` and `pinned` ask for one by name.
  std::string tier = "auto";
  // offload.name: the offload plugin that serves these settings.
  std::string plugin = "tiered";
  std::string folder;  // the run folder's offload/ subfolder

  bool any() const { return params || grads || optimizer; }
  static OffloadSettings fromRecipe(const Recipe& recipe, const std::string& runDir);
};

// Settings that cannot work, one line each (location, key, what to change):
// a tier named for the other device, offload together with
// optimizer.distributed. Empty when offload is off. `ptrain check` and
// `ptrain run` ask it.
PTRAIN_API std::vector<std::string> checkOffload(const Recipe& recipe);
// A run folder the disk tier cannot write: `runDir` (empty: the default
// runs/<name>), or its nearest existing parent when it does not exist yet.
// Empty when offload is off or the folder is writable.
PTRAIN_API std::vector<std::string> checkOffloadFolder(const Recipe& recipe, const std::string& runDir);

// What the recipe may run but will regret, one line each: parameter offload
// on cuda without model.recompute: full (autograd's saved views of a block's
// weights keep their device copies from forward to backward, so the
// parameters' share of device memory is not saved; measured on a 1.2B GPT).
PTRAIN_API std::vector<std::string> offloadWarnings(const Recipe& recipe);

class PTRAIN_API OffloadPlugin : public Plugin, public StepHooks {
 public:
  ~OffloadPlugin() override;
  const char* kind() const final { return plugin_kind::kOffload; }

  // After the parallel and precision plugins applied, before the optimizer
  // exists: moves the parameters (and makes room for the gradients) that
  // `settings` names into the tier, so that their memory is free again
  // before the optimizer allocates its state.
  virtual void attachModel(StagedModel& model, const OffloadSettings& settings) = 0;
  // After the optimizer was made (not called for a model that is not
  // trained): moves its state when settings.optimizer, and steps it one
  // parameter at a time.
  virtual void attachOptimizer(Optimizer& optimizer) = 0;
};

}  // namespace ptrain
