#include "lockstep/distributed/ring_allreduce.h"

#include <ATen/ATen.h>

namespace lockstep {

void ring_allreduce(ProcessGroup& pg, at::Tensor& tensor) {
  const int n = pg.size();
  if (n == 1) return;
  const int r = pg.rank();
  const int right = (r + 1) % n;
  const int left = (r + n - 1) % n;
  auto flat = tensor.view({-1});
  const int64_t numel = flat.numel();
  // Chunk c is [bounds[c], bounds[c+1]); the first numel % n chunks get one more.
  std::vector<int64_t> bounds{0};
  for (int c = 0; c < n; ++c) bounds.push_back(bounds.back() + numel / n + (c < numel % n ? 1 : 0));
  auto chunk = [&](int c) {
    c = ((c % n) + n) % n;
    return flat.slice(0, bounds[c], bounds[c + 1]);
  };
  const int64_t largest = numel / n + (numel % n ? 1 : 0);
  auto inbox = at::empty({largest}, flat.options());
  for (int phase = 0; phase < 2; ++phase) {
    for (int s = 0; s < n - 1; ++s) {
      const int send_c = phase == 0 ? r - s : r + 1 - s;
      const int recv_c = phase == 0 ? r - s - 1 : r - s;
      auto outgoing = chunk(send_c).contiguous();
      auto incoming = inbox.slice(0, 0, chunk(recv_c).numel());
      const int tag = phase * n + s;
      // An empty chunk (numel < n) is neither sent nor received: the left
      // neighbour's send index is this rank's receive index, so both skip it.
      Ptr<C10dWork> sent, received;
      if (outgoing.numel() > 0) sent = pg.send_async(outgoing, right, tag);
      if (incoming.numel() > 0) received = pg.recv_async(incoming, left, tag);
      pg.wait(received, "ring all-reduce recv (phase " + std::to_string(phase) + ", step " +
                            std::to_string(s) + ")");
      pg.wait(sent, "ring all-reduce send (phase " + std::to_string(phase) + ", step " +
                        std::to_string(s) + ")");
      auto target = chunk(recv_c);
      if (phase == 0) {
        target.add_(incoming);
      } else {
        target.copy_(incoming);
      }
    }
  }
}

}  // namespace lockstep
