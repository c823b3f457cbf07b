"""dev/data/gen_unicode_tables.py — writes llmc/unicode_tables.h: sorted code-point range tables of
the Unicode character properties the C++ tokenizers need, with a binary-search lookup for each.

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

Adding a property (e.g. for BERT's WordPiece: punctuation, control, Mn, CJK): append a Table to
TABLES with a source function returning the set of code points, e.g.
  Table("is_mark_nonspacing", "Mn", from_unicodedata(lambda c: unicodedata.category(c) == "Mn"))
where from_unicodedata is a source written like from_tiktoken. Pick the reference first: HF's
python BertTokenizer classifies with the unicodedata of the python running it, the Rust
`tokenizers` one with its crates' tables (their Unicode versions differ too). Mappings (lower
case, NFD) need a second emitter writing (code point -> replacement) tables next to
write_set_table.

  python3 dev/data/gen_unicode_tables.py            (needs `pip install tiktoken`; no download)
"""
import functools
import os
import unicodedata

import tiktoken

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "llmc", "unicode_tables.h")
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


def main():
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


if __name__ == "__main__":
    main()
