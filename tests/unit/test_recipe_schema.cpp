// Schema: the core key table, extension by a trainer, value checks, the
// generated documentation.
#include <gtest/gtest.h>

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "ptrain/recipe/key_specs.h"
#include "ptrain/recipe/recipe.h"
#include "ptrain/recipe/schema.h"

namespace ptrain {
namespace {

Schema coreSchema() {
  Schema s;
  describeCoreKeys(s);
  return s;
}

// The core's keys and the shape keys a GPT-shaped trainer declares.
Schema gptSchema() {
  Schema s = coreSchema();
  keys::addTransformerShape(s);
  keys::addMoe(s);
  return s;
}

KeySpec spec(const std::string& path, ValueType type, const std::string& def, const std::string& doc = "d") {
  KeySpec k;
  k.path = path;
  k.type = type;
  k.default_value = def;
  k.doc = doc;
  return k;
}

const char* kMinimal =
    "trainer: {name: llm}\n"
    "train: {steps: 10, global_batch_size: 8}\n";

// The keys the project's issue names, with their types and defaults.
TEST(RecipeSchema, CoreKeysFollowMegatronNamesAndDefaults) {
  Schema s = gptSchema();
  struct Expect {
    const char* path;
    ValueType type;
    const char* def;
  };
  const std::vector<Expect> expected = {
      {"launch.nproc", ValueType::kInt, "1"},
      {"plugins.paths", ValueType::kStringList, "[]"},
      {"model.num_layers", ValueType::kInt, ""},
      {"model.hidden_size", ValueType::kInt, ""},
      {"model.num_attention_heads", ValueType::kInt, ""},
      {"model.ffn_hidden_size", ValueType::kInt, "0"},
      {"model.seq_length", ValueType::kInt, ""},
      {"model.num_experts", ValueType::kInt, "0"},
      {"model.moe_router_topk", ValueType::kInt, "2"},
      {"data.name", ValueType::kString, ""},
      {"train.micro_batch_size", ValueType::kInt, ""},
      {"train.seed", ValueType::kInt, "1234"},
      {"train.eval_every", ValueType::kInt, "0"},
      {"train.log_every", ValueType::kInt, "10"},
      {"train.eval_batches", ValueType::kInt, "8"},
      {"optimizer.name", ValueType::kString, "adamw"},
      {"optimizer.lr", ValueType::kFloat, "0.001"},
      {"optimizer.weight_decay", ValueType::kFloat, "0.01"},
      {"optimizer.beta1", ValueType::kFloat, "0.9"},
      {"optimizer.beta2", ValueType::kFloat, "0.999"},
      {"optimizer.eps", ValueType::kFloat, "1e-8"},
      {"optimizer.clip_grad", ValueType::kFloat, "1.0"},
      {"optimizer.lr_schedule", ValueType::kString, "constant"},
      {"optimizer.warmup_steps", ValueType::kInt, "0"},
      {"optimizer.min_lr", ValueType::kFloat, "0.0"},
      {"parallel.tensor_model_parallel_size", ValueType::kInt, "1"},
      {"parallel.pipeline_model_parallel_size", ValueType::kInt, "1"},
      {"parallel.virtual_pipeline_model_parallel_size", ValueType::kInt, "1"},
      {"parallel.expert_model_parallel_size", ValueType::kInt, "1"},
      {"parallel.expert_tensor_parallel_size", ValueType::kInt, "1"},
      {"parallel.context_parallel_size", ValueType::kInt, "1"},
      {"parallel.sequence_parallel", ValueType::kBool, "false"},
      {"parallel.pipeline_schedule", ValueType::kString, "1f1b"},
      {"parallel.pipeline_layout", ValueType::kIntList, ""},
      {"parallel.grad_bucket_size_mb", ValueType::kFloat, "4"},
      {"parallel.overlap_grad_reduce", ValueType::kBool, "true"},
      {"communication.backend", ValueType::kString, "auto"},
      {"communication.timeout_s", ValueType::kFloat, "300"},
      {"precision.name", ValueType::kString, "fp32"},
      {"cpu.allocator", ValueType::kString, "caching"},
      {"cpu.kernels", ValueType::kString, "ptrain"},
      {"offload.params", ValueType::kBool, "false"},
      {"offload.optimizer", ValueType::kBool, "false"},
      {"checkpoint.every", ValueType::kInt, "0"},
      {"checkpoint.keep", ValueType::kInt, "3"},
      {"checkpoint.save_final", ValueType::kBool, "true"},
      {"log.level", ValueType::kString, "info"},
      {"log.progress", ValueType::kString, "auto"},
  };
  for (const auto& e : expected) {
    const KeySpec* k = s.find(e.path);
    ASSERT_NE(k, nullptr) << e.path;
    EXPECT_EQ(k->type, e.type) << e.path;
    EXPECT_EQ(k->default_value, e.def) << e.path;
    EXPECT_FALSE(k->doc.empty()) << e.path;
  }
  for (const char* required : {"trainer.name", "train.steps", "train.global_batch_size"}) {
    ASSERT_NE(s.find(required), nullptr) << required;
    EXPECT_TRUE(s.find(required)->required) << required;
  }
  EXPECT_EQ(s.find("optimizer.name")->choices, (std::vector<std::string>{"adamw", "sgd"}));
  EXPECT_EQ(s.find("optimizer.lr_schedule")->choices, (std::vector<std::string>{"constant", "linear", "cosine"}));
  EXPECT_EQ(s.find("parallel.pipeline_schedule")->choices,
            (std::vector<std::string>{"1f1b", "interleaved", "gpipe"}));
  EXPECT_EQ(s.find("log.progress")->choices, (std::vector<std::string>{"auto", "bar", "lines", "none"}));
  // Data-parallel size is derived, never a key.
  EXPECT_EQ(s.find("parallel.data_parallel_size"), nullptr);
  // Model keys only a trainer reads are that trainer's (LlmTrainer.KeysAndDerivedShapes).
  for (const char* trainers : {"model.vocab_size", "model.dropout", "model.init_std", "model.tie_embeddings"}) {
    EXPECT_EQ(s.find(trainers), nullptr) << trainers;
  }
  EXPECT_TRUE(s.isSection("parallel"));
  EXPECT_FALSE(s.isSection("train.steps"));
  // The model's keys are its trainer's (the shape through keys::addTransformerShape),
  // fusion the llm trainer's, fp16's loss scale precision/fp16's: none is the core's.
  const Schema core = coreSchema();
  EXPECT_FALSE(core.isSection("model"));
  EXPECT_FALSE(core.isSection("fusion"));
  EXPECT_EQ(core.find("precision.loss_scale"), nullptr);
  EXPECT_EQ(core.find("offload.tier"), nullptr);
  ASSERT_NE(core.find("offload.name"), nullptr);
  for (const KeySpec& k : core.keys()) EXPECT_EQ(k.owner, "") << k.path;
}

// Keys a plugin adds carry its name: the tables list them under it, a
// replaced key takes the new owner, and a key of a plugin the recipe does not
// use is refused with that plugin's reason.
TEST(RecipeSchema, KeysCarryThePluginThatOwnsThem) {
  Schema s = coreSchema();
  s.addFrom("precision/fp16", [](Schema& own) {
    own.add(keys::atLeast(keys::key("precision.loss_scale", ValueType::kFloat, "0", "Scale."), 0));
  });
  s.addFrom("trainer/llm", [](Schema& own) { keys::addRecompute(own, /*selective=*/true); });
  EXPECT_EQ(s.find("precision.loss_scale")->owner, "precision/fp16");
  EXPECT_EQ(s.find("model.recompute")->owner, "trainer/llm");
  EXPECT_EQ(s.find("train.steps")->owner, "");
  const std::string md = s.markdown();
  EXPECT_NE(md.find("### `precision` (plugin `precision/fp16`)"), std::string::npos) << md;
  EXPECT_NE(md.find("### `precision`\n"), std::string::npos) << md;  // the core's precision.name
  EXPECT_LT(md.find("### `log`"), md.find("(plugin `precision/fp16`)")) << "the core's sections come first";
  EXPECT_NE(s.text().find("keys of plugin precision/fp16:\nprecision.loss_scale"), std::string::npos) << s.text();

  s.addUnused("offload.tier", "applies to plugin offload/tiered only; remove it");
  Recipe r = Recipe::fromString(std::string(kMinimal) + "offload: {tier: disk}\nprecision: {loss_scale: -1}\n", "r.yaml");
  EXPECT_EQ(r.validateAll(s), (std::vector<std::string>{
                                  "r.yaml:3:11: offload.tier: applies to plugin offload/tiered only; remove it",
                                  "r.yaml:4:25: precision.loss_scale: -1 is out of range; use a value >= 0"}));
  // A trainer without selective recomputation declares only none and full.
  Schema detector = coreSchema();
  keys::addRecompute(detector, /*selective=*/false);
  EXPECT_EQ(detector.find("model.recompute")->choices, (std::vector<std::string>{"none", "full"}));
  detector.remove("model.recompute_num_layers");
  EXPECT_EQ(detector.find("model.recompute_num_layers"), nullptr);
}

TEST(RecipeSchema, TrainerExtensionValidatesItsOwnKeys) {
  const std::string yaml = std::string(kMinimal) +
                           "model: {num_layers: 2, rope_theta: 5000}\n"
                           "data: {name: arithmetic, max_operand: 99}\n";
  Recipe r = Recipe::fromString(yaml, "r.yaml");
  // With the core keys only, the trainer's keys are unknown.
  auto core = r.validateAll(gptSchema());
  ASSERT_EQ(core.size(), 2u);
  EXPECT_EQ(core[0], "r.yaml:3:24: model.rope_theta: unknown key; remove it (`ptrain keys` lists the keys of 'model')");
  EXPECT_EQ(core[1], "r.yaml:4:26: data.max_operand: unknown key; remove it (`ptrain keys` lists the keys of 'data')");

  // A first pass that lets the trainer's keys through still checks the core ones.
  EXPECT_TRUE(r.validateAll(gptSchema(), /*allowUnknown=*/true).empty());
  Recipe typo = Recipe::fromString(yaml + "optimizer: {lr: x}\n", "r.yaml");
  EXPECT_EQ(typo.validateAll(gptSchema(), true),
            std::vector<std::string>{"r.yaml:5:17: optimizer.lr: expected a number, got 'x'; write a number such as 0.001"});

  Schema extended = gptSchema();
  KeySpec theta = spec("model.rope_theta", ValueType::kFloat, "10000");
  theta.min = 0;
  theta.min_exclusive = true;
  extended.add(theta);
  KeySpec operand = spec("data.max_operand", ValueType::kInt, "");
  operand.required = true;
  extended.add(operand);
  extended.add(spec("data.digits", ValueType::kInt, "3"));
  // A trainer may also change a core default: its MLP is twice the width, not four times.
  extended.add(spec("model.ffn_hidden_size", ValueType::kInt, "128"));
  EXPECT_TRUE(r.validateAll(extended).empty());
  EXPECT_DOUBLE_EQ(r.getFloat("model.rope_theta"), 5000.0);
  EXPECT_EQ(r.getInt("data.max_operand"), 99);
  EXPECT_EQ(r.getInt("data.digits"), 3);
  EXPECT_EQ(r.getInt("model.ffn_hidden_size"), 128);

  // Validating again with the core schema drops the extension's defaults.
  auto again = r.validateAll(gptSchema());
  EXPECT_EQ(again.size(), 2u);
  EXPECT_FALSE(r.has("data.digits"));
  EXPECT_EQ(r.getInt("model.ffn_hidden_size"), 0);

  // The extension's own rules apply: range and required.
  Recipe bad = Recipe::fromString(std::string(kMinimal) + "model: {rope_theta: -1}\n", "r.yaml");
  auto p = bad.validateAll(extended);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], "r.yaml:3:21: model.rope_theta: -1 is out of range; use a value > 0");
  EXPECT_EQ(p[1], "r.yaml:1:1: data.max_operand: missing required key; add 'max_operand: <int>' under 'data:'");
}

