#include "ptrain/engine/cross_group_gradients.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "ptrain/comm/process_group.h"
#include "ptrain/layout/device_groups.h"

namespace ptrain {
namespace {

// The exchange's point-to-point messages, apart from any other on the job's world.
constexpr int kTag = 38;

struct RankBlock {
  int rank = 0;
  int group = 0;
  std::vector<int64_t> offsets, sizes;
};

std::string joined(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<int64_t> parsed(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

int64_t volume(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// The common part of two blocks of one tensor; false when there is none.
bool intersect(const std::vector<int64_t>& aOff, const std::vector<int64_t>& aSize, const std::vector<int64_t>& bOff,
               const std::vector<int64_t>& bSize, std::vector<int64_t>* off, std::vector<int64_t>* size) {
  off->assign(aOff.size(), 0);
  size->assign(aOff.size(), 0);
  for (size_t d = 0; d < aOff.size(); ++d) {
    const int64_t lo = std::max(aOff[d], bOff[d]);
    const int64_t hi = std::min(aOff[d] + aSize[d], bOff[d] + bSize[d]);
    if (hi <= lo) return false;
    (*off)[d] = lo;
    (*size)[d] = hi - lo;
  }
  return true;
}

// Every rank's text, over the job: lengths first, then the bytes padded to the longest.
std::vector<std::string> allTexts(ProcessGroup& job, const std::string& mine) {
  const int n = job.size();
  at::Tensor length = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kInt64);
  at::Tensor lengths = torch::zeros({n}, torch::kInt64);
  job.allgather(lengths, length)->wait();
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  at::Tensor bytes = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  at::Tensor all = torch::zeros({n * longest}, torch::kUInt8);
  job.allgather(all, bytes)->wait();
  std::vector<std::string> out;
  const auto* data = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < n; ++r) out.emplace_back(data + r * longest, static_cast<size_t>(lengths[r].item<int64_t>()));
  return out;
}

}  // namespace

int64_t CrossGroupGradients::Box::numel() const { return volume(sizes); }

CrossGroupGradients::CrossGroupGradients(std::vector<Held> held, const DeviceGroups& groups, int group,
                                         std::shared_ptr<ProcessGroup> job)
    : held_(std::move(held)), group_(group), groups_(groups.size()), job_(std::move(job)) {
  torch::NoGradGuard noGrad;
  const int me = job_->rank();
  // Every rank's blocks: "name \t full \t offsets \t sizes" per line.
  std::string mine;
  for (const Held& h : held_) {
    mine += h.name + "\t" + joined(h.full) + "\t" + joined(h.offsets) + "\t" + joined(h.param.sizes().vec()) + "\n";
  }
  const std::vector<std::string> texts = allTexts(*job_, mine);
  std::map<std::string, std::vector<RankBlock>> holders;  // by name, in rank order
  for (int r = 0; r < static_cast<int>(texts.size()); ++r) {
    std::stringstream in(texts[static_cast<size_t>(r)]);
    std::string line;
    while (std::getline(in, line)) {
      std::stringstream fields(line);
      std::string name, full, offsets, sizes;
      std::getline(fields, name, '\t');
      std::getline(fields, full, '\t');
      std::getline(fields, offsets, '\t');
      std::getline(fields, sizes, '\t');
      holders[name].push_back(RankBlock{r, groups.indexOf(r), parsed(offsets), parsed(sizes)});
    }
  }
  // The ranks of `group` holding exactly the block of `b`, in rank order.
  auto replicas = [&](const std::string& name, int inGroup, const RankBlock& b) {
    std::vector<int> out;
    for (const RankBlock& other : holders[name])
      if (other.group == inGroup && other.offsets == b.offsets && other.sizes == b.sizes) out.push_back(other.rank);
    return out;
  };
  auto indexIn = [](const std::vector<int>& ranks, int rank) {
    return static_cast<size_t>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
  };
  std::map<int, Peer> peers;
  for (size_t i = 0; i < held_.size(); ++i) {
    const Held& h = held_[i];
    const RankBlock self{me, group_, h.offsets, h.param.sizes().vec()};
    const std::vector<int> mySet = replicas(h.name, group_, self);
    const size_t k = indexIn(mySet, me);
    // What this rank receives: from each other group, the parts of its block,
    // each from one replica of the block holding it.
    std::vector<int64_t> covered(static_cast<size_t>(groups_), 0);
    for (const RankBlock& other : holders[h.name]) {
      if (other.group == group_) continue;
      const std::vector<int> theirs = replicas(h.name, other.group, other);
      if (theirs.front() != other.rank) continue;  // each block of the group once, at its first holder
      Box box;
      if (!intersect(self.offsets, self.sizes, other.offsets, other.sizes, &box.offsets, &box.sizes)) continue;
      box.param = i;
      box.group = other.group;
      covered[static_cast<size_t>(other.group)] += box.numel();
      peers[theirs[k % theirs.size()]].recv.push_back(std::move(box));
    }
    for (int g = 0; g < groups_; ++g) {
      if (g == group_ || covered[static_cast<size_t>(g)] == volume(self.sizes)) continue;
      throw ConfigError("parallel.groups: device group " + groups[g].name + " holds " +
                        std::to_string(covered[static_cast<size_t>(g)]) + " of the " +
                        std::to_string(volume(self.sizes)) + " values of parameter '" + h.name + "' that group " +
                        groups[group_].name + "'s rank " + std::to_string(me) +
                        " holds: every group must hold the whole model (the same model, in its own layout)");
    }
    // What this rank sends: to every rank of another group whose block
    // meets its own and whose replica index picks this rank.
    for (const RankBlock& other : holders[h.name]) {
      if (other.group == group_) continue;
      const std::vector<int> theirs = replicas(h.name, other.group, other);
      const size_t kOther = indexIn(theirs, other.rank);
      if (mySet[kOther % mySet.size()] != me) continue;
      Box box;
      if (!intersect(self.offsets, self.sizes, other.offsets, other.sizes, &box.offsets, &box.sizes)) continue;
      box.param = i;
      box.group = group_;
      peers[other.rank].send.push_back(std::move(box));
    }
  }
  // Both ends list a pair's parts in one order: by parameter name, then offsets.
  auto byName = [this](const Box& a, const Box& b) {
    const std::string& an = held_[a.param].name;
    const std::string& bn = held_[b.param].name;
    return an != bn ? an < bn : a.offsets < b.offsets;
  };
  for (auto& [rank, peer] : peers) {
    peer.rank = rank;
    std::sort(peer.send.begin(), peer.send.end(), byName);
    std::sort(peer.recv.begin(), peer.recv.end(), byName);
    for (const Box& b : peer.send) peer.send_numel += b.numel();
    for (const Box& b : peer.recv) peer.recv_numel += b.numel();
    peers_.push_back(std::move(peer));
  }
}

CrossGroupGradients::~CrossGroupGradients() = default;

at::Tensor CrossGroupGradients::local(size_t param, const Box& box, const at::Tensor& t) const {
  at::Tensor out = t;
  const std::vector<int64_t>& base = held_[param].offsets;
  for (size_t d = 0; d < box.offsets.size(); ++d) {
    out = out.narrow(static_cast<int64_t>(d), box.offsets[d] - base[d], box.sizes[d]);
  }
  return out;
}

void CrossGroupGradients::finishGradients() {
  if (groups_ < 2) return;
  torch::NoGradGuard noGrad;
  const auto start = std::chrono::steady_clock::now();
  // A parameter backward did not reach has a zero gradient in every group.
  std::vector<at::Tensor> grads;
  for (Held& h : held_) {
    if (!h.param.grad().defined()) h.param.mutable_grad() = torch::zeros_like(h.param, h.param.options().dtype(at::kFloat));
    grads.push_back(h.param.grad());
  }
  std::vector<at::Tensor> sent, received(peers_.size());
  std::vector<std::shared_ptr<Work>> works;
  PointToPointOptions p2p;
  p2p.tag = kTag;
  bytes_ = 0;
  for (size_t p = 0; p < peers_.size(); ++p) {
    const Peer& peer = peers_[p];
    if (peer.send_numel > 0) {
      std::vector<at::Tensor> parts;
      for (const Box& b : peer.send) parts.push_back(local(b.param, b, grads[b.param]).reshape({-1}).to(at::kFloat));
      sent.push_back(torch::cat(parts));
      works.push_back(job_->send(sent.back(), peer.rank, p2p));
      bytes_ += static_cast<double>(peer.send_numel) * 4;
    }
    if (peer.recv_numel > 0) {
      received[p] = torch::empty({peer.recv_numel}, torch::kFloat);
      works.push_back(job_->recv(received[p], peer.rank, p2p));
    }
  }
  for (auto& w : works) w->wait();
  // Each parameter's parts by the group they come from.
  std::vector<std::vector<std::vector<std::pair<const Box*, at::Tensor>>>> parts(
      held_.size(), std::vector<std::vector<std::pair<const Box*, at::Tensor>>>(static_cast<size_t>(groups_)));
  for (size_t p = 0; p < peers_.size(); ++p) {
    int64_t at = 0;
    for (const Box& b : peers_[p].recv) {
      parts[b.param][static_cast<size_t>(b.group)].emplace_back(&b, received[p].narrow(0, at, b.numel()).view(b.sizes));
      at += b.numel();
    }
  }
  // The same sum in the same order on every rank of every group: zero, then
  // group 0's part, group 1's, ...
  for (size_t i = 0; i < held_.size(); ++i) {
    at::Tensor sum = torch::zeros(grads[i].sizes(), grads[i].options().dtype(at::kFloat));
    for (int g = 0; g < groups_; ++g) {
      if (g == group_) {
        sum.add_(grads[i].to(at::kFloat));
        continue;
      }
      for (const auto& [box, value] : parts[i][static_cast<size_t>(g)]) local(i, *box, sum).add_(value);
    }
    grads[i].copy_(sum);
  }
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::map<std::string, double> CrossGroupGradients::stepStats() const {
  return {{"cross_group_bytes", bytes_}, {"cross_group_s", seconds_}};
}

}  // namespace ptrain
