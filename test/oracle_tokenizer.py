"""test/oracle_tokenizer.py — writes the GPT-2 encoding cases test_tokenizer checks llmc/tokenizer.h
against, encoded by tiktoken (0.14), the oracle for GPT-2 BPE.

tiktoken cannot download its encodings here, so the "gpt2" (r50k_base) encoding is rebuilt from the
ranks openai-whisper ships (whisper/assets/gpt2.tiktoken, fetched with `pip download --no-deps`
unless --whisper names the sdist), as dev/data/prepare_shakespeare.py does.

Cases, in groups (test_tokenizer prints one line per group):
  ascii prose, unicode, whitespace, numbers, contractions, punctuation, code, special text, empty:
      hand-written strings, tiktoken's encode_ordinary();
  real cjk, real code: python's own test/cjkencodings/*-utf8.txt (Chinese, Japanese, Korean prose)
      and a python stdlib module (textwrap.py), from the python running this script;
  long runs: single pre-tokens of 1-3 KB (the encoder's heap merge path);
  random mix: strings drawn from an alphabet of tricky characters (spaces of every kind,
      apostrophes, contraction letters, marks, zero-width and RTL characters, emoji, digits of
      other scripts, letters new in Unicode 15/16), seeded;
  table edges: every range edge of llmc/unicode_tables.h (lo-1, lo, hi, hi+1) in several contexts;
  invalid utf-8: byte strings that are not UTF-8. tiktoken's public API takes only (valid) str, so
      the oracle here is: pre-tokens from the same pattern (python's `regex` module) on the
      surrogateescape-decoded text, where each invalid byte is a lone surrogate, a character of the
      [^\\s\\p{L}\\p{N}] class like U+FFFD; then tiktoken's own BPE of each piece's original bytes.
      The script first checks that this method reproduces encode_ordinary() on every valid case.
The real-text check on 1.8 MB of Shakespeare needs no fixture: the bundled shards are tiktoken's
output (dev/data/prepare_shakespeare.py); this script verifies that they still are.

Fixture format, test/fixtures/tokenizer_cases.bin (little-endian):
  8 bytes "TOKCASE1", uint32 number of cases, then per case:
  uint8 group name length, the name; uint32 text length, the text bytes;
  uint32 token count, the tokens as uint16.

  python3 test/oracle_tokenizer.py [--whisper SDIST]
"""
import argparse
import base64
import glob
import os
import random
import re
import struct
import subprocess
import sys
import sysconfig
import tarfile
import tempfile

import regex
import tiktoken

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "fixtures", "tokenizer_cases.bin")
R50K_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The same for python's `regex` module, with \s spelled as the property Rust's engine uses.
R50K_PATTERN_PY = R50K_PATTERN.replace(r"\s", r"\p{White_Space}").replace(r"\S", r"\P{White_Space}")
EOT = 50256

PROSE = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "Mr. Smith went to Washington D.C. on Jan. 3rd; he said: \"Nothing's changed.\"",
    "ALL CAPS SENTENCE WITH SOME lower case AND MiXeD cAsE words.",
    "a",
    " a",
    "A sentence that ends with a space ",
    "Tokenization of GPT-2 is byte-level BPE (Radford et al., 2019).",
]
UNICODE = [
    "café naïve résumé façade coöperate", "Straße groß Fuß", "Ελληνικά γράμματα", "Привет, мир!",
    "中文字符测试", "日本語のひらがなとカタカナ", "한국어 텍스트", "مرحبا بالعالم", "שָׁלוֹם עולם",
    "e\u0301 (e + combining acute)", "n\u0303o\u0308", "हिन्दी भाषा", "தமிழ்", "ไทยภาษา",
    "zero\u200bwidth\u200cjoiner\u200dmark\ufeffbom\u2060wj", "\ufeffstarts with a BOM",
    "emoji 😀👍🏽👨‍👩‍👧 🇫🇷 ❤️", "non\u00a0breaking\u00a0space", "ideographic\u3000space",
    "em\u2003space", "line\u2028separator\u2029para", "next\u0085line", "rtl \u202eoverride\u202c done",
    "fullwidth ＡＢＣ１２３", "math 𝐀𝐁𝐂 𝟏𝟐𝟑", "roman Ⅻ and ⅷ", "½ ¾ ² ³ ① ⑳", "٣٤٥ ۱۲۳ १२३",
    "new letters: \U00011F04\U00011F05 \U0002EBF0 \U000105C0\U000105C1 \U00010D50",
    "ǅungla ʰaspirated 々 〇", "\u0600\u0601 arabic number signs", "control\x01\x02\x7fchars",
    "nul\x00inside", "ﬁ ligature ﬀ", "Ⓐ circled ⓐ", "\U0001F600", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]