TEST(RecipeSchema, FreeFormMapAcceptsAnyKeysBelowIt) {
  Schema s = coreSchema();
  s.add(spec("data.options", ValueType::kMap, "{}"));
  Recipe ok = Recipe::fromString(std::string(kMinimal) + "data:\n  options: {a: 1, b: {c: [1, 2]}}\n", "r.yaml");
  EXPECT_TRUE(ok.validateAll(s).empty());
  EXPECT_EQ(ok.keysUnder("data.options"), (std::vector<std::string>{"data.options.a", "data.options.b.c"}));
  EXPECT_EQ(ok.getIntList("data.options.b.c"), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(ok.has("data.options"));
  Recipe bad = Recipe::fromString(std::string(kMinimal) + "data:\n  options: 7\n", "r.yaml");
  auto p = bad.validateAll(s);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "r.yaml:4:12: data.options: expected a mapping, got '7'; write keys below it, e.g. {key: value}");
}

TEST(RecipeSchema, AddRejectsContradictorySpecs) {
  Schema s;
  EXPECT_THROW(s.add(spec("a.b", ValueType::kInt, "abc")), InternalError);
  KeySpec ranged = spec("a.c", ValueType::kInt, "0");
  ranged.min = 1;
  EXPECT_THROW(s.add(ranged), InternalError);
  KeySpec choice = spec("a.d", ValueType::kString, "x");
  choice.choices = {"y", "z"};
  EXPECT_THROW(s.add(choice), InternalError);
  KeySpec req = spec("a.e", ValueType::kInt, "3");
  req.required = true;
  EXPECT_THROW(s.add(req), InternalError);
  EXPECT_THROW(s.add(spec("a..f", ValueType::kInt, "")), InternalError);
  s.add(spec("a.g", ValueType::kInt, "1"));
  EXPECT_THROW(s.add(spec("a.g.h", ValueType::kInt, "1")), InternalError);  // a.g is a key, not a section
  EXPECT_THROW(s.add(spec("a", ValueType::kInt, "1")), InternalError);      // a is a section
  // Replacing keeps the place.
  s.add(spec("a.z", ValueType::kInt, "1"));
  s.add(spec("a.g", ValueType::kInt, "2"));
  ASSERT_EQ(s.keys().size(), 2u);
  EXPECT_EQ(s.keys()[0].path, "a.g");
  EXPECT_EQ(s.keys()[0].default_value, "2");
}

