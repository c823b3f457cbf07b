"""dev/data/gen_unicode_tables.py — writes llmc/unicode_tables.h (GPT-2) and llmc/unicode_bert.h (BERT):
sorted code-point range tables of the Unicode character properties and mappings the C++ tokenizers
need, with a binary-search lookup for each.

Which Unicode version. A tokenizer must classify characters exactly as the reference it imitates:
  - GPT-2 (llmc/tokenizer.h) must match tiktoken, whose regex engine is Rust's (fancy-regex over
    regex-syntax; tiktoken 0.14 ships regex-syntax 0.8.11 = Unicode 16.0);
  - python 3.11's unicodedata is Unicode 14.0 (3.12: 15.0, 3.13: 15.1), so tables built from it
    would call the ~9,300 letters and ~120 numbers assigned in Unicode 15.0-16.0 (CJK extensions
    H and I, Kawi, Nag Mundari, Garay, Todhri, ...) "unassigned" and pre-tokenize text in those
    scripts differently from tiktoken.
So each table names its source: the GPT-2 properties are read out of tiktoken's own regex engine
(an Encoding whose pattern is just the property, run over every code point: what it matches is
the property), which is exact by construction and records the engine's Unicode version.

BERT (llmc/wordpiece.h) must match transformers' python BertTokenizer, which classifies,
lower-cases and normalizes with the python running it: its unicodedata module and str methods.
Its reference here is python 3.11 = Unicode 14.0.0, so llmc/unicode_bert.h is written from
unicodedata and str.lower()/str.isspace() and the script refuses any other unicodedata version
(a newer python would silently move the tables to Unicode 15/16: e.g. BertTokenizer drops
every unassigned code point as a "control" character, so each newly assigned one changes
tokenization). Its tables:
  sets (Table, as above): BertTokenizer's _is_punctuation, _is_control, _is_whitespace (copied
      from transformers/tokenization_utils.py; checked against the real functions when
      transformers is importable), str.isspace (what str.split(), i.e. whitespace_tokenize,
      splits on), general category Mn (what strip_accents drops);
  maps: canonical combining classes (ranges of equal class), str.lower() per code point (runs
      of equal offset and stride 1 or 2, plus the one-to-many mappings), and the canonical
      decompositions (one level, with whether the character is a primary composite, i.e.
      what NFC composes back: NFC(c) == c; Hangul syllables are algorithmic and not listed).
The facts llmc/wordpiece.h relies on to skip work are asserted here (see bert_invariants()).

  python3 dev/data/gen_unicode_tables.py            (both headers; needs `pip install tiktoken`)
  python3 dev/data/gen_unicode_tables.py --only bert   (llmc/unicode_bert.h; no tiktoken needed)
"""
import argparse
import bisect
import functools
import os
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "llmc", "unicode_tables.h")
BERT_OUT = os.path.join(HERE, "..", "..", "llmc", "unicode_bert.h")
BERT_UNICODE_VERSION = "14.0.0"  # python 3.11's unicodedata: the BertTokenizer reference here
MAX_CP = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)  # not characters; no UTF-8 string holds them

# A letter first assigned in each Unicode version: the newest one the engine calls a letter gives
# its version (assignments are never undone, so these are stable facts of the standard).
VERSION_SENTINELS = [("14.0", 0x0870), ("15.0", 0x11F04), ("15.1", 0x2EBF0), ("16.0", 0x105C0),
                     ("17.0", 0x323B0)]


