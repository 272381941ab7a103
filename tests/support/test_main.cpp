// The main of every test binary (in place of gtest_main).
//
//   --ptrain_list_long_tests   prints the full name of each long test
//                              (PTRAIN_LONG_TEST, test_support.h), one a line,
//                              and exits: the test discovery labels them.
//
// Exit codes for ctest: 0 when every test that ran passed, 1 when one failed
// or when the filter matched no test (a discovery that no longer matches the
// binary must not pass silently), and 77 when every selected test skipped
// (GTEST_SKIP: no GPU, a Python package absent), which ctest reports as
// skipped (SKIP_RETURN_CODE). A batch in which some tests passed and others
// skipped passes; gtest's output lists the skipped ones.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "support/test_support.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ptrain_list_long_tests") == 0) {
      for (const auto& name : ptrain::test::longTestNames()) std::printf("%s\n", name.c_str());
      return 0;
    }
  }
  const int rc = RUN_ALL_TESTS();
  const auto* unit = ::testing::UnitTest::GetInstance();
  if (rc != 0) return rc;
  if (unit->test_to_run_count() == 0) {
    std::fprintf(stderr, "ptrain tests: the filter selected no test of this binary\n");
    return 1;
  }
  if (unit->skipped_test_count() == unit->test_to_run_count()) return 77;
  return 0;
}
