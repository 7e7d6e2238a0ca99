#!/usr/bin/env bash
# Generates test vectors for tandemfs's half-MD4 directory hash from e2fsprogs' debugfs, the
# reference implementation of ext4's dx_hash.
#
# Output (stdout), one vector a line, tab separated:
#   seed_uuid  major_hash_hex  minor_hash_hex  name_as_hex_bytes
#
# We ask debugfs for hash version 4 (`-h 4`), ext4's "half_md4_unsigned": the name's bytes are
# taken as unsigned chars. debugfs 1.47 has no name for that version (`-h half_md4_unsigned`
# silently falls back to version 0, the legacy hash), so the number is passed and debugfs reads
# it with atoi. `-h half_md4` is the signed-char variant, which differs for bytes >= 0x80.
#
# Names are printable ASCII (without `"` and `\`, which debugfs's command parser treats
# specially) mixed with UTF-8 characters of 2, 3 and 4 bytes, 1 to 255 bytes long. Every name is
# written in double quotes so that spaces survive, and after `--` so that a leading `-` is not
# read as an option. The generator is deterministic (RANDOM is seeded) so the file is stable.
#
# Usage: scripts/gen-half-md4-vectors.sh > crates/tandemfs/src/dir/testdata/half_md4_vectors.tsv
set -euo pipefail

DEBUGFS=${DEBUGFS:-/usr/sbin/debugfs}
NAMES_PER_SEED=${NAMES_PER_SEED:-300}
SEEDS=(
    00000000-0000-0000-0000-000000000000   # all zero: ext4 falls back to the MD4 initial values
    01234567-89ab-cdef-0123-456789abcdef
    d2c1a9f0-5b3e-4c7d-9e8f-102132435465
    ffffffff-ffff-ffff-ffff-fffffffffffe
)
# Printable ASCII without '"' and '\'.
ASCII=' !#$%&'"'"'()*+,-.0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]^_`abcdefghijklmnopqrstuvwxyz{|}~'
UTF8=(é ü ß Ω ж 日 本 語 € ✓ 🙂 𝄞 ñ ø)

RANDOM=20261122
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Prints one name of about `target` bytes (never more than 255).
make_name() {
    local target=$1 name='' piece
    while :; do
        if (( RANDOM % 4 == 0 )); then
            piece=${UTF8[RANDOM % ${#UTF8[@]}]}
        else
            piece=${ASCII:RANDOM % ${#ASCII}:1}
        fi
        local candidate="$name$piece"
        local bytes
        bytes=$(LC_ALL=C; printf '%s' "$candidate" | wc -c)
        if (( bytes > target )); then
            break
        fi
        name=$candidate
        if (( bytes == target )); then
            break
        fi
    done
    if [[ -z $name || $name == "." || $name == ".." ]]; then
        name=x$name
    fi
    printf '%s' "$name"
}

names_file=$work/names
: > "$names_file"
for ((i = 0; i < NAMES_PER_SEED; i++)); do
    case $i in
        0) target=1 ;;
        1) target=255 ;;
        2) target=254 ;;
        *)
            # Mostly short names as in real directories, some long ones to cover every
            # 32-byte block boundary of the hash.
            if (( RANDOM % 3 == 0 )); then target=$(( RANDOM % 255 + 1 )); else target=$(( RANDOM % 40 + 1 )); fi
            ;;
    esac
    make_name "$target" >> "$names_file"
    printf '\n' >> "$names_file"
done

for seed in "${SEEDS[@]}"; do
    commands=$work/commands
    : > "$commands"
    while IFS= read -r name; do
        printf 'dx_hash -h 4 -s %s -- "%s"\n' "$seed" "$name" >> "$commands"
    done < "$names_file"
    "$DEBUGFS" -f "$commands" /dev/null 2>/dev/null \
        | sed -n 's/^Hash of .* is 0x\([0-9a-f]*\) (minor 0x\([0-9a-f]*\))$/\1 \2/p' > "$work/hashes"
    if [[ $(wc -l < "$work/hashes") -ne $(wc -l < "$names_file") ]]; then
        echo "debugfs answered $(wc -l < "$work/hashes") of $(wc -l < "$names_file") names for seed $seed" >&2
        exit 1
    fi
    while IFS= read -r name && read -r major minor <&3; do
        hex=$(printf '%s' "$name" | od -An -tx1 -v | tr -d ' \n')
        printf '%s\t%s\t%s\t%s\n' "$seed" "$major" "$minor" "$hex"
    done < "$names_file" 3< "$work/hashes"
done