@functools.lru_cache(maxsize=None)
def tiktoken_matches(pattern):
    """The code points that tiktoken's regex engine matches with `pattern` (one character long).
    An Encoding whose ranks are the 256 single bytes returns exactly the bytes its pattern
    matched (tiktoken drops unmatched text), so one pass over all code points reads the property
    out of the engine."""
    import tiktoken
    ranks = {bytes([b]): b for b in range(256)}
    enc = tiktoken.Encoding("property_probe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    text = "".join(chr(c) for c in range(MAX_CP + 1) if c not in SURROGATES)
    return {ord(ch) for ch in enc.decode_bytes(enc.encode_ordinary(text)).decode("utf-8")}


def tiktoken_unicode_version():
    letters = tiktoken_matches(r"\p{L}")
    newest = [v for v, cp in VERSION_SENTINELS if cp in letters]
    return newest[-1] if newest else "older than 14.0"


def from_tiktoken(pattern):
    """Source: the code points tiktoken's regex engine matches with `pattern`."""
    def source():
        import tiktoken
        return tiktoken_matches(pattern), f"tiktoken {tiktoken.__version__}'s regex engine " \
                                          f"(Unicode {tiktoken_unicode_version()}), pattern {pattern}"
    return source


class Table:
    """One property: the C++ predicate's name, what it is, and where its code points come from."""

    def __init__(self, name, what, source, compare_category=None):
        self.name, self.what, self.source = name, what, source
        self.compare_category = compare_category  # general-category prefixes to compare with unicodedata


TABLES = [
    Table("is_letter", r"\p{L}: general category L (Lu Ll Lt Lm Lo)", from_tiktoken(r"\p{L}"), ("L",)),
    Table("is_number", r"\p{N}: general category N (Nd Nl No)", from_tiktoken(r"\p{N}"), ("N",)),
    Table("is_whitespace", r"\s: the White_Space property", from_tiktoken(r"\s")),
]


def ranges(cps):
    """Sorted code points -> list of inclusive (lo, hi) runs."""
    out = []
    for c in sorted(cps):
        if out and c == out[-1][1] + 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def write_set_table(lines, table, cps, source_desc):
    rs = ranges(cps)
    array = table.name[len("is_"):] + "_ranges"
    lines.append(f"// {table.what}: {len(cps)} code points in {len(rs)} ranges.")
    lines.append(f"// Source: {source_desc}.")
    lines.append(f"inline constexpr Range {array}[] = {{")
    row = []
    for lo, hi in rs:
        row.append(f"{{0x{lo:X}, 0x{hi:X}}},")
        if len(row) == 6:
            lines.append("    " + " ".join(row))
            row = []
    if row:
        lines.append("    " + " ".join(row))
    lines.append("};")
    lines.append(f"inline bool {table.name}(uint32_t cp) {{ return in_ranges({array}, std::size({array}), cp); }}")
    lines.append("")


def unicodedata_gap(cps, prefixes):
    """How the table differs from python's unicodedata on the same general categories."""
    py = {c for c in range(MAX_CP + 1) if unicodedata.category(chr(c)).startswith(prefixes)}
    return len(cps - py), len(py - cps)


def write_gpt2_tables():
    body, notes = [], []
    for t in TABLES:
        cps, desc = t.source()
        write_set_table(body, t, cps, desc)
        if t.compare_category:
            extra, missing = unicodedata_gap(cps, t.compare_category)
            notes.append(f"{t.name}: {extra} code points more than python {unicodedata.unidata_version}'s "
                         f"unicodedata, {missing} fewer")
        print(f"{t.name}: {len(cps)} code points, {len(ranges(cps))} ranges")
    for n in notes:
        print(n)
    header = [
        "// llmc/unicode_tables.h — Unicode character properties for the tokenizers, as sorted code-point",
        "// range tables with a binary-search lookup. GENERATED by dev/data/gen_unicode_tables.py: do not",
        "// edit, rerun it (its docstring says why each table's source and Unicode version were chosen).",
        "//",
        "// Compared with python's unicodedata, which some reference tokenizers use instead:",
    ] + [f"//   {n}" for n in notes] + [
        "// (the newer characters of the tables above are unassigned in that older unicodedata).",
        "#pragma once",
        "#include <cstddef>",
        "#include <cstdint>",
        "#include <iterator>",
        "",
        "namespace unicode {",
        "",
        "// An inclusive code-point range [lo, hi].",
        "struct Range {",
        "    uint32_t lo, hi;",
        "};",
        "",
        "// Whether cp is in one of the n sorted, disjoint ranges r (binary search).",
        "inline bool in_ranges(const Range* r, size_t n, uint32_t cp) {",
        "    size_t lo = 0, hi = n;  // the answer is the last range with r.lo <= cp, if any",
        "    while (lo < hi) {",
        "        size_t mid = (lo + hi) / 2;",
        "        if (r[mid].lo <= cp) lo = mid + 1;",
        "        else hi = mid;",
        "    }",
        "    return lo > 0 && cp <= r[lo - 1].hi;",
        "}",
        "",
    ]
    footer = ["}  // namespace unicode", ""]
    with open(OUT, "w") as f:
        f.write("\n".join(header + body + footer))
    print(f"wrote {os.path.normpath(OUT)}")


# ---------------------------------------------------------------------------------------------
# BERT: llmc/unicode_bert.h, from python's own unicodedata / str methods (module docstring).

def python_unicode():
    return f"python {sys.version_info.major}.{sys.version_info.minor}'s unicodedata {unicodedata.unidata_version}"


def from_unicodedata(predicate):
    """Source: the code points (surrogates included: python classifies them) where predicate(char)."""
    def source():
        return {c for c in range(MAX_CP + 1) if predicate(chr(c))}, python_unicode()
    return source


def bert_is_punctuation(ch):  # transformers/tokenization_utils.py _is_punctuation
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def bert_is_control(ch):  # _is_control: every C* category (unassigned and private use too)
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def bert_is_whitespace(ch):  # _is_whitespace
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


BERT_TABLES = [
    Table("is_punctuation", "BertTokenizer's _is_punctuation: general category P*, or ASCII 33-47, 58-64, "
          "91-96, 123-126", from_unicodedata(bert_is_punctuation)),
    Table("is_control", "BertTokenizer's _is_control: general category C* (Cc Cf Cn Co Cs) except \\t \\n \\r",
          from_unicodedata(bert_is_control)),
    Table("is_whitespace", "BertTokenizer's _is_whitespace: space, \\t, \\n, \\r and general category Zs",
          from_unicodedata(bert_is_whitespace)),
    Table("is_python_space", "str.isspace(), what str.split() (BertTokenizer's whitespace_tokenize) splits on",
          from_unicodedata(str.isspace)),
    Table("is_nonspacing_mark", "General category Mn, what strip_accents drops after NFD",
          from_unicodedata(lambda ch: unicodedata.category(ch) == "Mn")),
]


def check_against_transformers():
    """The predicates above against transformers' own functions, when it is importable."""
    try:
        from transformers import tokenization_utils as tu
    except ImportError:
        return "not checked against transformers (not importable here)"
    for c in range(MAX_CP + 1):
        ch = chr(c)
        assert tu._is_punctuation(ch) == bert_is_punctuation(ch), hex(c)
        assert tu._is_control(ch) == bert_is_control(ch), hex(c)
        assert tu._is_whitespace(ch) == bert_is_whitespace(ch), hex(c)
    return "checked against transformers' own _is_punctuation/_is_control/_is_whitespace on every code point"


def lower(c):
    return [ord(x) for x in chr(c).lower()]


def canonical_decomposition(c):
    """One level of c's canonical decomposition (a list of code points), or None."""
    d = unicodedata.decomposition(chr(c))
    return [int(x, 16) for x in d.split()] if d and not d.startswith("<") else None


def lower_runs():
    """The one-to-one lower-case mappings as runs (lo, hi, delta, stride): every code point lo,
    lo+stride, ..., hi maps to itself + delta, and no other code point in [lo, hi] changes."""
    runs = []
    for c in range(MAX_CP + 1):
        m = lower(c)
        if len(m) != 1 or m[0] == c:
            continue
        d = m[0] - c
        if runs:
            lo, hi, delta, stride = runs[-1]
            gap = c - hi
            if delta == d and gap <= 2 and stride in (0, gap):  # stride 0: a run of one, any stride
                runs[-1][1], runs[-1][3] = c, gap
                continue
        runs.append([c, c, d, 0])
    for r in runs:
        r[3] = r[3] or 1
    return runs


def bert_invariants(decomps, composites):
    """Facts llmc/wordpiece.h relies on, asserted for this Unicode version; returns the stable bounds."""
    is_lower = [lower(c) == [c] for c in range(MAX_CP + 1)]
    for c in range(MAX_CP + 1):
        m = lower(c)
        # str.lower() is idempotent, so BertTokenizer's second lower-casing (per word, after the
        # character-wise one of PreTrainedTokenizer.tokenize) changes nothing ...
        assert all(is_lower[x] for x in m), hex(c)
        # ... and it never makes an ASCII capital, so it cannot make a special token like [CLS].
        assert c < 0x80 or not any(0x41 <= x <= 0x5A for x in m), hex(c)
        # NFC of lower-case-stable text stays lower-case-stable (what it decomposes into ...
        if is_lower[c]:
            assert all(is_lower[ord(x)] for x in unicodedata.normalize("NFD", chr(c))), hex(c)
    for p, (a, b) in composites.items():  # ... and what it composes).
        assert not (is_lower[a] and is_lower[b]) or is_lower[p], hex(p)
    assert not any(0xAC00 <= c <= 0xD7A3 for c in decomps)  # Hangul syllables: algorithmic
    # Below NFC_STABLE_BELOW every code point is a starter that NFC leaves alone and that composes
    # with nothing before it: text of such code points only is NFC. Below NFD_STABLE_BELOW none
    # decomposes or is Mn: strip_accents leaves such text alone.
    seconds = {b for a, b in composites.values()}
    nfc_stable = min(c for c in range(MAX_CP + 1)
                     if unicodedata.combining(chr(c)) or c in seconds or unicodedata.normalize("NFC", chr(c)) != chr(c))
    nfd_stable = min(c for c in range(MAX_CP + 1) if c in decomps or unicodedata.category(chr(c)) == "Mn"
                     or unicodedata.combining(chr(c)))
    return nfc_stable, nfd_stable


def rows(items, per_row):
    return ["    " + " ".join(items[i:i + per_row]) for i in range(0, len(items), per_row)]


def write_bert_tables():
    if unicodedata.unidata_version != BERT_UNICODE_VERSION:
        sys.exit(f"llmc/unicode_bert.h must come from unicodedata {BERT_UNICODE_VERSION} (python 3.11, the "
                 f"BertTokenizer reference), not {python_unicode()}")
    body = []
    for t in BERT_TABLES:
        cps, desc = t.source()
        write_set_table(body, t, cps, desc)
        print(f"bert {t.name}: {len(cps)} code points, {len(ranges(cps))} ranges")
    checked = check_against_transformers()
    print(checked)

    ccc = []  # (lo, hi, class) runs of equal nonzero class
    for c in range(MAX_CP + 1):
        k = unicodedata.combining(chr(c))
        if k and ccc and ccc[-1][1] == c - 1 and ccc[-1][2] == k:
            ccc[-1][1] = c
        elif k:
            ccc.append([c, c, k])
    body += [f"// Canonical combining class (nonzero ones; every other code point's is 0): {len(ccc)} ranges.",
             f"// Source: {python_unicode()}, unicodedata.combining().",
             "struct ClassRange {",
             "    uint32_t lo, hi;",
             "    uint8_t ccc;",
             "};",
             "inline constexpr ClassRange combining_class_ranges[] = {"]
    body += rows([f"{{0x{lo:X}, 0x{hi:X}, {k}}}," for lo, hi, k in ccc], 5)
    body += ["};",
             "inline int combining_class(uint32_t cp) {",
             "    const ClassRange* r = last_at_or_below(combining_class_ranges, std::size(combining_class_ranges), &ClassRange::lo, cp);",
             "    return r && cp <= r->hi ? r->ccc : 0;",
             "}",
             ""]

    runs = lower_runs()
    specials = [(c, lower(c)) for c in range(MAX_CP + 1) if len(lower(c)) != 1]
    starts, special_map = [r[0] for r in runs], dict(specials)
    for c in range(MAX_CP + 1):  # the runs and specials reproduce str.lower() exactly
        lo, hi, d, st = runs[bisect.bisect_right(starts, c) - 1] if c >= starts[0] else (1, 0, 0, 1)
        m = special_map.get(c, [c + d] if lo <= c <= hi and (c - lo) % st == 0 else [c])
        assert m == lower(c), hex(c)
    assert all(len(m) <= 3 for c, m in specials)
    body += [f"// str.lower() of one code point, one-to-one mappings: {sum((hi - lo) // st + 1 for lo, hi, d, st in runs)} "
             f"code points in {len(runs)} runs; cp in [lo, hi]",
             "// with (cp - lo) % stride == 0 lower-cases to cp + delta (no other code point in the run changes).",
             f"// Source: {python_unicode()}, str.lower().",
             "struct LowerRun {",
             "    uint32_t lo, hi;",
             "    int32_t delta;",
             "    uint32_t stride;",
             "};",
             "inline constexpr LowerRun lower_runs[] = {"]
    body += rows([f"{{0x{lo:X}, 0x{hi:X}, {d}, {st}}}," for lo, hi, d, st in runs], 5)
    body += ["};",
             "// The one-to-many mappings (python's full lower case: SpecialCasing.txt without conditions).",
             "struct LowerSpecial {",
             "    uint32_t cp;",
             "    uint32_t to[3];  // 0-terminated unless 3 long",
             "};",
             "inline constexpr LowerSpecial lower_specials[] = {"]
    body += rows(["{0x%X, {%s}}," % (c, ", ".join(f"0x{x:X}" for x in m)) for c, m in specials], 4)
    body += ["};",
             "// Writes str.lower() of cp to out (1 to 3 code points) and returns how many.",
             "inline int to_lower(uint32_t cp, uint32_t out[3]) {",
             "    for (const LowerSpecial& s : lower_specials) {",
             "        if (s.cp == cp) {",
             "            int n = 0;",
             "            while (n < 3 && s.to[n]) out[n] = s.to[n], n++;",
             "            return n;",
             "        }",
             "    }",
             "    const LowerRun* r = last_at_or_below(lower_runs, std::size(lower_runs), &LowerRun::lo, cp);",
             "    out[0] = r && cp <= r->hi && (cp - r->lo) % r->stride == 0 ? cp + r->delta : cp;",
             "    return 1;",
             "}",
             ""]

    decomps = {c: d for c in range(MAX_CP + 1) if (d := canonical_decomposition(c))}
    assert all(len(d) <= 2 for d in decomps.values())
    composites = {c: d for c, d in decomps.items() if len(d) == 2 and unicodedata.normalize("NFC", chr(c)) == chr(c)}
    nfc_stable, nfd_stable = bert_invariants(decomps, composites)
    body += [f"// Canonical decompositions, one level (decompose first and second again for the full one): "
             f"{len(decomps)} code points,",
             f"// {len(composites)} of them primary composites (composes: NFC composes first + second back into cp). "
             "Hangul",
             "// syllables are algorithmic and not listed.",
             f"// Source: {python_unicode()}, unicodedata.decomposition() without the <compatibility> ones;",
             "// composes: unicodedata.normalize(\"NFC\", cp) == cp.",
             "struct Decomposition {",
             "    uint32_t cp, first, second;  // second: 0 for a one-character decomposition",
             "    uint8_t composes;",
             "};",
             "inline constexpr Decomposition decompositions[] = {"]
    body += rows([f"{{0x{c:X}, 0x{d[0]:X}, 0x{d[1] if len(d) > 1 else 0:X}, {int(c in composites)}}},"
                  for c, d in sorted(decomps.items())], 4)
    body += ["};",
             "// cp's entry in decompositions[], or nullptr.",
             "inline const Decomposition* decomposition(uint32_t cp) {",
             "    const Decomposition* d = last_at_or_below(decompositions, std::size(decompositions), &Decomposition::cp, cp);",
             "    return d && d->cp == cp ? d : nullptr;",
             "}",
             "",
             f"// Text of code points below NFC_STABLE_BELOW only is NFC; below NFD_STABLE_BELOW, NFD with no Mn.",
             f"inline constexpr uint32_t NFC_STABLE_BELOW = 0x{nfc_stable:X};",
             f"inline constexpr uint32_t NFD_STABLE_BELOW = 0x{nfd_stable:X};",
             ""]
    print(f"bert: {len(ccc)} combining class ranges, {len(runs)} lower-case runs + {len(specials)} one-to-many, "
          f"{len(decomps)} decompositions ({len(composites)} composites); NFC stable below 0x{nfc_stable:X}, "
          f"NFD below 0x{nfd_stable:X}")

    header = [
        "// llmc/unicode_bert.h — the Unicode data of BERT's WordPiece tokenizer (llmc/wordpiece.h) as",
        "// transformers' python BertTokenizer sees it: character classes, combining classes, lower case and",
        "// canonical decompositions as sorted tables with binary-search lookups. GENERATED by",
        "// dev/data/gen_unicode_tables.py: do not edit, rerun it.",
        "//",
        f"// Unicode {unicodedata.unidata_version}: python 3.11's unicodedata and str methods, which BertTokenizer uses when python",
        "// 3.11 runs it (test/oracle_wordpiece.py does). Not the Unicode 16.0 of llmc/unicode_tables.h (GPT-2",
        "// follows tiktoken's regex engine): BertTokenizer drops every unassigned code point as a control",
        "// character, so each character assigned since 14.0 would tokenize differently.",
        "// The generator checks the three BertTokenizer predicates against transformers' own functions on",
        "// every code point when transformers is importable (the only run-dependent fact: not written here).",
        "#pragma once",
        "#include <cstddef>",
        "#include <cstdint>",
        "#include <iterator>",
        "",
        "#include \"unicode_tables.h\"",
        "",
        "namespace unicode::bert {",
        "",
        "// The last of the n entries of t (sorted by member key) whose key is <= cp, or nullptr.",
        "template <class T>",
        "const T* last_at_or_below(const T* t, size_t n, uint32_t T::*key, uint32_t cp) {",
        "    size_t lo = 0, hi = n;",
        "    while (lo < hi) {",
        "        size_t mid = (lo + hi) / 2;",
        "        if (t[mid].*key <= cp) lo = mid + 1;",
        "        else hi = mid;",
        "    }",
        "    return lo > 0 ? &t[lo - 1] : nullptr;",
        "}",
        "",
    ]
    footer = ["}  // namespace unicode::bert", ""]
    with open(BERT_OUT, "w") as f:
        f.write("\n".join(header + body + footer))
    print(f"wrote {os.path.normpath(BERT_OUT)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["gpt2", "bert"], help="write only llmc/unicode_tables.h (gpt2) or "
                    "llmc/unicode_bert.h (bert)")
    args = ap.parse_args()
    if args.only != "bert":
        write_gpt2_tables()
    if args.only != "gpt2":
        write_bert_tables()


if __name__ == "__main__":
    main()
