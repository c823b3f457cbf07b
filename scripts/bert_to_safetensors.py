#!/usr/bin/env python3
"""scripts/bert_to_safetensors.py — converts a Hugging Face BERT checkpoint saved as pytorch_model.bin
(a pickled state dict) into model.safetensors next to it, which train_bert reads (--init DIR).

  python3 scripts/bert_to_safetensors.py PATH/pytorch_model.bin [--out FILE] [--force]

The .bin is read with torch.load(weights_only=True): only tensors and plain containers are unpickled,
never arbitrary objects (a .bin from the internet is a pickle, which can run code otherwise). Tensors
are written as they are (dtype, shape, values); tensors that share storage — the MLM decoder tied to
the word embeddings, cls.predictions.decoder.bias tied to cls.predictions.bias — are written once, as
transformers' save_pretrained does (the format cannot hold shared storage; loaders re-tie them). The
config.json the checkpoint came with must stay beside the output (train_bert reads the shape from it).
Needs torch and safetensors (pip install torch safetensors).
"""
import argparse
import os
import sys


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description="pytorch_model.bin -> model.safetensors (BERT checkpoints)")
    parser.add_argument("bin", help="the pytorch_model.bin to convert")
    parser.add_argument("--out", help="output file (default: model.safetensors next to the .bin)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    args = parser.parse_args()
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError as e:
        fail(f"needs torch and safetensors ({e}); install them: pip install torch safetensors")

    if not os.path.isfile(args.bin):
        fail(f"{args.bin}: no such file")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.bin)), "model.safetensors")
    if os.path.exists(out) and not args.force:
        fail(f"{out} exists (--force overwrites it)")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):  # said before the (maybe long) read of the .bin
        fail(f"cannot write {out}: {folder} " + ("is not a folder" if os.path.exists(folder) else "does not exist"))
    try:
        state = torch.load(args.bin, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file, not a pickle, or objects weights_only refuses
        fail(f"{args.bin}: cannot be read as a PyTorch state dict ({type(e).__name__}: {e})")
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # some training scripts wrap it
    if not isinstance(state, dict) or not state or not all(torch.is_tensor(v) for v in state.values()):
        fail(f"{args.bin}: not a state dict of tensors (a dict of names to tensors)")

    # Keep the first name of each group of tensors sharing storage (in file order the encoder's
    # word embeddings come before the tied decoder); the others must hold the same values.
    kept, dropped, seen = {}, [], {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr(),
               t.storage_offset(), tuple(t.shape), t.dtype)
        if t.numel() and key in seen:
            dropped.append(f"{name} (= {seen[key]})")
            continue
        seen[key] = name
        kept[name] = t.contiguous().clone()  # own storage: the format holds each tensor's bytes once
    tmp = out + ".tmp"
    try:
        save_file(kept, tmp, metadata={"format": "pt"})
        os.replace(tmp, out)
    except Exception as e:  # no permission, a full disk, a folder named like the output
        if os.path.isfile(tmp):
            os.remove(tmp)
        fail(f"cannot write {out}: {e}")
    total = sum(t.numel() for t in kept.values())
    print(f"{out}: {len(kept)} tensors, {total:,} values" +
          (f"; tied, written once: {', '.join(dropped)}" if dropped else ""))
    if not os.path.isfile(os.path.join(os.path.dirname(out), "config.json")):
        print(f"note: no config.json beside {out}: copy the checkpoint's config.json there for train_bert --init")


if __name__ == "__main__":
    main()