WHITESPACE = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", "  \n  x", "x  ", "x \n",
    "a  b", "a   b", "a\t\tb", "a \tb", "a\t b", "a\n\nb", "a \n b", "  leading", "trailing  ",
    " \t \n \r ", "\u3000 x", " \u3000x", "\u00a0x", " \u00a0 x", "x\u2028\u2028y", "word\n\n\n\nword",
    "    indented code", "\t\tindented", "end\n", "end\n\n", "end \n", " ", "\x0b\x0c", "\x1c\x1d\x1e\x1f",
]
NUMBERS = [
    "123456789", "3.14", "1,000", "1 000 000", "-42", "+1e10", "0x1F", "2024-11-22", "12:30:45",
    "$19.99", "100%", "1st 2nd 3rd 4th", "v1.2.3", "1234567890123456789012345678901234567890",
    " 12 34", "a1b2c3", "٣.١٤", "²³", "½", "1½",
]
CONTRACTIONS = [
    "I'm", "YOU'LL", "it's'", "we're", "they've", "I'd", "don't", "WON'T", "You'Re", "'s", "'S",
    "'t", "'re", "'RE", "'ve", "'m", "'ll", "'d", "'", "''", "'''s", "x's's", "rock'n'roll",
    " 's", " 'S", "''s", "'ll've", "it 's", "'sa", "'tis", "O'Neil's", "can't've", "'l", "'r",
    "'\u00e9", "he said 'hello'", "’s curly apostrophe’s",
]
PUNCTUATION = [
    "!!!", "...", "?!?!", "—", "–", "«»", "((()))", "#$%&*", "a...b", ". . .", " !!", "\n!!",
    "hello!!! world???", "@user #tag", "<html><body>", "a->b=>c", "::", "“quotes”", "¡Hola! ¿Qué?",
    "***bold***", "~~~", "|||", "\\\\", "__init__", "--option=value", "a_b_c", "😀!", "!😀",
]
CODE = [
    "def f(x):\n    return x * 2\n",
    "int main(int argc, char** argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; i++) { a[i] += b[i]; }",
    "    if x:\n        pass\n    else:\n        y = {'a': 1, \"b\": [2, 3]}\n",
    "SELECT * FROM users WHERE name = 'O''Brien';",
    "https://example.com/path?q=1&r=two#frag",
    "x = 1e-5  # comment\n\n\nclass A:\n\tpass\n",
]
SPECIAL = [
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|endoftext|> ", "<|endoftext|",
    "<|endoftext|>\n\nOnce upon a time", "text <|endoftext|>text", "<|fim_prefix|>",
]
RANDOM_ALPHABET = (
    list("abestrlmdvSTRLMDVA") + [" "] * 8 + ["  ", "\t", "\n", "\r\n", "\n\n"] + ["'"] * 4 +
    list("0129.,!?-_()\"`@$\\") +
    ["é", "ß", "中", "文", "ا", "ש", "\u05bc", "\u0301", "\u0903", "\u200b", "\u200d", "\ufeff", "\u00a0",
     "\u3000", "\u2028", "\u0085", "\u2003", "😀", "👍🏽", "½", "²", "Ⅻ", "٣", "𝐀", "\U00011F04",
     "\U000105C0", "<|endoftext|>", "\x00", "\x7f", "\x1f", "\u0600", "\u202e", "ǅ", "ʰ", "々", "〇",
     "ＡＢ", "’"]
)


def fetch_ranks(whisper_sdist):
    """GPT-2's BPE ranks from openai-whisper's gpt2.tiktoken (downloaded unless given)."""
    with tempfile.TemporaryDirectory() as tmp:
        if not whisper_sdist:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "-d", tmp, "openai-whisper"], check=True, stdout=subprocess.DEVNULL)
            whisper_sdist = glob.glob(os.path.join(tmp, "*.tar.gz"))[-1]
        with tarfile.open(whisper_sdist) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("assets/gpt2.tiktoken"))
            data = tar.extractfile(member).read()
    ranks = {}
    for line in data.decode().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def regex_split_encode(enc, data):
    """The oracle for bytes that need not be UTF-8: the r50k pattern on the surrogateescape-decoded
    text (an invalid byte becomes a lone surrogate, category Cs), then tiktoken's BPE of each
    piece's original bytes."""
    text = data.decode("utf-8", errors="surrogateescape")
    ids = []
    for piece in regex.findall(R50K_PATTERN_PY, text):
        ids.extend(enc._encode_single_piece(piece.encode("utf-8", errors="surrogateescape")))
    return ids


def random_strings(rng, n, alphabet, max_len):
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, max_len))) for _ in range(n)]


def table_edges():
    """Strings putting every range edge of llmc/unicode_tables.h (lo-1, lo, hi, hi+1) in contexts
    that tell its class apart: after a space, inside and after letters, digits, punctuation."""
    text = open(os.path.join(ROOT, "llmc", "unicode_tables.h")).read()
    cps = set()
    for lo, hi in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", text):
        cps.update({int(lo, 16) - 1, int(lo, 16), int(hi, 16), int(hi, 16) + 1})
    cps = sorted(c for c in cps if 0 <= c <= 0x10FFFF and not 0xD800 <= c < 0xE000)
    out = []
    for i in range(0, len(cps), 40):
        out.append("".join(f" {chr(c)}a{chr(c)}1{chr(c)}!{chr(c)} " for c in cps[i:i + 40]))
    return out


