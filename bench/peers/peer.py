"""PyTorch 2.x's own parallelism on the model `hp train` trains (llama.py), N ranks on Gloo,
one intra-op thread each, for bench/peers/compare.sh. Prints global tokens/s last, as
`RESULT peers_<mode>_<N>r <tok/s>`:

    $(scripts/venv_path)/bin/python bench/peers/peer.py --mode ddp --ranks 2 --steps 20
    ... --mode fsdp2 | --mode tp
    ... --config hp.toml   (an hp train config: its model; seq, lr, weight decay, global batch)

  ddp    torch.nn.parallel.DistributedDataParallel; each rank its own 8 sequences
  fsdp2  torch.distributed.fsdp.fully_shard on each block, then on the root; idem
  tp     parallelize_module over all N ranks as one tp mesh: q/k/v and gate/up column-wise,
         o and down row-wise (Megatron's pairs), every rank the same 8 * N sequences

Either way a step trains on 8 * N sequences of 256 tokens: global tokens/s compare across
modes and with hp. AdamW (lr 3e-3 and weight decay 0, as hp's config), float32, random tokens
from a seeded generator. The time of a step is the wall time from the end of one step to the
end of the next, batch included, as hp train measures it between its progress lines (it
also reads the loss back every step); the result is the median over the second half of the
steps (the upper median of an even count, as compare.sh takes hp's), on rank 0.

The ranks are started here with torch.multiprocessing.spawn. torchrun from the venv works
too on Python 3.11 with torch 2.11 (Debian's torch 1.13 did not, hence the old baseline's
spawn), but spawning keeps a run one self-contained command with no launcher agent beside
the ranks on a machine with few cores, and the port is picked free here.
"""
import argparse
import os
import socket
import sys
import time
import tomllib

# Before torch is imported: one OpenMP thread per rank, in the children as well (spawn
# starts them with this environment).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama import Llama, LlamaConfig  # noqa: E402


def parallelize(model, mode, ranks):
    """The model wrapped or sharded for `mode`; plain parameters in, the optimizer's out."""
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh

    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (ranks,), mesh_dim_names=("dp",))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    if mode == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (ranks,), mesh_dim_names=("tp",))
        plan = {
            "attn.q_proj": ColwiseParallel(),
            "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(),
            "attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
        for layer in model.layers:
            parallelize_module(layer, mesh, plan)
        return model
    raise ValueError(f"unknown mode {mode}")


def worker(rank, args, cfg, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)  # the same initial parameters on every rank
    model = parallelize(Llama(cfg), args.mode, args.ranks)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    # ddp, fsdp2: each rank its own sequences; tp: every rank the same 8 * N.
    rows = args.batch * args.ranks if args.mode == "tp" else args.batch
    gen = torch.Generator().manual_seed(args.seed + (0 if args.mode == "tp" else 1 + rank))
    times, losses = [], []
    last = time.perf_counter()
    for _ in range(args.steps):
        ids = torch.randint(0, cfg.vocab, (rows, args.seq + 1), generator=gen)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        now = time.perf_counter()
        times.append(now - last)
        last = now

    if rank == 0:
        half = sorted(times[args.steps // 2:])
        ms = half[len(half) // 2] * 1e3
        tokens = args.batch * args.ranks * args.seq
        print(f"{args.mode} ranks {args.ranks}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
              f"median {ms:.1f} ms/step over steps {args.steps // 2}..{args.steps - 1}", flush=True)
        print(f"RESULT peers_{args.mode}_{args.ranks}r {tokens / (ms / 1e3):.0f}", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description="PyTorch's DDP, FSDP2 or TP on hp's bench Llama; "
                                "prints global tokens/s (see the file's docstring)")
    p.add_argument("--mode", choices=["ddp", "fsdp2", "tp"], default="ddp")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--config", help="an hp train TOML: its [model], and seq, lr and batch (global, so "
                   "batch / ranks per rank) from its [train] (default: the 3.03M bench model)")
    p.add_argument("--batch", type=int, help="sequences per rank (tp: batch * ranks on each); default 8")
    p.add_argument("--seq", type=int, help="default 256")
    p.add_argument("--lr", type=float, help="default 3e-3")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg, train = LlamaConfig(), dict(batch=8 * args.ranks, seq=256, lr=3e-3, weight_decay=0.0)
    if args.config:
        cfg = LlamaConfig.from_toml(args.config)
        with open(args.config, "rb") as f:
            train.update({k: v for k, v in tomllib.load(f).get("train", {}).items() if k in train})
    if train["batch"] % args.ranks:
        p.error(f"the global batch {train['batch']} does not split over {args.ranks} ranks")
    args.batch = args.batch or train["batch"] // args.ranks
    args.seq = args.seq or train["seq"]
    args.lr = args.lr or train["lr"]
    args.weight_decay = train["weight_decay"]
    if args.steps < 2:
        p.error("--steps must be at least 2 (the second half is timed)")
    mp.spawn(worker, args=(args, cfg, free_port()), nprocs=args.ranks)


if __name__ == "__main__":
    main()
