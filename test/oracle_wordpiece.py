"""test/oracle_wordpiece.py — writes test/fixtures/wordpiece_cases.bin, the cases test_wordpiece checks
llmc/wordpiece.h against: BERT WordPiece encodings by transformers' python BertTokenizer (the
reference; 4.45, run by python 3.11 = Unicode 14.0) with the bert-base-uncased vocabulary bundled as
dev/data/bert/vocab.txt. Also compares BertTokenizerFast (the Rust `tokenizers` one) with it on the
same cases and prints where they differ (for information: the fixture holds the python one's answers).

Kinds of case (test_wordpiece prints one line per group):
  encode   ids of encode(text, add_special_tokens=False): hand-written groups (prose, punctuation,
           accents, upper case, CJK, kana, Korean, other scripts, emoji, control and zero-width
           characters, combining marks, long words, numbers, URLs and code, whitespace, special
           tokens in the text, empty), random strings of tricky characters, invalid UTF-8 (oracle:
           the text decoded with errors="replace", see llmc/wordpiece.h), the same under other
           options (cased; lower case keeping accents; cased stripping accents; no CJK split);
           and the first ~100 KB of the bundled Shakespeare;
  encode#  the same, but only the count and a hash of the ids: the rest of the Shakespeare (1.8 MB);
  words#   count and hash of the words before WordPiece (BertTokenizer.tokenize() with an identity
           WordpieceTokenizer): every code point U+0000-U+10FFFF, and every canonical decomposition
           of unicode_bert.h, in contexts (texts made by a rule, below, so not stored), under
           three option sets: this checks the Unicode tables and the normalization everywhere,
           not only where the vocabulary has tokens;
  single, pair   encode_plus(a[, b], max_length, truncation=True): ids and token type ids;
  decode   decode(ids, skip_special_tokens) for ids from encodings and odd ones.

Texts made by a rule (both sides build them):
  code points lo..hi: for each code point c in [lo, hi] but the surrogates: c "a" c "A " (UTF-8);
  decompositions i..j: for entries i..j-1 of the sorted list of code points with a canonical
      decomposition (llmc/unicode_bert.h's decompositions[]), P -> (a, b) or (a):
      two parts: a b " " a U+0334 b " " a U+0301 b " " a b U+0323 " " P U+0328 " " b a " "
      one part:  a " " P U+0301 " "
  shakespeare off..off+len: bytes of S, the bundled shards decoded: every token but end-of-text,
      shakespeare_val.bin then shakespeare_train.bin, with dev/data/shakespeare/gpt2_tokenizer.bin.

Fixture format, test/fixtures/wordpiece_cases.bin (little-endian):
  8 bytes "WPCASES1", uint8 number of groups, each: uint8 name length, the name; uint32 number of
  cases; per case:
    uint8 group (index in that list); uint8 kind (0 encode, 1 encode#, 2 words#, 3 single,
    4 pair, 5 decode); uint8 options (bit 0 do_lower_case, bit 1 strip_accents given, bit 2 its
    value, bit 3 tokenize_chinese_chars, bit 4 skip_special_tokens for decode); int32 max_len;
    a text (b too for pair; none for decode), each: uint8 source (0 bytes: uint32 length + bytes; 1 code points:
    uint32 lo, hi; 2 decompositions: uint32 i, j; 3 shakespeare: uint32 offset, length; 4 the
    text of an earlier case: uint32 case index, which text (0: a, 1: b));
    then by kind — encode, single, pair: uint32 n, n x uint16 ids (single, pair: then uint32 number
    of type-0 ids); encode#, words#: uint32 count, uint64 FNV-1a hash (of the ids as uint32 LE
    bytes; of the words' UTF-8 bytes, each followed by 0xFF); decode: uint32 n, n x int32 ids,
    uint32 length + the expected text.

  /usr/bin/python3 test/oracle_wordpiece.py     (transformers 4.45 on python 3.11; no download; ~1 min)
"""
import hashlib
import os
import random
import struct
import sys
import time
import unicodedata
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "fixtures", "wordpiece_cases.bin")
VOCAB = os.path.join(ROOT, "dev", "data", "bert", "vocab.txt")
VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"  # bert-base-uncased
SHAKESPEARE = os.path.join(ROOT, "dev", "data", "shakespeare")
ENCODE, ENCODE_HASH, WORDS_HASH, SINGLE, PAIR, DECODE = range(6)
SRC_BYTES, SRC_CODE_POINTS, SRC_DECOMPOSITIONS, SRC_SHAKESPEARE, SRC_CASE = range(5)

