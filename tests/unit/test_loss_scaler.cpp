// The fp16 loss scaler against sequences worked out by hand from Megatron-LM's
// DynamicGradScaler (initial 2^32, min 1, growth 2, backoff 0.5, window and
// hysteresis as each test says).
#include <gtest/gtest.h>

#include <cmath>

#include "ptrain/engine/loss_scaler.h"

using ptrain::LossScaler;
using ptrain::LossScalerOptions;

namespace {

LossScalerOptions small(int64_t window, int64_t hysteresis) {
  LossScalerOptions o;
  o.initial_scale = 1024.0f;
  o.window = window;
  o.hysteresis = hysteresis;
  return o;
}

}  // namespace

TEST(LossScaler, DefaultsAreMegatrons) {
  LossScaler s{LossScalerOptions{}};
  EXPECT_EQ(s.scale(), 4294967296.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
}

// Hysteresis 2: the first overflow only spends the counter; the second backs
// off; the third backs off again, because only a full clean window restores it.
TEST(LossScaler, BacksOffAfterHysteresisAndKeepsBackingOff) {
  LossScaler s(small(3, 2));
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 0);
  s.update(false);  // a clean step does not restore the counter
  EXPECT_EQ(s.state().hysteresis_tracker, 0);
  s.update(true);
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, -1);
}

// Growth after `window` clean steps in a row; an overflow restarts the count.
TEST(LossScaler, GrowsAfterAFullCleanWindowOnly) {
  LossScaler s(small(3, 2));
  s.update(false);
  s.update(false);
  s.update(true);  // restarts the clean count, spends one hysteresis
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);  // third clean step in a row
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);  // restored by the growth
}

TEST(LossScaler, NeverBelowMinScale) {
  LossScalerOptions o = small(1000, 1);
  o.initial_scale = 4.0f;
  o.min_scale = 1.5f;
  LossScaler s(o);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.5f);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.5f);
}

// A long run: float32 arithmetic as Megatron's, so 2^32 * 2^k stays exact
// and the value after many windows is a closed form.
TEST(LossScaler, LongRunMatchesClosedForm) {
  LossScaler s(LossScalerOptions{});
  for (int i = 0; i < 5000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), std::ldexp(1.0f, 32 + 5));
  for (int i = 0; i < 7; ++i) s.update(true);  // 1 spent on hysteresis, 6 backoffs
  EXPECT_EQ(s.scale(), std::ldexp(1.0f, 32 + 5 - 6));
}

TEST(LossScaler, ConstantScaleNeverMoves) {
  LossScalerOptions o;
  o.dynamic = false;
  o.initial_scale = 128.0f;
  LossScaler s(o);
  for (int i = 0; i < 10; ++i) s.update(i % 2 == 0);
  EXPECT_EQ(s.scale(), 128.0f);
}

TEST(LossScaler, StateRoundTripsAndBadOptionsAreConfigErrors) {
  LossScaler a(small(3, 2));
  a.update(true);
  a.update(false);
  LossScaler b(small(3, 2));
  b.load(a.state());
  a.update(false);
  a.update(false);
  b.update(false);
  b.update(false);
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.scale(), 2048.0f);

  LossScalerOptions bad = small(3, 2);
  bad.backoff = 1.0f;
  EXPECT_THROW(LossScaler{bad}, ptrain::ConfigError);
  bad = small(0, 2);
  EXPECT_THROW(LossScaler{bad}, ptrain::ConfigError);
  bad = small(3, 2);
  bad.min_scale = 4096.0f;
  EXPECT_THROW(LossScaler{bad}, ptrain::ConfigError);
  ptrain::LossScalerState broken{-1.0f, 0, 2};
  EXPECT_THROW(b.load(broken), ptrain::CheckpointError);
}