TEST(RecipeSchema, ValueChecksAreStrict) {
  KeySpec i = spec("x.i", ValueType::kInt, "");
  KeySpec f = spec("x.f", ValueType::kFloat, "");
  KeySpec b = spec("x.b", ValueType::kBool, "");
  auto check = [](const KeySpec& k, const std::string& text) { return Schema::checkValue(k, YAML::Load(text)); };
  EXPECT_EQ(check(i, "42"), "");
  EXPECT_EQ(check(i, "-7"), "");
  EXPECT_EQ(check(i, "0x10"), "");
  EXPECT_EQ(check(i, "4.0"), "expected an integer, got '4.0'; write a whole number such as 1");
  EXPECT_EQ(check(i, "1e3"), "expected an integer, got '1e3'; write a whole number such as 1");
  EXPECT_EQ(check(i, "99999999999999999999"),
            "expected an integer, got '99999999999999999999'; write a whole number such as 1");
  EXPECT_EQ(check(f, "3e-3"), "");
  EXPECT_EQ(check(f, "7"), "");
  EXPECT_EQ(check(f, ".5"), "");
  EXPECT_EQ(check(f, "nan"), "expected a number, got 'nan'; write a number such as 0.5");
  EXPECT_EQ(check(f, "inf"), "expected a number, got 'inf'; write a number such as 0.5");
  EXPECT_EQ(check(f, "1e999"), "expected a number, got '1e999'; write a number such as 0.5");
  for (const char* yes : {"true", "True", "yes", "on"}) EXPECT_EQ(check(b, yes), "") << yes;
  for (const char* no : {"false", "FALSE", "no", "off"}) EXPECT_EQ(check(b, no), "") << no;
  EXPECT_EQ(check(b, "1"), "expected true or false, got '1'; write true or false");
  EXPECT_EQ(check(b, "[true]"), "expected true or false, got a list; write a single value such as true");
}

