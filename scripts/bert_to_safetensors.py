#!/usr/bin/env python3
"""scripts/bert_to_safetensors.py — converts a Hugging Face BERT checkpoint saved as pytorch_model.bin
(a pickled state dict) into model.safetensors next to it, which train_bert reads (--init DIR).

  python3 scripts/bert_to_safetensors.py PATH/pytorch_model.bin [--out FILE] [--force]
  python3 scripts/bert_to_safetensors.py PATH/pytorch_model.bin.index.json   (a sharded save: all shards)

A sharded save (save_pretrained with max_shard_size) is converted from its index, every shard it
names into one model.safetensors; one of its shards alone is refused, as it is a part of the model.

The .bin is read with torch.load(weights_only=True): only tensors and plain containers are unpickled,
never arbitrary objects (a .bin from the internet is a pickle, which can run code otherwise). Tensors
are written as they are (dtype, shape, values); tensors that share storage — the MLM decoder tied to
the word embeddings, cls.predictions.decoder.bias tied to cls.predictions.bias — are written once, as
transformers' save_pretrained does (the format cannot hold shared storage; loaders re-tie them). The
config.json the checkpoint came with must stay beside the output (train_bert reads the shape from it).
Needs torch and safetensors (pip install torch safetensors).
"""
import argparse
import json
import os
import re
import sys


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def shard_files(index):
    """The shard files a sharded save's index names (its weight_map's values), in first-use order."""
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = list(dict.fromkeys(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        fail(f"{index}: not a sharded save's index (a JSON object with a weight_map of names to files: {e})")
    folder = os.path.dirname(index)
    missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
    if not files or missing:
        fail(f"{index}: " + (f"its shard {missing[0]} is missing" if missing else "names no shard"))
    return [os.path.join(folder, f) for f in files]


def read_state_dict(torch, path):
    """The state dict of tensors in the pickle at path (weights_only: no code runs); fails otherwise."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated file, not a pickle, or objects weights_only refuses
        fail(f"{path}: cannot be read as a PyTorch state dict ({type(e).__name__}: {e})")
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # some training scripts wrap it
    if not isinstance(state, dict) or not state or not all(torch.is_tensor(v) for v in state.values()):
        fail(f"{path}: not a state dict of tensors (a dict of names to tensors)")
    return state


def main():
    parser = argparse.ArgumentParser(description="pytorch_model.bin -> model.safetensors (BERT checkpoints)")
    parser.add_argument("bin", help="the pytorch_model.bin to convert, or a sharded save's pytorch_model.bin.index.json")
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
    shard = re.search(r"-(\d+)-of-(\d+)\.bin$", args.bin)
    if shard and int(shard.group(2)) > 1:
        index = os.path.join(os.path.dirname(args.bin), "pytorch_model.bin.index.json")
        fail(f"{args.bin}: one shard ({int(shard.group(1))} of {int(shard.group(2))}) of a sharded save, a part of the "
             f"model: convert {index if os.path.isfile(index) else 'the save' + chr(39) + 's .index.json'} instead, "
             "which reads every shard")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.bin)), "model.safetensors")
    if os.path.exists(out) and not args.force:
        fail(f"{out} exists (--force overwrites it)")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):  # said before the (maybe long) read of the .bin
        fail(f"cannot write {out}: {folder} " + ("is not a folder" if os.path.exists(folder) else "does not exist"))
    state = {}
    for path in shard_files(args.bin) if args.bin.endswith(".index.json") else [args.bin]:
        part = read_state_dict(torch, path)
        for name in part:
            if name in state:
                fail(f"{path}: tensor {name} is in an earlier shard too")
        state.update(part)

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
