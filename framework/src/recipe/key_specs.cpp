#include "ptrain/recipe/key_specs.h"

#include <utility>

namespace ptrain::keys {

KeySpec key(std::string path, ValueType type, std::string defaultValue, std::string doc) {
  KeySpec k;
  k.path = std::move(path);
  k.type = type;
  k.default_value = std::move(defaultValue);
  k.doc = std::move(doc);
  return k;
}

KeySpec required(std::string path, ValueType type, std::string doc) {
  KeySpec k = key(std::move(path), type, "", std::move(doc));
  k.required = true;
  return k;
}

KeySpec atLeast(KeySpec spec, double min) {
  spec.min = min;
  spec.min_exclusive = false;
  return spec;
}

KeySpec above(KeySpec spec, double min) {
  spec.min = min;
  spec.min_exclusive = true;
  return spec;
}

KeySpec atMost(KeySpec spec, double max) {
  spec.max = max;
  spec.max_exclusive = false;
  return spec;
}

KeySpec unitBelowOne(KeySpec spec) {
  spec.min = 0;
  spec.min_exclusive = false;
  spec.max = 1;
  spec.max_exclusive = true;
  return spec;
}

KeySpec oneOf(KeySpec spec, std::vector<std::string> choices) {
  spec.choices = std::move(choices);
  return spec;
}

KeySpec reserved(KeySpec spec, std::string reason, std::vector<std::string> accepts) {
  spec.reserved = std::move(reason);
  spec.reserved_accepts = std::move(accepts);
  return spec;
}

}  // namespace ptrain::keys
