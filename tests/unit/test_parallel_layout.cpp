// ParallelLayout against Megatron-LM's documented rank assignment and
// hand-written grids.
#include <gtest/gtest.h>

#include "ptrain/layout/parallel_layout.h"

using ptrain::GroupKind;
using ptrain::LayoutSizes;
using ptrain::ParallelLayout;
using Groups = std::vector<std::vector<int>>;

TEST(ParallelLayout, MegatronDocumentedExample) {
  // Megatron's initialize_model_parallel docstring: 16 GPUs, tp=2, pp=4.
  LayoutSizes s;
  s.world = 16;
  s.tp = 2;
  s.pp = 4;
  ParallelLayout layout(s);
  EXPECT_EQ(layout.dp(), 2);
  EXPECT_EQ(layout.groups(GroupKind::kTensor),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(layout.groups(GroupKind::kData),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(layout.groups(GroupKind::kPipeline),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(layout.groupOf(GroupKind::kPipeline, 9), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(layout.indexIn(GroupKind::kPipeline, 9), 2);
  EXPECT_EQ(layout.indexIn(GroupKind::kTensor, 9), 1);
  EXPECT_EQ(layout.indexIn(GroupKind::kData, 9), 0);
}

TEST(ParallelLayout, ContextParallelSitsBetweenTensorAndData) {
  // 8 ranks, tp=2, cp=2 -> dp=2: rank = tp + 2*cp + 4*dp.
  LayoutSizes s;
  s.world = 8;
  s.tp = 2;
  s.cp = 2;
  ParallelLayout layout(s);
  EXPECT_EQ(layout.groups(GroupKind::kContext), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.groups(GroupKind::kData), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.groups(GroupKind::kDataContext), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
}

TEST(ParallelLayout, ExpertGridOverTheSameRanks) {
  // 8 ranks, tp=2 pp=2 (dp=2); experts: etp=1 ep=2 -> edp=2.
  // Expert grid digits: etp (1), ep (2), edp (2), pp (2): rank = ep + 2*edp + 4*pp.
  LayoutSizes s;
  s.world = 8;
  s.tp = 2;
  s.pp = 2;
  s.ep = 2;
  s.etp = 1;
  ParallelLayout layout(s);
  EXPECT_EQ(layout.edp(), 2);
  EXPECT_EQ(layout.groups(GroupKind::kExpert), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.groups(GroupKind::kExpertData), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.groups(GroupKind::kExpertTensor).size(), 8u);
  EXPECT_EQ(layout.groups(GroupKind::kPipeline), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(ParallelLayout, EveryRankIsInExactlyOneGroupOfEachKind) {
  LayoutSizes s;
  s.world = 24;
  s.tp = 2;
  s.cp = 1;
  s.pp = 3;
  s.ep = 2;
  s.etp = 2;
  ParallelLayout layout(s);
  for (auto kind : {GroupKind::kTensor, GroupKind::kContext, GroupKind::kData, GroupKind::kPipeline,
                    GroupKind::kModel, GroupKind::kExpert, GroupKind::kExpertTensor, GroupKind::kExpertData}) {
    std::vector<int> seen(24, 0);
    for (auto& g : layout.groups(kind))
      for (int r : g) seen[r]++;
    for (int r = 0; r < 24; ++r) EXPECT_EQ(seen[r], 1) << toString(kind) << " rank " << r;
  }
}

TEST(ParallelLayout, RejectsWorldThatDoesNotSplit) {
  LayoutSizes s;
  s.world = 6;
  s.tp = 4;
  try {
    ParallelLayout layout(s);
    FAIL() << "expected ConfigError";
  } catch (const ptrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("world size 6 is not divisible"), std::string::npos) << e.what();
  }
}

TEST(ParallelLayout, GroupNames) {
  EXPECT_EQ(ParallelLayout::groupName(GroupKind::kTensor, {2, 3}), "tp[2,3]");
}
