"""A small decoder-only transformer served with continuous batching, in the manner of vLLM.

Each engine step runs one forward over a flat batch of tokens: whole prompts or prompt chunks (prefill)
and one token for each running request (decode). Projections and MLPs run once over the whole batch;
attention runs per request against its own KV cache (the decodes together, as a paged-attention kernel
would). Steps are labelled as vLLM labels them, `execute_context_{c}({tokens})_generation_{g}({g})`:
c requests prefilling `tokens` tokens, g decoding.

Without --chunked-prefill, waiting prompts are prefilled whole in steps of their own, and running
requests wait (vLLM's default before chunked prefill). With it, every step has a token budget: decodes
first, then prompt chunks fill what is left (SARATHI), so prefill and decode share steps.

With --async the engine schedules as vLLM V1 does with async scheduling: a step's range only launches its
work, every token stays on the device (the next step's decodes read their input tokens there), and the tokens
of step n are read back, through a non-blocking copy and an event, after step n+1 has been launched. On a GPU
the ranges then close before their kernels run and each range opens while the previous step's kernels still
execute; on CPU every operator runs inside the range that calls it, so the ranges still hold their work.
Either way the steps scheduled, and the tokens served, are the same as without it.

Arrivals are counted in engine steps, not seconds: request i joins the queue before step ⌊i / rate⌋, so
every run of the same settings schedules the same steps whatever the machine's speed. The model is kept
to few operators per step so that a profile of a whole run stays small.

Request events. The engine marks each request's life in the trace with ``record_function`` ranges that it
opens and closes at once (torch 2.13's profiler offers no instant event of its own: a range survives into the
Kineto JSON as a ``user_annotation``), so an event's time is its range's start and its length means nothing.
Any engine can emit the same names; ``pipebubble.analysis.serving.requests_from_trace`` reads them back. A name is
``request:{event} id={id}`` and then ``key=value`` fields, separated by single spaces (the id holds no space):

- ``request:arrival id=R prompt=N``: R reached the engine with an N-token prompt and joined its waiting queue.
- ``request:scheduled id=R``: R left the queue; its first prefill step begins (queue end, prefill start).
- ``request:prefill id=R tokens=N``, ``request:decode id=R``: R takes part in the engine step whose range
  holds the event, prefilling N prompt tokens or decoding one; a request's prefill ends with its last
  prefill step.
- ``request:kv_alloc id=R blocks=N used=U``: N KV-cache blocks given to R for this step (here 16 tokens a
  block, as vLLM's default); U blocks are in use across the cache after it.
- ``request:kv_free id=R blocks=N used=U``: R's N blocks released (it finished, or an engine evicted it).
- ``request:first_token id=R``: R's first output token reached the host.
- ``request:completion id=R tokens=N``: its last one did, N tokens in all.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field

import numpy as np

D_MODEL, HEADS, LAYERS, VOCAB, MAX_LEN = 512, 8, 1, 2048, 1024
HEAD_DIM = D_MODEL // HEADS
PROMPT_TOKENS, OUTPUT_TOKENS = (512, 740), (6, 12)  # prompts 2-3x the 256-token budget of the samples
MAX_PREFILL_TOKENS = 2048  # per step without chunked prefill
BLOCK_TOKENS = 16  # tokens per KV-cache block in the request events (vLLM's default block size)


@dataclass
class Request:
    slot: int
    prompt: list[int]
    max_new: int
    arrival: int  # the engine step before which it joins the queue
    prefilled: int = 0
    generated: int = 0
    last_token: int = 0
    blocks: int = 0  # KV-cache blocks held
    output: list[int] = field(default_factory=list)

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt)


def mark(name: str) -> None:
    """One request event (see the module docstring): a range opened and closed at once."""
    from torch.profiler import record_function

    with record_function(name):
        pass


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipebubble.capture.workloads.serve")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--arrival-rate", type=float, default=0.25,
                        help="new requests per engine step (0.25: one every 4 steps); deterministic")
    parser.add_argument("--chunked-prefill", type=int, default=0, help="token budget per step; 0 = off")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--async", dest="async_steps", action="store_true",
                        help="launch each step without waiting for it; read its tokens back after the next")
    parser.add_argument("--print-tokens", action="store_true", help="print every request's generated tokens")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_requests(args) -> list[Request]:
    rng = random.Random(args.seed)
    return [Request(slot, [rng.randrange(VOCAB) for _ in range(rng.randint(*PROMPT_TOKENS))],
                    rng.randint(*OUTPUT_TOKENS), int(slot / args.arrival_rate)) for slot in range(args.requests)]


class Model:
    """A parallel-block decoder (attention and MLP read one shared layer norm, as in GPT-J and PaLM) with
    bias-free weights applied by plain matrix products: few profiler events per step."""

    def __init__(self, device, slots: int, non_blocking: bool = False):
        import torch

        self.torch, self.device = torch, device
        # Pinned host buffers copied without blocking the host: what an async engine does on a GPU.
        self.non_blocking = non_blocking and device.type == "cuda"
        gen = torch.Generator().manual_seed(0)

        def weight(*shape):
            return (torch.randn(*shape, generator=gen) / shape[0] ** 0.5).to(device)

        self.embed, self.head = weight(VOCAB, D_MODEL), weight(D_MODEL, VOCAB)
        self.layers = [(weight(D_MODEL, 3 * D_MODEL), weight(D_MODEL, D_MODEL), weight(D_MODEL, 4 * D_MODEL),
                        weight(4 * D_MODEL, D_MODEL)) for _ in range(LAYERS)]
        # One KV cache per layer: (slot, position) rows of keys and values, written by one index_copy_ a step.
        self.caches = [torch.zeros(slots, MAX_LEN, 2, HEADS, HEAD_DIM, device=device) for _ in range(LAYERS)]

    def tensor(self, array: np.ndarray):
        t = self.torch.from_numpy(array)
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True) if self.non_blocking else t.to(self.device)

    def forward(self, tokens, decodes, prefills):
        """Next token (a device tensor) of every decode and of every prompt chunk; `tokens` are the input ids
        (a list, or a device tensor), `decodes` (slot, position) pairs, `prefills` (slot, first position,
        tokens), in the order their tokens appear in `tokens`."""
        slot = np.array([s for s, _ in decodes] + [s for s, _, n in prefills for _ in range(n)])
        pos = np.array([p for _, p in decodes] + [p for _, start, n in prefills for p in range(start, start + n)])
        at = self.tensor(slot * MAX_LEN + pos)
        x = self.embed[tokens if isinstance(tokens, self.torch.Tensor) else self.tensor(np.array(tokens))]
        for weights, cache in zip(self.layers, self.caches, strict=True):
            x = self.layer(x, weights, cache, at, decodes, prefills)
        ends = np.cumsum([1] * len(decodes) + [n for _, _, n in prefills]) - 1
        return self.torch.mm(x[self.tensor(ends)], self.head).argmax(-1)  # no final norm: fewer events

    def to_host(self, values):
        """A non-blocking copy of `values` to the host and the event that marks it done (None on CPU)."""
        if self.device.type == "cpu":
            return values, None
        host = values.to("cpu", non_blocking=True)
        event = self.torch.cuda.Event()
        event.record()
        return host, event

    def layer(self, x, weights, cache, at, decodes, prefills):
        mm, f = self.torch.mm, self.torch.nn.functional
        w_qkv, w_out, w_up, w_down = weights
        h = f.layer_norm(x, (D_MODEL,))
        qkv = mm(h, w_qkv).view(-1, 3, HEADS, HEAD_DIM)
        cache.view(-1, 2, HEADS, HEAD_DIM).index_copy_(0, at, qkv[:, 1:])
        q = qkv[:, 0]
        outs = [self.attend_decodes(q[:len(decodes)], cache, decodes)] if decodes else []
        offset = len(decodes)
        for slot, start, n in prefills:
            outs.append(self.attend_prefill(q[offset:offset + n], cache, slot, start))
            offset += n
        attended = outs[0] if len(outs) == 1 else self.torch.cat(outs)
        return x + mm(attended, w_out) + mm(f.gelu(mm(h, w_up)), w_down)

    def attend(self, q, kv, visible: np.ndarray):
        """Softmax attention of q (batch, queries, dim) over kv (2, batch, keys, dim); `visible`
        (queries, keys), or per batch row, says which keys each query sees."""
        bias = self.tensor(np.where(visible, 0.0, -np.inf).astype(np.float32))
        scores = self.torch.baddbmm(bias, q, kv[0].transpose(1, 2), alpha=HEAD_DIM ** -0.5)
        return self.torch.bmm(scores.softmax(-1), kv[1])

    def attend_decodes(self, q, cache, decodes):
        """All decodes in one call over their caches padded to the longest, each query masked to its own."""
        positions = np.repeat([p for _, p in decodes], HEADS)
        ctx = int(positions.max()) + 1
        kv = cache[self.tensor(np.array([s for s, _ in decodes])), :ctx]  # (g, ctx, 2, heads, dim)
        kv = kv.permute(2, 0, 3, 1, 4).reshape(2, -1, ctx, HEAD_DIM)
        visible = np.arange(ctx)[None, None, :] <= positions[:, None, None]
        return self.attend(q.reshape(-1, 1, HEAD_DIM), kv, visible).view(-1, D_MODEL)

    def attend_prefill(self, q, cache, slot, start):
        """One prompt (or chunk) against its cache: causal, offset by the chunk's start."""
        n = q.shape[0]
        kv = cache[slot, :start + n].permute(1, 2, 0, 3)  # (2, heads, keys, dim)
        visible = np.arange(start + n)[None, :] <= np.arange(start, start + n)[:, None]
        return self.attend(q.transpose(0, 1), kv, visible).transpose(0, 1).reshape(n, D_MODEL)


