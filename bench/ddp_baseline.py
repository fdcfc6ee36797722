#!/usr/bin/python3
"""The plain-PyTorch baseline for bench/train_step: the same Llama-style model trained with
torch.nn.parallel.DistributedDataParallel over Gloo, N processes spawned here (Debian's
torch.distributed.run fails on Python 3.11). Prints global tokens/s.

    /usr/bin/python3 bench/ddp_baseline.py --ranks 2 --steps 20
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.attn_norm = nn.Parameter(torch.ones(dim))
        self.mlp_norm = nn.Parameter(torch.ones(dim))
        self.q = nn.Linear(dim, heads * self.hd, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(heads * self.hd, dim, bias=False)
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)

    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rotary(self, x):
        s, half = x.shape[2], x.shape[3] // 2
        freq = 10000.0 ** (-torch.arange(half, dtype=x.dtype) * 2.0 / x.shape[3])
        ang = torch.arange(s, dtype=x.dtype)[:, None] * freq[None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm(x, self.attn_norm)
        q = self.rotary(self.q(h).view(b, s, self.heads, self.hd).transpose(1, 2))
        k = self.rotary(self.k(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2))
        v = self.v(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.hd)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(b, s, -1))
        h = self.norm(x, self.mlp_norm)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, ffn):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, ffn) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(dim))
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.out(Block.norm(x, self.norm))


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        Llama(args.vocab, args.dim, args.layers, args.heads, args.kv_heads, args.ffn))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=gen)
        start = time.perf_counter()
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    half = sorted(times[args.steps // 2:])
    ms = half[len(half) // 2] * 1e3
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        tokens = args.batch * args.seq * args.ranks
        print(f"ddp ranks {args.ranks}: {params / 1e6:.2f}M params, median {ms:.1f} ms/step, "
              f"{tokens / (ms / 1e3):.0f} tok/s", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=688)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--port", type=int, default=29731)
    args = p.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    mp.spawn(worker, args=(args, args.port), nprocs=args.ranks)


if __name__ == "__main__":
    main()
