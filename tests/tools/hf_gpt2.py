"""transformers' side of ptrain's GPT-2 interop tests (tests/unit/test_hf_gpt2.cpp).

  hf_gpt2.py make DIR HIDDEN LAYERS HEADS VOCAB POSITIONS TOKENS OUT.json
      saves a randomly initialised GPT2LMHeadModel to DIR with save_pretrained
      (safetensors) and writes its logits on TOKENS to OUT.json
  hf_gpt2.py logits DIR TOKENS OUT.json
      loads DIR with GPT2LMHeadModel.from_pretrained and writes its logits

TOKENS: comma-separated ids, one sequence. Logits: float32, [T, vocab].
"""
import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def logits_of(model, tokens):
    model.eval()
    with torch.no_grad():
        ids = torch.tensor([tokens], dtype=torch.long)
        return model(ids).logits[0].float().tolist()


def main():
    mode = sys.argv[1]
    if mode == "make":
        out_dir, hidden, layers, heads, vocab, positions, tokens, out = sys.argv[2:10]
        torch.manual_seed(1234)
        config = GPT2Config(n_embd=int(hidden), n_layer=int(layers), n_head=int(heads), vocab_size=int(vocab),
                            n_positions=int(positions), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(config)
        # Biases and LayerNorms away from their initial 0 and 1, so a mapping
        # that mixes them up shows.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias") or ".ln_" in name or "ln_f" in name:
                    p.add_(torch.randn_like(p) * 0.1)
        model.save_pretrained(out_dir, safe_serialization=True)
    elif mode == "logits":
        out_dir, tokens, out = sys.argv[2:5]
        model = GPT2LMHeadModel.from_pretrained(out_dir)
    else:
        raise SystemExit("unknown mode " + mode)
    ids = [int(t) for t in tokens.split(",")]
    with open(out, "w") as f:
        json.dump(logits_of(model, ids), f)


if __name__ == "__main__":
    main()