# Option sets: (do_lower_case, strip_accents, tokenize_chinese_chars).
UNCASED = (True, None, True)  # bert-base-uncased, the default
CASED = (False, None, True)
LOWER_KEEP_ACCENTS = (True, False, True)
CASED_STRIP = (False, True, False)  # also without the CJK split
NO_CJK_SPLIT = (True, None, False)

PROSE = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity.",
    "Mr. Smith went to Washington D.C. on Jan. 3rd; he said: \"Nothing's changed.\"",
    "BERT (Devlin et al., 2019) pre-trains deep bidirectional representations from unlabeled text.",
    "unaffable unbelievable tokenization preprocessing hyperparameters",
    "I can't believe it's not butter! They'd've said so, wouldn't they?",
    "a", "A", " a ", "The", "the", "playing", "unhappiness",
]
PUNCTUATION = [
    "!!!", "...", "?!?!", "—", "–", "«»", "((()))", "#$%&*", "a...b", ". . .", " !!", "\n!!",
    "hello!!! world???", "@user #tag", "<html><body>", "a->b=>c", "::", "“quotes”", "‘single’",
    "¡Hola! ¿Qué?", "***bold***", "~~~", "|||", "\\\\", "__init__", "--option=value", "a_b_c",
    "don't", "rock'n'roll", "e.g.", "U.S.A.", "^_^", "`code`", "$100", "50%", "§1 ¶2", "a/b\\c",
    "【括弧】「引用」『二重』", "、。・", "‹›", "′″", "※", "⁂", "⸮", "܀", "·", "؟", "।", "٪", "﹏", "＂＃",
    "\u00bf\u00a1", "\u2010\u2011\u2012", "+=<>|", "©®™", "°±×÷", "←→↑↓", "♠♣♥♦",
]
ACCENTS = [
    "café", "naïve", "Ångström", "résumé façade coöperate", "Straße groß Fuß", "Tiếng Việt",
    "Zażółć gęślą jaźń", "Příliš žluťoučký kůň", "İstanbul ıi", "Ελληνικά γράμματα", "ﬁ ligature",
    "São Paulo", "Crème brûlée", "Øresund æble", "Łódź", "Dvořák", "Ñandú", "Ærøskøbing", "Þórr",
    "caf\u0065\u0301", "n\u0303", "A\u030a", "\u212b ngstrom sign", "\u1e9b\u0323", "ǅ ǈ ǋ",
]
UPPERCASE = [
    "ALL CAPS SENTENCE", "MiXeD cAsE wOrDs", "ΟΔΟΣ ΣΊΣΥΦΟΣ Σ ΑΣ", "ПРИВЕТ, МИР!", "STRASSE ẞ",
    "\u212a kelvin", "\u2126 ohm", "ǅungla Ǆ", "ᲢᲔᲡᲢᲘ", "ᎠᎡᎢ", "𐐀𐐁 Deseret", "ＡＢＣ fullwidth",
    "ꞫꞬ", "ⱯⱰ", "ϴ ϑ", "ΐ ΰ", "İI ıi", "Σ", "ΌΣΟ", "Ⅻ Ⓐ",
]
CJK = [
    "中文字符测试", "我爱北京天安门", "漢字かな交じり文", "𠀀𠀁 ext B", "\U0002a700 ext C", "\U0002b740 ext D",
    "\U0002b820 ext E", "\U0002ceb0 ext F", "\U00030000 ext G", "豈 更 車 compatibility", "\U0002f800 supplement",
    "㐀㐁 ext A", "⺀ radicals ⼀", "〇〡", "中a文b", "a中", "中。文", "ＡＢＣ１２３", "㈱ ㍿", "龥鿿", "\u9ffd\u9ffe",
]
KANA = [
    "日本語のひらがなとカタカナ", "ガギグゲゴ", "ぱぴぷぺぽ", "ｶﾀｶﾅ ﾊﾟﾝ", "カ\u3099", "ヴァイオリン", "ー〜",
    "すもももももももものうち", "ゟ ヿ", "ㇰㇱ", "𛀀𛀁",
]
KOREAN = [
    "한국어 텍스트", "안녕하세요, 세계!", "\u1100\u1161\u11a8", "\u1100\u1161", "\uac00\u11a8", "ᄀᄁ ᅡᅢ ᆨᆩ",
    "ㄱㄴㄷ ㅏㅑ", "한글 Hangul 조합", "\u1112\u1161\u11ab\u1100\u1173\u11af",
]
OTHER_SCRIPTS = [
    "مرحبا بالعالم", "مَرْحَبًا", "السَّلَامُ عَلَيْكُمْ", "שָׁלוֹם עולם", "हिन्दी भाषा", "தமிழ்", "ภาษาไทย",
    "Հայերեն", "ქართული", "ᐃᓄᒃᑎᑐᑦ", "ᚠᚢᚦ", "አማርኛ", "ꦧꦱꦗꦮ", "Ελληνική", "Русский язык", "Українська",
    "\u0600\u0601 number signs", "\u200f\u200e marks", "ܐܪܡܝܐ", "ދިވެހި", "ߒߞߏ", "ᠮᠣᠩᠭᠣᠯ", "བོད་ཡིག",
]
EMOJI = [
    "😀", "emoji 😀👍🏽👨‍👩‍👧 🇫🇷 ❤️", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤\ufe0f", "☃", "🤖 robot", "a😀b",
    "😀!", "!😀", "#️⃣", "🏳️‍🌈", "\U0001fae0 new in 14", "\U0001faf8 new in 15",
]
CONTROL = [
    "\x00", "a\x00b", "\x01\x02\x03", "tab\x7fdel", "next\x85line", "\u200b", "soft\u00adhyphen",
    "\ufeffbom", "\u0378 unassigned", "\ue000 private", "\U000f0000 plane 15", "\U0010fffd", "\ufffd",
    "\ufffe\uffff nonchars", "\U000e0041\U000e007f tags", "\u2066isolate\u2069", "\u061c", "\u180e",
    "\U0001bca0", "\x1b[31mred\x1b[0m", "\u070f", "\U000110bd", "x\u0378y", "\U00011f00 new in 15",
    "\u0870 new in 14", "\U0001e4d0 new in 15", "\U0002ebf0 new in 15.1",
]
ZERO_WIDTH = [
    "zero\u200bwidth\u200cjoiner\u200dmark\u2060wj", "a\u200bb", "\u200c", "\u200d", "\u034f", "co\u00adop",
    "\u2060", "\ufeff\ufeff", "in\u200bvisible", "क्\u200dष",
]
COMBINING = [
    "e\u0301", "a\u0308\u0301", "\u0301alone", "x\u0323\u0307", "q\u0307\u0323", "s\u0323\u0307", "s\u0307\u0323",
    "Z̴̡̪a̷̠l̸g̶o̵", "a\u0340", "\u0344", "\u0958", "\u1e9b\u0323", "\u0041\u030a", "o\u0328\u0304",
    "\u0627\u0653", "\u0915\u093c", "\u09c7\u09be", "\u0b47\u0b3e", "\u0cc6\u0cd5", "\u1025\u102e",
    "\u0f71\u0f72", "u\u0308\u0304", "a" + "\u0301" * 30, "a" + "\u0316\u0301" * 20, "\u05b8\u05b7",
    "e\u0301\u0301", "i\u0307", "\u0345\u0301", "\U0001d15e", "\U0001d165\U0001d16e", "\u20dd", "o\u20dd",
]
LONG_WORDS = [
    "a" * 99, "a" * 100, "a" * 101, "x" * 200, "supercalifragilistic" * 6, "ab" * 60, "é" * 100,
    "é" * 101, "e\u0301" * 60, "Ü" * 100, "ü" * 101, "!" * 150, "中" * 150, "a" * 100 + "!" + "b" * 100,
    "hello" * 25, " ".join(["word"] * 300), "\u2603snowman", "x\u2603", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ⓗⓔⓛⓛⓞ", "q" * 1000, "ab" * 500 + "c",
]
NUMBERS = [
    "123456789", "3.14159", "1,000,000", "-42", "+1e10", "0x1F", "2024-11-22", "12:30:45", "$19.99",
    "100%", "1st 2nd 3rd 4th", "v1.2.3", "1234567890123456789012345678901234567890", "٣٤٥ ۱۲۳ १२३",
    "½ ¾ ² ³ ① ⑳", "Ⅻ ⅷ", "１２３", "𝟏𝟐𝟑", "1½", "3.0.0-rc1",
]
URLS_CODE = [
    "https://example.com/path?q=1&r=two#frag", "user@example.com", "http://www.bert.ai/~dev/index.html",
    "def f(x):\n    return x * 2\n", "int main(int argc, char** argv) { return 0; }", "C++ and C#",
    "for (i = 0; i < n; i++) a[i] += b[i];", "SELECT * FROM users WHERE name = 'O''Brien';",
    "x = 1e-5  # comment", "{\"key\": [1, 2, 3]}", "<div class=\"a\">b</div>", "$ git commit -m 'msg'",
]
WHITESPACE = [
    " ", "  ", "\t", "\n", "\r\n", "a\tb\nc\r\nd", "a\u00a0b", "a\u3000b", "a\u2003b", "a\u2028b", "a\u2029b",
    "a\u0085b", "a\x0bb\x0cc", "a\x1cb\x1dc\x1ed\x1ff", "   lead", "trail   ", "a \t\n b", "\u1680x",
    "\u202fnarrow", "\u205fmath", "x\u2000\u2001\u200ay", "\u180ex", "\u200bx y\u200b", "\n\n\n",
]
SPECIAL = [
    "[CLS]", "[MASK]", "[SEP] [PAD] [UNK]", "a[MASK]b", "[cls]", "[CLS", "CLS]", "[[CLS]]", "[MASK][MASK]",
    "[ CLS ]", "[Cls]", "[CLS]\u0301", "\u0301[CLS]", "x [unused0] y", "[unused1]", "[CL\x00S]", "[CL\u200bS]",
    "The [MASK] sat on the mat.", "[CLS] a [SEP] b [SEP]", "[UNK]", "[PAD][PAD]", "[MASK]s", "a [MASK].",
    "\x00[CLS]\x00", "[ＣＬＳ]", "[CLS]]", "[[MASK]", "[SEP]\u200b[SEP]", "[cls] [Sep]",
]
EMPTY = ["", " ", "\x00", "\u200b", "\t\n", "\u0301", "\ufffd"]

