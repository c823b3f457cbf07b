"""test/oracle_bert.py — writes the reference tensors test_bert compares against, computed by Hugging
Face transformers' BertForMaskedLM, BertForSequenceClassification and BertModel (PyTorch, CPU), the
oracle for model-level correctness.

A tiny BERT (2 layers, 64 channels, 4 heads, intermediate 128, 64 positions, vocabulary 500 — not a
multiple of 128 —, 2 token types, 3 labels) with random weights (biases and LayerNorm parameters
perturbed away from transformers' 0/1 initialization so that they matter), and one batch of 4
sequences of different lengths (64, 37, 9 and 1 valid tokens, padded with [PAD] = 0 and attention_mask
0; token types 0 then 1 in the longer ones), with about 15% of the valid tokens masked for MLM:
  test/fixtures/bert_tiny_mlm/            BertForMaskedLM.save_pretrained (model.safetensors, config.json)
  test/fixtures/bert_tiny_cls/            BertForSequenceClassification.save_pretrained (the same encoder)
  test/fixtures/bert_tiny_mlm_grads.safetensors   every parameter's gradient of the MLM loss, named as
  test/fixtures/bert_tiny_cls_grads.safetensors   the model's own tensors (so the C side maps both alike)
  test/fixtures/bert_tiny_batch.safetensors  the batch (I32), the MLM logits at the masked positions
                                          (M, V) in (b, t) order, both losses, the classification logits,
                                          and the losses of 10 AdamW steps of each head
When dev/data/bert/minilm/ holds all-MiniLM-L6-v2 (dev/data/bert/fetch_minilm.sh), also:
  test/fixtures/bert_minilm_sentences.safetensors  real sentences tokenized by BertTokenizer, padded, one
                                          of them a sentence pair (token types 1), and BertModel's
                                          last_hidden_state and pooler_output for them

Regenerate (needs torch and transformers; Debian's python3-torch + pip's transformers<4.46 work):
  /usr/bin/python3 test/oracle_bert.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel,
                          BertTokenizer)
from transformers.utils import logging

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
MINILM = os.path.join(HERE, "..", "dev", "data", "bert", "minilm")

L, C, NH, I, MAXT, V, NTYPES, NL = 2, 64, 4, 128, 64, 500, 2, 3
B, T = 4, 64
LENGTHS = [64, 37, 9, 1]
PAD, CLS, SEP, MASK = 0, 1, 2, 3
STEPS, LR, BETAS, EPS, WD, CLIP = 10, 1e-3, (0.9, 0.999), 1e-8, 0.01, 1.0


def tiny_config():
    return BertConfig(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=NH,
                      intermediate_size=I, max_position_embeddings=MAXT, type_vocab_size=NTYPES,
                      hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      layer_norm_eps=1e-12, num_labels=NL, attn_implementation="eager")


def perturb(model, names):
    """Adds N(0, 0.05) to the biases and LayerNorm parameters whose names contain one of `names`."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(n in name for n in names) and (name.endswith("bias") or "LayerNorm" in name):
                p.add_(0.05 * torch.randn_like(p))


def make_batch(g):
    """Token ids, token types, attention mask, MLM labels (with the inputs masked) and class labels."""
    ids = torch.randint(4, V, (B, T), generator=g)
    types = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        ids[b, 0] = CLS
        if n > 1:
            ids[b, n - 1] = SEP
        ids[b, n:] = PAD
        mask[b, :n] = 1
        if n >= 4:
            types[b, n // 2:n] = 1  # segment B
        # ~15% of the tokens between [CLS] and [SEP]; the one-token sequence predicts its [CLS]
        candidates = list(range(1, n - 1)) if n > 2 else [0]
        pick = [t for t in candidates if torch.rand(1, generator=g).item() < 0.15] or [candidates[0]]
        for t in pick:
            labels[b, t] = ids[b, t]
            r = torch.rand(1, generator=g).item()  # BERT's 80/10/10: [MASK], a random token, unchanged
            if r < 0.8:
                ids[b, t] = MASK
            elif r < 0.9:
                ids[b, t] = torch.randint(4, V, (1,), generator=g).item()
    cls_labels = torch.randint(0, NL, (B,), generator=g)
    return ids, types, mask, labels, cls_labels


def grads_of(model):
    """Every parameter's gradient under its own name (tied parameters appear once)."""
    return {name: p.grad.detach().clone().contiguous() for name, p in model.named_parameters()}


def adamw_losses(model_dir, cls, loss_of):
    """Losses before each of STEPS AdamW steps from the saved model, on the fixture batch: weight decay
    on the matrices (2-D tensors) only, gradient clipping at CLIP."""
    model = cls.from_pretrained(model_dir, attn_implementation="eager").float().eval()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=False)
        loss = loss_of(model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float32)


