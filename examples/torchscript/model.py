"""The model, defined in Python: scripted for C++, and loaded back to evaluate.

    python3 model.py save DIR     # DIR/model.ts (TorchScript) and DIR/data.pt
    python3 model.py eval DIR     # loads DIR/trained.pt into the Python module
"""
import collections
import sys

import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU())
        self.head = torch.nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.features(x))


def data():
    # Three classes, each around its own centre in 16 dimensions.
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (600,), generator=g)
    centres = torch.randn(3, 16, generator=g) * 0.5
    x = centres[y] + torch.randn(600, 16, generator=g)
    return x, y


def main(command, folder):
    x, y = data()
    if command == "save":
        torch.manual_seed(0)
        torch.jit.script(Net()).save(f"{folder}/model.ts")
        torch.save(collections.OrderedDict(x=x, y=y), f"{folder}/data.pt")
        return
    net = Net()
    net.load_state_dict(torch.load(f"{folder}/trained.pt"))  # every key, strict
    net.eval()
    with torch.no_grad():
        out = net(x)
    print(f"python: loss {F.cross_entropy(out, y).item():.6f} "
          f"accuracy {(out.argmax(1) == y).double().mean().item():.4f}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