RANDOM_ALPHABET = (
    list("abcdeINSTxyzABZ") + [" "] * 6 + ["\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2028"] +
    list("0123.,!?'-_()[]#") +
    ["é", "É", "ß", "ẞ", "ı", "İ", "Σ", "σ", "ς", "中", "文", "豈", "か", "カ", "\u3099", "한", "\u1100", "\u1161",
     "\u11a8", "ا", "\u064e", "ש", "\u05bc", "\u0301", "\u0323", "\u0308", "\u0334", "\u0345", "\u0903", "\u093c",
     "\u200b", "\u200d", "\ufeff", "\x00", "\x7f", "\u0085", "\ufffd", "\ue000", "\u0378", "😀", "🏽", "\ufe0f",
     "½", "²", "Ⅻ", "٣", "𝐀", "ǅ", "ﬁ", "\u212b", "\u2126", "\u212a", "[CLS]", "[MASK]", "[SEP]", "##", "[", "]",
     "\U00030000", "\U0002f800", "\U00011f04"]
)


def fnv1a(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def ids_hash(ids):
    return fnv1a(struct.pack(f"<{len(ids)}I", *ids))


def words_hash(words):
    return fnv1a(b"".join(w.encode("utf-8") + b"\xff" for w in words))


def code_point_text(lo, hi):
    return "".join(chr(c) + "a" + chr(c) + "A " for c in range(lo, hi + 1) if not 0xD800 <= c < 0xE000)


def decomposition_list():
    """The code points with a canonical decomposition, sorted, with their one-level decomposition."""
    out = []
    for c in range(0x110000):
        d = unicodedata.decomposition(chr(c))
        if d and not d.startswith("<"):
            out.append((c, [int(x, 16) for x in d.split()]))
    return out


def decomposition_text(entries):
    parts = []
    for p, d in entries:
        P, a = chr(p), chr(d[0])
        if len(d) == 2:
            b = chr(d[1])
            parts.append(f"{a}{b} {a}\u0334{b} {a}\u0301{b} {a}{b}\u0323 {P}\u0328 {b}{a} ")
        else:
            parts.append(f"{a} {P}\u0301 ")
    return "".join(parts)


def shakespeare_text():
    """S: the bundled shards decoded (every token but end-of-text; val, then train)."""
    with open(os.path.join(SHAKESPEARE, "gpt2_tokenizer.bin"), "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    vocab, eot = header[2], header[3] if header[1] == 2 else 50256
    tokens, p = [], 1024
    for _ in range(vocab):
        n = data[p]
        tokens.append(data[p + 1:p + 1 + n])
        p += 1 + n
    out = []
    for name in ("shakespeare_val.bin", "shakespeare_train.bin"):
        with open(os.path.join(SHAKESPEARE, name), "rb") as f:
            h = struct.unpack("<256i", f.read(1024))
            ids = struct.unpack(f"<{h[2]}H", f.read())
        out.extend(tokens[t] for t in ids if t != eot)
    return b"".join(out)


class Oracle:
    """BertTokenizer (and BertTokenizerFast, for comparison) per option set."""

    def __init__(self):
        from transformers import BertTokenizer, BertTokenizerFast
        self.slow_cls, self.fast_cls = BertTokenizer, BertTokenizerFast
        self.cache = {}

    def get(self, opts, which):
        key = (opts, which)
        if key not in self.cache:
            lower, strip, cjk = opts
            cls = self.fast_cls if which == "fast" else self.slow_cls
            t = cls(VOCAB, do_lower_case=lower, strip_accents=strip, tokenize_chinese_chars=cjk)
            if which == "words":  # tokenize() without WordPiece: the words it would split
                t.wordpiece_tokenizer.tokenize = lambda word: [word]
            self.cache[key] = t
        return self.cache[key]

    def encode(self, opts, text, which="slow"):
        return self.get(opts, which).encode(text, add_special_tokens=False)

    def words(self, opts, text):
        return self.get(opts, "words").tokenize(text)

    def frame(self, opts, a, b, max_len, which="slow"):
        kw = dict(max_length=max_len, truncation=True) if max_len else {}
        e = self.get(opts, which)(a, b, **kw) if b is not None else self.get(opts, which)(a, **kw)
        return e["input_ids"], e["token_type_ids"]

    def decode(self, ids, skip):
        return self.get(UNCASED, "slow").decode(ids, skip_special_tokens=skip)


def options_byte(opts, skip=False):
    lower, strip, cjk = opts
    return int(lower) | (strip is not None) << 1 | bool(strip) << 2 | int(cjk) << 3 | int(skip) << 4


def text_source(src):
    kind, value = src
    if kind == SRC_BYTES:
        return struct.pack("<BI", SRC_BYTES, len(value)) + value
    return struct.pack("<BII", kind, *value)


def random_strings(rng, n, max_len):
    return ["".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(1, max_len))) for _ in range(n)]


