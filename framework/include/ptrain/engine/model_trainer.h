// ModelTrainer<Model>: the base of a trainer whose models are all of one
// class. It builds them (makeModel) and gets them back typed: the engine
// hands a trainer its models as StagedModel& (evaluate, a runtime's
// inference), and ownModel() turns that into the trainer's own Model& by
// identity, with no cast across shared libraries and no list of its own.
//
//   class MyTrainer final : public ptrain::ModelTrainer<MyModel> {
//    protected:
//     std::shared_ptr<MyModel> makeModel(const ptrain::ModelBuild& build) override;
//     std::map<std::string, double> evaluateModel(MyModel& model, const ptrain::EvalContext& ctx) override;
//   };
//
// docs/writing_a_trainer.md walks through a whole trainer.
//
// Thread-safety: as Trainer: one thread per trainer object.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ptrain/engine/trainer.h"

namespace ptrain {

template <class Model>
class ModelTrainer : public Trainer {
  static_assert(std::is_base_of_v<StagedModel, Model>, "ModelTrainer<Model>: Model must derive from StagedModel");

 public:
  // makeModel(build), remembered so ownModel() recognises it. Throws
  // InternalError when makeModel returns nothing.
  std::shared_ptr<StagedModel> buildModel(const ModelBuild& build = {}) final {
    std::shared_ptr<Model> model = makeModel(build);
    PTRAIN_CHECK(model != nullptr, "trainer: makeModel() returned no model");
    built_.erase(std::remove_if(built_.begin(), built_.end(), [](const auto& w) { return w.expired(); }),
                 built_.end());
    built_.push_back(model);
    return model;
  }

  // evaluateModel on the Model this trainer built.
  std::map<std::string, double> evaluate(StagedModel& model, const EvalContext& ctx) final {
    return evaluateModel(ownModel(model), ctx);
  }

  // `model` as the Model it is: one this trainer's buildModel() made and that
  // is still alive. Throws InternalError for any other.
  Model& ownModel(StagedModel& model) const {
    for (const auto& w : built_) {
      if (auto p = w.lock(); p && static_cast<StagedModel*>(p.get()) == &model) return *p;
    }
    throw InternalError("trainer: got a model that its buildModel() did not create");
  }

 protected:
  // A new model holding the parts `build` names (Trainer::buildModel's
  // contract: every parameter drawn from its own seeded stream, e.g. with
  // nn::ParameterInit and nn::modelSeed(), ptrain/nn/parameter_init.h).
  virtual std::shared_ptr<Model> makeModel(const ModelBuild& build) = 0;
  // Trainer::evaluate's contract, on the trainer's own model.
  virtual std::map<std::string, double> evaluateModel(Model& model, const EvalContext& ctx) = 0;

 private:
  std::vector<std::weak_ptr<Model>> built_;
};

}  // namespace ptrain