def tiny():
    torch.manual_seed(20241123)
    config = tiny_config()
    mlm = BertForMaskedLM(config).float().eval()
    perturb(mlm, [""])
    clsm = BertForSequenceClassification(config).float().eval()
    missing, _ = clsm.bert.load_state_dict(mlm.bert.state_dict(), strict=False)
    assert all(k.startswith("pooler.") for k in missing), missing
    perturb(clsm, ["pooler", "classifier"])
    mlm_dir, cls_dir = os.path.join(OUT, "bert_tiny_mlm"), os.path.join(OUT, "bert_tiny_cls")
    mlm.save_pretrained(mlm_dir)
    clsm.save_pretrained(cls_dir)
    extra = os.path.join(mlm_dir, "generation_config.json")  # for generate(), which BERT has no use for
    if os.path.exists(extra):
        os.remove(extra)

    g = torch.Generator().manual_seed(7)
    ids, types, mask, labels, cls_labels = make_batch(g)
    inputs = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)

    out = mlm(**inputs, labels=labels)
    out.loss.backward()
    masked = labels != -100
    mlm_logits = out.logits[masked].detach()  # (M, V), rows in (b, t) order
    save_file(grads_of(mlm), os.path.join(OUT, "bert_tiny_mlm_grads.safetensors"))

    out_c = clsm(**inputs, labels=cls_labels)
    out_c.loss.backward()
    save_file(grads_of(clsm), os.path.join(OUT, "bert_tiny_cls_grads.safetensors"))

    mlm_steps = adamw_losses(mlm_dir, BertForMaskedLM, lambda m: m(**inputs, labels=labels).loss)
    cls_steps = adamw_losses(cls_dir, BertForSequenceClassification, lambda m: m(**inputs, labels=cls_labels).loss)
    i32 = lambda t: t.to(torch.int32).contiguous()
    f32 = lambda t: t.detach().to(torch.float32).contiguous()
    save_file({
        "input_ids": i32(ids), "token_type_ids": i32(types), "valid_len": i32(mask.sum(1)),
        "mlm_labels": i32(labels), "cls_labels": i32(cls_labels),
        "mlm_logits": f32(mlm_logits), "mlm_loss": f32(out.loss.reshape(1)),
        "cls_logits": f32(out_c.logits), "cls_loss": f32(out_c.loss.reshape(1)),
        "mlm_steps": mlm_steps, "cls_steps": cls_steps,
    }, os.path.join(OUT, "bert_tiny_batch.safetensors"),
        # one metadata key: safetensors writes several in a random order (fixtures would not be reproducible)
        metadata={"oracle": f"AdamW lr={LR} betas={BETAS} eps={EPS} weight_decay={WD} (2-D tensors only) "
                            f"grad_clip={CLIP}, losses before each step; transformers "
                            f"{__import__('transformers').__version__}, torch {torch.__version__}"})
    print(f"wrote tiny fixtures: {int(masked.sum())} masked tokens, MLM loss {out.loss.item():.6f}, "
          f"classification loss {out_c.loss.item():.6f}; 10 AdamW steps MLM {mlm_steps[0]:.6f} -> "
          f"{mlm_steps[-1]:.6f}, classification {cls_steps[0]:.6f} -> {cls_steps[-1]:.6f}")


SENTENCES = [
    ("The quick brown fox jumps over the lazy dog.", None),
    ("Tokenization splits unaffable words into wordpieces.", None),
    ("Where is the nearest train station?", "It is two blocks north, past the café."),
    ("Hi!", None),
]


def minilm():
    if not os.path.exists(os.path.join(MINILM, "model.safetensors")):
        print(f"skipped the all-MiniLM-L6-v2 fixture: {MINILM} is missing (run dev/data/bert/fetch_minilm.sh)")
        return
    tok = BertTokenizer(os.path.join(MINILM, "vocab.txt"), do_lower_case=True)
    firsts = [a for a, _ in SENTENCES]
    seconds = [b for _, b in SENTENCES]
    enc = [tok(a, b) if b else tok(a) for a, b in zip(firsts, seconds)]
    T_ = max(len(e["input_ids"]) for e in enc)
    T_ = (T_ + 7) // 8 * 8  # padded to a multiple of 8 of the longest, as the trainer's batches are
    ids = torch.zeros(len(enc), T_, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for b, e in enumerate(enc):
        n = len(e["input_ids"])
        ids[b, :n] = torch.tensor(e["input_ids"])
        types[b, :n] = torch.tensor(e["token_type_ids"])
        mask[b, :n] = 1
    model = BertModel.from_pretrained(MINILM, attn_implementation="eager").float().eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    i32 = lambda t: t.to(torch.int32).contiguous()
    save_file({"input_ids": i32(ids), "token_type_ids": i32(types), "valid_len": i32(mask.sum(1)),
               "hidden": out.last_hidden_state.float().contiguous(), "pooled": out.pooler_output.float().contiguous()},
              os.path.join(OUT, "bert_minilm_sentences.safetensors"),
              metadata={"sentences": repr(SENTENCES)})
    print(f"wrote the all-MiniLM-L6-v2 fixture: {len(enc)} sentences, T={T_}, lengths {mask.sum(1).tolist()}")


def main():
    logging.set_verbosity_error()
    os.makedirs(OUT, exist_ok=True)
    tiny()
    minilm()


if __name__ == "__main__":
    main()
