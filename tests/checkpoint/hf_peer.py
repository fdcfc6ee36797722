"""The Hugging Face side of the transformers round trip (tests/checkpoint/transformers_test.cpp).

  hf_peer.py logits DIR TOKENS OUT   logits of LlamaForCausalLM.from_pretrained(DIR) on TOKENS
  hf_peer.py make DIR CONFIG SEED    a randomly initialised LlamaForCausalLM saved to DIR

TOKENS: int64 [B, S] with a header line "B S"; OUT: float32 [B, S, V] raw. CONFIG: JSON of
LlamaConfig arguments. Float32, eager attention, offline.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def read_tokens(path):
    with open(path, "rb") as f:
        b, s = map(int, f.readline().split())
        return torch.from_numpy(np.frombuffer(f.read(), dtype=np.int64).reshape(b, s).copy())


def logits(model_dir, tokens_path, out_path):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(read_tokens(tokens_path)).logits
    out.numpy().astype(np.float32).tofile(out_path)


def make(model_dir, config_json, seed):
    torch.manual_seed(int(seed))
    config = LlamaConfig(**json.loads(config_json), hidden_act="silu", attention_bias=False, mlp_bias=False)
    model = LlamaForCausalLM(config).to(torch.float32)
    # Norm weights away from 1, so that loading them is checked too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(model_dir, safe_serialization=True)


if __name__ == "__main__":
    {"logits": logits, "make": make}[sys.argv[1]](*sys.argv[2:])
