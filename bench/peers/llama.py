"""The Llama that `hp train` trains (src/hp/nn/transformer.cpp), in plain PyTorch 2.x.

Same parameters, same shapes, same FLOPs: bias-free linears, RMSNorm with a learned scale
(eps from [model] norm_eps, 1e-6 by default as in hp), rotary embeddings on the
two halves of each head (theta 10000 unless the config says otherwise), grouped-query
attention with a causal mask, a SwiGLU MLP, and an output head of its own unless
tied_embeddings. Module names follow hp's (q_proj, gate_proj, ...) so that the tensor
parallel plan in peer.py reads like hp's llama_recipe.cpp.

Nothing here knows about parallelism: the attention views its projections with -1 heads,
so the same code runs on the heads a rank holds once ColwiseParallel has split q/k/v.
Call the model itself (forward) and take the loss outside: DDP and fully_shard hook
forward, not other methods.

Run alone, it prints the parameter count of an hp train config's model (default: the
bench model), on the torch model and by hp's module shapes; compare.sh checks them equal:

    $(scripts/venv_path)/bin/python bench/peers/llama.py [hp.toml]
"""
import dataclasses
import tomllib

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class LlamaConfig:  # hp::nn::LlamaConfig, with the bench model's sizes as defaults
    vocab: int = 256
    dim: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    ffn_dim: int = 688
    max_seq: int = 256
    rope_theta: float = 10000.0
    tied_embeddings: bool = False
    norm_eps: float = 1e-6

    @property
    def head_dim(self):
        return self.dim // self.heads

    @classmethod
    def from_toml(cls, path):
        """The [model] section of an hp train config; absent keys take hp's defaults
        (src/hp/nn/llama_config.h), which the bench sizes here are not: read them all."""
        with open(path, "rb") as f:
            model = tomllib.load(f).get("model", {})
        hp_defaults = dict(vocab=256, dim=128, layers=4, heads=4, kv_heads=2, ffn_dim=384, max_seq=128)
        unknown = set(model) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"{path}: [model] keys this model does not know: {sorted(unknown)}")
        return cls(**{**hp_defaults, **model})

    def param_count(self):
        """By formula, as hp's modules register them (the check against the torch model)."""
        d, hd = self.dim, self.head_dim
        attn = d * self.heads * hd + 2 * d * self.kv_heads * hd + self.heads * hd * d
        block = attn + 3 * d * self.ffn_dim + 2 * d  # + attn_norm, mlp_norm
        head = 0 if self.tied_embeddings else d * self.vocab
        return self.vocab * d + self.layers * block + d + head


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rotary(x, theta):
    """x: [B, H, S, Dh]; the first and second halves of each head as the pairs (hp's
    apply_rotary)."""
    s, half = x.shape[2], x.shape[3] // 2
    freq = theta ** (-torch.arange(half, dtype=x.dtype) * (2.0 / x.shape[3]))
    angle = torch.arange(s, dtype=x.dtype)[:, None] * freq[None, :]  # [S, half]
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        hd = c.head_dim
        self.q_proj = nn.Linear(c.dim, c.heads * hd, bias=False)
        self.k_proj = nn.Linear(c.dim, c.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(c.dim, c.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.heads * hd, c.dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        hd = self.c.head_dim

        def heads(proj):  # -1: the heads this rank holds (all of them without tp)
            return proj(x).view(b, s, -1, hd).transpose(1, 2)

        q = apply_rotary(heads(self.q_proj), self.c.rope_theta)
        k = apply_rotary(heads(self.k_proj), self.c.rope_theta)
        v = heads(self.v_proj)
        # enable_gqa: k and v keep their kv heads, each serving heads / kv_heads query heads
        # (hp repeats them; the same arithmetic). Default scale 1 / sqrt(Dh), as hp's.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.up_proj = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.down_proj = nn.Linear(c.ffn_dim, c.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.attn_norm = RMSNorm(c.dim, c.norm_eps)
        self.attn = Attention(c)
        self.mlp_norm = RMSNorm(c.dim, c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.mlp_norm(h))


class Llama(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(TransformerBlock(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = None if c.tied_embeddings else nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, ids):
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return self.output(x) if self.output is not None else F.linear(x, self.tok_embeddings.weight)


if __name__ == "__main__":
    import sys

    config = LlamaConfig.from_toml(sys.argv[1]) if len(sys.argv) > 1 else LlamaConfig()
    print(f"RESULT peers_params_torch {sum(p.numel() for p in Llama(config).parameters())}")
    print(f"RESULT peers_params_hp_shapes {config.param_count()}")