def invalid_utf8(rng):
    fixed = [b"\xff", b"abc \xff def", b"caf\xc3", b"\xc3(", b"\xe2\x82\xac\xe2\x82", b"\xed\xa0\x80 surrogate",
             b"\xc0\xaf overlong", b"\xf4\x90\x80\x80 too big", b"\xf0\x9f\x98 x", b" \x80\x80\x80",
             b"it\xff's", b"  \xff  x", b"\xff's", b"1\xff2", b"\xfe\xfe\xfe", b"\xf8\x88\x80\x80\x80",
             b"hello world\xe2\x82", b"\xe2\x82x", b"a\xff\xfeb", b"\xc3\xa9\xff\xc3\xa9", b"\xff \xff  \xff\n"]
    pool = [b"a", b"s", b"'", b" ", b"  ", b"\n", b"1", b".", b"\xc3\xa9", b"\xe4\xb8\xad"]
    rand = []
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 30)):
            parts.append(bytes([rng.randint(0x80, 0xFF)]) if rng.random() < 0.3 else rng.choice(pool))
        rand.append(b"".join(parts))
    return fixed + rand


def check_shakespeare(enc):
    """The bundled shards must be tiktoken's encoding of their decoded text (test_tokenizer uses
    them as 1.8 MB of real-text cases)."""
    for name in ("shakespeare_train.bin", "shakespeare_val.bin"):
        with open(os.path.join(ROOT, "dev", "data", "shakespeare", name), "rb") as f:
            header = struct.unpack("<256i", f.read(1024))
            tokens = list(struct.unpack(f"<{header[2]}H", f.read()))
        docs, cur = [], None
        for t in tokens:
            if t == EOT:
                cur = []
                docs.append(cur)
            else:
                cur.append(t)
        for d in docs:
            assert enc.encode_ordinary(enc.decode(d)) == d, f"{name}: a document is not tiktoken's encoding"
        print(f"{name}: {len(docs)} documents re-encode to the same {len(tokens)} tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--whisper", help="path to an openai-whisper sdist (else pip download)")
    args = ap.parse_args()
    enc = tiktoken.Encoding("gpt2", pat_str=R50K_PATTERN, mergeable_ranks=fetch_ranks(args.whisper),
                            special_tokens={"<|endoftext|>": EOT})
    assert enc.encode_ordinary("Hello world") == [15496, 995]
    rng = random.Random(20241122)

    stdlib = sysconfig.get_paths()["stdlib"]
    cjk = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(stdlib, "test", "cjkencodings", "*-utf8.txt")))]
    code = open(os.path.join(stdlib, "textwrap.py"), encoding="utf-8").read()
    runs = ["a" * 3000, " " * 2000 + "x", "1" * 1500, "\n" * 2000, "ab" * 1000, "!" * 1500, "é" * 1000,
            "a" * 1000 + " " + "b" * 1000, "hello" * 400, "'" * 1000, "\u3000" * 500 + "end", "中" * 600,
            "".join(rng.choice("ab") for _ in range(3000))]
    ascii_mix = list("abstdlmvrSTe") + [" ", " ", "  ", "\t", "\n", "'", "'", "1", ".", "!"]
    groups = [
        ("ascii prose", PROSE), ("unicode", UNICODE), ("whitespace", WHITESPACE), ("numbers", NUMBERS),
        ("contractions", CONTRACTIONS), ("punctuation", PUNCTUATION), ("code", CODE), ("special text", SPECIAL),
        ("empty", [""]), ("real cjk", cjk), ("real code", [code]), ("long runs", runs),
        ("random mix", random_strings(rng, 800, RANDOM_ALPHABET, 30) + random_strings(rng, 500, ascii_mix, 30)),
        ("table edges", table_edges()),
    ]
    cases = []
    for group, texts in groups:
        for t in texts:
            data = t.encode("utf-8")
            ids = enc.encode_ordinary(t)
            assert regex_split_encode(enc, data) == ids, f"the split oracle disagrees with tiktoken on {t!r}"
            cases.append((group, data, ids))
    agree = 0
    for data in invalid_utf8(rng):
        ids = regex_split_encode(enc, data)
        agree += ids == enc._encode_bytes(data)
        cases.append(("invalid utf-8", data, ids))
    check_shakespeare(enc)

    with open(OUT, "wb") as f:
        f.write(b"TOKCASE1" + struct.pack("<I", len(cases)))
        for group, data, ids in cases:
            name = group.encode()
            f.write(struct.pack("<B", len(name)) + name + struct.pack("<I", len(data)) + data)
            f.write(struct.pack(f"<I{len(ids)}H", len(ids), *ids))
    n_invalid = sum(g == "invalid utf-8" for g, _, _ in cases)
    print(f"{len(cases)} cases in {len(groups) + 1} groups -> {OUT} ({os.path.getsize(OUT)} bytes); "
          f"{agree} of {n_invalid} invalid-UTF-8 cases also equal tiktoken's private _encode_bytes()")


if __name__ == "__main__":
    main()