class Engine:
    def __init__(self, args, requests, device):
        self.chunk = args.chunked_prefill
        self.async_steps = args.async_steps
        self.model = Model(device, len(requests), non_blocking=args.async_steps)
        self.pending, self.running = list(requests), []
        self.kv_used = 0  # KV-cache blocks held by all requests
        self.in_flight = None  # --async: (host tokens, event, [(index, request)]) of the step last launched
        if self.async_steps:
            self.last_tokens = self.model.torch.zeros(len(requests), dtype=self.model.torch.long, device=device)

    def schedule(self) -> list[tuple[Request, int]]:
        """(request, tokens this step) for one step."""
        decodes = [(r, 1) for r in self.running if r.decoding]
        prefills = [r for r in self.running if not r.decoding]
        if not self.chunk:
            # Prefill first, whole prompts, in a step of their own; decodes wait.
            batch, total = [], 0
            for r in prefills:
                if batch and total + len(r.prompt) > MAX_PREFILL_TOKENS:
                    break
                batch.append((r, len(r.prompt)))
                total += len(r.prompt)
            return batch or decodes
        batch, budget = decodes[:self.chunk], self.chunk - min(len(decodes), self.chunk)
        for r in prefills:
            if budget <= 0:
                break
            take = min(budget, len(r.prompt) - r.prefilled)
            batch.append((r, take))
            budget -= take
        return batch

    def step(self, scheduled) -> None:
        from torch.profiler import record_function

        decodes = [r for r, _ in scheduled if r.decoding]
        prefills = [(r, n) for r, n in scheduled if not r.decoding]
        label = (f"execute_context_{len(prefills)}({sum(n for _, n in prefills)})"
                 f"_generation_{len(decodes)}({len(decodes)})")
        positions = [(r.slot, len(r.prompt) + r.generated - 1) for r in decodes]
        chunks = [(r.slot, r.prefilled, n) for r, n in prefills]
        with record_function(label), self.model.torch.inference_mode():
            self.mark_step(decodes, prefills)
            if self.async_steps:
                self.in_flight, previous = self.launch(decodes, prefills, positions, chunks), self.in_flight
            else:
                tokens = [r.last_token for r in decodes] + [t for r, n in prefills
                                                            for t in r.prompt[r.prefilled:r.prefilled + n]]
                # tolist() at the end waits for the device
                next_tokens = self.model.forward(tokens, positions, chunks).tolist()
        for r, n in prefills:
            r.prefilled += n
        for i, r in enumerate(decodes + [r for r, _ in prefills]):
            if r.decoding:  # a finished prompt yields its first token too
                r.generated += 1
                if not self.async_steps:
                    self.received(r, next_tokens[i])
        if self.async_steps:
            self.read_back(previous)
        for r in self.running:
            if r.generated == r.max_new:
                self.release(r)
        self.running = [r for r in self.running if r.generated < r.max_new]

    def mark_step(self, decodes, prefills) -> None:
        """Each request's part in the step about to run, and the KV-cache blocks it takes for it."""
        for r, n in prefills:
            if not r.prefilled:
                mark(f"request:scheduled id={r.slot}")
            self.allocate(r, r.prefilled + n)
            mark(f"request:prefill id={r.slot} tokens={n}")
        for r in decodes:
            self.allocate(r, len(r.prompt) + r.generated)
            mark(f"request:decode id={r.slot}")

    def allocate(self, r: Request, positions: int) -> None:
        """Blocks enough for `positions` cached tokens of `r`: the step's new ones, if any."""
        new = -(-positions // BLOCK_TOKENS) - r.blocks
        if new > 0:
            r.blocks += new
            self.kv_used += new
            mark(f"request:kv_alloc id={r.slot} blocks={new} used={self.kv_used}")

    def release(self, r: Request) -> None:
        """A finished request's blocks back to the cache."""
        self.kv_used -= r.blocks
        mark(f"request:kv_free id={r.slot} blocks={r.blocks} used={self.kv_used}")
        r.blocks = 0

    @staticmethod
    def received(r: Request, token: int) -> None:
        """A token of `r` on the host: its first and its last are request events."""
        r.last_token = token
        r.output.append(token)
        if len(r.output) == 1:
            mark(f"request:first_token id={r.slot}")
        if len(r.output) == r.max_new:
            mark(f"request:completion id={r.slot} tokens={len(r.output)}")

    def launch(self, decodes, prefills, positions, chunks):
        """--async: the step's work, launched: input tokens gathered on the device, next tokens written back
        there for the next step and copied to the host without waiting."""
        torch, model = self.model.torch, self.model
        parts = [self.last_tokens[model.tensor(np.array([r.slot for r in decodes]))]] if decodes else []
        prompt = [t for r, n in prefills for t in r.prompt[r.prefilled:r.prefilled + n]]
        parts += [model.tensor(np.array(prompt))] if prompt else []
        next_tokens = model.forward(parts[0] if len(parts) == 1 else torch.cat(parts), positions, chunks)
        owners = [(i, r) for i, r in enumerate(decodes)]
        owners += [(len(decodes) + i, r) for i, (r, n) in enumerate(prefills) if r.prefilled + n == len(r.prompt)]
        if owners:  # (a prompt chunk that does not finish its prompt yields no token)
            index = model.tensor(np.array([i for i, _ in owners]))
            slots = model.tensor(np.array([r.slot for _, r in owners]))
            self.last_tokens.index_copy_(0, slots, next_tokens[index])
        return (*model.to_host(next_tokens), owners)

    def read_back(self, in_flight) -> None:
        """--async: the tokens of a step launched before, once its copy is done (waits for that step only)."""
        if in_flight is None:
            return
        host, event, owners = in_flight
        if event is not None:
            event.synchronize()
        values = host.tolist()
        for i, r in owners:
            self.received(r, values[i])

    def run(self) -> int:
        """Serve every request; the step counter jumps ahead when nothing is running."""
        steps = 0
        while self.pending or self.running:
            if not self.running:
                steps = max(steps, self.pending[0].arrival)
            while self.pending and self.pending[0].arrival <= steps:
                r = self.pending.pop(0)
                mark(f"request:arrival id={r.slot} prompt={len(r.prompt)}")
                self.running.append(r)
            self.step(self.schedule())
            steps += 1
        self.read_back(self.in_flight)
        return steps


def main(argv: list[str]) -> int:
    args = parse(argv)
    import torch

    if args.device == "cpu":
        torch.set_num_threads(1)  # step times that do not depend on how many cores are free
    requests = make_requests(args)
    engine = Engine(args, requests, torch.device(args.device))
    steps = engine.run()
    print(f"served {len(requests)} requests in {steps} steps")
    if args.print_tokens:
        for r in requests:
            print(r.slot, *r.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