TEST(RecipeSchema, RangeText) {
  KeySpec k = spec("x.k", ValueType::kFloat, "");
  EXPECT_EQ(Schema::rangeText(k), "");
  k.min = 1;
  EXPECT_EQ(Schema::rangeText(k), ">= 1");
  k.min_exclusive = true;
  EXPECT_EQ(Schema::rangeText(k), "> 1");
  k.max = 2.5;
  EXPECT_EQ(Schema::rangeText(k), "in (1, 2.5]");
  k.max_exclusive = true;
  k.min_exclusive = false;
  EXPECT_EQ(Schema::rangeText(k), "in [1, 2.5)");
  k.min.reset();
  EXPECT_EQ(Schema::rangeText(k), "< 2.5");
}

TEST(RecipeSchema, SuggestOnlyWhenClose) {
  Schema s = gptSchema();
  EXPECT_EQ(s.suggest("train.stpes"), "train.steps");
  EXPECT_EQ(s.suggest("Train.Steps"), "train.steps");
  EXPECT_EQ(s.suggest("optimiser.lr"), "optimizer.lr");
  EXPECT_EQ(s.suggest("parallel.pipeline_parallel_size"), "parallel.pipeline_model_parallel_size");
  EXPECT_EQ(s.suggest("train.lr"), "optimizer.lr");
  EXPECT_EQ(s.suggest("model.num_layer"), "model.num_layers");
  // Equally far from tensor_model_parallel_size and context_parallel_size: the
  // one that starts the same way wins.
  EXPECT_EQ(s.suggest("parallel.tensor_parallel_size"), "parallel.tensor_model_parallel_size");
  // A short name is no typo of a different short name in the same section.
  EXPECT_EQ(s.suggest("checkpoint.dir"), "");
  EXPECT_EQ(s.suggest("completely.unrelated"), "");
  EXPECT_EQ(s.suggest("x"), "");
}

