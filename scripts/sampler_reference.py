"""PyTorch's DistributedSampler over a grid of settings, one line per case:

    length replicas rank shuffle seed epoch drop_last : i0 i1 i2 ...

The parity test (tests/data/test_sampler.cpp) runs this with Debian's
python3-torch and compares every line with lockstep::DistributedSampler.
"""
import itertools

from torch.utils.data import DistributedSampler

LENGTHS = [1, 2, 3, 5, 7, 10, 17, 100, 1797]
REPLICAS = [1, 2, 3, 4, 8]
SEEDS = [0, 42]
EPOCHS = [0, 1, 5]

for length, replicas, shuffle, seed, epoch, drop_last in itertools.product(
        LENGTHS, REPLICAS, [True, False], SEEDS, EPOCHS, [False, True]):
    for rank in range(replicas):
        sampler = DistributedSampler(range(length), num_replicas=replicas, rank=rank,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        assert len(indices) == sampler.num_samples
        print(length, replicas, rank, int(shuffle), seed, epoch, int(drop_last), ":",
              " ".join(map(str, indices)))
