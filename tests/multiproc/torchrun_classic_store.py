"""The stock torchrun, with its TCPStore on the classic server.

Debian 13's python3-torch 2.6 is built without libuv, yet TCPStore defaults
to use_libuv=True and torchrun's rendezvous handlers do not pass the flag (nor
read USE_LIBUV), so the stock `torchrun` fails before starting any worker:
"use_libuv was requested but PyTorch was build without libuv support".
This runs the same torch.distributed.run.main() with TCPStore defaulting to
use_libuv=False; everything else (agent, rendezvous, agent store, restarts)
is torchrun's own. tests/multiproc/torchrun.sh uses it only when the stock
store cannot start.
"""
import sys

import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore as _TCPStore


class TCPStore(_TCPStore):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        super().__init__(*args, **kwargs)


dist.TCPStore = TCPStore
import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static_rdzv  # noqa: E402
import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_rdzv  # noqa: E402

static_rdzv.TCPStore = TCPStore
c10d_rdzv.TCPStore = TCPStore
from torch.distributed.run import main  # noqa: E402

sys.exit(main())
