"""A small decoder-only transformer served with continuous batching, in the manner of vLLM.

Each engine step runs one forward over a flat batch of tokens: whole prompts or prompt chunks (prefill)
and one token for each running request (decode). Projections and MLPs run once over the whole batch;
attention runs per request against its own KV cache. Steps are labelled as vLLM labels them,
`execute_context_{c}({tokens})_generation_{g}({g})`: c requests prefilling `tokens` tokens, g decoding.

Without --chunked-prefill, waiting prompts are prefilled whole in steps of their own, and running
requests wait (vLLM's default before chunked prefill). With it, every step has a token budget: decodes
first, then prompt chunks fill what is left (SARATHI), so prefill and decode share steps.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from dataclasses import dataclass

D_MODEL, HEADS, LAYERS, VOCAB, MAX_LEN = 256, 4, 2, 2048, 512
PROMPT_TOKENS, OUTPUT_TOKENS = (32, 384), (8, 16)
MAX_PREFILL_TOKENS = 2048  # per step without chunked prefill


@dataclass
class Request:
    slot: int
    prompt: list[int]
    max_new: int
    arrival: float
    prefilled: int = 0
    generated: int = 0
    last_token: int = 0

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipebubble.capture.workloads.serve")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--arrival-rate", type=float, default=20.0, help="requests per second (Poisson)")
    parser.add_argument("--chunked-prefill", type=int, default=0, help="token budget per step; 0 = off")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def make_requests(args) -> list[Request]:
    rng = random.Random(args.seed)
    requests, arrival = [], 0.0
    for slot in range(args.requests):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(*PROMPT_TOKENS))]
        requests.append(Request(slot, prompt, rng.randint(*OUTPUT_TOKENS), arrival))
        arrival += rng.expovariate(args.arrival_rate)
    return requests


@dataclass
class Batch:
    """One step's flat batch: the decode tokens first (one per request), then the prompt chunks."""
    decode_slots: list[int]
    decode_positions: list[int]
    prefills: list[tuple[int, int, int]]  # (slot, first position, tokens)


def build_model(device):
    import torch
    from torch import nn
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    head_dim = D_MODEL // HEADS

    def attend_decodes(q, k, v, cache_k, cache_v, slots, positions):
        # All decodes in one attention call over their caches padded to the longest (as a paged-attention
        # kernel would): each query sees its own request's keys up to its position.
        cache_k[slots, positions], cache_v[slots, positions] = k, v
        ctx = int(positions.max()) + 1
        keys, values = cache_k[slots, :ctx].transpose(1, 2), cache_v[slots, :ctx].transpose(1, 2)
        mask = torch.arange(ctx, device=q.device)[None, :] <= positions[:, None]
        return sdpa(q[:, :, None, :], keys, values, attn_mask=mask[:, None, None, :]).reshape(-1, D_MODEL)

    def attend_prefill(q, k, v, cache_k, cache_v, slot, start):
        n = q.shape[0]
        cache_k[slot, start:start + n], cache_v[slot, start:start + n] = k, v
        keys, values = cache_k[slot, :start + n].transpose(0, 1), cache_v[slot, :start + n].transpose(0, 1)
        if start == 0:  # a whole prompt, or its first chunk: plain causal attention
            out = sdpa(q.transpose(0, 1)[None], keys[None], values[None], is_causal=True)[0]
        else:  # a later chunk: causal, offset by the chunk's start
            positions = torch.arange(start + n, device=q.device)
            mask = positions[None, :] <= positions[start:, None]
            out = sdpa(q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask)[0]
        return out.transpose(0, 1).reshape(n, D_MODEL)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
            self.qkv, self.out = nn.Linear(D_MODEL, 3 * D_MODEL), nn.Linear(D_MODEL, D_MODEL)
            self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

        def forward(self, x, batch, slots, positions, cache_k, cache_v):
            q, k, v = self.qkv(self.norm1(x)).view(-1, 3, HEADS, head_dim).unbind(1)
            g = len(batch.decode_slots)
            outs = [attend_decodes(q[:g], k[:g], v[:g], cache_k, cache_v, slots, positions)] if g else []
            offset = g
            for slot, start, n in batch.prefills:
                span = slice(offset, offset + n)
                outs.append(attend_prefill(q[span], k[span], v[span], cache_k, cache_v, slot, start))
                offset += n
            x = x + self.out(torch.cat(outs))
            return x + self.mlp(self.norm2(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.norm = nn.Embedding(VOCAB, D_MODEL), nn.LayerNorm(D_MODEL)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

        def forward(self, tokens, batch, caches):
            slots = torch.tensor(batch.decode_slots, device=tokens.device)
            positions = torch.tensor(batch.decode_positions, device=tokens.device)
            x = self.embed(tokens)
            for layer, (cache_k, cache_v) in zip(self.layers, caches, strict=True):
                x = layer(x, batch, slots, positions, cache_k, cache_v)
            g = len(batch.decode_slots)
            ends = list(range(g)) + [g - 1 + n for n in itertools.accumulate(n for _, _, n in batch.prefills)]
            return self.head(self.norm(x[ends])).argmax(-1)  # greedy: one next token per request

    torch.manual_seed(0)
    return Decoder().to(device).eval()


class Engine:
    def __init__(self, args, requests, device):
        import torch

        self.torch, self.device, self.chunk = torch, device, args.chunked_prefill
        self.model = build_model(device)
        shape = (len(requests), MAX_LEN, HEADS, D_MODEL // HEADS)
        self.caches = [(torch.zeros(shape, device=device), torch.zeros(shape, device=device)) for _ in range(LAYERS)]
        self.pending, self.running = list(requests), []

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
        with record_function(label):
            batch = Batch([r.slot for r in decodes], [len(r.prompt) + r.generated - 1 for r in decodes],
                          [(r.slot, r.prefilled, n) for r, n in prefills])
            tokens = [r.last_token for r in decodes] + [t for r, n in prefills
                                                        for t in r.prompt[r.prefilled:r.prefilled + n]]
            with self.torch.inference_mode():
                ids = self.torch.tensor(tokens, device=self.device)
                next_tokens = self.model(ids, batch, self.caches).tolist()  # tolist waits for the device
        for r, n in prefills:
            r.prefilled += n
        for r, token in zip(decodes + [r for r, _ in prefills], next_tokens, strict=True):
            if r.decoding:  # a finished prompt yields its first token too
                r.generated, r.last_token = r.generated + 1, token
        self.running = [r for r in self.running if r.generated < r.max_new]

    def run(self) -> int:
        start, steps = time.perf_counter(), 0
        while self.pending or self.running:
            now = time.perf_counter() - start
            while self.pending and self.pending[0].arrival <= now:
                self.running.append(self.pending.pop(0))
            if not self.running:
                time.sleep(self.pending[0].arrival - now)
                continue
            self.step(self.schedule())
            steps += 1
        return steps


def main(argv: list[str]) -> int:
    args = parse(argv)
    import torch

    requests = make_requests(args)
    engine = Engine(args, requests, torch.device(args.device))
    steps = engine.run()
    print(f"served {len(requests)} requests in {steps} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