TEST(RecipeSchema, MarkdownAndTextTables) {
  Schema s;
  KeySpec steps = spec("train.steps", ValueType::kInt, "", "Steps to run.");
  steps.required = true;
  steps.min = 1;
  s.add(steps);
  KeySpec mode = spec("train.mode", ValueType::kString, "a", "Mode a|b.");
  mode.choices = {"a", "b"};
  s.add(mode);
  s.add(spec("log.file", ValueType::kString, "", "Log file."));
  EXPECT_EQ(s.markdown(),
            "### `train`\n"
            "\n"
            "| Key | Type | Default | Allowed | Meaning |\n"
            "|---|---|---|---|---|\n"
            "| `train.steps` | int | required | >= 1 | Steps to run. |\n"
            "| `train.mode` | string | `a` | `a`, `b` | Mode a\\|b. |\n"
            "\n"
            "### `log`\n"
            "\n"
            "| Key | Type | Default | Allowed | Meaning |\n"
            "|---|---|---|---|---|\n"
            "| `log.file` | string | not set |  | Log file. |\n");
  EXPECT_EQ(s.text(),
            "key          type    default   allowed  meaning\n"
            "train.steps  int     required  >= 1     Steps to run.\n"
            "train.mode   string  a         a|b      Mode a|b.\n"
            "log.file     string  not set            Log file.\n");
}

