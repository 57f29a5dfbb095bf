"""A toy training loop for the README's first command: `pipebubble capture -- python sample_traces/toy_train.py`.

Nothing in it knows about pipebubble: capture finds the optimizer steps by itself, and the
record_function labels show up in the trace as named ranges.
"""

import torch
from torch import nn
from torch.profiler import record_function

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randn(64, 256)
labels = torch.randint(0, 10, (64,))

for step in range(6):
    with record_function("data"):
        x, y = data + 0.01 * torch.randn_like(data), labels
    with record_function("forward"):
        loss = nn.functional.cross_entropy(model(x), y)
    with record_function("backward"):
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step} loss {loss.item():.3f}")
