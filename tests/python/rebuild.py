"""Rebuilds a lockstep model in PyTorch from docs/models.md's own Python
blocks, loads a checkpoint's model.pt and prints the validation accuracy and
loss on the documented split of the digits:

    rebuild.py DOC DIGITS_CSV_GZ KIND CHECKPOINT_MODEL_PT 'JSON model arguments'

KIND: mlp | cnn | resnet | transformer. Output: "<accuracy> <loss>"."""
import json
import re
import sys

doc, digits_path, kind, checkpoint, arguments = sys.argv[1:6]
code = "\n".join(re.findall(r"```python\n(.*?)```", open(doc).read(), re.S))
ns = {}
exec(code, ns)
features, targets = ns["digits"](digits_path)
_, (vx, vy) = ns["split"](features, targets, 0.2, 0)
args = json.loads(arguments)
if kind == "mlp":
    model = ns["Mlp"](64, 10, **args)
elif kind == "cnn":
    model = ns["Cnn"]([1, 8, 8], 10, **args)
elif kind == "resnet":
    model = ns["ResNet"]([1, 8, 8], 10, **args)
else:
    model = ns["Transformer"](64, 10, **args)
loss, accuracy = ns["evaluate"](model, checkpoint, vx, vy)
print(f"{accuracy:.6f} {loss:.8f}")