TEST(RecipeSchema, KeyBuildersFillTheSpec) {
  KeySpec digits = keys::atMost(keys::atLeast(keys::key("data.digits", ValueType::kInt, "2", "Digits."), 1), 9);
  EXPECT_EQ(digits.path, "data.digits");
  EXPECT_EQ(digits.type, ValueType::kInt);
  EXPECT_EQ(digits.default_value, "2");
  EXPECT_EQ(digits.doc, "Digits.");
  EXPECT_FALSE(digits.required);
  EXPECT_EQ(Schema::rangeText(digits), "in [1, 9]");

  KeySpec steps = keys::required("train.steps", ValueType::kInt, "Steps.");
  EXPECT_TRUE(steps.required);
  EXPECT_EQ(steps.default_value, "");
  EXPECT_EQ(Schema::rangeText(keys::above(keys::key("o.lr", ValueType::kFloat, "0.1", "Lr."), 0)), "> 0");
  EXPECT_EQ(Schema::rangeText(keys::unitBelowOne(keys::key("o.b", ValueType::kFloat, "0.9", "B."))), "in [0, 1)");
  EXPECT_EQ(keys::oneOf(keys::key("o.n", ValueType::kString, "a", "N."), {"a", "b"}).choices,
            (std::vector<std::string>{"a", "b"}));

  KeySpec off = keys::reserved(keys::key("offload.params", ValueType::kBool, "false", "Offload."), "not built",
                               {"false"});
  EXPECT_EQ(off.reserved, "not built");
  EXPECT_EQ(off.reserved_accepts, std::vector<std::string>{"false"});
  EXPECT_TRUE(keys::key("x.y", ValueType::kInt, "1", "Y.").reserved.empty());

  Schema s;
  for (const KeySpec& k : {digits, steps, off}) s.add(k);
  EXPECT_EQ(s.keys().size(), 3u);
}

// Keys that are planned but not built: their types and defaults stay (see
// CoreKeysFollowMegatronNamesAndDefaults), and only what runs today is accepted.
TEST(RecipeSchema, CoreReservedKeys) {
  Schema s = coreSchema();
  const std::vector<std::pair<const char*, std::vector<std::string>>> reserved = {
      {"train.eval_batches", {}},
  };
  for (const auto& [path, accepts] : reserved) {
    const KeySpec* k = s.find(path);
    ASSERT_NE(k, nullptr) << path;
    EXPECT_FALSE(k->reserved.empty()) << path;
    EXPECT_EQ(k->reserved_accepts, accepts) << path;
  }
  const KeySpec* device = s.find("device.type");
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->type, ValueType::kString);
  EXPECT_EQ(device->default_value, "auto");
  EXPECT_TRUE(device->reserved.empty());
  EXPECT_TRUE(s.find("train.steps")->reserved.empty());
  EXPECT_TRUE(s.find("parallel.context_parallel_size")->reserved.empty());
  // Built: the offload plugin runs them.
  for (const char* path : {"offload.params", "offload.grads", "offload.optimizer", "offload.name"})
    EXPECT_TRUE(s.find(path)->reserved.empty()) << path;
}

TEST(RecipeSchema, AddRejectsContradictoryReservedSpecs) {
  Schema s;
  KeySpec noReason = spec("a.b", ValueType::kBool, "false");
  noReason.reserved_accepts = {"false"};
  EXPECT_THROW(s.add(noReason), InternalError);
  EXPECT_THROW(s.add(keys::reserved(spec("a.c", ValueType::kBool, "false"), "later", {"maybe"})), InternalError);
  EXPECT_THROW(s.add(keys::reserved(keys::atLeast(spec("a.d", ValueType::kInt, "1"), 1), "later", {"0"})),
               InternalError);
  EXPECT_THROW(s.add(keys::reserved(keys::oneOf(spec("a.e", ValueType::kString, "x"), {"x", "y"}), "later", {"z"})),
               InternalError);
  // The default need not be accepted: it never counts as set.
  s.add(keys::reserved(spec("a.f", ValueType::kInt, "8"), "later", {}));
  EXPECT_EQ(s.keys().size(), 1u);
}

