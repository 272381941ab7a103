#include "ptrain/engine/cross_group_gradients.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <sstream>

#include "ptrain/comm/process_group.h"
#include "ptrain/engine/row_sparse.h"
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

// Every rank's text, over the job: lengths first, then the bytes padded to
// the longest. The collectives run on `device`, where the job's backend
// works (NCCL takes device tensors only).
std::vector<std::string> allTexts(ProcessGroup& job, const std::string& mine, at::Device device) {
  const int n = job.size();
  const auto on = torch::TensorOptions().device(device);
  at::Tensor length = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kInt64).to(device);
  at::Tensor lengths = torch::zeros({n}, on.dtype(torch::kInt64));
  job.allgather(lengths, length)->wait();
  lengths = lengths.cpu();
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  at::Tensor bytes = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  at::Tensor all = torch::zeros({n * longest}, on.dtype(torch::kUInt8));
  job.allgather(all, bytes.to(device))->wait();
  all = all.cpu();
  std::vector<std::string> out;
  const auto* data = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < n; ++r) out.emplace_back(data + r * longest, static_cast<size_t>(lengths[r].item<int64_t>()));
  return out;
}

}  // namespace

int64_t CrossGroupGradients::Box::numel() const { return volume(sizes); }

CrossGroupGradients::CrossGroupGradients(std::vector<Held> held, const DeviceGroups& groups, int group,
                                         std::shared_ptr<ProcessGroup> job, at::Device device)
    : held_(std::move(held)), group_(group), groups_(groups.size()), job_(std::move(job)), device_(device) {
  torch::NoGradGuard noGrad;
  const int me = job_->rank();
  // Every rank's blocks: "name \t full \t offsets \t sizes" per line.
  std::string mine;
  for (const Held& h : held_) {
    mine += h.name + "\t" + joined(h.full) + "\t" + joined(h.offsets) + "\t" + joined(h.param.sizes().vec()) + "\t" +
            (h.row_sparse ? "1" : "0") + "\n";
  }
  const std::vector<std::string> texts = allTexts(*job_, mine, device_);
  std::map<std::string, std::vector<RankBlock>> holders;  // by name, in rank order
  std::map<std::string, std::set<bool>> rowSparse;         // by name: what the holders say
  for (int r = 0; r < static_cast<int>(texts.size()); ++r) {
    std::stringstream in(texts[static_cast<size_t>(r)]);
    std::string line;
    while (std::getline(in, line)) {
      std::stringstream fields(line);
      std::string name, full, offsets, sizes, sparse;
      std::getline(fields, name, '\t');
      std::getline(fields, full, '\t');
      std::getline(fields, offsets, '\t');
      std::getline(fields, sizes, '\t');
      std::getline(fields, sparse, '\t');
      holders[name].push_back(RankBlock{r, groups.indexOf(r), parsed(offsets), parsed(sizes)});
      rowSparse[name].insert(sparse == "1");
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
    // Both ends of a pair must agree on how a part travels.
    PTRAIN_CHECK_AS(ConfigError, rowSparse[h.name].size() == 1, "parallel.groups: parameter '", h.name,
                    "' has row-sparse gradients in one group and dense ones in another: every group must hold the "
                    "same model");
    PTRAIN_CHECK_AS(ConfigError, !h.row_sparse || h.param.dim() == 2, "parallel.groups: row-sparse parameter '",
                    h.name, "' is not a table [rows, dim]");
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
  // Messages and sums live on the job's device: a gradient resting in an
  // offload tier (offload.grads, or a parameter of offload.params) comes in
  // for its parts and takes its sum back where it rests.
  const auto onDevice = torch::TensorOptions().device(device_).dtype(torch::kFloat);
  const auto indexOnDevice = torch::TensorOptions().device(device_).dtype(torch::kInt64);
  PointToPointOptions p2p;
  p2p.tag = kTag;
  bytes_ = 0;

  // A row-sparse part travels as the rows this rank's group touched (their
  // indices in the part, then their values): the bytes follow the rows a
  // step looked up, not the table. The counts go first, one message each
  // way per pair that has such parts.
  std::vector<std::vector<at::Tensor>> sendRows(peers_.size());  // per peer, per row-sparse send part
  std::vector<at::Tensor> recvCounts(peers_.size());
  {
    std::vector<at::Tensor> counts;
    std::vector<std::shared_ptr<Work>> works;
    for (size_t p = 0; p < peers_.size(); ++p) {
      const Peer& peer = peers_[p];
      std::vector<int64_t> mine;
      for (const Box& b : peer.send) {
        if (!held_[b.param].row_sparse) continue;
        sendRows[p].push_back(touchedRows(local(b.param, b, grads[b.param])).to(indexOnDevice));
        mine.push_back(sendRows[p].back().numel());
      }
      if (!mine.empty()) {
        counts.push_back(torch::tensor(mine, torch::kInt64).to(device_));
        works.push_back(job_->send(counts.back(), peer.rank, p2p));
      }
      int64_t sparseRecv = 0;
      for (const Box& b : peer.recv) sparseRecv += held_[b.param].row_sparse ? 1 : 0;
      if (sparseRecv > 0) {
        recvCounts[p] = torch::empty({sparseRecv}, indexOnDevice);
        works.push_back(job_->recv(recvCounts[p], peer.rank, p2p));
      }
    }
    for (auto& w : works) w->wait();
    for (auto& c : recvCounts)
      if (c.defined()) c = c.cpu();
  }

  // The values (dense parts whole, row-sparse parts by their rows) and the
  // row indices, one message each per direction and pair.
  std::vector<at::Tensor> sent, received(peers_.size()), receivedRows(peers_.size());
  std::vector<std::shared_ptr<Work>> works;
  for (size_t p = 0; p < peers_.size(); ++p) {
    const Peer& peer = peers_[p];
    std::vector<at::Tensor> values, rows;
    size_t sparse = 0;
    for (const Box& b : peer.send) {
      const at::Tensor part = local(b.param, b, grads[b.param]);
      if (held_[b.param].row_sparse) {
        const at::Tensor& r = sendRows[p][sparse++];
        rows.push_back(r);
        values.push_back(part.index_select(0, r.to(part.device())).reshape({-1}).to(onDevice));
      } else {
        values.push_back(part.reshape({-1}).to(onDevice));
      }
    }
    if (!values.empty()) {
      sent.push_back(torch::cat(values));
      if (sent.back().numel() > 0) works.push_back(job_->send(sent.back(), peer.rank, p2p));
      bytes_ += static_cast<double>(sent.back().numel()) * 4;
    }
    if (!rows.empty()) {
      sent.push_back(torch::cat(rows));
      if (sent.back().numel() > 0) works.push_back(job_->send(sent.back(), peer.rank, p2p));
      bytes_ += static_cast<double>(sent.back().numel()) * 8;
    }
    int64_t valueCount = 0, rowCount = 0;
    size_t k = 0;
    for (const Box& b : peer.recv) {
      if (held_[b.param].row_sparse) {
        const int64_t n = recvCounts[p][static_cast<int64_t>(k++)].item<int64_t>();
        rowCount += n;
        valueCount += n * (b.numel() / b.sizes[0]);
      } else {
        valueCount += b.numel();
      }
    }
    if (!peer.recv.empty()) {
      received[p] = torch::empty({valueCount}, onDevice);
      if (valueCount > 0) works.push_back(job_->recv(received[p], peer.rank, p2p));
    }
    if (k > 0) {
      receivedRows[p] = torch::empty({rowCount}, indexOnDevice);
      if (rowCount > 0) works.push_back(job_->recv(receivedRows[p], peer.rank, p2p));
    }
  }
  for (auto& w : works) w->wait();

  // Each parameter's parts by the group they come from.
  std::vector<std::vector<std::vector<Part>>> parts(held_.size(),
                                                    std::vector<std::vector<Part>>(static_cast<size_t>(groups_)));
  for (size_t p = 0; p < peers_.size(); ++p) {
    int64_t at = 0, rowAt = 0;
    size_t k = 0;
    for (const Box& b : peers_[p].recv) {
      if (held_[b.param].row_sparse) {
        const int64_t n = recvCounts[p][static_cast<int64_t>(k++)].item<int64_t>();
        std::vector<int64_t> shape = b.sizes;
        shape[0] = n;
        const int64_t count = volume(shape);
        parts[b.param][static_cast<size_t>(b.group)].push_back(
            Part{&b, received[p].narrow(0, at, count).view(shape), receivedRows[p].narrow(0, rowAt, n)});
        at += count;
        rowAt += n;
      } else {
        parts[b.param][static_cast<size_t>(b.group)].push_back(
            Part{&b, received[p].narrow(0, at, b.numel()).view(b.sizes), at::Tensor()});
        at += b.numel();
      }
    }
  }
  // The same sum in the same order on every rank of every group: zero, then
  // group 0's part, group 1's, ...
  for (size_t i = 0; i < held_.size(); ++i) {
    if (held_[i].row_sparse) {
      sumRows(i, grads[i], parts[i]);
      continue;
    }
    at::Tensor sum = torch::zeros(grads[i].sizes(), onDevice);
    for (int g = 0; g < groups_; ++g) {
      if (g == group_) {
        sum.add_(grads[i].to(onDevice));
        continue;
      }
      for (const Part& part : parts[i][static_cast<size_t>(g)]) local(i, *part.box, sum).add_(part.values);
    }
    grads[i].copy_(sum);
  }
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A row-sparse table's sum, on the rows any group touched only: the same
// additions in the same order as the dense sum makes for those rows (a row
// no group touched stays zero everywhere), without a temporary of the
// table's size.
void CrossGroupGradients::sumRows(size_t param, at::Tensor& grad, const std::vector<std::vector<Part>>& byGroup) const {
  const auto onDevice = torch::TensorOptions().device(device_).dtype(torch::kFloat);
  const std::vector<int64_t>& base = held_[param].offsets;
  // A part's rows in this block's row coordinates.
  auto blockRows = [&](const Part& part) { return part.rows + (part.box->offsets[0] - base[0]); };
  std::vector<at::Tensor> rows{touchedRows(grad).to(device_)};
  for (const auto& parts : byGroup)
    for (const Part& part : parts) rows.push_back(blockRows(part));
  const at::Tensor touched = std::get<0>(at::_unique(torch::cat(rows), /*sorted=*/true));
  if (touched.numel() == 0) return;
  at::Tensor sum = torch::zeros({touched.numel(), grad.size(1)}, onDevice);
  for (int g = 0; g < groups_; ++g) {
    if (g == group_) {
      // Rows this group did not touch add exact zeros, as nothing added.
      sum.add_(grad.index_select(0, touched.to(grad.device())).to(onDevice));
      continue;
    }
    for (const Part& part : byGroup[static_cast<size_t>(g)]) {
      const at::Tensor at = torch::searchsorted(touched, blockRows(part));
      sum.narrow(1, part.box->offsets[1] - base[1], part.box->sizes[1]).index_add_(0, at, part.values);
    }
  }
  grad.index_copy_(0, touched.to(grad.device()), sum.to(grad.device(), grad.scalar_type()));
}

std::map<std::string, double> CrossGroupGradients::stepStats() const {
  return {{"cross_group_bytes", bytes_}, {"cross_group_s", seconds_}};
}

}  // namespace ptrain
