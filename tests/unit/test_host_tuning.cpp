// The environment the launcher gives its workers for this host's math
// libraries: kernel-set ordering, the user's own settings kept, and the
// OpenBLAS override only where OpenBLAS chose less than the CPU supports.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "ptrain/launch/host_tuning.h"

using ptrain::hostTuning;
using ptrain::openblasCoreInUse;
using ptrain::openblasCoreLevel;
using ptrain::openblasCoreTypeForCpu;

namespace {

// Sets (or unsets) a variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

bool hasEntry(const ptrain::HostTuning& t, const std::string& prefix) {
  for (const auto& e : t.env) {
    if (e.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST(HostTuning, KernelSetsAreOrderedByTheInstructionsTheyNeed) {
  EXPECT_EQ(openblasCoreLevel("Prescott"), 0);
  EXPECT_EQ(openblasCoreLevel("core2"), 0);
  EXPECT_EQ(openblasCoreLevel("Sandybridge"), 1);
  EXPECT_EQ(openblasCoreLevel("HASWELL"), 2);
  EXPECT_EQ(openblasCoreLevel("zen"), 2);
  EXPECT_EQ(openblasCoreLevel("skylakex"), 3);
  EXPECT_EQ(openblasCoreLevel("Cooperlake"), 3);
  EXPECT_EQ(openblasCoreLevel("something new"), 0);
}

TEST(HostTuning, CpuKernelSetIsOneOpenblasKnows) {
  const std::string best = openblasCoreTypeForCpu();
  if (!best.empty()) {
    EXPECT_GT(openblasCoreLevel(best), 0) << best;
  }
}

TEST(HostTuning, OpenMpThreadsSleepUnlessTheUserSaysOtherwise) {
  {
    ScopedEnv unset("OMP_WAIT_POLICY", nullptr);
    const auto t = hostTuning();
    EXPECT_TRUE(hasEntry(t, "OMP_WAIT_POLICY=PASSIVE"));
    // With ptrain's host kernels OpenMP is the only pool: its default wait stays.
    EXPECT_FALSE(hasEntry(hostTuning(/*oneThreadPool=*/true), "OMP_WAIT_POLICY="));
  }
  ScopedEnv active("OMP_WAIT_POLICY", "ACTIVE");
  EXPECT_FALSE(hasEntry(hostTuning(), "OMP_WAIT_POLICY="));
}

TEST(HostTuning, OpenblasIsCorrectedOnlyWhereItChoseLessThanTheCpuOffers) {
  {
    ScopedEnv own("OPENBLAS_CORETYPE", "Haswell");
    EXPECT_FALSE(hasEntry(hostTuning(), "OPENBLAS_CORETYPE="));  // the user's choice stands
  }
  ScopedEnv unset("OPENBLAS_CORETYPE", nullptr);
  const std::string inUse = openblasCoreInUse();
  const std::string best = openblasCoreTypeForCpu();
  const auto t = hostTuning();
  const bool expected = !inUse.empty() && !best.empty() && openblasCoreLevel(best) > openblasCoreLevel(inUse);
  EXPECT_EQ(hasEntry(t, "OPENBLAS_CORETYPE=" + best), expected) << "in use: '" << inUse << "', cpu: '" << best << "'";
  EXPECT_EQ(t.notes.size(), expected ? 1u : 0u);
}
