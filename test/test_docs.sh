#!/usr/bin/env bash
# test/test_docs.sh — checks the documentation a newcomer reads:
#   - README.md is at most 16 KiB (16384 bytes);
#   - every relative markdown link `](path)` in the project's markdown files (all *.md outside build/)
#     resolves to a file or folder, relative to the folder of the file that holds it (http(s) and
#     other scheme links are skipped), and its #anchor, if any, to a heading of the markdown file it
#     names (or of its own file, for a bare #anchor), as GitHub makes a heading's anchor: lower case,
#     punctuation but '-' and '_' dropped, spaces to '-';
#   - every repository path README.md names in backticks (inline code, and the commands of its sh
#     code blocks) exists: words that start with llmc/, dev/, test/, scripts/ or doc/ and contain a
#     '/', and train_gpt2.cu, train_bert.cu, Makefile. Trailing punctuation is stripped; words with a
#     glob or a placeholder (* < > % { $ [) are skipped.
# Prints `PASS name` or `FAIL name: reason` per check, then `N passed, N failed`; exits 1 on a failure.
#
#   test/test_docs.sh
set -u
cd "$(dirname "$0")/.." || exit 1

readme_limit=16384
mapfile -t docs < <(find . -name '*.md' -not -path './build/*' -not -path './.git/*' | sed 's|^\./||' | sort)
passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

# The file's text outside fenced code blocks.
prose() { awk '/^[[:space:]]*```/ { fence = !fence; next } !fence' "$1"; }
# The lines inside the file's ```sh / ```bash / ```shell code blocks.
sh_blocks() {
    awk '/^[[:space:]]*```/ {
             if (fence) { fence = 0; sh = 0 } else { fence = 1; sh = ($0 ~ /```[[:space:]]*(sh|bash|shell)[[:space:]]*$/) }
             next
         }
         fence && sh' "$1"
}

# 1. README.md's size.
if [[ ! -f README.md ]]; then
    fail "README.md size" "README.md is missing"
else
    size=$(wc -c < README.md)
    if ((size <= readme_limit)); then
        pass "README.md size: $size bytes (at most $readme_limit)"
    else
        fail "README.md size" "$size bytes, more than $readme_limit"
    fi
fi

# The anchors of a markdown file's headings (outside code blocks), one per line, as GitHub makes them.
anchors() {
    prose "$1" | sed -n 's/^#\{1,6\}[[:space:]]\{1,\}//p' | tr '[:upper:]' '[:lower:]' |
        sed 's/[^a-z0-9 _-]//g; s/ /-/g'
}

# 2. Relative links in each documentation file.
for f in "${docs[@]}"; do
    if [[ ! -f $f ]]; then
        fail "links in $f" "$f does not exist"
        continue
    fi
    dir=$(dirname "$f")
    n=0
    bad=()
    while IFS= read -r target; do
        [[ -z $target ]] && continue
        [[ $target =~ ^[A-Za-z][A-Za-z0-9+.-]*: ]] && continue  # http:, https:, mailto:, ...
        path=${target%%#*}
        path=${path%%\?*}
        anchor=
        [[ $target == *\#* ]] && anchor=${target#*#}
        if [[ -z $path ]]; then
            resolved=$f
        else
            [[ $path == /* ]] && resolved=.$path || resolved=$dir/$path
        fi
        n=$((n + 1))
        if [[ ! -e $resolved ]]; then
            bad+=("$target (no $resolved)")
        elif [[ -n $anchor && $resolved == *.md ]] && ! anchors "$resolved" | grep -qxF -- "$anchor"; then
            bad+=("$target (no heading of $resolved has the anchor #$anchor)")
        fi
    done < <(prose "$f" | grep -oE '\]\([^)[:space:]]+' | sed 's/^](//; s/^<//; s/>$//')
    if ((${#bad[@]} == 0)); then
        pass "links in $f ($n relative, all resolve)"
    else
        reasons=$(printf '%s; ' "${bad[@]}")
        fail "links in $f" "${reasons%; }"
    fi
done

# 3. Repository paths named in README.md's inline code and sh blocks.
if [[ -f README.md ]]; then
    n=0
    bad=()
    # shellcheck disable=SC2016  # the backticks in the patterns are literal
    while IFS= read -r word; do
        word=${word#./}
        while [[ $word =~ ^[\(\'\"] ]]; do word=${word:1}; done
        while [[ $word =~ [\]\)\.,\;:\!\?\'\"]$ ]]; do word=${word%?}; done
        [[ -z $word ]] && continue
        case $word in
            *'*'* | *'<'* | *'>'* | *%* | *'{'* | *'$'* | *'['*) continue ;;
        esac
        case $word in
            train_gpt2.cu | train_bert.cu | Makefile) ;;
            llmc/* | dev/* | test/* | scripts/* | doc/*) ;;
            *) continue ;;
        esac
        n=$((n + 1))
        [[ -e $word ]] || bad+=("$word")
    done < <({ prose README.md | grep -oE '`[^`]+`' | tr -d '`'; sh_blocks README.md; } | tr -s '[:space:]' '\n')
    if ((${#bad[@]} == 0)); then
        pass "paths in README.md ($n named, all exist)"
    else
        fail "paths in README.md" "missing: ${bad[*]}"
    fi
fi

echo "$passed passed, $failed failed"
((failed == 0))