TEST(RecipeSchema, CheckReservedAcceptsTheSameValueInAnySpelling) {
  auto check = [](const KeySpec& k, const std::string& text) { return Schema::checkReserved(k, YAML::Load(text)); };
  KeySpec b = keys::reserved(spec("off.p", ValueType::kBool, "false"), "no plugin", {"false"});
  for (const char* no : {"false", "False", "no", "off"}) EXPECT_EQ(check(b, no), "") << no;
  EXPECT_EQ(check(b, "yes"), "yes is not implemented yet (no plugin); remove it or set false");
  KeySpec i = keys::reserved(spec("x.i", ValueType::kInt, "1"), "later", {"1", "2"});
  EXPECT_EQ(check(i, "0x2"), "");
  EXPECT_EQ(check(i, "3"), "3 is not implemented yet (later); remove it or set 1 or 2");
  KeySpec none = keys::reserved(spec("x.n", ValueType::kInt, "8"), "the trainer sizes it", {});
  EXPECT_EQ(check(none, "8"), "8 is not implemented yet (the trainer sizes it); remove it");
  // Not reserved: nothing to say.
  EXPECT_EQ(check(spec("x.s", ValueType::kString, ""), "anything"), "");
}

// Reserved keys that accept some values are listed with what runs today.
TEST(RecipeSchema, ReservedKeysInTables) {
  Schema s;
  s.add(keys::reserved(spec("off.params", ValueType::kBool, "false", "Keep params."), "no plugin", {"false"}));
  s.add(keys::reserved(spec("off.name", ValueType::kString, "fp32", "Precision."), "later", {"fp32"}));
  s.add(keys::reserved(keys::oneOf(spec("off.device", ValueType::kString, "cpu", "Device."), {"cpu", "cuda"}),
                       "a GPU build", {"cpu"}));
  s.add(keys::reserved(keys::atLeast(spec("off.batches", ValueType::kInt, "8", "Batches."), 1), "the trainer's", {}));
  EXPECT_EQ(s.markdown(),
            "### `off`\n"
            "\n"
            "| Key | Type | Default | Allowed | Meaning |\n"
            "|---|---|---|---|---|\n"
            "| `off.params` | bool | `false` | `false` (`true`: not implemented yet) | Keep params. Not implemented "
            "yet: no plugin. |\n"
            "| `off.name` | string | `fp32` | `fp32` (others: not implemented yet) | Precision. Not implemented yet: "
            "later. |\n"
            "| `off.device` | string | `cpu` | `cpu` (`cuda`: not implemented yet) | Device. Not implemented yet: a "
            "GPU build. |\n");
  EXPECT_EQ(s.text(),
            "key         type    default  allowed                             meaning\n"
            "off.params  bool    false    false (true: not implemented yet)   Keep params. Not implemented yet: no "
            "plugin.\n"
            "off.name    string  fp32     fp32 (others: not implemented yet)  Precision. Not implemented yet: later.\n"
            "off.device  string  cpu      cpu (cuda: not implemented yet)     Device. Not implemented yet: a GPU "
            "build.\n");
  // off.batches accepts no value yet: nobody can use it, so no table lists
  // it, though a recipe that sets it is still refused with its reason.
  EXPECT_EQ(s.markdown().find("off.batches"), std::string::npos);
  EXPECT_EQ(s.text().find("off.batches"), std::string::npos);
}

TEST(RecipeSchema, EveryCoreDefaultValidates) {
  // A recipe with only the required keys validates and then holds a value for
  // every key that has a default.
  Recipe r = Recipe::fromString(kMinimal, "r.yaml");
  Schema s = coreSchema();
  EXPECT_TRUE(r.validateAll(s).empty());
  for (const auto& k : s.keys()) {
    EXPECT_EQ(r.has(k.path), k.required || !k.default_value.empty()) << k.path;
  }
}

}  // namespace
}  // namespace ptrain