def invalid_utf8(rng):
    fixed = [b"\xff", b"a\xffb", b"caf\xc3", b"\xc3(", b"\xe4\xb8", b"\xe4\xb8 \xe4\xb8\xad", b"\xed\xa0\x80 surrogate",
             b"\xc0\xaf overlong", b"\xf4\x90\x80\x80 too big", b"\xf0\x9f\x98 x", b" \x80\x80\x80",
             b"[CLS\xff]", b"\xff[CLS]\xff", b"[CL\xffS]", b"\x80\x80abc", b"it\xff's", b"e\xcc", b"\xfe\xff",
             b"\xf8\x88\x80\x80\x80", b"a\xc3\xa9\xff\xcc\x81"]
    pool = [b"a", b"B", b"'", b" ", b"\n", b"1", b".", b"\xc3\xa9", b"\xe4\xb8\xad", b"\xcc\x81", b"[MASK]"]
    rand = []
    for _ in range(60):
        parts = [bytes([rng.randint(0x80, 0xFF)]) if rng.random() < 0.3 else rng.choice(pool)
                 for _ in range(rng.randint(1, 20))]
        rand.append(b"".join(parts))
    return fixed + rand


def main():
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    assert unicodedata.unidata_version == "14.0.0", f"the reference is python 3.11 (Unicode 14.0.0), not {sys.version}"
    with open(VOCAB, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == VOCAB_SHA256, f"{VOCAB} is not bert-base-uncased's vocab.txt"
    oracle = Oracle()
    rng = random.Random(20241123)
    cases = []  # (group, kind, options byte, max_len, [sources], payload bytes)
    fast_diff = {}  # group -> [differing, total]

    def note_fast(group, same, example):
        d = fast_diff.setdefault(group, [0, 0, None])
        d[0] += not same
        d[1] += 1
        if not same and d[2] is None:
            d[2] = example

    def add_encode(group, opts, data, source=None):
        """Adds an encode case (source: where the C++ side reads data from; default: stored) and
        returns its index."""
        text = data.decode("utf-8", errors="replace")
        ids = oracle.encode(opts, text)
        note_fast(group, oracle.encode(opts, text, "fast") == ids, text)
        cases.append((group, ENCODE, options_byte(opts), 0, [source or (SRC_BYTES, data)],
                      struct.pack(f"<I{len(ids)}H", len(ids), *ids)))
        return len(cases) - 1

    hand = [("english prose", PROSE), ("punctuation", PUNCTUATION), ("accents", ACCENTS), ("uppercase", UPPERCASE),
            ("cjk", CJK), ("japanese kana", KANA), ("korean", KOREAN), ("other scripts", OTHER_SCRIPTS),
            ("emoji", EMOJI), ("control chars", CONTROL), ("zero-width", ZERO_WIDTH), ("combining marks", COMBINING),
            ("long words", LONG_WORDS), ("numbers", NUMBERS), ("urls and code", URLS_CODE), ("whitespace", WHITESPACE),
            ("special tokens in text", SPECIAL), ("empty", EMPTY)]
    stored = []  # (case index, text) of the hand-written and random texts, for the other option sets
    every_hand = [t for _, texts in hand for t in texts]
    for group, texts in hand:
        for t in texts:
            stored.append((add_encode(group, UNCASED, t.encode("utf-8")), t))
    for t in random_strings(rng, 250, 24):
        k = add_encode("random mix", UNCASED, t.encode("utf-8"))
        if len(stored) < len(every_hand) + 80:  # the other option sets reuse 80 of them
            stored.append((k, t))
    for data in invalid_utf8(rng):
        add_encode("invalid utf-8", UNCASED, data)
    others = [("cased", CASED), ("lower case, keep accents", LOWER_KEEP_ACCENTS),
              ("cased, strip accents, no cjk split", CASED_STRIP), ("no cjk split", NO_CJK_SPLIT)]
    for name, opts in others:
        for k, t in stored:
            add_encode(name, opts, t.encode("utf-8"), (SRC_CASE, (k, 0)))

    # Real text: the first ~100 KB of S with ids, the rest by hash, in chunks that end at a line end.
    S = shakespeare_text()
    chunks, pos = [], 0
    while pos < len(S):
        end = S.find(b"\n", pos + (4000 if pos < 100_000 else 16000))
        end = len(S) if end < 0 else end + 1
        chunks.append((pos, end - pos))
        pos = end
    t0, covered = time.time(), 0
    for off, n in chunks:
        text = S[off:off + n].decode("utf-8")
        ids = oracle.encode(UNCASED, text)
        if covered < 100_000:
            note_fast("shakespeare 100 KB", oracle.encode(UNCASED, text, "fast") == ids, text)
            cases.append(("shakespeare 100 KB", ENCODE, options_byte(UNCASED), 0, [(SRC_SHAKESPEARE, (off, n))],
                          struct.pack(f"<I{len(ids)}H", len(ids), *ids)))
        else:
            note_fast("shakespeare rest #", oracle.encode(UNCASED, text, "fast") == ids, text)
            cases.append(("shakespeare rest #", ENCODE_HASH, options_byte(UNCASED), 0,
                          [(SRC_SHAKESPEARE, (off, n))], struct.pack("<IQ", len(ids), ids_hash(ids))))
        covered += n
    print(f"shakespeare: {len(S)} bytes in {len(chunks)} chunks, python BertTokenizer "
          f"{len(S) / 1e6 / (time.time() - t0) / 2:.2f} MB/s (with the fast one)")

    # Every code point, and every decomposition, through the steps before WordPiece.
    decomps = decomposition_list()
    for name, opts in [("code points #", UNCASED), ("code points # cased", CASED),
                       ("code points # keep accents, no cjk", (True, False, False))]:
        t0 = time.time()
        for lo in range(0, 0x110000, 4096):
            hi = lo + 4095
            text = code_point_text(lo, hi)
            words = oracle.words(opts, text)
            if opts == UNCASED:
                note_fast("code points (ids)", oracle.encode(opts, text) == oracle.encode(opts, text, "fast"),
                          f"U+{lo:04X}..U+{hi:04X}")
            cases.append((name, WORDS_HASH, options_byte(opts), 0, [(SRC_CODE_POINTS, (lo, hi))],
                          struct.pack("<IQ", len(words), words_hash(words))))
        for i in range(0, len(decomps), 64):
            j = min(i + 64, len(decomps))
            words = oracle.words(opts, decomposition_text(decomps[i:j]))
            cases.append((name.replace("code points", "decompositions"), WORDS_HASH, options_byte(opts), 0,
                          [(SRC_DECOMPOSITIONS, (i, j))], struct.pack("<IQ", len(words), words_hash(words))))
        print(f"{name}: {time.time() - t0:.1f} s")

    # [CLS] a [SEP] (b [SEP]) with truncation.
    texts = PROSE + ["", "x", "short one", " ".join(["word"] * 40), "中文 and English", "[MASK] me"]
    first_of = {}  # text -> index of the first single case holding it
    for a in texts:
        for max_len in (0, 3, 4, 5, 8, 16):
            ids, types = oracle.frame(UNCASED, a, None, max_len)
            note_fast("single", (ids, types) == oracle.frame(UNCASED, a, None, max_len, "fast"), (a, max_len))
            source = (SRC_CASE, (first_of[a], 0)) if a in first_of else (SRC_BYTES, a.encode())
            first_of.setdefault(a, len(cases))
            cases.append(("single", SINGLE, options_byte(UNCASED), max_len, [source],
                          struct.pack(f"<I{len(ids)}HI", len(ids), *ids, types.count(0))))
    for k in range(250):
        a, b = rng.choice(texts), rng.choice(texts)
        max_len = rng.choice([0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 20, 25, 32, 64])
        ids, types = oracle.frame(UNCASED, a, b, max_len)
        assert types == [0] * types.count(0) + [1] * (len(types) - types.count(0))
        note_fast("pair", (ids, types) == oracle.frame(UNCASED, a, b, max_len, "fast"), (a, b, max_len))
        cases.append(("pair", PAIR, options_byte(UNCASED), max_len, [(SRC_CASE, (first_of[a], 0)),
                      (SRC_CASE, (first_of[b], 0))], struct.pack(f"<I{len(ids)}HI", len(ids), *ids, types.count(0))))

    # Decoding.
    fast = oracle.get(UNCASED, "fast")
    id_lists = [oracle.encode(UNCASED, t) for t in PROSE + PUNCTUATION[:20] + ACCENTS[:8] + CJK[:4] + SPECIAL[:12]]
    id_lists += [oracle.frame(UNCASED, a, b, 0)[0] for a, b in [("Hello world", "How are you?"), ("a", "")]]
    id_lists += [[], [101, 102], [100], [-1, 30522, 99999], [2023, 2003, 1037, 3231, 1012], [1001, 1001, 2003],
                 [2123, 1005, 1056], [1045, 1005, 1049, 2182], [2009, 1005, 1055], [2027, 1005, 2310], [2057, 1005, 2128],
                 [1037, 1005, 1038], [1037, 1010, 1038, 1029, 999], [7592, 1012, 1012, 1012], [2000, 2015, 1001, 1001],
                 [103, 103, 1037, 103], [0, 0, 0], [1, 2, 3, 4, 5], [30521, 30520], [2015, 2015, 2015],
                 [11874, 2015], [1011, 1011, 1011], [1006, 1007], [1005, 1005]]
    # Token sequences that reach each clean-up rule (" 'm" needs "'" then "##m": tokens are joined by spaces).
    vocab = oracle.get(UNCASED, "slow").vocab
    for tokens in ["i ' ##m here", "it ' ##s", "they ' ##ve", "we ' ##re", "do n ##' ##t", "x ' y", "a . b , c ! d ? e",
                   "##s start", "a ##s ##s", "x ' ##m ' ##s"]:
        id_lists.append([vocab[t] for t in tokens.split()])
    id_lists += [[rng.randrange(-3, 30525) for _ in range(rng.randint(1, 12))] for _ in range(30)]
    for ids in id_lists:
        for skip in (False, True):
            text = oracle.decode(ids, skip)
            if min(ids, default=0) >= 0:  # the Rust one refuses negative ids
                note_fast("decode", fast.decode(ids, skip_special_tokens=skip) == text, (ids, skip))
            data = text.encode("utf-8")
            cases.append(("decode", DECODE, options_byte(UNCASED, skip), 0, [],
                          struct.pack(f"<I{len(ids)}iI", len(ids), *ids, len(data)) + data))

    groups = list(dict.fromkeys(c[0] for c in cases))
    with open(OUT, "wb") as f:
        f.write(b"WPCASES1" + struct.pack("<B", len(groups)))
        for g in groups:
            f.write(struct.pack("<B", len(g.encode())) + g.encode())
        f.write(struct.pack("<I", len(cases)))
        for group, kind, opts, max_len, sources, payload in cases:
            f.write(struct.pack("<BBBi", groups.index(group), kind, opts, max_len))
            for s in sources:
                f.write(text_source(s))
            f.write(payload)
    print(f"{len(cases)} cases -> {os.path.relpath(OUT, ROOT)} ({os.path.getsize(OUT)} bytes)")
    print("BertTokenizerFast vs BertTokenizer (cases where they differ / cases):")
    for group, (d, n, example) in fast_diff.items():
        print(f"  {group}: {d} / {n}" + (f", e.g. {example!r:.100}" if d else ""))


if __name__ == "__main__":
    main()
